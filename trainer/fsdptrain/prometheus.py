"""Rank 0's Prometheus endpoint (METRICS_PORT): the latest logged step as gauges, through
prometheus_client. No torch here: fsdpctl's tests and the dashboard's checks import it cheaply."""

from __future__ import annotations

# name -> (step record key, help); gauges of the latest logged step, read by the Grafana dashboard
PROMETHEUS_GAUGES = {
    "fsdptrain_step": ("step", "last finished optimizer step"),
    "fsdptrain_max_steps": ("max_steps", "steps the run is set to do"),
    "fsdptrain_loss": ("loss", "training loss of the last step"),
    "fsdptrain_tokens_per_second": ("tokens_per_s", "tokens per second, whole job"),
    "fsdptrain_mfu": ("mfu", "model FLOPs utilisation (0..1) per device"),
    "fsdptrain_step_time_seconds": ("step_time_s", "wall time of the last step"),
    "fsdptrain_tflops_per_device": ("tflops_per_device", "model TFLOP/s per device"),
}


class _LatestStep:
    """A prometheus_client collector of the latest logged step: one gauge per PROMETHEUS_GAUGES name
    whose value this run measured (a CPU has no MFU: no `fsdptrain_mfu` rather than a made-up 0)."""

    def __init__(self) -> None:
        self.record: dict = {}

    def collect(self):  # prometheus_client's Collector protocol (registry.py)
        from prometheus_client.core import GaugeMetricFamily

        record = self.record
        for name, (key, help_text) in PROMETHEUS_GAUGES.items():
            value = record.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                yield GaugeMetricFamily(name, help_text, value=float(value))


class PrometheusExporter:
    """GET /metrics on `port` (rank 0): prometheus_client's own server (start_http_server, a daemon
    thread) over a registry of this run's gauges only, what Prometheus scrapes from the pod
    annotation fsdpctl writes. A port already taken raises OSError here: the caller logs it, the run
    goes on."""

    def __init__(self, port: int):
        from prometheus_client import CollectorRegistry, start_http_server

        self.collector = _LatestStep()
        self.registry = CollectorRegistry(
            auto_describe=False
        )  # not the global one: no process_* series
        self.registry.register(self.collector)
        self.server, self.thread = start_http_server(port, registry=self.registry)
        self.port: int = self.server.server_address[1]

    def update(self, record: dict) -> None:
        self.collector.record = dict(record)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

"""This process's place in the job (rank, device, process group) and rank 0's outputs: the human
log, the event lines (fsdptrain.events), the metrics file, the Prometheus endpoint and the trackers
(TensorBoard, W&B)."""

from __future__ import annotations

import os
import signal
import socket
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TextIO

import torch
import torch.distributed as dist

from fsdptrain import events
from fsdptrain.config import TrainConfig
from fsdptrain.prometheus import PrometheusExporter
from fsdptrain.trackers import Trackers, open_trackers


@dataclass
class Runtime:
    rank: int
    local_rank: int
    world: int
    local_world: int
    device: torch.device
    metrics_file: TextIO | None = None  # METRICS_FILE, rank 0: a copy of the event lines
    exporter: PrometheusExporter | None = None  # METRICS_PORT, local rank 0 of every node
    trackers: Trackers | None = None  # TENSORBOARD_DIR, WANDB_PROJECT, rank 0
    stop_requested: bool = False  # set by SIGTERM; the ranks agree on it once per step

    def log(self, msg: str) -> None:
        if self.rank == 0:
            print(msg, flush=True)

    def emit(self, event: events.Event) -> None:
        """One event line (machine-read by `fsdpctl job status`), rank 0 only; every node's exporter
        takes the step (each rank knows the job's averaged loss and times after `_read_steps`)."""
        if self.exporter is not None and isinstance(event, events.Step):
            self.exporter.update(events.as_record(event))
        if self.rank != 0:
            return
        if self.trackers is not None and isinstance(event, events.Step):
            self.trackers.step(event)
        if self.trackers is not None and isinstance(event, events.Checkpoint):
            self.trackers.flush()  # a checkpoint (also SIGTERM's) has every step before it on disk
        line = events.to_line(event)
        print(line, flush=True)
        if self.metrics_file is not None:
            self.metrics_file.write(line + "\n")
            self.metrics_file.flush()


def init_distributed(timeout_s: int = 0) -> Runtime:
    """The process group over torchrun's environment (NCCL on GPUs, gloo on CPUs); SIGTERM asks to
    stop. `timeout_s` (COLLECTIVE_TIMEOUT; 0: torch's default) bounds every collective: a rank whose
    peer is gone or cut off fails after it and torchrun's agent restarts the group, instead of
    waiting up to 30 minutes."""
    timeout = timedelta(seconds=timeout_s) if timeout_s else None
    os.environ.setdefault("RANK", "0")  # a plain `python -m fsdptrain` is a world of one
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("LOCAL_RANK", "0")
    os.environ.setdefault("LOCAL_WORLD_SIZE", "1")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(_free_port()))
    local_rank, local_world = int(os.environ["LOCAL_RANK"]), int(os.environ["LOCAL_WORLD_SIZE"])
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        dist.init_process_group(backend="nccl", device_id=device, timeout=timeout)
    else:
        device = torch.device("cpu")
        if "OMP_NUM_THREADS" not in os.environ:
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_world))
        dist.init_process_group(backend="gloo", timeout=timeout)
    rt = Runtime(dist.get_rank(), local_rank, dist.get_world_size(), local_world, device)
    signal.signal(signal.SIGTERM, lambda *_: setattr(rt, "stop_requested", True))
    return rt


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def open_outputs(cfg: TrainConfig, rt: Runtime) -> None:
    """Rank 0's METRICS_FILE; METRICS_PORT on local rank 0 of every node: Prometheus scrapes every
    pod of the job (the pod template's prometheus.io/scrape annotation, the same on all), and a node
    whose port answered nothing was a target down for the whole run. A port already taken costs the
    metrics, never the run."""
    if rt.rank == 0 and cfg.metrics_file:
        Path(cfg.metrics_file).parent.mkdir(parents=True, exist_ok=True)
        rt.metrics_file = open(cfg.metrics_file, "a")  # for the whole run: closed by close_outputs
    if cfg.metrics_port and rt.local_rank == 0:
        try:
            rt.exporter = PrometheusExporter(cfg.metrics_port)
            rt.log(f"metrics: http://0.0.0.0:{rt.exporter.port}/metrics")
        except OSError as e:
            rt.log(
                f"metrics: port {cfg.metrics_port} unavailable ({e.strerror}); "
                "training goes on without it"
            )


def start_trackers(cfg: TrainConfig, rt: Runtime, start_step: int, rid: str | None = None) -> None:
    """Rank 0's TensorBoard writer and W&B run, once the step the run resumes after is known; `rid`:
    the tracker run to write (that of the run whose checkpoint this one continues)."""
    if rt.rank == 0 and (cfg.tensorboard_dir or cfg.wandb_project):
        warn = lambda m: rt.log(f"warning: {m}")  # noqa: E731 - one line, in the human log
        rt.trackers = open_trackers(cfg, start_step=start_step, world=rt.world, warn=warn, rid=rid)


def close_outputs(rt: Runtime) -> None:
    if rt.trackers is not None:
        rt.trackers.close()
    if rt.exporter is not None:
        rt.exporter.close()
    if rt.metrics_file is not None:
        rt.metrics_file.close()


def leader_event(rt: Runtime) -> events.Leader:
    """Global rank 0 names its node, so a reader of several node logs knows which one carries the
    progress: torchrun's rendezvous, not the launch order, decides where rank 0 lands."""
    return events.Leader(
        node_rank=int(os.environ.get("GROUP_RANK", "0")),
        hostname=socket.gethostname(),
        world=rt.world,
        time=time.time(),
    )

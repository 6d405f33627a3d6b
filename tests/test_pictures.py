"""Pictures and trackers (issue 16): the trainer's TensorBoard event files and W&B run, its
Prometheus endpoint through prometheus_client, the curves `job status` draws in the terminal
(plotext) and the PNG of `job plot` (matplotlib). Each outside format is read back with its own
reader:

- TensorBoard: `tensorboard.backend.event_processing.event_accumulator.EventAccumulator` (Reload, Scalars:
  ScalarEvent(wall_time, step, value), the value a float32 as `SummaryWriter.add_scalar` writes it:
  torch/utils/tensorboard/summary.py `scalar` makes a float32 `simple_value`).
- W&B offline files: `wandb/offline-run-*/run-*.wandb`, W&B's transaction log. wandb 0.31 ships no Python
  reader (sdk/internal/datastore.py is gone; the Go core writes it), so `wandb_records` below reads the format
  that module documented: a 7-byte header (ident ":W&B", magic 0xBEE1, version; struct "<4sHB") and then
  leveldb log records (google/leveldb doc/log_format.md: 32 KiB blocks, each record crc32 u32, length u16,
  type u8 FULL=1 FIRST=2 MIDDLE=3 LAST=4), each a `wandb.proto.wandb_internal_pb2.Record` protobuf; a
  history record's items carry `key` (or `nested_key`) and `value_json`, with `_step` the step logged.
- Prometheus: `prometheus_client.parser.text_string_to_metric_families` on the real endpoint's body
  (prometheus_client/exposition.py: with no Accept header the text format 0.0.4,
  CONTENT_TYPE_PLAIN_0_0_4).
- PNG: PIL (matplotlib's own image dependency) opens it; the size is figsize x dpi.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fsdpctl.cli import plots
from fsdptrain import events
from fsdptrain.trackers import SCALARS, scalars, tracker_config
from test_kube import add_pod, install_operator, kube, peer, set_condition, step_line  # noqa: F401 (fixture)
from test_kube import cli as kcli

TOKEN = "hf_PiCtUrEsTeStToKeNnOtReAl0123456789ab"


def step(n: int, loss: float = 3.0, **extra) -> events.Step:
    fields = dict(
        step=n, max_steps=100, loss=loss, step_time_s=0.5, time=1.0e9 + n, tokens_per_s=1000.0
    )
    return events.Step(**{**fields, **extra})


finite = st.floats(min_value=1e-3, max_value=1e4, allow_nan=False)
optional = st.none() | finite


@st.composite
def step_lists(draw, min_size: int = 2) -> list[events.Step]:
    """Runs as the trainer logs them: increasing steps (LOG_INTERVAL gaps), any finite numbers, MFU
    and learning rate sometimes unknown (a CPU has no peak; an older trainer wrote no lr)."""
    n = draw(st.integers(min_size, 40))
    gaps = draw(st.lists(st.integers(1, 5), min_size=n, max_size=n))
    return [
        step(
            sum(gaps[: i + 1]),
            loss=draw(finite),
            tokens_per_s=draw(finite),
            lr=draw(optional),
            mfu=draw(st.none() | st.floats(0, 1)),
            mem_peak_rss_gib=draw(optional),
        )
        for i in range(n)
    ]


# ---- the trackers' inputs -------------------------------------------------------------------------------


@given(step_lists(min_size=1))
@settings(max_examples=30, deadline=None)
def test_scalars_are_every_measured_field_and_nothing_unmeasured(steps):
    """Each logged step gives the trackers exactly the numbers its line carries, by the one tag
    table."""
    for s in steps:
        record = events.as_record(s)
        got = scalars(s)
        measured = {k for k in SCALARS if isinstance(record.get(k), (int, float))}
        assert set(got) == {SCALARS[k] for k in measured}
        assert all(got[SCALARS[k]] == float(record[k]) for k in measured)


def test_the_wandb_config_is_the_settings_by_key_and_never_a_token():
    from fsdptrain.config import TrainConfig

    cfg = TrainConfig(dataset=f"/data/{TOKEN}", wandb_project="p")
    config = tracker_config(cfg, WORLD_SIZE=2)
    assert (
        config["MODEL"] == "tiny" and config["WANDB_PROJECT"] == "p" and config["WORLD_SIZE"] == 2
    )
    assert TOKEN not in json.dumps(config) and config["DATASET"] == "/data/***"
    assert "HF_TOKEN" not in config  # the trainer's settings only, never its environment


@pytest.mark.parametrize(
    "key, package", [("TENSORBOARD_DIR", "tensorboard"), ("WANDB_PROJECT", "wandb")]
)
def test_a_tracker_key_without_its_package_is_one_line_before_training(
    cli, monkeypatch, key, package
):
    """The trainer refuses at validation (exit 2 in __main__: `fsdptrain: error: LINE`), and so does
    a local `job run` before anything starts: one line naming the key, its value and the pip extra.
    The package is made to look absent the way both check it, importlib.util.find_spec returning
    None."""
    import importlib.util

    from fsdptrain.config import ConfigError, from_sources

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == package else real(name)
    )
    value = "/fsx/tensorboard" if key == "TENSORBOARD_DIR" else "proj"
    with pytest.raises(ConfigError) as e:
        from_sources([], environ={key: value})
    line = f"{key}={value!r} needs the {package} package, which is not installed: "
    line += "pip install 'fsdpctl[trackers]'"
    assert str(e.value).startswith(line)
    r = cli(
        "--set", f"{key}={value}", "--set", "JOB_NODES=1", "job", "run", "-d", "--backend", "local"
    )
    assert r.exit_code == 2 and line in r.stderr and "Traceback" not in r.output, r.output
    assert not (cli.home / "jobs").exists()  # nothing started, nothing written


@pytest.mark.parametrize(
    "value, problem",
    [
        ("tb", "TENSORBOARD_DIR='tb' (--set) is not an absolute path: use e.g. /fsx/tensorboard"),
        (
            "/tmp/tb",
            "TENSORBOARD_DIR='/tmp/tb' (--set) is not on the shared volume (SHARED_VOLUME_PATH=/fsx)",
        ),
        ("/fsxother/tb", "TENSORBOARD_DIR='/fsxother/tb' (--set) is not on the shared volume"),
    ],
)
def test_tensorboard_dir_off_the_shared_volume_is_refused(cli, value, problem):
    r = cli("--set", f"TENSORBOARD_DIR={value}", "config", "show")
    assert r.exit_code == 2 and problem in r.stderr, r.output


def test_pods_write_events_and_wandb_files_on_the_shared_volume(cli):
    """The pod's TENSORBOARD_DIR is the user's plus the job (the trainer adds the run id); WANDB_DIR
    is on the shared volume too, where an offline run outlives its pod; neither without its key."""
    from fsdpctl.job import policy as jobpolicy
    from fsdpctl.settings import load

    cfg = load(flags={"TENSORBOARD_DIR": "/fsx/tb/", "WANDB_PROJECT": "p", "JOB_NAME": "j1"})
    env = jobpolicy.pod_env(cfg)
    assert env["TENSORBOARD_DIR"] == "/fsx/tb/j1" and env["WANDB_DIR"] == "/fsx/wandb/j1"
    assert env["WANDB_PROJECT"] == "p" and env["WANDB_MODE"] == "online"
    plain = jobpolicy.pod_env(load(flags={"JOB_NAME": "j1"}))
    assert (
        "WANDB_DIR" not in plain and plain["TENSORBOARD_DIR"] == "" and plain["WANDB_PROJECT"] == ""
    )


# ---- Prometheus -----------------------------------------------------------------------------------------


def test_metrics_endpoint_is_prometheus_client_with_the_dashboard_names(monkeypatch):
    """The real server on an OS-chosen port, scraped over HTTP and parsed by prometheus_client's
    parser: one gauge per PROMETHEUS_GAUGES name the step measured (no MFU on a CPU: no series),
    this run's registry only (no process_/python_ series of the global one); a port already taken is
    an OSError the trainer logs."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    from fsdptrain.prometheus import PROMETHEUS_GAUGES, PrometheusExporter

    exporter = PrometheusExporter(0)
    try:
        record = events.as_record(step(7, loss=2.5, mfu=None, tflops_per_device=0.01))
        exporter.update(record)
        with urllib.request.urlopen(f"http://127.0.0.1:{exporter.port}/metrics", timeout=10) as r:
            assert r.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
            families = {f.name: f for f in text_string_to_metric_families(r.read().decode())}
        want = {n for n, (k, _) in PROMETHEUS_GAUGES.items() if record.get(k) is not None}
        assert set(families) == want and "fsdptrain_mfu" not in families
        for name, family in families.items():
            assert family.type == "gauge" and family.documentation == PROMETHEUS_GAUGES[name][1]
            assert family.samples[0].value == float(record[PROMETHEUS_GAUGES[name][0]])
        with pytest.raises(OSError):
            PrometheusExporter(exporter.port)
    finally:
        exporter.close()


# ---- terminal curves and the PNG ------------------------------------------------------------------------


@given(step_lists(), st.integers(40, 160), st.integers(12, 40))
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_terminal_curves_fit_the_size_asked_for(steps, width, height):
    """Whatever the numbers, the drawing is `height` lines of at most `width` columns, both panels
    titled, without a colour code (the same text on a terminal and in a file)."""
    text = plots.terminal_plot(steps, width=width, height=height)
    lines = text.splitlines()
    assert len(lines) == height and max(len(line) for line in lines) <= width
    assert "loss by step" in text and "tokens/s (whole job) by step" in text and "\x1b[" not in text


def test_steps_of_a_resumed_run_keep_the_redone_steps_latest():
    """A run resumed from step 2's checkpoint logs 3 again: the picture shows the second attempt."""
    recs = [
        step(1, 5.0),
        step(2, 4.0),
        step(3, 3.9),
        events.Checkpoint(step=2, path="c"),
        step(3, 3.5),
    ]
    assert [(s.step, s.loss) for s in plots.steps_of(recs)] == [(1, 5.0), (2, 4.0), (3, 3.5)]


def png_pixels(path: Path):
    from PIL import Image

    with Image.open(path) as im:
        assert im.format == "PNG"
        return im.size, im.convert("L").getcolors(maxcolors=1 << 20)


def test_png_is_four_panels_of_the_size_asked_for(tmp_path):
    """With every panel drawn, and with MFU unknown (its panel says so): the size asked for, not
    blank, and only the PNG left in its directory (written to a temp file, then renamed)."""
    for mfu in (0.4, None):
        steps = [step(s, loss=6 * math.exp(-s / 10) + 2, lr=1e-3, mfu=mfu) for s in range(1, 31)]
        path = tmp_path / f"mfu-{mfu}" / "run.png"
        plots.write_png(steps, path, title="t")
        size, colors = png_pixels(path)
        assert size == (plots.PNG_SIZE_IN[0] * plots.PNG_DPI, plots.PNG_SIZE_IN[1] * plots.PNG_DPI)
        assert len(colors) > 20  # lines, text and axes: not a blank canvas
        assert [p.name for p in path.parent.iterdir()] == ["run.png"]


# ---- the commands, on EKS through the Kubernetes API peer ---------------------------------------------


def test_job_plot_on_eks_reads_the_leader_pods_whole_log(peer, tmp_path):  # noqa: F811 (the fixture)
    """`job plot` reads the leader pod's log through the Kubernetes logs API (the peer serves
    peer.api.logs), all of it (`tailLines` unset: kubernetes API reference, PodLogOptions); a job
    with no step yet is exit 2, one line, and writes nothing; `job tensorboard` on EKS says where
    the events are."""
    install_operator(peer)
    assert kcli("--set", "TENSORBOARD_DIR=/fsx/tensorboard", "job", "run", "-d").exit_code == 0
    k = kube(peer)
    [job] = peer.objects("pytorchjobs")
    set_condition(k, job, "Running")
    add_pod(k, peer, "fsdp", 0, log="no steps yet\n")
    png = tmp_path / "fsdp.png"
    r = kcli("job", "plot", "--out", str(png))
    assert (
        r.exit_code == 2 and "job fsdp has no finished step yet" in r.stderr and not png.exists()
    ), r.output
    lines = [step_line(s, max_steps=5000, loss=9 - s / 1000) for s in range(1, 3501)]  # > LOG_TAIL
    peer.api.logs[("fsdp", "fsdp-worker-0")] = "\n".join(lines) + "\n"
    r = kcli("job", "plot", "--out", str(png))
    assert r.exit_code == 0 and "3500 steps, 1..3500" in r.stderr, r.output
    assert png_pixels(png)[0] == (1200, 800)
    r = kcli("job", "tensorboard", "--print-only")
    assert r.exit_code == 0, r.output
    assert "tensorboard --logdir /fsx/tensorboard/fsdp --port 6006 --bind_all" in r.stdout
    assert "kubectl -n fsdp port-forward pod/<that pod> 6006:6006" in r.stdout


def test_job_plot_without_matplotlib_names_the_extra(cli, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a: None if n == "matplotlib" else real(n)
    )
    r = cli("job", "plot", "nojob")
    assert (
        r.exit_code == 1
        and "needs matplotlib" in r.stderr
        and "pip install 'fsdpctl[plot]'" in r.stderr
    )


def test_job_plot_refuses_what_is_not_a_png_file(cli, tmp_path):
    for out, why in (("x.txt", "is not a .png file"), (str(tmp_path), "is a directory")):
        r = cli("job", "plot", "nojob", "--out", out)
        assert r.exit_code == 2 and why in r.stderr, r.output


# ---- one short real run: the three pictures read back ---------------------------------------------------


def wandb_records(path: Path):
    """The protobuf Records of a W&B transaction log (the format in this module's docstring)."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    ident, magic, _version = struct.unpack("<4sHB", data[:7])
    assert (ident, magic) == (b":W&B", 0xBEE1)
    block, header, at, partial = 32768, 7, 7, b""
    while at + header <= len(data):
        left = block - at % block
        if left < header:  # a block's trailer: zeros
            at += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[at : at + header])
        if (length, kind) == (0, 0):
            at += left
            continue
        chunk = data[at + header : at + header + length]
        at += header + length
        partial = chunk if kind in (1, 2) else partial + chunk
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(partial)
            yield record


@pytest.mark.slow
def test_a_short_local_job_writes_tensorboard_wandb_and_a_png(cli, tmp_path):
    """One real local job (one node, one process, 5 steps, LOG_INTERVAL 2) with TENSORBOARD_DIR and
    an offline W&B run, then each picture read back with its own reader and compared with the
    trainer's step lines: TensorBoard scalars per step (float32), W&B history (exact, JSON doubles),
    the PNG of `job plot`, the curves of `job status --plot`, the command `job tensorboard` runs.
    The HF token the job had is in none of the trackers' files."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    sets = [
        "JOB_NAME=pics",
        "JOB_NODES=1",
        "MAX_STEPS=5",
        "LOG_INTERVAL=2",
        "WARMUP_STEPS=1",
        "SEQ_LEN=64",
        "PRECISION=fp32",
        "TENSORBOARD_DIR=/fsx/tensorboard",
        "WANDB_PROJECT=fsdpctl-test",
        "WANDB_MODE=offline",
        f"HF_TOKEN={TOKEN}",
    ]
    run = cli(*(f"--set={kv}" for kv in sets), "job", "run")
    assert run.exit_code == 0, run.output
    status = json.loads(cli("job", "status", "pics", "-o", "json").stdout)
    lines = [json.loads(x) for x in cli("job", "logs", "pics", "-o", "json").stdout.splitlines()]
    logged = {
        r["event"]["step"]: r["event"] for r in lines if r.get("event", {}).get("event") == "step"
    }
    assert sorted(logged) == [2, 4, 5]  # every LOG_INTERVAL and the last

    volume = cli.home / "volumes" / "fsx-claim"
    [run_dir] = (volume / "tensorboard" / "pics").iterdir()
    assert run_dir.name == status["run_id"]  # one TensorBoard run per fsdpctl run
    acc = EventAccumulator(str(run_dir))
    acc.Reload()
    assert {"train/loss", "train/lr", "perf/tokens_per_s", "train/grad_norm"} <= set(
        acc.Tags()["scalars"]
    )
    for tag, key in (
        ("train/loss", "loss"),
        ("train/lr", "lr"),
        ("perf/tokens_per_s", "tokens_per_s"),
    ):
        got = {e.step: e.value for e in acc.Scalars(tag)}
        assert sorted(got) == sorted(logged)
        assert all(got[s] == pytest.approx(logged[s][key], rel=1e-6) for s in logged)  # float32
    assert "perf/mfu" not in acc.Tags()["scalars"]  # no peak on a CPU: no made-up MFU

    [wandb_file] = (volume / "wandb" / "pics" / "wandb").glob("offline-run-*/run-*.wandb")
    history, config = {}, {}
    for record in wandb_records(wandb_file):
        if record.HasField("history"):
            items = {
                i.key or "/".join(i.nested_key): json.loads(i.value_json)
                for i in record.history.item
            }
            history[items["_step"]] = items
        if record.HasField("run"):
            config.update({i.key: json.loads(i.value_json) for i in record.run.config.update})
    assert sorted(history) == sorted(logged)
    assert all(history[s]["train/loss"] == logged[s]["loss"] for s in logged)
    assert (
        config["MODEL"] == "tiny"
        and config["RUN_ID"] == status["run_id"]
        and config["MAX_STEPS"] == 5
    )
    for f in (volume / "wandb").rglob("*"):
        assert not f.is_file() or TOKEN.encode() not in f.read_bytes(), f

    png = tmp_path / "pics.png"
    r = cli("job", "plot", "pics", "--out", str(png))
    assert r.exit_code == 0 and "3 steps, 2..5" in r.stderr, r.output
    assert png_pixels(png)[0] == (1200, 800)
    r = cli("job", "status", "pics", "--plot")
    assert r.exit_code == 0 and "loss by step" in r.stdout, r.output
    assert (
        "loss by step" not in cli("job", "status", "pics").stdout
    )  # off a terminal: the table only
    r = cli("job", "tensorboard", "pics", "--print-only")
    assert r.stdout.strip() == f"tensorboard --logdir {volume / 'tensorboard' / 'pics'} --port 6006"


def test_a_failing_tracker_warns_once_and_the_others_go_on():
    """A tracker whose disk filled (OSError ENOSPC from its writes) is dropped after one warning
    line; the other tracker keeps every step, and nothing is raised into the training loop."""
    import errno

    class Disk:
        def __init__(self, name: str, full_at: int | None):
            self.name, self.full_at, self.logged = name, full_at, []

        def log(self, step: int, values) -> None:
            if self.full_at is not None and step >= self.full_at:
                raise OSError(errno.ENOSPC, "No space left on device")
            self.logged.append(step)

        def flush(self) -> None:
            self.log(self.logged[-1] + 1 if self.logged else 0, {})

        def close(self) -> None:
            pass

    from fsdptrain.trackers import Trackers

    warned: list[str] = []
    full, fine = Disk("tensorboard", full_at=3), Disk("wandb", full_at=None)
    trackers = Trackers([full, fine], warned.append)
    for n in range(1, 6):
        trackers.step(step(n))
    trackers.flush()
    trackers.close()
    assert fine.logged[:5] == [1, 2, 3, 4, 5] and full.logged == [1, 2]
    assert warned == [
        "tensorboard: OSError: [Errno 28] No space left on device; training goes on without it"
    ]


@pytest.mark.xdist_group("torch")
def test_a_restarted_attempt_continues_the_tensorboard_step_axis(tmp_path):
    """torchrun restarts a failed attempt of the same run (same run id, same directory) from its
    last checkpoint: the TensorBoard writer opens with purge_step = the first step it redoes, so
    TensorBoard drops what the failed attempt logged from there on (SummaryWriter(purge_step=...): a
    SessionLog.START event at that step; EventAccumulator purges the older events at or after it)
    and one curve remains."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from fsdptrain.trackers import TensorBoard

    first = TensorBoard(tmp_path, purge_step=None)
    for n in range(1, 6):  # died after step 5; the last checkpoint was step 3
        first.log(n, {"train/loss": 10.0 + n})
    first.close()
    again = TensorBoard(tmp_path, purge_step=4)
    for n in range(4, 8):
        again.log(n, {"train/loss": float(n)})
    again.close()
    acc = EventAccumulator(str(tmp_path))
    acc.Reload()
    got = [(e.step, e.value) for e in acc.Scalars("train/loss")]
    assert got == [(1, 11.0), (2, 12.0), (3, 13.0), (4, 4.0), (5, 5.0), (6, 6.0), (7, 7.0)]

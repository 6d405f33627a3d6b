"""The trainer's event lines, written by fsdptrain.events and read back by fsdpctl (in-process, no
torch)."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

from fsdpctl.backends.local import engine as local
from fsdpctl.job import progress
from fsdptrain import events

STEP = events.Step(
    step=7,
    max_steps=10,
    loss=3.25,
    lr=1e-3,
    grad_norm=0.5,
    step_time_s=2.0,
    data_wait_frac=0.01,
    time=1_700_000_000.0,
    tokens_per_s=512.0,
    tokens_per_s_per_device=256.0,
    tflops_per_device=0.002,
    mfu=None,
    mem_peak_rss_gib=1.5,
)
SUMMARY = events.Summary(
    steps=10,
    start_step=0,
    final_loss=2.5,
    first_loss=6.0,
    losses=[6.0, 2.5],
    tokens_per_s=500.0,
    tokens_per_s_per_device=250.0,
    mfu=None,
    param_bytes=10,
    grad_bytes=10,
    optim_bytes=20,
    activation_bytes=5,
    checkpoint="/ckpt/step-00000010",
    export=None,
    stopped=False,
)
LEADER = events.Leader(node_rank=1, hostname="job-worker-1", world=4, time=1_700_000_000.0)
CHECKPOINT = events.Checkpoint(step=10, path="/ckpt/step-00000010")


def test_each_event_round_trips_through_its_line():
    lines = [events.to_line(e) for e in (LEADER, STEP, CHECKPOINT, SUMMARY)]
    assert list(events.parse(lines)) == [LEADER, STEP, CHECKPOINT, SUMMARY]


def test_the_line_format_readers_rely_on():
    line = events.to_line(STEP)
    assert line.startswith('{"event":"step","step":7,"max_steps":10,"loss":3.25,')
    record = json.loads(line)
    assert record["mfu"] is None  # an unknown peak is written as null
    assert record["mem_peak_rss_gib"] == 1.5
    assert (
        "mem_allocated_gib" not in record and "gpu_util_pct" not in record
    )  # not measured: left out
    assert json.loads(events.to_line(SUMMARY))["losses"] == [6.0, 2.5]


def test_a_cut_line_an_unknown_event_and_other_lines_are_skipped():
    full = events.to_line(STEP)
    lines = [
        "fsdptrain: model tiny (0.50M params)",
        full[: len(full) // 2],  # a crash mid-write
        '{"event":"compile","seconds":3}',  # a kind a newer trainer may add
        '{"event":"checkpoint","step":3}',  # a required field missing
        '{"event": 5}',
        "  " + events.to_line(CHECKPOINT) + "  ",
    ]
    assert list(events.parse(lines)) == [CHECKPOINT]


def test_a_reader_ignores_fields_it_does_not_know_and_tolerates_missing_optional_ones():
    line = json.dumps(
        {
            "event": "step",
            "step": 3,
            "max_steps": 9,
            "loss": 4.0,
            "tokens_per_s": 10.0,
            "step_time_s": 1.0,
        }
        | {"time": 5.0, "new_metric": 1}
    )
    (step,) = events.parse([line])
    assert isinstance(step, events.Step) and (step.step, step.lr, step.mfu) == (3, None, None)


def test_progress_reads_the_typed_events():
    later = replace(STEP, step=8, loss=3.0, mfu=0.4)
    lines = [events.to_line(e) for e in (LEADER, STEP, later, CHECKPOINT)]
    p = progress.progress(progress.parse_events(lines), now=STEP.time + 5)
    assert (p["step"], p["max_steps"], p["loss"], p["mfu"]) == (8, 10, 3.0, 0.4)
    assert p["percent"] == 80.0 and p["eta_s"] == 2 * 2.0 and p["last_progress_s"] == 5.0
    assert p["checkpoint"] == CHECKPOINT.path and p["summary"] is None
    done = progress.progress(progress.parse_events([*lines, events.to_line(SUMMARY)]), now=0)
    assert done["summary"] == json.loads(
        events.to_line(SUMMARY)
    )  # `job status -o json` shows the line
    empty = progress.progress([], now=0)
    assert empty["step"] == 0 and empty["max_steps"] is None and not math.isnan(empty["percent"])


def _node_logs(logs: Path, *texts: str) -> dict:
    """Node logs where the local backend keeps a run's (FSDPCTL_HOME/jobs/<job>/logs/<run-id>)."""
    logs.mkdir(parents=True, exist_ok=True)
    for i, text in enumerate(texts):
        (logs / f"node-{i}.log").write_text(text)
    return {"job": "j", "run_id": "r", "log_dir": str(logs)}


def test_local_leader_is_the_node_whose_log_names_it(tmp_path, monkeypatch):
    monkeypatch.setenv("FSDPCTL_HOME", str(tmp_path))
    logs = tmp_path / "jobs" / "j" / "logs" / "r"
    assert local.leader_log({"job": "j", "run_id": "r", "log_dir": str(logs)}) is None
    # no leader event yet (still in the rendezvous): node 0
    state = _node_logs(logs, "waiting\n", "waiting\n")
    assert local.leader_log(state) == logs / "node-0.log"
    state = _node_logs(logs, "agent\n", "agent\n" + events.to_line(LEADER) + "\n")
    assert local.leader_log(state) == logs / "node-1.log"
    # after an elastic restart the group ranks are assigned anew: the latest leader event wins
    moved = events.Leader(node_rank=0, hostname="job-worker-0", world=4, time=LEADER.time + 60)
    state = _node_logs(logs, events.to_line(moved) + "\n", events.to_line(LEADER) + "\n")
    assert local.leader_log(state) == logs / "node-0.log"

"""Runs you can trust (issue 28), the fast part: what fsdpctl decides around a run (which checkpoint
a run may resume, where a rerun starts) and what it says (status derived from what the processes
did, JSON that is JSON, log text that is never markup), on the pure core and on planted job
directories; the real runs are in tests/test_fault_kinds.py and tests/test_walkthrough.py.

Peers and sources: torch's own elastic agent, read in torch 2.13
(torch/distributed/elastic/agent/server/ api.py `_invoke_run`: it restarts while
`_remaining_restarts > 0`, logs "worker group successfully finished" on success;
multiprocessing/api.py: DefaultLogsSpecs makes its log dir with `tempfile.mkdtemp(prefix=
"torchelastic_")`, the TMPDIR the process has, and never removes it); RFC 8259 section 6 (NaN and
Infinity are not JSON) and Python's json (`allow_nan=False` refuses them), parsed back strictly;
rich's markup (rich.markup.render raises MarkupError on a closing tag nothing opened, `[/__w/...]`);
pipe(7) (a write of at most PIPE_BUF bytes is atomic); the real supervisor with short Python
programs as launchers, which print what torchrun's agent prints (the lines above, its root-cause
block), for the supervisor-killed cases.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from conftest import ROOT
from fsdpctl.adapters import netns
from fsdpctl.backends.local import engine as local
from fsdpctl.job import crilog, failures, kstatus, progress, record
from fsdptrain import events
from fsdptrain.config import TrainConfig
from fsdptrain.resume import MATH_KEYS, candidates, math_settings, problem, step_name

SETTLE = settings(
    max_examples=40, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck)
)


def cri(t: float, text: str, stream: str = "stdout") -> str:
    return crilog.format_line(t, stream, text)


def step_line(step: int, max_steps: int, loss: float, t: float) -> str:
    e = events.Step(
        step=step, max_steps=max_steps, loss=loss, step_time_s=0.5, time=t, tokens_per_s=1000.0
    )
    return events.to_line(e)


# ---- 1. a resume with other settings, or past MAX_STEPS, is refused ----------------------------------------

FIELDS = {f.name: f for f in dataclasses.fields(TrainConfig)}


def _other(name: str, value):
    """A value of the same kind that differs (and still validates)."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return value / 2 if value else 0.5
    return {"model": "tiny-gqa", "precision": "fp32", "sharding_strategy": "NO_SHARD"}.get(
        name, value + "x"
    )


@given(
    changed=st.sets(st.sampled_from(sorted(FIELDS)), min_size=1, max_size=4),
    world=st.integers(1, 16),
)
@SETTLE
def test_a_checkpoint_is_resumed_only_by_the_settings_that_saved_it(changed, world):
    """Any set of changed keys: refused exactly when one of them changes the math (MATH_KEYS), the
    line naming each such key with its old and new value; ALLOW_SETTING_CHANGES lets it through;
    other keys never count, nor does the world size."""
    saved_with = TrainConfig(max_steps=100, warmup_steps=5)
    meta = {"step": 20, "settings": math_settings(saved_with, world)}
    now = dataclasses.replace(
        saved_with,
        **{k: _other(k, getattr(saved_with, k)) for k in changed if k != "allow_setting_changes"},
    )
    why = problem(meta, now, world, where="ck")
    math = sorted(k for k in changed if k in MATH_KEYS)
    assert (why is not None) == bool(math), (changed, why)
    for k in math:
        env = FIELDS[k].metadata["env"]
        assert f"{env} {getattr(saved_with, k)} -> {getattr(now, k)}" in why
    allowed = dataclasses.replace(now, allow_setting_changes=True, max_steps=max(now.max_steps, 21))
    assert problem(meta, allowed, world, where="ck") is None
    # another world is no refusal: the global batch follows fsdptrain.elastic's rule
    # (tests/test_elastic.py)
    assert (
        problem({"step": 1, "settings": math_settings(saved_with, 2)}, saved_with, 3, where="ck")
        is None
    )


@given(
    step=st.integers(0, 200), max_steps=st.integers(1, 200), allow=st.booleans(), old=st.booleans()
)
@SETTLE
def test_a_checkpoint_at_or_past_max_steps_is_refused_whatever_else(step, max_steps, allow, old):
    """Nothing left to train is refused even with ALLOW_SETTING_CHANGES, and for a checkpoint of a
    trainer that kept no settings; below MAX_STEPS with the same settings it resumes."""
    cfg = TrainConfig(max_steps=max_steps, warmup_steps=0, allow_setting_changes=allow)
    meta = {"step": step} if old else {"step": step, "settings": math_settings(cfg, 2)}
    why = problem(meta, cfg, 2, where="ck")
    assert (why is not None) == (step >= max_steps)
    if why:
        assert f"at or past MAX_STEPS={max_steps}" in why and "\n" not in why


def _plant_checkpoint(root: Path, step: int, cfg: TrainConfig, world: int) -> Path:
    path = root / step_name(step)
    path.mkdir(parents=True)
    (path / "meta.json").write_text(
        json.dumps({"step": step, "settings": math_settings(cfg, world)})
    )
    (root / "latest").write_text(path.name)
    return path


def test_candidates_are_latest_then_every_older_complete_one(tmp_path):
    cfg = TrainConfig()
    for s in (2, 4, 6):
        _plant_checkpoint(tmp_path, s, cfg, 1)
    (tmp_path / "latest").write_text(step_name(4))
    (tmp_path / step_name(8)).mkdir()  # an interrupted save: no meta.json
    assert [p.name for p in candidates(tmp_path, "auto")] == [step_name(s) for s in (4, 6, 2)]
    assert candidates(tmp_path, "never") == [] and candidates(tmp_path, "/x/y") == [Path("/x/y")]


def test_the_pre_launch_check_refuses_before_torchrun(tmp_path, capfd):
    """fsdptrain.launch (the pod's command) reads the checkpoint it would resume on its node and
    exits 2 with one line before torchrun: the operator fails the job at once instead of after every
    restart."""
    from fsdptrain import launch

    root = tmp_path / "ckpt"
    _plant_checkpoint(root, 21, TrainConfig(max_steps=60, precision="fp32", lr=1e-3), 2)
    env = {"CHECKPOINT_DIR": str(root), "MAX_STEPS": "12", "PRECISION": "bf16", "WARMUP_STEPS": "1"}
    argv = ["--nnodes=2", "--nproc-per-node=1", "-m", "fsdptrain"]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(os, "execv", lambda *a: pytest.fail("torchrun was started"))
        for k in list(os.environ):
            if k in {f.metadata["env"] for f in FIELDS.values()}:
                mp.delenv(k)
        mp.setattr(os, "environ", {**os.environ, **env})
        assert launch.main(argv) == 2
    err = capfd.readouterr().err.strip().splitlines()
    assert (
        len(err) == 1 and "at or past MAX_STEPS=12" in err[0] and "PRECISION fp32 -> bf16" in err[0]
    )
    assert (
        "MAX_STEPS 60 -> 12" in err[0] and "LR 0.001 -> 0.003" in err[0] and "not retried" in err[0]
    )


def test_job_run_of_a_job_stopped_with_other_settings_is_refused_and_writes_nothing(cli):
    """The issue's run: stopped at step 21 of MAX_STEPS=60 (fp32, LR 1e-3), started again under a
    .env with MAX_STEPS=12 and bf16. Before: it resumed, trained `steps 22..12`, logged `loss nan`
    and Succeeded. Now: exit 2, one line naming each difference, no record, no state, nothing
    started."""
    saved = TrainConfig(max_steps=60, precision="fp32", lr=1e-3, seq_len=32)
    root = cli.home / "volumes" / "fsx-claim" / "checkpoints" / "fsdp"
    _plant_checkpoint(root, 21, saved, 2)
    (cli.cwd / ".env").write_text("MAX_STEPS=12\nPRECISION=bf16\nSEQ_LEN=32\n")
    r = cli("job", "run", "-d")
    assert r.exit_code == 2, r.output
    errors = [x for x in r.stderr.splitlines() if x.startswith("error:")]
    assert (
        len(errors) == 1
        and "at or past MAX_STEPS=12" in errors[0]
        and "PRECISION fp32 -> bf16" in errors[0]
    )
    assert (
        not (cli.home / "jobs" / "fsdp" / "state.json").exists()
        and not (cli.home / "records").exists()
    )
    same = cli(
        "--set",
        "PRECISION=fp32",
        "--set",
        "MAX_STEPS=60",
        "--set",
        "LR=0.001",
        "job",
        "run",
        "--dry-run",
    )
    assert same.exit_code == 0, (
        same.output
    )  # its own settings: it resumes (a dry run shows it would start)
    anyway = cli(
        "--set", "MAX_STEPS=80", "--set", "ALLOW_SETTING_CHANGES=true", "job", "run", "--dry-run"
    )
    assert anyway.exit_code == 0, anyway.output


def test_job_resume_without_a_checkpoint_is_one_line(cli):
    _plant_record(cli.home, "fsdp", "fsdp-1", {"MAX_STEPS": "9"}, created=1.0)
    r = cli("job", "resume", "fsdp", "--dry-run")
    assert r.exit_code == 2 and "has no checkpoint to resume" in r.said and "job run" in r.said, (
        r.output
    )


# ---- 2. a rerun starts where its run started, in a directory of its own -----------------------------------


def _plant_record(
    home: Path, job: str, run_id: str, settings_: dict, created: float, trainer=None
) -> dict:
    from fsdpctl.job import store as record_store
    from fsdpctl.settings import load

    cfg = load(dotenv={"JOB_NAME": job, **settings_})
    rec = record.build(cfg, run_id=run_id, code={}, image=None, created=created, secret_name="s")
    rec["trainer"] = trainer
    record_store.save(rec)
    return rec


def _start(step: int, resumed: str | None) -> dict:
    return {
        "python": "3",
        "torch": "2",
        "transformers": "5",
        "cuda": None,
        "nccl": None,
        "device": "cpu",
        "start_step": step,
        "resumed_from": resumed,
        # a fingerprint as fsdptrain.fingerprint makes one (a record's parts are checked when read
        # back)
        "dataset": {"source": "builtin", "local": False},
        "tokenizer": {"source": "builtin", "local": False},
        "time": 0.0,
    }


@pytest.mark.parametrize(
    "trainer, resume",
    [
        (_start(0, None), "never"),
        (
            _start(20, "/anywhere/the/trainer/saw/step-00000020"),
            "/fsx/checkpoints/fsdp/step-00000020",
        ),
        (
            _start(12, None),
            "/fsx/checkpoints/fsdp/step-00000012",
        ),  # an older trainer: named by its step
    ],
    ids=["afresh", "resumed", "older trainer"],
)
def test_a_rerun_starts_where_its_run_started_in_a_directory_of_its_own(cli, trainer, resume):
    """Before: `job rerun` of a finished job resumed the job's latest checkpoint (start_step 6 of
    MAX_STEPS 6: nothing trained). Now its RESUME is the recorded start (never, or the checkpoint
    the run resumed, by its pod path) and CHECKPOINT_SUBDIR=reruns/<its run id>: it neither resumes
    nor overwrites the job's."""
    from fsdpctl.cli import job_record_cmd

    rec = _plant_record(cli.home, "fsdp", "fsdp-a", {"MAX_STEPS": "30"}, 1.0, trainer)

    class Ctx:
        def find_root(self):
            from fsdpctl.cli.common import AppState

            return type("C", (), {"obj": AppState(env_file=cli.cwd / ".env")})()

    got = job_record_cmd._rerun_start(Ctx(), rec, "fsdp-new")
    assert got == {"RESUME": resume, "CHECKPOINT_SUBDIR": "reruns/fsdp-new"}


def test_a_rerun_of_a_run_that_never_said_where_it_started_is_refused(cli):
    _plant_record(cli.home, "fsdp", "fsdp-a", {"MAX_STEPS": "30"}, 1.0, None)
    r = cli("job", "rerun", "fsdp-a", "--dry-run")
    assert (
        r.exit_code == 2
        and "does not say where its run started" in r.said
        and "RESUME=never" in r.said
    )


def test_job_resume_continues_the_jobs_own_line_not_a_rerun(cli):
    from fsdpctl.cli import record_reading

    own = _plant_record(cli.home, "fsdp", "fsdp-a", {"MAX_STEPS": "30"}, 1.0)
    rerun = _plant_record(
        cli.home, "fsdp", "fsdp-b", {"MAX_STEPS": "30", "CHECKPOINT_SUBDIR": "reruns/b"}, 2.0
    )
    assert record_reading.main_line(rerun)["run_id"] == own["run_id"]
    assert record_reading.main_line(own) is own


# ---- 3. JSON carries no NaN ----------------------------------------------------------------------------

JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=20,
)


def _strict(text: str):
    def refuse(name):
        raise ValueError(f"not JSON: {name}")

    return json.loads(text, parse_constant=refuse)


@given(doc=JSONISH)
@SETTLE
def test_every_document_is_strict_json_and_a_non_number_is_null(doc, capsys):
    """Whatever floats a document holds (NaN, inf: a run with no step, a diverged loss), -o json is
    JSON a strict parser takes, each non-finite number null and every other value as it was."""
    from fsdpctl.cli.common import Output, emit

    emit(doc, Output.json)
    back = _strict(capsys.readouterr().out)

    def same(a, b):
        if isinstance(a, float):
            return b is None if not math.isfinite(a) else b == a
        if isinstance(a, dict):
            return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
        if isinstance(a, list):
            return len(a) == len(b) and all(map(same, a, b))
        return a == b

    assert same(doc, back)


def _planted(home: Path, name: str, node_logs: list[str], **state_extra) -> Path:
    jdir = home / "jobs" / name
    logs = jdir / "logs" / f"{name}-run"
    logs.mkdir(parents=True)
    for n, text in enumerate(node_logs):
        (logs / f"node-{n}.log").write_text(text)
    state = {
        "job": name,
        "run_id": f"{name}-run",
        "phase": "Succeeded",
        "created": 1.0e9,
        "replicas": len(node_logs),
        "log_dir": str(logs),
        "checkpoint_dir": None,
        "launchers": [],
        "max_restarts": 0,
        **state_extra,
    }
    (jdir / "state.json").write_text(json.dumps(state))
    return logs


def test_status_of_a_run_that_trained_nothing_is_strict_json(cli):
    """The summary of a run with no step (what a resume past MAX_STEPS printed): losses NaN in the
    trainer's line; `job status -o json` says null, and the table says no step was trained."""
    summary = events.Summary(
        steps=0,
        start_step=6,
        final_loss=float("nan"),
        first_loss=float("nan"),
        losses=[],
        tokens_per_s=0.0,
        tokens_per_s_per_device=0.0,
        mfu=None,
        param_bytes=0,
        grad_bytes=0,
        optim_bytes=0,
        activation_bytes=0,
        checkpoint=None,
        export=None,
        stopped=False,
    )
    _planted(cli.home, "nan", [cri(1.0e9, events.to_line(summary))])
    r = cli("job", "status", "nan", "-o", "json")
    assert r.exit_code == 0 and "NaN" not in r.stdout
    assert _strict(r.stdout)["summary"]["final_loss"] is None


# ---- 5. every string from a log reaches the terminal as it is -------------------------------------------

MARKUPISH = st.lists(
    st.sampled_from(
        [
            "[",
            "]",
            "[/",
            "[/__w/1/s/torch]",
            "[bold]",
            "[/bold]",
            "[rank0]:",
            "[link=x]",
            "\\",
            "x",
            " ",
            ":",
            "[red",
            "]]",
            "[[",
            "[#ff0000]",
        ]
    ),
    min_size=1,
    max_size=12,
).map("".join)


@given(text=MARKUPISH)
@example(
    text="gloo: [/__w/1/s/third_party/gloo/transport/tcp/pair.cc:534] Connection closed by peer"
)
@settings(max_examples=25, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))
def test_any_log_line_goes_through_every_view_as_it_is(cli, text):
    """gloo's `[/__w/...]` in a failure line crashed `job status` with MarkupError. Generated lines
    of brackets, tags and backslashes as a failing rank's error, the supervisor's reason, a
    checkpoint path, a pre-step line and a setting: status (table and JSON), list, logs, wait,
    history, describe and diff neither fail nor lose a character."""
    import shutil

    shutil.rmtree(cli.home, ignore_errors=True)
    marked = text.replace("\n", " ").strip() or "["
    log = [
        cri(1.0e9, "Traceback (most recent call last):", "stderr"),
        cri(1.0e9, f"[rank0]: RuntimeError: {marked}", "stderr"),
        cri(1.0e9, events.to_line(events.Checkpoint(step=1, path=f"/ck/{marked}"))),
        cri(1.0e9, failures.ROOT_CAUSE, "stderr"),
        cri(1.0e9, "  rank      : 0 (local_rank: 0)", "stderr"),
        cri(1.0e9, "  exitcode  : 1 (pid: 1)", "stderr"),
    ]
    why = f"node 0 exited with code 1 {marked}"
    _planted(cli.home, "mk", ["".join(log)], phase="Failed", reason=why, failed_node=0)
    _plant_record(cli.home, "mk", "mk-run", {"DATASET_TEXT_FIELD": marked[:60] or "x"}, 1.0)
    for args in (
        ("job", "status", "mk"),
        ("job", "list"),
        ("job", "logs", "mk"),
        ("job", "wait", "mk"),
        ("job", "history", "mk"),
        ("job", "describe", "mk"),
        ("job", "diff", "mk-run", "mk-run"),
    ):
        r = cli(*args)
        assert r.exit_code in (0, 3) and "Traceback" not in r.stderr, (args, r.output)
    status = cli("job", "status", "mk")
    assert f"RuntimeError: {marked}" in status.stdout and f"/ck/{marked}" in status.stdout
    assert (marked[:60] or "x") in cli("job", "describe", "mk").stdout


# ---- 4. status is derived from what the processes did ----------------------------------------------------

# a launcher as torchrun behaves, on the real supervisor: agent lines on stderr, the trainer's
# events (node 0)
FAKE = r"""
import json, os, signal, sys, time
AGENT = "I1204 10:00:00.000000 PID torch/distributed/elastic/agent/server/api.py:932]"
node = int(os.environ["FSDPCTL_POD"].rsplit("-", 1)[1])
steps, step_s, end = int(os.environ["FAKE_STEPS"]), float(os.environ["FAKE_STEP_S"]), os.environ["FAKE_END"]
stop = []
signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
def agent(msg):
    print(AGENT.replace("PID", str(os.getpid())) + " " + msg, file=sys.stderr, flush=True)
def event(**e):
    if node == 0:
        print(json.dumps(e), flush=True)
import tempfile
print("tmp " + tempfile.mkdtemp(prefix="torchelastic_"), flush=True)
agent("[default] Rendezvous'ing worker group")
event(event="leader", node_rank=0, hostname="h", world=2, time=time.time())
summary = dict(event="summary", start_step=0, first_loss=5.0, tokens_per_s=1.0,
               tokens_per_s_per_device=1.0, mfu=None, param_bytes=0, grad_bytes=0, optim_bytes=0,
               activation_bytes=0, checkpoint=None, export=None)
for step in range(1, steps + 1):
    time.sleep(step_s)
    event(event="step", step=step, max_steps=steps, loss=5.0 - step / 100, step_time_s=step_s,
          time=time.time(), tokens_per_s=1000.0)
    if stop:
        event(**summary, steps=step, final_loss=5.0, losses=[5.0] * step, stopped=True)
        print(f"SignalException: Process {os.getpid()} got signal: 15", file=sys.stderr, flush=True)
        sys.exit(1)
if end == "fail":
    print("Root Cause (first observed failure):", file=sys.stderr, flush=True)
    print(f"  rank      : {node} (local_rank: 0)", file=sys.stderr, flush=True)
    print("  exitcode  : 1 (pid: 1)", file=sys.stderr, flush=True)
    sys.exit(1)
if end == "silent":
    os.kill(os.getpid(), signal.SIGKILL)
event(**summary, steps=steps, final_loss=5.0, losses=[5.0] * steps, stopped=False)
agent("[default] worker group successfully finished. Waiting 300 seconds for other agents to finish.")
"""


def fake_job(name: str, *, steps: int, step_s: float, end: str, replicas: int = 2) -> dict:
    """A PyTorchJob as render shapes it whose container is FAKE: the real supervisor runs one per
    replica."""
    env = [
        {"name": "FAKE_STEPS", "value": str(steps)},
        {"name": "FAKE_STEP_S", "value": str(step_s)},
        {"name": "FAKE_END", "value": end},
    ]
    command = ["python", "-c", FAKE, f"--rdzv-endpoint={name}-worker-0:29400"]
    return {
        "metadata": {"name": name},
        "spec": {
            "elasticPolicy": {"rdzvId": f"{name}-run", "rdzvBackend": "c10d", "maxRestarts": 0},
            "nprocPerNode": "1",
            "runPolicy": {"backoffLimit": 0},
            "pytorchReplicaSpecs": {
                "Worker": {
                    "replicas": replicas,
                    "restartPolicy": "ExitCode",
                    "template": {
                        "spec": {
                            "terminationGracePeriodSeconds": 5,
                            "volumes": [],
                            "containers": [{"command": command, "env": env, "volumeMounts": []}],
                        }
                    },
                }
            },
        },
    }


def until(what, timeout: float = 60, poll: float = 0.05):
    deadline = time.monotonic() + timeout
    while not (value := what()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(poll)
    return value


def running(name: str) -> dict:
    return until(
        lambda: (
            (s := local.read_state(local.job_dir(name)))
            and s["phase"] == "Running"
            and len(s["launchers"]) == s["replicas"]
            and s
        )
    )


def kill_supervisor(state: dict) -> None:
    os.kill(state["supervisor"]["pid"], signal.SIGKILL)
    until(lambda: not local.same_process(state["supervisor"]))


def said_everywhere(cli, name: str) -> dict:
    """What every view says of the job: status (table and JSON), list, wait; all must agree."""
    status = cli("job", "status", name, "-o", "json")
    assert status.exit_code == 0, status.output
    phase = _strict(status.stdout)["phase"]
    listed = {r["job"]: r["phase"] for r in _strict(cli("job", "list", "-o", "json").stdout)}
    waited = cli("job", "wait", name, "--timeout", "0", "-o", "json")
    assert listed[name] == phase == _strict(waited.stdout)["phase"], (phase, listed, waited.output)
    return _strict(status.stdout)


@pytest.fixture
def home(cli, monkeypatch):
    """The isolated home, every process of its jobs SIGKILLed at the end (loopback unless a test
    asks)."""
    monkeypatch.setenv("FSDPCTL_LOCAL_NETNS", "0")
    yield cli
    for jdir in (cli.home / "jobs").glob("*"):
        for pid in local.job_processes(jdir.name):
            local.signal_marked(pid, signal.SIGKILL, local.job_mark(jdir.name))


@pytest.mark.skipif(
    not netns.available()[0], reason="no network namespace per node here (root, iproute2)"
)
@pytest.mark.slow  # 3-7 s: the fast lane keeps under 2 minutes (CI runs it in the slow lane)
def test_a_job_whose_supervisor_was_killed_ends_as_its_processes_did(home, monkeypatch):
    """The issue's case: the supervisor SIGKILLed while the job runs on. Before: the job succeeded,
    but `job status`, `list` and `wait` said Failed, state.json said Running, and the namespaces,
    bridge, veths and /etc/netns entries stayed. Now every view says Succeeded (from the agents'
    success lines and the trainer's summary), state.json says so too, the network is gone,
    torchrun's temp dirs (made under the job) are gone, and `job stop` says there is nothing to
    stop."""
    monkeypatch.delenv("FSDPCTL_LOCAL_NETNS")
    name = f"sk-{os.getpid()}"
    local.start(fake_job(name, steps=30, step_s=0.1, end="succeed"), secret_env={})
    state = running(name)
    net = netns.Network(state["net_index"], name, 2)
    try:
        _judged_from_the_launchers(home, name, state, net)
    finally:  # namespaces are the machine's: never left behind, whatever failed
        netns.destroy(net)


def _judged_from_the_launchers(home, name: str, state: dict, net: netns.Network) -> None:
    assert netns.exists(net)
    kill_supervisor(state)
    assert said_everywhere(home, name)["phase"] == "Orphaned"
    until(lambda: not local.pods_alive(state), timeout=60)
    final = said_everywhere(home, name)
    assert final["phase"] == "Succeeded" and "supervisor gone" in final["reason"]
    assert local.read_state(local.job_dir(name))["phase"] == "Succeeded"
    assert not netns.exists(net) and not (Path("/etc/netns") / net.namespace(0)).exists()
    temp = [
        line.split()[1]
        for f in local.log_files(state)
        for line in crilog.texts(f)
        if line.startswith("tmp ")
    ]
    assert len(temp) == 2 and all(
        str(local.job_dir(name)) in t and not Path(t).exists() for t in temp
    )
    stop = home("job", "stop", name)
    assert stop.exit_code == 0 and "not running (Succeeded)" in stop.said


@pytest.mark.parametrize(
    "end, phase, why",
    [
        ("fail", "Failed", "node 0 exited with code 1"),
        ("silent", "Failed", "ended without saying how"),
    ],
)
def test_a_job_whose_supervisor_died_is_failed_only_when_its_processes_say_so(
    home, end, phase, why
):
    name = f"sk{end}"
    local.start(fake_job(name, steps=3, step_s=0.2, end=end), secret_env={})
    kill_supervisor(running(name))
    until(lambda: local.effective_phase(local.read_state(local.job_dir(name))) != "Orphaned")
    final = said_everywhere(home, name)
    assert final["phase"] == phase and why in final["reason"], final["reason"]
    if end == "fail":
        assert (
            final["failure"]["rank"] == 0
        )  # the node's own root-cause block, as with a supervisor
    cleaned = home("cleanup", "--yes")
    assert cleaned.exit_code == 0 and not local.job_dir(name).joinpath("state.json").exists()


def test_status_of_a_stopping_job_names_what_stop_waits_for(home):
    """`job stop` says what it waits for: the step in flight and its stop checkpoint, then the
    launchers."""
    from fsdpctl.backends.local.report import job_report

    local.start(fake_job("stopw", steps=200, step_s=0.3, end="succeed"), secret_env={})
    running("stopw")
    until(lambda: job_report(local.read_state(local.job_dir("stopw")), float("inf"))["step"] >= 1)
    r = home("job", "stop", "stopw")
    assert r.exit_code == 0 and "Stopped" in r.said, r.output
    assert "waiting: step " in r.stderr and "to finish and its stop checkpoint" in r.stderr, (
        r.stderr
    )


# ---- 6. checkpoint errors: the first sentences, one write per line ----------------------------------------


@given(
    words=st.lists(
        st.text(alphabet="abcdefghij. ", min_size=1, max_size=12), min_size=1, max_size=80
    )
)
@SETTLE
def test_a_long_cause_is_cut_at_a_sentence_or_word_never_inside_one(words):
    from fsdptrain.checkpoint import REASON_CHARS, shortened

    text = " ".join(words)
    short = shortened(text)
    flat = " ".join(text.split())
    assert len(short) <= REASON_CHARS
    if len(flat) <= REASON_CHARS:
        assert short == flat
    else:
        body = short.removesuffix("…")
        assert flat.startswith(body) and (flat[len(body)] == " " if len(body) < len(flat) else True)


def test_an_error_line_is_one_atomic_write_below_pipe_buf(monkeypatch):
    """Two ranks printing at once glued `fsdptrain: error: A` and `...: B` into one line: print()
    writes the text and the newline apart. print_error makes one write(2) of less than PIPE_BUF
    bytes (pipe(7))."""
    from fsdptrain.config import PIPE_BUF, print_error

    writes = []
    monkeypatch.setattr(os, "write", lambda fd, data: writes.append(data) or len(data))
    print_error("x " * 5000)
    print_error("loading failed", " (checked before torchrun: not retried)")
    assert len(writes) == 2 and all(
        len(w) < PIPE_BUF and w.endswith(b"\n") and w.count(b"\n") == 1 for w in writes
    )
    assert writes[1] == b"fsdptrain: error: loading failed (checked before torchrun: not retried)\n"


# ---- 7. a spent restart budget says so ------------------------------------------------------------------


def _round(addr_port: int) -> list[str]:
    return [kstatus.ROUND_DONE, "  master_addr=10.0.0.1", f"  master_port={addr_port}"]


@pytest.mark.parametrize(
    "max_restarts, rounds, spent", [(1, 2, True), (2, 2, False), (0, 1, False), (3, 4, True)]
)
def test_a_failed_job_that_used_every_restart_says_the_budget_is_spent(
    cli, max_restarts, rounds, spent
):
    lines = [x for r in range(rounds) for x in _round(40000 + r)]
    lines += [kstatus.GROUP_RESTART] * (rounds - 1)
    lines += [failures.ROOT_CAUSE, "  rank      : 0 (local_rank: 0)", "  exitcode  : 1 (pid: 1)"]
    lines += ["Traceback (most recent call last):", "RuntimeError: boom"]
    _planted(
        cli.home,
        "budget",
        ["".join(cri(1.0e9, x, "stderr") for x in lines)],
        phase="Failed",
        reason="node 0 exited with code 1 (1-127 are permanent under restartPolicy ExitCode)",
        failed_node=0,
        max_restarts=max_restarts,
    )
    r = _strict(cli("job", "status", "budget", "-o", "json").stdout)
    assert r["reason"].startswith(f"MAX_RESTARTS={max_restarts} spent") == spent, r["reason"]
    assert r["failure"]["error"] == "RuntimeError: boom"


# ---- 8. torchrun's temp dirs are the job's --------------------------------------------------------------


def test_each_launcher_gets_a_temp_dir_of_its_own_under_the_job(tmp_path):
    spec = local.spec_from_job(
        fake_job("t", steps=1, step_s=0, end="succeed"), tmp_path / "jobs" / "t"
    )
    dirs = {
        launch.env["TMPDIR"] for launch in local.launches(spec, "127.0.0.1:1", {"TMPDIR": "/tmp"})
    }
    assert dirs == {str(local.temp_dir(tmp_path / "jobs" / "t", n)) for n in (0, 1)}


# ---- what users met -------------------------------------------------------------------------------------


@given(runs=st.lists(st.tuples(st.integers(0, 30), st.integers(1, 30)), min_size=1, max_size=5))
@SETTLE
def test_the_curve_across_runs_is_each_run_from_where_it_started(runs):
    """Runs (start step, steps trained): the merged curve has each step once, from the last run that
    trained it and started before it, as `job plot` draws the job across its stops and resumes."""
    logs, expect = [], {}
    for i, (start, n) in enumerate(runs):
        steps = [
            events.Step(
                step=s, max_steps=99, loss=i + s / 100, step_time_s=1, time=0, tokens_per_s=1
            )
            for s in range(start + 1, start + n + 1)
        ]
        start_event = events.Start(
            record_id="",
            python="",
            torch="",
            transformers="",
            cuda=None,
            nccl=None,
            device="cpu",
            start_step=start,
            dataset={},
            tokenizer={},
            time=0,
        )
        logs.append([start_event, *steps])
        expect = {k: v for k, v in expect.items() if k <= start} | {e.step: e.loss for e in steps}
    from fsdpctl.cli.plots import steps_of

    got = {e.step: e.loss for e in steps_of(progress.across_runs(logs))}
    assert got == expect


def test_a_run_that_continues_a_checkpoint_continues_its_tracker_run(monkeypatch):
    """TensorBoard and W&B show a job's whole curve across stops and resumes: RESUME=auto writes
    into the run kept in the checkpoint's meta.json; an explicit RESUME (a rerun) and a fresh start
    get their own."""
    from fsdptrain.build import _tracker_run

    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "now")
    assert _tracker_run(TrainConfig(), {"tracker_run": "first"}) == "first"
    assert _tracker_run(TrainConfig(resume="/c/step-00000004"), {"tracker_run": "first"}) == "now"
    assert (
        _tracker_run(TrainConfig(), None) == "now"
        and _tracker_run(TrainConfig(), {"step": 4}) == "now"
    )


def test_stages_before_the_first_step():
    leader = events.Leader(node_rank=0, hostname="h", world=2, time=0)
    assert progress.stage([], 1, 2) == "rendezvous 1/2"
    assert progress.stage([leader], 2, 2) == "process group ready"
    assert (
        progress.stage([leader, events.Stage(stage="loading data", time=0)], 2, 2) == "loading data"
    )
    start = events.Start(
        record_id="",
        python="",
        torch="",
        transformers="",
        cuda=None,
        nccl=None,
        device="cpu",
        start_step=5,
        dataset={},
        tokenizer={},
        time=0,
    )
    assert progress.stage([leader, start], 2, 2) == "first step (after step 5)"


def test_an_ended_job_shows_no_eta_and_labels_its_throughput():
    r = {
        "max_steps": 8,
        "step": 5,
        "percent": 62.5,
        "eta_s": 3.0,
        "loss": 5.0,
        "tokens_per_s": 900.0,
        "last_progress_s": 1.0,
    }
    for phase, eta in (
        ("Stopped", False),
        ("Succeeded", False),
        ("Failed", False),
        ("Running", True),
    ):
        rows = dict(progress.progress_rows({**r, "phase": phase}))
        assert ("ETA" in rows["progress"]) == eta and rows["throughput"].endswith("(last step)")


def test_history_lists_every_run_with_what_changed_and_how_it_ended(cli):
    _plant_record(cli.home, "h", "h-1", {"MAX_STEPS": "8"}, 1.0, _start(0, None))
    _plant_record(cli.home, "h", "h-2", {"MAX_STEPS": "8"}, 2.0, _start(5, "/c/h/step-00000005"))
    _plant_record(
        cli.home,
        "h",
        "h-3",
        {"MAX_STEPS": "8", "LR": "0.001"},
        3.0,
        _start(5, "/c/h/step-00000005"),
    )
    jdir = cli.home / "jobs" / "h"
    for run, text in (("h-1", [step_line(5, 8, 5.0, 1.0)]), ("h-2", [])):
        (jdir / "logs" / run).mkdir(parents=True)
        (jdir / "logs" / run / "node-0.log").write_text("".join(cri(1.0, x) for x in text))
    logs = jdir / "logs" / "h-3"
    logs.mkdir(parents=True)
    (logs / "node-0.log").write_text(cri(1.0, step_line(8, 8, 4.0, 1.0)))
    state = {
        "job": "h",
        "run_id": "h-3",
        "phase": "Succeeded",
        "created": 3.0,
        "replicas": 1,
        "log_dir": str(logs),
        "checkpoint_dir": None,
        "launchers": [],
    }
    (jdir / "state.json").write_text(json.dumps(state))
    rows = _strict(cli("job", "history", "h", "-o", "json").stdout)
    assert [r["run_id"] for r in rows] == ["h-1", "h-2", "h-3"]
    assert (
        rows[0]["from"] == "afresh (step 0)"
        and rows[1]["from"] == "from checkpoint step-00000005 (step 5)"
    )
    assert rows[0]["outcome"] == "ended without a summary at step 5 (failed or killed)"
    assert rows[2]["changed"] == {"LR": ["0.003", "0.001"]} and rows[2]["outcome"].startswith(
        "Succeeded"
    )
    table = cli("job", "history", "h").stdout
    assert "LR=0.001" in table and "h-2" in table


def test_describe_has_one_row_per_setting_not_at_its_default(cli):
    _plant_record(cli.home, "d", "d-1", {"MAX_STEPS": "8", "SEQ_LEN": "64"}, 1.0)
    text = cli("job", "describe", "d").stdout
    rows = [line.split() for line in text.splitlines() if line.startswith("  ")]
    assert rows == [
        ["JOB_NAME", "d", ".env"],
        ["SEQ_LEN", "64", ".env"],
        ["MAX_STEPS", "8", ".env"],
    ], text
    assert "3 not at their default" in text


def test_cleanup_asks_first_and_does_nothing_unless_told_yes(cli):
    """`cleanup` lists what it would remove and asks; n, Enter or end of input leave everything
    (exit 2); y removes; --yes does not ask."""
    for name in ("c1", "c2"):
        _planted(cli.home, name, [""])
    for answer in ("n\n", "\n", ""):
        r = cli("cleanup", input=answer)
        assert r.exit_code == 2 and "nothing removed" in r.stderr, (answer, r.output)
        assert (cli.home / "jobs" / "c1" / "state.json").exists()
    r = cli("cleanup", input="y\n")
    assert r.exit_code == 0 and not (cli.home / "jobs" / "c1" / "state.json").exists()
    _planted(cli.home, "c3", [""])
    assert (
        cli("cleanup", "--yes").exit_code == 0
        and not (cli.home / "jobs" / "c3" / "state.json").exists()
    )
    assert cli("cleanup").exit_code == 0  # nothing left: nothing asked


def test_max_steps_3_just_works_and_a_default_in_a_refusal_says_so(cli):
    r = cli("--set", "MAX_STEPS=3", "config", "show", "-o", "json")
    shown = _strict(r.stdout)
    assert r.exit_code == 0 and shown["settings"]["WARMUP_STEPS"] == 3
    assert shown["sources"]["WARMUP_STEPS"] == "default, at most MAX_STEPS"
    bad = cli("--set", "MAX_STEPS=3", "--set", "WARMUP_STEPS=5", "config", "validate")
    assert bad.exit_code == 2 and "WARMUP_STEPS=5 (--set) exceeds MAX_STEPS=3 (--set)" in bad.said
    from fsdpctl.settings import with_sources

    line = with_sources(
        ["JOB_NODES=2 needs a shared volume"], {}, {"JOB_NODES": "default"}, "tiny"
    )[0]
    assert line == "JOB_NODES=2 (default) needs a shared volume"


TORCH_LINES = [
    "I1204 18:47:57.684000 8308 torch/distributed/launcher/api.py:254] Starting elastic_operator with launch",
    "[W1204 18:47:57.241436884 socket.cpp:207] [c10d] The hostname of the client socket cannot be retrieved.",
    "[rank0]:W1204 18:47:57.684000 8308 torch/distributed/fsdp/_fully_shard.py:1] something",
]
TRAINER_LINES = [
    "step     6/8 | loss 5.7031 | lr 2.32e-03",
    "fsdptrain: error: CHECKPOINT_DIR='/x' is not writable",
    "[rank0]: RuntimeError: boom",
    "Traceback (most recent call last):",
]


def test_trainer_only_leaves_out_torchs_own_logging(cli):
    assert [failures.from_torch(x) for x in TORCH_LINES + TRAINER_LINES] == [True] * 3 + [False] * 4
    _planted(cli.home, "tl", ["".join(cri(1.0, x, "stderr") for x in TORCH_LINES + TRAINER_LINES)])
    out = cli("job", "logs", "tl", "--trainer-only").stdout.splitlines()
    assert out == TRAINER_LINES


# the pages the docs site builds itself (scripts/docs_reference.py): links to them are to the built site
GENERATED_PAGES = {"docs/reference/settings.md", "docs/reference/cli.md"}


def doc_pages() -> list[Path]:
    """README.md and every page of the docs site (docs/)."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def test_the_docs_name_only_files_the_repository_has():
    """Every relative link of README.md and the docs pages (from the page's own folder) and every
    backticked repository path in them exists (what the tools make, a hidden directory such as
    benchmarks/.venvs/, aside)."""
    made = re.compile(r"(^|/)\.")
    missing = set()
    for page in doc_pages():
        text = page.read_text()
        for link in re.findall(r"\]\(((?!https?:|#)[^)\s]+)\)", text):
            target = (page.parent / link.split("#")[0]).resolve()
            if str(target.relative_to(ROOT)) not in GENERATED_PAGES and not target.exists():
                missing.add(f"{page.relative_to(ROOT)}: {link}")
        ticked = re.findall(
            r"`((?:src|tests|trainer|templates|benchmarks|scripts|docker|terraform|eksctl|docs)/"
            r"[\w./-]+)`",
            text,
        )
        missing |= {
            f"{page.relative_to(ROOT)}: {p}"
            for p in ticked
            if not made.search(p) and not (ROOT / p).exists() and p not in GENERATED_PAGES
        }
    assert not missing, sorted(missing)
    readme = (ROOT / "README.md").read_text()
    assert "## Your first own job" in readme and "## Where to go next" in readme


def _leaves():
    import typer.main

    from fsdpctl.cli import app

    def walk(cmd, path):
        subs = getattr(cmd, "commands", None)
        if subs is None:
            yield path, cmd
            return
        for name in sorted(subs):
            if not subs[name].hidden:
                yield from walk(subs[name], (*path, name))

    return dict(walk(typer.main.get_command(app), ()))


def test_every_verb_has_the_flags_the_docs_give_it():
    """Each `fsdpctl ...` line of README.md and the docs pages: the command it names takes every
    option the line shows (`[--dry-run]`, `[-o json]`, ...); and every command that changes state has
    --dry-run."""
    leaves = _leaves()
    lines = [line for page in doc_pages() for line in page.read_text().splitlines()]
    for line in lines:
        if not line.startswith("fsdpctl "):
            continue
        words = line.split("#")[0].split()
        path = next(
            (p for n in (2, 1) if (p := tuple(w for w in words[1 : 1 + n])) in leaves), None
        )
        if path is None:
            continue
        opts = {o for p in leaves[path].params for o in getattr(p, "opts", ())}
        for flag in re.findall(
            r"(?<![\w-])(--[a-z][\w-]*|-[a-z])\b", " ".join(words[1 + len(path) :])
        ):
            if flag not in ("--set", "-s", "--env-file", "--debug"):
                assert flag in opts, (line, flag)
    changes = {("job", v) for v in ("run", "rerun", "resume", "stop", "plot")} | {
        ("cleanup",),
        ("quickstart",),
    }
    changes |= {
        p
        for p in leaves
        if p[0] in ("deploy", "image", "model", "data") and p != ("deploy", "status")
    }
    changes |= {("cluster", "create"), ("cluster", "delete")}
    for path in changes:
        assert "--dry-run" in {o for p in leaves[path].params for o in getattr(p, "opts", ())}, path


@pytest.mark.parametrize("delay", [0.25, 0.45])
def test_ctrl_c_while_the_cli_starts_is_one_line(cli, delay):
    """SIGINT while the executable is still importing typer, rich and pydantic (a few hundred ms
    after the interpreter started): before, a KeyboardInterrupt traceback from inside some import;
    now `interrupted` and 130. A machine fast enough to have finished first has nothing to judge."""
    from conftest import _terminal_signals

    p = subprocess.Popen(
        cli.argv("job", "list"),
        env=cli.env(),
        cwd=cli.cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_terminal_signals,
    )
    time.sleep(delay)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    if (
        p.returncode in (0, -signal.SIGINT) and not err
    ):  # it finished first, or Python had not started yet
        return
    assert p.returncode == 130 and err.strip() == "interrupted" and out == "", (p.returncode, err)


def test_no_long_install_step_is_silent():
    """Issue 38 item 6: the install, checkov's venv and the Debian packages each say what they install
    before they start and let pip and apt show their progress (no -q on pip, no -qq or >/dev/null on
    apt); measured silences: benchmarks/first_hour.py silence. And item 2: `make quickstart` ends with how
    to get fsdpctl on PATH, whatever the run's outcome."""
    make = (ROOT / "Makefile").read_text()
    recipes = {
        target: make.split(f"\n{target}:", 1)[1].split("\n\n", 1)[0]
        for target in ("$(STAMP)", "$(CHECKOV)", "quickstart")
    }
    for target in ("$(STAMP)", "$(CHECKOV)"):
        lines = [x.strip() for x in recipes[target].replace("\\\n", " ").splitlines()]
        for i, line in enumerate(lines):
            if "pip install" in line:
                assert " -q" not in line and "--quiet" not in line, line
                # said first: the install before each pip step, checkov before its venv and pip
                said = lines[i - 1 : i] if target == "$(STAMP)" else lines[:i]
                assert any(x.startswith("@echo") for x in said), (target, line)
    quickstart = recipes["quickstart"]
    assert quickstart.index("fsdpctl quickstart") < quickstart.index(". $(VENV)/bin/activate")
    assert "exit $$code" in quickstart  # the run's own exit code, after the hint
    deps = (ROOT / "scripts" / "system-deps").read_text()
    assert "-qq" not in deps and ">/dev/null\n" not in deps.split("apt-get update", 1)[1]
    assert deps.index("echo") < deps.index("apt-get update")


def test_the_install_heartbeat_passes_output_through_and_speaks_when_it_stands_still():
    """scripts/heartbeat, around each pip step of `make install`: the command's output unchanged and
    in order, a `still ...` line once it has shown nothing new for the given seconds (a pip unpacking
    torch shows a frozen bar), and the command's own exit code. On a pipe here; at a terminal the command
    gets a pseudo-terminal so that pip keeps drawing its bars."""
    p = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "heartbeat"),
            "0.3",
            "unpacking",
            "--",
            "bash",
            "-c",
            "echo first; sleep 0.7; printf 'second\\n'; exit 3",
        ],
        capture_output=True,
        timeout=60,
    )
    lines = [x for x in p.stdout.decode().splitlines() if x]
    assert p.returncode == 3 and lines[0] == "first" and lines[-1] == "second", p.stdout
    assert any(x.startswith("  ... still unpacking (") for x in lines[1:-1]), p.stdout
    quick = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "heartbeat"), "30", "x", "--", "true"],
        capture_output=True,
        timeout=60,
    )
    assert quick.returncode == 0 and quick.stdout == b""
    # at a terminal: lines that keep coming (a pty ends each with \r\n) are output, not a still screen
    master, slave = os.openpty()
    streaming = subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "scripts" / "heartbeat"),
            "0.5",
            "quiet",
            "--",
            "bash",
            "-c",
            "for i in $(seq 8); do echo line$i; sleep 0.1; done",
        ],
        stdout=slave,
        stderr=slave,
    )
    os.close(slave)
    seen = _read_to_the_end(master)
    assert streaming.wait(timeout=60) == 0 and b"line8" in seen and b"still" not in seen, seen


def test_the_install_says_its_time_and_size_before_it_starts():
    make = (ROOT / "Makefile").read_text()
    recipe = make.split("$(STAMP): pyproject.toml", 1)[1].split("\n\n", 1)[0]
    first_pip = recipe.index("pip install")
    assert "minutes" in recipe[:first_pip] and "GB" in recipe[:first_pip]
    assert "-q torch" not in recipe  # pip's progress shows for the big download
    assert sys.executable  # (the same Makefile as CI runs)


@pytest.mark.parametrize("columns", [80, 120])
def test_history_never_cuts_the_ids_a_user_copies_and_diff_takes_a_prefix(cli, columns):
    """`job history` cut its run ids at 80 and 120 columns (`first-6b16cc71-f607…`), and `job diff`
    refused what a user pasted (issue 44). The id columns are never cut (the prose columns wrap),
    and every verb that takes a run takes a unique prefix of its id, as git and docker do; a pasted
    cut id (its "…") is a prefix; a prefix two runs share is refused naming both."""
    runs = [f"first-6b16cc71-f607-4a{n}c-9e2d-long-run-id" for n in range(3)]
    for n, run in enumerate(runs):
        _plant_record(cli.home, "first", run, {"LR": f"0.00{n + 1}", "MAX_STEPS": "600"}, n + 1.0)
    table = _at_a_terminal(cli, columns, "job", "history", "first")
    assert all(run in table for run in runs), table
    assert max(map(len, table.splitlines())) <= columns, table
    said = cli("job", "diff", runs[0][:-10] + "…", runs[2])
    assert said.exit_code == 0, said.output
    short = cli("job", "describe", "first-6b16")
    assert short.exit_code == 2 and "names 3 runs" in short.stderr
    assert all(f"first/{run}" in short.stderr for run in runs)


def _at_a_terminal(cli, columns: int, *args: str) -> str:
    """What fsdpctl prints on a terminal `columns` wide (a pseudo-terminal: rich fits its tables to
    a terminal only), without the escape sequences."""
    master, slave = os.openpty()
    env = {**cli.env(COLUMNS=str(columns)), "TERM": "dumb"}
    proc = subprocess.Popen(cli.argv(*args), stdout=slave, stderr=slave, env=env, cwd=cli.cwd)
    os.close(slave)
    seen = _read_to_the_end(master)
    assert proc.wait(timeout=60) == 0, seen
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", seen.decode(errors="replace"))
    return text.replace("\r\n", "\n")


def _read_to_the_end(master: int) -> bytes:
    """Everything written to a pseudo-terminal until every writer closed it (EIO), then closed."""
    seen = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: every writer closed the terminal
            break
        if not chunk:
            break
        seen += chunk
    os.close(master)
    return seen

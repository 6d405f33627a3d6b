"""A state directory as fsdpctl leaves it after two local jobs, made by fsdpctl's own writers, for
the tests that read it back damaged (tests/test_untrusted_state.py).

Each job is the PyTorchJob `render.render_job` renders from the default local settings (2 nodes, the
shared volume `fsx-claim`, checkpoints under it), started by the real supervisor
(`backends.local.engine.start`), with one change: the container runs a short Python program that
prints what fsdptrain's rank 0 prints (the typed event lines of `fsdptrain.events`: leader, start
with the run record's id, steps, a checkpoint, the summary) instead of torchrun. Its record is
written by `record_store` and its placement is in its state (the job core's), as `job run` writes them.
`alpha` succeeds; `beta`'s node 1 fails with a Python traceback (exit 1), so the failure readers run
too.

Building it takes about a second (two supervisors); the tests copy it into each case's home and
rewrite the absolute paths fsdpctl stored (as a job started in that home would have them)."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

JOBS = ("alpha", "beta")
RUN = "{job}-run-1"  # each job's run id (a valid rendezvous id and directory name)

# node 0 prints the leader's lines, node 1 a few plain ones; beta's node 1 then fails
PRINTER = """
import os, sys
node = os.environ["FSDPCTL_POD"].rsplit("-", 1)[1]
sys.stdout.write(open(os.environ["STATE_HOME_LINES"] + "-" + node).read())
sys.stdout.flush()
sys.exit(int(os.environ.get("STATE_HOME_EXIT_" + node, "0")))
"""


def _event_lines(job: str, record_id: str) -> list[str]:
    from fsdptrain import events

    now = time.time()
    steps = [
        events.Step(
            step=s,
            max_steps=4,
            loss=4.0 - s / 4,
            lr=1e-3,
            grad_norm=1.0,
            step_time_s=0.1,
            data_wait_frac=0.0,
            time=now + s,
            tokens_per_s=1000.0,
            tokens_per_s_per_device=500.0,
            tflops_per_device=0.1,
            mfu=None,
        )
        for s in range(1, 5)
    ]
    fp = {"source": "builtin", "local": True, "files": 1, "bytes": 10, "digest": "0" * 64}
    start = events.Start(
        record_id=record_id,
        python="3.11",
        torch="2.13.0",
        transformers="5",
        cuda=None,
        nccl=None,
        device="cpu",
        start_step=0,
        dataset=fp,
        tokenizer=fp,
        time=now,
    )
    summary = events.Summary(
        steps=4,
        start_step=0,
        final_loss=3.0,
        first_loss=3.75,
        losses=[s.loss for s in steps],
        tokens_per_s=1000.0,
        tokens_per_s_per_device=500.0,
        mfu=None,
        param_bytes=1,
        grad_bytes=1,
        optim_bytes=1,
        activation_bytes=1,
        checkpoint=f"/checkpoints/{job}/step-00000004",
        export=None,
        stopped=False,
        record_id=record_id,
    )
    leader = events.Leader(node_rank=0, hostname=f"{job}-worker-0", world=2, time=now)
    lines = [events.to_line(leader), events.to_line(start), "[rank0]: building the model [x] done"]
    for s in steps:
        lines += [f"step {s.step}/4 | loss {s.loss:.4f}", events.to_line(s)]
    lines.append(
        events.to_line(events.Checkpoint(step=4, path=f"/checkpoints/{job}/step-00000004"))
    )
    lines.append(events.to_line(summary))
    return lines


FAILURE = [
    "[rank1]: Traceback (most recent call last):",
    '[rank1]:   File "train.py", line 1, in <module>',
    "[rank1]: ValueError: the data set ran dry",
]


def build(home: Path) -> None:
    """Both jobs, ended, under `home` (FSDPCTL_HOME must already be `home`; loopback nodes)."""
    from fsdpctl.backends.local import engine as local
    from fsdpctl.job import crilog, lock, record, render
    from fsdpctl.job import home as job_home
    from fsdpctl.job import store as record_store
    from fsdpctl.settings import load

    assert os.environ["FSDPCTL_HOME"] == str(home) and os.environ.get("FSDPCTL_LOCAL_NETNS") == "0"
    for job in JOBS:
        cfg = load(flags={"JOB_NAME": job, "CHECKPOINT_INTERVAL": "2"})
        run_id = RUN.format(job=job)
        rec = record_store.new(cfg, run_id)
        *infra, pytorchjob = render.render_job(cfg, run_id, rec["id"])
        record_store.save({**rec, "manifests": render.to_yaml([*infra, pytorchjob])})
        lines = home / f"{job}-lines"
        lines.with_name(f"{job}-lines-0").write_text("\n".join(_event_lines(job, rec["id"])) + "\n")
        plain = ["node 1 up", *(FAILURE if job == "beta" else ["node 1 done"])]
        lines.with_name(f"{job}-lines-1").write_text("\n".join(plain) + "\n")
        container = pytorchjob["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"][
            "containers"
        ][0]
        endpoint = next(a for a in container["command"] if a.startswith("--rdzv-endpoint="))
        container["command"] = ["python", "-c", PRINTER, endpoint]
        container["env"] += [{"name": "STATE_HOME_LINES", "value": str(lines)}]
        if job == "beta":
            container["env"] += [{"name": "STATE_HOME_EXIT_1", "value": "1"}]
        with lock.held(job_home.job_dir(job)):  # as job run holds it
            local.start(pytorchjob, secret_env={})
    for job in JOBS:
        deadline = time.monotonic() + 60
        while local.effective_phase(local.read_state(local.job_dir(job))) in local.ACTIVE:
            assert time.monotonic() < deadline, f"{job} did not end"
            time.sleep(0.05)
        ckpt = local.read_state(local.job_dir(job))["checkpoint_dir"]
        step = Path(ckpt) / "step-00000004"  # what the trainer would have saved there
        step.mkdir(parents=True)
        (step / "meta.json").write_text(json.dumps({"step": 4}))
        (Path(ckpt) / "latest").write_text("step-00000004")
    for job in JOBS:
        for lines in home.glob(f"{job}-lines*"):
            lines.unlink()
        # what the first `job describe` learns from the log (the trainer's start line), already
        # kept: the record then changes no more, so a later change is a defect
        rec = record_store.find(job)
        logs = sorted(local.job_dir(job).glob("logs/*/node-*.log"))
        record_store.save(record.learnt(rec, [t for f in logs for t in crilog.texts(f)]))


def copy(template: Path, home: Path) -> None:
    """`template` as if its jobs had been started in `home`: the tree copied (links as links), and
    every absolute path fsdpctl stored in its JSON files moved from the template's home to this one.
    """
    shutil.copytree(template, home, symlinks=True)
    old, new = str(template), str(home)
    for path in home.rglob("*.json"):
        text = path.read_text()
        if old in text:
            path.write_text(text.replace(old, new))

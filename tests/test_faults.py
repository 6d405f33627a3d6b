"""Faults survived, with real processes: torchrun's elastic agent, Debian's etcd, the kernel's
signals and file-size limits. Each test says which real mechanism it drives."""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT, logged_events, prefixed, torchrun, torchrun_argv, train_env
from conftest import fsdpctl_process as fsdpctl
from fsdptrain import events

pytestmark = pytest.mark.slow


def job_env(home: Path, name: str, **settings) -> dict:
    env = {
        **os.environ,
        "FSDPCTL_HOME": str(home),
        "NO_COLOR": "1",
        **prefixed(
            {
                "JOB_NAME": name,
                "SEQ_LEN": "64",
                "PRECISION": "fp32",
                "MAX_STEPS": "120",
                "WARMUP_STEPS": "2",
                "CHECKPOINT_INTERVAL": "20",
                "MAX_RESTARTS": "2",
            }
        ),
    }
    env.update(prefixed({k: str(v) for k, v in settings.items()}))
    return env


def step_losses(env) -> dict[int, float]:
    """Loss per step of the leader's log (`job logs -o json`: plain `job logs` prints human lines);
    after a restart the resumed attempt's lines replace the first attempt's."""
    text = fsdpctl("job", "logs", "-o", "json", env=env).stdout
    return {e.step: e.loss for e in logged_events(text) if isinstance(e, events.Step)}


def leader_text(env) -> str:
    return fsdpctl("job", "logs", env=env).stdout


@pytest.mark.usefixtures("cli")  # job_env starts from the isolated environment
def test_sigkill_of_a_worker_restarts_the_group_and_resumes_exactly(tmp_path):
    """torchrun --max-restarts: the agent sees the dead worker, re-rendezvouses both nodes (c10d),
    and the trainer resumes from the last checkpoint; the losses after it equal an uninterrupted
    run's."""
    ref = job_env(tmp_path, "ref")
    assert fsdpctl("job", "run", env=ref, timeout=300).returncode == 0
    expected = step_losses(ref)

    env = job_env(tmp_path, "killed")
    assert fsdpctl("job", "run", "--detach", env=env).returncode == 0
    deadline = time.monotonic() + 180
    while json.loads(fsdpctl("job", "status", "-o", "json", env=env).stdout)["step"] < 25:
        assert time.monotonic() < deadline
        time.sleep(0.5)
    state = json.loads((tmp_path / "jobs/killed/state.json").read_text())
    launcher = state["launchers"][1]["pid"]
    workers = subprocess.run(
        ["pgrep", "-P", str(launcher)], capture_output=True, text=True
    ).stdout.split()
    assert workers, "the node-1 launcher has no worker"
    os.kill(int(workers[0]), signal.SIGKILL)

    assert fsdpctl("job", "wait", "--timeout", "300", env=env, timeout=330).returncode == 0
    text = leader_text(env)
    assert "resumed from" in text
    status = json.loads(fsdpctl("job", "status", "-o", "json", env=env).stdout)
    assert (
        status["restarts"] == 1 and status["phase"] == "Succeeded"
    )  # one restart of the job, both nodes
    got = step_losses(env)
    resumed_at = status["summary"]["start_step"]
    assert resumed_at >= 20 and resumed_at % 20 == 0
    for step in range(resumed_at + 1, 121):
        assert got[step] == pytest.approx(expected[step], abs=1e-6), step


@pytest.mark.skipif(not shutil.which("etcd"), reason="etcd-server not installed")
def test_etcd_restart_during_rendezvous(assets, tmp_path):
    """The first node waits in an etcd rendezvous; etcd is killed and restarted on the same port and
    data dir; the second node joins and the job trains to the end."""
    from fsdpctl.adapters import etcd as etcd_adapter

    server = etcd_adapter.start(tmp_path / "etcd", log_file=tmp_path / "etcd.log")
    port = server.client_port
    env = train_env(assets, MAX_STEPS=3, WARMUP_STEPS=1)
    argv = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes=2",
        "--nproc-per-node=1",
        "--rdzv-backend=etcd",
        f"--rdzv-endpoint=127.0.0.1:{port}",
        "--rdzv-id=etcd-restart",
        "--rdzv-conf=join_timeout=120",
        "-m",
        "fsdptrain",
    ]
    first = subprocess.Popen(
        argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        time.sleep(8)  # node 0 is waiting for node 1 in the rendezvous now
        assert first.poll() is None
        server.proc.kill()
        server.proc.wait()
        time.sleep(2)
        server = _restart_etcd(tmp_path, port)
        second = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=240)
        out, _ = first.communicate(timeout=240)
    finally:
        first.kill()
        server.stop()
    assert first.returncode == 0 and second.returncode == 0, (out[-2000:], second.stderr[-2000:])
    assert "summary:" in out + second.stdout


def _restart_etcd(tmp_path: Path, port: int):
    """Same data dir, same client port: what a restarted etcd pod behind its Service looks like."""
    from fsdpctl.adapters import etcd as etcd_adapter

    return etcd_adapter.start(tmp_path / "etcd", log_file=tmp_path / "etcd.log", client_port=port)


def test_kill_during_a_checkpoint_write_keeps_the_previous_one(assets, tmp_path):
    """Rank 0 dies by SIGKILL after the step-6 shards are written, before the rename
    (FSDPTRAIN_FAILPOINT)."""
    ref = torchrun(assets, MAX_STEPS=9, CHECKPOINT_DIR=tmp_path / "ref", CHECKPOINT_INTERVAL=3)
    assert ref.rc == 0, ref.stderr[-2000:]
    crashed = torchrun(
        assets,
        MAX_STEPS=9,
        CHECKPOINT_DIR=tmp_path / "c",
        CHECKPOINT_INTERVAL=3,
        FSDPTRAIN_FAILPOINT="kill-during-save:6",
    )
    assert crashed.rc != 0
    ckpts = tmp_path / "c"
    assert (ckpts / "latest").read_text() == "step-00000003"
    assert (ckpts / ".tmp-step-00000006").is_dir() and not (ckpts / "step-00000006").exists()
    resumed = torchrun(assets, MAX_STEPS=9, CHECKPOINT_DIR=ckpts, CHECKPOINT_INTERVAL=3)
    assert resumed.rc == 0, resumed.stderr[-2000:]
    assert [r["step"] for r in resumed.events("step")] == list(range(4, 10))
    assert resumed.losses == ref.losses[3:]
    assert not (ckpts / ".tmp-step-00000006").exists()  # the next save cleaned it up


def _limit_file_size(limit: int):
    def apply():
        signal.signal(
            signal.SIGXFSZ, signal.SIG_IGN
        )  # write() then fails with EFBIG, as a full disk fails
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return apply


def test_disk_full_during_a_checkpoint_is_a_clear_error(assets, tmp_path):
    """The kernel refuses writes past RLIMIT_FSIZE (EFBIG), the same failure path as ENOSPC for DCP."""
    good = torchrun(assets, MAX_STEPS=4, CHECKPOINT_DIR=tmp_path)
    assert good.rc == 0
    # a longer run from the step-4 save (another LR schedule: allowed explicitly, fsdptrain.resume)
    env = train_env(assets, MAX_STEPS=8, CHECKPOINT_DIR=tmp_path, ALLOW_SETTING_CHANGES="true")
    p = subprocess.run(
        torchrun_argv(2),
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        preexec_fn=_limit_file_size(1 << 20),
    )
    assert p.returncode != 0
    line = next(
        li
        for li in p.stderr.splitlines()
        if li.startswith("fsdptrain: error: checkpoint at step 8 failed")
    )
    assert (
        "short write: the disk is full" in line
        and "the last good one is" in line
        and "step-00000004" in line
    )
    assert (tmp_path / "latest").read_text() == "step-00000004"
    assert not list(tmp_path.glob(".tmp-*")) and not (tmp_path / "step-00000008").exists()


def test_unwritable_checkpoint_dir_is_a_clear_error(assets, tmp_path):
    (tmp_path / "a-file").write_text("not a directory")
    run = torchrun(assets, MAX_STEPS=2, WARMUP_STEPS=1, CHECKPOINT_DIR=tmp_path / "a-file" / "ckpt")
    assert run.rc != 0
    assert "CHECKPOINT_DIR=" in run.stderr and "is not writable (Not a directory)" in run.stderr


def test_a_stalled_rank_fails_its_peers_within_collective_timeout(assets, tmp_path):
    """SIGSTOP freezes rank 1 mid-run, as a hung process or a node that stopped answering would look
    to its peers. gloo gives up on the collective after the process group's timeout
    (COLLECTIVE_TIMEOUT, passed to init_process_group), not after torch's default 30 minutes, and
    rank 0 fails; torchrun's agent then ends the group. Without root this is the check that the
    setting reaches the process group (test_pods cuts a node's link under network namespaces)."""
    err = tmp_path / "stderr.txt"
    with open(err, "w") as stderr:
        proc = subprocess.Popen(
            torchrun_argv(2),
            env=train_env(assets, MAX_STEPS=400, WARMUP_STEPS=1, COLLECTIVE_TIMEOUT=5),
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            cwd=ROOT,
        )
    try:
        for line in proc.stdout:  # rank 0's lines: both ranks are past their first collectives
            if line.startswith('{"event":"step","step":3,'):
                break
        workers = subprocess.run(
            ["pgrep", "-P", str(proc.pid)], capture_output=True, text=True
        ).stdout.split()
        assert len(workers) == 2, workers
        environ = {int(w): b"\0" + Path(f"/proc/{w}/environ").read_bytes() for w in workers}
        rank1 = next(pid for pid, env in environ.items() if b"\0RANK=1\0" in env)
        os.kill(rank1, signal.SIGSTOP)
        stopped_at = time.monotonic()
        while "Timed out waiting 5000ms" not in err.read_text():
            assert time.monotonic() - stopped_at < 5 + 25, (
                "rank 0 still waiting 25 s after COLLECTIVE_TIMEOUT=5"
            )
            time.sleep(0.2)
        os.kill(
            rank1, signal.SIGCONT
        )  # so it takes the agent's SIGTERM now, not at the 30 s SIGKILL
        proc.stdout.read()
        assert proc.wait(timeout=60) != 0
    finally:
        proc.kill()
        proc.wait()

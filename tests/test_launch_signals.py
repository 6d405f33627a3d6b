"""S6 (issue 36): a stop gives torchrun exactly one SIGTERM, whoever sends it.

Peer: the real torchrun of torch 2.13 (torch.distributed.run, standalone rendezvous) under the
real launcher (`python -m fsdptrain.launch`), with a worker that takes 3 s to "save" after its
SIGTERM, as a stop checkpoint does.

Who signals differs by scheduler. The kubelet sends SIGTERM to the container's PID 1 alone (the
launcher, which forwards it: FSDPTRAIN_SIGNALS=pod). Slurm signals every process of the step at
once: slurmstepd's signal_container (Slurm 22.05 src/slurmd/slurmstepd/req.c
_handle_signal_container) goes through the proctrack plugin, which signals every process it tracks
(proctrack/linuxproc: each descendant of slurmstepd; proctrack/cgroup: the step's cgroup), the
launcher, torchrun and the workers alike (FSDPTRAIN_SIGNALS=step). A launcher that forwarded its
copy there gave torchrun a second SIGTERM, which torch's handler raises as another SignalException
(torch/distributed/elastic/multiprocessing/api.py _terminate_process_handler) from inside the
shutdown it started on the first one (elastic/agent/server/api.py `run`: `_shutdown` -> `_close`
waiting for the workers); torch 2.13 runs the shutdown again from `run`'s `finally`, one more signal
and it is abandoned, and slurmstepd SIGKILLs whatever of the step is left once the task (the
launcher) has exited (slurmstepd/mgr.c job_manager: proctrack_g_signal(cont_id, SIGKILL)): the
workers still writing the stop checkpoint. Here the signals are sent in the order that exposes it:
the worker and torchrun first, the launcher once torchrun is shutting down."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fsdptrain import disruption

WORKER = r"""
import os, signal, sys, time
from pathlib import Path
here = Path(sys.argv[1])
got = []
signal.signal(signal.SIGTERM, lambda *_: got.append(1))
(here / "ready").write_text(str(os.getpid()))
while not got:
    time.sleep(0.05)
time.sleep(3)  # the stop checkpoint
(here / "saved").write_text(str(len(got)))
"""


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(p) for p in text.split()]


def _until(what: str, check, timeout: float = 120):
    deadline = time.monotonic() + timeout
    while not (got := check()):
        assert time.monotonic() < deadline, f"{what}: not within {timeout:g} s"
        time.sleep(0.05)
    return got


@pytest.mark.slow
@pytest.mark.parametrize("scope", ["step", "pod"])
def test_torchrun_gets_exactly_one_sigterm_and_the_workers_finish_saving(tmp_path, scope):
    """`step` (Slurm): every process gets the scheduler's SIGTERM, the launcher's last; torchrun
    reports exactly one signal (its SignalException traceback once, no "During handling"), the
    worker finishes its 3 s save, the launcher exits 0 (a stop was requested). `pod` (Kubernetes):
    the launcher alone gets it and forwards one."""
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    stop = tmp_path / "annotations"
    stop.write_text(
        f'{disruption.STOP_ANNOTATION}="1"\n'
    )  # the stop request, as job stop writes it
    env = {
        **os.environ,
        disruption.SIGNALS_ENV: scope,
        disruption.STOP_FILE_ENV: str(stop),
        "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "30",
        "PYTHONUNBUFFERED": "1",
    }
    argv = [sys.executable, "-m", "fsdptrain.launch", "--standalone", "--nnodes=1"]
    argv += ["--nproc-per-node=1", "--max-restarts=0", str(worker), str(tmp_path)]
    log = tmp_path / "launch.log"
    with open(log, "wb") as out:
        launcher = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        ready = tmp_path / "ready"
        _until("the worker", ready.exists)
        worker_pid = int(ready.read_text())
        torchrun = _until("torchrun", lambda: _children(launcher.pid))[0]
        if scope == "step":  # as proctrack does, the launcher's copy last
            os.kill(worker_pid, signal.SIGTERM)
            os.kill(torchrun, signal.SIGTERM)
            _until("torchrun's shutdown", lambda: "death signal" in log.read_text())
        os.kill(launcher.pid, signal.SIGTERM)
        assert launcher.wait(timeout=90) == 0, log.read_text()[-3000:]
    finally:
        if launcher.poll() is None:
            launcher.kill()
    text = log.read_text()
    assert text.count("got signal: 15") == 1, text[-4000:]
    assert "During handling of the above exception" not in text, text[-4000:]
    assert (tmp_path / "saved").is_file(), text[-3000:]

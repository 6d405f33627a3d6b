"""A local pod's processes are found by the mark they inherit, as a container runtime finds a
container's processes by its cgroup: torchrun
(torch/distributed/elastic/multiprocessing/subprocess_handler) starts each worker with
start_new_session=True, so a worker outlives a SIGKILL to its launcher's process group. Real
processes, real signals."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from fsdpctl.backends.local import engine as local

# a launcher that starts a "worker" in a session of its own, prints its pid and waits
LAUNCHER = (
    "import subprocess, sys, time;"
    "w = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'], start_new_session=True);"
    "print(w.pid, flush=True); time.sleep(120)"
)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie is dead for our purpose
        return f.read().split(")")[-1].split()[0] != "Z"


def _start(mark: str) -> tuple[subprocess.Popen, int]:
    env = {**os.environ, local.POD_MARK: mark}
    launcher = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    return launcher, int(launcher.stdout.readline())


def test_kill_pod_reaches_workers_in_their_own_session_and_orphans():
    mark = f"test/run-{os.getpid()}/node-0"
    launcher, worker = _start(mark)
    other, other_worker = _start(mark + "x")  # another pod: a prefix of its mark must not match
    try:
        assert sorted(local.pod_processes(mark)) == sorted([launcher.pid, worker])
        os.killpg(
            launcher.pid, 9
        )  # what killing only the launcher's group did: the worker survives it
        launcher.wait()
        assert _alive(worker) and local.pod_processes(mark) == [worker]
        local.kill_pod(mark)
        deadline = time.monotonic() + 5
        while _alive(worker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(worker) and local.pod_processes(mark) == []
        assert _alive(other.pid) and _alive(other_worker)
    finally:
        for pid in (other.pid, other_worker, worker):
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
        other.wait()


def test_every_launcher_carries_its_pods_mark():
    spec = {
        "job": "j",
        "run_id": "r1",
        "replicas": 3,
        "nproc_per_node": 1,
        "command": [
            "torchrun",
            "--nnodes=3",
            "--rdzv-endpoint=j-worker-0:29400",
            "-m",
            "fsdptrain",
        ],
        "env": {},
        "volumes": {},
    }
    marks = [launch.env[local.POD_MARK] for launch in local.launches(spec, "127.0.0.1:1", {})]
    assert marks == ["j/r1/node-0", "j/r1/node-1", "j/r1/node-2"]
    home = {
        local.JOB_MARK: "/home/a/jobs/j"
    }  # the supervisor's: the job's directory in this FSDPCTL_HOME
    marks = [launch.env[local.POD_MARK] for launch in local.launches(spec, "127.0.0.1:1", home)]
    assert marks == [f"/home/a/jobs/j/r1/node-{n}" for n in range(3)]

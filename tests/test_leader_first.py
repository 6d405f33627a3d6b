"""On Kubernetes the leader's pod ends first (fsdptrain.disruption LEADER_FIRST_ENV), so that the job's
success comes from it and its log, with the summary and the losses, is kept.

Why: an elastic PyTorchJob is Succeeded as soon as any worker pod succeeds, and cleanPodPolicy Running
then deletes the pods still running (training-operator v1.9.4 pkg/controller.v1/pytorch/
pytorchjob_controller.go UpdateJobStatus; pkg/controller.v1/common/job.go DeletePodsAndServices;
tests/kube_peer_operator.py plays both); torchrun's agents leave their exit barrier together
(torch/distributed/elastic/agent/server/api.py _exit_barrier). Seen on the API peer's operator before
this: the leader's pod deleted in about one run in three, `job status` Succeeded at step 0.

Peers: the real launcher (`python -m fsdptrain.launch`) with a stand-in torchrun that exits 0 as the
trainer does after marking its node (the real trainer and operator: tests/conformance/test_paths.py's
EKS cells, `make test-all`); fsdpctl's rendering for every target.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import scaled
from fsdpctl.job import policy
from fsdpctl.settings import load
from fsdptrain import disruption


@pytest.mark.parametrize("group_rank", [None, "0", "1", "7"])
@pytest.mark.parametrize("wait_s", ["", "0", "10", "2.5"])
@pytest.mark.parametrize("note", [True, False])
def test_only_a_follower_node_waits_and_only_when_asked(tmp_path, group_rank, wait_s, note):
    """Every combination: a node waits LEADER_FIRST_S exactly when it is not node 0, the setting is
    positive and its launcher gave it a note path; the leader's node never waits."""
    env = {disruption.LEADER_FIRST_ENV: wait_s}
    if note:
        env[disruption.NOTE_ENV] = str(tmp_path / "note.json")
    disruption.mark_follower(env, group_rank)
    follower = note and group_rank not in (None, "0") and float(wait_s or 0) > 0
    assert disruption.leader_first_s(env) == (float(wait_s) if follower else 0.0)


@pytest.mark.parametrize("backend", ["local", "eks", "slurm"])
def test_pods_are_told_to_let_the_leader_end_first_and_nothing_else_is(backend):
    """Only a Kubernetes target's pods carry LEADER_FIRST_S: the local backend keeps each node's log
    on its own disk, Slurm keeps the steps' output files."""
    cfg = load(environ={}, flags={"BACKEND": backend, "MODEL": "tiny"})
    env = policy.pod_env(cfg)
    assert (disruption.LEADER_FIRST_ENV in env) == (backend == "eks")


TORCHRUN = """import os, sys
from pathlib import Path
Path(os.environ["FSDPTRAIN_EXIT_NOTE"] + ".follower").touch() if sys.argv[-1] == "follower" else None
Path(os.environ["TEST_TORCHRUN_DONE"]).touch()
"""


@pytest.mark.parametrize("role", ["leader", "follower"])
def test_the_launcher_outlives_torchrun_on_a_follower_node_until_signalled(tmp_path, role):
    """The real launcher after a torchrun that succeeded: a follower's waits, the leader's does not,
    and a SIGTERM (the operator deleting the pod) ends the wait with the pod's 0."""
    fake = tmp_path / "torch" / "distributed"
    fake.mkdir(parents=True)
    for d in (tmp_path / "torch", fake):
        (d / "__init__.py").write_text("")
    (fake / "run.py").write_text(TORCHRUN)
    env = {
        **os.environ,
        "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
        disruption.LEADER_FIRST_ENV: "600",
        "TEST_TORCHRUN_DONE": str(tmp_path / "torchrun-done"),
    }
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "fsdptrain.launch", "--nnodes=1", "-m", "x", role], env=env
    )
    if role == "leader":
        assert proc.wait(timeout=120) == 0
        return
    # the event, not a pace: on a busy machine torchrun may take longer than any fixed wait, and a
    # SIGTERM while it runs is forwarded to it (the pod's 143), not the end of the follower's wait
    deadline = time.monotonic() + scaled(120)
    while not (tmp_path / "torchrun-done").exists():
        assert proc.poll() is None and time.monotonic() < deadline, "torchrun never ended"
        time.sleep(0.05)
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(timeout=1)  # a follower's launcher is still waiting after torchrun ended
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0 and time.monotonic() - started < 300

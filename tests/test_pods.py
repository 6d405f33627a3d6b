"""Local nodes that behave like pods (issue 13): each simulated node has its own disk (emptyDir)
and, as root with iproute2, its own network namespace and address; only a shared volume is shared.
Each run is the real `fsdpctl job run` (local backend), real torchrun launchers and gloo; each test
names the upstream behaviour it relies on. CI runs as root, so the namespace tests run there;
elsewhere they skip and say why."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from conftest import KEEP_FSDPCTL_VARS, logged_events, prefixed
from conftest import fsdpctl_process as fsdpctl
from fsdpctl.adapters import netns
from fsdpctl.job import crilog
from fsdptrain import events

NETNS, WHY_NOT = netns.available()
needs_netns = pytest.mark.skipif(not NETNS, reason=f"no network namespace per node here: {WHY_NOT}")

# small and quick: the tiny model, seq 64, fp32 on CPU; a checkpoint every 10 steps; collectives and
# the rendezvous give up in seconds, not torch's 30 minutes
RUN = {
    "SEQ_LEN": "64",
    "PRECISION": "fp32",
    "MAX_STEPS": "40",
    "WARMUP_STEPS": "2",
    "CHECKPOINT_INTERVAL": "10",
    "MAX_RESTARTS": "2",
    "COLLECTIVE_TIMEOUT": "10",
    "RDZV_JOIN_TIMEOUT": "60",
}


def sealed_env(home: Path, name: str, **settings: str) -> dict[str, str]:
    """This machine's environment without any fsdpctl setting or switch (as the `cli` fixture seals
    it), FSDPCTL_HOME=home, JOB_NAME=name, RUN and `settings`."""
    from fsdpctl.settings import setting_keys

    keys = set(setting_keys())
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in keys and not (k.startswith("FSDPCTL_") and not k.startswith(KEEP_FSDPCTL_VARS))
    }
    home.mkdir(parents=True, exist_ok=True)
    return {
        **env,
        "FSDPCTL_HOME": str(home),
        "NO_COLOR": "1",
        **prefixed({"JOB_NAME": name, **RUN, **settings}),
    }


def status(env: dict[str, str]) -> dict:
    return json.loads(fsdpctl("job", "status", "-o", "json", env=env).stdout)


def state(env: dict[str, str]) -> dict:
    return json.loads(
        (Path(env["FSDPCTL_HOME"]) / "jobs" / env["FSDPCTL_JOB_NAME"] / "state.json").read_text()
    )


def step_losses(env: dict[str, str]) -> dict[int, float]:
    """Loss per step from the leader's log; a resumed attempt's lines replace the first attempt's."""
    text = fsdpctl(
        "job", "logs", "-o", "json", env=env
    ).stdout  # plain `job logs` prints human lines
    return {e.step: e.loss for e in logged_events(text) if isinstance(e, events.Step)}


def wait_for_step(env: dict[str, str], step: int, within: float = 180) -> None:
    """Until the leader has logged `step`: read from the node logs themselves, since a `job status`
    process per look lags a tiny model's steps by several."""
    deadline = time.monotonic() + within
    while _latest_step(env) < step:
        assert time.monotonic() < deadline, f"no step {step} within {within} s: {status(env)}"
        time.sleep(0.2)


def _latest_step(env: dict[str, str]) -> int:
    logs = Path(env["FSDPCTL_HOME"]) / "jobs" / env["FSDPCTL_JOB_NAME"] / "logs"
    lines = [
        line
        for log in logs.glob("*/node-*.log")
        for line in crilog.texts(log)  # the relay's CRI format
    ]
    return max((e.step for e in events.parse(lines) if isinstance(e, events.Step)), default=0)


def finish(env: dict[str, str]) -> dict:
    """`job wait` to the end; the final status, which must be Succeeded."""
    waited = fsdpctl("job", "wait", "--timeout", "300", env=env, timeout=330)
    final = status(env)
    assert waited.returncode == 0 and final["phase"] == "Succeeded", (final, waited.stderr)
    return final


def assert_resumed_like(env: dict[str, str], reference: dict[int, float], final: dict) -> int:
    """Every rank resumed from one checkpoint and the steps after it reproduce the uninterrupted
    run; returns the step resumed from."""
    text = fsdpctl("job", "logs", env=env).stdout
    resumed_at = final["summary"]["start_step"]
    assert resumed_at >= 10 and resumed_at % 10 == 0, final["summary"]
    assert (
        f"step-{resumed_at:08d} at step {resumed_at}" in text
    )  # the leader's "resumed from ..." line
    got = step_losses(env)
    for step in range(resumed_at + 1, 41):
        assert got[step] == pytest.approx(reference[step], abs=1e-6), step
    return resumed_at


def children(pid: int) -> list[int]:
    return [
        int(p)
        for p in subprocess.run(
            ["pgrep", "-P", str(pid)], capture_output=True, text=True
        ).stdout.split()
    ]


def workers_of(launcher: int) -> list[int]:
    """The trainer processes of a pod: the launcher (fsdptrain.launch, the container's first
    process) runs torchrun as its child, whose children are the workers."""
    return [w for torchrun in children(launcher) for w in children(torchrun)]


def kill_node(pid: int) -> None:
    """SIGKILL to every process of one simulated node, as when its machine dies: the launcher's
    process group and each worker's own session (torchrun starts workers with start_new_session,
    torch/distributed/elastic/ multiprocessing/subprocess_handler), so killing the launcher's group
    alone would leave them training."""
    workers = workers_of(pid)
    assert workers, f"launcher {pid} has no worker"
    for group in [pid, *workers]:
        os.killpg(group, signal.SIGKILL)


def assert_separate_addresses(env: dict[str, str]) -> None:
    """With namespaces each node had an address of its own, node 0's being the rendezvous
    endpoint's."""
    if not NETNS:
        return
    addresses = [launcher["address"] for launcher in state(env)["launchers"]]
    assert len(set(addresses)) == len(addresses) == 2 and "127.0.0.1" not in addresses, addresses


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict[int, float]:
    """Step losses of the uninterrupted 2-node job (the runs below differ only in their name and
    faults)."""
    env = sealed_env(tmp_path_factory.mktemp("ref"), "ref")
    ran = fsdpctl("job", "run", env=env, timeout=300)
    assert ran.returncode == 0, ran.stderr[-3000:]
    losses = step_losses(env)
    assert sorted(losses) == list(range(1, 41))
    return losses


# ---- no shared storage -----------------------------------------------------------------------------------


def test_two_nodes_on_pod_local_disks_are_refused_before_anything_starts(cli):
    """DCP writes each rank's shards on the filesystem that rank sees (torch
    checkpoint/filesystem.py): with per-node disks and no shared volume a 2-node job could never
    resume together, so `job run` refuses it with exit 2, and nothing exists afterwards: no job
    directory, no volume, no namespace."""
    result = cli("--set", "JOB_NAME=podlocal", "--set", "SHARED_VOLUME=", "job", "run")
    assert result.exit_code == 2, result.output
    assert (
        "JOB_NODES=2 (default) with SHARED_VOLUME='' (--set) and CHECKPOINT_PVC=''" in result.said
    )
    assert not cli.home.exists() or not any(cli.home.iterdir()), list(cli.home.rglob("*"))
    if NETNS:
        listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert not re.search(r"fsdpctl-\d+-podlocal-", listed), listed


@needs_netns
def test_two_jobs_of_one_name_get_their_own_networks_and_tear_down_only_theirs(monkeypatch):
    """Job "twin" run from two homes (or users) at once, the second having looked for free subnets
    before the first made its bridge: real iproute2 as root, where `ip link add` of an existing link
    fails with File exists (the kernel's RTM_NEWLINK under NLM_F_EXCL, which `ip link add` sets).
    The second moves to the next subnet instead of failing, and its teardown (or its failure's)
    never removes the first's bridge or namespaces: every name carries the subnet's index, not only
    the job's name."""
    tried: list[int] = []
    real_create, bridges = netns.create, netns._bridges

    def create(net, names=None):
        tried.append(net.index)
        real_create(net, names)

    monkeypatch.setattr(netns, "create", create)
    first = netns.claim("twin", 2, {"twin-worker-0": 0})
    try:
        monkeypatch.setattr(netns, "_bridges", set)  # it looked before the first's bridge existed
        second = netns.claim("twin", 2, {"twin-worker-0": 0})
        try:
            assert tried[:2] == [first.index, first.index] and second.index != first.index, tried
            ours, theirs = ({net.namespace(n) for n in range(2)} for net in (first, second))
            assert not ours & theirs
            hosts = (netns.ETC_NETNS / second.namespace(1) / "hosts").read_text()
            assert f"{second.address(0)} twin-worker-0" in hosts.splitlines()
        finally:
            netns.destroy(second)
        assert netns.exists(first) and first.index in bridges()
    finally:
        netns.destroy(first)
    assert not netns.exists(first)


@pytest.mark.slow
def test_one_node_on_its_own_disk_resumes_every_rank_from_the_same_checkpoint(tmp_path, reference):
    """One node, two processes, SHARED_VOLUME='': the checkpoints live on the node's own disk (an
    emptyDir survives a container's worker restarts). A worker is SIGKILLed; torchrun's agent
    restarts the group (--max-restarts) and rank 0's resume decision, broadcast, brings both ranks
    back at the same step."""
    env = sealed_env(tmp_path, "solo", SHARED_VOLUME="", JOB_NODES="1", LOCAL_PROCS_PER_NODE="2")
    assert fsdpctl("job", "run", "--detach", env=env).returncode == 0
    wait_for_step(env, 12)
    launcher = state(env)["launchers"][0]["pid"]
    workers = workers_of(launcher)
    assert len(workers) == 2, workers
    os.kill(int(workers[1]), signal.SIGKILL)
    final = finish(env)
    assert_resumed_like(env, reference, final)
    own_disk = tmp_path / "jobs/solo/nodes/node-0"
    assert [p.parent.name for p in own_disk.rglob("latest")] == ["solo"]
    assert not (tmp_path / "volumes").exists()  # nothing on a shared volume: there is none


# ---- two nodes, one shared volume ------------------------------------------------------------------------


@pytest.mark.slow
def test_a_killed_node_comes_back_and_every_rank_resumes_from_the_same_step(tmp_path, reference):
    """Node 1's launcher and workers die together (SIGKILL to each, as when a pod's machine fails).
    The Training Operator recreates the pod (restartPolicy ExitCode: 137 is retryable); node 0's
    workers lose their gloo peer and torchrun's agent restarts the group; the c10d rendezvous seats
    the new node 1; every rank loads the checkpoint rank 0 chose on the shared volume (DCP) and the
    losses after it equal the uninterrupted run's."""
    env = sealed_env(tmp_path, "killed")
    assert fsdpctl("job", "run", "--detach", env=env).returncode == 0
    wait_for_step(env, 12)
    assert_separate_addresses(env)
    kill_node(state(env)["launchers"][1]["pid"])
    final = finish(env)
    assert state(env)["launchers"][1]["relaunches"] == 1
    assert_resumed_like(env, reference, final)
    ckpts = tmp_path / "volumes/fsx-claim/checkpoints/killed"
    assert (ckpts / "latest").read_text() == "step-00000040"
    assert not list(
        (tmp_path / "jobs/killed/nodes").rglob("step-*")
    )  # no shard on a node's own disk


@pytest.mark.slow
@needs_netns
def test_a_node_cut_off_fails_the_group_within_the_collective_timeout_and_it_restarts(
    tmp_path, reference
):
    """Node 1's link goes down (`netns.cut`) mid-run. gloo's collectives give up after
    COLLECTIVE_TIMEOUT (the process group's timeout), the workers exit 1 and torchrun's agents
    restart the group; the last checkpoint stays whole meanwhile (DCP publishes only complete
    saves). Once the link is back the c10d rendezvous re-forms both nodes and every rank resumes
    from that checkpoint: an elastic restart, with no step lost beyond the last checkpoint."""
    env = sealed_env(tmp_path, "cut")
    assert fsdpctl("job", "run", "--detach", env=env).returncode == 0
    wait_for_step(env, 12)
    assert_separate_addresses(env)
    addresses = [launcher["address"] for launcher in state(env)["launchers"]]
    net = netns.Network(int(addresses[0].split(".")[2]), "cut", 2)
    assert net.address(1) == addresses[1]
    ckpts = tmp_path / "volumes/fsx-claim/checkpoints/cut"
    netns.cut(net, 1)
    cut_at = time.monotonic()
    log0 = Path(state(env)["log_dir"]) / "node-0.log"
    while (
        "failed (exitcode: 1)" not in log0.read_text()
    ):  # torchrun's agent on node 0 saw its worker fail
        assert time.monotonic() - cut_at < 10 + 30, (
            "no collective timeout 30 s after COLLECTIVE_TIMEOUT=10"
        )
        time.sleep(0.5)
    assert "Timed out waiting 10000ms" in log0.read_text()  # gloo, under the configured timeout
    last = (ckpts / "latest").read_text()
    assert (ckpts / last / "meta.json").is_file() and last >= "step-00000010"
    netns.reconnect(net, 1)
    final = finish(env)
    resumed_at = assert_resumed_like(env, reference, final)
    assert f"step-{resumed_at:08d}" == last  # the checkpoint that was whole during the cut
    # node 1 took part in the new round: its own worker failed, or its agent saw the group change
    # first ("will restart worker group", torch elastic/agent/server/api.py): either way, a 2nd
    # rendezvous
    assert (log0.parent / "node-1.log").read_text().count("Rendezvous complete for workers") >= 2

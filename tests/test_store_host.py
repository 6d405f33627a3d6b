"""The node hosting the c10d rendezvous store dies: the job resumes, it does not fail.

Upstream, read for this: with RDZV_BACKEND=c10d the store lives in the agent of worker 0 (the
endpoint `<job>-worker-0:29400`, fsdpctl.job.policy.rendezvous). An agent elsewhere asks that store
on every monitor pass (torch/distributed/elastic/agent/server/api.py `_invoke_run` ->
dynamic_rendezvous.num_nodes_waiting) and for every restart's round; once it is gone the call raises
RendezvousConnectionError (rendezvous/c10d_rendezvous_backend.py `_call_store`) and torchrun, whose
`main` is wrapped in `elastic.multiprocessing.errors.record` (torch/distributed/run.py), writes that
exception to TORCHELASTIC_ERROR_FILE (errors/error_handler.py `record_exception`) and exits 1: a
code the Training Operator's restartPolicy ExitCode makes permanent (v1.9.4 pkg/util/train/
train_util.go IsRetryableExitCode: >= 128 only). Before this rule one killed pod on worker 0 failed
the whole job, where a killed pod on any other node resumed it (seen in CI: the local conformance
cell `path-killed node` failed whenever node 0 hosted the store).

Peers: torch's own `record` decorator writes the error files read here (real torch); the launcher's
loop runs with its fork/exec replaced (the real loop, a scripted torchrun); the end-to-end run is
tests/test_stop_and_restarts.py::test_a_killed_node_is_recreated_and_the_job_resumes[store host]
(real torchrun, one network namespace per node, node 0 hosting the store)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kube_peer_kubelet as rules
from fsdpctl.job import kstatus
from fsdptrain import disruption, events, launch


def _agent_error(path: Path, exc: BaseException, monkeypatch: pytest.MonkeyPatch) -> None:
    """What torchrun's agent leaves when `exc` ends it: torch's own `record` writing the file."""
    from torch.distributed.elastic.multiprocessing.errors import record

    monkeypatch.setenv(disruption.AGENT_ERROR_ENV, str(path))

    @record
    def main() -> None:
        raise exc

    with pytest.raises(type(exc)):
        main()


def _exceptions() -> list[tuple[BaseException, bool]]:
    from torch.distributed.elastic.rendezvous.api import (
        RendezvousClosedError,
        RendezvousConnectionError,
        RendezvousTimeoutError,
    )

    return [
        (RendezvousConnectionError("The connection to the C10d store has failed."), True),
        (RendezvousTimeoutError("the join timed out"), False),
        (RendezvousClosedError(), False),
        (RuntimeError("RendezvousConnectionError: in a message, not the type"), False),
        (ValueError("bad --nnodes"), False),
    ]


@pytest.mark.parametrize("index", range(5))
def test_only_a_lost_store_reads_as_one(tmp_path, monkeypatch, index):
    """The file torch writes names the exception's type first: RendezvousConnectionError alone is a
    lost store; a join timeout (nodes that never came), a closed rendezvous (the job is over) or any
    other error is not, and neither is no file, an empty one or one that is not JSON."""
    exc, lost = _exceptions()[index]
    path = tmp_path / "agent-error.json"
    _agent_error(path, exc, monkeypatch)
    assert json.loads(path.read_text())["message"]["message"].startswith(type(exc).__name__)
    assert disruption.lost_store(str(path)) is lost
    assert disruption.lost_store(str(tmp_path / "none.json")) is False
    for garbage in ("", "{", "[]", '{"message": 3}', '{"message": {"message": null}}'):
        path.write_text(garbage)
        assert disruption.lost_store(str(path)) is False


@settings(max_examples=200, deadline=None, derandomize=True)
@given(nodes=st.integers(2, 16), kind=st.sampled_from(("pytorchjob", "trainjob")))
def test_a_killed_store_host_never_ends_a_job(nodes, kind):
    """Node 0 killed (137, recreated); every other node's agent loses the store and exits 1 with it
    named: each launcher starts torchrun again (RESTART), so the job stays Running (a PyTorchJob
    recreates the one pod; a TrainJob's Job restarts its container in place) and succeeds once every
    node ends 0. The same exits without the launcher's rule (1 on every other node) fail a
    PyTorchJob at once."""
    victim = rules.End(0, disruption.pod_exit(-9, signalled=False, note=None, stopping=False))
    assert victim.code == 137
    for _node in range(1, nodes):
        after = disruption.pod_exit(1, signalled=False, note=None, stopping=False, store_lost=True)
        assert after == disruption.RESTART
    judge = rules.pytorchjob if kind == "pytorchjob" else rules.trainjob
    mid = judge([victim], nodes)
    assert mid.phase == "Running" and mid.recreated == (kind == "pytorchjob")
    done = [victim, *(rules.End(n, 0) for n in range(nodes))]
    assert judge(done, nodes).phase == "Succeeded"
    old = [victim, *(rules.End(n, 1) for n in range(1, nodes))]
    assert rules.pytorchjob(old, nodes).phase == "Failed"


@pytest.mark.parametrize("rc", [1, 2, -9, 0])
@pytest.mark.parametrize("stopping", [False, True])
@pytest.mark.parametrize("note", [None, {"kind": "failed"}])
def test_a_lost_store_restarts_only_an_agent_that_exited_1_unasked(rc, stopping, note):
    """The rule is narrow: an agent's 1 with its store named. A stop request still ends the pod 0, a
    `failed` note still fails it, a kill is still the runtime's 128+n and a 2 (bad settings) stays
    permanent, whatever the error file says."""
    with_it = disruption.pod_exit(
        rc, signalled=False, note=note, stopping=stopping, store_lost=True
    )
    without = disruption.pod_exit(rc, signalled=False, note=note, stopping=stopping)
    if rc == 1 and not stopping and note is None:
        assert with_it == disruption.RESTART and without == 1
    else:
        assert with_it == without


FINISHED = events.Finished(step=8, max_steps=8, loss=5.1, checkpoint="/c/step-8", record_id="r")


@pytest.mark.parametrize("finished", [None, FINISHED])
def test_the_launcher_rejoins_after_a_lost_store_unless_the_run_is_done(
    monkeypatch, capsys, tmp_path, finished
):
    """The real loop with torchrun scripted: its first agent ends on a lost store (torch's own error
    file), so the launcher starts torchrun again, with the old file gone, and ends 0 with the
    second; when the run meanwhile trained to its end (the store host's pod finished), it ends 0
    without starting torchrun again."""
    from torch.distributed.elastic.rendezvous.api import RendezvousConnectionError

    outcomes = iter([1, 0])
    spawned: list[dict[str, str]] = []

    def wait(pid: int, note: str, signalled: list[int]) -> int:
        rc = next(outcomes)
        if rc:
            _agent_error(
                Path(spawned[-1][disruption.AGENT_ERROR_ENV]),
                RendezvousConnectionError("The connection to the C10d store has failed."),
                monkeypatch,
            )
        return rc

    def spawn(argv: list[str], env: dict[str, str]) -> int:
        assert not Path(env[disruption.AGENT_ERROR_ENV]).exists()  # no verdict from a past start
        spawned.append(dict(env))
        return 4242

    monkeypatch.setattr(launch, "_spawn", spawn)
    monkeypatch.setattr(launch, "_wait", wait)
    ledger = {
        disruption.STARTS_DIR_ENV: str(tmp_path / "starts"),
        disruption.STARTS_MAX_ENV: "4",
    }
    argv = ["--nnodes=1", "-m", "x"]
    assert launch.run_torchrun(argv, ledger, finished=lambda: finished) == 0
    assert len(spawned) == (1 if finished else 2)
    said = capsys.readouterr().out
    restarted = "fsdptrain: torchrun start 2 of this run, at most 4: the job restarted"
    assert (restarted in said) is (not finished)
    if finished:
        assert "this run already trained to MAX_STEPS=8" in said
        assert list(events.parse(said.splitlines())) == [finished]
    else:
        assert "the rendezvous store went away with the node hosting it" in said


@settings(max_examples=200, deadline=None, derandomize=True)
@given(
    nodes=st.integers(1, 16),
    rounds=st.integers(0, 5),
    begun=st.integers(0, 15),
    leader=st.data(),
    kind=st.sampled_from(("killed", "rejoined")),
)
def test_the_ledger_counts_a_job_restart_once_whichever_pod_prints_it(
    tmp_path_factory, nodes, rounds, begun, leader, kind
):
    """`job status` on EKS reads the leader's log alone. A restart that recreates a pod and starts
    torchrun again on the others leaves no restartCount (ExitCode pods are recreated, Training
    Operator v1.9.4 pkg/controller.v1/common/pod.go) and no agent restart line (a fresh agent), so
    each launcher prints the ledger's count at a start past the first JOB_NODES: each job restart
    adds one start per node, so any pod's highest line gives the job's restarts, a round still being
    joined (`begun` of its starts) counting as one."""
    begun = begun % nodes if nodes > 1 else 0
    folder = tmp_path_factory.mktemp("starts")
    env = {disruption.STARTS_DIR_ENV: str(folder), disruption.STARTS_MAX_ENV: "999"}
    printed: list[list[str]] = [[] for _ in range(nodes)]
    total = nodes * (1 + rounds) + begun
    for i in range(total):
        ledger = disruption.record_start(env, f"pod-{i % nodes}")
        if line := disruption.restart_line(ledger, env, nodes):
            printed[i % nodes].append(line)
    want = rounds + (1 if begun else 0)
    last = leader.draw(st.integers(0, nodes - 1))
    if kind == "killed":  # read the pod that printed last (the highest count)
        last = (total - 1) % nodes
    seen = kstatus.ledger_restarts(printed[last], nodes)
    assert seen == want if kind == "killed" else seen <= want
    assert kstatus.restarts([], printed[last], nodes) == seen
    assert kstatus.ledger_restarts(printed[last], 0) == 0  # a job of unknown size: no guess

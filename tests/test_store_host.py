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
from fsdptrain import disruption, launch


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


@pytest.mark.parametrize("finished", [None, "fsdptrain: this run already trained to MAX_STEPS"])
def test_the_launcher_rejoins_after_a_lost_store_unless_the_run_is_done(
    monkeypatch, capsys, finished
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
    assert launch.run_torchrun(["-m", "x"], {}, finished=lambda: finished) == 0
    assert len(spawned) == (1 if finished else 2)
    said = capsys.readouterr().out
    if finished:
        assert finished in said
    else:
        assert "the rendezvous store went away with the node hosting it" in said

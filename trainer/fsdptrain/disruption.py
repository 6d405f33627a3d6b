"""How a run ends before MAX_STEPS, and what its pod's exit code then tells the controllers.

Two reasons, told apart by what the trainer reads, never by the signal alone:
- **stop**: `fsdpctl job stop` puts the annotation `fsdpctl.io/stop` on the job's pods; the kubelet
  writes the pod's annotations into a downward API file (FSDPTRAIN_STOP_FILE) and every rank reads
  it once per step. The ranks checkpoint and exit 0: the job ends Stopped.
- **disruption**: SIGTERM without that annotation: the pod is evicted (a drain, a node repair, a
  managed node group update, a Spot or Capacity Block end). torchrun forwards the signal to the
  workers; the ranks checkpoint and end *without* success, because a PyTorchJob with an
  elasticPolicy is marked Succeeded as soon as any worker pod succeeds (Training Operator v1.9.4
  pkg/controller.v1/pytorch/pytorchjob_controller.go, UpdateJobStatus). Local rank 0 of each node
  leaves a note (FSDPTRAIN_EXIT_NOTE) for the pod's launcher (fsdptrain.launch), which starts
  torchrun again on the nodes that were not evicted, and exits 128+15 on the evicted one: a code the
  operator retries by recreating the pod (pkg/util/train/train_util.go, IsRetryableExitCode:
  >= 128), where torchrun itself exits 1 on SIGTERM (torch/distributed/elastic/agent/server/api.py,
  `run`: SignalException re-raised), which ExitCode makes permanent. The job comes back and resumes
  from the checkpoint it just wrote.

A third note, **failed**, says no restart can help (the volume is full or not writable): the
launcher ends the pod with 1 at once instead of letting torchrun retry the same save MAX_RESTARTS
times.

A **lost store** needs no note: with RDZV_BACKEND=c10d the rendezvous lives in a TCPStore that the
agent of node 0 (worker 0) hosts. When that node dies, an agent elsewhere that asks the store
anything (each monitor pass asks `num_nodes_waiting`; a restart asks for the next round) raises
RendezvousConnectionError (torch/distributed/elastic/rendezvous/c10d_rendezvous_backend.py,
`_call_store`) and torchrun exits 1, a code ExitCode makes permanent: the whole job would fail for
one lost node. torchrun's `main` is wrapped in `elastic.multiprocessing.errors.record`, which writes
the agent's own exception to TORCHELASTIC_ERROR_FILE (errors/error_handler.py, record_exception;
each worker is given a file of its own, multiprocessing/api.py), so the launcher reads why its agent
ended and starts torchrun again, whose fresh agent joins the store the recreated pod hosts (a client
retries its connect for `read_timeout`, set to RDZV_JOIN_TIMEOUT).

Who gets the signal differs (FSDPTRAIN_SIGNALS): the kubelet sends SIGTERM to the container's PID 1
alone, the launcher, which forwards it to torchrun (`pod`, the default). Slurm signals every process
of a job step at once (`step`: slurmstepd's signal_container goes through the proctrack plugin,
Slurm 22.05 src/slurmd/slurmstepd/req.c _handle_signal_container, proctrack/linuxproc and
proctrack/cgroup kill every process of the step), so torchrun already has it and a forwarded copy
would be its second: torch's elastic agent raises SignalException on each one
(torch/distributed/elastic/multiprocessing/api.py, _terminate_process_handler), and a second one
lands inside its shutdown (`_close` waiting for the workers) and abandons it, killing workers that
are still writing the stop checkpoint. On Slurm the launcher therefore forwards nothing.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

from fsdptrain import atomic

STOP_FILE_ENV = (
    "FSDPTRAIN_STOP_FILE"  # the pod's annotations as the kubelet writes them (downward API)
)
STOP_ANNOTATION = "fsdpctl.io/stop"
NOTE_ENV = "FSDPTRAIN_EXIT_NOTE"  # a file the pod's launcher reads after torchrun ends
# who gets the scheduler's SIGTERM: `pod` (PID 1 alone: Kubernetes, local) or `step` (every process
# of the job step: Slurm); see the module's docstring
SIGNALS_ENV = "FSDPTRAIN_SIGNALS"
# where each launcher of a Slurm step writes the code it ends with (a file per launcher): the batch
# script tells a step the trainers ended from one Slurm ended under them (a task killed, a launch
# refused), which it starts again
ENDS_DIR_ENV = "FSDPTRAIN_ENDS_DIR"
# agreed across ranks with MAX: a stop request wins over a disruption seen at the same step
NONE, DISRUPTED, STOP = 0, 1, 2
RETRYABLE_EXIT = 128 + signal.SIGTERM  # what a container killed by SIGTERM reports
# the downward API's annotations file: one `key="value"` line per annotation, the value quoted as
# Go's %q
_LINE = re.compile(r'^(?P<key>[^=\s]+)="(?P<value>.*)"$')


def pod_annotations(path: str) -> dict[str, str]:
    """The pod's annotations from the downward API file; {} when it is missing or unreadable."""
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError):
        return {}
    found = (_LINE.match(line) for line in text.splitlines())
    return {m["key"]: m["value"] for m in found if m}


def stop_requested(environ: Mapping[str, str]) -> bool:
    path = environ.get(STOP_FILE_ENV, "")
    return bool(path) and STOP_ANNOTATION in pod_annotations(path)


def local_reason(signalled: bool, environ: Mapping[str, str]) -> int:
    """This rank's reason to end now: a stop request (whether or not a signal came with it), else a
    SIGTERM (a disruption), else none."""
    if stop_requested(environ):
        return STOP
    return DISRUPTED if signalled else NONE


def signals_reach_every_process(environ: Mapping[str, str]) -> bool:
    """Whether the scheduler signals every process of the step (Slurm), not the launcher alone."""
    return environ.get(SIGNALS_ENV, "pod") == "step"


def describe(reason: int, environ: Mapping[str, str] | None = None) -> str:
    """The reason in words. A SIGTERM without a stop request is an eviction on Kubernetes; on Slurm
    it comes from the scheduler: a `scancel` from outside fsdpctl (scancel(1): SIGTERM, then SIGKILL
    after KillWait), a preemption or a time limit."""
    step = signals_reach_every_process(os.environ if environ is None else environ)
    disrupted = (
        "disrupted (SIGTERM from the scheduler: scancel, preemption or time limit)"
        if step
        else "disrupted (SIGTERM: pod evicted)"
    )
    return {STOP: "stop requested (fsdpctl job stop)", DISRUPTED: disrupted}.get(reason, "none")


def write_note(environ: Mapping[str, str], kind: str, **detail: Any) -> None:
    """Tell the pod's launcher why the run ended (kind: disrupted or failed). Written whole (a
    rename), by every rank that knows, since any of them may be the last one the launcher waits for.
    """
    path = environ.get(NOTE_ENV)
    if not path:
        return
    try:
        atomic.write_text(path, json.dumps({"kind": kind, **detail}))
    except OSError:  # the launcher then goes by the exit code alone
        pass


# On Kubernetes the leader's pod ends first (fsdpctl sets this, in seconds, for pods): an elastic
# PyTorchJob is Succeeded as soon as any worker pod succeeds, and cleanPodPolicy Running then deletes
# the pods still running (training-operator v1.9.4 pytorchjob_controller.go UpdateJobStatus,
# common/job.go DeletePodsAndServices). torchrun's agents leave their exit barrier together
# (torch/distributed/elastic/agent/server/api.py _exit_barrier), so the leader's pod, with its log
# (the summary, the losses), was deleted in about one run in three. The nodes whose ranks do not
# include global rank 0 mark themselves followers; their launchers wait this long after torchrun.
LEADER_FIRST_ENV = "FSDPTRAIN_LEADER_FIRST_S"


def follower_mark(environ: Mapping[str, str]) -> str | None:
    """Where a follower node's launcher learns it is one: beside its exit note."""
    path = environ.get(NOTE_ENV)
    return f"{path}.follower" if path else None


def mark_follower(environ: Mapping[str, str], group_rank: str | None) -> None:
    """Written by a node's local rank 0 at a successful end when its node is not node 0 (torchrun's
    GROUP_RANK: global rank 0, the leader, is on group rank 0) and the pod's launcher waits."""
    mark = follower_mark(environ)
    if mark and group_rank not in (None, "0") and float(environ.get(LEADER_FIRST_ENV) or 0) > 0:
        try:
            Path(mark).touch()
        except OSError:  # the launcher then ends as soon as torchrun does
            pass


def leader_first_s(environ: Mapping[str, str]) -> float:
    """How long this pod's launcher waits after torchrun succeeded: LEADER_FIRST_S on a follower
    node, else 0."""
    mark = follower_mark(environ)
    if not mark or not os.path.exists(mark):
        return 0.0
    try:
        return max(0.0, float(environ.get(LEADER_FIRST_ENV) or 0))
    except ValueError:
        return 0.0


def read_note(path: str) -> dict[str, Any] | None:
    try:
        note = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return note if isinstance(note, dict) else None


# ---- what the pod's launcher does when torchrun ends ---------------------------------------------

RESTART = -1  # `pod_exit`: start torchrun again in this pod


def pod_exit(
    rc: int,
    *,
    signalled: bool,
    note: dict[str, Any] | None,
    stopping: bool,
    store_lost: bool = False,
) -> int:
    """The pod's exit code once torchrun ended with `rc` (negative: killed by that signal), or
    RESTART. `signalled`: the kubelet sent this pod SIGTERM; `note`: what the trainer left;
    `stopping`: the stop annotation is there; `store_lost`: the agent's own error was its
    rendezvous store gone (`lost_store`). Under restartPolicy ExitCode the operator recreates a
    pod that exits 128-255 and fails the job on 1-127 (Training Operator v1.9.4
    pkg/controller.v1/common/pod.go, ReconcilePods)."""
    if stopping and (signalled or rc == 0):
        return 0  # asked to stop: torchrun's own 1 on SIGTERM is no failure of the job
    if signalled:
        return RETRYABLE_EXIT  # evicted: the operator recreates this pod, the job resumes
    if note and note.get("kind") == "failed":
        return 1  # no restart can help: fail the job now
    if note and note.get("kind") == "disrupted":
        return RESTART  # another node was evicted: rejoin with a fresh agent (and store)
    if store_lost and rc == 1 and not stopping:
        return RESTART  # the node hosting the store died: rejoin the one its new pod hosts
    return 128 - rc if rc < 0 else rc  # as a container runtime reports a death by signal


AGENT_ERROR_ENV = "TORCHELASTIC_ERROR_FILE"  # where torchrun's agent writes why it ended
STORE_LOST = "RendezvousConnectionError"


def lost_store(path: str) -> bool:
    """torchrun's agent ended because its rendezvous store stopped answering: the error file it
    left (`{"message": {"message": "<ExceptionType>: ...", ...}}`, error_handler.record_exception)
    names RendezvousConnectionError. A worker's failure copied there (ChildFailedError) names the
    worker's own exception, and no file (an agent killed, or a torch that writes none) is False."""
    note = read_note(path)
    message = note.get("message") if note else None
    text = message.get("message") if isinstance(message, dict) else message
    return isinstance(text, str) and text.startswith(f"{STORE_LOST}:")


STARTS_DIR_ENV = "FSDPTRAIN_STARTS_DIR"  # the run's ledger of torchrun starts, on the shared volume
STARTS_MAX_ENV = "FSDPTRAIN_STARTS_MAX"  # JOB_NODES x (1 + MAX_RESTARTS)


class Ledger(NamedTuple):
    starts: int | None  # this run's torchrun starts so far, this one included; None: no ledger
    refusal: str | None  # the line refusing this start (over the budget), else None


def record_start(environ: Mapping[str, str], who: str) -> Ledger:
    """Count a torchrun start of this run in its ledger (a file per start, in a directory every pod
    sees); with the line that refuses it when the job has started more often than its budget. Under
    restartPolicy ExitCode a pod that dies by a signal is recreated without bound (the operator's
    backoffLimit counts the restarts of running containers, and with ExitCode pods never restart in
    place: v1.9.4 pkg/core/job.go, PastBackoffLimit), so the pods bound themselves: JOB_NODES first
    starts plus MAX_RESTARTS restarts of every node. No count and no refusal: no ledger (a plain
    torchrun, or a volume it cannot write to)."""
    folder, most = environ.get(STARTS_DIR_ENV, ""), environ.get(STARTS_MAX_ENV, "")
    if not folder or not most.isdigit():
        return Ledger(None, None)
    try:
        os.makedirs(folder, exist_ok=True)
        Path(folder, f"{who}-{os.getpid()}-{time.time_ns()}").touch()
        count = len(os.listdir(folder))
    except OSError:
        return Ledger(None, None)
    if count <= int(most):
        return Ledger(count, None)
    return Ledger(
        count,
        f"this run has started torchrun {count} times, over its budget of {most} (JOB_NODES x (1 + "
        "MAX_RESTARTS)): not starting again; `fsdpctl job logs --all` shows why it kept failing",
    )


# What a launcher prints at a torchrun start past the run's first JOB_NODES (fsdpctl.job.kstatus
# reads it: on Kubernetes a pod recreated or a torchrun started again leaves no restartCount and no
# agent restart line, and the ledger is the one count every pod shares)
RESTART_LINE = "fsdptrain: torchrun start {count} of this run, at most {most}: the job restarted"


def restart_line(ledger: Ledger, environ: Mapping[str, str], nodes: int) -> str | None:
    if ledger.starts is None or ledger.starts <= nodes:
        return None
    return RESTART_LINE.format(count=ledger.starts, most=environ.get(STARTS_MAX_ENV, "?"))


def record_end(environ: Mapping[str, str], who: str, code: int) -> None:
    """The launcher's exit code in ENDS_DIR_ENV's folder, written whole (a rename); nothing when
    unset or not writable (the script then counts this launcher as ended by Slurm)."""
    folder = environ.get(ENDS_DIR_ENV, "")
    if not folder:
        return
    path = Path(folder) / f"{who}-{os.getpid()}"
    try:
        os.makedirs(folder, exist_ok=True)
        atomic.write_text(path, f"{code}\n")
    except OSError:
        pass

"""What a backend says about a job, typed (pure): its phase, its status report (`job status`, `job
list`, the follow screen, `-o json`), why it failed, and its pre-step. Every backend returns these
shapes; the CLI reads nothing else. As torchx's `AppState` and `is_terminal` (torchx/specs/api.py):
one set of phases for every scheduler, and one rule for which of them are final.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Literal, NotRequired, TypedDict


class Phase(StrEnum):
    """A job's phase, whichever backend runs it (a str: `-o json` writes its value)."""

    PENDING = "Pending"
    CREATED = "Created"
    RUNNING = "Running"
    RESTARTING = "Restarting"
    SUSPENDED = "Suspended"
    STOPPING = "Stopping"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    STOPPED = "Stopped"
    ORPHANED = "Orphaned"  # local: its supervisor died while processes of its pods still live
    # its place gave no answer that says (an empty or malformed scheduler record, an unreachable
    # controller): never an outcome, so nothing is deleted or marked failed on it
    UNKNOWN = "Unknown"


# A job in one of these has ended; any other phase may still change.
FINAL = frozenset({Phase.SUCCEEDED, Phase.FAILED, Phase.STOPPED})
# What `job wait` returns: a final phase, else its timeout passed first (then the phase the job had,
# or TIMEOUT where the backend no longer saw it)
TIMEOUT: Literal["Timeout"] = "Timeout"
Waited = Phase | Literal["Timeout"]


class Progress(TypedDict):
    """Training progress from the leader's event lines (`fsdpctl.job.progress.progress`)."""

    step: int
    max_steps: int | None
    percent: float
    loss: float | None
    tokens_per_s: float | None
    eta_s: float | None
    last_progress_s: float | None
    checkpoint: str | None  # the newest checkpoint the trainer published
    summary: dict[str, Any] | None  # the trainer's summary event, once it ended
    mfu: NotRequired[float | None]  # once a step was logged


class RankFailure(TypedDict):
    """Why a rank failed, in its own words, from its node's log (`fsdpctl.job.kstatus.failure`)."""

    rank: int | None
    exitcode: int | None
    error_file: str | None
    error: str | None
    line: int | None  # 1-based, in `log`
    raised: str | None


class Failure(RankFailure):
    """Why a job failed: the failing rank's words, on the node whose exit failed the job."""

    node: int | None
    log: str


class PrestepReport(TypedDict):
    """The pre-step's phase and the totals of its download (`fsdpctl.job.prestep.report`)."""

    phase: str
    repos: list[str]
    files_done: int
    files_total: int
    bytes_done: int
    bytes_total: int
    downloaded_bytes: int
    error: str | None


class GpuNode(TypedDict):
    """A GPU node of a job on a cluster (`fsdpctl.plan.nodefit.gpu_node_fit`): what its device
    plugins made allocatable against what one of the job's pods asks for, and the job's pods on
    it."""

    node: str
    allocatable: dict[str, int]  # resource -> count
    wants: dict[str, int]
    ready: bool
    short: list[str]  # the resources it has fewer of than a pod asks for
    pods: list[str]


class SchedulerJob(TypedDict):
    """The job in a batch scheduler (Slurm: scontrol's record of it)."""

    id: int
    state: str | None  # JobState
    nodes: str | None  # NodeList, a hostlist expression; None before it has any


class Report(Progress):
    """`job status` of one job: the same keys from every backend, then what only some have."""

    job: str
    backend: str
    phase: Phase
    run_id: str
    nodes: int
    nodes_running: int
    restarts: int
    age_s: float
    leader: str | None  # the node (local) or pod (cluster) hosting global rank 0
    leader_log: str | None
    checkpoint_dir: str | None
    reason: str | None
    problems: list[
        str
    ]  # what is wrong now, one line each (Pending reasons, a budget spent, a hang)
    stalled: bool
    labels: dict[str, str]
    prestep: PrestepReport | None
    network: str | None
    stage: NotRequired[str]  # before the first step: how far the start got
    failure: NotRequired[Failure | None]
    identity: NotRequired[str | None]  # the user the pods run as (local)
    kind: NotRequired[str]  # the job's kind on a cluster (PyTorchJob, TrainJob)
    pods: NotRequired[dict[str, int]]  # pods by state (cluster)
    network_warning: NotRequired[str | None]
    gpu_nodes: NotRequired[list[GpuNode] | None]
    interrupted: NotRequired[bool]  # Ctrl-C ended the follow
    scheduler_job: NotRequired[SchedulerJob]
    world_changes: NotRequired[list[str]]  # "3 → 2 nodes at step 120: node-1 lost" (job.world)


def is_final(phase: str | None) -> bool:
    return phase in FINAL

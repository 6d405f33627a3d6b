"""A local job's part of its state (FSDPCTL_HOME/jobs/<job>/state.json, the job core's file:
fsdpctl.job.state): the keys its supervisor records and their checks, the paths derived from it
rather than taken from it, and the host directories that stand for its volumes.

The state is read back later, perhaps damaged or from another home (`cp -a` keeps absolute paths),
and `cleanup` deletes by it. So no path is taken from it as it stands: the log directory is
`jobs/<job>/logs/<run-id>` of this FSDPCTL_HOME, and the other paths it records (checkpoints, the
pre-step's marker, TensorBoard, NCCL dumps) are used only inside this FSDPCTL_HOME, moved there from
the home the job was started in when the home was copied or moved.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Any, Required, TypedDict, cast

from fsdpctl.errors import FsdpctlError
from fsdpctl.files import home
from fsdpctl.job import home as job_home
from fsdpctl.job import state as core
from fsdpctl.job.reports import Phase
from fsdpctl.job.state import (
    Keys,
    between,
    is_count,
    is_int,
    is_num,
    is_str,
    list_of,
    obj,
    optional,
)

RECORDED_ACTIVE = (Phase.PENDING, Phase.RUNNING, Phase.STOPPING)


# Orphaned is never recorded: the supervisor died (SIGKILL, OOM) while processes of its job still
# live
ACTIVE = (*RECORDED_ACTIVE, Phase.ORPHANED)


STOP_GRACE_S = 120  # a job rendered without terminationGracePeriodSeconds
MAX_REPLICAS = 100_000
# the phases a supervisor records (Orphaned never is: it is what a reader sees when the supervisor
# died)
PHASES = (
    Phase.PENDING,
    Phase.RUNNING,
    Phase.STOPPING,
    Phase.SUCCEEDED,
    Phase.FAILED,
    Phase.STOPPED,
)

_IDENTITY = {"pid": optional(lambda v: is_int(v) and v > 0), "start": optional(is_count)}
_IDENTITY |= {"boot": optional(is_str)}
_LAUNCHER = {
    **_IDENTITY,
    "node": is_count,
    "rc": optional(is_int),
    "address": is_str,
    "relaunches": is_count,
}
# every key of the local backend's a verb reads, with what it must be (the core checks job, run_id,
# created, version, backend, labels, stop_requested)
KEYS = Keys(
    required={
        "phase": lambda v: v in PHASES,
        "replicas": between(1, MAX_REPLICAS),
        "log_dir": is_str,
        "checkpoint_dir": optional(is_str),
        "launchers": list_of(obj(_LAUNCHER, required=("node",))),
    },
    optional={
        "tensorboard_dir": optional(is_str),
        "nccl_traces": list_of(is_str),
        "max_restarts": is_count,
        "prestep": optional(
            obj(
                {"log": is_str, "marker": is_str, "rc": optional(is_int)},
                required=("log", "marker"),
            )
        ),
        "supervisor_pid": optional(lambda v: is_int(v) and v > 0),
        "supervisor": optional(obj(_IDENTITY, required=("pid",))),
        "mark": is_str,
        "started": is_num,
        "finished": is_num,
        "rdzv_endpoint": is_str,
        "network": is_str,
        "net_index": optional(is_count),
        "reason": optional(is_str),
        "failed_node": optional(is_count),  # the node whose exit failed the job (the supervisor's)
        "identity": optional(
            is_str
        ),  # the user the pods run as (kubelet.as_user), for `job status`
    },
)


class Identity(TypedDict, total=False):
    """A process as the supervisor identifies it (its pid, start time and boot: a pid alone may be
    reused)."""

    pid: Required[int | None]
    start: int | None
    boot: str | None


class Launcher(Identity, total=False):
    """A node's torchrun launcher as the supervisor records it."""

    node: Required[int]
    rc: int | None
    address: str
    relaunches: int


class PrestepState(TypedDict, total=False):
    log: Required[str]
    marker: Required[str]
    rc: int | None


class LocalState(core.JobState, total=False):
    """A local job's state: the core's keys and its supervisor's (KEYS checks each as read)."""

    phase: Required[str]
    replicas: Required[int]
    log_dir: Required[str]
    checkpoint_dir: Required[str | None]
    launchers: Required[list[Launcher]]
    tensorboard_dir: str | None
    nccl_traces: list[str]
    max_restarts: int
    prestep: PrestepState | None
    supervisor_pid: int | None
    supervisor: Identity | None
    mark: str
    started: float
    finished: float
    rdzv_endpoint: str
    network: str
    net_index: int | None
    reason: str | None
    failed_node: int | None
    identity: str | None


class LocalJobError(FsdpctlError):
    pass


class JobBusy(LocalJobError):
    """`job run` of a job whose run is active or some process of which still lives."""


class NotOurs(LocalJobError):
    """`job run` of a job whose checkpoint directory on a claim another home's or another job's
    owner file names (fsdpctl.backends.local.owned)."""


CorruptState = core.Damaged  # a state.json that cannot be read as a job's state


def job_dir(job_name: str) -> Path:
    return job_home.job_dir(job_name)


def read_state(jdir: Path) -> LocalState | None:
    """The job's state (the core's reader: checked, never followed or blocked on); None when it has
    none; CorruptState naming the file when it is not this local job's state."""
    st = core.read(jdir)
    if st is not None and core.backend_of(st) != core.FIRST_BACKEND:
        return None  # the job's name is held by a run on another backend: no local job of it
    return cast(LocalState, st)  # core.read checked KEYS (the local Target's `state`)


def update(jdir: Path, **changes: Any) -> LocalState:
    return cast(LocalState, core.update(jdir, **changes))


def write_json(path: Path, data: dict) -> None:
    import json

    from fsdpctl.files import write_atomic

    write_atomic(path, json.dumps(data, indent=1))


# ---- paths: derived, or moved into this home -----------------------------------------------------


def log_dir(state: Mapping[str, Any]) -> Path:
    """Where the run's logs are: always the job's own directory of this home, whatever the file
    says."""
    return home() / "jobs" / str(state["job"]) / "logs" / str(state["run_id"])


def started_in(state: Mapping[str, Any]) -> PurePosixPath | None:
    """The FSDPCTL_HOME the job was started in, as its recorded log directory
    (`<home>/jobs/<job>/logs/<run-id>`) says; None when that is not the shape fsdpctl writes."""
    recorded = PurePosixPath(os.path.normpath(state["log_dir"]))
    if recorded.is_absolute() and recorded.parts[-4:] == (
        "jobs",
        state["job"],
        "logs",
        state["run_id"],
    ):
        return recorded.parents[3]
    return None


def in_home(state: Mapping[str, Any], recorded: str | None) -> Path | None:
    """A path the state records, as it is in this home: itself when it is under this home, moved
    here when it is under the home the job was started in (a copied or moved home), else None (not
    fsdpctl's). Normalised first, so `..` cannot walk out."""
    if not recorded:
        return None
    path = PurePosixPath(os.path.normpath(recorded))
    if not path.is_absolute():
        return None
    here = PurePosixPath(home())
    if path.is_relative_to(here):
        return Path(path)
    then = started_in(state)
    if then is not None and path.is_relative_to(then):
        return home() / path.relative_to(then)
    return None


def checkpoint_dir(state: Mapping[str, Any]) -> Path | None:
    """The job's checkpoint directory that `cleanup --checkpoints` may delete: the one fsdpctl
    derives for the job (jobpolicy.checkpoint_dir: `<root>/<job>`, the root on a claim or the node's
    disk), mapped on this machine to `volumes/<claim>/checkpoints/<job>`, `volumes/<claim>/<job>` or
    a path in the job's own directory. Anything else a state may name (another job's, a claim's
    root, outside the home) is None."""
    path = in_home(state, state.get("checkpoint_dir"))
    job = state["job"]
    if path is None or path.name != job:
        return None
    rel = path.relative_to(home()).parts
    on_claim = rel[0] == "volumes" and (
        len(rel) == 3 or (len(rel) == 4 and rel[2] == "checkpoints")
    )
    own = rel[:2] == ("jobs", job) and len(rel) > 2
    return path if on_claim or own else None


def temp_dir(jdir: Path, node: int | str) -> Path:
    """Node N's launcher's TMPDIR: torchrun makes its `torchelastic_*` log dir there
    (tempfile.mkdtemp in torch/distributed/elastic/multiprocessing/api.py, DefaultLogsSpecs, never
    removed by torch), as in a pod's /tmp, which goes with its container. Under the node's pod-local
    disk."""
    return jdir / "nodes" / f"node-{node}" / "tmp"


def remove_temp_dirs(jdir: Path, replicas: int) -> None:
    for node in range(replicas):
        shutil.rmtree(temp_dir(jdir, node), ignore_errors=True)


def host_dir(jdir: Path, node: int | str, path: str) -> Path:
    """A hostPath (the /local scratch) on simulated node N: that node's own disk, which outlives its
    pods (unlike nodes/node-N, a pod's emptyDirs, renewed with each pod) and the job's runs, as a
    node's does."""
    return jdir / "hosts" / f"node-{node}" / path.lstrip("/")


def shared_volume_dir(claim: str) -> Path:
    """A PersistentVolumeClaim on this machine: a directory under FSDPCTL_HOME/volumes that outlives
    jobs."""
    return home() / "volumes" / claim

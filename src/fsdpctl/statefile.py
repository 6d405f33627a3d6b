"""A local job's state.json read back (pure): what shape it must have before any verb uses it, and
the paths fsdpctl derives from it itself rather than taking them from the file.

The state is fsdpctl's own file, but it is read back later, perhaps damaged (cut short, edited,
copied from another job) or from another version, and one verb (`cleanup`) deletes by it. So every
key a verb reads is checked for its type here (a wrong one makes the state damaged: skipped by `job
list` and `cleanup` with one warning, one line exit 2 for a verb naming the job), and no path is
taken from it as it stands: the log directory is `jobs/<job>/logs/<run-id>` of this FSDPCTL_HOME,
and the other paths it records (checkpoints, the pre-step's marker, TensorBoard, NCCL dumps) are
used only inside this FSDPCTL_HOME, moved there from the home the job was started in when the home
was copied or moved (`cp -a` keeps the absolute paths).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from pathlib import Path, PurePosixPath
from typing import Any

from fsdpctl.files import RUN_ID
from fsdpctl.reports import Phase

VERSION = 1  # written into every state; a state of a later version is refused, not misread
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
MAX_REPLICAS = 100_000

Check = Callable[[Any], bool]


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _count(v: Any) -> bool:
    return _int(v) and v >= 0


def _num(v: Any) -> bool:
    return (_int(v) or isinstance(v, float)) and math.isfinite(v)


def _str(v: Any) -> bool:
    return isinstance(v, str)


def _opt(check: Check) -> Check:
    return lambda v: v is None or check(v)


def _list(check: Check) -> Check:
    return lambda v: isinstance(v, list) and all(check(x) for x in v)


def _obj(keys: Mapping[str, Check], required: tuple[str, ...] = ()) -> Check:
    def ok(v: Any) -> bool:
        if not isinstance(v, dict) or any(k not in v for k in required):
            return False
        return all(check(v[k]) for k, check in keys.items() if k in v)

    return ok


_IDENTITY = {"pid": _opt(lambda v: _int(v) and v > 0), "start": _opt(_count), "boot": _opt(_str)}
_LAUNCHER = {
    **_IDENTITY,
    "node": _count,
    "rc": _opt(_int),
    "address": _str,
    "relaunches": _count,
}
# every key a verb reads, with what it must be; the first group must be there
REQUIRED: dict[str, Check] = {
    "job": _str,
    "run_id": lambda v: _str(v) and bool(RUN_ID.fullmatch(v)) and ".." not in v,
    "phase": lambda v: v in PHASES,
    "created": _num,
    "replicas": lambda v: _int(v) and 1 <= v <= MAX_REPLICAS,
    "log_dir": _str,
    "checkpoint_dir": _opt(_str),
    "launchers": _list(_obj(_LAUNCHER, required=("node",))),
}
OPTIONAL: dict[str, Check] = {
    "version": _int,
    "tensorboard_dir": _opt(_str),
    "nccl_traces": _list(_str),
    "max_restarts": _count,
    "prestep": _opt(
        _obj({"log": _str, "marker": _str, "rc": _opt(_int)}, required=("log", "marker"))
    ),
    "supervisor_pid": _opt(lambda v: _int(v) and v > 0),
    "supervisor": _opt(_obj(_IDENTITY, required=("pid",))),
    "mark": _str,
    "stop_requested": lambda v: isinstance(v, bool),
    "labels": lambda v: isinstance(v, dict) and all(_str(k) and _str(x) for k, x in v.items()),
    "started": _num,
    "finished": _num,
    "rdzv_endpoint": _str,
    "network": _str,
    "net_index": _opt(_count),
    "reason": _opt(_str),
    "failed_node": _opt(_count),  # the node whose exit failed the job (the supervisor's verdict)
    "identity": _opt(_str),  # the user the pods run as (adapters/kubelet.as_user), for `job status`
}


def problem(data: Any, job: str) -> str | None:
    """Why `data` is not the state of job `job` this fsdpctl can use; None when it is."""
    if not isinstance(data, dict):
        return "is not a job's state (not an object)"
    version = data.get("version", VERSION)
    if _int(version) and version > VERSION:
        return f"was written by a newer fsdpctl (state version {version}; this one reads {VERSION})"
    wrong = [k for k, check in REQUIRED.items() if k not in data or not check(data[k])]
    wrong += [k for k, check in OPTIONAL.items() if k in data and not check(data[k])]
    if not wrong and data["job"] != job:
        wrong = [f"job={data['job']!r}"]
    return f"is not a job's state (bad or missing: {', '.join(wrong)})" if wrong else None


# ---- paths: derived, or moved into this home ------------------------------------------------------------


def log_dir(home: Path, state: Mapping[str, Any]) -> Path:
    """Where the run's logs are: always the job's own directory of this home, whatever the file
    says."""
    return home / "jobs" / str(state["job"]) / "logs" / str(state["run_id"])


def started_in(state: Mapping[str, Any]) -> PurePosixPath | None:
    """The FSDPCTL_HOME the job was started in, as its recorded log directory
    (`<home>/jobs/<job>/logs/ <run-id>`) says; None when that is not the shape fsdpctl writes."""
    recorded = PurePosixPath(os.path.normpath(state["log_dir"]))
    if recorded.is_absolute() and recorded.parts[-4:] == (
        "jobs",
        state["job"],
        "logs",
        state["run_id"],
    ):
        return recorded.parents[3]
    return None


def in_home(home: Path, state: Mapping[str, Any], recorded: str | None) -> Path | None:
    """A path the state records, as it is in this home: itself when it is under this home, moved
    here when it is under the home the job was started in (a copied or moved home), else None (not
    fsdpctl's). Normalised first, so `..` cannot walk out."""
    if not recorded:
        return None
    path = PurePosixPath(os.path.normpath(recorded))
    if not path.is_absolute():
        return None
    here = PurePosixPath(home)
    if path.is_relative_to(here):
        return Path(path)
    then = started_in(state)
    if then is not None and path.is_relative_to(then):
        return home / path.relative_to(then)
    return None


def checkpoint_dir(home: Path, state: Mapping[str, Any]) -> Path | None:
    """The job's checkpoint directory that `cleanup --checkpoints` may delete: the one fsdpctl
    derives for the job (jobpolicy.checkpoint_dir: `<root>/<job>`, the root on a claim or the node's
    disk), mapped on this machine to `volumes/<claim>/checkpoints/<job>`, `volumes/<claim>/<job>` or
    a path in the job's own directory. Anything else a state may name (another job's, a claim's
    root, outside the home) is None."""
    path = in_home(home, state, state.get("checkpoint_dir"))
    job = state["job"]
    if path is None or path.name != job:
        return None
    rel = path.relative_to(home).parts
    on_claim = rel[0] == "volumes" and (
        len(rel) == 3 or (len(rel) == 4 and rel[2] == "checkpoints")
    )
    own = rel[:2] == ("jobs", job) and len(rel) > 2
    return path if on_claim or own else None

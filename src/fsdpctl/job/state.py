"""A job's state file, FSDPCTL_HOME/jobs/<job>/state.json, whatever backend runs the job (pure
reading and checking; atomic writing through fsdpctl.files).

The state is fsdpctl's own file, but it is read back later, perhaps damaged (cut short, edited,
copied from another job or machine) or from another version, and verbs act on what it says. So it
is untrusted input: every key a verb reads is checked for its type here (the core's keys below and
the keys of the backend that runs the job, `Target.state`), a state that fails is damaged (skipped
by `job list` and `cleanup` with one warning, one line and exit 2 for a verb naming the job), and no
path is taken from it: the paths a verb acts on are derived from the settings, the job's name and
its run id (`fsdpctl.job.home`), and a backend that records a path maps it into this home or ignores
it (backends/local/state.py).

    version   2 (1: a local job's state before the core; read as a local job's)
    job       the job's name: the directory's own
    backend   the place that runs it (targets.NAMES)
    run_id    the current run
    created   when the run was submitted (seconds since the epoch)
    ...       the backend's own keys (local: its supervisor's record; slurm: the Slurm job id, ...)

Written atomically (a reader sees the old state or the new one) with mode 0600 in a directory of
mode 0755, whatever the umask.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Required, TypedDict, cast

from fsdpctl import files, targets
from fsdpctl.errors import ExitCode, FsdpctlError

VERSION = 2
NAME = "state.json"
FIRST_BACKEND = "local"  # version 1 states were the local backend's alone

Check = Callable[[Any], bool]


# ---- checks of a value's type and range, composed per key ----------------------------------------


def is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def is_count(v: Any) -> bool:
    return is_int(v) and v >= 0


def is_num(v: Any) -> bool:
    return (is_int(v) or isinstance(v, float)) and math.isfinite(v)


def is_str(v: Any) -> bool:
    return isinstance(v, str)


def is_bool(v: Any) -> bool:
    return isinstance(v, bool)


def between(low: int, high: int) -> Check:
    return lambda v: is_int(v) and low <= v <= high


def optional(check: Check) -> Check:
    return lambda v: v is None or check(v)


def list_of(check: Check) -> Check:
    return lambda v: isinstance(v, list) and all(check(x) for x in v)


def obj(keys: Mapping[str, Check], required: tuple[str, ...] = ()) -> Check:
    def ok(v: Any) -> bool:
        if not isinstance(v, dict) or any(k not in v for k in required):
            return False
        return all(check(v[k]) for k, check in keys.items() if k in v)

    return ok


def labels(v: Any) -> bool:
    return isinstance(v, dict) and all(is_str(k) and is_str(x) for k, x in v.items())


@dataclass(frozen=True)
class Keys:
    """What a backend records in a job's state besides the core's keys: each key a verb reads, with
    the check its value must pass; `required` must be there."""

    required: Mapping[str, Check] = field(default_factory=dict)
    optional: Mapping[str, Check] = field(default_factory=dict)


CORE = Keys(
    required={
        "job": is_str,
        "run_id": lambda v: is_str(v) and bool(files.RUN_ID.fullmatch(v)) and ".." not in v,
        "created": is_num,
    },
    optional={
        "version": is_int,
        "backend": lambda v: v in targets.NAMES,
        "labels": labels,
        "stop_requested": is_bool,
    },
)


class JobState(TypedDict, total=False):
    """A job's state as `read` returns it, checked: the core's keys (CORE), and where on a cluster
    the job lives (the runner writes these for a Kubernetes backend: listing.PLACEMENT_KEYS, checked
    by the EKS backend's Keys). A backend's own keys are in its own type, which extends this one
    (backends/local/state.py LocalState, backends/slurm SlurmState) and is read through it."""

    job: Required[str]
    run_id: Required[str]
    created: Required[float]
    version: int
    backend: str
    labels: dict[str, str]
    stop_requested: bool
    job_namespace: str
    job_kind: str
    kube_context: str


def backend_of(data: Mapping[str, Any]) -> str:
    """The backend a state says runs the job (a state of version 1: the local backend's)."""
    return str(data.get("backend", FIRST_BACKEND))


def keys_of(backend: str) -> Keys:
    """The backend's own keys (its Target's `state` field names them)."""
    ref = targets.target(backend).state
    found: Keys = targets.resolve(ref) if ref else Keys()
    return found


def problem(data: Any, job: str) -> str | None:
    """Why `data` is not the state of job `job` this fsdpctl can use; None when it is."""
    if not isinstance(data, dict):
        return "is not a job's state (not an object)"
    version = data.get("version", 1)
    if is_int(version) and version > VERSION:
        return f"was written by a newer fsdpctl (state version {version}; this one reads {VERSION})"
    if "backend" in data and data["backend"] not in targets.NAMES:
        return f"is not a job's state (backend {str(data['backend'])[:40]!r} is not one of {targets.NAMES})"
    wrong = []
    for keys in (CORE, keys_of(backend_of(data))):
        wrong += [k for k, check in keys.required.items() if k not in data or not check(data[k])]
        wrong += [k for k, check in keys.optional.items() if k in data and not check(data[k])]
    if not wrong and data["job"] != job:
        wrong = [f"job={str(data['job'])[:70]!r}"]
    return f"is not a job's state (bad or missing: {', '.join(wrong)})" if wrong else None


class Damaged(FsdpctlError):
    """A state.json that cannot be read as the job's state (a stray or damaged file), named."""

    def __init__(self, path: Path, why: str):
        super().__init__(
            f"{path} {why}",
            hint=f"remove {path.parent} (its run's logs go with it) and run the job again",
            code=ExitCode.BAD_INPUT,
        )
        self.path = path


class Unreadable(Damaged):
    """A state.json the file system will not let this user read (permissions, an I/O error): the
    file may be whole, so the hint is to fix the access, never to remove the job's directory. A
    Damaged for the verbs that pass over a job they cannot read (list, cleanup keep it)."""

    def __init__(self, path: Path, why: str):
        FsdpctlError.__init__(
            self,
            f"{path} cannot be read: {why}",
            hint="fix its permissions (or run as the user who started the job); nothing was changed",
            code=ExitCode.BAD_INPUT,
        )
        self.path = path


def read(jdir: Path) -> JobState | None:
    """The job's state; None when it has none; Damaged (naming the file) when it is not this job's
    state: not a regular file (a FIFO, a link, a directory: read without following or blocking),
    too big, not UTF-8 JSON, the wrong shape, a newer version's, or another job's."""
    path = jdir / NAME
    try:
        data = files.read_json(path)
    except FileNotFoundError:
        return None
    except OSError as e:
        if not isinstance(e, files.NotOurs) and (fs := files.fs_error(e, path)):
            raise Unreadable(path, fs) from e
        raise Damaged(path, files.why(e)) from e
    except ValueError as e:
        raise Damaged(path, files.why(e)) from e
    if why := problem(data, jdir.name):
        raise Damaged(path, why)
    # problem() checked every key the core and the job's backend read, each for its type
    return cast(JobState, dict(data))


def write(jdir: Path, state: Mapping[str, Any]) -> None:
    """The whole state, atomically, mode 0600 (files.write_atomic)."""
    files.make_dirs(jdir)
    files.write_atomic(jdir / NAME, json.dumps({**state, "version": VERSION}, indent=1))


def update(jdir: Path, **changes: Any) -> JobState:
    """The state with `changes` over it, written back; the new state (the caller's keys: a
    backend's own, or the core's)."""
    state = cast(JobState, {**(read(jdir) or {}), **changes})
    write(jdir, state)
    return state


def remove(jdir: Path) -> None:
    """The state file alone (a run whose submit was undone leaves no state behind)."""
    try:
        os.unlink(jdir / NAME)
    except FileNotFoundError:
        pass

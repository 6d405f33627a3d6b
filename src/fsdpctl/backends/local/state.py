"""A local job's directory and its state file (FSDPCTL_HOME/jobs/<job>/state.json, fsdpctl.statefile):
read, checked and updated atomically; the host directories that stand for its volumes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from fsdpctl import files, statefile
from fsdpctl.files import home, write_atomic
from fsdpctl.reports import Phase

RECORDED_ACTIVE = (Phase.PENDING, Phase.RUNNING, Phase.STOPPING)


# Orphaned is never recorded: the supervisor died (SIGKILL, OOM) while processes of its job still
# live
ACTIVE = (*RECORDED_ACTIVE, Phase.ORPHANED)


LOCK = "lock"


STOP_GRACE_S = 120  # a job rendered without terminationGracePeriodSeconds


class LocalJobError(RuntimeError):
    pass


class JobBusy(LocalJobError):
    """`job run` of a job whose lock is held or some process of which still lives."""


class CorruptState(LocalJobError):
    """A state.json that cannot be read as a job's state (a stray or damaged file)."""


def job_dir(job_name: str) -> Path:
    return home() / "jobs" / files.job_name(job_name)


def write_json(path: Path, data: dict) -> None:
    write_atomic(path, json.dumps(data, indent=1))


def read_state(jdir: Path) -> dict | None:
    """The job's state; None when it has none; CorruptState (naming the file) when it is not this
    job's state: not a regular file (a FIFO, a link, a directory), too big, not UTF-8 JSON, the
    wrong shape (fsdpctl.statefile), a newer version's, or another job's (cleanup deletes by it)."""
    path = jdir / "state.json"
    try:
        data = files.read_json(path)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise CorruptState(f"{path} {files.why(e)}") from e
    if problem := statefile.problem(data, jdir.name):
        raise CorruptState(f"{path} {problem}")
    return data


def log_dir(state: dict) -> Path:
    """The run's log directory, derived (never the path the file records: it may be damaged or
    another home's)."""
    return statefile.log_dir(home(), state)


def in_home(state: dict, recorded: str | None) -> Path | None:
    """A path the state records, if it is in this FSDPCTL_HOME (or was in the home the job ran
    from)."""
    return statefile.in_home(home(), state, recorded)


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


def update(jdir: Path, **changes) -> dict:
    state = read_state(jdir) or {}
    state.update(changes)
    write_json(jdir / "state.json", state)
    return state

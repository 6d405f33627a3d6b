"""What the job core knows of the jobs in this home without changing them: `job list` over every
backend that holds one (a backend's or a job's trouble is one warning, never an empty or failed
list), a job's placement from its state, and the rows that say Unknown or Stopped from what a state
records when its place cannot say."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from fsdpctl import files, targets
from fsdpctl.errors import FsdpctlError
from fsdpctl.job import home, state
from fsdpctl.job.protocol import Factory
from fsdpctl.job.reports import Phase, Report
from fsdpctl.job.state import JobState

# settings that say where on its backend a job lives, kept in its state: a verb on the job finds it
# there without being told (`placed`)
PLACEMENT_KEYS = ("job_namespace", "job_kind", "kube_context")


def stopped_report(st: JobState, nodes: int) -> Report:
    """A run fsdpctl stopped whose place deleted it (EKS: `job stop` deletes the job and its
    pods), from what the state records."""
    why = (
        "stopped with `fsdpctl job stop`; its place deleted the job's objects: `fsdpctl job resume` "
        "continues from its last checkpoint"
    )
    return {**unknown_report(st, nodes, why), "phase": Phase.STOPPED, "problems": []}


@dataclass
class Listed:
    """`job list` over every backend: the reports, what was passed over (one line each), and the
    backends that could not be asked (their error: the command prints the rest, then fails)."""

    reports: list[Report] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    failed: list[FsdpctlError] = field(default_factory=list)


def list_jobs(backend: str, other: Factory, only: str | None = None) -> Listed:
    """The jobs of every backend that holds one in this home, and of `only` (or BACKEND when it is a
    place that keeps its own jobs, EKS's cluster) besides; with `only`, that backend's alone. A
    backend that cannot be asked is in `failed`, and its jobs recorded here are listed as
    Unknown."""
    names = [only] if only else backends_here(backend)
    found = Listed()
    for name in names:
        be = other(name)
        try:
            rows = be.list_jobs()
        except FsdpctlError as e:
            found.failed.append(e)
            rows = [_unknown_row(s, f"{name}: {e}") for s in _states_of(name)]
        found.notes += [n for n in getattr(be, "notes", []) if n not in found.notes]
        found.reports += rows
    return found


def backends_here(backend: str) -> list[str]:
    """The backends holding a job in this home, and `backend`, BACKEND's value (EKS lists the
    cluster's jobs, started from anywhere)."""
    here = {state.backend_of(s) for s in _all_states()} | {backend}
    # a layout before the job core (Slurm's FSDPCTL_HOME/slurm/, which its backend adopts as it
    # lists): a job there is a job here
    here |= {
        n
        for n in targets.NAMES
        if (d := targets.target(n).legacy_dir) and (files.home() / d).is_dir()
    }
    return [n for n in targets.NAMES if n in here]


def _all_states() -> list[JobState]:
    found = []
    for jdir in home.job_dirs(lambda _: None):
        try:
            st = state.read(jdir)
        except state.Damaged:
            continue
        if st is not None:
            found.append(st)
    return found


def _states_of(backend: str) -> list[JobState]:
    return [s for s in _all_states() if state.backend_of(s) == backend]


def states_of(backend: str, notes: list[str]) -> list[JobState]:
    """Every job of `backend` recorded in this home (for a backend's list and cleanup); a damaged
    state or a stray file is one line in `notes` and the other jobs are still there."""
    found = []
    for jdir in home.job_dirs(notes.append):
        try:
            st = state.read(jdir)
        except state.Damaged as e:
            notes.append(f"{e}: skipped")
            continue
        if st is not None and state.backend_of(st) == backend:
            found.append(st)
    return found


def _unknown_row(st: JobState, why: str) -> Report:
    """A recorded job whose backend could not be asked, as a row that says so."""
    return unknown_report(st, _nodes(st), why)


def _nodes(st: Mapping[str, object]) -> int:
    """The node count a backend's own keys record (Slurm: nodes, local: replicas; checked ints)."""
    n = st.get("nodes") or st.get("replicas") or 0
    return n if isinstance(n, int) else 0


def unknown_report(st: JobState, nodes: int, why: str) -> Report:
    """A report that knows only what the state records: the job, its backend and run, Unknown with
    what was asked and what came back."""
    backend = state.backend_of(st)
    return {
        "job": st["job"],
        "backend": backend,
        "phase": Phase.UNKNOWN,
        "run_id": st["run_id"],
        "nodes": nodes,
        "nodes_running": 0,
        "restarts": 0,
        "age_s": time.time() - st["created"],
        "leader": None,
        "leader_log": None,
        "checkpoint_dir": None,
        "reason": why,
        "problems": [why],
        "stalled": False,
        "labels": {
            "fsdpctl.io/job": st["job"],
            "fsdpctl.io/run-id": st["run_id"],
            **st.get("labels", {}),
            "fsdpctl.io/backend": backend,
        },
        "prestep": None,
        "network": None,
        "step": 0,
        "max_steps": None,
        "percent": 0.0,
        "loss": None,
        "tokens_per_s": None,
        "eta_s": None,
        "last_progress_s": None,
        "checkpoint": None,
        "summary": None,
    }


def placement(job: str) -> dict[str, str] | None:
    """Where the job's state says it lives: its backend, and on a Kubernetes place its namespace,
    kind and context; None without a state (a damaged one is said once: the verb then looks where
    BACKEND says)."""
    jdir = home.job_dir(job)
    try:
        st = state.read(jdir)
    except state.Damaged as e:
        files.skipped(
            e.path, str(e).removeprefix(f"{e.path} "), "ignored (the job is looked for at BACKEND)"
        )
        return None
    if st is None:
        return None
    recorded: Mapping[str, object] = st
    return {
        "backend": state.backend_of(st),
        **{k: str(recorded[k]) for k in PLACEMENT_KEYS if k in st},
    }

"""A Slurm job's part of its state (FSDPCTL_HOME/jobs/<job>/state.json, the job core's file:
fsdpctl.job.state): the keys the Slurm backend records besides the core's, and their checks."""

from __future__ import annotations

from fsdpctl.job import owner, shape
from fsdpctl.job import state as core
from fsdpctl.job.state import Keys, between, is_count

MAX_NODES = 100_000
# what a Slurm job's state records besides the core's keys (fsdpctl.job.state)
STATE = Keys(
    required={
        "slurm_job": shape.is_slurm_id,
        "nodes": between(1, MAX_NODES),
        "max_restarts": is_count,
    },
    optional={
        "slurm_user": is_count,
        "owner_home": lambda v: isinstance(v, str) and bool(owner.HOME_ID.fullmatch(v)),
    },
)


class SlurmState(core.JobState):
    """A Slurm job's state: the core's keys and STATE's (checked as read)."""

    slurm_job: int
    nodes: int
    max_restarts: int
    slurm_user: int
    owner_home: str

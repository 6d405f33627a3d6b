"""The places a job can run, each by what it is rather than by its name (pure).

Code outside `fsdpctl.backends` never compares a backend's name (tests/test_backend_neutral.py): it
asks the place's `Target` what it has. A new place is one folder under `backends/` (its `Backend`,
see `fsdpctl.backends`) and one line in `TARGETS`. As torchx's scheduler registry
(torchx/schedulers/__init__.py, `get_scheduler_factories`): the job is the same everywhere; each
scheduler says what it can do.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Target:
    """What a place to run jobs is, for the code that is the same on every place."""

    name: str
    # "module:Class" of its `Backend`, imported only when a command uses it (no kubernetes client
    # locally)
    backend: str
    # one processes per GPU on nodes of INSTANCE_TYPE (GPUS, EFA, the planner's step time, FSx
    # capacity); else CPU processes on this machine (LOCAL_PROCS_PER_NODE, its RAM)
    gpus: bool
    # the job is an object in a Kubernetes API, outliving the command that made it (JOB_KIND,
    # NODE_COUNT, the token as a Secret, the run record as a ConfigMap, TensorBoard through a
    # port-forward)
    kubernetes: bool
    # SHARED_VOLUME and CHECKPOINT_PVC are directories on this machine
    # (FSDPCTL_HOME/volumes/<claim>), and the job's logs are files here: `job record`/`job rerun`
    # read them, the HF cache is filled from here
    on_this_machine: bool
    # the trainer runs from an image (IMAGE_URI), which the run record names; else from this
    # checkout
    image: bool
    # what Ctrl-C does to a followed job
    interrupt: str
    where: str  # for `--backend` help: where the job runs
    # "module:function" (cfg, run_id) -> the text `fsdpctl manifest` prints, for a place that
    # renders the job as something other than Kubernetes objects (a batch script); "" for those
    # objects
    manifest: str = ""
    # "module:function" (cfg) -> one line per setting that means nothing there (key, value, fix),
    # refused by admission (`config validate`, `job run`, `manifest`) even with --force; "" none
    refusals: str = ""
    # "module:name" of the `fsdpctl.job.state.Keys` its jobs' state records besides the core's; ""
    # none
    state: str = ""
    # the shared volume is the FSx for Lustre file system the FSX_* settings describe and fsdpctl
    # sizes (on this machine a directory standing in for it): a save's rate follows from
    # FSX_STORAGE_GIB x FSX_THROUGHPUT_PER_TIB. False: the place's own file system, which fsdpctl
    # neither made nor read (a Slurm cluster's): its rate is SHARED_VOLUME_WRITE_MBPS or an
    # assumption (fsdpctl.plan.volume.rate)
    fsx_volume: bool = True
    # a directory of FSDPCTL_HOME where a layout before the job core kept its jobs (Slurm's
    # slurm/<job>.json, adopted as the backend lists them): a job there is a job of this home; ""
    # none
    legacy_dir: str = ""


TARGETS = {
    t.name: t
    for t in (
        Target(
            "local",
            "fsdpctl.backends.local.backend:LocalBackend",
            gpus=False,
            kubernetes=False,
            on_this_machine=True,
            image=False,
            interrupt="stopping (SIGTERM: the trainer saves a checkpoint)",
            where="this machine",
            state="fsdpctl.backends.local.state:KEYS",
        ),
        Target(
            "eks",
            "fsdpctl.backends.eks.backend:EksBackend",
            gpus=True,
            kubernetes=True,
            on_this_machine=False,
            image=True,
            interrupt="detaching",
            where="the cluster",
            state="fsdpctl.backends.eks.backend:STATE",
        ),
        # a Slurm cluster of the same GPU nodes (HyperPod, ParallelCluster); its shared file system
        # is mounted where fsdpctl runs, at the path the nodes see it, and it keeps no run record of
        # its own
        Target(
            "slurm",
            "fsdpctl.backends.slurm.backend:SlurmBackend",
            gpus=True,
            kubernetes=False,
            on_this_machine=False,
            image=False,
            interrupt="detaching",
            where="a Slurm cluster (sbatch)",
            manifest="fsdpctl.backends.slurm.script:manifest",
            refusals="fsdpctl.backends.slurm.script:refusals",
            state="fsdpctl.backends.slurm.state:STATE",
            fsx_volume=False,
            legacy_dir="slurm",
        ),
    )
}
NAMES = tuple(TARGETS)


def target(name: str) -> Target:
    """The place named `name` (settings check BACKEND against `NAMES` first)."""
    return TARGETS[name]


def resolve(ref: str) -> Any:
    """What a Target's "module:name" field names, imported only when a command uses it."""
    module, name = ref.split(":")
    return getattr(importlib.import_module(module), name)

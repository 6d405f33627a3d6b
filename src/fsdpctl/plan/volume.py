"""The shared volume as the job uses it (pure): how fast the job can write to it, whether a save
fits the checkpoint interval, and the report `fsdpctl plan` prints. What the job keeps there and the
FSx capacity that holds it are the settings' (`fsdpctl.settings.storage`, which sizes
FSX_STORAGE_GIB where it is unset); their names are re-exported here, where plan, admission and the
job policy read them.

FSx for Lustre: a PERSISTENT_2 SSD file system holds 1200 GiB, 2400 GiB or a multiple of 2400 GiB
(CreateFileSystem, StorageCapacity) and writes at PerUnitStorageThroughput MB/s per TiB of capacity,
for all its clients together (FSx for Lustre User Guide, "Aggregate file system performance"): the
default 1200 GiB at 250 MB/s/TiB is about 293 MB/s for every node of the job at once. That is the
rate where fsdpctl sizes the file system (EKS; the local backend's directory stands in for it). On a
Slurm cluster the shared file system is the cluster's own, which fsdpctl neither made nor read: its
rate is SHARED_VOLUME_WRITE_MBPS, or an assumption that `rate` marks as one and admission names
(`rate_warning`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, NotRequired, TypedDict

from fsdpctl.settings.storage import (
    CHECKPOINT_BYTES_PER_PARAM as CHECKPOINT_BYTES_PER_PARAM,
)
from fsdpctl.settings.storage import (
    EXPORT_BYTES_PER_PARAM as EXPORT_BYTES_PER_PARAM,
)
from fsdpctl.settings.storage import (
    FILL_AT_MOST as FILL_AT_MOST,
)
from fsdpctl.settings.storage import (
    FSX_FIRST_GIB as FSX_FIRST_GIB,
)
from fsdpctl.settings.storage import (
    FSX_STEP_GIB as FSX_STEP_GIB,
)
from fsdpctl.settings.storage import (
    FSX_THROUGHPUTS as FSX_THROUGHPUTS,
)
from fsdpctl.settings.storage import (
    GIB as GIB,
)
from fsdpctl.settings.storage import (
    HUB_BYTES_PER_PARAM as HUB_BYTES_PER_PARAM,
)
from fsdpctl.settings.storage import (
    TIB as TIB,
)
from fsdpctl.settings.storage import (
    Need as Need,
)
from fsdpctl.settings.storage import (
    checkpoint_bytes as checkpoint_bytes,
)
from fsdpctl.settings.storage import (
    checkpoints_at_once as checkpoints_at_once,
)
from fsdpctl.settings.storage import (
    could_resume as could_resume,
)
from fsdpctl.settings.storage import (
    default_fsx_gib as default_fsx_gib,
)
from fsdpctl.settings.storage import (
    fsx_size_gib as fsx_size_gib,
)
from fsdpctl.settings.storage import (
    gib as gib,
)
from fsdpctl.settings.storage import (
    need as need,
)
from fsdpctl.settings.storage import (
    on_volume as on_volume,
)
from fsdpctl.settings.storage import (
    params as params,
)
from fsdptrain.events import MATERIAL_SAVE_S, seconds_text

if TYPE_CHECKING:
    from fsdpctl.settings import Config

# The shared file system's rate where nobody gave it (a Slurm cluster without
# SHARED_VOLUME_WRITE_MBPS): the slowest FSx for Lustre SSD file system a cluster is made with, 1200
# GiB at PERSISTENT_2's lowest 125 MB/s/TiB (CreateFileSystem: StorageCapacity,
# PerUnitStorageThroughput), ~146 MB/s. Low on purpose: a stop grace too long costs only the wait
# for a hung worker, one too short kills the stop checkpoint.
ASSUMED_GIB, ASSUMED_PER_TIB = FSX_FIRST_GIB, FSX_THROUGHPUTS[0]


def throughput(storage_gib: int, per_tib: int) -> float:
    """Bytes per second the whole file system writes, all clients together."""
    return storage_gib / 1024 * per_tib * 1e6


@dataclass(frozen=True)
class Rate:
    """How fast a checkpoint goes to its volume, all nodes together, and where the number comes
    from."""

    bytes_per_s: float
    basis: str  # in the settings' words: "FSX_STORAGE_GIB=1200 x FSX_THROUGHPUT_PER_TIB=250"
    assumed: bool = False  # nobody gave it or anything it follows from: `rate_warning` says so

    @property
    def mb_per_s(self) -> float:
        return self.bytes_per_s / 1e6


def rate(cfg: Config) -> Rate:
    """The rate a save goes at. A CHECKPOINT_PVC, whose size and kind the settings do not give, is
    taken to be a file system of FSx's kind just big enough for the checkpoints it keeps. Else the
    shared volume: SHARED_VOLUME_WRITE_MBPS when set; where fsdpctl sizes an FSx for Lustre file
    system for it (the place's `fsx_volume`), FSX_STORAGE_GIB x FSX_THROUGHPUT_PER_TIB; elsewhere (a
    Slurm cluster's own file system) the assumed ASSUMED_GIB x ASSUMED_PER_TIB, marked as
    assumed."""
    per_tib = cfg.fsx_throughput_per_tib
    if cfg.checkpoint_pvc:
        keeps, _ = checkpoints_at_once(cfg.training.checkpoint_keep, resumes=could_resume(cfg))
        size = fsx_size_gib(keeps * checkpoint_bytes(cfg))
        basis = f"CHECKPOINT_PVC taken as an FSx of {size} GiB x FSX_THROUGHPUT_PER_TIB={per_tib}"
        return Rate(throughput(size, per_tib), basis)
    if cfg.shared_volume_write_mbps:
        mbps = cfg.shared_volume_write_mbps
        return Rate(mbps * 1e6, f"SHARED_VOLUME_WRITE_MBPS={mbps}")
    if cfg.target.fsx_volume:
        size, where = cfg.fsx_storage_gib, cfg.sources.get("FSX_STORAGE_GIB", "")
        sized = f" ({where})" if where == "derived" else ""
        basis = f"FSX_STORAGE_GIB={size}{sized} x FSX_THROUGHPUT_PER_TIB={per_tib}"
        return Rate(throughput(size, per_tib), basis)
    basis = (
        f"assumed: SHARED_VOLUME_WRITE_MBPS is unset, and the file system at SHARED_VOLUME_PATH="
        f"{cfg.shared_volume_path} is taken as the slowest FSx for Lustre SSD one, {ASSUMED_GIB} GiB x "
        f"{ASSUMED_PER_TIB} MB/s/TiB"
    )
    return Rate(throughput(ASSUMED_GIB, ASSUMED_PER_TIB), basis, assumed=True)


def write_rate(cfg: Config) -> float:
    """Bytes per second a checkpoint goes to its volume (`rate`)."""
    return rate(cfg).bytes_per_s


def save_seconds(cfg: Config) -> float:
    """How long one save takes: the whole checkpoint over the volume's aggregate throughput,
    whatever the node count (every node writes its part at once, through the same servers)."""
    return checkpoint_bytes(cfg) / write_rate(cfg)


def rate_warning(cfg: Config) -> str | None:
    """One line when the stop grace rests on an assumed rate that matters: STOP_GRACE_SECONDS unset
    and a save at that rate at least MATERIAL_SAVE_S long (the tiny model's saves are not)."""
    r = rate(cfg)
    if not r.assumed or cfg.stop_grace_seconds:
        return None
    save_s = checkpoint_bytes(cfg) / r.bytes_per_s
    if save_s < MATERIAL_SAVE_S:
        return None
    return (
        f"SHARED_VOLUME_WRITE_MBPS is unset: the stop grace counts {seconds_text(save_s)} for a save of "
        f"{gib(checkpoint_bytes(cfg))} at {r.mb_per_s:.0f} MB/s, the slowest FSx for Lustre SSD file "
        f"system ({ASSUMED_GIB} GiB x {ASSUMED_PER_TIB} MB/s/TiB), not the one at SHARED_VOLUME_PATH="
        f"{cfg.shared_volume_path}, which fsdpctl has not read: set SHARED_VOLUME_WRITE_MBPS to its "
        "aggregate write rate (FSx for Lustre: TiB x PerUnitStorageThroughput), or STOP_GRACE_SECONDS"
    )


def capacity_problem(
    cfg: Config, capacity_bytes: int, where: str, fix: str = "", kept: Need | None = None
) -> str | None:
    """One line when the volume (`where`: what gave its capacity) cannot hold what the job keeps
    there (`kept`: by default what the settings alone say, `need(cfg)`), with the size that fits
    and `fix` (default: a file system of that size)."""
    n = kept or need(cfg)
    if not n.total or n.total <= capacity_bytes * FILL_AT_MOST:
        return None
    more = f"; plus {', '.join(n.unknown)}, not counted" if n.unknown else ""
    size = fsx_size_gib(n.total)
    fix = fix or f"set FSX_STORAGE_GIB={size} (a new file system, or grow this one to {size} GiB)"
    return (
        f"{where} holds {gib(capacity_bytes)}, and MODEL={cfg.training.model} keeps {gib(n.total)} on it "
        f"({n.parts()}{more}), over {FILL_AT_MOST:.0%} of it: {fix}, lower CHECKPOINT_KEEP, or put "
        "checkpoints on CHECKPOINT_PVC"
    )


def fsx_problem(cfg: Config) -> str | None:
    """The FSX_STORAGE_GIB file system against the job, on the cluster (locally the volume is a
    directory: its disk's free space is checked where it is read; on the cluster `job run` also
    reads the claim's)."""
    if cfg.target.on_this_machine:
        return None
    return capacity_problem(
        cfg, cfg.fsx_storage_gib * GIB, f"FSX_STORAGE_GIB={cfg.fsx_storage_gib}"
    )


_SUFFIX = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_SUFFIX.update({"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18})


def quantity_bytes(text: str) -> int | None:
    """A resource.Quantity (apimachinery pkg/api/resource/quantity.go: binary Ki..Ei, decimal k..E,
    plain or exponent numbers) in bytes; None when it is not one."""
    text = text.strip()
    for suffix in sorted(_SUFFIX, key=len, reverse=True):
        if text.endswith(suffix):
            number, scale = text[: -len(suffix)], _SUFFIX[suffix]
            break
    else:
        number, scale = text, 1
    try:
        value = float(number)
    except ValueError:
        return None
    return int(value * scale) if math.isfinite(value) and value >= 0 else None


def interval_warning(cfg: Config, step_s: float) -> str | None:
    """When saving takes longer than the training between two saves: the job would spend more time
    saving than training (the trainer saves synchronously). Only for a save of at least
    MATERIAL_SAVE_S: below that the estimates' left-out latencies decide, not the numbers shown."""
    interval = cfg.training.checkpoint_interval
    if not interval or step_s <= 0:
        return None
    save_s, train_s = save_seconds(cfg), interval * step_s
    if save_s <= train_s or save_s < MATERIAL_SAVE_S:
        return None
    r = rate(cfg)
    return (
        f"CHECKPOINT_INTERVAL={interval}: each save of {gib(checkpoint_bytes(cfg))} takes about "
        f"{seconds_text(save_s)} at {r.mb_per_s:.0f} MB/s ({r.basis}), longer than the "
        f"{seconds_text(train_s)} of training it protects ({interval} steps of "
        f"{seconds_text(step_s)}): {_interval_fix(cfg, save_s, step_s)}"
    )


def steps_covering(save_s: float, step_s: float) -> int:
    """The fewest steps whose training lasts at least `save_s`."""
    steps = max(1, math.ceil(save_s / step_s))
    while steps * step_s < save_s:  # the quotient rounded down past an exact multiple
        steps += 1
    return steps


def _interval_fix(cfg: Config, save_s: float, step_s: float) -> str:
    steps = steps_covering(save_s, step_s)
    if steps >= cfg.training.max_steps:  # no interval within the run protects more than it costs
        return (
            f"set CHECKPOINT_INTERVAL=0 (a save only at MAX_STEPS={cfg.training.max_steps} and on "
            "a stop), or a faster file system"
        )
    return f"set CHECKPOINT_INTERVAL={steps} or more, or a faster file system"


class VolumeReport(TypedDict):
    """`plan`'s `volume` (-o json|yaml): what the job keeps on the shared volume against
    FSX_STORAGE_GIB, the write rate and one save; `plan` adds the stop grace it leads to."""

    need_gib: float
    holds: str  # what is counted, in words (storage.Need.parts)
    not_counted: list[str]
    fsx_storage_gib: int
    fits: bool
    size_that_fits_gib: int
    write_mb_per_s: float
    write_rate_basis: str
    write_rate_assumed: bool
    save_s: float
    warning: str | None
    stop_grace_s: NotRequired[int]  # job.policy.stop_timing's shutdown_s
    stop_grace_basis: NotRequired[str]


def report(cfg: Config, step_s: float) -> VolumeReport:
    """What `plan` says about the shared volume: the need against FSX_STORAGE_GIB, the rate, one
    save."""
    n = need(cfg)
    problem = fsx_problem(cfg)
    return {
        "need_gib": n.total / GIB,
        "holds": n.parts(),
        "not_counted": list(n.unknown),
        "fsx_storage_gib": cfg.fsx_storage_gib,
        "fits": problem is None,
        "size_that_fits_gib": fsx_size_gib(n.total),
        "write_mb_per_s": write_rate(cfg) / 1e6,
        "write_rate_basis": rate(cfg).basis,
        "write_rate_assumed": rate(cfg).assumed,
        "save_s": save_seconds(cfg),
        "warning": interval_warning(cfg, step_s),
    }

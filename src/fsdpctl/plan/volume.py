"""The shared volume as the job uses it (pure): what the job writes there, how big the FSx for
Lustre file system must be to hold it, and how fast the job can write to it.

What one job keeps on its shared volume (SHARED_VOLUME, at SHARED_VOLUME_PATH):
- checkpoints, unless CHECKPOINT_PVC holds them: 12 bytes per parameter each (fp32 weights and AdamW's two
  fp32 moments; DCP writes each replicated shard once, torch/distributed/checkpoint/_dedup_save_plans.py).
  The trainer prunes to CHECKPOINT_KEEP only after the next one is published (fsdptrain.checkpoint.prune), so
  CHECKPOINT_KEEP + 1 exist at once during every save; and `prune` never removes the checkpoint a run
  resumed from (its `spare`), so a resumed run has one more once CHECKPOINT_KEEP newer ones exist:
  CHECKPOINT_KEEP + 2 during its later saves (`checkpoints_at_once`);
- the Hugging Face cache when PRETRAINED is a hub repo: the pre-step downloads its safetensors, 2 bytes per
  parameter (Llama 2's hub checkpoints are fp16);
- EXPORT_DIR when it is on the volume: the full fp32 state dict as safetensors, 4 bytes per parameter, and
  a second copy while a new export is written beside the old one before the rename
  (fsdptrain.checkpoint.export_hf);
- the data set, whose size fsdpctl does not know (a hub data set is streamed, a local one you copied there).

FSx for Lustre: a PERSISTENT_2 SSD file system holds 1200 GiB, 2400 GiB or a multiple of 2400 GiB
(CreateFileSystem, StorageCapacity) and writes at PerUnitStorageThroughput MB/s per TiB of capacity,
for all its clients together (FSx for Lustre User Guide, "Aggregate file system performance"): the
default 1200 GiB at 250 MB/s/TiB is about 293 MB/s for every node of the job at once. That is the rate
where fsdpctl sizes the file system (EKS; the local backend's directory stands in for it). On a Slurm
cluster the shared file system is the cluster's own, which fsdpctl neither made nor read: its rate is
SHARED_VOLUME_WRITE_MBPS, or an assumption that `rate` marks as one and admission names (`rate_warning`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fsdptrain.events import MATERIAL_SAVE_S, seconds_text
from fsdptrain.fetch import is_hub_id
from fsdptrain.shapes import MODEL_CONFIGS

if TYPE_CHECKING:
    from fsdpctl.settings import Config

GIB = 1024**3
TIB = 1024 * GIB
CHECKPOINT_BYTES_PER_PARAM = 12  # fp32 parameters (4) and AdamW's two fp32 moments (8)
HUB_BYTES_PER_PARAM = 2  # the hub's Llama 2 safetensors are fp16
EXPORT_BYTES_PER_PARAM = 4  # export_hf writes the fp32 full state dict
# Lustre stripes files over its OSTs and a write fails with ENOSPC once the OST it lands on is full,
# before the file system as a whole is: the need is sized to fill at most this much of the capacity.
FILL_AT_MOST = 0.9
FSX_FIRST_GIB, FSX_STEP_GIB = 1200, 2400  # PERSISTENT_2 SSD: 1200, 2400, then multiples of 2400
FSX_THROUGHPUTS = (125, 250, 500, 1000)  # PERSISTENT_2 PerUnitStorageThroughput, MB/s per TiB
# The shared file system's rate where nobody gave it (a Slurm cluster without SHARED_VOLUME_WRITE_MBPS): the
# slowest FSx for Lustre SSD file system a cluster is made with, 1200 GiB at PERSISTENT_2's lowest 125
# MB/s/TiB (CreateFileSystem: StorageCapacity, PerUnitStorageThroughput), ~146 MB/s. Low on purpose: a stop
# grace too long costs only the wait for a hung worker, one too short kills the stop checkpoint.
ASSUMED_GIB, ASSUMED_PER_TIB = FSX_FIRST_GIB, FSX_THROUGHPUTS[0]


@dataclass(frozen=True)
class Need:
    """Bytes the job keeps on its shared volume at the worst moment (during a save), by part."""

    checkpoint: int  # one checkpoint
    checkpoints: int  # how many exist at once on the volume (0: they are elsewhere)
    cache: int  # the hub weights the pre-step downloads
    export: int  # EXPORT_DIR, both copies while one replaces the other
    unknown: tuple[str, ...] = ()  # what the volume also holds that fsdpctl cannot size
    counted: str = ""  # why `checkpoints` is that many, in the settings' words

    @property
    def total(self) -> int:
        return self.checkpoint * self.checkpoints + self.cache + self.export

    def parts(self) -> str:
        """'4 checkpoints of 770.9 GiB (CHECKPOINT_KEEP=2 + the one being saved + the one a resumed
        run started from, RESUME=auto), 128.5 GiB of hub weights'"""
        found = []
        if self.checkpoints:
            found.append(
                f"{self.checkpoints} checkpoints of {gib(self.checkpoint)} ({self.counted})"
            )
        if self.cache:
            found.append(f"{gib(self.cache)} of hub weights (PRETRAINED)")
        if self.export:
            found.append(f"{gib(self.export)} for EXPORT_DIR (the new export beside the old)")
        return ", ".join(found) or "nothing fsdpctl can size"


def gib(n: float) -> str:
    """Bytes as GiB, or MiB below one GiB (a tiny model's checkpoint is a few MB)."""
    return f"{n / GIB:.1f} GiB" if n >= GIB or n == 0 else f"{n / 2**20:.1f} MiB"


def params(cfg: Config) -> int:
    return MODEL_CONFIGS[cfg.training.model].num_params()


def checkpoint_bytes(cfg: Config) -> int:
    """One checkpoint of the whole job (every node's part together)."""
    return CHECKPOINT_BYTES_PER_PARAM * params(cfg)


def on_volume(cfg: Config, path: str) -> bool:
    root = cfg.shared_volume_path.rstrip("/")
    return bool(cfg.shared_volume) and (path == root or path.startswith(root + "/"))


def could_resume(cfg: Config) -> bool:
    """Whether the run may start from a checkpoint on the volume that holds its checkpoints, judged
    from the settings alone (where nothing here can look, e.g. a cluster's claim): RESUME=never never
    does; RESUME=auto does whenever the job ran before (`job resume`, a second `job run`); a RESUME
    path does when it is on that volume (with CHECKPOINT_PVC any path off the shared one is taken
    to be on the claim)."""
    resume = cfg.training.resume
    if resume in ("auto", "never"):
        return resume == "auto"
    return bool(cfg.checkpoint_pvc) or on_volume(cfg, resume)


def checkpoints_at_once(keep: int, *, resumes: bool, present: int = 0) -> tuple[int, str]:
    """(how many checkpoints exist at once at the worst moment, why). That moment is a save:
    fsdptrain.checkpoint `stage` writes the new one beside those kept, and `prune` cuts back to the
    newest `keep` only after `publish`. `prune` never removes the checkpoint the run resumed from
    (its `spare`), which stays beside the newest `keep` once that many newer ones exist. `present`:
    complete checkpoints in the directory already (a lowered CHECKPOINT_KEEP leaves more than it
    keeps until the first prune): the first save adds one to those."""
    count = keep + 1 + int(resumes)
    why = f"CHECKPOINT_KEEP={keep} + the one being saved"
    if resumes:
        why += " + the one a resumed run started from"
    if present + 1 > count:
        return present + 1, f"the {present} already there + the one being saved"
    return count, why


def need(cfg: Config, *, resumes: bool | None = None, present: int = 0) -> Need:
    """What the job keeps on SHARED_VOLUME (nothing without one). `resumes`: whether the run starts
    from a checkpoint on the volume (None: `could_resume`, the settings alone); `present`: the
    complete checkpoints already in its directory, where that can be seen."""
    if not cfg.shared_volume:
        return Need(0, 0, 0, 0)
    t = cfg.training
    keeps, counted = 0, ""
    if not cfg.checkpoint_pvc:
        resumed = could_resume(cfg) if resumes is None else resumes
        keeps, counted = checkpoints_at_once(t.checkpoint_keep, resumes=resumed, present=present)
        if resumed and resumes is None:
            counted += f", RESUME={t.resume}"
    cache = HUB_BYTES_PER_PARAM * params(cfg) if is_hub_id(t.pretrained) else 0
    export = (
        2 * EXPORT_BYTES_PER_PARAM * params(cfg)
        if t.export_dir and on_volume(cfg, t.export_dir)
        else 0
    )
    unknown = [f"DATASET={t.dataset}"] if is_hub_id(t.dataset) or on_volume(cfg, t.dataset) else []
    return Need(checkpoint_bytes(cfg), keeps, cache, export, tuple(unknown), counted)


def fsx_size_gib(need_bytes: int) -> int:
    """The smallest PERSISTENT_2 capacity that holds `need_bytes` filled to FILL_AT_MOST at most."""
    want = need_bytes / FILL_AT_MOST / GIB
    if want <= FSX_FIRST_GIB:
        return FSX_FIRST_GIB
    return FSX_STEP_GIB * math.ceil(want / FSX_STEP_GIB)


def default_fsx_gib(cfg: Config) -> int:
    """FSX_STORAGE_GIB when unset: sized for what this job keeps there (`need`)."""
    return fsx_size_gib(need(cfg).total)


def throughput(storage_gib: int, per_tib: int) -> float:
    """Bytes per second the whole file system writes, all clients together."""
    return storage_gib / 1024 * per_tib * 1e6


@dataclass(frozen=True)
class Rate:
    """How fast a checkpoint goes to its volume, all nodes together, and where the number comes from."""

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
    Slurm cluster's own file system) the assumed ASSUMED_GIB x ASSUMED_PER_TIB, marked as assumed."""
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


def report(cfg: Config, step_s: float) -> dict[str, object]:
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

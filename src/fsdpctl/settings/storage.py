"""What one job keeps on its shared volume and the FSx for Lustre capacity that holds it (pure): the
settings' own derivation of FSX_STORAGE_GIB where it is unset (`default_fsx_gib`, which `load`
calls), so it lives with the settings; `fsdpctl.plan.volume` adds the write rate and the warnings on
top.

What one job keeps on its shared volume (SHARED_VOLUME, at SHARED_VOLUME_PATH):
- checkpoints, unless CHECKPOINT_PVC holds them: 12 bytes per parameter each (fp32 weights and
  AdamW's two fp32 moments; DCP writes each replicated shard once,
  torch/distributed/checkpoint/_dedup_save_plans.py). The trainer prunes to CHECKPOINT_KEEP only
  after the next one is published (fsdptrain.checkpoint.prune), so CHECKPOINT_KEEP + 1 exist at once
  during every save; and `prune` never removes the checkpoint a run resumed from (its `spare`), so a
  resumed run has one more once CHECKPOINT_KEEP newer ones exist: CHECKPOINT_KEEP + 2 during its
  later saves (`checkpoints_at_once`);
- the Hugging Face cache when PRETRAINED is a hub repo: the pre-step downloads its safetensors, 2
  bytes per parameter (Llama 2's hub checkpoints are fp16);
- EXPORT_DIR when it is on the volume: the full fp32 state dict as safetensors, 4 bytes per
  parameter, and a second copy while a new export is written beside the old one before the rename
  (fsdptrain.hf_io.export_hf);
- the data set, whose size fsdpctl does not know (a hub data set is streamed, a local one you copied
  there).

FSx for Lustre: a PERSISTENT_2 SSD file system holds 1200 GiB, 2400 GiB or a multiple of 2400 GiB
(CreateFileSystem, StorageCapacity), filled to FILL_AT_MOST at most (`fsx_size_gib`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fsdpctl.settings.config import Config

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
    from fsdptrain.shapes import MODEL_CONFIGS  # the trainer's, only when sizing (not for FSX_*)

    return MODEL_CONFIGS[cfg.training.model].num_params()


def checkpoint_bytes(cfg: Config) -> int:
    """One checkpoint of the whole job (every node's part together)."""
    return CHECKPOINT_BYTES_PER_PARAM * params(cfg)


def on_volume(cfg: Config, path: str) -> bool:
    root = cfg.shared_volume_path.rstrip("/")
    return bool(cfg.shared_volume) and (path == root or path.startswith(root + "/"))


def could_resume(cfg: Config) -> bool:
    """Whether the run may start from a checkpoint on the volume that holds its checkpoints, judged
    from the settings alone (where nothing here can look, e.g. a cluster's claim): RESUME=never
    never does; RESUME=auto does whenever the job ran before (`job resume`, a second `job run`); a
    RESUME path does when it is on that volume (with CHECKPOINT_PVC any path off the shared one is
    taken to be on the claim)."""
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
    from fsdptrain.hub import is_hub_id  # the trainer's, only when sizing (not for FSX_*)

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

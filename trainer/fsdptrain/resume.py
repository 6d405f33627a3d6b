"""Which checkpoint a run resumes, and whether resuming it continues the run that saved it. Pure: no
torch, so the pre-launch check (fsdptrain.launch) and fsdpctl judge a checkpoint exactly as the
trainer does.

A checkpoint's meta.json keeps the settings that decide what a step computes (`math_settings`). A
run resumes a checkpoint only when its own are the same: with another precision, model, sharding,
learning-rate schedule, sequence length or batch it would not continue that run but train something
else from its weights, and with MAX_STEPS at or below the checkpoint's step it would train nothing.
Both are refused with one line naming each difference (exit 2, before torchrun in a pod: not
retried); ALLOW_SETTING_CHANGES=true resumes anyway.

The world size is kept too (WORLD_SIZE: the world the checkpoint was saved on) but never refused: a
run resumes on any world, the global batch following one rule (fsdptrain.elastic).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fsdptrain.config import TrainConfig

META = "meta.json"
LATEST = "latest"
# what a step computes: the model and its start, the numerics and sharding (reduction order), the
# data each step sees (sequence length, batch, seed: the order), and the optimizer with its schedule
# (LR, warmup, the cosine that ends at MAX_STEPS); the world size joins them under WORLD_SIZE, for
# the reader: a resume on another world is not refused (fsdptrain.elastic's rule keeps the batch)
MATH_KEYS = (
    "model",
    "pretrained",
    "precision",
    "sharding_strategy",
    "hsdp_shard_size",
    "seq_len",
    "micro_batch_size",
    "grad_accum_steps",
    "seed",
    "lr",
    "min_lr_ratio",
    "warmup_steps",
    "max_steps",
    "weight_decay",
    "grad_clip",
)
WORLD = "WORLD_SIZE"


def step_name(step: int) -> str:
    """A checkpoint's directory name: its step, zero-padded so that names sort as steps do."""
    return f"step-{step:08d}"


def math_settings(cfg: TrainConfig, world: int) -> dict[str, Any]:
    """ENV_KEY -> value of every setting in MATH_KEYS, and the world size: what meta.json keeps."""
    found = {
        f.metadata["env"]: getattr(cfg, f.name)
        for f in dataclasses.fields(cfg)
        if f.name in MATH_KEYS
    }
    return {**found, WORLD: world}


def complete_checkpoints(root: Path) -> list[Path]:
    """Finished checkpoints, oldest first (a dir without meta.json is an interrupted save)."""
    if not root.is_dir():
        return []
    return sorted(p for p in root.glob("step-*") if (p / META).is_file())


def latest_checkpoint(root: Path) -> Path | None:
    """The one `latest` names when it is complete, else the newest complete one."""
    pointer = root / LATEST
    if pointer.is_file():
        candidate = root / pointer.read_text().strip()
        if candidate.parent == root and (candidate / META).is_file():
            return candidate
    done = complete_checkpoints(root)
    return done[-1] if done else None


def candidates(root: Path | None, resume: str) -> list[Path]:
    """What RESUME asks for, most wanted first: auto is `latest`, then every older complete
    checkpoint (a damaged newest one falls back to the next); a path is that one alone; never is
    none."""
    if resume == "never":
        return []
    if resume != "auto":
        return [Path(resume)]
    if root is None:
        return []
    first = latest_checkpoint(root)
    older = [p for p in reversed(complete_checkpoints(root)) if p != first]
    return [first, *older] if first else older


def read_meta(path: Path) -> dict[str, Any] | None:
    """A checkpoint's meta.json, or None when it has none that reads as an object."""
    try:
        meta = json.loads((path / META).read_text())
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) else None


def differences(saved: Mapping[str, Any], now: Mapping[str, Any]) -> list[str]:
    """`KEY was -> now` for each setting both know that differs (a checkpoint of an older trainer
    keeps none, and a key it does not keep is not compared)."""
    return [f"{k} {saved[k]} -> {v}" for k, v in now.items() if k in saved and saved[k] != v]


def problem(meta: Mapping[str, Any], cfg: TrainConfig, world: int, *, where: str) -> str | None:
    """Why this run must not resume the checkpoint `where` (whose meta.json is `meta`), or None: its
    step at or past MAX_STEPS (always), the settings it was saved with that differ (unless
    ALLOW_SETTING_CHANGES). Another `world` is not one of them (fsdptrain.elastic)."""
    step = meta.get("step")
    done = isinstance(step, int) and step >= cfg.max_steps
    saved = meta.get("settings")
    now = {k: v for k, v in math_settings(cfg, world).items() if k != WORLD}
    changed = (
        [] if cfg.allow_setting_changes or not isinstance(saved, dict) else differences(saved, now)
    )
    if not (done or changed):
        return None
    why = [f"it is at or past MAX_STEPS={cfg.max_steps} (nothing is left to train)"] if done else []
    if changed:
        why.append(f"it was saved by a run with other settings ({', '.join(changed)})")
    return (
        f"checkpoint {where} (step {step}) is not resumed: {' and '.join(why)}: {_ways_out(done)}"
    )


def _ways_out(done: bool) -> str:
    """What to do instead, the way out first. A finished job's checkpoint is refused by `job
    resume` too (it resumes the same checkpoint), so that one is not offered there."""
    if done:
        return (
            "to start again, use a new JOB_NAME or RESUME=never (`fsdpctl job rerun` repeats the run "
            "in a directory of its own); to train further, a larger MAX_STEPS with "
            "ALLOW_SETTING_CHANGES=true (another LR schedule)"
        )
    return (
        "`fsdpctl job resume` continues a stopped job with its own settings; "
        "ALLOW_SETTING_CHANGES=true resumes it anyway; `fsdpctl job rerun` repeats a run in a "
        "directory of its own; RESUME=never starts afresh"
    )


def first_problem(root: Path | None, cfg: TrainConfig, world: int) -> str | None:
    """The refusal of the checkpoint this run would resume first (its RESUME and CHECKPOINT_DIR as
    this machine sees them), or None. A missing or unreadable checkpoint is the loader's business,
    not this."""
    wanted = candidates(root, cfg.resume)
    meta = read_meta(wanted[0]) if wanted else None
    return problem(meta, cfg, world, where=str(wanted[0])) if meta is not None else None

"""Rank 0's experiment trackers: TensorBoard event files (TENSORBOARD_DIR) and a Weights & Biases
run (WANDB_PROJECT), the pictures ML engineers already read. Both are optional (`pip install
'fsdpctl[trackers]'`): a key set without its package is refused before training
(config.missing_packages); a tracker that fails mid-run costs its pictures, with one warning, never
the run.

Each logged step (LOG_INTERVAL) goes to every tracker under the same tags, with the optimizer step
as the x axis; a resumed run continues that axis (TensorBoard purges what a crashed attempt wrote
after the checkpoint it resumes from)."""

from __future__ import annotations

import dataclasses
import os
import re
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

from fsdptrain import events
from fsdptrain.config import TrainConfig

# step record field -> tag; the same names in TensorBoard and W&B (the part before "/" is the
# section)
SCALARS = {
    "loss": "train/loss",
    "lr": "train/lr",
    "grad_norm": "train/grad_norm",
    "tokens_per_s": "perf/tokens_per_s",
    "tokens_per_s_per_device": "perf/tokens_per_s_per_device",
    "tflops_per_device": "perf/tflops_per_device",
    "mfu": "perf/mfu",
    "step_time_s": "perf/step_time_s",
    "data_wait_frac": "perf/data_wait_frac",
    "mem_allocated_gib": "memory/allocated_gib",
    "mem_reserved_gib": "memory/reserved_gib",
    "mem_peak_rss_gib": "memory/peak_rss_gib",
    "gpu_util_pct": "gpu/util_pct",
    "gpu_temp_c": "gpu/temp_c",
    "gpu_power_w": "gpu/power_w",
}
# a value shaped like a Hugging Face token never reaches a tracker's config, whatever key it was
# pasted into
_TOKEN = re.compile(r"hf_[A-Za-z0-9]{20,}")


def scalars(step: events.Step) -> dict[str, float]:
    """The step's measured numbers by tag; what this device could not measure (None) is left out."""
    record = events.as_record(step)
    return {
        tag: float(record[key])
        for key, tag in SCALARS.items()
        if isinstance(record.get(key), (int, float)) and not isinstance(record.get(key), bool)
    }


def run_id() -> str:
    """torchrun's rendezvous id (TORCHELASTIC_RUN_ID: fsdpctl's run id), the same on every attempt
    of a run; a plain `python -m fsdptrain` gets one from the clock."""
    found = os.environ.get("TORCHELASTIC_RUN_ID", "")
    return found if found and found != "none" else time.strftime("run-%Y%m%d-%H%M%S")


def tracker_config(cfg: TrainConfig, **extra: Any) -> dict[str, Any]:
    """The resolved training config by its keys (MODEL, LR, ...) for W&B's run config: settings
    only, never the environment, and no token-shaped value."""
    values = {f.metadata["env"]: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}
    values.update(extra)
    return {k: _TOKEN.sub("***", v) if isinstance(v, str) else v for k, v in values.items()}


class Tracker(Protocol):
    name: str

    def log(self, step: int, values: Mapping[str, float]) -> None: ...

    def flush(self) -> None: ...

    def close(self) -> None: ...


class TensorBoard:
    """`torch.utils.tensorboard.SummaryWriter` into TENSORBOARD_DIR/<run id>. `purge_step`: on a
    resumed attempt, the first step it will redo; events at or after it from an earlier attempt are
    dropped."""

    name = "tensorboard"

    def __init__(self, logdir: Path, purge_step: int | None):
        from torch.utils.tensorboard import SummaryWriter

        self.logdir = logdir
        self.writer = SummaryWriter(log_dir=str(logdir), purge_step=purge_step, flush_secs=30)

    def log(self, step: int, values: Mapping[str, float]) -> None:
        for tag, value in values.items():
            self.writer.add_scalar(tag, value, global_step=step)

    def flush(self) -> None:
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandB:
    """One W&B run per fsdpctl run (id and name: the run id); an attempt torchrun restarts resumes
    it."""

    name = "wandb"

    def __init__(self, cfg: TrainConfig, rid: str, config: Mapping[str, Any]):
        import wandb

        self.run = wandb.init(
            project=cfg.wandb_project,
            id=rid,
            name=rid,
            config=dict(config),
            mode=cfg.wandb_mode,  # type: ignore[arg-type]
            resume="allow",
            # the trainer's stdout carries the event lines fsdpctl reads: W&B leaves the console
            # alone
            settings=wandb.Settings(console="off", save_code=False, disable_git=True),
        )

    def log(self, step: int, values: Mapping[str, float]) -> None:
        self.run.log(dict(values), step=step)

    def flush(self) -> None:
        pass  # W&B's service writes as it goes

    def close(self) -> None:
        self.run.finish()


class Trackers:
    """The trackers rank 0 opened; each failure is reported once through `warn` and ends that
    tracker."""

    def __init__(self, trackers: list[Tracker], warn: Callable[[str], None]):
        self.trackers = trackers
        self.warn = warn

    def _each(self, what: Callable[[Tracker], None]) -> None:
        for t in list(self.trackers):
            try:
                what(t)
            except (
                Exception
            ) as e:  # a full disk or a lost W&B service costs the pictures, not the run
                self.trackers.remove(t)
                self.warn(f"{t.name}: {type(e).__name__}: {e}; training goes on without it")

    def step(self, step: events.Step) -> None:
        values = scalars(step)
        self._each(lambda t: t.log(step.step, values))

    def flush(self) -> None:
        self._each(lambda t: t.flush())

    def close(self) -> None:
        self._each(lambda t: t.close())
        self.trackers = []


def open_trackers(
    cfg: TrainConfig,
    *,
    start_step: int,
    world: int,
    warn: Callable[[str], None],
    rid: str | None = None,
) -> Trackers:
    """The trackers the config asks for (rank 0 only), under the tracker run `rid` (default: this
    run's id; a run that continues a job's checkpoint continues the run that saved it: one curve
    across resumes). One that cannot start (W&B online without a login) is a warning; the run goes
    on."""
    rid = rid or run_id()
    found = Trackers([], warn)
    opened: list[Tracker] = []
    if cfg.tensorboard_dir:

        def tb() -> None:
            purge = start_step + 1 if start_step else None
            opened.append(TensorBoard(Path(cfg.tensorboard_dir) / rid, purge))

        _try(tb, "tensorboard", warn)
    if cfg.wandb_project and cfg.wandb_mode != "disabled":
        config = tracker_config(cfg, WORLD_SIZE=world, RUN_ID=rid)
        _try(lambda: opened.append(WandB(cfg, rid, config)), "wandb", warn)
    found.trackers = opened
    return found


def _try(start: Callable[[], None], name: str, warn: Callable[[str], None]) -> None:
    try:
        start()
    except Exception as e:  # e.g. wandb.errors.UsageError: no API key in a non-interactive pod
        warn(f"{name}: cannot start ({type(e).__name__}: {e}); training goes on without it")

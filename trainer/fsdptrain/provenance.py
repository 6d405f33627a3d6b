"""The trainer's `start` event: the library versions it runs with and the fingerprints of the data
and the tokenizer it reads, for the run record fsdpctl keeps (fsdpctl.job.record). Rank 0 only; read
once per run."""

from __future__ import annotations

import os
import platform
import time
from pathlib import Path

import torch

from fsdptrain import events
from fsdptrain.config import TrainConfig
from fsdptrain.fingerprint import fingerprint


def record_id() -> str:
    """The run record's id fsdpctl put in the environment ('' when the trainer was started by
    hand)."""
    return os.environ.get(events.RECORD_ENV, "")


def _nccl() -> str | None:
    """NCCL's version as torch reports it (a tuple since torch 2.x; an int before); None without
    CUDA."""
    if not torch.cuda.is_available():
        return None
    try:
        version = torch.cuda.nccl.version()
    except (AttributeError, RuntimeError):  # a build without NCCL
        return None
    return ".".join(map(str, version)) if isinstance(version, tuple) else str(version)


def _files_of(value: str, kind: str) -> str | None:
    """Where the files of a setting's value are: a path as given; a hub id's cached snapshot when
    the job reads offline (the pre-step fetched it); None for a hub id read online (nothing here to
    fingerprint)."""
    if Path(value).expanduser().exists():
        return value
    from fsdptrain.fetch import local_snapshot

    try:
        return local_snapshot(value, kind)
    # not cached: the record says "not local" rather than fail the run
    except Exception:  # noqa: BLE001
        return None


def start_event(
    cfg: TrainConfig,
    device: torch.device,
    start_step: int,
    levers: dict[str, str] | None = None,
    resumed_from: Path | None = None,
) -> events.Start:
    """`cfg` with DATASET/TOKENIZER already resolved (builtin -> the asset files); `levers`: how the
    speed settings resolved (fsdptrain.levers); `resumed_from`: the checkpoint the run started from
    (a rerun starts there again), None for a fresh start."""
    import transformers

    return events.Start(
        record_id=record_id(),
        python=platform.python_version(),
        torch=torch.__version__,
        transformers=transformers.__version__,
        cuda=torch.version.cuda,
        nccl=_nccl(),
        device=device.type,
        start_step=start_step,
        resumed_from=str(resumed_from) if resumed_from is not None else None,
        dataset=fingerprint(cfg.dataset, _files_of(cfg.dataset, "dataset")),
        tokenizer=fingerprint(cfg.tokenizer_path, _files_of(cfg.tokenizer_path, "model")),
        time=time.time(),
        levers=dict(levers or {}),
    )

"""The optimizer, its learning rate and its step: AdamW over the sharded parameters (with a loss
scaler for fp16), the schedule the loop sets before each step (linear warmup, cosine decay), and the
step itself after gradient clipping."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from fsdptrain.config import TrainConfig
from fsdptrain.levers import resolve_fused_optimizer

if TYPE_CHECKING:
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warmup to LR, then cosine down to LR * MIN_LR_RATIO at MAX_STEPS (step counts from
    1)."""
    if cfg.warmup_steps and step <= cfg.warmup_steps:
        return cfg.lr * step / cfg.warmup_steps
    span = max(1, cfg.max_steps - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / span)
    floor = cfg.lr * cfg.min_lr_ratio
    return floor + 0.5 * (cfg.lr - floor) * (1 + math.cos(math.pi * progress))


def build_optimizer(
    cfg: TrainConfig, model: nn.Module, device: torch.device
) -> tuple[torch.optim.Optimizer, ShardedGradScaler | None]:
    """AdamW over the sharded parameters (fused or foreach: FUSED_OPTIMIZER); a loss scaler for fp16
    (bf16 and fp32 need none)."""
    fused = resolve_fused_optimizer(cfg.fused_optimizer, device.type)
    optimizer = torch.optim.AdamW(
        model.parameters(),
        lr=cfg.lr,
        betas=(0.9, 0.95),
        weight_decay=cfg.weight_decay,
        fused=fused,
        foreach=not fused,  # torch refuses both at once
    )
    if cfg.precision != "fp16":
        return optimizer, None
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

    return optimizer, ShardedGradScaler(device=device.type)


def clip_and_step(
    cfg: TrainConfig,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scaler: ShardedGradScaler | None,
) -> torch.Tensor:
    """Clip to GRAD_CLIP (0: off) and step; returns the gradient norm before clipping."""
    if scaler:
        scaler.unscale_(optimizer)
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip or float("inf"))
    if scaler:
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()
    return norm.full_tensor() if isinstance(norm, DTensor) else norm

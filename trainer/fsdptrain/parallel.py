"""FSDP2 sharding, mixed precision and activation checkpointing, as in torchtitan's `parallelize`.

The four FSDP1 strategies users know map onto FSDP2 like this:
- FULL_SHARD: 1-D mesh over all ranks, parameters resharded after forward.
- SHARD_GRAD_OP: same mesh, parameters kept gathered between forward and backward.
- HYBRID_SHARD: 2-D mesh (replicate, shard): shard inside a group (a node by default), replicate across
  groups.
- NO_SHARD: 2-D mesh (world, 1): every rank holds everything, gradients all-reduced (DDP semantics).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from fsdptrain.models import decoder_layers
from fsdptrain.shapes import job_mesh_shape

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def build_mesh(
    device_type: str, strategy: str, world_size: int, *, hsdp_shard_size: int, procs_per_node: int
) -> DeviceMesh:
    shape = job_mesh_shape(
        strategy, world_size, hsdp_shard_size=hsdp_shard_size, procs_per_node=procs_per_node
    )
    names = ("shard",) if len(shape) == 1 else ("replicate", "shard")
    return init_device_mesh(device_type, shape, mesh_dim_names=names)


def apply_activation_checkpointing(model: nn.Module, *, mode: str, every: int) -> int:
    """Wrap decoder layers in non-reentrant checkpointing; returns how many were wrapped."""
    if mode == "none":
        return 0
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl, checkpoint_wrapper

    layers = decoder_layers(model)
    step = 1 if mode == "full" else every
    wrapped = 0
    for i in range(0, len(layers), step):
        layers[i] = checkpoint_wrapper(layers[i], checkpoint_impl=CheckpointImpl.NO_REENTRANT)
        wrapped += 1
    return wrapped


def apply_fsdp(model: nn.Module, *, mesh: DeviceMesh, strategy: str, precision: str) -> None:
    """fully_shard each decoder layer, then the root (embeddings, final norm, head)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = MixedPrecisionPolicy(param_dtype=DTYPES[precision], reduce_dtype=torch.float32)
    reshard = strategy != "SHARD_GRAD_OP"
    layers = decoder_layers(model)
    for i, layer in enumerate(layers):
        # the last layer's params are needed again right away in backward: no point resharding them
        fully_shard(layer, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard and i < len(layers) - 1)
    fully_shard(model, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard)


def parallelize(
    model: nn.Module, *, mesh: DeviceMesh, strategy: str, precision: str, ac_mode: str, ac_every: int
) -> int:
    """Activation checkpointing, then FSDP2, in place; returns how many layers recompute activations."""
    wrapped = apply_activation_checkpointing(model, mode=ac_mode, every=ac_every)
    apply_fsdp(model, mesh=mesh, strategy=strategy, precision=precision)
    return wrapped

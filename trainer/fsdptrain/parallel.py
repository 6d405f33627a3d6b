"""FSDP2 sharding, mixed precision, activation checkpointing, per-layer compile and float8, as in
torchtitan's `parallelize` (torchtitan/models/llama3/infra/parallelize.py): float8 first, then
activation checkpointing, then compile, then FSDP.

The four FSDP1 strategies users know map onto FSDP2 like this:
- FULL_SHARD: 1-D mesh over all ranks, parameters resharded after forward.
- SHARD_GRAD_OP: same mesh, parameters kept gathered between forward and backward.
- HYBRID_SHARD: 2-D mesh (replicate, shard): shard inside a group (a node by default), replicate
  across groups.
- NO_SHARD: 2-D mesh (world, 1): every rank holds everything, gradients all-reduced (DDP semantics).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, cast

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


# Selective (op-level) activation checkpointing keeps these ops' outputs and recomputes the cheap
# rest (norms, activations, RoPE): torchtitan's `_save_list`
# (torchtitan/distributed/activation_checkpoint.py), less its tensor-parallel and MoE entries, which
# this trainer does not use.
SAC_SAVE_OPS = (
    "aten.mm.default",
    "aten._scaled_dot_product_efficient_attention.default",
    "aten._scaled_dot_product_flash_attention.default",
    "aten._scaled_dot_product_cudnn_attention.default",
    "aten._scaled_dot_product_flash_attention_for_cpu.default",
    # float8's amax: cheap to keep, a reduction over a whole tensor to recompute
    "aten.max.default",
)
# the backend COMPILE uses; the CPU tests set aot_eager (same graphs, no C++ build) to stay within
# seconds
COMPILE_BACKEND_ENV = "FSDPTRAIN_COMPILE_BACKEND"


def _op(name: str) -> Any:
    """torch.ops.aten.<op>.<overload> by name; None where this torch build lacks it."""
    namespace, op, overload = name.split(".")
    return getattr(getattr(getattr(torch.ops, namespace), op, None), overload, None)


def sac_policy() -> Callable[..., Any]:
    """torchtitan's op-level policy: save the outputs of SAC_SAVE_OPS, except every second matmul of
    a layer (recomputing half the matmuls costs little and halves what they hold); recompute
    everything else."""
    from torch.utils.checkpoint import CheckpointPolicy

    save = {op for op in map(_op, SAC_SAVE_OPS) if op is not None}
    mm = torch.ops.aten.mm.default

    def policy(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
        if func == mm:
            # counted separately in forward and in the recompute, so both take the same decisions
            key = "recompute_mm_count" if ctx.is_recompute else "forward_mm_count"
            count = getattr(policy, key, 0) + 1
            setattr(policy, key, count)
            if count % 2 == 0:
                return CheckpointPolicy.PREFER_RECOMPUTE
        return CheckpointPolicy.MUST_SAVE if func in save else CheckpointPolicy.PREFER_RECOMPUTE

    return policy


def _selective_context() -> Any:
    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    return create_selective_checkpoint_contexts(sac_policy())


def apply_activation_checkpointing(model: nn.Module, *, mode: str, every: int) -> int:
    """Wrap decoder layers in non-reentrant checkpointing; returns how many were wrapped.
    `selective` wraps every layer but keeps the matmul outputs (SAC_SAVE_OPS), so backward
    recomputes only cheap ops: op-level, for compiled layers
    (fsdptrain.levers.resolve_activation_checkpointing)."""
    if mode == "none":
        return 0
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        CheckpointImpl,
        checkpoint_wrapper,
    )

    layers = decoder_layers(model)
    step = every if mode == "every-k" else 1
    extra = {"context_fn": _selective_context} if mode == "selective" else {}
    wrapped = 0
    for i in range(0, len(layers), step):
        layers[i] = checkpoint_wrapper(
            layers[i], checkpoint_impl=CheckpointImpl.NO_REENTRANT, **extra
        )
        wrapped += 1
    return wrapped


def apply_compile(model: nn.Module) -> None:
    """torch.compile each decoder layer in place (torchtitan's `apply_compile`): the layers share
    one code object, so they compile once; `Module.compile` keeps the parameter names, hence the
    checkpoints."""
    backend = os.environ.get(COMPILE_BACKEND_ENV, "inductor")
    for layer in decoder_layers(model):
        layer.compile(backend=backend)


def float8_filter(module: nn.Module, fqn: str) -> bool:
    """Which linear layers float8 trains: the decoder's, not the output head (torchtitan keeps
    `output` in high precision), and only shapes float8 matmuls take (both dimensions multiples of
    16)."""
    if not isinstance(module, nn.Linear) or fqn.split(".")[-1] == "lm_head":
        return False
    return module.in_features % 16 == 0 and module.out_features % 16 == 0


def shard_degree(mesh: DeviceMesh) -> int:
    """How many ranks share each parameter's shards: the mesh's last ("shard") dimension (1 under
    NO_SHARD, the group under HYBRID_SHARD)."""
    return mesh.size(mesh.ndim - 1)


def float8_config(recipe: str, shards: int) -> Any:
    """torchao's Float8LinearConfig for FLOAT8_RECIPE, as torchtitan v0.2 builds it
    (torchtitan/components/quantization/float8.py Float8LinearConverter): tensorwise with FSDP's
    all-gather of the weights in float8 when they are sharded over several ranks (`shards` > 1: half
    bf16's bytes; the scales are precomputed after each optimizer step, `float8_after_step`), or
    torchao's rowwise recipe, whose communication stays in high precision."""
    from torchao.float8 import Float8LinearConfig

    if recipe == "rowwise":
        # torchtitan sets this with rowwise (pytorch/pytorch#150859: inductor's casts must round as
        # eager's)
        import torch._inductor.config

        torch._inductor.config.emulate_precision_casts = True
        return Float8LinearConfig.from_recipe_name("rowwise")
    return Float8LinearConfig(enable_fsdp_float8_all_gather=shards > 1)


def apply_float8(model: nn.Module, *, recipe: str = "tensorwise", shards: int = 1) -> int:
    """Swap the decoder's nn.Linear for torchao's Float8Linear (float8_config); returns how many
    were swapped. FLOAT8's GPU and package were checked at start."""
    from torchao.float8 import convert_to_float8_training

    convert_to_float8_training(
        model, config=float8_config(recipe, shards), module_filter_fn=float8_filter
    )
    return sum(type(m).__name__ == "Float8Linear" for m in model.modules())


def float8_after_step(recipe: str, shards: int) -> Callable[[nn.Module], None] | None:
    """What runs after each optimizer step: with float8 all-gather (tensorwise, sharded over several
    ranks), one fused amax over all the sharded weights for the next forward's scales (torchao
    `precompute_float8_dynamic_scale_for_fsdp`, torchtitan's post-optimizer hook); None otherwise.
    """
    if recipe != "tensorwise" or shards <= 1:
        return None
    from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp

    return cast(Callable[[nn.Module], None], precompute_float8_dynamic_scale_for_fsdp)


def apply_fsdp(
    model: nn.Module, *, mesh: DeviceMesh, strategy: str, precision: str, prefetch: int = 1
) -> None:
    """fully_shard each decoder layer, then the root (embeddings, final norm, head); with `prefetch`
    > 0, each layer also names the next `prefetch` layers whose all-gather starts before its own
    compute."""
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

    mp = MixedPrecisionPolicy(param_dtype=DTYPES[precision], reduce_dtype=torch.float32)
    reshard = strategy != "SHARD_GRAD_OP"
    layers = decoder_layers(model)
    for i, layer in enumerate(layers):
        # the last layer's params are needed again right away in backward: no point resharding them
        fully_shard(
            layer, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard and i < len(layers) - 1
        )
    fully_shard(model, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard)
    if prefetch:
        set_prefetch([layer for layer in layers if isinstance(layer, FSDPModule)], prefetch)


def set_prefetch(layers: list[Any], n: int) -> None:
    """Explicit FSDP2 prefetch (torch's FSDPModule.set_modules_to_forward_prefetch /
    _backward_prefetch, as in torch's FSDP2 example): forward runs the layers in order, backward in
    reverse."""
    for i, layer in enumerate(layers):
        ahead = layers[i + 1 : i + 1 + n]
        behind = layers[max(0, i - n) : i][::-1]
        if ahead:
            layer.set_modules_to_forward_prefetch(ahead)
        if behind:
            layer.set_modules_to_backward_prefetch(behind)


def parallelize(
    model: nn.Module,
    *,
    mesh: DeviceMesh,
    strategy: str,
    precision: str,
    ac_mode: str,
    ac_every: int,
    compile: bool = False,
    float8: bool = False,
    float8_recipe: str = "tensorwise",
    prefetch: int = 1,
) -> int:
    """Float8, activation checkpointing, compile, then FSDP2, in place; returns how many layers
    recompute activations. `ac_mode` and `compile` are resolved already (fsdptrain.levers)."""
    if float8:
        apply_float8(model, recipe=float8_recipe, shards=shard_degree(mesh))
    wrapped = apply_activation_checkpointing(model, mode=ac_mode, every=ac_every)
    if compile:
        apply_compile(model)
    apply_fsdp(model, mesh=mesh, strategy=strategy, precision=precision, prefetch=prefetch)
    return wrapped

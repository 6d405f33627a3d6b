"""The model every rank trains: built on the meta device, sharded (FSDP2, with activation
checkpointing, compile and float8 as resolved), materialised shard by shard, then given its weights:
fresh (seeded per shard coordinate) or PRETRAINED's (fsdptrain.hf_io)."""

from __future__ import annotations

from typing import Any, cast

import torch
from torch import nn

from fsdptrain import hf_io
from fsdptrain.config import TrainConfig
from fsdptrain.levers import Checkpointing
from fsdptrain.models import (
    MODEL_CONFIGS,
    build_meta_model,
    init_weights,
    llama_config,
    use_causal_sdpa,
)
from fsdptrain.parallel import build_mesh, parallelize
from fsdptrain.runtime import Runtime


def build_model(
    cfg: TrainConfig, rt: Runtime, tokenizer: Any, compiled: bool, checkpointing: Checkpointing
) -> tuple[nn.Module, Any, Any, int]:
    """Meta-device model -> sharded -> materialised shard by shard -> weights (fresh or pretrained).
    Returns (model, its transformers config, the device mesh, layers with activation checkpointing).
    """
    from transformers import AutoConfig

    if cfg.pretrained:
        path = hf_io.resolve_pretrained(cfg.pretrained, local_rank=rt.local_rank)
        config = AutoConfig.from_pretrained(str(path))
    else:
        config = llama_config(
            cfg.model, vocab_size=max(len(tokenizer), MODEL_CONFIGS[cfg.model].vocab)
        )
    # no KV cache in training: it is never read, and selective checkpointing's recompute would find
    # the keys of the forward already in it (a different op sequence, which torch.utils.checkpoint
    # refuses)
    config.use_cache = False
    # SDPA without transformers' per-forward packed-sequence check (a host sync)
    use_causal_sdpa(config)
    model = build_meta_model(config)
    mesh = build_mesh(
        rt.device.type,
        cfg.sharding_strategy,
        rt.world,
        hsdp_shard_size=cfg.hsdp_shard_size,
        procs_per_node=rt.local_world,
    )
    ac_layers = parallelize(
        model,
        mesh=mesh,
        strategy=cfg.sharding_strategy,
        precision=cfg.precision,
        ac_mode=checkpointing.mode,
        ac_every=checkpointing.every,
        compile=compiled,
        float8=cfg.float8,
        float8_recipe=cfg.float8_recipe,
        prefetch=cfg.fsdp_prefetch,
    )
    # replicas (HSDP/NO_SHARD) must start identical, shards must differ: seed by position in the
    # shard dim
    shard_coord = mesh.get_local_rank("shard") if mesh.ndim == 2 else mesh.get_local_rank()
    torch.manual_seed(cfg.seed + 7919 * shard_coord)
    init_weights(model, config, rt.device)
    if cfg.pretrained:
        hf_io.load_pretrained(path, model=model)
    return model, config, mesh, ac_layers


def param_counts(model: nn.Module) -> tuple[int, int]:
    """(all parameters, input-embedding parameters), for FLOPs per token."""
    embeddings = cast(Any, model).get_input_embeddings()  # a transformers model
    return sum(p.numel() for p in model.parameters()), embeddings.weight.numel()

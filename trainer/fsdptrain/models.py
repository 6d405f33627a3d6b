"""Llama-2 shapes as named configs, built on the meta device so no rank ever holds the whole model."""

from __future__ import annotations

import torch
from torch import nn

from fsdptrain.shapes import MODEL_CONFIGS


def llama_config(name: str, vocab_size: int | None = None):
    from transformers import LlamaConfig

    s = MODEL_CONFIGS[name]
    return LlamaConfig(
        hidden_size=s.hidden,
        num_hidden_layers=s.layers,
        num_attention_heads=s.heads,
        num_key_value_heads=s.kv_heads,
        intermediate_size=s.intermediate,
        vocab_size=vocab_size or s.vocab,
        max_position_embeddings=s.context,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        attention_dropout=0.0,
    )


# Training runs without a KV cache, and then transformers' create_causal_mask looks for packed sequences in
# the position ids with a data-dependent `.all()` (masking_utils.find_packed_sequence_indices): a host sync in
# every forward. Registered as an attention function of its own (transformers' AttentionInterface), not as a
# mask function, SDPA gets no mask (create_causal_mask returns None for an implementation without a mask
# function) and runs with is_causal=True, as stock "sdpa" does when nothing is padded: same numbers, no sync.
CAUSAL_SDPA = "fsdptrain_causal_sdpa"


def use_causal_sdpa(config) -> None:
    """Train with CAUSAL_SDPA (fsdptrain's loader never pads: every sequence is full and causal)."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    AttentionInterface.register(CAUSAL_SDPA, sdpa_attention_forward)
    config._attn_implementation = CAUSAL_SDPA


def build_meta_model(config) -> nn.Module:
    """Build the model without allocating weights; `init_weights` fills each rank's shard later."""
    from transformers import LlamaForCausalLM

    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    return model


@torch.no_grad()
def init_weights(model: nn.Module, config, device: torch.device) -> None:
    """Materialize (after sharding) and initialise every parameter and buffer.

    `to_empty` leaves garbage; transformers' own initialiser skips modules it marked initialised, and the
    RoPE `inv_freq` buffer must be recomputed, so every tensor is set here explicitly.
    """
    from transformers.models.llama.modeling_llama import LlamaRMSNorm, LlamaRotaryEmbedding

    model.to_empty(device=device)
    std = config.initializer_range
    for module in model.modules():
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=std)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, LlamaRMSNorm):
            nn.init.ones_(module.weight)
        elif isinstance(module, LlamaRotaryEmbedding):
            fresh = LlamaRotaryEmbedding(config)
            module.inv_freq.copy_(fresh.inv_freq.to(device))
            module.original_inv_freq.copy_(fresh.original_inv_freq.to(device))


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The transformer blocks, the unit FSDP shards and activation checkpointing wraps."""
    layers = model.get_submodule("model.layers")
    if not isinstance(layers, nn.ModuleList):
        raise TypeError(f"{type(model).__name__}.model.layers is a {type(layers).__name__}, not a ModuleList")
    return layers

"""Llama-2 shapes as named configs, built on the meta device so no rank ever holds the whole
model."""

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


# Training runs without a KV cache, and then transformers' create_causal_mask looks for packed
# sequences in the position ids with a data-dependent `.all()`
# (masking_utils.find_packed_sequence_indices): a host sync in every forward. Registered as an
# attention function of its own (transformers' AttentionInterface), not as a mask function, SDPA
# gets no mask (create_causal_mask returns None for an implementation without a mask function) and
# runs with is_causal=True, as stock "sdpa" does when nothing is padded: same numbers, no sync.
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

    `to_empty` leaves garbage; transformers' own initialiser skips modules it marked initialised,
    and the RoPE `inv_freq` buffer must be recomputed, so every tensor is set here explicitly.
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
        raise TypeError(
            f"{type(model).__name__}.model.layers is a {type(layers).__name__}, not a ModuleList"
        )
    return layers


# SDPA_BACKENDS' names -> torch.nn.attention.SDPBackend members, and the aten op each kernel
# dispatches to
SDPA_MEMBERS = {
    "cudnn": "CUDNN_ATTENTION",
    "flash": "FLASH_ATTENTION",
    "efficient": "EFFICIENT_ATTENTION",
    "math": "MATH",
}
SDPA_OPS = {
    "_scaled_dot_product_cudnn_attention": "cudnn",
    "_scaled_dot_product_flash_attention_for_cpu": "flash (cpu)",
    "_scaled_dot_product_flash_attention": "flash",
    "_scaled_dot_product_efficient_attention": "efficient",
    "_scaled_dot_product_fused_attention_overrideable": "fused (device's own)",
}


def sdpa_priority(order: str):
    """SDPA_BACKENDS as torch's kernel priority, for a `with` block around the run: torch takes the
    first kernel in this order that supports the inputs (torch.nn.attention.sdpa_kernel with
    set_priority=True, as torchtitan's ScaledDotProductAttention). Process-wide, so compiled layers
    see it when they trace."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backends = [getattr(SDPBackend, SDPA_MEMBERS[n.strip()]) for n in order.split(",")]
    rest = [
        getattr(SDPBackend, m)
        for m in SDPA_MEMBERS.values()
        if getattr(SDPBackend, m) not in backends
    ]
    return sdpa_kernel(
        backends + rest, set_priority=True
    )  # every kernel stays allowed, in this order


def attention_kernel(config, device: torch.device, dtype: torch.dtype, batch: int, seq: int) -> str:
    """The SDPA kernel torch picks for the model's attention: one causal SDPA forward on one layer's
    shapes (q, k, v of batch x heads x seq x head_dim, requiring grad as in training) under a
    dispatch mode that sees which aten kernel ran. Asked once at start: compiled layers hide their
    ops from such a mode."""
    import torch.nn.functional as F
    from torch.utils._python_dispatch import TorchDispatchMode

    ran: list[str] = []

    class Seen(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            ran.append(func.__name__.split(".")[0])
            return func(*args, **(kwargs or {}))

    heads = config.num_attention_heads
    shape = (batch, heads, seq, config.hidden_size // heads)
    try:
        q, k, v = (
            torch.randn(shape, device=device, dtype=dtype, requires_grad=True) for _ in range(3)
        )
        with Seen():
            F.scaled_dot_product_attention(q, k, v, is_causal=True)
    except (RuntimeError, torch.OutOfMemoryError) as e:  # asking must never cost the run
        return f"unknown ({type(e).__name__})"
    return next((SDPA_OPS[op] for op in ran if op in SDPA_OPS), "math")

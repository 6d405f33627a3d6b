"""Model shapes and mesh arithmetic: pure Python, no torch, so settings are checked (and planned)
fast."""

from __future__ import annotations

from dataclasses import dataclass

from fsdptrain.errors import ConfigError


@dataclass(frozen=True)
class ModelShape:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    context: int

    def layer_params(self) -> int:
        """Parameters of one decoder layer: attention, SwiGLU MLP, two RMSNorms."""
        head_dim = self.hidden // self.heads
        attn = self.hidden * head_dim * (2 * self.heads + 2 * self.kv_heads)
        return attn + 3 * self.hidden * self.intermediate + 2 * self.hidden

    def num_params(self) -> int:
        """Exact parameter count of LlamaForCausalLM with untied embeddings."""
        return self.layers * self.layer_params() + 2 * self.vocab * self.hidden + self.hidden


def flops_per_token(
    num_params: int, embedding_params: int, layers: int, hidden: int, seq_len: int
) -> int:
    """Training FLOPs per token: 6 x matmul params (forward + backward) + 12 x L x H x S for
    attention.

    The input embedding is a lookup, not a matmul, so it is left out (as torchtitan does).
    """
    return 6 * (num_params - embedding_params) + 12 * layers * hidden * seq_len


# Dense peak TFLOP/s per GPU (bf16/fp16; fp32 runs as TF32 on tensor cores). SXM parts, vendor data
# sheets.
PEAK_TFLOPS = {
    "A100": {"bf16": 312.0, "fp16": 312.0, "fp32": 156.0},
    "H100": {"bf16": 989.0, "fp16": 989.0, "fp32": 494.0},
    "H200": {"bf16": 989.0, "fp16": 989.0, "fp32": 494.0},
}


# Published Hugging Face meta-llama/Llama-2-*-hf shapes; tiny ones keep tests and the quickstart
# fast.
MODEL_CONFIGS: dict[str, ModelShape] = {
    "7b": ModelShape(4096, 32, 32, 32, 11008, 32000, 4096),
    "13b": ModelShape(5120, 40, 40, 40, 13824, 32000, 4096),
    "70b": ModelShape(8192, 80, 64, 8, 28672, 32000, 4096),
    "tiny": ModelShape(128, 4, 4, 4, 344, 512, 512),
    "tiny-gqa": ModelShape(128, 4, 4, 2, 344, 512, 512),
}


def mesh_shape(strategy: str, world_size: int, shard_size: int) -> tuple[int, ...]:
    """The device-mesh shape for a strategy (see fsdptrain.parallel)."""
    if strategy in ("FULL_SHARD", "SHARD_GRAD_OP"):
        return (world_size,)
    if strategy == "NO_SHARD":
        return (world_size, 1)
    if shard_size < 1 or world_size % shard_size:
        raise ConfigError(
            f"HSDP_SHARD_SIZE={shard_size} does not divide the world size {world_size}: "
            f"use a divisor of {world_size} (usually the GPUs per node)"
        )
    return (world_size // shard_size, shard_size)


def hsdp_group_size(hsdp_shard_size: int, procs_per_node: int) -> int:
    """HYBRID_SHARD's shard group: HSDP_SHARD_SIZE, or when 0 the processes of one node. A node's
    GPUs share NVLink, so the per-layer all-gathers stay inside it and only the gradient all-reduce
    crosses nodes."""
    return hsdp_shard_size or procs_per_node


def job_mesh_shape(
    strategy: str, world_size: int, *, hsdp_shard_size: int, procs_per_node: int
) -> tuple[int, ...]:
    """`mesh_shape` with HSDP_SHARD_SIZE's default applied: the one shape the settings check, the
    trainer's start-up check and its device mesh all use."""
    return mesh_shape(strategy, world_size, hsdp_group_size(hsdp_shard_size, procs_per_node))

"""The floor fsdptrain is measured against: a bare FSDP2 training loop with nothing but the training math.

    torchrun --standalone --nproc-per-node 2 benchmarks/bare_fsdp.py CORPUS TOKENIZER STEPS SEQ_LEN \
        MICRO_BATCH PRECISION [MODEL_DIR]

The same Hugging Face LlamaForCausalLM as fsdptrain (the tiny config, or MODEL_DIR's config.json, the
~10M one benchmarks/run.py writes), fully_shard per decoder layer then the root as fsdptrain shards it
(FULL_SHARD: the last layer not resharded after forward), AdamW (foreach, the
trainer's betas and weight decay), gradient clipping at 1.0 as the trainer's default, the same packed
blocks of SEQ_LEN+1 tokens. No metrics, no logging, no loss all-reduce, no host sync but the loop's own.
Prints one JSON line: {"peer": "bare", "tokens_per_s": ...}, counted as the trainer counts its summary:
wall time between step ends, the first step (warm-up) left out.
"""

import json
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from transformers import AutoConfig, AutoTokenizer, LlamaConfig, LlamaForCausalLM

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def tiny_config() -> LlamaConfig:
    """fsdptrain's MODEL=tiny (fsdptrain.shapes.MODEL_CONFIGS, fsdptrain.models.llama_config)."""
    return LlamaConfig(
        hidden_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=4,
        intermediate_size=344,
        vocab_size=512,
        max_position_embeddings=512,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        attention_dropout=0.0,
    )


def main() -> None:
    corpus, tok_dir, steps, seq, batch, precision = sys.argv[1:7]
    steps, seq, batch = int(steps), int(seq), int(batch)
    config = AutoConfig.from_pretrained(sys.argv[7]) if len(sys.argv) > 7 else tiny_config()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(1234 + rank)
    mesh = init_device_mesh("cpu", (world,))
    model = LlamaForCausalLM(config)
    mp = MixedPrecisionPolicy(param_dtype=DTYPES[precision], reduce_dtype=torch.float32)
    layers = model.model.layers
    for i, layer in enumerate(layers):
        # the layout fsdptrain.parallel.apply_fsdp makes: the last layer stays gathered for backward
        fully_shard(layer, mesh=mesh, mp_policy=mp, reshard_after_forward=i < len(layers) - 1)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    opt = torch.optim.AdamW(
        model.parameters(), lr=3e-3, betas=(0.9, 0.95), weight_decay=0.1, foreach=True
    )
    tok = AutoTokenizer.from_pretrained(tok_dir)
    ids = [t for line in open(corpus) for t in (*tok(line.strip())["input_ids"], tok.eos_token_id)]
    blocks = torch.from_numpy(
        np.asarray(ids[: len(ids) // (seq + 1) * (seq + 1)]).reshape(-1, seq + 1)
    )
    ends = [time.perf_counter()]
    for step in range(steps):
        start = (step * world + rank) * batch
        rows = blocks[[i % len(blocks) for i in range(start, start + batch)]]
        logits = model(input_ids=rows[:, :-1]).logits
        loss = F.cross_entropy(logits.float().flatten(0, 1), rows[:, 1:].flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        ends.append(time.perf_counter())
    final = loss.item()
    if rank == 0:
        timed = ends[-1] - ends[1]  # steps 2..N, as fsdptrain's summary
        tokens = batch * seq * world * (steps - 1)
        print(
            json.dumps({"peer": "bare", "tokens_per_s": tokens / timed, "final_loss": final}),
            flush=True,
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

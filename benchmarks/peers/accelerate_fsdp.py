"""Peer: Hugging Face accelerate with its FSDP2 plugin, on the same tiny Llama, data, batch, seq and steps.

    torchrun --standalone --nproc-per-node 2 accelerate_fsdp.py \
        CORPUS TOKENIZER STEPS SEQ_LEN MICRO_BATCH PRECISION
Prints one JSON line: {"peer": "accelerate", "tokens_per_s": ...} (steps after the first).
"""

import json
import sys
import time

import numpy as np
import torch
from accelerate import Accelerator, FullyShardedDataParallelPlugin
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM


def main():
    corpus, tok_dir, steps, seq, batch = (
        sys.argv[1],
        sys.argv[2],
        int(sys.argv[3]),
        int(sys.argv[4]),
        int(sys.argv[5]),
    )
    precision = sys.argv[6] if len(sys.argv) > 6 else "bf16"
    plugin = FullyShardedDataParallelPlugin(
        fsdp_version=2,
        reshard_after_forward=True,
        auto_wrap_policy="transformer_based_wrap",
        transformer_cls_names_to_wrap=["LlamaDecoderLayer"],
    )
    acc = Accelerator(
        cpu=True, fsdp_plugin=plugin, mixed_precision="no" if precision == "fp32" else precision
    )
    torch.manual_seed(1234)
    tok = AutoTokenizer.from_pretrained(tok_dir)
    config = LlamaConfig(
        hidden_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=4,
        intermediate_size=344,
        vocab_size=512,
        max_position_embeddings=512,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1)
    model, opt = acc.prepare(model, opt)
    ids = [t for line in open(corpus) for t in (*tok(line.strip())["input_ids"], tok.eos_token_id)]
    blocks = np.asarray(ids[: len(ids) // (seq + 1) * (seq + 1)]).reshape(-1, seq + 1)
    rank, world = acc.process_index, acc.num_processes
    times = []
    for step in range(steps):
        start = (step * world + rank) * batch
        rows = torch.from_numpy(blocks[[i % len(blocks) for i in range(start, start + batch)]])
        t0 = time.perf_counter()
        out = model(input_ids=rows[:, :-1])
        loss = torch.nn.functional.cross_entropy(
            out.logits.float().flatten(0, 1), rows[:, 1:].flatten()
        )
        acc.backward(loss)
        acc.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
        times.append(time.perf_counter() - t0)
    if acc.is_main_process:
        timed = times[1:]
        print(
            json.dumps(
                {
                    "peer": "accelerate",
                    "tokens_per_s": batch * seq * world * len(timed) / sum(timed),
                    "final_loss": float(loss),
                }
            )
        )


if __name__ == "__main__":
    main()

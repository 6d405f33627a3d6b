"""How long one full (generation 2) Python garbage collection takes in a training process, before and after
compile: the suspect of the 583 ms host stall in the H200's micro-batch-2 row (BENCHMARKS.md "GPU").

    python benchmarks/gc_probe.py        # CPU: an 8-layer Llama (hidden 256), layers compiled with aot_eager

Prints the objects the collector tracks and the milliseconds of one gc.collect(2), after the build and after
compiling the layers and two training steps. fsdptrain's GC_INTERVAL keeps the automatic collector off during
training for this reason (torchtitan's gc_freq).
"""

import gc
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def full_collection_ms() -> float:
    t0 = time.perf_counter()
    gc.collect(2)
    return (time.perf_counter() - t0) * 1000


def main() -> None:
    cfg = LlamaConfig(
        hidden_size=256,
        num_hidden_layers=8,
        num_attention_heads=4,
        intermediate_size=688,
        vocab_size=32000,
    )
    model = LlamaForCausalLM(cfg)
    print(
        f"after the build: {len(gc.get_objects()):,} objects, gen-2 collection {full_collection_ms():.0f} ms"
    )
    for layer in model.model.layers:
        layer.compile(backend="aot_eager")
    x = torch.randint(0, cfg.vocab_size, (1, 128))
    for _ in range(2):
        model(input_ids=x, labels=x).loss.backward()
    print(
        f"after compile: {len(gc.get_objects()):,} objects, gen-2 collection {full_collection_ms():.0f} ms"
    )


if __name__ == "__main__":
    main()

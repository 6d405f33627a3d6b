#!/usr/bin/env bash
# Llama-2-7B from scratch in bf16 on ONE GPU with full activation checkpointing: tokens/s and MFU, to compare
# with published FSDP figures (7B: 3,700 tok/s/GPU at 57% MFU on A100, 7,500 at 37% on H100; PyTorch blog 2024-03).
#
#   bash benchmarks/gpu.sh [STEPS]        # needs the CUDA build of torch; ~110 GiB of GPU memory (H200 141 GB)
#
# 7B's fp32 state alone (16 bytes x 6.74B params = 108 GB) does not fit an 80 GB A100/H100 on one GPU:
# there, run it with 2+ GPUs (`torchrun --nproc-per-node N`) and FULL_SHARD; `fsdpctl plan` says so first.
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-20}
python3 - <<'PY'
import torch, sys
if not torch.cuda.is_available():
    sys.exit("benchmarks/gpu.sh needs a CUDA GPU and the CUDA build of torch")
p = torch.cuda.get_device_properties(0)
print(f"GPU: {p.name}, {p.total_memory / 2**30:.0f} GiB, torch {torch.__version__} CUDA {torch.version.cuda}")
PY
instance=$(python3 -c "
import torch; n = torch.cuda.get_device_name(0)
print('p5e.48xlarge' if 'H200' in n else 'p4de.24xlarge' if 'A100' in n else 'p5.48xlarge')")
echo "plan for this run (as on one GPU of a $instance):"
python3 -m fsdpctl.cli --set GPUS_PER_NODE=1 plan --model 7b --instance-type "$instance" --nodes 1 --ac full \
  --seq-len 4096 --micro-batch 1 --precision bf16 2>/dev/null | sed 's/^/  /' || true
export MODEL=7b PRECISION=bf16 ACTIVATION_CHECKPOINTING=full SEQ_LEN=4096 MICRO_BATCH_SIZE=1 GRAD_ACCUM_STEPS=1 \
  MAX_STEPS=$steps WARMUP_STEPS=2 LOG_INTERVAL=1 SHARDING_STRATEGY=FULL_SHARD DATASET=builtin
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
log=$(mktemp)
torchrun --standalone --nproc-per-node 1 -m fsdptrain | tee "$log"
python3 - "$log" <<'PY'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if l.startswith('{"event"')]
steps = [r for r in recs if r["event"] == "step"][2:]  # skip warm-up steps
tps = sum(r["tokens_per_s"] for r in steps) / len(steps)
mfu = sum(r["mfu"] for r in steps) / len(steps)
mem = max(r["mem_allocated_gib"] for r in steps)
print(f"Llama-2-7B bf16, 1 GPU, full activation checkpointing, seq 4096: {tps:,.0f} tokens/s, MFU {100 * mfu:.1f}% "
      f"(model FLOPs, recompute not counted), peak {mem:.1f} GiB allocated")
PY

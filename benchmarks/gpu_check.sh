#!/usr/bin/env bash
# One prepared GPU check, under 8 minutes on one H200 (issue 17 item 4). From the repository root:
#
#   bash benchmarks/gpu_check.sh              # the table goes to stdout and to $OUT/gpu_check.md if OUT is set
#
# Steps, each bounded by `timeout` and all by GPU_CHECK_BUDGET_S (400 s) inside gpu_check.py:
#   1. no CUDA GPU: one line, exit 2 (tests/test_gpu_check.py runs this on CPU)
#   2. CUDA smoke of every strategy that fits one GPU (FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD on
#      one process), tiny model, 6 steps
#   3. resume equality on CUDA: 8 steps with a checkpoint at 4, resume from it, the losses of steps 5-8 equal
#   4. Llama-2-7B-shaped throughput (7B's layer, 8 of its 32 layers, seq 4096, bf16, batch 1): the trainer's
#      defaults, then each lever's other values (COMPILE, FUSED_OPTIMIZER, DETERMINISTIC,
#      ACTIVATION_CHECKPOINTING none/selective/full, FLOAT8, FSDP_PREFETCH); a key `python -m fsdptrain
#      --help` does not list, or a value it refuses (exit 2), is reported as not available, FLOAT8 without
#      torchao "skipped"; the bare loop (5) runs right after the baseline so the time budget never drops it
#   5. side by side, a bare FSDP2 + torch.compile loop on the same shape: torchtitan is not installed on the
#      GPU machine and nothing can be fetched there (carry it as a wheel in .whl/ to add it)
#   6. one markdown table: config, tokens/s, MFU, peak memory GiB, status
# Environment (/work/.library/device/README.md, KINDS.md): python3 3.12 with torch 2.11 CUDA 13, transformers
# 5.x, safetensors, tokenizers, numpy, rich, typer, pyyaml are installed there. fsdptrain with DATASET=builtin
# imports only torch and transformers (`datasets` only for json/parquet/hub datasets; the slow test
# test_a_cpu_rehearsal_runs_every_row runs every row with only that machine's packages), so nothing must be
# carried; benchmarks/gpu_check_wheels.txt lists the optional wheels (torchao for FLOAT8, torchtitan).
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/src:$PWD/trainer${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
# no NVIDIA device node and no nvidia-smi: no GPU, said before python and torch start
if ! command -v nvidia-smi >/dev/null 2>&1 && ! [ -e /dev/nvidia0 ]; then
  echo "gpu_check: no CUDA GPU: no /dev/nvidia0 and no nvidia-smi here (run it on a GPU machine)"
  exit 2
fi
timeout 30 "$py" benchmarks/gpu_check.py gpu || exit 2
work=${GPU_CHECK_DIR:-$(mktemp -d)}
timeout 440 "$py" benchmarks/gpu_check.py all "$work"
rc=$?
echo "logs: $work"
exit $rc

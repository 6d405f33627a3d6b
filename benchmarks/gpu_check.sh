#!/usr/bin/env bash
# One prepared GPU check (v2, issue 30), under 8 minutes on one H200. From the repository root:
#
#   bash benchmarks/gpu_check.sh     # the report goes to stdout, to $OUT/gpu_check.md and the logs to
#                                    # $OUT/gpu_check_logs.tgz when OUT is set
#
# 1. no CUDA GPU: one line, exit 2 (tests/test_gpu_check.py runs this on CPU)
# 2. the probe (the same exit 2 where torch sees no GPU): the GPU, versions (torch, triton, transformers, torchao, torchtitan, datasets, pyarrow, fsspec, tyro),
#    torch's attention kernel order, the C compiler Triton would use (COMPILE=auto's condition)
# 3. the rows of gpu_check.py ROWS, in priority order, each started only while the budget
#    (GPU_CHECK_BUDGET_S, 420 s) still holds its expected time, each under its own timeout: the trainer's
#    defaults (COMPILE=auto), the bare FSDP2 + compile loop and torchtitan 0.2.2 on the same 7b-8l shape
#    (Llama-2-7B's layer x 8, seq 4096, bf16, micro-batch 1), resume equality on CUDA, FLOAT8 alone,
#    eager selective vs eager full checkpointing, compile + full checkpointing, micro-batch 2, the full
#    32-layer 7B at micro-batch 2; then optional rows while time is left
# 4. one markdown table (median and total-time tokens/s, MFU, peak GiB, step 1, slowest step), the targets'
#    ratios measured side by side, and how each trainer row resolved its levers
# Environment (/work/.library/device/README.md, KINDS.md): python3 3.12 with torch 2.11 CUDA, transformers
# 5.x, numpy, rich, pyyaml there; benchmarks/gpu_check_wheels.txt lists the wheels to carry (torchao for
# FLOAT8, torchtitan 0.2.2 and what it needs): install them first, rows whose package is missing are skipped.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/src:$PWD/trainer${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
# no NVIDIA device node and no nvidia-smi: no GPU, said before python and torch start
if ! command -v nvidia-smi >/dev/null 2>&1 && ! [ -e /dev/nvidia0 ]; then
  echo "gpu_check: no CUDA GPU: no /dev/nvidia0 and no nvidia-smi here (run it on a GPU machine)"
  exit 2
fi
work=${GPU_CHECK_DIR:-$(mktemp -d)}
mkdir -p "$work"
timeout 30 "$py" benchmarks/gpu_check.py probe > "$work/probe.txt" 2>&1
probe_rc=$?
cat "$work/probe.txt"
[ "$probe_rc" -eq 0 ] || exit 2
timeout 445 "$py" benchmarks/gpu_check.py all "$work"
rc=$?
echo "logs: $work"
if [ -n "${OUT:-}" ]; then
  cp "$work/probe.txt" "$OUT/" 2>/dev/null
  tar czf "$OUT/gpu_check_logs.tgz" -C "$work" --exclude='ckpt-*' --exclude='titan-out' --exclude='hf' . 2>/dev/null
fi
exit $rc

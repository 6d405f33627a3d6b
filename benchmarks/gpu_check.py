"""The python half of benchmarks/gpu_check.sh: runs, parsing, the lever sweep, a bare FSDP2 loop, the table.

Modes (gpu_check.sh calls them; each trainer run is `torchrun --standalone --nproc-per-node 1` on this file):
    python benchmarks/gpu_check.py gpu                 # exit 2 with one line when no CUDA GPU
    python benchmarks/gpu_check.py all OUTDIR          # smoke, resume, levers, bare loop; prints the table
    python benchmarks/gpu_check.py train               # (under torchrun) fsdptrain with the 7b-8l shape added
    python benchmarks/gpu_check.py bare                # (under torchrun) bare FSDP2 + torch.compile loop
Importable without torch (tests/test_gpu_check.py unit-tests the parsing and the table writer on CPU).

GPU_CHECK_REHEARSE=cpu runs `all` on the CPU build instead: a 2-layer shape of 7B's vocabulary, fp32, gloo, no
compile in the bare loop, every row otherwise as on the GPU. tests/test_gpu_check.py rehearses it that way, so
a bug in this script (a lever value the trainer refuses, a resume that finds no checkpoint) shows here and
not in the GPU machine's 15 minutes.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Llama-2-7B's layer (hidden 4096, 32 heads, MLP 11008, vocab 32000, seq 4096) with 8 of its 32 layers:
# the per-layer matmuls and the head are 7B's, so tokens/s per layer and MFU read like 7B's, in a fraction of
# the start-up and memory (1.9B parameters: 30 GiB of fp32 state + activations on one H200).
SHAPE = "7b-8l"
SHAPE_ARGS = (4096, 8, 32, 32, 11008, 32000, 4096)
SEQ_LEN = 4096
STEPS = 12
WARM = 4  # steps left out of the means: allocation, autotuning, compile
REHEARSE = os.environ.get("GPU_CHECK_REHEARSE") == "cpu"
# the same rows on the CPU build, ~2.5 min on 2 cores: (hidden, layers, heads, kv, MLP, vocab, ctx)
if REHEARSE:
    SHAPE_ARGS, SEQ_LEN, STEPS, WARM = (64, 2, 4, 4, 128, 32000, 256), 64, 4, 2
BUDGET_S = float(os.environ.get("GPU_CHECK_BUDGET_S", 400))  # the whole run stays under 8 minutes
# lever key -> values to try; the trainer's default runs as the baseline row, each other value once
LEVERS: dict[str, tuple[str, ...]] = {
    "COMPILE": ("false", "true"),
    "FUSED_OPTIMIZER": ("on", "off"),  # the trainer's choices: auto (on with CUDA), on, off
    "DETERMINISTIC": ("false", "true"),
    "ACTIVATION_CHECKPOINTING": ("none", "selective", "full"),
    "FLOAT8": ("false", "true"),
    "FSDP_PREFETCH": ("0", "1"),
}
SMOKE_STRATEGIES = ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD")


@dataclass
class Record:
    config: str
    status: str  # ok | FAIL: ... | skipped: ...
    tokens_per_s: float | None = None
    mfu: float | None = None
    peak_gib: float | None = None


def table(records: Iterable[Record]) -> str:
    """One markdown table: config, tokens/s, MFU, peak memory GiB, status."""
    lines = ["| config | tokens/s | MFU | peak GiB | status |", "|---|---|---|---|---|"]
    for r in records:
        tps = f"{r.tokens_per_s:,.0f}" if r.tokens_per_s is not None else "-"
        mfu = f"{100 * r.mfu:.1f}%" if r.mfu is not None else "-"
        mem = f"{r.peak_gib:.1f}" if r.peak_gib is not None else "-"
        status = r.status.replace("|", "/").replace("\n", " ")
        lines.append(f"| {r.config.replace('|', '/')} | {tps} | {mfu} | {mem} | {status} |")
    return "\n".join(lines) + "\n"


def events(text: str) -> list[dict]:
    """The trainer's JSON event lines (METRICS_FILE or stdout); other lines are skipped."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if isinstance(rec, dict) and "event" in rec:
                out.append(rec)
    return out


def measure(config: str, evs: Sequence[dict], warm: int = WARM) -> Record:
    """Means over the steps after `warm` (all steps when there are no more), peak over all of them."""
    steps = [e for e in evs if e["event"] == "step"]
    if not steps:
        return Record(config, "FAIL: no step events")
    kept = steps[warm:] or steps
    tps = sum(e["tokens_per_s"] for e in kept) / len(kept)
    mfus = [e["mfu"] for e in kept if e.get("mfu") is not None]
    mems = [e["mem_allocated_gib"] for e in steps if e.get("mem_allocated_gib") is not None]
    return Record(config, "ok", tps, sum(mfus) / len(mfus) if mfus else None, max(mems) if mems else None)


def losses(evs: Iterable[dict]) -> dict[int, float]:
    return {e["step"]: e["loss"] for e in evs if e["event"] == "step"}


def resume_equal(full: Mapping[int, float], resumed: Mapping[int, float], rtol: float = 1e-5) -> str:
    """ok when the resumed run's losses equal the uninterrupted run's at every step it ran."""
    if not resumed:
        return "FAIL: the resumed run logged no steps"
    diffs = {s: abs(full[s] - v) / max(abs(full[s]), 1e-12) for s, v in resumed.items() if s in full}
    if len(diffs) != len(resumed):
        return f"FAIL: steps {sorted(set(resumed) - set(full))} missing from the full run"
    worst = max(diffs.values())
    what = f"steps {min(resumed)}-{max(resumed)}, max relative loss difference {worst:.1e}"
    return f"ok ({what})" if worst <= rtol else f"FAIL: {what}"


def available_keys(help_text: str) -> dict[str, str]:
    """The settings `python -m fsdptrain --help` lists, with their defaults: '(env KEY, default VALUE' in
    each option's help (argparse may wrap it), VALUE as Python's repr, lower-cased without quotes."""
    found = re.findall(r"\(env\s+([A-Z][A-Z0-9_]*),\s+default\s+('[^']*'|[^\s;)]+)", help_text)
    return {key: value.strip("'").lower() for key, value in found}


def lever_runs(keys: Mapping[str, str], have_torchao: bool) -> list[tuple[str, dict[str, str], str]]:
    """(config name, settings, skip reason or '') for each lever value other than the trainer's default
    (that one is the baseline row); a lever the trainer does not list is reported as not available."""
    runs: list[tuple[str, dict[str, str], str]] = []
    for key, values in LEVERS.items():
        for value in values:
            name = f"7b-8l {key}={value}"
            if key not in keys:
                runs.append((name, {}, "skipped: lever not available in this trainer"))
            elif keys[key] == value:
                runs.append((name, {}, "skipped: the trainer's default, the baseline row"))
            elif key == "FLOAT8" and value == "true" and not have_torchao:
                runs.append((name, {}, "skipped: torchao not installed"))
            else:
                runs.append((name, {key: value}, ""))
    return runs


# --- running (GPU machine only below this line) --------------------------------------------------------


def _env(extra: Mapping[str, str]) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT / "trainer"), env.get("PYTHONPATH", "")])
    env.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    precision = "fp32" if REHEARSE else "bf16"
    env.update({"DATASET": "builtin", "LOG_INTERVAL": "1", "PRECISION": precision})
    env.update(extra)
    return env


def _torchrun(mode: str, settings: Mapping[str, str], timeout: float, log: Path) -> tuple[int, str]:
    metrics = log.with_suffix(".jsonl")
    metrics.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1"]
    cmd += [str(Path(__file__).resolve()), mode]
    env = _env({**settings, "METRICS_FILE": str(metrics)})
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
        rc, out = p.returncode, p.stdout + p.stderr
    except subprocess.TimeoutExpired as e:
        rc, out = 124, f"{e.stdout or ''}{e.stderr or ''}"
        out = out if isinstance(out, str) else out.decode(errors="replace")
    log.write_text(out)
    text = metrics.read_text() if metrics.exists() else out
    return rc, text


def _last_error(log: Path) -> str:
    lines = [ln for ln in log.read_text().splitlines() if ln.strip()]
    err = [ln for ln in lines if re.search(r"Error|error:|refused|not allowed", ln)]
    return (err or lines or ["no output"])[-1][:160]


class Clock:
    def __init__(self, budget: float) -> None:
        self.end = time.monotonic() + budget

    def left(self) -> float:
        return self.end - time.monotonic()


def run_all(outdir: Path) -> list[Record]:
    outdir.mkdir(parents=True, exist_ok=True)
    clock = Clock(BUDGET_S)
    records: list[Record] = []

    def go(name: str, settings: dict[str, str], limit: float, mode: str = "train") -> tuple[Record, str]:
        if clock.left() < 20:
            return Record(name, "skipped: time budget (8 minutes) spent"), ""
        log = outdir / (re.sub(r"[^A-Za-z0-9_.-]+", "_", name) + ".log")
        t0 = time.monotonic()
        rc, text = _torchrun(mode, settings, min(limit, clock.left()), log)
        took = time.monotonic() - t0
        if rc == 124:
            return Record(name, f"FAIL: timed out after {took:.0f} s"), text
        if rc != 0:
            return Record(name, f"FAIL: exit {rc}: {_last_error(log)}"), text
        rec = measure(name, events(text))
        if rec.status == "ok":
            rec.status = f"ok ({took:.0f} s)"
        return rec, text

    tiny = {"MODEL": "tiny", "MAX_STEPS": "6", "WARMUP_STEPS": "1", "CHECKPOINT_DIR": ""}
    for strategy in SMOKE_STRATEGIES:  # (2) every strategy that fits one GPU, tiny model, a few steps
        # HYBRID_SHARD on one process: a 1 x 1 mesh (HSDP_SHARD_SIZE's default, the node's processes)
        rec, _ = go(f"smoke tiny {strategy}", {**tiny, "SHARDING_STRATEGY": strategy}, 90)
        records.append(rec)

    # (3) resume equality: 8 steps with a checkpoint at 4; resume from step 4; compare steps 5-8
    ck = outdir / "ckpt-full"
    base = {"MODEL": "tiny", "MAX_STEPS": "8", "WARMUP_STEPS": "1", "CHECKPOINT_INTERVAL": "4"}
    rec, text = go(
        "resume: uninterrupted 8 steps", {**base, "CHECKPOINT_DIR": str(ck), "RESUME": "never"}, 90
    )
    records.append(rec)
    at4 = [e.get("path") for e in events(text) if e["event"] == "checkpoint" and e.get("step") == 4]
    if rec.status.startswith("ok") and at4 and at4[0]:
        settings = {**base, "CHECKPOINT_DIR": str(outdir / "ckpt-resumed"), "RESUME": str(at4[0])}
        rec2, text2 = go("resume: from step 4 to 8", settings, 90)
        if rec2.status.startswith("ok"):
            rec2.status = resume_equal(losses(events(text)), losses(events(text2)))
        records.append(rec2)
    else:
        records.append(Record("resume: from step 4 to 8", "skipped: no step-4 checkpoint from the full run"))

    # (4) the levers on the 7B-shaped model
    help_text = subprocess.run(
        [sys.executable, "-m", "fsdptrain", "--help"], env=_env({}), capture_output=True, text=True, cwd=ROOT
    ).stdout
    import importlib.util

    shape = {
        "MODEL": SHAPE,
        "SEQ_LEN": str(SEQ_LEN),
        "MICRO_BATCH_SIZE": "1",
        "MAX_STEPS": str(STEPS),
        "WARMUP_STEPS": "2",
        "CHECKPOINT_DIR": "",
        "LR": "1e-4",
    }
    records.append(go("7b-8l baseline (trainer defaults)", shape, 150)[0])
    # (5) side by side: torchtitan is not installed on the GPU machine (and cannot be fetched there), so a
    # bare FSDP2 + torch.compile loop on the same shape stands in for it
    records.append(go("bare FSDP2 + compile loop, 7b-8l (torchtitan not installed)", shape, 150, "bare")[0])
    for name, settings, skip in lever_runs(
        available_keys(help_text), importlib.util.find_spec("torchao") is not None
    ):
        if skip:
            records.append(Record(name, skip))
            continue
        limit = 150 if settings.get("COMPILE") == "true" else 90
        rec = go(name, {**shape, **settings}, limit)[0]
        if rec.status.startswith("FAIL: exit 2:"):  # the trainer refuses the value: a lever not offered
            rec.status = "skipped: not offered by this trainer:" + rec.status.removeprefix("FAIL: exit 2:")
        records.append(rec)

    return records


# --- inside torchrun ----------------------------------------------------------------------------------


def _add_shape() -> None:
    from fsdptrain import shapes

    shapes.MODEL_CONFIGS.setdefault(SHAPE, shapes.ModelShape(*SHAPE_ARGS))


def train_main() -> int:
    _add_shape()
    from fsdptrain.__main__ import main

    return main([])


def bare_main() -> int:
    """FSDP2 (fully_shard per decoder layer, bf16 params, fp32 reduce), torch.compile per layer, fused AdamW,
    random tokens: what a minimal hand-written loop reaches on the same shape, METRICS_FILE lines like the
    trainer's."""
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from transformers import LlamaConfig, LlamaForCausalLM

    from fsdptrain.shapes import PEAK_TFLOPS, flops_per_token

    cuda = not REHEARSE
    dist.init_process_group("nccl" if cuda else "gloo")
    dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(dev)
    h, layers, heads, kv, inter, vocab, ctx = SHAPE_ARGS
    seq, steps = int(os.environ.get("SEQ_LEN", SEQ_LEN)), int(os.environ.get("MAX_STEPS", STEPS))
    cfg = LlamaConfig(
        hidden_size=h,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        intermediate_size=inter,
        vocab_size=vocab,
        max_position_embeddings=ctx,
        attn_implementation="sdpa",
    )
    with torch.device(dev):
        model = LlamaForCausalLM(cfg)
    mp = MixedPrecisionPolicy(
        param_dtype=torch.bfloat16 if cuda else torch.float32, reduce_dtype=torch.float32
    )
    for layer in model.model.layers:  # as torchtitan: compile each block in place, then shard it
        if cuda:  # (the rehearsal leaves inductor's C++ build out)
            layer.compile()
        fully_shard(layer, mp_policy=mp)
    fully_shard(model, mp_policy=mp)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=cuda, foreach=not cuda)
    n = sum(p.numel() for p in model.parameters())
    fpt = flops_per_token(n, vocab * h, layers, h, seq)
    name = torch.cuda.get_device_name(dev) if cuda else "cpu"
    gpu = next((g for g in PEAK_TFLOPS if g in name), None)
    peak = PEAK_TFLOPS[gpu]["bf16"] * 1e12 if gpu else None
    out = open(os.environ["METRICS_FILE"], "w")  # noqa: SIM115 - one file for the whole loop
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    for step in range(1, steps + 1):
        x = torch.randint(0, vocab, (1, seq), device=dev)
        sync()
        t0 = time.perf_counter()
        loss = model(input_ids=x, labels=x).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync()
        dt = time.perf_counter() - t0
        rec = {
            "event": "step",
            "step": step,
            "loss": loss.item(),
            "tokens_per_s": seq / dt,
            "mfu": seq * fpt / dt / peak if peak else None,
            "mem_allocated_gib": torch.cuda.max_memory_allocated(dev) / 2**30 if cuda else None,
        }
        out.write(json.dumps(rec) + "\n")
        out.flush()
    dist.destroy_process_group()
    return 0


def gpu_present() -> int:
    """0 with one line naming the GPU; 2 with one line when there is none (or no CUDA build of torch)."""
    try:
        import torch
    except ImportError:
        print("gpu_check: no CUDA GPU: torch is not installed here (run it on a GPU machine)")
        return 2
    if not torch.cuda.is_available():
        print(f"gpu_check: no CUDA GPU: torch {torch.__version__} sees none (run it on a GPU machine)")
        return 2
    p = torch.cuda.get_device_properties(0)
    print(
        f"GPU: {p.name}, {p.total_memory / 2**30:.0f} GiB, "
        f"torch {torch.__version__} CUDA {torch.version.cuda}"
    )
    return 0


def main(argv: Sequence[str]) -> int:
    mode = argv[0] if argv else ""
    if mode == "gpu":
        return gpu_present()
    if mode == "train":
        return train_main()
    if mode == "bare":
        return bare_main()
    if mode == "all" and len(argv) == 2:
        outdir = Path(argv[1])
        records = run_all(outdir)
        md = table(records)
        print(md, end="")
        (outdir / "gpu_check.md").write_text(md)
        if os.environ.get("OUT"):
            Path(os.environ["OUT"], "gpu_check.md").write_text(md)
        return 0 if all(not r.status.startswith("FAIL") for r in records) else 1
    print("usage: gpu_check.py gpu | all OUTDIR | train | bare", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

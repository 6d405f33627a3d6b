"""The python half of benchmarks/gpu_check.sh (v2): the rows, their runs, parsing, and the table.

Modes (gpu_check.sh calls them; each trainer run is `torchrun --standalone --nproc-per-node 1` on this file):
    python benchmarks/gpu_check.py gpu                 # exit 2 with one line when no CUDA GPU
    python benchmarks/gpu_check.py probe               # versions, attention order, compiler: one line each
    python benchmarks/gpu_check.py all OUTDIR          # every row of ROWS, then the table and the ratios
    python benchmarks/gpu_check.py train               # (under torchrun) fsdptrain with the shapes added
    python benchmarks/gpu_check.py bare                # (under torchrun) bare FSDP2 + torch.compile loop
Importable without torch (tests/test_gpu_check.py unit-tests the rows, the parsing and the table on CPU).

v2 (issue 30): fewer, longer rows (20 steps, medians over the last 15), each with the seconds it is expected
to take; a row starts only when the budget still holds it, so no row is cut half-way by the budget (v1's
"FSDP_PREFETCH=0 FAIL" was the budget running out), and rows are ordered by what they verify, the optional
ones last. Every row reports the median and the total-time tokens/s, the first step's seconds and the
slowest step (a stall shows there), and how the trainer resolved its levers (its `start` event).
torchtitan 0.2.2 runs beside the trainer on the same shape when its wheels are installed
(benchmarks/gpu_check_wheels.txt, benchmarks/peers/torchtitan_peer.py).

GPU_CHECK_REHEARSE=cpu runs `all` on the CPU build instead: a 2-layer shape of 7B's vocabulary (4 layers for
the full-model row), fp32, gloo, compile with the aot_eager backend; tests/test_gpu_check.py rehearses it so a
bug in this script shows here and not in the GPU machine's 15 minutes.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REHEARSE = os.environ.get("GPU_CHECK_REHEARSE") == "cpu"
# Llama-2-7B's layer (hidden 4096, 32 heads, MLP 11008, vocab 32000, seq 4096) with 8 of its 32 layers:
# the per-layer matmuls and the head are 7B's, so tokens/s per layer and MFU read like 7B's, in a fraction of
# the start-up and memory (1.9B parameters: 30 GiB of fp32 state + activations on one H200).
SHAPE = "7b-8l"
SHAPE_ARGS = (4096, 8, 32, 32, 11008, 32000, 4096)
FULL = "7b"  # the whole model: 100 GiB of fp32 state on one H200 (ANALYSIS.md 5b predicts ~112 GiB peak)
FULL_ARGS: tuple[int, ...] | None = None  # 7b is the trainer's own shape
SEQ_LEN, STEPS, WARM, FULL_STEPS = 4096, 20, 5, 10
TITAN_FLAVOR = "7b-8l"
# the same rows on the CPU build, ~3 min on 2 cores: (hidden, layers, heads, kv, MLP, vocab, ctx)
if REHEARSE:
    SHAPE_ARGS, SEQ_LEN, STEPS, WARM, FULL_STEPS = (64, 2, 4, 4, 128, 32000, 256), 64, 4, 2, 4
    FULL, FULL_ARGS, TITAN_FLAVOR = "7b-rehearsal", (64, 4, 4, 4, 128, 32000, 256), "rehearsal"
BUDGET_S = float(os.environ.get("GPU_CHECK_BUDGET_S", 420))  # the whole run stays under 8 minutes


@dataclass(frozen=True)
class Row:
    """One run: a trainer (`train`), the bare loop (`bare`) or torchtitan (`titan`) with these settings.
    `expect`: seconds it took on the H200 (or is estimated to take); it starts only with that much budget
    left (x1.1), and `limit` is its own timeout."""

    name: str
    settings: Mapping[str, str]
    expect: float
    limit: float
    mode: str = "train"
    verifies: str = ""
    optional: bool = False
    needs: str = ""  # a Python package the row needs ('' none)
    gpu_only: bool = False  # refused on a CPU (FLOAT8): skipped in the rehearsal


def _shape(**extra: str) -> dict[str, str]:
    return {
        "MODEL": SHAPE,
        "SEQ_LEN": str(SEQ_LEN),
        "MICRO_BATCH_SIZE": "1",
        "MAX_STEPS": str(STEPS),
        "WARMUP_STEPS": "2",
        "CHECKPOINT_DIR": "",
        "LR": "1e-4",
        **extra,
    }


TINY = {"MODEL": "tiny", "MAX_STEPS": "8", "WARMUP_STEPS": "1", "CHECKPOINT_INTERVAL": "4"}
TITAN_AC = {
    "none": ("--activation_checkpoint.mode", "none"),
    "full": ("--activation_checkpoint.mode", "full"),
    "op": (
        "--activation_checkpoint.mode",
        "selective",
        "--activation_checkpoint.selective_ac_option",
        "op",
    ),
}
# In priority order: what issue 30 asks the next GPU run to verify first, the optional rows last.
ROWS: tuple[Row, ...] = (
    Row(
        "7b-8l trainer defaults",
        _shape(),
        36,
        150,
        verifies="COMPILE=auto turns compile on with CUDA",
    ),
    Row(
        "bare FSDP2 + compile loop, 7b-8l",
        _shape(),
        38,
        150,
        "bare",
        "defaults >= 1.0x the bare loop",
    ),
    Row(
        "torchtitan 0.2.2, compile, AC none, 7b-8l",
        {"TITAN_AC": "none", "TITAN_COMPILE": "1"},
        55,
        180,
        "titan",
        "the trainer >= torchtitan on the same shape",
        needs="torchtitan",
    ),
    Row(
        "7b-8l FLOAT8=true",
        _shape(FLOAT8="true"),
        48,
        180,
        verifies="FLOAT8 compiles by itself; >= 1.1x compiled bf16",
        needs="torchao",
        gpu_only=True,
    ),
    Row(
        "7b-8l ACTIVATION_CHECKPOINTING=selective COMPILE=false",
        _shape(ACTIVATION_CHECKPOINTING="selective", COMPILE="false"),
        26,
        90,
        verifies="eager selective falls back to layer-level; >= eager full",
    ),
    Row(
        "7b-8l ACTIVATION_CHECKPOINTING=full COMPILE=false",
        _shape(ACTIVATION_CHECKPOINTING="full", COMPILE="false"),
        25,
        90,
        verifies="eager full (the reference for eager selective)",
    ),
    Row(
        "7b (32 layers) defaults",
        {**_shape(MODEL=FULL, MAX_STEPS=str(FULL_STEPS)), "MICRO_BATCH_SIZE": "2"},
        75,
        200,
        verifies="full 7B trains on one H200 at micro-batch 2 (predicted ~112 GiB, ~11.5k tok/s)",
    ),
    Row(
        "7b-8l MICRO_BATCH_SIZE=2",
        _shape(MICRO_BATCH_SIZE="2"),
        36,
        150,
        verifies="micro-batch 2 compiled; the 583 ms stall with GC control",
    ),
    Row(
        "7b-8l ACTIVATION_CHECKPOINTING=full",
        _shape(ACTIVATION_CHECKPOINTING="full"),
        36,
        150,
        verifies="compile + full checkpointing (the missing cell)",
    ),
    Row(
        "resume: uninterrupted 8 steps",
        {**TINY, "RESUME": "never"},
        18,
        90,
        verifies="resume on CUDA",
    ),
    Row(
        "resume: from step 4 to 8",
        dict(TINY),
        18,
        90,
        verifies="losses equal an uninterrupted run's",
    ),
    Row(
        "7b-8l COMPILE=false",
        _shape(COMPILE="false"),
        24,
        90,
        verifies="the old eager default",
        optional=True,
    ),
    Row(
        "torchtitan 0.2.2, eager, AC full, 7b-8l",
        {"TITAN_AC": "full"},
        40,
        120,
        "titan",
        "torchtitan's own eager full",
        optional=True,
        needs="torchtitan",
    ),
    Row(
        "torchtitan 0.2.2, eager, AC op, 7b-8l",
        {"TITAN_AC": "op"},
        40,
        120,
        "titan",
        "torchtitan's eager op-SAC: does it lose to full there too?",
        optional=True,
        needs="torchtitan",
    ),
    Row(
        "7b-8l ACTIVATION_CHECKPOINTING=selective",
        _shape(ACTIVATION_CHECKPOINTING="selective"),
        40,
        150,
        verifies="op-level selective, compiled",
        optional=True,
    ),
)


@dataclass
class Record:
    config: str
    status: str  # ok ... | FAIL: ... | skipped: ...
    tokens_per_s: float | None = None  # median of the measured steps
    tokens_per_s_total: float | None = None  # their tokens over their summed time (stalls included)
    mfu: float | None = None  # median
    peak_gib: float | None = None
    first_step_s: float | None = None
    max_step_ms: float | None = None
    levers: dict[str, str] = field(default_factory=dict)  # the trainer's start event


def _fmt(value: float | None, spec: str, scale: float = 1.0) -> str:
    return "-" if value is None else format(value * scale, spec)


def table(records: Iterable[Record]) -> str:
    """One markdown table: config, tokens/s (median and total time), MFU, peak GiB, step 1, slowest step."""
    head = (
        "| config | tok/s median | tok/s total | MFU | peak GiB | step 1 s | max step ms | status |"
    )
    lines = [head, "|---|---|---|---|---|---|---|---|"]
    for r in records:
        cells = [
            r.config.replace("|", "/"),
            _fmt(r.tokens_per_s, ",.0f"),
            _fmt(r.tokens_per_s_total, ",.0f"),
            _fmt(r.mfu, ".1f", 100) + ("%" if r.mfu is not None else ""),
            _fmt(r.peak_gib, ".1f"),
            _fmt(r.first_step_s, ".1f"),
            _fmt(r.max_step_ms, ",.0f"),
            r.status.replace("|", "/").replace("\n", " "),
        ]
        lines.append("| " + " | ".join(cells) + " |")
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


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_TITAN_STEP = re.compile(
    r"step:\s*(\d+)\s+loss:\s*([-\d.naif]+).*?memory:\s*([\d.]+)GiB.*?tps:\s*([\d,]+).*?mfu:\s*([\d.]+)%"
)


def titan_events(text: str, tokens_per_step: int) -> list[dict]:
    """torchtitan's step lines (torchtitan/components/metrics.py MetricsProcessor.log: step, loss, memory =
    max reserved GiB, tps = tokens/s per device, mfu %) as the trainer's step events; the step's time is
    tokens_per_step / tps (torchtitan prints no time)."""
    out = []
    for line in _ANSI.sub("", text).splitlines():
        m = _TITAN_STEP.search(line)
        if m is None:
            continue
        tps = float(m.group(4).replace(",", ""))
        out.append(
            {
                "event": "step",
                "step": int(m.group(1)),
                "loss": float(m.group(2)),
                "tokens_per_s": tps,
                "step_time_s": tokens_per_step / tps if tps else float("inf"),
                "mfu": float(m.group(5)) / 100,
                "mem_allocated_gib": float(m.group(3)),
            }
        )
    return out


def measure(config: str, evs: Sequence[dict], warm: int = WARM) -> Record:
    """Medians over the steps after `warm` (all steps when there are no more), the total-time rate over the
    same steps, the first step's time, the slowest measured step, the peak memory over all steps."""
    steps = [e for e in evs if e.get("event") == "step"]
    if not steps:
        return Record(config, "FAIL: no step events")
    kept = steps[warm:] or steps
    tps = statistics.median(e["tokens_per_s"] for e in kept)
    times = [e.get("step_time_s") for e in kept]
    total = None
    if all(isinstance(t, (int, float)) and t > 0 for t in times):
        total = sum(e["tokens_per_s"] * e["step_time_s"] for e in kept) / sum(times)  # type: ignore[misc]
    mfus = [e["mfu"] for e in kept if e.get("mfu") is not None]
    mems = [e["mem_allocated_gib"] for e in steps if e.get("mem_allocated_gib") is not None]
    first = steps[0].get("step_time_s")
    slowest = max((t for t in times if isinstance(t, (int, float))), default=None)
    starts = [e for e in evs if e.get("event") == "start"]
    return Record(
        config,
        "ok",
        tps,
        total,
        statistics.median(mfus) if mfus else None,
        max(mems) if mems else None,
        first,
        slowest * 1000 if slowest is not None else None,
        dict(starts[-1].get("levers") or {}) if starts else {},
    )


def losses(evs: Iterable[dict]) -> dict[int, float]:
    return {e["step"]: e["loss"] for e in evs if e["event"] == "step"}


def resume_equal(
    full: Mapping[int, float], resumed: Mapping[int, float], rtol: float = 1e-5
) -> str:
    """ok when the resumed run's losses equal the uninterrupted run's at every step it ran."""
    if not resumed:
        return "FAIL: the resumed run logged no steps"
    diffs = {
        s: abs(full[s] - v) / max(abs(full[s]), 1e-12) for s, v in resumed.items() if s in full
    }
    if len(diffs) != len(resumed):
        return f"FAIL: steps {sorted(set(resumed) - set(full))} missing from the full run"
    worst = max(diffs.values())
    what = f"steps {min(resumed)}-{max(resumed)}, max relative loss difference {worst:.1e}"
    return f"ok ({what})" if worst <= rtol else f"FAIL: {what}"


def lever_note(levers: Mapping[str, str]) -> str:
    """What the trainer chose, short: 'compile on, AC every-k' from its start event's levers."""
    parts = []
    if "compile" in levers:
        parts.append("compile " + levers["compile"].split(" ", 1)[0])
    ac = levers.get("activation_checkpointing", "")
    if ac and ac != "off":
        parts.append("AC " + ac.split(",", 1)[0])
    if "attention" in levers:
        parts.append("attn " + levers["attention"].split(" (SDPA", 1)[0])
    return ", ".join(parts)


def ratios(records: Sequence[Record]) -> list[str]:
    """Issue 30's targets, each measured side by side in this run: one line each, with its ratio."""
    by = {r.config: r.tokens_per_s for r in records if r.status.startswith("ok") and r.tokens_per_s}

    def ratio(a: str, b: str, want: float, what: str) -> str:
        if a not in by or b not in by:
            return f"- {what}: not measured ({'/'.join(n for n in (a, b) if n not in by)} missing)"
        x = by[a] / by[b]
        return f"- {what}: {x:.3f}x (target >= {want}) {'met' if x >= want else 'NOT met'}"

    return [
        ratio(
            "7b-8l trainer defaults",
            "bare FSDP2 + compile loop, 7b-8l",
            1.0,
            "defaults / bare compile loop",
        ),
        ratio(
            "7b-8l FLOAT8=true",
            "7b-8l trainer defaults",
            1.1,
            "FLOAT8 defaults / compiled bf16 defaults",
        ),
        ratio(
            "7b-8l ACTIVATION_CHECKPOINTING=selective COMPILE=false",
            "7b-8l ACTIVATION_CHECKPOINTING=full COMPILE=false",
            1.0,
            "eager selective / eager full",
        ),
        ratio(
            "7b-8l trainer defaults",
            "torchtitan 0.2.2, compile, AC none, 7b-8l",
            1.0,
            "trainer / torchtitan",
        ),
        ratio(
            "7b-8l trainer defaults",
            "7b-8l COMPILE=false",
            1.0,
            "defaults / eager (the old default)",
        ),
    ]


# --- running (GPU machine only below this line, but for the rehearsal) ----------------------------------


def _env(extra: Mapping[str, str]) -> dict[str, str]:
    env = dict(os.environ)
    paths = [str(ROOT / "src"), str(ROOT / "trainer"), env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    env.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    precision = "fp32" if REHEARSE else "bf16"
    env.update({"DATASET": "builtin", "LOG_INTERVAL": "1", "PRECISION": precision})
    if (
        REHEARSE
    ):  # COMPILE=auto compiles on the GPU: here too, with aot_eager (inductor's C++: minutes)
        env.update(FSDPTRAIN_COMPILE_BACKEND="aot_eager", COMPILE="true")
    env.update(extra)
    return env


def _run(cmd: list[str], env: dict[str, str], timeout: float, log: Path) -> tuple[int, str]:
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
        rc, out = p.returncode, p.stdout + p.stderr
    except subprocess.TimeoutExpired as e:
        rc, out = 124, f"{e.stdout or ''}{e.stderr or ''}"
        out = out if isinstance(out, str) else out.decode(errors="replace")
    log.write_text(out)
    return rc, out


def _torchrun(script: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "1",
        str(script),
    ]


def run_trainer(
    mode: str, settings: Mapping[str, str], timeout: float, log: Path
) -> tuple[int, str]:
    """fsdptrain (mode train) or the bare loop (bare) under torchrun; returns (rc, the event lines' text)."""
    metrics = log.with_suffix(".jsonl")
    metrics.unlink(missing_ok=True)
    cmd = [*_torchrun(Path(__file__).resolve()), mode]
    rc, out = _run(cmd, _env({**settings, "METRICS_FILE": str(metrics)}), timeout, log)
    return rc, metrics.read_text() if metrics.exists() else out


def titan_data(work: Path) -> tuple[Path, Path]:
    """The trainer's own offline assets for torchtitan: its BPE tokenizer directory and its corpus as the
    JSON lines torchtitan's `c4_test` loader reads (`load_dataset(path, split="train")`, a 'text' field)."""
    if str(ROOT / "trainer") not in sys.path:  # as the rows' PYTHONPATH (_env) has it
        sys.path.insert(0, str(ROOT / "trainer"))
    from fsdptrain.assets import ensure_assets

    corpus, tokenizer = ensure_assets(work / "assets")
    data = work / "titan-data"
    data.mkdir(parents=True, exist_ok=True)
    lines = [ln for ln in corpus.read_text().splitlines(keepends=True) if ln.strip()]
    with open(data / "data.json", "w") as f:
        for i in range(0, len(lines), 20):
            f.write(json.dumps({"text": "".join(lines[i : i + 20])}) + "\n")
    return tokenizer, data


def torchtitan_flags(
    settings: Mapping[str, str], tokenizer: Path, data: Path, dump: Path
) -> list[str]:
    """torchtitan 0.2.2's command line for a row: the 7b-8l flavor, the trainer's data and tokenizer, batch 1
    x SEQ_LEN, STEPS steps, a step line per step without colours, AC and compile as the row asks."""
    flags = [
        "--model.name",
        "llama3",
        "--model.flavor",
        TITAN_FLAVOR,
        "--model.hf_assets_path",
        str(tokenizer),
    ]
    flags += ["--training.dataset", "c4_test", "--training.dataset_path", str(data)]
    flags += ["--training.local_batch_size", "1", "--training.seq_len", str(SEQ_LEN)]
    flags += [
        "--training.steps",
        str(STEPS),
        "--lr_scheduler.warmup_steps",
        "2",
        "--optimizer.lr",
        "1e-4",
    ]
    flags += [
        "--metrics.log_freq",
        "1",
        "--metrics.disable_color_printing",
        "--job.dump_folder",
        str(dump),
    ]
    flags += list(TITAN_AC[settings.get("TITAN_AC", "none")])
    if settings.get("TITAN_COMPILE"):
        flags += ["--compile.enable"] + (["--compile.backend", "aot_eager"] if REHEARSE else [])
    return flags


def run_titan(
    settings: Mapping[str, str], timeout: float, log: Path, work: Path
) -> tuple[int, str]:
    tokenizer, data = titan_data(work)
    script = ROOT / "benchmarks" / "peers" / "torchtitan_peer.py"
    cmd = _torchrun(script) + torchtitan_flags(settings, tokenizer, data, work / "titan-out")
    env = _env({"HF_HOME": str(work / "hf"), "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"})
    rc, out = _run(cmd, env, timeout, log)
    return rc, json.dumps({"event": "titan"}) + "\n" + "\n".join(
        json.dumps(e) for e in titan_events(out, SEQ_LEN)
    )


def _last_error(log: Path) -> str:
    lines = [ln for ln in log.read_text().splitlines() if ln.strip()]
    err = [ln for ln in lines if re.search(r"Error|error:|refused|not allowed", ln)]
    return (err or lines or ["no output"])[-1][:200]


class Clock:
    def __init__(self, budget: float) -> None:
        self.end = time.monotonic() + budget

    def left(self) -> float:
        return self.end - time.monotonic()


def _installed(package: str) -> bool:
    import importlib.util

    return not package or importlib.util.find_spec(package) is not None


def run_all(outdir: Path, rows: Sequence[Row] = ROWS) -> list[Record]:
    outdir.mkdir(parents=True, exist_ok=True)
    clock = Clock(BUDGET_S)
    records: list[Record] = []
    full_text = ""  # the uninterrupted resume run's events: the resumed run starts from its step-4 checkpoint
    for row in rows:
        if row.gpu_only and REHEARSE:
            records.append(Record(row.name, "skipped: needs a GPU (CPU rehearsal)"))
            continue
        if not _installed(row.needs):
            records.append(Record(row.name, f"skipped: {row.needs} not installed"))
            continue
        if clock.left() < row.expect * 1.1:
            records.append(
                Record(
                    row.name,
                    f"skipped: {clock.left():.0f} s of budget left, needs ~{row.expect:.0f}",
                )
            )
            continue
        settings = dict(row.settings)
        if row.name.startswith("resume: uninterrupted"):
            settings["CHECKPOINT_DIR"] = str(outdir / "ckpt-full")
        elif row.name.startswith("resume: from step 4"):
            at4 = [
                e.get("path")
                for e in events(full_text)
                if e["event"] == "checkpoint" and e.get("step") == 4
            ]
            if not (at4 and at4[0]):
                records.append(Record(row.name, "skipped: no step-4 checkpoint from the full run"))
                continue
            settings.update(CHECKPOINT_DIR=str(outdir / "ckpt-resumed"), RESUME=str(at4[0]))
        log = outdir / (re.sub(r"[^A-Za-z0-9_.-]+", "_", row.name) + ".log")
        t0 = time.monotonic()
        timeout = min(row.limit, clock.left())
        if row.mode == "titan":
            rc, text = run_titan(settings, timeout, log, outdir)
        else:
            rc, text = run_trainer(row.mode, settings, timeout, log)
        took = time.monotonic() - t0
        if row.name.startswith("resume: uninterrupted"):
            full_text = text
        if rc == 124:
            records.append(Record(row.name, f"FAIL: timed out after {took:.0f} s"))
            continue
        if rc != 0:
            records.append(Record(row.name, f"FAIL: exit {rc}: {_last_error(log)}"))
            continue
        rec = measure(row.name, events(text), warm=WARM if not row.name.startswith("resume") else 1)
        if rec.status == "ok":
            note = lever_note(rec.levers)
            rec.status = f"ok ({took:.0f} s{'; ' + note if note else ''})"
        if row.name.startswith("resume: from step 4") and rec.status.startswith("ok"):
            rec.status = resume_equal(losses(events(full_text)), losses(events(text)))
        records.append(rec)
    return records


def probe() -> int:
    """One line per fact the rows depend on: the GPU (exit 2 without one), versions, the attention kernel
    order, Triton's compiler."""
    import importlib.metadata as md
    import shutil

    if gpu_present() != 0 and not REHEARSE:
        return 2

    def version(name: str) -> str:
        try:
            return md.version(name)
        except md.PackageNotFoundError:
            return "not installed"

    names = (
        "torch",
        "triton",
        "transformers",
        "torchao",
        "torchtitan",
        "datasets",
        "pyarrow",
        "fsspec",
        "tyro",
    )
    print("versions: " + ", ".join(f"{n} {version(n)}" for n in names))
    import torch

    from fsdptrain.levers import triton_compiler

    print(f"sdp priority order (torch's): {torch._C._get_sdp_priority_order()}")
    print(f"triton compiler: {triton_compiler() or 'none'}; gcc at {shutil.which('gcc')}")
    return 0


# --- inside torchrun ----------------------------------------------------------------------------------


def _add_shapes() -> None:
    from fsdptrain import shapes

    shapes.MODEL_CONFIGS.setdefault(SHAPE, shapes.ModelShape(*SHAPE_ARGS))
    if FULL_ARGS is not None:
        shapes.MODEL_CONFIGS.setdefault(FULL, shapes.ModelShape(*FULL_ARGS))


def train_main() -> int:
    _add_shapes()
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
    dev = (
        torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    )
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
            "step_time_s": dt,
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
        print(
            f"gpu_check: no CUDA GPU: torch {torch.__version__} sees none (run it on a GPU machine)"
        )
        return 2
    p = torch.cuda.get_device_properties(0)
    print(
        f"GPU: {p.name}, {p.total_memory / 2**30:.0f} GiB, "
        f"torch {torch.__version__} CUDA {torch.version.cuda}"
    )
    return 0


def report(records: Sequence[Record]) -> str:
    """The table, the targets' ratios, and each row's resolved levers."""
    lines = [table(records), "Targets (issue 30), side by side in this run:", *ratios(records), ""]
    lines += ["Levers as each trainer row resolved them (its `start` event):"]
    lines += [f"- {r.config}: {json.dumps(r.levers, sort_keys=True)}" for r in records if r.levers]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str]) -> int:
    mode = argv[0] if argv else ""
    if mode == "gpu":
        return gpu_present()
    if mode == "probe":
        return probe()
    if mode == "train":
        return train_main()
    if mode == "bare":
        return bare_main()
    if mode == "all" and len(argv) == 2:
        outdir = Path(argv[1])
        records = run_all(outdir)
        md = report(records)
        print(md, end="")
        (outdir / "gpu_check.md").write_text(md)
        if os.environ.get("OUT"):
            Path(os.environ["OUT"], "gpu_check.md").write_text(md)
        return 0 if all(not r.status.startswith("FAIL") for r in records) else 1
    print("usage: gpu_check.py gpu | probe | all OUTDIR | train | bare", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

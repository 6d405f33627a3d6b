"""Benchmarks, measured side by side in one run on this machine; prints a table and writes BENCHMARKS.md.

    make bench            # or: .venv/bin/python benchmarks/run.py [--rounds 2] [--steps 20]

1. Trainer tokens/s against the peers on the same tiny Llama, data, batch, seq and steps, 2 CPU processes:
   Hugging Face accelerate (FSDP2 plugin) and torchtitan, each installed in its own venv under
   benchmarks/.venvs/ (created on first use). Rounds alternate the order; medians are compared.
   The same trainer against a bare fully_shard loop (benchmarks/bare_fsdp.py) at two model sizes: what
   the trainer's own per-step work (metrics, logging, data loading, stop agreement) costs.
2. Per-rank memory (sharded state + bytes held for backward) under each strategy, against NO_SHARD.
3. Start-up time of `fsdpctl --help` and `fsdpctl manifest` against `kubectl version --client`.
4. `fsdpctl plan`'s predicted per-rank memory against the trainer's measurement.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VENVS = ROOT / "benchmarks" / ".venvs"
PY = sys.executable
SEQ, BATCH = 128, 2
PEERS = {
    "accelerate": ["torch==2.13.0", "transformers>=5,<6", "accelerate"],
    "torchtitan": ["torch==2.13.0", "torchtitan", "triton"],
}


def sh(argv, env=None, timeout=900) -> subprocess.CompletedProcess:
    return subprocess.run(
        argv, env={**os.environ, **(env or {})}, capture_output=True, text=True, timeout=timeout
    )


def peer_python(name: str) -> Path:
    venv = VENVS / name
    python = venv / "bin" / "python"
    if not python.exists():
        print(f"creating {venv} ...", flush=True)
        sh([sys.executable, "-m", "venv", str(venv)])
        p = sh([str(python), "-m", "pip", "install", "-q", *PEERS[name]], timeout=1800)
        if p.returncode:
            raise RuntimeError(f"installing {name} failed: {p.stderr[-500:]}")
    return python


def assets() -> tuple[str, str]:
    sys.path.insert(0, str(ROOT / "trainer"))
    from fsdptrain.assets import default_cache, ensure_assets

    corpus, tok = ensure_assets(default_cache())
    return str(corpus), str(tok)


def run_ours(steps: int, **settings) -> dict:
    env = {
        "MODEL": "tiny",
        "SEQ_LEN": str(SEQ),
        "MICRO_BATCH_SIZE": str(BATCH),
        "MAX_STEPS": str(steps),
        "WARMUP_STEPS": "2",
        "LOG_INTERVAL": "1000",
        **{k: str(v) for k, v in settings.items()},
    }
    p = sh(
        [
            PY,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node=2",
            "-m",
            "fsdptrain",
        ],
        env,
    )
    for line in p.stdout.splitlines():
        if line.startswith('{"event":"summary"'):
            return json.loads(line)
    raise RuntimeError(f"fsdptrain failed: {p.stderr[-1500:]}")


def run_accelerate(steps: int, corpus: str, tok: str, precision: str) -> dict:
    python = peer_python("accelerate")
    script = ROOT / "benchmarks" / "peers" / "accelerate_fsdp.py"
    p = sh(
        [
            str(python),
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node=2",
            str(script),
            corpus,
            tok,
            str(steps),
            str(SEQ),
            str(BATCH),
            precision,
        ]
    )
    for line in p.stdout.splitlines():
        if line.startswith('{"peer"'):
            return json.loads(line)
    raise RuntimeError(f"accelerate failed: {(p.stderr or p.stdout)[-1500:]}")


# about 10M parameters (fsdptrain's tiny is 0.92M): 8 layers of hidden 320, the tiny model's vocabulary
MID = {
    "hidden_size": 320,
    "num_hidden_layers": 8,
    "num_attention_heads": 8,
    "num_key_value_heads": 8,
    "intermediate_size": 864,
    "vocab_size": 512,
    "max_position_embeddings": 512,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
    "attention_dropout": 0.0,
}


def mid_model(where: Path) -> tuple[Path, int]:
    """The ~10M Llama as a Hugging Face model dir: fsdptrain takes it as PRETRAINED (no named config of that
    size), the bare loop reads its config.json. Returns (dir, parameter count)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    model = LlamaForCausalLM(LlamaConfig(**MID))
    model.save_pretrained(where)
    return where, sum(p.numel() for p in model.parameters())


def run_bare(
    steps: int,
    corpus: str,
    tok: str,
    precision: str,
    model_dir: Path | None,
    env: dict | None = None,
) -> dict:
    script = ROOT / "benchmarks" / "bare_fsdp.py"
    argv = [str(script), corpus, tok, str(steps), str(SEQ), str(BATCH), precision]
    argv += [str(model_dir)] if model_dir else []
    p = sh([PY, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", *argv], env)
    for line in p.stdout.splitlines():
        if line.startswith('{"peer"'):
            return json.loads(line)
    raise RuntimeError(f"bare loop failed: {(p.stderr or p.stdout)[-1500:]}")


def fsdptrains_malloc() -> dict[str, str]:
    """The glibc malloc thresholds fsdptrain sets on the CPU (fsdptrain.hostmem), as the variables that set
    them for a whole process: the bare loop run under the same allocator settings."""
    sys.path.insert(0, str(ROOT / "trainer"))
    from fsdptrain import hostmem

    return hostmem.environment()


def against_bare(rounds: int, steps: int) -> dict:
    """fsdptrain (logging every 10 steps, as a run would), the bare loop, and the bare loop under fsdptrain's
    malloc thresholds, fp32, alternating rounds."""
    import tempfile

    corpus, tok = assets()
    malloc = fsdptrains_malloc()
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        mid_dir, mid_params = mid_model(Path(tmp) / "llama-10m")
        sizes = {
            "tiny": (None, {"MODEL": "tiny"}),
            "mid": (mid_dir, {"PRETRAINED": mid_dir, "TOKENIZER": tok}),
        }
        for size, (model_dir, model_env) in sizes.items():
            runs = {
                "ours": lambda e=model_env: run_ours(steps, PRECISION="fp32", LOG_INTERVAL=10, **e),
                "bare": lambda d=model_dir: run_bare(steps, corpus, tok, "fp32", d),
                "bare_malloc": lambda d=model_dir: run_bare(steps, corpus, tok, "fp32", d, malloc),
            }
            got: dict[str, list[float]] = {name: [] for name in runs}
            for r in range(rounds):
                for name in list(runs) if r % 2 == 0 else list(runs)[::-1]:
                    got[name].append(runs[name]()["tokens_per_s"])
                    print(
                        f"  {size} round {r + 1}: {name} {got[name][-1]:,.0f} tokens/s", flush=True
                    )
            ratios = [o / b for o, b in zip(got["ours"], got["bare"], strict=True)]
            same_malloc = [o / b for o, b in zip(got["ours"], got["bare_malloc"], strict=True)]
            out[size] = {
                "params": 0.92e6 if size == "tiny" else mid_params,
                **{k: statistics.median(v) for k, v in got.items()},
                **{f"{k}_all": v for k, v in got.items()},
                "ratio": statistics.median(ratios),
                "ratios": ratios,
                "ratio_same_malloc": statistics.median(same_malloc),
                "ratios_same_malloc": same_malloc,
            }
    return out


def run_torchtitan(steps: int) -> dict:
    """torchtitan's own debug Llama config, cut to our batch/seq/steps; it reports its own tokens/s."""
    python = peer_python("torchtitan")
    p = sh(
        [
            str(python),
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node=2",
            "-m",
            "torchtitan.train",
            "--module",
            "llama3",
            "--config",
            "llama3_debugmodel",
            "--training.steps",
            str(steps),
            "--training.local-batch-size",
            str(BATCH),
            "--training.seq-len",
            str(SEQ),
        ],
        timeout=600,
    )
    if p.returncode:
        errors = [li.strip() for li in (p.stderr + p.stdout).splitlines() if "Error:" in li]
        return {"error": errors[0] if errors else f"exit {p.returncode}"}
    tps = [float(x) for x in __import__("re").findall(r"tps: ([\d,.]+)", p.stdout + p.stderr)]
    return {"tokens_per_s": statistics.median(tps[1:] or tps) * 2}


def throughput(rounds: int, steps: int) -> dict:
    corpus, tok = assets()
    out = {}
    for precision in ("fp32", "bf16"):
        runs = {
            "ours": lambda p=precision: run_ours(steps, PRECISION=p),
            "ours_ddp": lambda p=precision: run_ours(
                steps, PRECISION=p, SHARDING_STRATEGY="NO_SHARD"
            ),
            "accelerate": lambda p=precision: run_accelerate(steps, corpus, tok, p),
        }
        got = {name: [] for name in runs}
        for r in range(rounds):
            for name in list(runs) if r % 2 == 0 else list(runs)[::-1]:
                got[name].append(runs[name]()["tokens_per_s"])
                print(
                    f"  {precision} round {r + 1}: {name} {got[name][-1]:,.0f} tokens/s", flush=True
                )
        out[precision] = {
            **{k: statistics.median(v) for k, v in got.items()},
            **{f"{k}_all": v for k, v in got.items()},
        }
    out["torchtitan"] = run_torchtitan(steps)
    return out


def memory(steps: int) -> dict:
    sys.path.insert(0, str(ROOT / "src"))
    from fsdpctl.plan.planner import Job
    from fsdpctl.plan.planner import memory as plan_memory

    out = {}
    for strategy in ("FULL_SHARD", "SHARD_GRAD_OP", "HYBRID_SHARD", "NO_SHARD"):
        for ac in ("none", "full"):
            s = run_ours(
                steps, SHARDING_STRATEGY=strategy, HSDP_SHARD_SIZE=1, ACTIVATION_CHECKPOINTING=ac
            )
            state = s["param_bytes"] + s["grad_bytes"] + s["optim_bytes"]
            job = Job(
                model="tiny",
                instance_type="p5.48xlarge",
                nodes=2,
                gpus_per_node=1,
                strategy=strategy,
                precision="bf16",
                ac=ac,
                ac_every=2,
                micro_batch=BATCH,
                seq_len=SEQ,
                hsdp_shard_size=1,
            )
            out[(strategy, ac)] = {
                "state": state,
                "activations": s["activation_bytes"],
                "measured": state + s["activation_bytes"],
                "planned": plan_memory(job).measured_equivalent,
            }
            print(
                f"  {strategy:<13} ac={ac:<4} state {state / 2**20:.2f} MiB, held for backward "
                f"{s['activation_bytes'] / 2**20:.2f} MiB",
                flush=True,
            )
    return out


def startup(repeats: int = 10) -> dict:
    fsdpctl = str(Path(PY).parent / "fsdpctl")

    def median_time(argv):
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            sh(argv)
            times.append(time.perf_counter() - t0)
        return statistics.median(times)

    out = {
        "fsdpctl --help": median_time([fsdpctl, "--help"]),
        "fsdpctl manifest": median_time([fsdpctl, "manifest"]),
    }
    kubectl = shutil.which("kubectl")
    out["kubectl version --client"] = (
        median_time([kubectl, "version", "--client"]) if kubectl else None
    )
    return out


def bare_section(bare: dict, steps: int, rounds: int) -> list[str]:
    """BENCHMARKS.md's "Trainer vs a bare fully_shard loop" section."""
    fmt = lambda xs: ", ".join(f"{x:,.0f}" for x in xs)  # noqa: E731
    lines = [
        "",
        f"## Trainer vs a bare fully_shard loop (2 processes gloo, fp32, batch {BATCH} x {SEQ} tokens, "
        f"{steps} steps, first step left out; median of {rounds} alternating rounds)",
        "",
        "| model | fsdptrain tokens/s | bare loop tokens/s | ratio (median of rounds) | ratio per round |"
        " bare loop, fsdptrain's malloc: tokens/s | ratio | ratio per round |"
        " fsdptrain rounds | bare rounds | bare, fsdptrain's malloc, rounds |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    per_round = lambda xs: ", ".join(f"{r:.2f}" for r in xs)  # noqa: E731
    for size, b in bare.items():
        lines.append(
            f"| {'tiny' if size == 'tiny' else 'Llama'} {b['params'] / 1e6:.2f}M | {b['ours']:,.0f} | "
            f"{b['bare']:,.0f} | {b['ratio']:.2f} | {per_round(b['ratios'])} | {b['bare_malloc']:,.0f} | "
            f"{b['ratio_same_malloc']:.2f} | {per_round(b['ratios_same_malloc'])} | "
            f"{fmt(b['ours_all'])} | {fmt(b['bare_all'])} | {fmt(b['bare_malloc_all'])} |"
        )
    return lines + [
        "",
        "The bare loop (`benchmarks/bare_fsdp.py`) is the same Hugging Face Llama sharded the same way "
        "(fully_shard per decoder layer and the root), AdamW, clipping at 1.0, the same blocks, and nothing "
        "else. fsdptrain logs every 10 steps (LOG_INTERVAL=10): the loss and gradient norm stay on the "
        "device between logged steps and are read in one all-reduce and one host sync, batches are built "
        "on a background thread, and the step events are made only when read. Rounds run one at a time on a "
        "machine that may be shared: the per-round ratio (the runs back to back) is steadier than either "
        "column, and the ratio is the median of those.",
        "",
        "On the CPU fsdptrain fixes glibc malloc's thresholds (`fsdptrain.hostmem`): left to move with the "
        "process's history, they made a step's freed buffers go back to the kernel and be page-faulted in "
        "again, which cost fsdptrain 10-20% at ~10M parameters (twice the bare loop's minor faults) and "
        "made either program's speed change from run to run. The third column runs the bare loop under the "
        "same thresholds (glibc's MALLOC_*_ variables), so the like-for-like ratio is there too.",
    ]


def write_report(tp: dict, bare: dict, mem: dict, st: dict, args) -> str:
    cpu = next(
        (
            li.split(":", 1)[1].strip()
            for li in Path("/proc/cpuinfo").read_text().splitlines()
            if li.startswith("model name")
        ),
        platform.processor(),
    )
    lines = [
        "# Benchmarks",
        "",
        f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} by "
        f"`benchmarks/run.py` on {os.cpu_count()} x {cpu}, torch 2.13.0 CPU, side by side in one run. "
        "Ratios matter, absolute numbers depend on the machine.",
        "",
        f"## 1. Trainer throughput (tiny Llama 0.92M params, 2 processes gloo, batch {BATCH} x {SEQ} tokens, "
        f"{args.steps} steps, FULL_SHARD; median of {args.rounds} alternating rounds)",
        "",
        "| trainer | precision | tokens/s | ratio to accelerate | rounds |",
        "|---|---|---|---|---|",
    ]
    for precision in ("fp32", "bf16"):
        t = tp[precision]
        fmt = lambda xs: ", ".join(f"{x:,.0f}" for x in xs)  # noqa: E731
        lines += [
            f"| fsdptrain FULL_SHARD | {precision} | {t['ours']:,.0f} | {t['ours'] / t['accelerate']:.2f} | "
            f"{fmt(t['ours_all'])} |",
            f"| fsdptrain NO_SHARD | {precision} | {t['ours_ddp']:,.0f} | "
            f"{t['ours_ddp'] / t['accelerate']:.2f} | {fmt(t['ours_ddp_all'])} |",
            f"| HF accelerate (asked for FSDP2, runs DDP on CPU) | {precision} | {t['accelerate']:,.0f} | "
            f"1.00 | {fmt(t['accelerate_all'])} |",
        ]
    titan = tp["torchtitan"]
    if "error" in titan:
        lines.append(
            f"| torchtitan 0.3.0 | - | did not run on CPU: `{titan['error'][:120]}` | - | - |"
        )
    else:
        lines.append(
            f"| torchtitan | fp32 | {titan['tokens_per_s']:,.0f} | "
            f"{tp['fp32']['ours'] / titan['tokens_per_s']:.2f} | - |"
        )
    lines += [
        "",
        "accelerate 1.x on CPU does not apply its FSDP plugin: `Accelerator(cpu=True, fsdp_plugin=...)` "
        "under torchrun reports `DistributedType.MULTI_CPU` and wraps the model in `DistributedDataParallel` "
        "(checked in this run's venv), so its row is DDP, and fsdptrain's NO_SHARD row is the like-for-like "
        "one. On a 0.92M-parameter model the step is mostly fixed framework cost: FSDP2's per-layer hooks "
        "and DTensor dispatch in the optimizer cost fsdptrain tens of milliseconds per step that DDP does "
        "not pay; the gap says nothing about large models, where compute dominates.",
        "",
        "bf16 here means FSDP2's MixedPrecisionPolicy for fsdptrain (parameters cast to bf16, every matmul "
        "in bf16) and CPU autocast for accelerate (only some ops in bf16); on a CPU without bf16 units, "
        "bf16 matmuls are several times slower than fp32, so the fp32 row is the like-for-like one.",
    ]
    lines += bare_section(bare, args.steps, args.bare_rounds)
    lines += [
        "",
        "## 2. Per-rank memory by strategy (2 ranks; sharded params + grads + AdamW state, plus bytes held "
        "for backward)",
        "",
        "| strategy | checkpointing | state MiB | state / NO_SHARD | held for backward MiB |"
        " plan predicted MiB | measured MiB | plan error |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for (strategy, ac), m in mem.items():
        base = mem[("NO_SHARD", ac)]["state"]
        lines.append(
            f"| {strategy} | {ac} | {m['state'] / 2**20:.2f} | {m['state'] / base:.2f} | "
            f"{m['activations'] / 2**20:.2f} | {m['planned'] / 2**20:.2f} | {m['measured'] / 2**20:.2f} | "
            f"{100 * (m['planned'] - m['measured']) / m['measured']:+.1f}% |"
        )
    lines += [
        "",
        "HYBRID_SHARD here is 2 groups of 1 (one rank per simulated node), so it holds what NO_SHARD holds.",
        "",
        "## 3. Start-up time (median of 10)",
        "",
        "| command | seconds | ratio to kubectl |",
        "|---|---|---|",
    ]
    k = st["kubectl version --client"]
    for cmd, secs in st.items():
        lines.append(
            f"| `{cmd}` | {secs:.3f} | {secs / k:.2f} |" if k else f"| `{cmd}` | {secs:.3f} | - |"
        )
    lines += [
        "",
        "## GPU",
        "",
        "`benchmarks/gpu_check.sh` is the one GPU check (smoke of every one-GPU strategy, resume equality on "
        "CUDA, a Llama-2-7B-shaped run with each lever on and off, a bare FSDP2 + compile loop beside it; "
        "under 8 minutes on one H200); it prints one table to paste here. Not yet run on a GPU from this "
        "branch. `benchmarks/gpu.sh` trains all of Llama-2-7B in bf16 on one GPU with full activation "
        "checkpointing. Published FSDP figures to compare with: next section.",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--bare-rounds", type=int, default=4)
    ap.add_argument(
        "--only-bare", action="store_true", help="run only the bare-loop rows and print them"
    )
    args = ap.parse_args()
    if args.only_bare:
        bare = against_bare(args.bare_rounds, args.steps)
        print(json.dumps(bare, indent=1))
        print("\n".join(bare_section(bare, args.steps, args.bare_rounds)))
        return
    print("throughput ...", flush=True)
    tp = throughput(args.rounds, args.steps)
    print("against a bare fully_shard loop ...", flush=True)
    bare = against_bare(args.bare_rounds, args.steps)
    print("memory ...", flush=True)
    mem = memory(steps=3)
    print("start-up ...", flush=True)
    st = startup()
    report = write_report(tp, bare, mem, st, args)
    (ROOT / "BENCHMARKS.md").write_text(report)
    # the planner-against-published section is data, not a measurement: appended by its own script
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "published.py")], check=True)
    # and the commands' start-up CPU, by its own script too
    subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "cli_start.py"), "--write"], check=True
    )
    print((ROOT / "BENCHMARKS.md").read_text())


if __name__ == "__main__":
    main()

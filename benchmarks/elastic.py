"""A lost node on the local backend, with and without an elastic range (issue 43), in one run:

    PYTHONPATH=src:trainer .venv/bin/python benchmarks/elastic.py [--steps 40] [--interval 5] \
        [--lose-at 12] [--away 60] [--markdown] [--write]

Both legs: tiny model, 3 simulated nodes (a network namespace each when root, else loopback), a
checkpoint every --interval steps, node 1 lost (engine.lose: every process of its pod SIGKILLed,
no pod made again) once the job logged step --lose-at, and back (engine.bring_back) --away seconds
later. `elastic`: MIN_NODES=2; `today`: MIN_NODES=0 (= JOB_NODES, the behaviour before: the
survivors wait for the third node); `uninterrupted`: no node lost, the losses the others are held to.
Per leg: (a) seconds from the loss to the first step trained
after it, and on how many nodes; (b) steps lost (the highest step logged before the resume, past the
checkpoint resumed); (c) seconds from the node's return to the first step on 3 nodes; the restarts
`job status` counts and the final phase; (d) the largest difference of a step's loss from the
uninterrupted run's at the same step, relative, over every step both trained (TOLERANCE states what
is accepted: the batch rule keeps the global batch and the data position is exact, so only the
order of float sums differs). Prints JSON, or a Markdown table with --markdown; --write
puts that table in BENCHMARKS.md between its `elastic` markers (the prose around it stays).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from fsdpctl.backends.local import engine as local
from fsdpctl.backends.local.backend import LocalBackend
from fsdpctl.backends.local.report import job_report
from fsdpctl.job import policy as jobpolicy
from fsdpctl.job import record, world
from fsdpctl.settings import load
from fsdptrain import events


def _step() -> int:
    state = local.read_state(local.job_dir("bench"))
    return int(job_report(state, float("inf"))["step"]) if state else 0


def _ended() -> bool:
    state = local.read_state(local.job_dir("bench"))
    return state is not None and local.effective_phase(state) in ("Failed", "Succeeded")


def _wait(step: int, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while _step() < step:
        if time.monotonic() > deadline:
            raise SystemExit(f"no step {step} in {timeout:.0f} s")
        time.sleep(0.2)


# (d)'s bound: a world of 2 sums the same gradients in another order than one of 3 (fp32, gloo)
TOLERANCE = 0.01


def leg(
    home: Path, *, min_nodes: int, args: argparse.Namespace, lose: bool = True
) -> dict[str, Any]:
    """One job: started, node 1 lost at --lose-at, back --away s later (unless not `lose`), waited
    for to its end."""
    os.environ["FSDPCTL_HOME"] = str(home)
    cfg = load(
        dotenv={
            "SEQ_LEN": "64",
            "PRECISION": "fp32",
            "WARMUP_STEPS": "2",
            "JOB_NAME": "bench",
            "JOB_NODES": "3",
            "MIN_NODES": str(min_nodes),
            "MAX_STEPS": str(args.steps),
            "CHECKPOINT_INTERVAL": str(args.interval),
            "MAX_RESTARTS": "3",
            "GRAD_ACCUM_STEPS": "2",
            "LOG_INTERVAL": "1",
        }
    )
    infra, job = LocalBackend(cfg)._rendered(jobpolicy.new_run_id("bench"), "bench")
    local.start(job, secret_env={}, prestep=next((o for o in infra if o["kind"] == "Job"), None))
    lost_at = back_at = float("inf")
    if lose:
        _wait(args.lose_at)
        lost_at = time.time()
        local.lose("bench", 1)
        while time.time() < lost_at + args.away and not _ended():
            time.sleep(0.2)
        back_at = time.time()
        local.bring_back("bench", 1)
    state = local.wait("bench", timeout=1200)
    if state is None:
        raise SystemExit("the job's state is gone")
    lines = LocalBackend(cfg).run_lines("bench", state["run_id"]) or []
    report = job_report(state, float("inf"))
    return {
        "min_nodes": min_nodes or 3,
        "phase": report["phase"],
        "step": report["step"],
        "restarts": report["restarts"],
        "world_changes": report.get("world_changes", []),
        "losses": record.losses(lines),
        **(_timings(lines, lost_at, back_at) if lose else {}),
    }


def loss_gap(run: dict[str, Any], reference: dict[str, Any]) -> float | None:
    """(d): max over the steps both trained of |loss - reference| / reference; None if none."""
    ref = reference["losses"]
    gaps = [abs(v - ref[k]) / abs(ref[k]) for k, v in run["losses"].items() if k in ref and ref[k]]
    return round(max(gaps), 5) if gaps else None


def _timings(lines: list[str], lost_at: float, back_at: float) -> dict[str, Any]:
    """(a), (b), (c) from the trainer's own events: step lines (rank 0's, with their times), the
    `world` events, the start events (each world's first step follows its start)."""
    evs = list(events.parse(lines))
    steps = [e for e in evs if isinstance(e, events.Step)]
    resumes = sorted(
        (e for e in evs if isinstance(e, events.Start) and e.time > lost_at), key=lambda e: e.time
    )
    # the old world's last step may be logged just after the kill: the resume's start divides them
    cut = resumes[0].time if resumes else float("inf")
    before = max((e.step for e in steps if e.time < cut), default=0)
    after = [e for e in steps if e.time > cut]
    first = min(after, key=lambda e: e.time) if after else None
    worlds = world.changes(lines)
    on_two = next((c for c in worlds if c["to_nodes"] == 2), None)
    regrown = next((c for c in worlds if c["to_nodes"] == 3), None)
    on_three = (
        min((e.time for e in steps if e.time > back_at and e.step > regrown["step"]), default=None)
        if regrown
        else min((e.time for e in steps if e.time > back_at), default=None)
    )
    resumed = resumes[0].start_step if resumes else None
    return {
        "a_first_step_after_loss_s": round(first.time - lost_at, 1) if first else None,
        "a_nodes": 2 if on_two else 3,
        "b_steps_lost": before - resumed if resumed is not None else None,
        "c_back_to_3_nodes_s": round(on_three - back_at, 1) if on_three else None,
    }


def markdown(rows: list[dict[str, Any]], args: argparse.Namespace, load_avg: str) -> str:
    head = (
        "| leg | (a) loss → first step | on | (b) steps lost | (c) return → step on 3 | restarts "
        "| phase | (d) loss vs uninterrupted |\n|---|---|---|---|---|---|---|---|\n"
    )
    body = "".join(
        f"| MIN_NODES={r['min_nodes']} | {r['a_first_step_after_loss_s']} s | {r['a_nodes']} nodes "
        f"| {r['b_steps_lost']} (K={args.interval}) | {r['c_back_to_3_nodes_s']} s | {r['restarts']} "
        f"| {r['phase']} at step {r['step']} | {_gap_text(r.get('loss_gap'))} |\n"
        for r in rows
    )
    return (
        f"3 nodes, tiny model, CHECKPOINT_INTERVAL={args.interval}, MAX_STEPS={args.steps}; node 1 "
        f"lost after step {args.lose_at}, back {args.away} s later; load average at the start "
        f"{load_avg}.\n\n" + head + body
    )


def _gap_text(gap: float | None) -> str:
    if gap is None:
        return "-"
    return f"{gap:.2%} ({'within' if gap <= TOLERANCE else 'over'} {TOLERANCE:.0%})"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--interval", type=int, default=5)
    p.add_argument("--lose-at", type=int, default=12)
    p.add_argument("--away", type=float, default=60.0)
    p.add_argument("--markdown", action="store_true")
    p.add_argument("--write", action="store_true", help="the table into BENCHMARKS.md")
    args = p.parse_args()
    load_avg = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    with tempfile.TemporaryDirectory(prefix="fsdpctl-elastic-") as tmp:
        rows = [
            leg(Path(tmp) / "elastic", min_nodes=2, args=args),
            leg(Path(tmp) / "today", min_nodes=0, args=args),
        ]
        reference = leg(Path(tmp) / "uninterrupted", min_nodes=0, args=args, lose=False)
    for r in rows:
        r["loss_gap"] = loss_gap(r, reference)
    table = markdown(rows, args, load_avg)
    if args.write:
        write(table)
    print(table if args.markdown else json.dumps(rows, indent=1, default=str))
    return 0


BENCHMARKS = Path(__file__).resolve().parent.parent / "BENCHMARKS.md"
START, END = "<!-- elastic:start -->", "<!-- elastic:end -->"


def write(table: str) -> None:
    """The measured lines (from the one after the heading up to the table's end) replaced in the
    section between the markers; the heading and the explanation after the table are kept."""
    text = BENCHMARKS.read_text()
    head, _, rest = text.partition(START)
    section, _, tail = rest.partition(END)
    lines = section.strip("\n").splitlines()
    heading = lines[0]
    after = [i for i, line in enumerate(lines) if line.startswith("|")]
    prose = lines[after[-1] + 1 :] if after else []
    body = "\n".join([heading, "", table.strip(), *prose])
    BENCHMARKS.write_text(f"{head}{START}\n{body}\n{END}{tail}")


if __name__ == "__main__":
    sys.exit(main())

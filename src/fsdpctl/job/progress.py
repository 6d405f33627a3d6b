"""Training progress from the trainer's JSON log lines (pure): what `job status` and `job run`
show."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from fsdpctl.job.reports import FINAL, Phase, Progress
from fsdptrain import events


def parse_events(lines: Iterable[str]) -> list[events.Event]:
    """The trainer's typed events in a log (other lines, and a line cut by a crash, are skipped)."""
    return list(events.parse(lines))


def across_runs(runs: Sequence[Sequence[events.Event]]) -> list[events.Event]:
    """The events of a job's runs, oldest first, as one curve: each run's steps from where it
    started (its `start` event's step) on replace what the runs before it logged after that step;
    the last run's events are all kept (its summary, its checkpoints). A run with no start event (it
    never trained) adds nothing but its steps."""
    merged: list[events.Event] = []
    for i, run in enumerate(runs):
        start = next((e.start_step for e in run if isinstance(e, events.Start)), None)
        if start is not None:
            merged = [e for e in merged if not (isinstance(e, events.Step) and e.step > start)]
        last = i == len(runs) - 1
        merged += [e for e in run if last or isinstance(e, events.Step)]
    return merged


def run_outcome(recs: Sequence[events.Event], phase: str | None = None) -> str:
    """How a run ended, in words, from its trainer's events; `phase`: the job's phase when this is
    its current run (what the processes did), else the run is over and its events say all there is.
    """
    steps = [e.step for e in recs if isinstance(e, events.Step | events.Finished)]
    summary = next((e for e in reversed(recs) if isinstance(e, events.Summary)), None)
    at = f" at step {max(steps)}" if steps else " before its first step"
    if phase is not None and (phase == "Failed" or summary is None):
        return f"{phase}{at}"  # its processes' own verdict, the job's phase
    if summary is not None:
        return f"{'Stopped' if summary.stopped else 'Succeeded'} at step {summary.start_step + summary.steps}"
    if any(isinstance(e, events.Finished) for e in recs):
        return f"Succeeded{at} (its last checkpoint was at MAX_STEPS already)"
    return f"ended without a summary{at} (failed or killed)"


RENDEZVOUS_JOIN = (
    "Rendezvous'ing worker group"  # torchrun's agent entering a round (elastic agent api.py)
)


def stage(recs: Sequence[events.Event], joined: int | None, nodes: int) -> str:
    """What a run does before its first step, from its trainer's events and, before those, how many
    nodes' agents entered the rendezvous (`joined`; None where their logs cannot be read)."""
    start = next((e for e in reversed(recs) if isinstance(e, events.Start)), None)
    if start is not None:
        return f"first step (after step {start.start_step})" if start.start_step else "first step"
    built = next((e for e in reversed(recs) if isinstance(e, events.Stage)), None)
    if built is not None:
        return built.stage
    if any(isinstance(e, events.Leader) for e in recs):
        return "process group ready"
    return f"rendezvous {joined}/{nodes}" if joined is not None else "waiting for the rendezvous"


def progress(recs: Sequence[events.Event], now: float) -> Progress:
    steps = [r for r in recs if isinstance(r, events.Step)]
    summary = next((r for r in reversed(recs) if isinstance(r, events.Summary)), None)
    ckpt = next((r for r in reversed(recs) if isinstance(r, events.Checkpoint)), None)
    out: Progress = {
        "step": 0,
        "max_steps": None,
        "percent": 0.0,
        "loss": None,
        "tokens_per_s": None,
        "eta_s": None,
        "last_progress_s": None,
        "checkpoint": ckpt.path if ckpt else None,
        "summary": events.as_record(summary) if summary else None,
    }
    if not steps:
        done = next((r for r in reversed(recs) if isinstance(r, events.Finished)), None)
        return out if done is None else _finished(out, done)
    last = steps[-1]
    recent = steps[-10:]
    step_time = sum(r.step_time_s for r in recent) / len(recent)
    return {
        **out,
        "step": last.step,
        "max_steps": last.max_steps,
        "percent": 100.0 * last.step / last.max_steps,
        "loss": last.loss,
        "tokens_per_s": last.tokens_per_s,
        "mfu": last.mfu,
        "eta_s": (last.max_steps - last.step) * step_time,
        "last_progress_s": max(0.0, now - last.time),
    }


def _finished(out: Progress, done: events.Finished) -> Progress:
    """Where a run got to when all a reader has is a launcher's `finished` line (the leader's log
    went with its pod): the last checkpoint's step and loss; no rate, no time of a last step."""
    return {
        **out,
        "step": done.step,
        "max_steps": done.max_steps,
        "percent": 100.0 * done.step / done.max_steps,
        "loss": done.loss,
        "checkpoint": out["checkpoint"] or done.checkpoint,
    }


def stalled(phase: str, prog: Progress, idle_s: float | None, stall_after: float) -> bool:
    """Running with no step finished for `stall_after` s (counted from the start until the first
    step)."""
    stale = prog["last_progress_s"] if prog["step"] else idle_s
    return phase == Phase.RUNNING and stale is not None and stale > stall_after


def hung_warning(stall_after: float) -> str:
    return f"no training step finished for over {fmt_duration(stall_after)}: the job may be hung"


def progress_rows(r: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The progress lines of `job status`, from a report holding `progress()`'s fields."""
    if not r["max_steps"]:
        return [("progress", r.get("stage") or "no step finished yet")]
    ended = r.get("phase") in FINAL  # nothing left to estimate
    eta = "" if ended else f", ETA {fmt_duration(r['eta_s'])}"
    rows = [("progress", f"step {r['step']}/{r['max_steps']} ({r['percent']:.0f}%){eta}")]
    if r["loss"] is not None:
        rows.append(("loss", f"{r['loss']:.4f}"))
    if r["tokens_per_s"] is None:  # a launcher's `finished` line alone: no step was seen
        return rows
    return [
        *rows,
        (
            "throughput",
            f"{r['tokens_per_s']:.0f} tokens/s (last step)"
            + (f", MFU {r['mfu']:.1%}" if r.get("mfu") else ""),
        ),
        ("last step", f"{fmt_duration(r['last_progress_s'])} ago"),
    ]


def step_and_loss(r: Mapping[str, Any]) -> tuple[str, str]:
    """The step and loss cells of `job list`."""
    step = f"{r['step']}/{r['max_steps']}" if r["max_steps"] else "-"
    return step, f"{r['loss']:.4f}" if r["loss"] is not None else "-"


def fmt_duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = int(seconds)
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else (f"{m}m{s:02d}s" if m else f"{s}s")


def describe(event: events.Event) -> str:
    """One trainer event as the short human line `job logs` prints for its JSON line."""
    if isinstance(event, events.Step):
        extra = f" MFU {event.mfu:.1%}" if event.mfu else ""
        return (
            f"step {event.step}/{event.max_steps} loss {event.loss:.4f} {event.tokens_per_s:.0f} tokens/s "
            f"{event.step_time_s:.2f} s/step{extra}"
        )
    if isinstance(event, events.Checkpoint):
        return f"checkpoint at step {event.step}: {event.path}"
    if isinstance(event, events.Leader):
        return f"leader: node rank {event.node_rank} on {event.hostname}, {event.world} processes"
    if isinstance(event, events.Stage):
        return f"stage: {event.stage}"
    if isinstance(event, events.Start):
        cuda = f"CUDA {event.cuda}, NCCL {event.nccl}" if event.cuda else "no CUDA"
        return (
            f"start: torch {event.torch}, transformers {event.transformers}, {cuda} on {event.device}, "
            f"from step {event.start_step}"
            + (f", record {event.record_id}" if event.record_id else "")
        )
    if isinstance(event, events.Finished):
        return (
            f"finished already: the run's checkpoint {event.checkpoint} is at step "
            f"{event.step}/{event.max_steps}, nothing left to train"
        )
    if isinstance(event, events.World):
        return _world_line(event)
    what = "stopped" if event.stopped else "done"
    return (
        f"{what}: {event.steps} steps (from step {event.start_step}), loss {event.first_loss:.4f} -> "
        f"{event.final_loss:.4f}, {event.tokens_per_s:.0f} tokens/s"
        + (f", checkpoint {event.checkpoint}" if event.checkpoint else "")
    )


def _world_line(event: events.World) -> str:
    """A resume on another world size (fsdptrain.elastic), in nodes where the trainer knew both."""
    nodes = (
        f" ({event.from_nodes} -> {event.to_nodes} nodes)"
        if event.from_nodes is not None and event.from_nodes != event.to_nodes
        else ""
    )
    batch = (
        f"global batch kept at {event.global_batch} by gradient accumulation {event.grad_accum}"
        if event.rule == "constant"
        else f"per-rank batch kept: global batch {event.global_batch}, "
        f"not the job's {event.target_global_batch}"
    )
    return (
        f"world: {event.from_world} -> {event.to_world} processes{nodes} from the checkpoint at "
        f"step {event.step}, {batch}"
    )

"""Training progress from the trainer's JSON log lines (pure): what `job status` and `job run` show."""

from __future__ import annotations

import json
from typing import Iterable


def records(lines: Iterable[str]) -> list[dict]:
    out = []
    for line in lines:
        line = line.strip()
        if line.startswith('{"event"'):
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:  # a line cut by a crash mid-write
                continue
    return out


def progress(recs: list[dict], now: float) -> dict:
    steps = [r for r in recs if r["event"] == "step"]
    summary = next((r for r in reversed(recs) if r["event"] == "summary"), None)
    ckpt = next((r for r in reversed(recs) if r["event"] == "checkpoint"), None)
    out: dict = {"step": 0, "max_steps": None, "percent": 0.0, "loss": None, "tokens_per_s": None,
                 "eta_s": None, "last_progress_s": None, "checkpoint": ckpt["path"] if ckpt else None,
                 "summary": summary}
    if not steps:
        return out
    last = steps[-1]
    recent = steps[-10:]
    step_time = sum(r["step_time_s"] for r in recent) / len(recent)
    out.update(step=last["step"], max_steps=last["max_steps"], percent=100.0 * last["step"] / last["max_steps"],
               loss=last["loss"], tokens_per_s=last["tokens_per_s"], mfu=last.get("mfu"),
               eta_s=(last["max_steps"] - last["step"]) * step_time, last_progress_s=max(0.0, now - last["time"]))
    return out


def fmt_duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = int(seconds)
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else (f"{m}m{s:02d}s" if m else f"{s}s")

"""`job wait --for`: a condition on a job's report to wait for, as `kubectl wait --for` waits for a
condition of an object (kubectl's `--for=condition=Ready`, `--for=jsonpath=...`), instead of a pace a
script or walkthrough assumes (pure: the CLI polls the backend and asks `met`).

    step=N        the trainer has finished step N (or the job ended past it)
    checkpoint    a checkpoint has been published (the report's newest checkpoint is set)
    phase=P       the job is in phase P (Running, Succeeded, ...: reports.Phase)

Unknown (the place gave no answer) is never read as met nor as ended: the wait goes on.
"""

from __future__ import annotations

from dataclasses import dataclass

from fsdpctl.errors import BadInput
from fsdpctl.job.reports import FINAL, Phase, Report

FORMS = "step=N, checkpoint or phase=P (e.g. --for step=100)"


@dataclass(frozen=True)
class Condition:
    kind: str  # "step", "checkpoint", "phase"
    step: int = 0
    phase: Phase | None = None

    def __str__(self) -> str:
        if self.kind == "step":
            return f"step {self.step}"
        return "a checkpoint" if self.kind == "checkpoint" else f"phase {self.phase}"


def parse(text: str) -> Condition:
    """The condition `--for` names; bad input (the value and the forms) otherwise."""
    key, eq, value = text.strip().partition("=")
    if key == "step" and eq and value.isdigit() and len(value) <= 12:
        return Condition("step", step=int(value))
    if key == "checkpoint" and not eq:
        return Condition("checkpoint")
    if key == "phase" and eq:
        found = next((p for p in Phase if p.value.lower() == value.lower()), None)
        if found is not None:
            return Condition("phase", phase=found)
        names = ", ".join(p.value for p in Phase)
        raise BadInput(f"--for {text!r}: no phase {value!r}", hint=f"one of {names}")
    raise BadInput(f"--for {text!r} is not a condition", hint=f"use {FORMS}")


def met(cond: Condition, r: Report) -> bool:
    """Whether the report shows the condition (an Unknown report shows nothing)."""
    if r["phase"] == Phase.UNKNOWN:
        return False
    if cond.kind == "step":
        return r["step"] >= cond.step
    if cond.kind == "checkpoint":
        return bool(r["checkpoint"])
    return r["phase"] == cond.phase


def unreachable(cond: Condition, r: Report) -> str | None:
    """Why the condition can no longer be met (the job ended short of it), or None."""
    if r["phase"] not in FINAL or met(cond, r):
        return None
    return f"the job ended ({r['phase']} at step {r['step']}) before {cond}"

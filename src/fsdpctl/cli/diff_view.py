"""`job diff`'s screen (-o table): the two runs, what differs part by part, and the loss curves
compared: one verdict line, then the steps where they part (LOSS_ROWS of them; -o json has every
step)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.table import Table

from fsdpctl.cli.common import out

if TYPE_CHECKING:
    from collections.abc import Mapping

    from fsdpctl.job.record_view import LossRow, RecordDiff


def print_diff(d: RecordDiff) -> None:
    """Both runs named, then each part ("same", or KEY: A -> B), then the losses."""
    out.print(
        f"A: record {d['a']['id']} (job {d['a']['job']}, run {d['a']['run_id']})", markup=False
    )
    out.print(
        f"B: record {d['b']['id']} (job {d['b']['job']}, run {d['b']['run_id']})", markup=False
    )
    parts: Mapping[str, dict[str, list[Any]]] = {
        k: d[k] for k in ("settings", "placement", "versions", "data", "world")
    }
    for part in parts:
        if not parts[part]:
            out.print(f"{part}: same", markup=False)
            continue
        out.print(f"{part}:", markup=False)
        for key, (x, y) in parts[part].items():
            out.print(f"  {key}: {shown(x)} -> {shown(y)}", markup=False, highlight=False)
    _print_losses(d["losses"])


def _print_losses(rows: list[LossRow]) -> None:
    out.print(loss_verdict(rows), markup=False, highlight=False)
    differing = [r for r in rows if _delta(r) != 0.0]
    if differing:
        out.print(_loss_table(differing[:LOSS_ROWS]))
        if len(differing) > LOSS_ROWS:
            out.print(
                f"... {len(differing) - LOSS_ROWS} more steps differ (-o json has every step)"
            )


LOSS_ROWS = 20  # the differing steps shown; -o json holds them all


def shown(value: Any) -> str:
    return "(empty)" if value in ("", None) else str(value)


def _delta(r: LossRow) -> float | None:
    """B - A at one step; None where only one run logged it."""
    return r["b"] - r["a"] if r["a"] is not None and r["b"] is not None else None


def loss_verdict(rows: list[LossRow]) -> str:
    """The loss curves compared in one line: the same at every step both logged, or where and by
    how much they part; steps only one of the runs logged are counted apart."""
    if not rows:
        return "losses: neither run logged a step"
    both = [r for r in rows if _delta(r) is not None]
    only = len(rows) - len(both)
    apart = f"; {only} steps only one run logged" if only else ""
    differ = [r for r in both if _delta(r) != 0.0]
    if not both:
        return f"losses: no step logged by both runs{apart}"
    if not differ:
        return f"losses: the same at all {len(both)} steps both runs logged{apart}"
    first = differ[0]
    worst = max(differ, key=lambda r: abs(_delta(r) or 0.0))
    return (
        f"losses: B differs from A at {len(differ)} of {len(both)} steps (first at step "
        f"{first['step']}: {_num(first['a'])} vs {_num(first['b'])}; largest |B - A| "
        f"{abs(_delta(worst) or 0.0):.6f} at step {worst['step']}){apart}"
    )


def _loss_table(rows: list[LossRow]) -> Table:
    t = Table(title="loss where they differ", title_justify="left", box=None, pad_edge=False)
    for col in ("step", "A", "B", "B - A"):
        t.add_column(col, justify="right")
    for r in rows:
        t.add_row(*(str(r["step"]), _num(r["a"]), _num(r["b"]), _num(_delta(r))))
    return t


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.6f}"

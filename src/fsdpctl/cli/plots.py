"""Pictures of a run from the trainer's step lines: the loss and tokens/s curves drawn in the
terminal (plotext) for `job status` and the quickstart, and a PNG of loss, learning rate, tokens/s
and MFU over steps (matplotlib) for `job plot`. The libraries load inside the functions: the CLI
starts without them."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from fsdpctl import files
from fsdptrain import events


@dataclass(frozen=True)
class Panel:
    field: str  # the step record's field
    title: str
    why_empty: str  # what an empty panel says


PNG_PANELS = (
    Panel("loss", "loss", "no steps"),
    Panel("lr", "learning rate", "not in these step lines (an older trainer)"),
    Panel("tokens_per_s", "tokens/s (whole job)", "no steps"),
    Panel("mfu", "MFU", "unknown peak TFLOP/s on this device (set PEAK_TFLOPS)"),
)
TERMINAL_PANELS = (PNG_PANELS[0], PNG_PANELS[2])
PNG_SIZE_IN = (12.0, 8.0)
PNG_DPI = 100


def steps_of(recs: Sequence[events.Event]) -> list[events.Step]:
    """The step events of a log, the latest of each step number (a resumed run redoes the steps
    after its checkpoint), in step order."""
    latest = {e.step: e for e in recs if isinstance(e, events.Step)}
    return [latest[s] for s in sorted(latest)]


def series(steps: Sequence[events.Step], field: str) -> tuple[list[int], list[float]]:
    """(steps, values) of one field, where it was measured (None: left out)."""
    pairs = [
        (s.step, getattr(s, field)) for s in steps if isinstance(getattr(s, field), (int, float))
    ]
    return [p[0] for p in pairs], [float(p[1]) for p in pairs]


def terminal_plot(steps: Sequence[events.Step], width: int, height: int = 24) -> str:
    """Loss above tokens/s over steps, `width` columns by `height` lines, without colour codes (the
    same text on every terminal and in a file)."""
    import plotext

    plotext.terminal.limit(
        False, False
    )  # the size asked for, not the size of whatever terminal this is
    fig = plotext.figure
    fig.clear()
    fig.plot_size(width, height)  # shared by the panels, one above the other
    fig.subplots(len(TERMINAL_PANELS), 1)
    for row, panel in enumerate(TERMINAL_PANELS, 1):
        sub = fig.subplot(row, 1)
        sub.title(f"{panel.title} by step")
        xs, ys = series(steps, panel.field)
        if xs:
            sub.draw(sub.signal(xs, ys).lines())
    text: str = fig.build().string(colorless=True)
    fig.clear()
    return "\n".join(line.rstrip() for line in text.splitlines())


def write_png(steps: Sequence[events.Step], path: Path, title: str) -> None:
    """Four panels (loss, learning rate, tokens/s, MFU) over steps; a panel without data says why.
    Written to a temp file beside `path`, then renamed: a reader never sees half a PNG."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=PNG_SIZE_IN, dpi=PNG_DPI, layout="constrained")
    FigureCanvasAgg(fig)  # the Agg renderer: no display needed
    fig.suptitle(title)
    for ax, panel in zip(fig.subplots(2, 2).flat, PNG_PANELS, strict=True):
        ax.set_title(panel.title)
        ax.set_xlabel("step")
        xs, ys = series(steps, panel.field)
        if xs:
            ax.plot(xs, ys, marker="." if len(xs) < 50 else None)
            ax.grid(alpha=0.3)
        else:
            ax.text(
                0.5,
                0.5,
                f"no data: {panel.why_empty}",
                ha="center",
                va="center",
                transform=ax.transAxes,
            )
            ax.set_xticks([])
            ax.set_yticks([])
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = files.temp_beside(path, 0o644)  # a random name: nothing planted is written through
    try:
        with os.fdopen(fd, "wb") as f:
            fig.savefig(f, format="png")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)

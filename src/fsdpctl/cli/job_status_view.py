"""`job status` on the terminal: the status table, its warnings, the view redrawn while the job
runs (`job status -w`) and the loss curves. Shared by `job` and `quickstart`."""

from __future__ import annotations

import time
from typing import Any

from rich.text import Text

from fsdpctl.backends import Backend
from fsdpctl.cli.common import out, warn
from fsdpctl.cli.job_view import PHASE_COLOR, failure_line, nodes_cell, warnings
from fsdpctl.cli.tables import PlainTable, styled
from fsdpctl.job import prestep
from fsdpctl.job.progress import fmt_duration, hung_warning, progress_rows
from fsdpctl.job.reports import FINAL, Report
from fsdpctl.plan import nodefit
from fsdpctl.redact import redact


def status_table(r: Report) -> PlainTable:
    t = PlainTable(show_header=False, box=None, pad_edge=False)
    kind = f"{r['kind']} " if r.get("kind") else ""
    t.add_row("job", f"{kind}{r['job']}  (run {r['run_id']}, {r.get('backend', '-')})")
    reason = f"  ({r['reason']})" if r.get("reason") else ""
    t.add_row("phase", styled(r["phase"], PHASE_COLOR.get(r["phase"], "yellow")) + Text(reason))
    t.add_row("nodes", f"{nodes_cell(r)}; {r['restarts']} restarts; age {fmt_duration(r['age_s'])}")
    for i, change in enumerate(r.get("world_changes") or []):
        t.add_row("world" if i == 0 else "", change)
    t.add_row("leader", r.get("leader") or "-")
    for row in progress_rows(r):
        t.add_row(*row)
    if pre := r.get("prestep"):
        t.add_row("pre-step", prestep.describe(pre))
    if r.get("network"):
        t.add_row("network", r["network"])
    if r.get("identity"):
        t.add_row("user", r["identity"])
    for i, node in enumerate(r.get("gpu_nodes") or []):
        t.add_row("GPU nodes" if i == 0 else "", nodefit.describe_node(node))
    if failure := r.get("failure"):
        t.add_row("error", failure_line(failure))
    t.add_row("checkpoint", r.get("checkpoint") or "-")
    t.add_row("leader log", r.get("leader_log") or "-")
    return t


def print_status(r: Report, stall_after: float) -> None:
    out.print(status_table(r))
    for line in warnings(r):
        warn(line)
    if r["stalled"]:
        warn(hung_warning(stall_after))


def status_view(r: Report, stall_after: float, curves: list[Any] | None) -> Any:
    """What `job status` shows, as one renderable (the table, its warnings, the curves), for a
    view redrawn in place."""
    from rich.console import Group

    from fsdpctl.cli.plots import steps_of, terminal_plot

    parts: list[Any] = [status_table(r)]
    said = [*warnings(r), *([hung_warning(stall_after)] if r["stalled"] else [])]
    parts += [Text("warning: " + redact(line), style="yellow") for line in said]
    if curves is not None and len(steps := steps_of(curves)) >= 2:
        parts.append(Text(terminal_plot(steps, width=min(out.width, PLOT_MAX_WIDTH))))
    return Group(*parts)


def watch_status(backend: Backend, name: str, stall_after: float, plot: bool) -> None:
    """`job status -w`: on a terminal the view redrawn in place (rich's Live) every 2 s until the
    job ends, as `watch` or `kubectl get -w` on a screen; elsewhere (a pipe, a log file) a new view
    only when something in it changed, never a frame per refresh."""
    from rich.live import Live

    def changed(r: Report) -> tuple[Any, ...]:  # what a person watches for, not the ticking age
        return (r["phase"], r["step"], r["restarts"], r["reason"], tuple(warnings(r)))

    if not out.is_terminal:
        last = None
        while True:
            r = backend.report(name, stall_after)
            if changed(r) != last:
                last = changed(r)
                print_status(r, stall_after)
            if r["phase"] in FINAL:
                return
            time.sleep(2)
    with Live(console=out, auto_refresh=False) as live:
        while True:
            r = backend.report(name, stall_after)
            live.update(status_view(r, stall_after, backend.history(name) if plot else None))
            live.refresh()
            if r["phase"] in FINAL:
                return
            time.sleep(2)


def want_plot(flag: bool | None) -> bool:
    """--plot/--no-plot, else curves only on a terminal: off one (a pipe, a file) the output stays
    the table's lines, for grep."""
    return flag if flag is not None else out.is_terminal


PLOT_MAX_WIDTH = 120


def print_curves(recs: list[Any]) -> None:
    """Loss and tokens/s over the steps of the leader's log (plotext); nothing before two steps."""
    from fsdpctl.cli.plots import steps_of, terminal_plot

    steps = steps_of(recs)
    if len(steps) >= 2:
        out.print(
            terminal_plot(steps, width=min(out.width, PLOT_MAX_WIDTH)),
            markup=False,
            highlight=False,
        )

"""How a job looks on the terminal, whichever backend runs it: the follow screen, the job list and
the outcome with its exit code (the status table and its live view: `job_status_view`). Shared by
`job` and `quickstart`."""

from __future__ import annotations

import re
import time
from typing import TYPE_CHECKING, Any, NotRequired, TypedDict

from rich.markup import escape
from rich.text import Text

from fsdpctl.backends import Backend, LogLine, Started
from fsdpctl.cli.common import Output, emit, err, ok, out, warn
from fsdpctl.cli.tables import PlainTable
from fsdpctl.errors import BadInput, ExitCode
from fsdpctl.job import crilog, interrupts, prestep
from fsdpctl.job.progress import describe, fmt_duration, step_and_loss
from fsdpctl.job.reports import FINAL, Failure, Phase, Report
from fsdpctl.job.validate import label_value_problem
from fsdpctl.redact import redact
from fsdpctl.targets import target
from fsdptrain import events

if TYPE_CHECKING:
    from fsdpctl.settings import Config

PHASE_COLOR = {"Succeeded": "green", "Failed": "red", "Running": "cyan", "Stopped": "yellow"}
FAILURE_LINES = 15


def warnings(r: Report) -> list[str]:
    """What the report says is wrong now: Pending reasons, an EFA fallback."""
    net = r.get("network_warning")
    return [*r["problems"], *([net] if net else [])]


def follow(backend: Backend, name: str) -> Report | None:
    """A progress bar fed by the leader's step lines until the job ends; the final report. Ctrl-C
    does what the backend does with it (local: stop with a checkpoint; cluster: detach, returning
    None). SIGTERM and SIGHUP (CI's timeout, a closed terminal) do the same, then end the command
    with one line and 128 + the signal's number (143, 129), as a shell reports a process it
    ended."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (
        TextColumn("{task.description}", markup=False, style="bold"),
        BarColumn(),
        TextColumn("{task.fields[count]}", markup=False),  # step/max once known; nothing before
        TextColumn("{task.fields[info]}", markup=False),  # from logs: never markup
        TimeElapsedColumn(),
    )
    warned: set[str] = set()
    spoken = Spoken(name)
    with interrupts.signals_interrupt():  # SIGTERM, SIGHUP: as Ctrl-C
        try:
            with Progress(*columns, console=err) as bar:
                task = bar.add_task("starting", total=None, info="", count="")
                while True:
                    r = backend.report(name)
                    for line in warnings(r):
                        if line not in warned:
                            warned.add(line)
                            bar.console.print("[yellow]warning:[/] " + escape(redact(line)))
                    _advance(bar, task, r)
                    if not err.is_terminal:  # no bar is drawn: a plain line now and then
                        spoken.say(r)
                    if r["phase"] in FINAL:
                        return r
                    time.sleep(backend.poll_s)
        except KeyboardInterrupt as e:  # one line in the end, whatever the job was doing
            what = target(backend.name).interrupt
            from fsdpctl.job import runner  # the submit machinery: only when it changes the job

            with err.status(f"interrupted: {what} ..."):
                stopped = runner.interrupt(backend, name)
            final: Report | None = {**stopped, "interrupted": True} if stopped is not None else None
            if isinstance(
                e, interrupts.Interrupted
            ):  # the command ends: its line, 128 + the signal
                outcome(backend, name, final, table=False)
                import typer

                raise typer.Exit(128 + e.signum) from None
            return final


# off a terminal (a CI log, `| tee`), where no bar is drawn, a followed job says where it is this often,
# and at once when its stage changes
PLAIN_EVERY_S = 30.0


class Spoken:
    """A followed job's progress as plain lines where no bar is drawn: one per stage (starting,
    downloading, rendezvous 1/2, training, ...) and, within one, one every PLAIN_EVERY_S."""

    def __init__(self, job: str) -> None:
        self.job, self.stage, self.at = job, "", 0.0

    def say(self, r: Report) -> None:
        stage, line = plain_line(r)
        now = time.monotonic()
        if stage != self.stage or now - self.at >= PLAIN_EVERY_S:
            err.print(escape(redact(f"{self.job}: {line}")), highlight=False)
            self.stage, self.at = stage, now


def plain_line(r: Report) -> tuple[str, str]:
    """(stage, line) of a report, as the bar would show it."""
    if r["max_steps"]:
        loss = f" | loss {r['loss']:.4f}" if r["loss"] is not None else ""
        speed = f" | {r['tokens_per_s']:.0f} tok/s" if r["tokens_per_s"] else ""
        return "training", f"step {r['step']}/{r['max_steps']}{loss}{speed}"
    if (pre := r.get("prestep")) and pre["phase"] in ("Pending", "Running"):
        return "downloading", f"downloading {prestep.describe(pre).partition(': ')[2]} ..."
    stage = r.get("stage") if r["phase"] == "Running" else None
    what = str(stage or r["phase"]).lower()
    return what, f"{what} ..."


def _advance(bar: Any, task: Any, r: Report) -> None:
    """The bar from a report: training (step/max, loss, last step's tokens/s), the pre-step's
    download, or the stage a starting run is in (rendezvous 1/2, loading data, building the model,
    first step)."""
    if r["max_steps"]:
        info = f"loss {r['loss']:.4f} | {r['tokens_per_s']:.0f} tok/s"
        count = f"{r['step']}/{r['max_steps']}"
        bar.update(
            task,
            description="training",
            total=r["max_steps"],
            completed=r["step"],
            info=info,
            count=count,
        )
    elif (pre := r.get("prestep")) and pre["phase"] in (
        "Pending",
        "Running",
    ):  # trainers wait for it
        info = prestep.describe(pre).partition(": ")[2]
        bar.update(
            task,
            description="downloading",
            total=pre["files_total"] or None,
            completed=pre["files_done"],
            info=info,
            count=f"{pre['files_done']}/{pre['files_total']}" if pre["files_total"] else "",
        )
    elif r["phase"] == "Running" and r.get("stage"):
        bar.update(task, description=r["stage"])
    else:
        bar.update(task, description=str(r["phase"]).lower())


def outcome(backend: Backend, name: str, r: Report | None, table: bool = True) -> int:
    """The last screen of a followed job and the exit code that tells how it ended (`table`: its
    summary table on stdout; off when stdout carries JSON)."""
    if r is None:
        ok(f"detached; job {name} keeps running (`fsdpctl job stop {name}` stops it)")
        return ExitCode.OK
    if r.get("summary") and table:
        out.print(summary_table(r))
    if r["phase"] == "Succeeded":
        loss = f": loss {r['loss']:.4f} at step {r['step']}" if r.get("loss") is not None else ""
        ok(
            f"job {name} succeeded{loss}"
            + (f"; logs: {r['leader_log']}" if r.get("leader_log") else "")
        )
        return ExitCode.OK
    if r["phase"] == "Stopped":
        said = "interrupted: " if r.get("interrupted") else ""
        if r.get("checkpoint"):
            warn(
                f"{said}job {name} stopped at step {r['step']}; `fsdpctl job resume {name}` continues it"
            )
        else:
            warn(
                f"{said}job {name} stopped before its first checkpoint; `fsdpctl job run` starts it again"
            )
        return ExitCode.JOB_STOPPED
    reason = f": {redact(r['reason'])}" if r["reason"] else ""
    err.print("[red]✗[/] " + escape(f"job {name} {r['phase']}{reason}"))
    if failure := r.get("failure"):
        err.print("  " + redact(failure_line(failure)), markup=False)
    lines = backend.tail(name, FAILURE_LINES)
    if full := full_disk(backend, r, lines):
        err.print("  " + redact(full), markup=False)
    where = failure["log"] if failure else r.get("leader_log")
    if lines:
        err.print(f"last lines of {where}:" if where else "last lines of its log:", markup=False)
        for line in lines:
            err.print("  " + redact(line), markup=False)
    return ExitCode.JOB_FAILED


# a file system with less free than this cannot take the next log line or checkpoint shard
FULL_BELOW_BYTES = 1024 * 1024


def full_disk(backend: Backend, r: Report, lines: list[str]) -> str | None:
    """The line that says a failed job met a full disk: its failure or its last lines say so
    (failures.DISK_FULL), or, on this machine, the file system of its log or checkpoints has
    (almost) nothing left: then the trainer may not even have had room to write why."""
    import shutil
    from pathlib import Path

    from fsdpctl.job.failures import says_disk_full

    failure = r.get("failure")
    words = [failure.get("error"), failure.get("raised")] if failure else []
    said = says_disk_full([*words, r.get("reason"), *lines])
    paths = [p for p in (r.get("checkpoint_dir"), r.get("leader_log")) if p]
    if target(backend.name).on_this_machine:
        for path in paths:
            at = Path(path)
            while not at.exists() and at != at.parent:
                at = at.parent
            try:
                free = shutil.disk_usage(at).free
            except OSError:
                continue
            if free < FULL_BELOW_BYTES or said:
                return (
                    f"the disk is full: the file system of {path} has {free / 2**20:.1f} MiB free "
                    "(ENOSPC); free space there, or put the job's volume or FSDPCTL_HOME elsewhere"
                )
    if said:
        return (
            "the disk is full (ENOSPC): the job could not write its checkpoint or logs; free space "
            "on its volume (SHARED_VOLUME, CHECKPOINT_PVC) or give it a larger one"
        )
    return None


def failure_line(f: Failure) -> str:
    """Why the job failed in one line: the failing rank's first error line, where it is, and what
    ended the rank when that differs (torchrun's root cause)."""
    who = (
        f"rank {f['rank']} on node {f['node']}"
        if f.get("rank") is not None
        else f"node {f['node']}"
    )
    at = f" ({f['log']}:{f['line']})" if f.get("line") else ""
    error = f.get("error") or "no error line in its log"
    ended = (
        f"; it ended with {f['raised']}"
        if f.get("raised") and f["raised"] != f.get("error")
        else ""
    )
    return f"{who}: {error}{at}{ended}"


def summary_table(r: Report) -> PlainTable:
    """The trainer's summary of a run that ended (`outcome` shows it only then)."""
    s = r["summary"] or {}
    t = PlainTable(title=Text(f"{r['job']}: {r['phase']}"), show_header=False)
    t.add_column("what", no_wrap=True)
    t.add_column("value", overflow="fold")  # paths are shown whole, folded, never cut
    t.add_row("steps", f"{s['start_step'] + s['steps']} (this run {s['steps']})")
    trained = s["steps"] and all(isinstance(s[k], float) for k in ("first_loss", "final_loss"))
    t.add_row(
        "loss",
        f"{s['first_loss']:.4f} -> {s['final_loss']:.4f}" if trained else "- (no step trained)",
    )
    t.add_row(
        "tokens/s",
        f"{s['tokens_per_s']:.0f} mean of this run ({s['tokens_per_s_per_device']:.0f} per process)",
    )
    state_mib = (s["param_bytes"] + s["optim_bytes"]) / 2**20
    t.add_row("state per rank", f"{state_mib:.2f} MiB (params + optimizer)")
    t.add_row("checkpoint", str(s["checkpoint"]))
    return t


def nodes_cell(r: Report) -> str:
    """The nodes cell of the status table and the job list: running of wanted, or the pods."""
    if "pods" in r:
        pods = ", ".join(f"{n} {s.lower()}" for s, n in sorted(r["pods"].items())) or "no pods yet"
        return f"{r['nodes']} wanted; pods: {pods}"
    return f"{r['nodes_running']}/{r['nodes']} running"


PHASES = tuple(Phase)  # every phase a job can be reported in, for `job list --phase`


def phase_filter(values: list[str]) -> set[Phase]:
    """--phase values (repeated or comma lists, any case) as phase names; BadInput naming the known
    ones."""
    known = {p.lower(): p for p in PHASES}
    chosen = set()
    for value in (v.strip() for vs in values for v in vs.split(",")):
        if value.lower() not in known:
            raise BadInput(
                f"--phase {value!r} is not a job phase", hint="use one of " + ", ".join(PHASES)
            )
        chosen.add(known[value.lower()])
    return chosen


class StartedObject(TypedDict):
    """What `job run` and `quickstart` say they started (-o json|yaml), before the dry run's
    objects or the followed job's report."""

    job: str
    run_id: str
    backend: str  # the place's name (BACKEND)
    where: str  # where its output goes
    dry_run: NotRequired[str]  # "none": set once it was really started


def started_object(backend: Backend, started: Started) -> StartedObject:
    """What `job run` and `quickstart` say they started (-o json): job, run_id, backend, where."""
    return {
        "job": started.job,
        "run_id": started.run_id,
        "backend": backend.name,
        "where": started.where,
    }


def dry_run_word(dry_run: bool, server: bool = False) -> str:
    """A document's `dry_run`: kubectl's --dry-run values, none, client or server, in every
    command."""
    return "server" if server else ("client" if dry_run else "none")


def dry_run_done(
    what: StartedObject, started: Started, output: Output, server: bool = False
) -> None:
    """What a dry run of `job run` (or `quickstart`) would start: its lines on stdout (object names,
    launch commands, the batch script), or with -o json/yaml one document holding the objects it
    would create themselves (and the script), as kubectl's `--dry-run -o yaml`; then one line saying
    nothing was created."""
    doc = {**what, "dry_run": dry_run_word(True, server), "objects": started.objects}
    doc |= {"script": started.script} if started.script is not None else {}
    if not emit({**doc, "lines": started.dry_run_lines}, output):
        for line in started.dry_run_lines:
            out.print(line, markup=False)
    ok(f"dry run: {what['where']}; nothing was created")


def launch(
    backend: Backend,
    cfg: Config,
    *,
    run_id: str | None,
    replace: bool,
    dry_run: bool,
    detach: bool,
    output: Output,
    server_dry_run: bool = False,
    said: str = "",
    then: str = "",
) -> None:
    """Start the job (`job run`, `rerun`, `resume`) through the job core (its lock, its record,
    submit-or-cancel), then follow it to its end, or return at once when detached; exits with the
    code its end calls for. `said`: what the started line adds; `then`: the next command a detached
    start suggests besides `job status`. -o json/yaml: one document on stdout."""
    import typer

    from fsdpctl import backends
    from fsdpctl.job import policy as jobpolicy
    from fsdpctl.job import runner

    # (the core takes SIGTERM and SIGHUP during its submit as Ctrl-C: interrupts.signals_interrupt)
    started = runner.run(
        backend,
        cfg,
        run_id=run_id or jobpolicy.new_run_id(cfg.job_name),
        replace=replace,
        dry_run=dry_run,
        server_dry_run=server_dry_run,
        other=backends.factory(cfg),
        say=warn,
    )
    what = started_object(backend, started)
    if dry_run or server_dry_run:
        dry_run_done(what, started, output, server_dry_run)
        return
    what["dry_run"] = "none"
    ok(f"started job {started.job} (run {started.run_id}) on {backend.name}{said}: {started.where}")
    if detach:
        err.print(
            f"  next: fsdpctl job status {started.job}   {then or f'fsdpctl job logs -f {started.job}'}"
        )
        emit(what, output)
        return
    final = follow(backend, started.job)
    code = outcome(backend, started.job, final, table=output == Output.table)
    emit({**what, "report": final}, output)
    raise typer.Exit(code)


def label_selector(text: str) -> list[tuple[str, str, str]]:
    """An equality-based label selector as kubectl takes it (`key=value`, `key==value`,
    `key!=value`, comma separated: all must hold; apimachinery pkg/labels/selector.go), as (key, op,
    value) requirements."""
    reqs = []
    for part in (p.strip() for p in text.split(",")):
        op = next((o for o in ("!=", "==", "=") if o in part), None)
        key, value = part.split(op, 1) if op else (part, "")
        if op is None or not key.strip() or not re.fullmatch(r"[-A-Za-z0-9_./]+", key.strip()):
            raise BadInput(
                f"--selector {text!r}: {part!r} is not key=value",
                hint="use key=value[,key2!=value2], e.g. -l fsdpctl.io/job=fsdp",
            )
        if why := label_value_problem(value.strip()):  # the selector parser checks each value so
            raise BadInput(
                f"--selector {text!r}: {value.strip()!r} is not a label value ({why})",
                hint="a value is at most 63 letters, digits, '-', '_' or '.', starting and ending with a "
                "letter or digit (or empty)",
            )
        reqs.append((key.strip(), "!=" if op == "!=" else "=", value.strip()))
    return reqs


def selected(r: Report, phases: set[Phase], reqs: list[tuple[str, str, str]]) -> bool:
    """Whether a job report passes --phase and --selector (a missing label is != any value, as in
    kubectl)."""
    labels = r.get("labels") or {}
    if phases and r["phase"] not in phases:
        return False
    return all((labels.get(k) == v) == (op == "=") for k, op, v in reqs)


def list_table(reports: list[Report], wide: bool = False) -> PlainTable:
    """`job list`: a row per job. Only names and run ids fold on a narrow terminal; a phase, a
    count, a loss or an age is never split inside a word (`Succeede`/`d` at 80 columns). `wide`
    (-o wide, kubectl's) adds the restarts, the newest checkpoint and why the job is where it is."""
    extra = ("restarts", "checkpoint", "reason") if wide else ()
    t = PlainTable("job", "backend", "phase", "run", "nodes", "step", "loss", "age", *extra)
    for column in t.columns:
        folds = column.header in ("job", "run", "checkpoint", "reason")
        column.overflow, column.no_wrap = ("fold", False) if folds else ("ellipsis", True)
    for r in reports:
        where = r.get("backend", "-") + (f"/{r['kind']}" if r.get("kind") else "")
        nodes = nodes_cell(r).split("; pods: ")[-1]
        more = (
            (
                str(r["restarts"]),
                (r.get("checkpoint") or "-").rsplit("/", 1)[-1],
                r.get("reason") or "-",
            )
            if wide
            else ()
        )
        t.add_row(
            r["job"],
            where,
            r["phase"],
            r["run_id"],
            nodes,
            *step_and_loss(r),
            fmt_duration(r["age_s"]),
            *more,
        )
    return t


# events the trainer follows with a human line of its own (fsdptrain/train.py: `step N/M | loss
# ...`, `summary: ...`): `job logs` shows that line instead of a second one
HUMAN_TWIN = (events.Step, events.Summary)


def log_text(line: LogLine, *, prefix: bool, timestamps: bool) -> str | None:
    """A log line as `job logs` prints it (None: not printed): a trainer event as a short human
    line, or not at all where the trainer printed one for it; anything else as printed; then, as
    kubectl writes them, the source first (--prefix) and the time (--timestamps)."""
    event = next(events.parse([line.text]), None)
    if isinstance(event, HUMAN_TWIN):
        return None
    text = describe(event) if event is not None else line.text
    if timestamps:
        text = f"{crilog.rfc3339(line.time) if line.time is not None else '-'} {text}"
    return f"{line.prefix} {text}" if prefix else text


def log_record(line: LogLine) -> dict[str, Any]:
    """A log line for `job logs -o json`: where it comes from, its time (RFC 3339, null when
    unknown) and either the trainer event it holds (`event`: the event's own fields) or the line as
    printed (`text`)."""
    event = next(events.parse([line.text]), None)
    when = crilog.rfc3339(line.time) if line.time is not None else None
    body = {"event": events.as_record(event)} if event is not None else {"text": line.text}
    return {**line.where, "time": when, **body}

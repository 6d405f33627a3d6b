"""fsdpctl job describe|rerun|diff: a run's record (fsdpctl.job.record), shown, started again,
compared.

Registered on the `job` group by job_cmd (`register`). A NAME is a job name (its newest run), a run
id or a record id; on a cluster a job name reads the ConfigMap <job>-record, anything else this
machine's copies.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from fsdpctl import backends, files
from fsdpctl.cli import completion, job_view
from fsdpctl.cli.admission import admit
from fsdpctl.cli.common import (
    BackendOpt,
    DetachOpt,
    DryRunOpt,
    ForceOpt,
    Output,
    OutputOpt,
    ReplaceOpt,
    emit,
    emit_text,
    out,
    state,
    warn,
)
from fsdpctl.cli.diff_view import print_diff, shown
from fsdpctl.cli.record_reading import drift, has_a_checkpoint, learnt, load_record, main_line
from fsdpctl.cli.tables import PlainTable
from fsdpctl.errors import BadInput, ExitCode, FsdpctlError

if TYPE_CHECKING:
    from rich.console import Group

    from fsdpctl.job.record import Fingerprint, RunRecord
    from fsdpctl.job.record_view import HistoryRow
    from fsdpctl.settings import Config


FORMATS = ("table", "json", "yaml", "env")


NameArg = typer.Argument(
    help="job name (its newest run), run id or record id (or a unique prefix), JOB/RUN (default: JOB_NAME)",
    autocompletion=completion.job_names,
)


JobArg = typer.Argument(help="job name (default: JOB_NAME)", autocompletion=completion.job_names)


ResumeArg = typer.Argument(
    help="job name (default: JOB_NAME), or a run id to continue that run's own checkpoints",
    autocompletion=completion.job_names,
)


def register(app: typer.Typer) -> None:
    app.command()(describe)
    app.command()(history)
    app.command()(resume)
    app.command()(rerun)
    app.command()(diff)


def _format(output: str) -> str:
    if output not in FORMATS:
        raise BadInput(
            f"--output {output!r} is not a format of this command",
            hint="use table, json, yaml or env",
        )
    return output


# ---- describe ------------------------------------------------------------------------------------


def describe(
    ctx: typer.Context,
    name: Annotated[str | None, NameArg] = None,
    output: Annotated[
        str, typer.Option("--output", "-o", help="table, json, yaml or env")
    ] = "table",
    backend: BackendOpt = None,
) -> None:
    """What made a run: its settings, code, image, versions and data. Its resolved settings with
    where each came from, the code version, the image
    (by digest once a pod reported it), the trainer's torch/transformers/CUDA/NCCL versions and the
    fingerprints of its data and tokenizer. `-o env` prints a .env that reproduces the run.

    Example: fsdpctl job describe -o env > run.env
    """
    from fsdpctl.job import record_view

    _format(output)
    got = load_record(ctx, name, backend)
    for line in got.problems:
        warn(line)
    if output in ("json", "yaml"):
        emit(got.rec, Output(output))
    elif output == "env":
        emit_text(record_view.env_text(got.rec))  # byte for byte: a TAB or CR in a value is kept
    else:
        out.print(_describe_table(got.rec, got.where))


def _describe_table(rec: RunRecord, where: str) -> Group:
    """The run in a few rows, then one `KEY value source` row per setting not at its plain
    default."""
    from rich.console import Group

    from fsdpctl.job import record_view

    t = PlainTable(show_header=False, box=None, pad_edge=False)
    t.add_column(style="bold")
    t.add_column(overflow="fold")
    t.add_row("record", f"{rec['id']} ({where})")
    t.add_row("job", f"{rec['job']}, run {rec['run_id']}, backend {rec['backend']}")
    t.add_row("code", record_view.code_text(rec.get("code")))
    if image := rec.get("image"):
        t.add_row("image", record_view.image_text(image))
    trainer = rec.get("trainer")
    if trainer:
        libs = f"python {trainer['python']}, torch {trainer['torch']}, transformers {trainer['transformers']}"
        t.add_row(
            "trainer", f"{libs}, CUDA {trainer['cuda'] or '-'}, NCCL {trainer['nccl'] or '-'}"
        )
        t.add_row("dataset", _fingerprint_text(trainer["dataset"]))
        t.add_row("tokenizer", _fingerprint_text(trainer["tokenizer"]))
        t.add_row("started", record_view.start_text(trainer))
    else:
        t.add_row("trainer", "not started yet (its start line has not been read)")
    for key, ref in rec.get("secrets", {}).items():
        t.add_row(key, ref)
    chosen = record_view.not_default(rec, _defaults(rec))
    t.add_row("settings", f"{len(rec['settings'])} keys; {len(chosen)} not at their default:")
    rows = PlainTable(show_header=False, box=None, pad_edge=False)
    for _ in range(3):
        rows.add_column(overflow="fold")
    for key, (value, source) in chosen.items():
        rows.add_row(f"  {key}", value, source)
    return Group(t, rows)


def _defaults(rec: RunRecord) -> dict[str, str]:
    """The defaults of the record's model, or none where this fsdpctl cannot make them (a record of
    a model or key it does not know): every key set is then listed, as before."""
    from fsdpctl.errors import FsdpctlError
    from fsdpctl.job import record_view

    try:
        return record_view.defaults_of(rec["settings"].get("MODEL", ""))
    except FsdpctlError:
        return {}


def _fingerprint_text(fp: Fingerprint) -> str:
    if not fp.get("local"):
        return f"{fp['source']} (no files here to fingerprint: read from the hub)"
    return f"{fp['source']}: {fp['files']} files, {fp['bytes']} bytes, sha256 {fp['digest'][:16]}"


# ---- history -------------------------------------------------------------------------------------


def history(
    ctx: typer.Context,
    name: Annotated[str | None, JobArg] = None,
    output: Annotated[
        Output, typer.Option("--output", "-o", help="table, json or yaml")
    ] = Output.table,
    backend: BackendOpt = None,
) -> None:
    """Every run of a job this machine recorded, oldest first. Its run id and record, when it
    started, where it started (afresh, or the checkpoint it resumed), the settings that differ from
    the run before it, and how it ended (from its trainer's lines; runs whose logs are gone say so).

    Example: fsdpctl job history fsdp -o json
    """
    from fsdpctl.job import record_view
    from fsdpctl.job import store as record_store

    cfg = state(ctx).config()
    job = files.job_name(name) if name is not None else cfg.job_name
    damaged: list[BadInput] = []
    runs = [learnt(rec, cfg) for rec in record_store.of_job(job, damaged)]
    for e in damaged:  # one warning each; the other runs are listed
        warn(f"{e}: skipped")
    if (
        not runs and damaged
    ):  # every record of the job is damaged: that, named, not "no run" (exit 2)
        raise damaged[-1]
    if not runs:
        raise FsdpctlError(
            f"no recorded run of job {job!r} on this machine",
            hint="`fsdpctl job list` shows the jobs; `fsdpctl job run` records every run",
            code=ExitCode.JOB_NOT_FOUND,
        )
    try:
        ended = backends.create(backends.placed(cfg, job, backend)).outcomes(job)
    except FsdpctlError:  # the job's state is gone (cleaned up): the records still tell the runs
        ended = {}
    rows = record_view.history_rows(runs, ended)
    if not emit(rows, output):
        out.print(_history_table(rows))


def _history_table(rows: list[HistoryRow]) -> PlainTable:
    t = PlainTable(
        "run",
        "record",
        "started",
        "from",
        "settings changed",
        "outcome",
        "world",
        box=None,
        pad_edge=False,
    )
    for r in rows:
        changed = ", ".join(f"{k}={shown(v)}" for k, (_, v) in r["changed"].items()) or "-"
        t.add_row(
            r["run_id"], r["record"], r["started"], r["from"], changed, r["outcome"], r["world"]
        )
    # the ids are what a user copies (into `job diff`): never cut; the prose columns wrap instead
    for i, column in enumerate(t.columns):
        if i < 2:
            column.no_wrap = True
            column.min_width = max([len(str(column.header)), *(len(x[i]) for x in t.plain_rows)])
        else:
            column.overflow = "fold"
    return t


def _settings_for(
    ctx: typer.Context, rec: RunRecord, derived: dict[str, str] | None = None, by: str = ""
) -> Config:
    """The record's settings (the .env it reproduces) under --set (anywhere on the line: the root
    group takes them); the secrets from where this command runs, as `job run` takes them. `derived`:
    what the command `by` sets itself (a rerun's start point and checkpoint directory), under the
    user's --set."""
    from fsdpctl.settings import load

    user = dict(state(ctx).flags)
    mine = {k: v for k, v in (derived or {}).items() if k not in user}
    flags = {**mine, **user}
    current = state(ctx).config()
    env = dict(rec["settings"])
    if current.hf_token.get_secret_value():  # the record holds where it was, never the value
        env["HF_TOKEN"] = current.hf_token.get_secret_value()
    if not env.get("HF_TOKEN_FILE") and current.hf_token_file:
        env["HF_TOKEN_FILE"] = current.hf_token_file
    cfg = load(
        dotenv=env, flags=flags, dotenv_name=f"record {rec['id']}", set_by=dict.fromkeys(mine, by)
    )
    # a recorded value keeps saying where it first came from, through reruns of reruns
    first = {k: rec["sources"].get(k, "default") for k in rec["settings"]}
    sources = {
        k: (first[k] if first[k].startswith("record ") else f"record {rec['id']}: {first[k]}")
        if v == f"record {rec['id']}" and k in first
        else v
        for k, v in cfg.sources.items()
    }
    for key in ("HF_TOKEN", "HF_TOKEN_FILE"):
        if env.get(key) and not rec["settings"].get(key):
            sources[key] = current.sources.get(key, "default")
    return cfg.model_copy(update={"sources": sources})


def rerun(
    ctx: typer.Context,
    name: Annotated[str | None, NameArg] = None,
    allow_drift: Annotated[
        bool,
        typer.Option(
            "--allow-drift", help="run although the code or data differ from the record's"
        ),
    ] = False,
    detach: DetachOpt = False,
    replace: ReplaceOpt = False,
    dry_run: DryRunOpt = False,
    backend: BackendOpt = None,
    force: ForceOpt = False,
    output: Output = OutputOpt,
) -> None:
    """Reproduce a run from its record, with the same losses. Its settings (with any --set
    KEY=VALUE over them), a new run
    id, the start the run had (afresh, or the checkpoint it resumed: RESUME) and a checkpoint
    directory of its own (CHECKPOINT_SUBDIR=reruns/<run id>), so it trains the same steps with the
    same losses and never touches the job's checkpoints. Refused, with what differs, when the code
    (version, commit, uncommitted changes) or the data and tokenizer files (their fingerprints) are
    not what the record says, unless --allow-drift.

    Example: fsdpctl job rerun fsdp-1a2b3c4d-5e6f7a   (then: fsdpctl job diff A B)
    """
    from fsdpctl.job import policy as jobpolicy

    got = load_record(ctx, name, backend, acts=True)
    run_id = jobpolicy.new_run_id(got.rec["job"])
    cfg = _settings_for(ctx, got.rec, _rerun_start(ctx, got.rec, run_id), "job rerun")
    drifted, unchecked = drift(got.rec, cfg)
    _say_drift(got.rec, drifted, unchecked, allow_drift)
    admit(cfg, force=force)
    job_view.launch(
        backends.create(cfg),
        cfg,
        run_id=run_id,
        replace=replace,
        dry_run=dry_run,
        detach=detach,
        output=output,
        said=f", from record {got.rec['id']}",
        then=f"fsdpctl job diff {got.rec['run_id']} {run_id}",
    )


def _say_drift(rec: RunRecord, drifted: list[str], unchecked: list[str], allow: bool) -> None:
    """A rerun of other code or data is refused unless --allow-drift; what differs or could not be
    checked is warned."""
    if drifted and not allow:
        raise BadInput(
            f"record {rec['id']} no longer matches: " + "; ".join(drifted),
            hint="--allow-drift runs it anyway (the new record says what it ran)",
        )
    for line in [*drifted, *unchecked]:
        warn(line)


def _rerun_start(ctx: typer.Context, rec: RunRecord, run_id: str) -> dict[str, str]:
    """RESUME and CHECKPOINT_SUBDIR of a rerun: where the recorded run started, as its trainer said
    (the checkpoint it resumed, found where the run kept them; never: afresh), and a directory of
    its own."""
    from fsdpctl.job import policy as jobpolicy

    start = {"CHECKPOINT_SUBDIR": f"reruns/{run_id}"}
    trainer = rec.get("trainer")
    if not trainer:
        if rec["settings"].get("RESUME") == "never":
            return {**start, "RESUME": "never"}
        raise BadInput(
            f"record {rec['id']} does not say where its run started (its trainer's start line was never "
            "read: it failed before training, or its logs are gone)",
            hint="--set RESUME=never reruns it afresh",
        )
    if not trainer.get("start_step"):
        return {**start, "RESUME": "never"}
    from fsdptrain.resume import step_name

    resumed = trainer.get("resumed_from")
    name = Path(resumed).name if resumed else step_name(trainer["start_step"])
    then = _settings_for(ctx, rec)  # where the recorded run kept its checkpoints
    return {**start, "RESUME": f"{jobpolicy.checkpoint_dir(then, then.job_name)}/{name}"}


def resume(
    ctx: typer.Context,
    name: Annotated[str | None, ResumeArg] = None,
    detach: DetachOpt = False,
    replace: ReplaceOpt = False,
    dry_run: DryRunOpt = False,
    backend: BackendOpt = None,
    force: ForceOpt = False,
    output: Output = OutputOpt,
) -> None:
    """Continue a stopped (or failed) job from its newest checkpoint. With the settings of its own
    record, not those of today's .env: a new run id, RESUME=auto. --set KEY=VALUE goes over them;
    one that changes the math (precision, model, sharding, LR schedule, MAX_STEPS, sequence length,
    batch) is refused unless ALLOW_SETTING_CHANGES=true, as is a job already at MAX_STEPS.

    Example: fsdpctl job resume fsdp -d
    """
    got = load_record(ctx, name, backend, acts=True)
    rec = main_line(got.rec) if name is None or name == got.rec["job"] else got.rec
    cfg = _settings_for(ctx, rec, {"RESUME": "auto"}, "job resume")
    admit(cfg, force=force)
    has_a_checkpoint(cfg)
    job_view.launch(
        backends.create(cfg),
        cfg,
        run_id=None,
        replace=replace,
        dry_run=dry_run,
        detach=detach,
        output=output,
        said=f", resumed with the settings of record {rec['id']}",
    )


# ---- diff ----------------------------------------------------------------------------------------


def diff(
    ctx: typer.Context,
    a: Annotated[
        str,
        typer.Argument(
            metavar="A",
            help="a run: job name, run id or record id (or a unique prefix), JOB/RUN",
            autocompletion=completion.job_names,
        ),
    ],
    b: Annotated[
        str, typer.Argument(metavar="B", help="the other run", autocompletion=completion.job_names)
    ],
    output: Annotated[str, typer.Option("--output", "-o", help="table or json")] = "table",
    backend: BackendOpt = None,
) -> None:
    """What differs between two runs: the settings (only those that differ), the versions, the data
    and tokenizer fingerprints, and the two loss curves side by side.

    Example: fsdpctl job diff fsdp-1a2b3c4d-5e6f7a fsdp-1a2b3d00-8c9d0e
    """
    from fsdpctl.job import record_view

    if output not in ("table", "json"):
        raise BadInput(
            f"--output {output!r} is not a format of this command", hint="use table or json"
        )
    one, two = load_record(ctx, a, backend), load_record(ctx, b, backend)
    for line in [*one.problems, *two.problems]:
        warn(line)
    d = record_view.diff(one.rec, two.rec)
    d["losses"] = record_view.side_by_side(one.losses, two.losses)
    if output == "json":
        emit(d, Output.json)  # masked, written whole, as every -o json
        return
    print_diff(d)

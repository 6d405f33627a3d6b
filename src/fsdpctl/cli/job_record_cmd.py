"""fsdpctl job describe|rerun|diff: a run's record (fsdpctl.record), shown, started again, compared.

Registered on the `job` group by job_cmd (`register`). A NAME is a job name (its newest run), a run id or a
record id; on a cluster a job name reads the ConfigMap <job>-record, anything else this machine's copies.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from fsdpctl import backends, files
from fsdpctl.cli import completion, job_view
from fsdpctl.cli.common import (
    BackendOpt,
    DetachOpt,
    ForceOpt,
    Output,
    ReplaceOpt,
    admit,
    emit,
    err,
    ok,
    out,
    state,
    warn,
)
from fsdpctl.errors import BadInput, ExitCode, FsdpctlError

if TYPE_CHECKING:
    from fsdpctl.settings import Config

FORMATS = ("table", "json", "env")
NameArg = typer.Argument(
    help="job name (its newest run), run id or record id (default: JOB_NAME)",
    autocompletion=completion.job_names,
)


@dataclass
class Loaded:
    """A record as read back, with what its run's log adds: the losses, and what could not be checked."""

    rec: dict[str, Any]
    losses: dict[int, float] = field(default_factory=dict)
    where: str = ""
    problems: list[str] = field(default_factory=list)


def register(app: typer.Typer) -> None:
    app.command()(describe)
    app.command()(rerun)
    app.command()(diff)


# ---- reading a record back -------------------------------------------------------------------------------


def _local_log(rec: dict[str, Any]) -> list[str]:
    """The leader's lines of a local run: its node logs under the job directory (the leader alone prints
    events, so all nodes' lines together hold just its)."""
    from fsdpctl import crilog
    from fsdpctl.adapters.local import job_dir

    logs = sorted((job_dir(rec["job"]) / "logs" / rec["run_id"]).glob("node-*.log"))
    return [line for p in logs for line in crilog.texts(p)]  # the relay's CRI lines, as text


def _from_this_machine(name: str) -> Loaded | None:
    from fsdpctl import record, record_store

    rec = record_store.find(name)
    if rec is None:
        return None
    where = str(record_store.path(rec["job"], rec["run_id"]))
    if rec["backend"] != "local":
        return Loaded(rec, where=where)
    lines = _local_log(rec)
    now = record.learnt(rec, lines)
    if now != rec:  # the trainer's start line, kept once read: the logs may be cleaned up
        record_store.save(now)
    return Loaded(now, record.losses(lines), where)


def load_record(ctx: typer.Context, name: str | None, backend: str | None) -> Loaded:
    """The record NAME means (see the module's doc); exit 4 with the fix when there is none."""
    from fsdpctl import record, record_store

    cfg = state(ctx).config()
    name = name if name is not None else cfg.job_name
    if not files.RUN_ID.fullmatch(name):
        raise BadInput(f"NAME {name!r} is not a job name, run id or record id", hint="`fsdpctl job list`")
    job = name if files.JOB_NAME.fullmatch(name) else None
    placed = backends.placed(cfg, job, backend)
    if placed.backend == "eks" and job is not None:
        from fsdpctl import kjobs

        kube = kjobs.connect(placed)
        rec, lines, problems = kjobs.record_of(kube, placed, job)
        if rec is not None:
            where = f"ConfigMap {placed.job_namespace}/{record.config_map_name(job)} on {kube.server}"
            if not problems:  # this machine's copy, with what was learnt
                record_store.save(rec)
            return Loaded(rec, record.losses(lines), where, problems)
    found = _from_this_machine(name)
    if found is None:
        raise FsdpctlError(
            f"no run record for {name!r}",
            hint="`fsdpctl job run` writes one for every run (runs started before fsdpctl kept records "
            "have none)",
            code=ExitCode.JOB_NOT_FOUND,
        )
    return found


def _format(output: str) -> str:
    if output not in FORMATS:
        raise BadInput(f"--output {output!r} is not a format of this command", hint="use table, json or env")
    return output


# ---- describe --------------------------------------------------------------------------------------------


def describe(
    ctx: typer.Context,
    name: Annotated[str | None, NameArg] = None,
    output: Annotated[str, typer.Option("--output", "-o", help="table, json or env")] = "table",
    backend: BackendOpt = None,
) -> None:
    """What made a run: its resolved settings with where each came from, the code version, the image (by
    digest once a pod reported it), the trainer's torch/transformers/CUDA/NCCL versions and the
    fingerprints of its data and tokenizer. `-o env` prints a .env that reproduces the run.

    Example: fsdpctl job describe -o env > run.env
    """
    from fsdpctl import record

    _format(output)
    got = load_record(ctx, name, backend)
    for line in got.problems:
        warn(line)
    if output == "json":
        emit(got.rec, Output.json)
    elif output == "env":
        out.print(record.env_text(got.rec), end="", markup=False, highlight=False)
    else:
        out.print(_describe_table(got.rec, got.where))


def _describe_table(rec: dict[str, Any], where: str) -> Table:
    from fsdpctl import record

    t = Table(show_header=False, box=None, pad_edge=False)
    t.add_column(style="bold")
    t.add_column(overflow="fold")
    t.add_row("record", f"{rec['id']} ({where})")
    t.add_row("job", f"{rec['job']}, run {rec['run_id']}, backend {rec['backend']}")
    t.add_row("code", record.code_text(rec.get("code")))
    if rec.get("image"):
        t.add_row("image", record.image_text(rec["image"]))
    trainer = rec.get("trainer")
    if trainer:
        libs = f"python {trainer['python']}, torch {trainer['torch']}, transformers {trainer['transformers']}"
        t.add_row("trainer", f"{libs}, CUDA {trainer['cuda'] or '-'}, NCCL {trainer['nccl'] or '-'}")
        for key in ("dataset", "tokenizer"):
            t.add_row(key, _fingerprint_text(trainer[key]))
    else:
        t.add_row("trainer", "not started yet (its start line has not been read)")
    chosen = {k: v for k, v in rec["settings"].items() if rec["sources"].get(k, "default") != "default"}
    t.add_row(
        "settings",
        f"{len(rec['settings'])} keys; not defaults: "
        + ", ".join(f"{k}={v} ({rec['sources'][k]})" for k, v in chosen.items())
        if chosen
        else f"{len(rec['settings'])} keys, all defaults",
    )
    for key, ref in rec.get("secrets", {}).items():
        t.add_row(key, ref)
    return t


def _fingerprint_text(fp: dict[str, Any]) -> str:
    if not fp.get("local"):
        return f"{fp['source']} (no files here to fingerprint: read from the hub)"
    return f"{fp['source']}: {fp['files']} files, {fp['bytes']} bytes, sha256 {fp['digest'][:16]}"


# ---- rerun -----------------------------------------------------------------------------------------------


def _local_inputs(cfg: Config) -> dict[str, str]:
    """Where the trainer of a local run finds DATASET and TOKENIZER on this machine: builtin -> the asset
    cache the trainer makes (fsdptrain.assets), a pod path under a mapped claim -> that directory."""
    from fsdpctl.adapters.local import shared_volume_dir
    from fsdpctl.settings import local_path
    from fsdptrain.assets import default_cache
    from fsdptrain.config import BUILTIN

    claims = {cfg.shared_volume_path: cfg.shared_volume, "/checkpoints": cfg.checkpoint_pvc}
    mounts = {p: str(shared_volume_dir(c)) for p, c in claims.items() if c}
    builtin = {"dataset": default_cache() / "corpus.txt", "tokenizer": default_cache() / "tokenizer"}
    t = cfg.training
    values = {"dataset": t.dataset, "tokenizer": t.tokenizer_path}
    return {k: str(builtin[k]) if v == BUILTIN else local_path(v, mounts) for k, v in values.items()}


def _drift(rec: dict[str, Any], cfg: Config) -> tuple[list[str], list[str]]:
    """(what differs from the record, what could not be checked here)."""
    from fsdpctl import record
    from fsdpctl.adapters.git import code_version
    from fsdptrain.fingerprint import fingerprint

    unchecked = []
    data: dict[str, dict[str, Any] | None] = {}
    if not rec.get("trainer"):
        unchecked.append("data: the recorded run never reported its data (no start line): not compared")
    elif cfg.backend == "local":
        data = {k: fingerprint(rec["trainer"][k]["source"], p) for k, p in _local_inputs(cfg).items()}
    else:
        unchecked.append(
            "data: the cluster's volume cannot be read from here: the new run's start line records it "
            "(compare with `fsdpctl job diff`)"
        )
    if rec.get("image"):
        unchecked.append(
            "image: the digest of a tag is known once a pod pulled it; `fsdpctl job diff` compares them after"
        )
    return record.drift(rec, code=code_version(), data=data), unchecked


def _settings_for(ctx: typer.Context, rec: dict[str, Any]) -> Config:
    """The record's settings (the .env it reproduces) under --set (anywhere on the line: the root group
    takes them); the secrets from where this command runs, as `job run` takes them."""
    from fsdpctl.settings import load

    flags = dict(state(ctx).flags)
    current = state(ctx).config()
    env = dict(rec["settings"])
    if current.hf_token.get_secret_value():  # the record holds where it was, never the value
        env["HF_TOKEN"] = current.hf_token.get_secret_value()
    if not env.get("HF_TOKEN_FILE") and current.hf_token_file:
        env["HF_TOKEN_FILE"] = current.hf_token_file
    cfg = load(dotenv=env, flags=flags, dotenv_name=f"record {rec['id']}")
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
        bool, typer.Option("--allow-drift", help="run although the code or data differ from the record's")
    ] = False,
    detach: DetachOpt = False,
    replace: ReplaceOpt = False,
    backend: BackendOpt = None,
    force: ForceOpt = False,
) -> None:
    """Start a run again from its record: the recorded settings (with any --set KEY=VALUE over them) and a
    new run id.
    Refused, with what differs, when the code (version, commit, uncommitted changes) or the data and
    tokenizer files (their fingerprints) are not what the record says, unless --allow-drift. Like `job
    run`, a job that kept checkpoints resumes from them unless RESUME=never.

    Example: fsdpctl job rerun fsdp-1a2b3c4d-5e6f7a --set MAX_STEPS=100
    """
    got = load_record(ctx, name, backend)
    cfg = _settings_for(ctx, got.rec)
    drifted, unchecked = _drift(got.rec, cfg)
    if drifted and not allow_drift:
        raise BadInput(
            f"record {got.rec['id']} no longer matches: " + "; ".join(drifted),
            hint="--allow-drift runs it anyway (the new record says what it ran)",
        )
    for line in [*drifted, *unchecked]:
        warn(line)
    admit(cfg, force=force)
    be = backends.create(cfg)
    started = be.run(run_id=None, replace=replace, dry_run=False, server_dry_run=False)
    ok(f"started job {started.job} (run {started.run_id}) on {be.name}, from record {got.rec['id']}")
    if detach:
        then = got.rec["run_id"]
        err.print(f"  next: fsdpctl job status {started.job}   fsdpctl job diff {then} {started.run_id}")
        return
    raise typer.Exit(job_view.outcome(be, started.job, job_view.follow(be, started.job)))


# ---- diff ------------------------------------------------------------------------------------------------


def diff(
    ctx: typer.Context,
    a: Annotated[
        str,
        typer.Argument(
            metavar="A", help="a run: job name, run id or record id", autocompletion=completion.job_names
        ),
    ],
    b: Annotated[str, typer.Argument(metavar="B", help="the other run", autocompletion=completion.job_names)],
    output: Annotated[str, typer.Option("--output", "-o", help="table or json")] = "table",
    backend: BackendOpt = None,
) -> None:
    """What differs between two runs: the settings (only those that differ), the versions, the data and
    tokenizer fingerprints, and the two loss curves side by side.

    Example: fsdpctl job diff fsdp-1a2b3c4d-5e6f7a fsdp-1a2b3d00-8c9d0e
    """
    from fsdpctl import record

    if output not in ("table", "json"):
        raise BadInput(f"--output {output!r} is not a format of this command", hint="use table or json")
    one, two = load_record(ctx, a, backend), load_record(ctx, b, backend)
    for line in [*one.problems, *two.problems]:
        warn(line)
    d = record.diff(one.rec, two.rec)
    d["losses"] = record.side_by_side(one.losses, two.losses)
    if output == "json":
        emit(d, Output.json)  # masked, written whole, as every -o json
        return
    out.print(f"A: record {d['a']['id']} (job {d['a']['job']}, run {d['a']['run_id']})", markup=False)
    out.print(f"B: record {d['b']['id']} (job {d['b']['job']}, run {d['b']['run_id']})", markup=False)
    for part in ("settings", "placement", "versions", "data"):
        if not d[part]:
            out.print(f"{part}: same", markup=False)
            continue
        out.print(f"{part}:", markup=False)
        for key, (x, y) in d[part].items():
            out.print(f"  {key}: {x} -> {y}", markup=False, highlight=False)
    out.print(_loss_table(d["losses"]))


def _loss_table(rows: list[dict[str, Any]]) -> Table:
    t = Table(title="loss", title_justify="left", box=None, pad_edge=False)
    for col in ("step", "A", "B", "B - A"):
        t.add_column(col, justify="right")
    for r in rows:
        delta = r["b"] - r["a"] if r["a"] is not None and r["b"] is not None else None
        t.add_row(*(str(r["step"]), _num(r["a"]), _num(r["b"]), _num(delta)))
    if not rows:
        t.add_row("-", "no steps logged", "", "")
    return t


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.6f}"

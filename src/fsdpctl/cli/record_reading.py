"""A run record read back for `job describe|history|rerun|resume|diff`: by job name (its newest
run), run id or record id, from where its place keeps it (`Backend.kept_record`) else this machine's
copies, with what its run's logs add; and what differs from it now (drift) or would stop a
resume."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from fsdpctl import backends, files
from fsdpctl.cli.common import (
    state,
)
from fsdpctl.errors import BadInput, ExitCode, FsdpctlError

if TYPE_CHECKING:
    from collections.abc import Mapping

    from fsdpctl.job.record import RunRecord
    from fsdpctl.settings import Config


@dataclass
class Loaded:
    """A record as read back, with what its run's log adds: the losses, and what could not be
    checked."""

    rec: RunRecord
    losses: dict[int, float] = field(default_factory=dict)
    where: str = ""
    problems: list[str] = field(default_factory=list)


# ---- reading a record back -----------------------------------------------------------------------


def _run_lines(rec: RunRecord, cfg: Config) -> list[str] | None:
    """The recorded run's log lines where this machine keeps them (on the backend it ran on)."""
    return backends.create(cfg.model_copy(update={"backend": rec["backend"]})).run_lines(
        rec["job"], rec["run_id"]
    )


def learnt(rec: RunRecord, cfg: Config) -> RunRecord:
    """A run's record with its trainer's start line from its logs where they are here, kept once
    read (the logs may be cleaned up); any other record as it is."""
    from fsdpctl.job import record
    from fsdpctl.job import store as record_store

    if (rec.get("trainer") and rec.get("losses")) or (lines := _run_lines(rec, cfg)) is None:
        return rec
    now = record.learnt(rec, lines)
    if now != rec:
        record_store.keep(now)
    return now


def _from_this_machine(name: str, cfg: Config) -> Loaded | None:
    from fsdpctl.job import record
    from fsdpctl.job import store as record_store

    rec = record_store.find(name)
    if rec is None:
        return None
    where = str(record_store.path(rec["job"], rec["run_id"]))
    if (lines := _run_lines(rec, cfg)) is None:  # gone with its pods: what the record kept
        return Loaded(rec, record.kept_losses(rec), where=where)
    now = record.learnt(rec, lines)
    if now != rec:  # the trainer's start line, kept once read: the logs may be cleaned up
        record_store.keep(now)
    return Loaded(now, record.losses(lines), where)


def load_record(
    ctx: typer.Context, name: str | None, backend: str | None, *, acts: bool = False
) -> Loaded:
    """The record NAME means (see the module's doc); exit 4 with the fix when there is none.
    `acts`: the verb starts a run from it (resume, rerun): a --backend that is not the backend of
    the job (its state) or of the record is refused, one line naming both."""
    got = _load_record(ctx, name, backend, acts=acts)
    if acts and backend is not None and backend != got.rec["backend"]:
        rec = got.rec
        raise BadInput(
            f"job {rec['job']} run {rec['run_id']} ran on {rec['backend']}, not on --backend "
            f"{backend}",
            hint=f"leave --backend out (it runs where the record says), or pass --backend "
            f"{rec['backend']}",
        )
    return got


def _load_record(
    ctx: typer.Context, name: str | None, backend: str | None, *, acts: bool
) -> Loaded:
    from fsdpctl.job import record
    from fsdpctl.job import store as record_store

    cfg = state(ctx).config()
    name = name if name is not None else cfg.job_name
    if "/" in name:  # JOB/RUN: one job's run, where a run id alone names runs of several jobs
        job_part, _, run_part = name.partition("/")
        name = f"{files.job_name(job_part)}/{files.run_id(run_part)}"
    elif not files.RUN_ID.fullmatch(name.removesuffix("…").removesuffix("...")):  # (a prefix)
        raise BadInput(
            f"NAME {name!r} is not a job name, run id (or a prefix of one), JOB/RUN or record id",
            hint="`fsdpctl job list`",
        )
    job = name if files.JOB_NAME.fullmatch(name) else None
    placed = backends.placed(cfg, job, backend, acts=acts)
    kept = backends.create(placed).kept_record(job) if job is not None else None
    if kept is not None:
        if not kept.problems:  # this machine's copy, with what was learnt
            record_store.keep(kept.record)
        return Loaded(kept.record, record.losses(kept.lines), kept.where, kept.problems)
    found = _from_this_machine(name, cfg)
    if found is None:
        raise FsdpctlError(
            f"no run record for {name!r}",
            hint="`fsdpctl job run` writes one for every run (runs started before fsdpctl kept records "
            "have none)",
            code=ExitCode.JOB_NOT_FOUND,
        )
    return found


# ---- rerun ---------------------------------------------------------------------------------------


def _inputs_here(cfg: Config) -> dict[str, str] | None:
    """Where the trainer finds DATASET and TOKENIZER on this machine: builtin -> the asset cache the
    trainer makes (fsdptrain.assets), a path it sees -> where that is here; None where its files are
    not here."""
    from fsdptrain.assets import default_cache
    from fsdptrain.config import BUILTIN

    be = backends.create(cfg)
    builtin = {
        "dataset": default_cache() / "corpus.txt",
        "tokenizer": default_cache() / "tokenizer",
    }
    t = cfg.training
    values = {"dataset": t.dataset, "tokenizer": t.tokenizer_path}
    here = {k: be.here(str(builtin[k]) if v == BUILTIN else v) for k, v in values.items()}
    return None if None in here.values() else {k: str(v) for k, v in here.items()}


def drift(rec: RunRecord, cfg: Config) -> tuple[list[str], list[str]]:
    """(what differs from the record, what could not be checked here)."""
    from fsdpctl.adapters.git import code_version
    from fsdpctl.job import record_view
    from fsdptrain.fingerprint import fingerprint

    unchecked = []
    data: dict[str, dict[str, Any] | None] = {}
    if not rec.get("trainer"):
        unchecked.append(
            "data: the recorded run never reported its data (no start line): not compared"
        )
    elif (inputs := _inputs_here(cfg)) is not None:
        started: Mapping[str, Any] = rec.get("trainer") or {}
        data = {k: fingerprint(started[k]["source"], p) for k, p in inputs.items()}
    else:
        unchecked.append(
            "data: the cluster's volume cannot be read from here: the new run's start line records it "
            "(compare with `fsdpctl job diff`)"
        )
    if rec.get("image"):
        unchecked.append(
            "image: the digest of a tag is known once a pod pulled it; `fsdpctl job diff` compares them after"
        )
    return record_view.drift(rec, code=code_version(), data=data), unchecked


def main_line(rec: RunRecord) -> RunRecord:
    """For a job named by its name: the newest run that kept its checkpoints in the job's own
    directory (a rerun keeps its own: `job resume RUN_ID` continues that one)."""
    from fsdpctl.job import store as record_store

    if not rec["settings"].get("CHECKPOINT_SUBDIR"):
        return rec
    own = [r for r in record_store.of_job(rec["job"]) if not r["settings"].get("CHECKPOINT_SUBDIR")]
    return own[-1] if own else rec


def has_a_checkpoint(cfg: Config) -> None:
    """A job with nothing to resume is refused (exit 2) where its checkpoints are on this machine:
    `job run` starts it. On a cluster the volume is the pods' to read: the trainer starts afresh
    there when it finds none, and says so."""
    from fsdpctl.job import policy as jobpolicy
    from fsdptrain.resume import latest_checkpoint

    where = backends.create(cfg).here(jobpolicy.checkpoint_dir(cfg, cfg.job_name))
    if where is None:
        return
    if latest_checkpoint(Path(where)) is None:
        raise BadInput(
            f"job {cfg.job_name} has no checkpoint to resume in {where}",
            hint=f"`fsdpctl job run` starts it; `fsdpctl job history {cfg.job_name}` shows its runs",
        )

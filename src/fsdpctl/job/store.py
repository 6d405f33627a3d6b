"""Where run records live on this machine, and making one at `job run` (fsdpctl.job.record is the
pure core).

    FSDPCTL_HOME/records/<job>/<run-id>.json one per run, whatever the backend (EKS: a copy of the
                                                 ConfigMap <job>-record, which goes with its job)

Beside the jobs directory, not in it: `cleanup` removes an ended job's files, and a record is what
lets `job diff` compare a run with one long gone.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, cast

from fsdpctl import files
from fsdpctl.errors import BadInput
from fsdpctl.files import home, write_atomic
from fsdpctl.job import record
from fsdpctl.job.record import ImageRef, RunRecord

if TYPE_CHECKING:
    from fsdpctl.settings import Config


def root() -> Path:
    return home() / "records"


def path(job: str, run_id: str) -> Path:
    return root() / files.job_name(job) / f"{files.run_id(run_id)}.json"


def new(cfg: Config, run_id: str) -> RunRecord:
    """The record of the run about to start: the settings, the code it runs, the image (EKS: by
    reference; its digest is known once a pod pulled it)."""
    from fsdpctl.adapters.git import code_version
    from fsdpctl.job import render  # its objects' names: a start's, not a read verb's import

    image: ImageRef | None = None
    if cfg.target.image:
        image = {
            "uri": cfg.image_uri,
            "digest": None,
            "digest_from": "unknown until a pod runs (the kubelet's status.containerStatuses[].imageID)",
        }
    return record.build(
        cfg,
        run_id=run_id,
        code=code_version(),
        image=image,
        created=time.time(),
        secret_name=render.secret_name(cfg),
    )


def save(rec: RunRecord) -> Path:
    """Atomically (files.write_atomic: a reader sees the old record or the new one, never half of
    one)."""
    where = path(rec["job"], rec["run_id"])
    write_atomic(where, json.dumps(rec, indent=1, default=str) + "\n")
    return where


def keep(rec: RunRecord) -> None:
    """What a read verb learnt (the trainer's start line, the cluster's copy), kept when the home
    can take it: a read verb never needs to write, so a read-only or full home only means it is
    learnt again next time."""
    try:
        save(rec)
    except OSError:
        pass


def discard(where: Path) -> None:
    """The record of a run that did not start, and the directories made for it alone."""
    where.unlink(missing_ok=True)
    for parent in (where.parent, root(), home()):
        try:
            parent.rmdir()  # only when empty
        except OSError:
            return


def read(where: Path) -> RunRecord:
    """The record in file `where`; BadInput naming the file when it is not one this fsdpctl wrote
    there: not a regular file (read without following a link or blocking: fsdpctl.files), too big,
    not JSON, another version's, changed since (its hash), or the record of another job or run than
    its path says."""
    try:
        data = files.read_json(where)
    except (OSError, ValueError) as e:
        raise BadInput(f"run record {where} {files.why(e)}", hint="remove it") from e
    problem = record.problem(data)
    rec = cast(RunRecord, data)  # when no problem: record.problem checked each part a reader uses
    if not problem and (rec["job"], rec["run_id"]) != (where.parent.name, where.stem):
        problem = f"is the record of job {rec['job']} run {rec['run_id']}, not of the path it is at"
    if problem:
        raise BadInput(
            f"{where} {problem}", hint="remove it, or run the job again for a new record"
        )
    return rec


def of_job(job: str, damaged: list[BadInput] | None = None) -> list[RunRecord]:
    """Every run record of job `job` on this machine, oldest first; damaged ones skipped (into
    `damaged`, newest last, when given)."""
    found = []
    where = root() / job
    if (
        files.JOB_NAME.fullmatch(job)
        and os.path.lexists(where)
        and (where.is_symlink() or not where.is_dir())
    ):
        files.skipped(where, f"is {files.kind_of(where)}, not the directory of job {job}'s records")
        return []
    for p in sorted(where.glob("*.json")) if files.JOB_NAME.fullmatch(job) else []:
        try:
            found.append(read(p))
        except BadInput as e:
            (damaged if damaged is not None else []).append(e)
    return sorted(found, key=lambda r: r["created"])


def find(name: str) -> RunRecord | None:
    """The record `name` means: `JOB/RUN` (that job's run), else the newest run of job `name` (a
    job's own name wins over another job's run id or record that happens to equal it), else a run
    id or a record id (any job). A run id two jobs share is refused, naming both as `JOB/RUN` (never
    one picked silently). A job whose every record is damaged is that damage, one line naming the
    newest file (not "no record"). Failing all of those, a unique prefix of a run id or record id
    (at least PREFIX_MIN characters; a trailing "…" of a cut table cell is taken off)."""
    if "/" in name:
        job, _, run = name.partition("/")
        where = path(job, run)  # bad input when either part is not a name
        return read(where) if os.path.lexists(where) else None
    damaged: list[BadInput] = []
    runs = of_job(name, damaged)
    if runs:
        return runs[-1]
    if damaged:
        raise damaged[-1]
    dirs = _job_dirs()
    if files.RUN_ID.fullmatch(name) and ".." not in name:
        # lexists: a link or a FIFO where the record was is named, not passed over
        hits = [d / f"{name}.json" for d in dirs if os.path.lexists(d / f"{name}.json")]
        if len(hits) > 1:
            raise Ambiguous(f"run id {name!r}", [f"{p.parent.name}/{name}" for p in hits])
        if hits:
            return read(hits[0])
    if len(name) == record.ID_CHARS:
        found = [rec for rec in _all_records(dirs) if rec["id"] == name]
        if len({(r["job"], r["run_id"]) for r in found}) > 1:
            raise Ambiguous(f"record id {name!r}", [f"{r['job']}/{r['run_id']}" for r in found])
        if found:
            return found[0]
    return _by_prefix(name, dirs)


# the shortest prefix of a run or record id taken for the whole (git's and docker's 4); a table cut
# at a narrow terminal ends an id with "…", which is taken off
PREFIX_MIN = 4


def _by_prefix(name: str, dirs: list[Path]) -> RunRecord | None:
    """The one run whose run id or record id starts with `name`, as git and docker take a unique
    prefix; more than one is refused naming each as JOB/RUN; None when none."""
    prefix = name.removesuffix("…").removesuffix("...")
    if len(prefix) < PREFIX_MIN or not files.RUN_ID.fullmatch(prefix.rstrip("-_.") or "-"):
        return None
    runs = {(d.name, p.stem) for d in dirs for p in d.glob("*.json") if p.stem.startswith(prefix)}
    if all(c in "0123456789abcdef" for c in prefix):
        runs |= {(r["job"], r["run_id"]) for r in _all_records(dirs) if r["id"].startswith(prefix)}
    if len(runs) > 1:
        raise Ambiguous(f"prefix {prefix!r}", [f"{j}/{r}" for j, r in sorted(runs)])
    if not runs:
        return None
    job, run = runs.pop()
    return read(path(job, run))


class Ambiguous(BadInput):
    """An id more than one run answers to: each named in the form that means it alone."""

    def __init__(self, what: str, forms: list[str]):
        super().__init__(
            f"{what} names {len(forms)} runs: {', '.join(forms)}",
            hint=f"name one as JOB/RUN, e.g. `fsdpctl job describe {forms[0]}`",
        )
        self.forms = forms


def _all_records(dirs: list[Path]) -> list[RunRecord]:
    """Every readable record in `dirs` (a record id lookup: damaged ones are passed over)."""
    found = []
    for p in (p for d in dirs for p in sorted(d.glob("*.json"))):
        try:
            found.append(read(p))
        except BadInput:
            continue
    return found


def _job_dirs() -> list[Path]:
    """The directories of records/, one per job; anything else there is said once and passed
    over."""
    found = []
    for entry in sorted(root().iterdir()) if root().is_dir() else []:
        if entry.is_symlink() or not entry.is_dir():
            files.skipped(entry, f"is {files.kind_of(entry)}, not a directory of run records")
        else:
            found.append(entry)
    return found

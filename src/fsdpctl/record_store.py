"""Where run records live on this machine, and making one at `job run` (fsdpctl.record is the pure core).

    FSDPCTL_HOME/records/<job>/<run-id>.json    one per run, whatever the backend (EKS: a copy of the
                                                 ConfigMap <job>-record, which goes with its job)

Beside the jobs directory, not in it: `cleanup` removes an ended job's files, and a record is what lets
`job diff` compare a run with one long gone.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from fsdpctl import files, record, render
from fsdpctl.errors import BadInput
from fsdpctl.files import home, write_atomic
from fsdpctl.settings import Config


def root() -> Path:
    return home() / "records"


def path(job: str, run_id: str) -> Path:
    return root() / files.job_name(job) / f"{files.run_id(run_id)}.json"


def new(cfg: Config, run_id: str) -> dict[str, Any]:
    """The record of the run about to start: the settings, the code it runs, the image (EKS: by reference;
    its digest is known once a pod pulled it)."""
    from fsdpctl.adapters.git import code_version

    image = None
    if cfg.backend == "eks":
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


def save(rec: dict[str, Any]) -> Path:
    """Atomically (files.write_atomic: a reader sees the old record or the new one, never half of one)."""
    where = path(rec["job"], rec["run_id"])
    write_atomic(where, json.dumps(rec, indent=1, default=str) + "\n")
    return where


def discard(where: Path) -> None:
    """The record of a run that did not start, and the directories made for it alone."""
    where.unlink(missing_ok=True)
    for parent in (where.parent, root(), home()):
        try:
            parent.rmdir()  # only when empty
        except OSError:
            return


def read(where: Path) -> dict[str, Any]:
    try:
        rec = json.loads(where.read_text())
    except (OSError, ValueError) as e:
        raise BadInput(f"run record {where} cannot be read ({type(e).__name__})", hint="remove it") from e
    problem = record.problem(rec)
    if problem:
        raise BadInput(f"{where} {problem}", hint="remove it, or run the job again for a new record")
    return rec


def of_job(job: str) -> list[dict[str, Any]]:
    """Every run record of job `job` on this machine, oldest first (damaged ones skipped)."""
    found = []
    for p in sorted((root() / job).glob("*.json")) if files.JOB_NAME.fullmatch(job) else []:
        try:
            found.append(read(p))
        except BadInput:
            continue
    return sorted(found, key=lambda r: r.get("created", 0))


def find(name: str) -> dict[str, Any] | None:
    """The record `name` means: a run id or a record id (any job), else the newest run of job `name`."""
    if files.RUN_ID.fullmatch(name) and ".." not in name:
        for p in sorted(root().glob(f"*/{name}.json")):
            return read(p)
    for p in sorted(root().glob("*/*.json")) if len(name) == record.ID_CHARS else []:
        try:
            rec = read(p)
        except BadInput:
            continue
        if rec["id"] == name:
            return rec
    runs = of_job(name)
    return runs[-1] if runs else None

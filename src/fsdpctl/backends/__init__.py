"""Where jobs run: one `Backend` interface (fsdpctl.job.protocol), one folder per place (eks/,
local/, slurm/), resolved once per command.

Each place is registered once, in `fsdpctl.targets.TARGETS` (what it is, and its `Backend` class);
each renders the same `fsdpctl.job.spec.JobSpec`. Every job verb (run, status, logs, stop, list,
wait, cleanup, the run record's, TensorBoard's) speaks to a `Backend`, through the job core
(fsdpctl.job) for what changes a job, and no code outside this package compares a backend's name
(tests/test_backend_neutral.py). A job's placement, the backend it was started on, is in its state
(FSDPCTL_HOME/jobs/<job>/state.json, `fsdpctl.job.listing.placement`), so `fsdpctl job status NAME`
after `fsdpctl job run --backend eks -d` looks on the cluster without being told.
"""

from __future__ import annotations

import re
import typing
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fsdpctl import files
from fsdpctl.errors import BadInput
from fsdpctl.files import home
from fsdpctl.job import listing
from fsdpctl.job.crilog import LogLine
from fsdpctl.job.listing import PLACEMENT_KEYS
from fsdpctl.job.protocol import Backend, KeptRecord, Started, Submitted
from fsdpctl.job.reports import FINAL
from fsdpctl.settings.rules import DNS_LABEL, JobKind
from fsdpctl.targets import NAMES, resolve, target

if TYPE_CHECKING:
    from fsdpctl.settings import Config

# a job's log line (fsdpctl.job.crilog); the protocol's types (fsdpctl.job.protocol)
__all__ = ["FINAL", "Backend", "KeptRecord", "LogLine", "Started", "Submitted"]


def create(cfg: Config) -> Backend:
    """The implementation for cfg.backend (its `Target.backend`); imports only what that backend
    needs (no kubernetes locally)."""
    made: Backend = resolve(cfg.target.backend)(cfg)
    return made


def factory(cfg: Config) -> Callable[[str], Backend]:
    """Backends by name with the command's settings (one of each): what the job core asks about a
    job that lives on another backend than BACKEND, and `job list` about every backend."""
    made: dict[str, Backend] = {}

    def get(name: str) -> Backend:
        if name not in made:
            made[name] = create(cfg.model_copy(update={"backend": name}))
        return made[name]

    return get


def check_name(backend: str | None) -> None:
    if backend is not None and backend not in NAMES:
        raise BadInput(f"--backend {backend!r} is not a backend", hint=f"use {' or '.join(NAMES)}")


def _legacy_placement_path(job: str) -> Path:
    return home() / "started" / f"{job}.json"


def placement_of(job: str) -> dict[str, str] | None:
    """Where job `job` lives: its state's placement, else (a home from before the job core) the
    placement file `run` wrote then under FSDPCTL_HOME/started/. A damaged one counts as none, with
    a warning naming it: the verb then looks where BACKEND says."""
    found = listing.placement(job)
    if found is not None:
        return found
    path = _legacy_placement_path(job)
    try:
        data = files.read_json(path, limit=PLACEMENT_MAX_BYTES)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        files.skipped(path, files.why(e), "ignored (the job is looked for at BACKEND)")
        return None
    if not placement_ok(data):
        files.skipped(
            path, "is not a placement fsdpctl wrote", "ignored (the job is looked for at BACKEND)"
        )
        return None
    return {k: str(data[k]) for k in ("backend", *PLACEMENT_KEYS) if k in data}


PLACEMENT_MAX_BYTES = 64 * 1024  # four short strings


def placement_ok(data: Any) -> bool:
    """The shape a placement has, each value one the settings would take (they go into API
    paths)."""
    if not isinstance(data, dict) or data.get("backend") not in NAMES:
        return False
    if not all(isinstance(data[k], str) for k in PLACEMENT_KEYS if k in data):
        return False
    kinds = typing.get_args(JobKind)
    namespace_ok = re.fullmatch(DNS_LABEL, data.get("job_namespace", "fsdp")) is not None
    return namespace_ok and data.get("job_kind", kinds[0]) in kinds


def placed(cfg: Config, job: str | None, flag: str | None, *, acts: bool = False) -> Config:
    """The settings a verb on `job` runs with: `--backend` wins; else where the job was started;
    else BACKEND. When the record decides, its namespace, kind and context come with it. `acts`: a
    verb that changes the job (stop, cleanup): a --backend that is not the one the job's state
    names is refused (one line naming both), never taken to mean another backend's job of that
    name (which this home did not start)."""
    update = placement_update(job, flag, acts=acts)
    return cfg.model_copy(update=update) if update else cfg


def placement_update(job: str | None, flag: str | None, *, acts: bool = False) -> dict[str, str]:
    """What `placed` changes in the settings (nothing: BACKEND's, as they are)."""
    check_name(flag)
    if flag is not None:
        if acts and job:
            not_its_backend(job, placement_of(job), flag)
        return {"backend": flag}
    record = placement_of(job) if job else None
    if record is None:
        return {}
    return {k: v for k, v in record.items() if k == "backend" or k in PLACEMENT_KEYS}


def reader(name: str, load: Callable[[], Config]) -> Backend:
    """Backend `name` for a verb that only reads (`job list`, `job status`): one that reads its
    settings only when it acts (`settings_on_demand`: the local backend, whose reports are files in
    this home) is handed `load` and never calls it to read; any other gets `load()`, the settings
    loaded and checked whole, at once."""
    cls = resolve(target(name).backend)
    made: Backend = cls(load) if getattr(cls, "settings_on_demand", False) else cls(load())
    return made


def readers(load: Callable[[], Config]) -> Callable[[str], Backend]:
    """`factory` for a verb that only reads: each backend by `reader`, its settings loaded only if it
    needs them."""
    made: dict[str, Backend] = {}

    def get(name: str) -> Backend:
        if name not in made:
            made[name] = reader(name, lambda: load().model_copy(update={"backend": name}))
        return made[name]

    return get


def not_its_backend(job: str, where: dict[str, str] | None, flag: str) -> None:
    """BadInput when job `job` is recorded here on another backend than --backend `flag`."""
    if where is not None and where["backend"] != flag:
        raise BadInput(
            f"job {job} runs on {where['backend']} (its state here says so), not on --backend {flag}",
            hint=f"leave --backend out (the verb acts where the job runs), or pass --backend "
            f"{where['backend']}",
        )

"""Where jobs run: one `Backend` interface, one folder per place (eks/, local/), resolved once per
command.

Each place is registered once, in `fsdpctl.targets.TARGETS` (what it is, and its `Backend` class);
each renders the same `fsdpctl.jobspec.JobSpec`. Every job verb (run, status, logs, stop, list,
wait, cleanup, the run record's, TensorBoard's) speaks to a `Backend`, and no code outside this
package compares a backend's name (tests/test_backend_neutral.py). A job's placement, the backend it
was started on, is kept under FSDPCTL_HOME/started/ (`save_placement`), so `fsdpctl job status NAME`
after `fsdpctl job run --backend eks -d` looks on the cluster without being told.
"""

from __future__ import annotations

import json
import re
import typing
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from fsdpctl import files
from fsdpctl.crilog import LogLine
from fsdpctl.errors import BadInput
from fsdpctl.files import home, write_atomic
from fsdpctl.reports import FINAL, Report, Waited
from fsdpctl.settings import DNS_LABEL, Config, Settings
from fsdpctl.targets import NAMES, resolve
from fsdptrain import events

# What a record keeps besides the backend: the settings that say where on that backend the job
# lives.
PLACEMENT_KEYS = ("job_namespace", "job_kind", "kube_context")
__all__ = ["FINAL", "LogLine"]  # a job's log line, defined with the log format (fsdpctl.crilog)


@dataclass
class Started:
    """What `run` did: the job and run id, where its output goes, and (dry run) what it would have
    done."""

    job: str
    run_id: str
    where: str
    dry_run_lines: list[str] = field(default_factory=list)


@dataclass
class KeptRecord:
    """A job's run record as its place keeps it (EKS: a ConfigMap beside the job), with the lines of
    the leader's log that the record learnt from, where it was read, and what is wrong with it."""

    record: dict[str, Any]
    lines: list[str]
    where: str
    problems: list[str]


class Backend(Protocol):
    """A place where jobs run. Every answer has one shape whichever backend gives it
    (fsdpctl.reports)."""

    name: str
    poll_s: float

    def run(
        self, *, run_id: str | None, replace: bool, dry_run: bool, server_dry_run: bool
    ) -> Started: ...

    def report(self, name: str, stall_after: float = float("inf")) -> Report: ...

    def logs(
        self,
        name: str,
        *,
        follow: bool,
        all_: bool,
        node: int | None,
        pod: str | None,
        tail: int | None = None,
        since_s: float | None = None,
    ) -> Iterator[LogLine]:
        """The chosen logs' lines: per node or pod its last `tail` lines, those of the last
        `since_s` seconds, as PodLogOptions tailLines and sinceSeconds choose them; with `follow`,
        then what comes until the job ends."""
        ...

    def tail(self, name: str, lines: int) -> list[str]: ...

    def history(self, name: str) -> list[events.Event]:
        """Every event line of the leader's whole log (this run's): what `job plot` draws."""
        ...

    def outcomes(self, name: str) -> dict[str, str]:
        """run id -> how that run of the job ended, in words (`progress.run_outcome`), for the runs
        whose output this backend can still read (local: every run's logs; eks: the current run's
        pods)."""
        ...

    def tensorboard_dir(self, name: str) -> str | None:
        """Where the job's TensorBoard event files are (local: on this machine; eks: in the pods),
        None when it was started without TENSORBOARD_DIR."""
        ...

    def tensorboard_elsewhere(self, name: str, argv: list[str]) -> list[str] | None:
        """How to serve the job's TensorBoard files (`argv` serves them where they are) when this
        machine cannot read them: lines to print; None when `argv` runs here."""
        ...

    def run_lines(self, job: str, run_id: str) -> list[str] | None:
        """The log lines of one run of `job` as this machine keeps them (local: every node's log of
        the run); None where the logs are not here (EKS: `kept_record` reads the pods')."""
        ...

    def here(self, path: str) -> str | None:
        """Where a path the trainer sees is on this machine (local: a claim's directory under
        FSDPCTL_HOME/volumes); None where this machine cannot see the job's files."""
        ...

    def kept_record(self, job: str) -> KeptRecord | None:
        """The job's run record as its place keeps it (EKS: its ConfigMap, with what the cluster
        learnt since); None where only this machine keeps records (fsdpctl.record_store)."""
        ...

    def stop(
        self, name: str, *, wait: bool, dry_run: bool, say: Callable[[str], None] | None = None
    ) -> str:
        """Stop the job; with `wait`, until it has ended, saying through `say` what it waits for."""
        ...

    def interrupt(self, name: str) -> Report | None: ...

    def list_jobs(self) -> list[Report]: ...

    def wait(self, name: str, timeout: float | None) -> Waited: ...

    def cleanup(self, *, checkpoints: bool, dry_run: bool) -> list[str]: ...


def create(cfg: Config) -> Backend:
    """The implementation for cfg.backend (its `Target.backend`); imports only what that backend
    needs (no kubernetes locally)."""
    made: Backend = resolve(cfg.target.backend)(cfg)
    return made


def check_name(backend: str | None) -> None:
    if backend is not None and backend not in NAMES:
        raise BadInput(f"--backend {backend!r} is not a backend", hint=f"use {' or '.join(NAMES)}")


def _placement_path(job: str) -> Path:
    return home() / "started" / f"{job}.json"


def save_placement(cfg: Config) -> None:
    """Called by `run`: the job NAME now lives on cfg.backend, in that namespace/kind/context."""
    record = {"backend": cfg.backend, **{k: getattr(cfg, k) for k in PLACEMENT_KEYS}}
    write_atomic(_placement_path(cfg.job_name), json.dumps(record, indent=1) + "\n")


def placement_of(job: str) -> dict[str, str] | None:
    """The placement `run` recorded for this job name, if any. A damaged record (not a regular file,
    not JSON, not its shape: read as fsdpctl.files reads back what it wrote) counts as none, with a
    warning naming it: the verb then looks where BACKEND says."""
    path = _placement_path(job)
    try:
        data = files.read_json(path, limit=PLACEMENT_MAX_BYTES)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        files.skipped(path, files.why(e), "ignored (the job is looked for at BACKEND)")
        return None
    if not _placement_ok(data):
        files.skipped(
            path, "is not a placement fsdpctl wrote", "ignored (the job is looked for at BACKEND)"
        )
        return None
    return {k: str(data[k]) for k in ("backend", *PLACEMENT_KEYS) if k in data}


PLACEMENT_MAX_BYTES = 64 * 1024  # four short strings


def _placement_ok(data: Any) -> bool:
    """The shape `save_placement` writes, each value one the settings would take (they go into API
    paths)."""
    if not isinstance(data, dict) or data.get("backend") not in NAMES:
        return False
    if not all(isinstance(data[k], str) for k in PLACEMENT_KEYS if k in data):
        return False
    kinds = typing.get_args(Settings.model_fields["job_kind"].annotation)
    namespace_ok = re.fullmatch(DNS_LABEL, data.get("job_namespace", "fsdp")) is not None
    return namespace_ok and data.get("job_kind", kinds[0]) in kinds


def placed(cfg: Config, job: str | None, flag: str | None) -> Config:
    """The settings a verb on `job` runs with: `--backend` wins; else where the job was started;
    else BACKEND. When the record decides, its namespace, kind and context come with it."""
    check_name(flag)
    if flag is not None:
        return cfg.model_copy(update={"backend": flag})
    record = placement_of(job) if job else None
    if record is None:
        return cfg
    return cfg.model_copy(
        update={k: v for k, v in record.items() if k == "backend" or k in PLACEMENT_KEYS}
    )

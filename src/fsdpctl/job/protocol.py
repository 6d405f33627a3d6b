"""The Backend protocol: what a place that runs jobs does for the core and the CLI (pure types).

As torchx's Scheduler (torchx/schedulers/api.py: submit_dryrun, schedule, describe, log_iter,
cancel, list) under its Runner: a backend submits, observes, signals, cancels and says where its
logs are; the runner (fsdpctl.job.runner) holds the job's lock, records the run and its state, and
cancels a submit it could not record. Every answer has one shape whichever backend gives it
(fsdpctl.job.reports).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from fsdpctl.errors import SettingsError
from fsdpctl.job.crilog import LogLine
from fsdpctl.job.owner import Owner
from fsdpctl.job.record import RunRecord
from fsdpctl.job.reports import Report, Waited
from fsdptrain import events


@dataclass
class Started:
    """What `run` did: the job and run id, where its output goes, and (dry run) what it would have
    done: in lines for a person, and as the documents it would create (kubectl's `--dry-run -o
    yaml` prints the objects, not their names): the Kubernetes objects, and on Slurm the batch
    script."""

    job: str
    run_id: str
    where: str
    dry_run_lines: list[str] = field(default_factory=list)
    objects: list[dict[str, Any]] = field(default_factory=list)
    script: str | None = None


@dataclass
class Submitted:
    """What a backend's `submit` started: the keys the job's state records for it (the outside id:
    a Slurm job id, a supervisor's identity), the run record as submitted (with what the place
    learnt), where its output goes, and how to cancel it by hand should fsdpctl fail to (named in
    the line that says so)."""

    state: dict[str, Any]  # the backend's own keys (its Target's `state` Keys), over the core's
    record: RunRecord
    where: str
    outside: str  # in words: "Slurm job 1234", "PyTorchJob fsdp/fsdp", "supervisor pid 77"
    cancel_command: str  # what cancels it by hand: "scancel 1234"


@dataclass
class KeptRecord:
    """A job's run record as its place keeps it (EKS: a ConfigMap beside the job), with the lines of
    the leader's log that the record learnt from, where it was read, and what is wrong with it."""

    record: RunRecord
    lines: list[str]
    where: str
    problems: list[str]


class Backend(Protocol):
    """A place where jobs run."""

    name: str
    poll_s: float
    # what the backend's `list_jobs` and `cleanup` passed over (a stray file, a damaged state)
    notes: list[str]
    # its state keeps a record of every submitted job here (local, Slurm); False where the place
    # itself keeps them and lists jobs started from anywhere (EKS: the cluster)
    keeps_state: ClassVar[bool]
    # a process of the backend records the run's progress into the job's state from its start (the
    # local supervisor): `submit` writes the state before it starts that process, and the runner
    # merges its own keys in rather than writing the state afresh
    supervised: ClassVar[bool]

    def refusals(self) -> list[str]:
        """What this place refuses of the job before anything is written, beyond the settings' own
        checks: one line each, naming the key, the value and the fix (EKS: an image with no
        registry; local: a package the trainers need, a checkpoint it must not resume; Slurm: a
        SHARED_VOLUME_PATH not mounted here). `config validate` lists them with every other
        refusal; `dry_run` and `prepare` refuse on them."""
        ...

    def dry_run(self, *, run_id: str, server: bool) -> Started:
        """What `submit` would do, contacting nothing (server: the place checks it, changing
        nothing); writes nothing."""
        ...

    def prepare(self, record: RunRecord) -> RunRecord:
        """The run record with what the backend adds before anything is submitted (the manifests or
        batch script it will submit); BadInput for a setting the place cannot honour."""
        ...

    def submit(self, *, run_id: str, record: RunRecord, replace: bool) -> Submitted:
        """Start the run at its place. Called with the job's lock held and its record saved; on an
        exception nothing of the run may be left started."""
        ...

    def find_submitted(self, mine: Owner) -> Submitted | None:
        """The submission of run `mine` its place holds, found by the run's owner token (a Slurm
        job's comment, a Kubernetes label), whatever an interrupted submit said; None when the
        place holds none; FsdpctlError when the place cannot answer (unknown is not "none")."""
        ...

    def cancel(self, submitted: Submitted) -> None:
        """Undo a `submit` the core could not record (scancel, delete, SIGTERM); FsdpctlError when
        it cannot."""
        ...

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
        keep: Callable[[LogLine], bool] | None = None,
    ) -> Iterator[LogLine]:
        """The chosen logs' lines that `keep` keeps (all without it): per node or pod its last
        `tail` of those, those of the last `since_s` seconds, as PodLogOptions tailLines and
        sinceSeconds choose lines; with `follow`, then what comes until the job ends. `tail` counts
        kept lines: `job logs --tail 3 --trainer-only` is three of the trainer's lines."""
        ...

    def tail(self, name: str, lines: int) -> list[str]: ...

    def history(self, name: str) -> list[events.Event]:
        """Every event line of the leader's whole log (this run's): what `job plot` draws."""
        ...

    def outcomes(self, name: str) -> dict[str, str]:
        """run id -> how that run of the job ended, in words (`progress.run_outcome`), for the runs
        whose output this backend can still read."""
        ...

    def tensorboard_dir(self, name: str) -> str | None: ...

    def tensorboard_elsewhere(self, name: str, argv: list[str]) -> list[str] | None: ...

    def run_lines(self, job: str, run_id: str) -> list[str] | None:
        """The log lines of one run of `job` as this machine can read them (local: every node's log
        of the run; Slurm: the leader's on the shared file system); None where they are not here."""
        ...

    def here(self, path: str) -> str | None:
        """Where a path the trainer sees is on this machine; None where this machine cannot see the
        job's files."""
        ...

    def kept_record(self, job: str) -> KeptRecord | None: ...

    def stop(
        self, name: str, *, wait: bool, dry_run: bool, say: Callable[[str], None] | None = None
    ) -> str:
        """Stop the job; with `wait`, until it has ended, saying through `say` what it waits for."""
        ...

    def interrupt(self, name: str) -> Report | None: ...

    def list_jobs(self) -> list[Report]: ...

    def wait(
        self, name: str, timeout: float | None, say: Callable[[str], None] | None = None
    ) -> Waited:
        """Until the job ends (its final phase) or `timeout` passes (TIMEOUT, or the phase it had).
        A place that gives no answer is waited out, saying so once through `say`: unknown is not an
        end."""
        ...

    def cleanup(
        self, *, checkpoints: bool, dry_run: bool, job: str | None = None, force: bool = False
    ) -> list[str]:
        """Each ended job's files (only `job`'s when given); with `checkpoints` its checkpoints.
        Only what carries this home's owner mark; with `force` also what carries none (never
        another home's or job's), and a job whose place cannot prove it ended (Slurm: "Invalid job
        id" while its log is fresh; a running one never). Each item is "<what> (owner:
        <Mark.describe()>)"; what is kept goes to the backend's `kept` list as "<what>: <why>
        (owner: ...)" (docs/ownership.md)."""
        ...


# a backend by name, with the command's settings: how the core reaches a job's place when the job
# lives on another backend than the command's (runner, submit.settle, listing)
Factory = Callable[[str], Backend]


def refuse(lines: list[str]) -> None:
    """A place's refusals (Backend.refusals), all at once: one line each, exit 2."""
    if lines:
        raise SettingsError(lines)

"""Who made a thing: fsdpctl's owner identity, and the one rule every verb that changes an outside
thing follows: it acts only on what carries this identity, never on a name alone.

An identity is three parts:

    home    a random id made once per FSDPCTL_HOME (FSDPCTL_HOME/home-id): two laptops on one
            cluster or one shared volume are two homes, whatever their job names
    job     the job's name
    run_id  the run (unique per job: a reused --run-id is refused), so home + job + run id is also
            the submit's idempotency token (AWS's ClientToken; a Slurm comment squeue finds)

It is written on everything fsdpctl makes: labels fsdpctl.io/home, fsdpctl.io/job, fsdpctl.io/run-id
on Kubernetes objects (and ownerReferences to the job object for its Secret, ConfigMap and PDB, so
the garbage collector deletes them with their owner), the Slurm job's --comment (with the user who
submitted it), and an owner file in every run directory on a shared volume.

The models: the kubelet acts on a pod's UID, not its name; SkyPilot tags each cluster with the
user's hash and `sky down` refuses one it does not own; AWS's idempotency tokens make a retried
create not a second one.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from fsdpctl import files
from fsdpctl.errors import BadInput

HOME_ID_FILE = "home-id"
HOME_ID = re.compile(r"[0-9a-f]{16}")
OWNER_FILE = ".fsdpctl-owner.json"  # in every run directory fsdpctl makes on a shared volume

# the Kubernetes labels (and the Slurm comment's parts) that carry the identity
HOME_LABEL = "fsdpctl.io/home"
JOB_LABEL = "fsdpctl.io/job"
RUN_LABEL = "fsdpctl.io/run-id"
TOKEN_LABEL = "fsdpctl.io/submit"
COMMENT_PREFIX = "fsdpctl"
_COMMENT = re.compile(r"fsdpctl:home=([0-9a-f]{16}),job=([a-z0-9-]{1,63}),token=([0-9a-f]{16})")


def home_id(root: Path | None = None) -> str:
    """This home's id: read from FSDPCTL_HOME/home-id, made once (O_EXCL: two fsdpctls making it at
    once agree on the first). A file there that is not an id is bad input, never replaced: every
    thing this home made carries the id it holds."""
    root = root or files.home()
    path = root / HOME_ID_FILE
    try:
        return _read_id(path)
    except FileNotFoundError:
        pass
    files.make_dirs(root)
    made = secrets.token_hex(8)
    try:
        fd = os.open(
            path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
        )
    except FileExistsError:
        return _read_id(path)
    with os.fdopen(fd, "w", encoding="ascii") as f:
        f.write(made + "\n")
        f.flush()
        os.fsync(f.fileno())
    return made


def this_home() -> str | None:
    """This home's id, or None when it has none yet (then nothing anywhere carries it; nothing is
    made by asking: `cleanup --dry-run` and `config validate` write nothing)."""
    if not (files.home() / HOME_ID_FILE).exists():
        return None
    return home_id()


def _read_id(path: Path) -> str:
    try:
        text = files.read_regular(path, 1024).decode("ascii", errors="replace").strip()
    except files.NotOurs as e:
        raise BadInput(f"{path} {e.why}", hint=f"remove {path}: fsdpctl makes a new one") from None
    if not HOME_ID.fullmatch(text):
        raise BadInput(
            f"{path} is not this home's id (16 hex digits)",
            hint=f"remove {path} only if nothing this home started still runs: its things carry "
            "the old id, and fsdpctl then leaves them alone",
        )
    return text


@dataclass(frozen=True)
class Owner:
    """The identity of one run of one job made from one home."""

    home: str
    job: str
    run_id: str

    @property
    def token(self) -> str:
        """The submit's idempotency token: 16 hex digits of home, job and run id (fits a label
        value, a Slurm comment and a client token)."""
        return hashlib.sha256(f"{self.home}\0{self.job}\0{self.run_id}".encode()).hexdigest()[:16]

    def labels(self) -> dict[str, str]:
        """The labels every Kubernetes object of the run carries."""
        from fsdpctl.job.validate import label_value

        return {
            HOME_LABEL: self.home,
            JOB_LABEL: self.job,
            RUN_LABEL: label_value(self.run_id),
            TOKEN_LABEL: self.token,
        }

    def comment(self) -> str:
        """The Slurm job's --comment: squeue's %k finds the submit by it."""
        return f"{COMMENT_PREFIX}:home={self.home},job={self.job},token={self.token}"

    def document(self) -> dict[str, str]:
        """The owner file's content (a run directory on a shared volume)."""
        return {"home": self.home, "job": self.job, "run_id": self.run_id, "token": self.token}


@dataclass(frozen=True)
class Mark:
    """What a found thing says of its maker (any part may be missing: a thing fsdpctl never made
    carries none)."""

    home: str | None
    job: str | None
    token: str | None = None
    run_id: str | None = None

    def describe(self) -> str:
        """In words, for a line that names the owner (`cleanup --dry-run`)."""
        if self.home is None:
            return "no fsdpctl owner"
        return f"home {self.home}, job {self.job or '?'}" + (
            f", run {self.run_id}" if self.run_id else ""
        )


def of_labels(labels: Mapping[str, str] | None) -> Mark:
    labels = labels or {}
    return Mark(
        labels.get(HOME_LABEL),
        labels.get(JOB_LABEL),
        labels.get(TOKEN_LABEL),
        labels.get(RUN_LABEL),
    )


def of_comment(comment: str | None) -> Mark:
    m = _COMMENT.fullmatch((comment or "").strip())
    return Mark(m.group(1), m.group(2), m.group(3)) if m else Mark(None, None)


def why_not_ours(found: Mark, home: str, job: str, token: str | None = None) -> str | None:
    """Why a thing is not this home's `job` (and, with `token`, not this submit); None when it is."""
    if found.home is None:
        return "it carries no fsdpctl owner (made by someone else, or by hand)"
    if found.home != home:
        return f"it belongs to another fsdpctl home ({found.home})"
    if found.job != job:
        return f"it belongs to job {found.job} of this home"
    if token is not None and found.token != token:
        return "it belongs to another run of the job"
    return None


# ---- the owner file of a run directory on a shared volume ----------------------------------------


def write_file(directory: Path, owner: Owner) -> None:
    """The run directory's owner file (atomic; the directory is the caller's, just made)."""
    files.write_atomic(directory / OWNER_FILE, json.dumps(owner.document(), indent=1) + "\n")


def read_file(directory: Path) -> Mark:
    """What a run directory's owner file says; no owner when it is missing, damaged or not a
    regular file (a link or FIFO there is nobody's proof)."""
    try:
        data = files.loads(files.read_regular(directory / OWNER_FILE, 4096))
    except (OSError, ValueError):
        return Mark(None, None)
    if not isinstance(data, dict) or not all(isinstance(data.get(k), str) for k in ("home", "job")):
        return Mark(None, None)
    token, run_id = data.get("token"), data.get("run_id")
    return Mark(
        data["home"],
        data["job"],
        token if isinstance(token, str) else None,
        run_id if isinstance(run_id, str) else None,
    )


def dir_refusal(directory: Path | None, job: str) -> str | None:
    """Why a run of `job` must not write into the checkpoint directory `directory`: its owner file
    names another home (two laptops with one job name on one FSx) or another job. None when it is
    this home's job's, has no owner file (adopted by the run), or does not exist."""
    if directory is None or not directory.is_dir():
        return None
    found = read_file(directory)
    if found.home is None:
        return None
    why = why_not_ours(found, this_home() or "", job)
    if why is None:
        return None
    return (
        f"checkpoint directory {directory} is not job {job}'s of this home: {why} "
        f"(owner: {found.describe()}); this run would resume and overwrite its checkpoints. "
        f"Use another JOB_NAME or CHECKPOINT_SUBDIR, or, if it is yours to take, remove "
        f"{directory / OWNER_FILE}"
    )

"""The pre-step: a job's one preparation of its volumes and its one download from the Hugging Face
Hub, before any process group exists.

Its first container (`volume-prep`, fsdptrain.volumes) runs as root and does only that: it makes the
directories the job writes to on its claims, owned by the trainer's uid, since a new FSx for Lustre
file system's root is root's with mode 0755 and the kubelet never applies fsGroup to an FSx claim
(the driver's fsGroupPolicy ReadWriteOnceWithFSType): without it the download and the non-root
trainers got EACCES. The trainers wait for the pre-step's marker whenever there is a claim, so
nothing of the job writes before the directories are ready; an init container on every worker pod
was not possible, since a TrainJob's runtimePatches may not add one with a command (Trainer v2.3.0's
TrainJob CRD: initContainers take env, name, securityContext and volumeMounts only).

Why not the ranks themselves: local rank 0 of every node would download (16 copies of 138 GB for 70B
on 16 nodes) while the other ranks wait in a barrier under the collective timeout (10 minutes),
which a download of that size outlasts. Why not an init container on every pod: each would download
unless they took a lock on the shared volume, and FSx for Lustre honours flock only when mounted
with it. So:

- `job run` creates a one-shot Job `<job>-fetch` (batch/v1; locally a process the supervisor starts
  before the launchers) that runs `python -m fsdptrain.fetch` with the job's PRETRAINED, TOKENIZER
  and DATASET into HF_HOME on the shared volume, once, and writes a marker file there;
- the workers get FSDPTRAIN_FETCH_MARKER and HF_HUB_OFFLINE=1: each trainer process polls for the
  marker before it builds a process group (a file poll: no collective, no timeout), then reads only
  the cache;
- `job status` shows the pre-step's progress (files and bytes) from its event lines.

Only with a shared volume: without one there is no disk the pre-step and the workers share, and the
trainer downloads per node, still before any process group (fsdptrain.fetch.before_process_group).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Literal
from urllib.parse import urlsplit

from fsdpctl.errors import BadInput
from fsdpctl.job.kube_shapes import BatchJob
from fsdpctl.job.reports import PrestepReport
from fsdptrain.fetch import (
    MARKER_ENV,
    MODEL_PATTERNS,
    TOKENIZER_PATTERNS,
    WAIT_ENV,
    Fetched,
    FetchEvent,
    Progress,
    Target,
    repo_id_problem,
)
from fsdptrain.fetch import targets as fetch_targets

if TYPE_CHECKING:
    from fsdpctl.settings import Config

CONTAINER = "fetch"
PREP_CONTAINER = "volume-prep"
OF_LABEL = "fsdpctl.io/prestep-of"  # on the Job and its pod: the job it downloads for
SETTING_KEYS = ("PRETRAINED", "TOKENIZER", "DATASET")
CHECKPOINT_MOUNT = "/checkpoints"  # where pods mount CHECKPOINT_PVC (jobpolicy.POD_CHECKPOINT_ROOT)
TRAINER_UID = (
    1000  # the image's `trainer` user (docker/Dockerfile), the pods' runAsUser and fsGroup
)

if TYPE_CHECKING:
    from fsdpctl.settings import Config
# how long the trainers wait for a pre-step with nothing to download: its pod's scheduling and image
# pull
PREP_ONLY_WAIT_S = 900


def targets(cfg: Config) -> list[Target]:
    """The repos the job reads from the hub. Decided from the settings alone: on a pod nothing of
    this machine exists (the pre-step skips at run time a value that turns out to be a path there).
    """
    return fetch_targets(cfg.train_env(), exists=lambda _: False)


def needed(cfg: Config) -> bool:
    """Whenever a pod mounts a claim: its directories are prepared first (and hub repos
    downloaded)."""
    return bool(cfg.shared_volume or cfg.checkpoint_pvc)


def downloads(cfg: Config) -> bool:
    """Whether the pre-step downloads anything: hub repos, onto the shared volume."""
    return bool(cfg.shared_volume) and bool(targets(cfg))


def hf_home(cfg: Config) -> str:
    """The pods' HF_HOME: the Hugging Face cache on the shared volume."""
    return f"{cfg.shared_volume_path.rstrip('/')}/hf-cache"


def job_name(job: str) -> str:
    return f"{job[:57]}-fetch"  # a DNS label: at most 63 characters


def marker(cfg: Config, run_id: str) -> str:
    """One per run: a restarted run waits for its own pre-step, never for an older run's verdict. On
    the shared volume (in the HF cache), else on the checkpoint claim."""
    root = hf_home(cfg) if cfg.shared_volume else CHECKPOINT_MOUNT
    return f"{root}/.fsdpctl/prestep/{run_id}.json"


def trainer_env(cfg: Config, run_id: str) -> dict[str, str]:
    """What the workers add to their environment when a pre-step runs before them: its marker, how
    long to wait for it (PRESTEP_TIMEOUT when it downloads; a preparation alone takes the time its
    pod needs to start) and, when it downloads, offline mode."""
    if not needed(cfg):
        return {}
    wait = cfg.prestep_timeout if downloads(cfg) else min(cfg.prestep_timeout, PREP_ONLY_WAIT_S)
    env = {MARKER_ENV: marker(cfg, run_id), WAIT_ENV: str(wait)}
    return env | ({"HF_HUB_OFFLINE": "1"} if downloads(cfg) else {})


def fetch_env(cfg: Config) -> dict[str, str]:
    """The pre-step container's environment (the token comes as the Secret's file,
    HF_TOKEN_PATH)."""
    train = cfg.train_env()
    repos = {k: train[k] for k in SETTING_KEYS} if downloads(cfg) else {}
    home = {"HF_HOME": hf_home(cfg)} if cfg.shared_volume else {}
    return {**home, **repos, **hub_endpoint(), "PYTHONUNBUFFERED": "1"}


def hub_endpoint() -> dict[str, str]:
    """HF_ENDPOINT from fsdpctl's environment (huggingface_hub's constants.py: another hub, or a
    mirror) for the containers that download: a pod's environment is what its manifest says, where
    a local or a Slurm job inherits the shell's (sbatch --export=ALL). An endpoint with credentials
    in it is refused, unprinted: a manifest is no place for a secret (HF_TOKEN is the token's)."""
    endpoint = os.environ.get("HF_ENDPOINT", "")
    if not endpoint:
        return {}
    try:
        parts = urlsplit(endpoint)
        credentials = parts.username is not None or parts.password is not None
        url = parts.scheme in ("http", "https") and bool(parts.hostname)
    except ValueError:
        credentials, url = False, False
    if credentials:
        raise BadInput(
            "HF_ENDPOINT holds credentials (user:password@): the job's manifest would carry them",
            hint="set HF_ENDPOINT without them and the token in HF_TOKEN",
        )
    if not url:
        raise BadInput(
            f"HF_ENDPOINT={endpoint!r} is not an http(s) URL",
            hint="set HF_ENDPOINT to the hub's address (https://host[:port]) or unset it",
        )
    return {"HF_ENDPOINT": endpoint}


def prep_command(shares: list[str], dirs: list[str]) -> list[str]:
    """The volume-prep container's command (fsdptrain.volumes): each claim's mount point
    group-writable, the job's directories owned by the trainer's uid."""
    owner = f"{TRAINER_UID}:{TRAINER_UID}"
    return [
        "python",
        "-m",
        "fsdptrain.volumes",
        "--owner",
        owner,
        *(f"--share={s}" for s in shares),
        *dirs,
    ]


def fetch_command(cfg: Config, run_id: str) -> list[str]:
    return ["python", "-m", "fsdptrain.fetch", "--marker", marker(cfg, run_id)]


# ---- fsdpctl model fetch / data fetch ------------------------------------------------------------


def command_targets(cfg: Config, kind: str, repo: str | None, revision: str) -> list[Target]:
    """`model fetch [REPO]` / `data fetch [REPO]`: the repo given, else what the settings name."""
    if repo is not None:
        if why := repo_id_problem(repo):  # before any line about fetching it
            raise BadInput(
                f"{kind} {repo!r} is not a hub id: {why}",
                hint="give the repo as the hub names it, e.g. meta-llama/Llama-2-7b-hf",
            )
        patterns = (*MODEL_PATTERNS, *TOKENIZER_PATTERNS) if kind == "model" else None
        key = "model" if kind == "model" else "dataset"
        return [
            Target(kind, repo, key, tuple(dict.fromkeys(patterns)) if patterns else None, revision)
        ]
    found = [t for t in targets(cfg) if t.kind == kind]
    if not found:
        keys = "PRETRAINED (or TOKENIZER)" if kind == "model" else "DATASET"
        raise BadInput(
            f"no hub {kind} to fetch: {keys} names none (a hub id is namespace/name)",
            hint=f"give one: fsdpctl {'model' if kind == 'model' else 'data'} fetch ORG/NAME",
        )
    return [Target(t.kind, t.repo_id, t.key, t.patterns, revision) for t in found]


def destination(cfg: Config, to: Path | None, volumes: Path) -> Path:
    """The HF_HOME to fill: --to, else (locally) the shared volume's hf-cache directory that the
    local backend mounts at SHARED_VOLUME_PATH."""
    if to is not None:
        return to.expanduser().resolve()
    if cfg.target.on_this_machine and cfg.shared_volume:
        return volumes / cfg.shared_volume / "hf-cache"
    where = "without SHARED_VOLUME" if cfg.target.on_this_machine else f"on {cfg.target.where}"
    raise BadInput(
        f"no directory to fetch into {where}",
        hint="give --to DIR (an HF_HOME, e.g. the shared volume mounted here: --to /fsx/hf-cache)",
    )


def fmt_bytes(n: float) -> str:
    units = ("B", "KiB", "MiB", "GiB", "TiB")
    i = 0
    while n >= 1024 and i < len(units) - 1:
        n, i = n / 1024, i + 1
    return f"{n:.0f} B" if i == 0 else f"{n:.1f} {units[i]}"


def result_line(f: Fetched, dry_run: bool) -> str:
    size = f"{files(len(f.files))}, {fmt_bytes(f.bytes_total)}"
    what = f"{f.target.repo_id} ({f.target.kind} at {f.sha[:10]}): {size}"
    if not f.missing:
        return f"{what}; already complete, nothing downloaded"
    verb = "would download" if dry_run else "downloaded"
    return f"{what}; {verb} {files(len(f.missing))}, {fmt_bytes(f.bytes_missing)}"


def files(n: int) -> str:
    return f"{n} file" if n == 1 else f"{n} files"


def progress_line(p: Progress) -> str:
    if p.state == "downloading" and p.files_total:
        return f"{p.repo}: {counts(p.files_done, p.files_total, p.bytes_done, p.bytes_total)}"
    return f"{p.repo}: {p.state}"


def counts(files_done: int, files_total: int, bytes_done: int, bytes_total: int) -> str:
    return f"{files_done}/{files_total} files, {fmt_bytes(bytes_done)} of {fmt_bytes(bytes_total)}"


# ---- job status ----------------------------------------------------------------------------------


def report(records: list[FetchEvent], phase: str, reason: str | None = None) -> PrestepReport:
    """What `job status` says about the pre-step: its phase (Pending, Running, Succeeded, Failed)
    and the totals of its repos' last `fetch` lines."""

    def total(
        key: Literal["files_done", "files_total", "bytes_done", "bytes_total", "downloaded_bytes"],
    ) -> int:
        return sum(int(r.get(key) or 0) for r in records)

    failed = [r for r in records if r.get("state") == "failed"]
    error = failed[-1].get("error") if failed else reason
    return {
        "phase": "Failed" if failed else phase,
        "repos": [str(r.get("repo")) for r in records],
        "files_done": total("files_done"),
        "files_total": total("files_total"),
        "bytes_done": total("bytes_done"),
        "bytes_total": total("bytes_total"),
        "downloaded_bytes": total("downloaded_bytes"),
        "error": error if (failed or phase == "Failed") else None,
    }


def describe(p: PrestepReport) -> str:
    """One status row: 'Running: 3/7 files, 1.2 GiB of 13.5 GiB (org/name)'."""
    repos = f" ({', '.join(p['repos'])})" if p.get("repos") else ""
    if p["phase"] == "Failed":
        return f"Failed: {p.get('error') or 'see its log'}{repos}"
    if not p.get("files_total"):
        return f"{p['phase']}{repos}"
    done = counts(p["files_done"], p["files_total"], p["bytes_done"], p["bytes_total"])
    cached = (
        "; all cached, nothing downloaded"
        if p["phase"] == "Succeeded" and not p["downloaded_bytes"]
        else ""
    )
    return f"{p['phase']}: {done}{cached}{repos}"


def job_phase(job: BatchJob) -> tuple[str, str | None]:
    """A batch/v1 Job's phase as `job status` names it, and why it failed (its condition's message:
    which exit code met which podFailurePolicy rule, or the backoff limit)."""
    status = job.get("status") or {}
    for c in status.get("conditions") or []:
        if c.get("status") != "True":
            continue
        if c.get("type") in ("Complete", "SuccessCriteriaMet"):
            return "Succeeded", None
        if c.get("type") in ("Failed", "FailureTarget"):
            return "Failed", c.get("message") or c.get("reason")
    return ("Running" if status.get("active") else "Pending"), None

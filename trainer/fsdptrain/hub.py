"""The Hugging Face Hub side of a job's downloads: which repos its settings name (`targets`), the
token and the cache, and each repo's download (`plan`, `download`, progress as `fetch` event
lines), with every hub failure as one line that names the setting (`FetchError`). What runs it
before any process group, and how the trainers learn it is done, is fsdptrain.fetch.
"""

from __future__ import annotations

import json
import os
import re
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from fsdptrain import atomic
from fsdptrain.config import BUILTIN

PROGRESS_ENV = "FSDPTRAIN_FETCH_PROGRESS_S"  # seconds between progress lines (default 10)
# what the trainer reads from a model repo (hf_io.resolve_pretrained) and from a tokenizer's
MODEL_PATTERNS = ("*.safetensors", "*.json", "tokenizer*")
TOKENIZER_PATTERNS = ("*.json", "tokenizer*", "*.model", "*.txt")
# the Hub's repo ids: namespace/name, each starting with a letter or digit
_REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}")


class FetchError(Exception):
    """One line; `permanent` (a wrong id, no access): retrying cannot help, the job fails with exit
    2."""

    def __init__(self, message: str, *, permanent: bool) -> None:
        super().__init__(message)
        self.permanent = permanent


@dataclass(frozen=True)
class Target:
    kind: str  # model | dataset
    repo_id: str
    key: str  # the setting that named it: PRETRAINED, TOKENIZER, DATASET (or a command's argument)
    patterns: tuple[str, ...] | None = None  # None: the whole repo
    revision: str = "main"


@dataclass
class Fetched:
    """One repo: what it holds (after the patterns) and what this run had to download."""

    target: Target
    sha: str
    files: dict[str, int]  # path -> bytes
    missing: list[str]  # not in the cache before this run
    path: str = ""  # the snapshot directory

    @property
    def bytes_total(self) -> int:
        return sum(self.files.values())

    @property
    def bytes_missing(self) -> int:
        return sum(self.files[p] for p in self.missing)


@dataclass(frozen=True)
class Progress:
    """One `fetch` event line."""

    repo: str
    kind: str
    state: str  # checking | planned | downloading | complete | failed
    files_done: int = 0
    files_total: int = 0
    bytes_done: int = 0
    bytes_total: int = 0
    downloaded_bytes: int = 0  # fetched from the hub by this run (0: it was all cached)
    error: str | None = None
    time: float = field(default_factory=time.time)

    def line(self) -> str:
        return json.dumps({"event": "fetch", **asdict(self)}, separators=(",", ":"))


# a repo id as huggingface_hub checks it before any request (utils/_validators.py validate_repo_id,
# REPO_ID_REGEX: an optional namespace and a name of 1-96 ASCII letters, digits, '-', '_', '.', each
# starting and ending with a letter or digit; no '--' or '..'; not ending in '.git')
_HUB_REPO_ID = re.compile(
    r"(?:[A-Za-z0-9_](?:[\w.-]{0,94}[A-Za-z0-9_])?/)?[A-Za-z0-9_](?:[\w.-]{0,94}[A-Za-z0-9_])?",
    re.ASCII,
)


def repo_id_problem(value: str) -> str | None:
    """Why `value` is not a repo id the hub takes (validate_repo_id's rules), or None."""
    if _HUB_REPO_ID.fullmatch(value) and "--" not in value and ".." not in value:
        return None if not value.endswith(".git") else "it ends in .git"
    return (
        "a hub id is namespace/name (or name): letters, digits, '-', '_' and '.', at most 96 "
        "characters each, no '--' or '..'"
    )


def is_hub_id(value: str) -> bool:
    """`namespace/name` as the Hub spells repo ids; paths (/, ./, ~) and `builtin` are not."""
    return value != BUILTIN and bool(_REPO_ID.fullmatch(value)) and ".." not in value


def targets(
    values: Mapping[str, str], exists: Callable[[str], bool] = os.path.exists
) -> list[Target]:
    """The repos a job with these settings reads from the hub, each once. A value that exists here
    as a path is a local directory (as the trainer decides), not a repo."""
    pretrained, tokenizer = values.get("PRETRAINED", ""), values.get("TOKENIZER", "")
    dataset = values.get("DATASET", "")
    out = []
    if is_hub_id(pretrained) and not exists(pretrained):
        own_tokenizer = tokenizer in ("", pretrained)
        patterns = MODEL_PATTERNS + (TOKENIZER_PATTERNS if own_tokenizer else ())
        out.append(Target("model", pretrained, "PRETRAINED", tuple(dict.fromkeys(patterns))))
    if tokenizer != pretrained and is_hub_id(tokenizer) and not exists(tokenizer):
        out.append(Target("model", tokenizer, "TOKENIZER", TOKENIZER_PATTERNS))
    if is_hub_id(dataset) and not exists(dataset):
        out.append(Target("dataset", dataset, "DATASET"))
    return out


def token_from(env: Mapping[str, str]) -> str:
    """HF_TOKEN, else the file HF_TOKEN_PATH (the Secret in a pod, which is optional: absent, no
    token) or HF_TOKEN_FILE; '' when none. HF_TOKEN_FILE is the user's own setting (on Slurm the
    batch script passes it to the node that downloads): a file that is not there, or not readable,
    on this machine is a permanent FetchError naming it, where a silent '' would turn into a
    misleading "not found / gated" from the hub."""
    if env.get("HF_TOKEN"):
        return env["HF_TOKEN"].strip()
    for key in ("HF_TOKEN_PATH", "HF_TOKEN_FILE"):
        path = Path(env.get(key, "")).expanduser()
        if env.get(key) and path.is_file():
            try:
                return path.read_text().strip()
            except (OSError, UnicodeDecodeError) as e:
                raise FetchError(
                    f"{key}={env[key]} cannot be read on {socket.gethostname()}: {_why(e)}",
                    permanent=True,
                ) from e
    if env.get("HF_TOKEN_FILE"):
        raise FetchError(
            f"HF_TOKEN_FILE={env['HF_TOKEN_FILE']} is not a file on {socket.gethostname()}, where "
            "the download runs: put the token file where every node sees it (the shared file "
            "system), or set HF_TOKEN",
            permanent=True,
        )
    return ""


def _why(e: Exception) -> str:
    return e.strerror or str(e) if isinstance(e, OSError) else "not UTF-8 text"


def hub_cache(env: Mapping[str, str]) -> Path:
    """Where huggingface_hub keeps repos: HF_HUB_CACHE, else HF_HOME/hub, else
    ~/.cache/huggingface/hub."""
    if env.get("HF_HUB_CACHE"):
        return Path(env["HF_HUB_CACHE"]).expanduser()
    home = env.get("HF_HOME") or str(Path.home() / ".cache" / "huggingface")
    return Path(home).expanduser() / "hub"


# ---- one repo ------------------------------------------------------------------------------------


def storage_dir(cache: Path, target: Target) -> Path:
    """huggingface_hub's folder for a repo in a cache: models--org--name, datasets--org--name."""
    return cache / f"{target.kind}s--{target.repo_id.replace('/', '--')}"


def _ref(cache: Path, target: Target) -> str:
    try:
        return (storage_dir(cache, target) / "refs" / target.revision).read_text().strip()
    except OSError:
        return ""


def plan(target: Target, cache: Path, *, token: str, endpoint: str | None) -> Fetched:
    """Two API calls (the commit, its file list), nothing written: what is in the repo and not yet
    here."""
    from huggingface_hub import HfApi
    from huggingface_hub.hf_api import RepoFile
    from huggingface_hub.utils import filter_repo_objects

    api = HfApi(endpoint=endpoint, token=token or False)
    try:
        info = api.repo_info(target.repo_id, repo_type=target.kind, revision=target.revision)
        tree = api.list_repo_tree(
            target.repo_id, repo_type=target.kind, revision=info.sha, recursive=True
        )
        sizes = {f.path: f.size for f in tree if isinstance(f, RepoFile)}
    except Exception as e:  # noqa: BLE001 - every hub failure becomes one line (explain)
        raise explain(e, target, token_given=bool(token), endpoint=endpoint) from e
    patterns = list(target.patterns) if target.patterns else None
    wanted = sorted(filter_repo_objects(sizes, allow_patterns=patterns))
    snapshot = storage_dir(cache, target) / "snapshots" / str(info.sha)
    missing = [p for p in wanted if not (snapshot / p).exists()]
    return Fetched(target, str(info.sha), {p: sizes[p] for p in wanted}, missing, str(snapshot))


def explain(e: Exception, target: Target, *, token_given: bool, endpoint: str | None) -> FetchError:
    """A hub error as one line that names the setting and the fix (the token itself never
    appears)."""
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    what = f"{target.key}={target.repo_id!r}"
    # huggingface_hub validate_repo_id, before any request
    if type(e).__name__ == "HFValidationError":
        why = repo_id_problem(target.repo_id) or str(e)
        return FetchError(f"{what} is not a hub id: {why}", permanent=True)
    if isinstance(e, GatedRepoError):
        if not token_given:
            return FetchError(
                f"{what} is a gated repo: set HF_TOKEN or HF_TOKEN_FILE", permanent=True
            )
        return FetchError(
            f"{what}: the token has no access; request it on the repo's page", permanent=True
        )
    if isinstance(e, RepositoryNotFoundError):
        hint = "" if token_given else " (if it is private, set HF_TOKEN)"
        return FetchError(f"{what} is not a {target.kind} repo on the hub{hint}", permanent=True)
    if isinstance(e, RevisionNotFoundError):
        return FetchError(f"{what} has no revision {target.revision!r}", permanent=True)
    status = (
        e.response.status_code if isinstance(e, HfHubHTTPError) and e.response is not None else 0
    )
    if status == 401:
        return FetchError(f"{what}: the hub refused the token (invalid or expired)", permanent=True)
    where = endpoint or "huggingface.co"
    if "Timeout" in type(e).__name__:  # httpx's ConnectTimeout, ReadTimeout, ...: past the deadline
        return FetchError(
            f"{what}: the hub ({where}) did not answer in time ({type(e).__name__})",
            permanent=False,
        )
    return FetchError(
        f"{what}: the hub ({where}) failed: {type(e).__name__} {status or ''}".rstrip(),
        permanent=False,
    )


class _Deadline:
    """An httpx request hook: every timeout a request left unset (huggingface_hub's own client is
    made with `timeout=None`, and HfApi.repo_info and list_repo_tree pass `timeout=None` on: no
    deadline at all) becomes `seconds`. The timeouts travel in request.extensions["timeout"], which
    the transport reads after the request hooks ran (httpx Client._send_handling_redirects)."""

    seconds: float | None = None

    def __call__(self, request: Any) -> None:
        if self.seconds is None:
            return
        given = request.extensions.get("timeout") or {}
        request.extensions["timeout"] = {
            k: self.seconds if given.get(k) is None else given[k]
            for k in ("connect", "read", "write", "pool")
        }


_DEADLINE = _Deadline()


def hub_deadline(seconds: float) -> None:
    """Every request huggingface_hub sends from now on (on its shared client: `get_session`) waits
    at most `seconds` to connect and for each read."""
    from huggingface_hub import get_session

    _DEADLINE.seconds = seconds
    session = get_session()
    hooks = session.event_hooks
    if _DEADLINE not in hooks.get("request", []):
        session.event_hooks = {**hooks, "request": [*hooks.get("request", []), _DEADLINE]}


def download(
    f: Fetched, cache: Path, *, token: str, endpoint: str | None, report: Callable[[Progress], None]
) -> None:
    """The missing files through huggingface_hub (temp file, then rename into blobs/), progress
    every few seconds from what has landed; then `refs/<revision>` is published, atomically."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.utils import disable_progress_bars

    disable_progress_bars()  # the event lines say it, in a pod's log too
    stop = threading.Event()
    interval = float(os.environ.get(PROGRESS_ENV, "10"))
    watcher = threading.Thread(target=_watch, args=(f, cache, report, stop, interval), daemon=True)
    watcher.start()
    try:
        snapshot_download(
            f.target.repo_id,
            repo_type=f.target.kind,
            revision=f.sha,  # a commit: nothing is resolved again, no ref is written before the end
            cache_dir=str(cache),
            token=token or False,
            endpoint=endpoint,
            allow_patterns=list(f.target.patterns) if f.target.patterns else None,
        )
    except Exception as e:  # noqa: BLE001
        raise explain(e, f.target, token_given=bool(token), endpoint=endpoint) from e
    finally:
        stop.set()
        watcher.join()
    publish_ref(cache, f.target, f.sha)


def publish_ref(cache: Path, target: Target, sha: str) -> None:
    ref = storage_dir(cache, target) / "refs" / target.revision
    ref.parent.mkdir(parents=True, exist_ok=True)
    atomic.write_text(ref, sha)


def progress_now(f: Fetched, cache: Path, state: str) -> Progress:
    """Files whose snapshot link exists are done; partial bytes are the `.incomplete` blobs."""
    snapshot = Path(f.path)
    done = [p for p in f.files if (snapshot / p).exists()]
    partial = sum(
        b.stat().st_size for b in (storage_dir(cache, f.target) / "blobs").glob("*.incomplete")
    )
    return Progress(
        repo=f.target.repo_id,
        kind=f.target.kind,
        state=state,
        files_done=len(done),
        files_total=len(f.files),
        bytes_done=sum(f.files[p] for p in done) + partial,
        bytes_total=f.bytes_total,
        downloaded_bytes=f.bytes_missing if state == "complete" else 0,
    )


def _watch(
    f: Fetched,
    cache: Path,
    report: Callable[[Progress], None],
    stop: threading.Event,
    interval: float,
):
    while not stop.wait(interval):
        try:
            report(progress_now(f, cache, "downloading"))
        except OSError:  # a blob renamed while it was measured: the next look sees it
            continue


# ---- every repo of a job -------------------------------------------------------------------------


def fetch_one(
    target: Target,
    cache: Path,
    *,
    token: str,
    endpoint: str | None,
    report: Callable[[Progress], None],
    dry_run: bool = False,
) -> Fetched:
    """Plan; a complete snapshot (files and ref) is left alone; else download what is missing."""
    report(Progress(repo=target.repo_id, kind=target.kind, state="checking"))
    f = plan(target, cache, token=token, endpoint=endpoint)
    if dry_run:
        report(progress_now(f, cache, "planned"))
        return f
    if f.missing or _ref(cache, target) != f.sha:
        report(progress_now(f, cache, "downloading"))
        download(f, cache, token=token, endpoint=endpoint, report=report)
    report(progress_now(f, cache, "complete"))
    return f


def fetch_all(
    wanted: Iterable[Target],
    cache: Path,
    *,
    token: str,
    endpoint: str | None,
    report: Callable[[Progress], None],
    attempts: int = 1,
    dry_run: bool = False,
    sleep: Callable[[float], None] = time.sleep,
) -> list[Fetched]:
    """Each repo in turn; a transient failure (hub unreachable, 5xx) is tried `attempts` times."""
    done = []
    for target in wanted:
        for attempt in range(1, attempts + 1):
            try:
                done.append(
                    fetch_one(
                        target,
                        cache,
                        token=token,
                        endpoint=endpoint,
                        report=report,
                        dry_run=dry_run,
                    )
                )
                break
            except FetchError as e:
                if e.permanent or attempt == attempts:
                    report(
                        Progress(
                            repo=target.repo_id, kind=target.kind, state="failed", error=str(e)
                        )
                    )
                    raise
                sleep(min(60.0, 5.0 * 2 ** (attempt - 1)))
    return done

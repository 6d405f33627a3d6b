"""Hub downloads done once per job, before any process group exists.

`PRETRAINED`, `TOKENIZER` and `DATASET` may name Hugging Face Hub repos. Fetched by the ranks
themselves, one rank per node downloads while the others wait in a collective barrier under the
process group's timeout (10 minutes; 70B weights are about 138 GB), and every node downloads its own
copy. Instead:

- on a cluster, the pre-step (a one-shot Kubernetes Job that `fsdpctl job run` creates with the training job;
  locally a process the supervisor starts first) runs `python -m fsdptrain.fetch --marker M`: it downloads
  every repo once into the Hugging Face cache on the shared volume (HF_HOME) and writes the marker M;
- every trainer process waits for M before it builds a process group (`before_process_group`): no
  collective, no timeout; then it runs with HF_HUB_OFFLINE=1, so no rank touches the hub;
- without a pre-step (no shared volume, a plain `torchrun`), local rank 0 of each node runs the same
  download in a child process before any process group, the node's other ranks wait for its marker.

A download is idempotent (a repo whose snapshot is complete is not downloaded again: two API calls)
and atomic for readers: files land in `snapshots/<commit>/` through huggingface_hub's
temp-then-rename blobs, and only when all are there does `refs/<revision>` point at the commit,
which is what an offline load resolves. Progress goes to stdout as event lines:

    {"event":"fetch","repo":"org/name","kind":"model","state":"downloading","files_done":3,...}

The token comes from HF_TOKEN, else the file HF_TOKEN_PATH (the Kubernetes Secret) or HF_TOKEN_FILE;
it is never printed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, MutableMapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from fsdptrain.config import BUILTIN, ConfigError

MARKER_ENV = "FSDPTRAIN_FETCH_MARKER"  # set by fsdpctl when a pre-step downloads for the job
PROGRESS_ENV = "FSDPTRAIN_FETCH_PROGRESS_S"  # seconds between progress lines (default 10)
ATTEMPTS_ENV = "FSDPTRAIN_FETCH_ATTEMPTS"  # tries against an unreachable or failing hub (default 5)
# what the trainer reads from a model repo (checkpoint.resolve_pretrained) and from a tokenizer's
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


# ---- one repo --------------------------------------------------------------------------------------------


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
    """A hub error as one line that names the setting and the fix (the token itself never appears)."""
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    what = f"{target.key}={target.repo_id!r}"
    if (
        type(e).__name__ == "HFValidationError"
    ):  # huggingface_hub validate_repo_id, before any request
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
    tmp = ref.with_name(f".{ref.name}.{os.getpid()}.tmp")
    tmp.write_text(sha)
    os.replace(tmp, ref)


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


# ---- every repo of a job -------------------------------------------------------------------------------


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


# ---- the marker: how the pre-step tells every trainer process ------------------------------------------


def write_marker(path: Path, *, error: str | None, fetched: list[Fetched]) -> None:
    record = {
        "ok": error is None,
        "error": error,
        "time": time.time(),
        "repos": [
            {
                "kind": f.target.kind,
                "repo": f.target.repo_id,
                "sha": f.sha,
                "path": f.path,
                "files": len(f.files),
            }
            for f in fetched
        ],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(record) + "\n")
    os.replace(tmp, path)


def read_marker(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):  # not there yet (a rename makes it appear whole)
        return None


WAIT_ENV = (
    "FSDPTRAIN_FETCH_WAIT_S"  # how long a trainer waits for the pre-step's marker (PRESTEP_TIMEOUT)
)
DEFAULT_WAIT_S = 7200.0


def wait_timeout(environ: Mapping[str, str]) -> float:
    value = environ.get(WAIT_ENV, "")
    try:
        return float(value) if float(value) > 0 else DEFAULT_WAIT_S
    except ValueError:
        return DEFAULT_WAIT_S


def wait_for_marker(
    path: Path,
    *,
    say: Callable[[str], None],
    timeout_s: float = DEFAULT_WAIT_S,
    poll_s: float = 2.0,
    say_every_s: float = 60.0,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, Any]:
    """Until the marker exists: a plain file poll, no collective, up to `timeout_s`. A failed
    download, or none within the deadline (a pre-step that died before it could write the marker, or
    could not write it: a volume the download cannot write to), is a ConfigError (exit 2: retrying
    the trainer cannot fix it)."""
    start, next_say = clock(), clock()
    while (record := read_marker(path)) is None:
        if clock() - start >= timeout_s:
            raise ConfigError(
                f"the download before training gave no result in {timeout_s:.0f} s (PRESTEP_TIMEOUT): no "
                f"marker {path}; `fsdpctl job status` shows the pre-step and `fsdpctl job logs` its log"
            )
        if clock() >= next_say:
            say(
                f"fsdptrain: waiting for the download before training ({clock() - start:.0f} s): {path}"
            )
            next_say = clock() + say_every_s
        sleep(poll_s)
    if not record.get("ok"):
        raise ConfigError(f"the download before training failed: {record.get('error')}")
    return record


def before_process_group(values: Mapping[str, str], environ: MutableMapping[str, str]) -> None:
    """Called by every trainer process before it builds a process group: wait for the job's
    pre-step, or (none) have local rank 0 download for this node while its other ranks wait; then go
    offline. `values`: the trainer's PRETRAINED, TOKENIZER and DATASET (flags or environment)."""

    def say(msg: str) -> None:
        if environ.get("RANK", "0") == "0":
            print(msg, flush=True)

    if environ.get(
        MARKER_ENV
    ):  # the job's pre-step: it prepared the volumes, and downloaded if it could
        wait_for_marker(Path(environ[MARKER_ENV]), say=say, timeout_s=wait_timeout(environ))
        if (
            environ.get("HF_HUB_OFFLINE") == "1"
        ):  # fsdpctl sets it when the pre-step downloads for the job
            return
    if environ.get("HF_HUB_OFFLINE") == "1" or not targets(values):
        return
    marker = hub_cache(environ) / ".fsdptrain-fetch" / _attempt_id(environ)
    if environ.get("LOCAL_RANK", "0") == "0":
        _fetch_in_child(values, marker)
    wait_for_marker(marker, say=say)
    environ["HF_HUB_OFFLINE"] = "1"


def _fetch_in_child(values: Mapping[str, str], marker: Path) -> None:
    """A fresh interpreter (spawn), because this one must not import huggingface_hub before it is
    offline: the library reads HF_HUB_OFFLINE once, at import."""
    import multiprocessing

    keys = ("PRETRAINED", "TOKENIZER", "DATASET")
    child = multiprocessing.get_context("spawn").Process(
        target=_child, args=({k: values.get(k, "") for k in keys}, str(marker))
    )
    child.start()
    child.join()
    if (
        read_marker(marker) is None
    ):  # it died before it could say: the waiting ranks must not wait forever
        write_marker(marker, error=f"the download process exited with {child.exitcode}", fetched=[])


def _child(values: dict[str, str], marker: str) -> None:
    os.environ.update(values)
    sys.exit(main(["--marker", marker]))


def _attempt_id(environ: Mapping[str, str]) -> str:
    """This node's current attempt: torchrun's run id, restart count and node rank, and the
    launcher's pid (every local rank's parent). A restart looks again rather than trusting an older
    attempt's marker."""
    parts = [
        environ.get(k, "0")
        for k in ("TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT", "GROUP_RANK")
    ]
    return re.sub(r"[^A-Za-z0-9._-]", "_", "-".join([*parts, str(os.getppid())])) + ".json"


def local_snapshot(repo_id: str, kind: str) -> str | None:
    """Offline (HF_HUB_OFFLINE=1): the cached snapshot a repo id stands for, else None (online, or a
    path)."""
    if os.environ.get("HF_HUB_OFFLINE") != "1" or not is_hub_id(repo_id) or os.path.exists(repo_id):
        return None
    from huggingface_hub import snapshot_download

    try:
        return snapshot_download(repo_id, repo_type=kind, local_files_only=True)
    except Exception as e:  # noqa: BLE001 - LocalEntryNotFoundError and its relatives
        raise ConfigError(
            f"{repo_id!r} is not in the Hugging Face cache ({hub_cache(os.environ)}) and HF_HUB_OFFLINE=1: "
            "fetch it first (`fsdpctl data fetch` / `fsdpctl model fetch`)"
        ) from e


# ---- python -m fsdptrain.fetch ---------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    """The pre-step: every repo the settings in the environment name, into the environment's HF
    cache."""
    parser = argparse.ArgumentParser(prog="python -m fsdptrain.fetch", description=main.__doc__)
    parser.add_argument(
        "--marker", type=Path, help="write the outcome here (what trainers wait for)"
    )
    args = parser.parse_args(argv)
    env = os.environ
    wanted = targets(env)
    print(f"fsdptrain.fetch: {len(wanted)} repo(s) into {hub_cache(env)}", flush=True)
    try:
        fetched = fetch_all(
            wanted,
            hub_cache(env),
            token=token_from(env),
            endpoint=env.get("HF_ENDPOINT") or None,
            report=lambda p: print(p.line(), flush=True),
            attempts=int(env.get(ATTEMPTS_ENV, "5")),
        )
    except FetchError as e:
        print(f"fsdptrain.fetch: error: {e}", file=sys.stderr, flush=True)
        _tell(args.marker, error=str(e), fetched=[])
        return 2 if e.permanent else 1
    except (
        OSError
    ) as e:  # the cache cannot be written: one line, and the trainers told if the marker can be
        print(
            f"fsdptrain.fetch: error: {_unwritable(e, hub_cache(env))}", file=sys.stderr, flush=True
        )
        _tell(args.marker, error=_unwritable(e, hub_cache(env)), fetched=[])
        return 1
    except (
        BaseException
    ) as e:  # a bug or a signal: still tell the waiting trainers, then fail loudly
        _tell(args.marker, error=f"{type(e).__name__}: {e}", fetched=[])
        raise
    return 0 if _tell(args.marker, error=None, fetched=fetched) else 1


def _unwritable(e: OSError, cache: Path) -> str:
    return (
        f"cannot write {e.filename or cache} ({e.strerror or e}): the shared volume's directories must be "
        "writable by this pod's user (fsdpctl prepares them: volume-prep)"
    )


def _tell(marker: Path | None, *, error: str | None, fetched: list[Fetched]) -> bool:
    """Write the marker the trainers wait for; one line instead of a traceback when that cannot be
    done (they then wait until their deadline, PRESTEP_TIMEOUT, and fail with it)."""
    if marker is None:
        return True
    try:
        write_marker(marker, error=error, fetched=fetched)
        return True
    except OSError as e:
        print(
            f"fsdptrain.fetch: error: {_unwritable(e, marker.parent)}", file=sys.stderr, flush=True
        )
        return False


def parse(lines: Iterable[str]) -> list[dict[str, Any]]:
    """The last `fetch` event of each repo among a log's lines, in order of first appearance."""
    last: dict[str, dict[str, Any]] = {}
    for raw in lines:
        line = raw.strip()
        if not line.startswith('{"event":"fetch"'):
            continue
        try:
            record = json.loads(line)
        except ValueError:
            continue
        last[record.get("repo", "")] = record
    return list(last.values())


if __name__ == "__main__":
    sys.exit(main())

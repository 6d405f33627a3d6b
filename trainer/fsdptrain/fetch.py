"""Hub downloads done once per job, before any process group exists.

`PRETRAINED`, `TOKENIZER` and `DATASET` may name Hugging Face Hub repos. Fetched by the ranks
themselves, one rank per node downloads while the others wait in a collective barrier under the
process group's timeout (10 minutes; 70B weights are about 138 GB), and every node downloads its own
copy. Instead:

- on a cluster, the pre-step (a one-shot Kubernetes Job that `fsdpctl job run` creates with the
  training job; locally a process the supervisor starts first) runs `python -m fsdptrain.fetch
  --marker M`: it downloads every repo once into the Hugging Face cache on the shared volume
  (HF_HOME) and writes the marker M;
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
it is never printed. Which repos a job names, and each one's download, are fsdptrain.hub's; this
module is the program that runs them and the marker that tells the trainers.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from collections.abc import Callable, Iterable, Mapping, MutableMapping
from pathlib import Path
from typing import Any, TypedDict

from fsdptrain import atomic
from fsdptrain.config import ConfigError

# re-exported: what a job reads from the hub and the download itself live in fsdptrain.hub;
# fsdpctl (prestep, volume, adapters.hub) and the tests import these names from here
from fsdptrain.hub import MODEL_PATTERNS as MODEL_PATTERNS
from fsdptrain.hub import PROGRESS_ENV as PROGRESS_ENV
from fsdptrain.hub import TOKENIZER_PATTERNS as TOKENIZER_PATTERNS
from fsdptrain.hub import Fetched as Fetched
from fsdptrain.hub import FetchError as FetchError
from fsdptrain.hub import Progress as Progress
from fsdptrain.hub import Target as Target
from fsdptrain.hub import fetch_all as fetch_all
from fsdptrain.hub import hub_cache as hub_cache
from fsdptrain.hub import hub_deadline as hub_deadline
from fsdptrain.hub import is_hub_id as is_hub_id
from fsdptrain.hub import repo_id_problem as repo_id_problem
from fsdptrain.hub import targets as targets
from fsdptrain.hub import token_from as token_from

MARKER_ENV = "FSDPTRAIN_FETCH_MARKER"  # set by fsdpctl when a pre-step downloads for the job
ATTEMPTS_ENV = "FSDPTRAIN_FETCH_ATTEMPTS"  # tries against an unreachable or failing hub (default 5)


# ---- the marker: how the pre-step tells every trainer process ------------------------------------


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
    atomic.write_text(path, json.dumps(record) + "\n")


def read_marker(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):  # not there yet (a rename makes it appear whole)
        return None


# how long a trainer waits for the pre-step's marker (PRESTEP_TIMEOUT)
WAIT_ENV = "FSDPTRAIN_FETCH_WAIT_S"
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
                f"the download before training gave no result in {timeout_s:.0f} s "
                f"(PRESTEP_TIMEOUT): no marker {path}; `fsdpctl job status` shows the pre-step and "
                "`fsdpctl job logs` its log"
            )
        if clock() >= next_say:
            say(
                "fsdptrain: waiting for the download before training "
                f"({clock() - start:.0f} s): {path}"
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

    # the job's pre-step: it prepared the volumes, and downloaded if it could
    if environ.get(MARKER_ENV):
        wait_for_marker(Path(environ[MARKER_ENV]), say=say, timeout_s=wait_timeout(environ))
        # fsdpctl sets it when the pre-step downloads for the job
        if environ.get("HF_HUB_OFFLINE") == "1":
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
    # it died before it could say: the waiting ranks must not wait forever
    if read_marker(marker) is None:
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
            f"{repo_id!r} is not in the Hugging Face cache ({hub_cache(os.environ)}) and "
            "HF_HUB_OFFLINE=1: fetch it first (`fsdpctl data fetch` / `fsdpctl model fetch`)"
        ) from e


# ---- python -m fsdptrain.fetch -------------------------------------------------------------------


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
    # the cache cannot be written: one line, and the trainers told if the marker can be
    except OSError as e:
        print(
            f"fsdptrain.fetch: error: {_unwritable(e, hub_cache(env))}", file=sys.stderr, flush=True
        )
        _tell(args.marker, error=_unwritable(e, hub_cache(env)), fetched=[])
        return 1
    # a bug or a signal: still tell the waiting trainers, then fail loudly
    except BaseException as e:
        _tell(args.marker, error=f"{type(e).__name__}: {e}", fetched=[])
        raise
    return 0 if _tell(args.marker, error=None, fetched=fetched) else 1


def _unwritable(e: OSError, cache: Path) -> str:
    return (
        f"cannot write {e.filename or cache} ({e.strerror or e}): the shared volume's directories "
        "must be writable by this pod's user (fsdpctl prepares them: volume-prep)"
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


class FetchEvent(TypedDict, total=False):
    """A `fetch` event line (fsdptrain.hub.Progress.line) as parsed back from a log: any field may
    be missing from a line cut short or written by another version, so readers `.get` each."""

    event: str  # "fetch"
    repo: str
    kind: str
    state: str  # checking | planned | downloading | complete | failed
    files_done: int
    files_total: int
    bytes_done: int
    bytes_total: int
    downloaded_bytes: int
    error: str | None
    time: float


def parse(lines: Iterable[str]) -> list[FetchEvent]:
    """The last `fetch` event of each repo among a log's lines, in order of first appearance."""
    last: dict[str, FetchEvent] = {}
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

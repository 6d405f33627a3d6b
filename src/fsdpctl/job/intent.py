"""A submit's intent, FSDPCTL_HOME/jobs/<job>/submitting.json: written before a backend's submit,
removed once the run is recorded in the job's state (or its submission cancelled).

A `job run` killed between the two (SIGKILL, a power cut) leaves it: the run may be queued or
running at its place, and nothing here names it. The next verb on the job asks the place for the
submission by the run's owner token (fsdpctl.job.owner) and records or drops it
(fsdpctl.job.submit.settle), so a second `job run` never starts a second copy beside it.

    backend   where the submit went
    run_id    the run
    home      the home id the token was made with
    at        when the submit began
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from fsdpctl import files, targets
from fsdpctl.errors import ExitCode, FsdpctlError
from fsdpctl.job.owner import HOME_ID, Owner

NAME = "submitting.json"


@dataclass(frozen=True)
class Intent:
    backend: str
    run_id: str
    home: str
    at: float


def write(jdir: Path, backend: str, mine: Owner) -> None:
    files.write_atomic(
        jdir / NAME,
        json.dumps(
            {"backend": backend, "run_id": mine.run_id, "home": mine.home, "at": time.time()}
        ),
    )


def read(jdir: Path) -> Intent | None:
    """The intent a submit left; None when there is none. One that is not an intent fsdpctl wrote
    is named (exit 2), never read as "nothing was submitted"."""
    path = jdir / NAME
    try:
        data = files.read_json(path, 4096)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise _damaged(path, files.why(e)) from e
    ok = (
        isinstance(data, dict)
        and data.get("backend") in targets.NAMES
        and isinstance(data.get("run_id"), str)
        and bool(files.RUN_ID.fullmatch(data["run_id"]))
        and isinstance(data.get("home"), str)
        and bool(HOME_ID.fullmatch(data["home"]))
        and isinstance(data.get("at"), int | float)
    )
    if not ok:
        raise _damaged(path, "is not a submit's intent (bad or missing keys)")
    return Intent(data["backend"], data["run_id"], data["home"], float(data["at"]))


def _damaged(path: Path, why: str) -> FsdpctlError:
    return FsdpctlError(
        f"{path} {why}",
        hint=f"look for the job's run at its place (squeue, kubectl) and cancel it if it is not "
        f"wanted, then remove {path}",
        code=ExitCode.BAD_INPUT,
    )


def clear(jdir: Path) -> None:
    try:
        os.unlink(jdir / NAME)
    except FileNotFoundError:
        pass

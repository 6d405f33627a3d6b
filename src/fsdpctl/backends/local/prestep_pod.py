"""The pre-step's pod on this machine (the download a job's trainers wait for): started before the
launchers, stopped with the job, and its exit code recorded in the job's state for `job status`."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fsdpctl.adapters import shell
from fsdpctl.backends.local.state import read_state, update

if TYPE_CHECKING:
    from fsdpctl.job.render import Obj


def prestep_state(spec: Obj, log_dir: Path) -> dict | None:
    pre = spec.get("prestep")
    return (
        {"log": str(log_dir / "prestep.log"), "marker": pre["marker"], "rc": None} if pre else None
    )


def start_prestep(spec: Obj, jdir: Path, log_dir: Path, user: list[str]) -> Any:
    """Started first, in this machine's own network (a pod on another node, not one of the job's
    nodes): its volume-prep as root, then, when that succeeded, its download as the pod's user; the
    launchers' trainers wait for its marker before any process group exists. A volume-prep that
    fails fails the pod (its podFailurePolicy FailJob): the download never starts, and the trainers
    wait out their deadline."""
    pre = spec.get("prestep")
    if pre is None:
        return None
    log = log_dir / "prestep.log"
    if "init" in pre:
        init = shell.spawn(pre["init"]["argv"], env=dict(os.environ), log=log, stamped=True)
        if init.wait() != 0:
            update(jdir, prestep={**(prestep_state(spec, log_dir) or {}), "rc": init.returncode})
            return None
    fetch_user = user if pre.get("run_as") == spec.get("run_as") else []
    env = {**os.environ, **pre["env"]}
    if fetch_user:
        env["HOME"] = str(Path(log_dir) / "prestep-home")
        Path(env["HOME"]).mkdir(exist_ok=True)
        os.chown(env["HOME"], *pre["run_as"])
    return shell.spawn(
        [*fetch_user, *pre["argv"]], env=env, log=log, stamped=True, cwd=Path(env.get("HOME", "."))
    )


def end_prestep(proc: Any) -> None:
    if proc is not None and proc.poll() is None:  # the job ended (or was stopped) before it
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait()


def prestep_ended(pre: Any, jdir: Path) -> None:
    """Record the pre-step's exit code once it ended (`job status` shows a failed one)."""
    if pre is not None and pre.poll() is not None and not getattr(pre, "recorded", False):
        pre.recorded = True
        state = read_state(jdir)
        if state and (recorded := state.get("prestep")):
            update(jdir, prestep={**recorded, "rc": pre.returncode})

"""Adapter: the local backend. Runs a rendered PyTorchJob on this machine, one torchrun launcher per
simulated node, as Kubernetes would run one per pod, with the pod's command and environment.

A detached supervisor process (`python -m fsdpctl.backends.local JOB_DIR`) owns the launchers, so
`job status`, `job logs -f` and `job stop` work from any terminal. Everything lives under the job
directory:

    FSDPCTL_HOME/jobs/<job>/state.json phase, process identities, exit codes (written atomically)
    FSDPCTL_HOME/jobs/<job>/lock flock'ed by the supervisor for its life: one run per job
    FSDPCTL_HOME/jobs/<job>/spec.json what to launch (no secrets: the token is in the environment)
    FSDPCTL_HOME/jobs/<job>/logs/<run>/node-N.log a pod's output, each line stamped (CRI log format,
    crilog)
    FSDPCTL_HOME/jobs/<job>/checkpoints/ the pod's /checkpoints volume; survives runs, so runs
    resume
    FSDPCTL_HOME/jobs/<job>/hosts/node-N/... node N's hostPath directories (the /local scratch);
    survive runs
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import sys
import time
from pathlib import Path

from fsdpctl import files
from fsdpctl.adapters import netns, shell
from fsdpctl.backends.local import owned
from fsdpctl.backends.local.pods import (
    grace_in,
    grace_s,
    launches,
    mapped_env,
    prestep_spec,
    resume_refusal,
    spec_from_job,
    volume_dirs,
)
from fsdpctl.backends.local.prestep_pod import prestep_state
from fsdpctl.backends.local.processes import (
    JOB_MARK,
    POD_MARK,
    RUN_MARK,
    boot_id,
    environ_of,
    identity,
    is_ours,
    job_mark,
    job_processes,
    kill_pod,
    launcher_identity,
    launchers_alive,
    ours_if_started,
    owned_processes,
    pod_processes,
    pods_alive,
    same_process,
    signal_marked,
    signal_owned,
    signal_recorded,
    start_ticks,
    supervisor_mark,
)
from fsdpctl.backends.local.state import (
    ACTIVE,
    RECORDED_ACTIVE,
    CorruptState,
    JobBusy,
    LocalJobError,
    LocalState,
    NotOurs,
    in_home,
    job_dir,
    log_dir,
    read_state,
    remove_temp_dirs,
    shared_volume_dir,
    temp_dir,
    update,
    write_json,
)
from fsdpctl.backends.local.status import (
    effective_phase,
    end_leftovers,
    leader_log,
    leftovers,
    list_jobs,
    log_files,
    nccl_dumps,
    nccl_traces,
    network_note,
    orphan_note,
    phase_of,
    restarts,
    settle,
    wait,
)
from fsdpctl.backends.local.supervisor import exit_code, supervise, verdict
from fsdpctl.job import state as core
from fsdpctl.job.owner import Owner, home_id
from fsdpctl.job.reports import Phase


def start(
    job: dict, *, secret_env: dict[str, str], prestep: dict | None = None, settle_s: float = 0
) -> dict:
    """Write the spec and the state and start the detached supervisor; returns the initial state.
    `prestep`: the rendered pre-step Job (fsdpctl.job.prestep), which the supervisor starts before
    the launchers. Called with the job's lock held (fsdpctl.job.runner): refused while a run of the
    job is active or any process of it lives, after waiting up to `settle_s` for the processes of a
    run that just ended to exit (a `--replace`: the old supervisor is still on its way out)."""
    name = job["metadata"]["name"]
    jdir = job_dir(name)
    if effective_phase(settle(read_state(jdir))) in RECORDED_ACTIVE:  # orphans: `_busy_note`
        raise JobBusy(
            f"job {name!r} is already running: `fsdpctl job stop {name}` first, or pass --replace"
        )
    deadline = time.monotonic() + settle_s
    while (busy := job_processes(name)) and time.monotonic() < deadline:
        time.sleep(0.1)
    if busy:
        raise JobBusy(_busy_note(name, jdir, busy))
    if why := owned.refusal(owned.checkpoint_dir(spec_from_job(job, jdir), name), name):
        raise NotOurs(why)  # checked with the lock held: a refusals() look may be stale
    return _start_locked(job, jdir, secret_env, prestep)


def _busy_note(name: str, jdir: Path, busy: list[int]) -> str:
    """Why `job run` waits: processes of the job's last run (`job stop` ends them), or processes
    that carry the job's mark without being proven its own (fsdpctl signals none of those: the user
    ends them)."""
    try:
        last = read_state(jdir)
    except CorruptState:
        last = None
    owned = set(owned_processes(last)) if last else set()
    pids = ", ".join(map(str, busy))
    if owned >= set(busy):
        return (
            f"job {name!r} still has {len(busy)} processes running (pids {pids}): "
            f"`fsdpctl job stop {name}` ends them"
        )
    return (
        f"job {name!r}: {len(busy)} processes carry its mark {JOB_MARK}={jdir} (pids {pids}) but are not "
        "proven its own, so fsdpctl signals none of them: end them yourself, then run it again"
    )


def _start_locked(job: dict, jdir: Path, secret_env: dict[str, str], prestep: dict | None) -> dict:
    """`start` with the job's lock held and none of its processes alive: whatever state is there is
    over. The supervisor carries the job's mark from its first instruction, so another `job run`
    that takes the lock once this one lets go finds its processes; the state names its identity."""
    name = job["metadata"]["name"]
    spec = spec_from_job(job, jdir)
    if prestep is not None:
        spec["prestep"] = prestep_spec(prestep, jdir)
    # the owner file first: nothing of the run is on a shared volume without it
    owned.claim(owned.checkpoint_dir(spec, name), Owner(home_id(), name, spec["run_id"]))
    shutil.rmtree(jdir / "nodes", ignore_errors=True)  # new pods get new emptyDirs
    log_dir = jdir / "logs" / spec["run_id"]
    files.make_dirs(log_dir)
    write_json(jdir / "spec.json", spec)
    state = {
        "version": core.VERSION,
        "backend": "local",
        "job": name,
        "run_id": spec["run_id"],
        "mark": secrets.token_hex(16),  # the run's own token: its processes inherit it (`is_ours`)
        "phase": Phase.PENDING,
        "created": time.time(),
        "replicas": spec["replicas"],
        "log_dir": str(log_dir),
        "checkpoint_dir": mapped_env(spec, 0).get("CHECKPOINT_DIR"),
        "tensorboard_dir": mapped_env(spec, 0).get("TENSORBOARD_DIR") or None,
        "nccl_traces": nccl_traces(spec),
        "max_restarts": spec["max_restarts"],
        "prestep": prestep_state(spec, log_dir),
        "supervisor_pid": None,
        "launchers": [],
        "stop_requested": False,
        "labels": job["metadata"].get("labels", {}),  # the PyTorchJob's, for `job list -l`
    }
    core.write(jdir, state)
    marks = {
        POD_MARK: supervisor_mark(name, spec["run_id"]),
        JOB_MARK: str(jdir),
        RUN_MARK: state["mark"],
    }
    env = {**os.environ, **secret_env, **marks}
    argv = [sys.executable, "-m", "fsdpctl.backends.local", str(jdir)]
    proc = shell.spawn(argv, env=env, log=log_dir / "supervisor.log")  # a session of its own
    state["supervisor_pid"] = proc.pid
    update(jdir, supervisor_pid=proc.pid, supervisor=identity(proc.pid))
    return state


def stop(job_name: str) -> LocalState | None:
    """SIGTERM to the supervisor, verified as the one recorded; with the supervisor gone, its
    orphans are stopped here (`stop_orphans`)."""
    jdir = job_dir(job_name)
    state = read_state(jdir)
    if state is None:
        raise LocalJobError(
            f"no local job named {job_name!r}: `fsdpctl job list` shows what exists"
        )
    phase = effective_phase(state)
    if phase in RECORDED_ACTIVE:
        if not signal_recorded(state.get("supervisor"), signal.SIGTERM, state):
            raise LocalJobError(
                f"job {job_name!r}: {jdir / 'state.json'} names a process that is not the job's supervisor "
                f"(recorded {state.get('supervisor') or state.get('supervisor_pid')}); nothing was signalled"
            )
        update(jdir, stop_requested=True)
    elif phase == Phase.ORPHANED:
        stop_orphans(jdir, state)
    return read_state(jdir)


def stop_orphans(jdir: Path, state: LocalState) -> None:
    """The supervisor's part, done by `job stop` once it is gone: SIGTERM to each launcher still the
    one recorded (every process proven the run's if none is: `is_ours`), SIGKILL to every process of
    the run when they have ended or the pod's grace period is over; the job ends Stopped with none
    of them left."""
    job = state["job"]
    update(jdir, phase=Phase.STOPPING, stop_requested=True)
    launchers = [launcher_identity(lz) for lz in state.get("launchers", []) if isinstance(lz, dict)]
    termed = [lz for lz in launchers if signal_recorded(lz, signal.SIGTERM, state)]
    if not termed:
        termed = [
            {"pid": p} for p in owned_processes(state) if signal_owned(p, signal.SIGTERM, state)
        ]
    deadline = time.monotonic() + grace_in(jdir)
    while time.monotonic() < deadline and any(ours_if_started(t["pid"], state) for t in termed):
        time.sleep(0.2)
    for _ in range(50):  # SIGKILL is not ignorable: the kernel takes a moment at most
        left = owned_processes(state)
        if not left:
            break
        for pid in left:
            signal_owned(pid, signal.SIGKILL, state)
        time.sleep(0.1)
    # the namespaces and bridge its `finally` did not remove
    if isinstance(index := state.get("net_index"), int):
        netns.destroy(netns.Network(index, job, state["replicas"]))
    remove_temp_dirs(jdir, state["replicas"])
    update(
        jdir,
        phase=Phase.STOPPED,
        finished=time.time(),
        reason="supervisor gone; its processes stopped",
    )


def evict(job_name: str, node: int) -> None:
    """Evict node `node`'s pod, as a drain does: the supervisor's "kubelet" sends the pod's first
    process SIGTERM and SIGKILLs what is left after terminationGracePeriodSeconds; the operator's
    rule then decides (exit 143 is retryable: the pod is made again)."""
    requests = job_dir(job_name) / "evict"
    files.make_dirs(requests)
    (requests / f"node-{node}").touch()


def lose(job_name: str, node: int) -> None:
    """Lose node `node` (a hardware fault, a reservation ending): the supervisor SIGKILLs every
    process of its pod at once and, unlike after an eviction, makes no new one until `bring_back`:
    the node is gone, not its pod."""
    requests = job_dir(job_name) / "lost"
    files.make_dirs(requests)
    (requests / f"node-{node}").touch()


def bring_back(job_name: str, node: int) -> None:
    """Node `node` (or its replacement) is back: the supervisor starts its pod again, which joins
    the running job at its next rendezvous."""
    (job_dir(job_name) / "lost" / f"node-{node}").unlink(missing_ok=True)


# the engine's API for the backend, the CLI and the tests, wherever each part lives
__all__ = [
    "ACTIVE",
    "CorruptState",
    "JOB_MARK",
    "JobBusy",
    "LocalJobError",
    "POD_MARK",
    "RUN_MARK",
    "boot_id",
    "effective_phase",
    "end_leftovers",
    "environ_of",
    "evict",
    "exit_code",
    "grace_s",
    "identity",
    "in_home",
    "is_ours",
    "job_dir",
    "job_mark",
    "job_processes",
    "kill_pod",
    "launchers_alive",
    "launches",
    "leader_log",
    "leftovers",
    "list_jobs",
    "log_dir",
    "log_files",
    "mapped_env",
    "nccl_dumps",
    "nccl_traces",
    "network_note",
    "orphan_note",
    "phase_of",
    "pod_processes",
    "pods_alive",
    "prestep_spec",
    "read_state",
    "restarts",
    "resume_refusal",
    "same_process",
    "settle",
    "shared_volume_dir",
    "signal_marked",
    "spec_from_job",
    "start",
    "start_ticks",
    "stop",
    "supervise",
    "temp_dir",
    "verdict",
    "volume_dirs",
    "wait",
]

"""What a local job is doing or how it ended, from its state, its processes and its logs; a job
whose supervisor died is settled by whoever reads it first."""

from __future__ import annotations

import glob
import os
import signal
import time
from pathlib import Path

from fsdpctl.adapters import netns
from fsdpctl.backends.local.pods import mapped_env
from fsdpctl.backends.local.processes import (
    launchers_alive,
    owned_processes,
    pods_alive,
    signal_owned,
    supervisor_alive,
)
from fsdpctl.backends.local.state import (
    ACTIVE,
    RECORDED_ACTIVE,
    CorruptState,
    LocalState,
    in_home,
    job_dir,
    log_dir,
    read_state,
    remove_temp_dirs,
    update,
)
from fsdpctl.job import crilog, failures, kstatus, lock
from fsdpctl.job import home as job_home
from fsdpctl.job.reports import Phase
from fsdptrain import events


def effective_phase(state: LocalState | None) -> Phase | None:
    """`phase_of` the state; None without one."""
    return None if state is None else phase_of(state)


def phase_of(state: LocalState) -> Phase:
    """The recorded phase; when the supervisor died without recording an end, Orphaned while a
    process of the job's pods lives, else the end its processes' output tells (`ended`)."""
    if state["phase"] in RECORDED_ACTIVE and not supervisor_alive(state):
        return Phase.ORPHANED if pods_alive(state) else ended(state).phase
    return Phase(state["phase"])


def ended(state: LocalState) -> failures.Ended:
    """How a job whose supervisor died ended, from what its processes did: each launcher's last
    words and the trainer's summary (failures.ended)."""
    logs = {_node_of(f): crilog.texts(f) for f in log_files(state)}
    outcomes = [failures.launcher_outcome(logs.get(n, [])) for n in range(state["replicas"])]
    summary = next(
        (
            e
            for lines in logs.values()
            for e in events.parse(lines)
            if isinstance(e, events.Summary)
        ),
        None,
    )
    stopped = summary.stopped if summary is not None else None
    return failures.ended(outcomes, stopped, bool(state.get("stop_requested")))


def settle(state: LocalState | None) -> LocalState | None:
    """A job whose supervisor died and whose pods all ended is over: whoever sees it first does what
    the supervisor's end would have (`_ended_by_reader`). Any other state is returned as it is."""
    if (
        state is None
        or state["phase"] not in RECORDED_ACTIVE
        or supervisor_alive(state)
        or pods_alive(state)
    ):
        return state
    return _ended_by_reader(job_dir(state["job"]), state)


def _ended_by_reader(jdir: Path, seen: LocalState) -> LocalState | None:
    """The end its processes' output tells, recorded by the reader when it can take the job's lock
    at once (one reader settles; a verb holding the lock decides) and write the state: the processes
    that served its pods (etcd, the pre-step) are stopped, and its network and temp dirs removed.
    A reader that cannot (the lock busy, a read-only or full home) gets the same end without
    recording it: a read verb never needs to write."""
    end = ended(seen)
    told: LocalState = {
        **seen,
        "phase": end.phase,
        "finished": time.time(),
        "reason": f"supervisor gone; {end.reason}",
        "failed_node": end.failed_node,
    }
    with lock.try_held(jdir) as held:
        if not held:
            return told
        state = read_state(jdir)
        if state is None or state["phase"] not in RECORDED_ACTIVE or supervisor_alive(state):
            return state
        end_leftovers(state)
        try:
            return update(
                jdir, **{k: told[k] for k in ("phase", "finished", "reason", "failed_node")}
            )
        except OSError:
            return told


def leftovers(state: LocalState) -> list[str]:
    """What an ended job left outside its files that `end_leftovers` removes, in words (cleanup
    lists it)."""
    found = [f"process {pid} of job {state['job']}" for pid in owned_processes(state)]
    if isinstance(index := state.get("net_index"), int):
        net = netns.Network(index, state["job"], state["replicas"])
        if netns.exists(net):
            found.append(
                f"network of job {state['job']}: bridge {net.bridge}, namespaces {net.namespace(0)}.."
            )
    return found


def end_leftovers(state: LocalState) -> None:
    """What an ended job may have left: processes of it (etcd, the pre-step: SIGTERM, then SIGKILL),
    its nodes' network namespaces, bridge, veths and /etc/netns entries, its launchers' temp dirs.
    """
    job = state["job"]
    for pid in owned_processes(state):  # only what proves to be the run's (`is_ours`)
        signal_owned(pid, signal.SIGTERM, state)
    for _ in range(50):
        if not (left := owned_processes(state)):
            break
        time.sleep(0.1)
        for pid in left:
            signal_owned(pid, signal.SIGKILL, state)
    if isinstance(index := state.get("net_index"), int):
        net = netns.Network(index, job, state["replicas"])
        if netns.exists(net):
            netns.destroy(net)
    remove_temp_dirs(job_dir(job), state["replicas"])


def orphan_note(state: LocalState) -> str:
    """What `job status` says of a job whose supervisor is gone while some of its processes live."""
    running, left = launchers_alive(state), len(owned_processes(state))
    what = f"{running} launchers still running" if running else f"{left} processes still running"
    return f"supervisor gone; {what} (orphaned): `fsdpctl job stop {state['job']}` stops them"


def wait(job_name: str, timeout: float | None = None, poll: float = 0.5) -> LocalState | None:
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        state = settle(read_state(job_dir(job_name)))
        if effective_phase(state) not in ACTIVE:
            return state
        if deadline is not None and time.monotonic() > deadline:
            return state
        time.sleep(poll)


def list_jobs(skipped: list[str] | None = None) -> list[LocalState]:
    """Every job's state. A stray file or a damaged state is one line in `skipped` (naming its
    path), and every other job is still listed."""
    states, notes = [], skipped if skipped is not None else []
    for path in job_home.job_dirs(notes.append):
        try:
            state = settle(read_state(path))
        except CorruptState as e:
            notes.append(f"{e}: skipped")
            continue
        if state:
            states.append(state)
    return states


def restarts(state: LocalState) -> int:
    """Restarts of the job, not of its nodes: every node's agent restarts the group once per
    job-level restart (and logs kstatus.GROUP_RESTART), a recreated node starts over once; the
    busiest node counts them all."""
    relaunched = {lz["node"]: lz.get("relaunches", 0) for lz in state.get("launchers", [])}
    return max(
        (
            sum(kstatus.GROUP_RESTART in line for line in crilog.texts(f))
            + relaunched.get(_node_of(f), 0)
            for f in log_files(state)
        ),
        default=0,
    )


def _node_of(log: Path) -> int:
    return int(log.stem.rpartition("-")[2])


def nccl_traces(spec: dict) -> list[str]:
    """Each node's TORCH_NCCL_DEBUG_INFO_TEMP_FILE as mapped on this machine (one, on a shared
    volume)."""
    found = (
        mapped_env(spec, n).get("TORCH_NCCL_DEBUG_INFO_TEMP_FILE") for n in range(spec["replicas"])
    )
    return sorted({t for t in found if t})


def nccl_dumps(state: LocalState) -> list[Path]:
    """The NCCL flight recorder's dump files (`<prefix><rank>`), written when a collective timed
    out: looked for only in this home (a prefix a state names elsewhere is not the job's)."""
    prefixes = [
        p for p in (in_home(state, t) for t in state.get("nccl_traces", [])) if p is not None
    ]
    return sorted(d for t in prefixes for d in t.parent.glob(glob.escape(t.name) + "*"))


def log_files(state: LocalState) -> list[Path]:
    return sorted(log_dir(state).glob("node-*.log"))


def leader_log(state: LocalState) -> Path | None:
    """The node whose launcher hosts global rank 0 (the one printing progress), as its `leader`
    event says; node 0 until one is seen. After an elastic restart the rendezvous may seat rank 0
    elsewhere: the latest event wins."""
    files = log_files(state)
    named = [
        (e.time, f)
        for f in files
        for e in events.parse(crilog.texts(f))
        if isinstance(e, events.Leader)
    ]
    if named:
        return max(named)[1]
    return files[0] if files else None


def wants_network() -> bool:
    """Namespaces when this machine allows them (root, iproute2) and FSDPCTL_LOCAL_NETNS is not
    0."""
    usable, _ = netns.available()
    return usable and os.environ.get("FSDPCTL_LOCAL_NETNS", "1") != "0"


def network_note(state: LocalState) -> str:
    """What `job status` says about the nodes' addresses."""
    return state.get("network") or "loopback"

"""The processes of a local job: who they are (a PID is reused, (boot id, start time, PID) is not;
and the marks in their environment), signalled only when proven the job's. The job's lock is the
core's (fsdpctl.job.lock)."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from fsdpctl.backends.local.state import Identity, Launcher, LocalState, job_dir

POD_MARK = "FSDPCTL_POD"


# every process of a job carries its job directory: the job's identity on this machine, so two
# FSDPCTL_HOMEs (two users, two test workers) with a job of one name never see each other's
# processes
JOB_MARK = "FSDPCTL_JOB"


# and every process of one run the run's own random token (its state's `mark`): a copied FSDPCTL_JOB
# is not enough to be taken for the job's
RUN_MARK = "FSDPCTL_RUN"


def pid_alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def pods_alive(state: LocalState) -> bool:
    """Whether any process of the job's pods (its launchers, their workers) lives. etcd and the
    pre-step, which serve the pods and end with them, carry the supervisor's pod mark (they inherit
    its environment)."""
    prefix = f"{POD_MARK}=".encode()

    def of_a_pod(pid: int) -> bool:
        marks = [v for v in environ_of(pid) if v.startswith(prefix)]
        return any(not v.endswith(b"/supervisor") for v in marks)

    return any(of_a_pod(pid) for pid in owned_processes(state))


def boot_id() -> str:
    """This boot's random id (proc(5): /proc/sys/kernel/random/boot_id): start times count from
    boot."""
    return Path("/proc/sys/kernel/random/boot_id").read_text().strip()


def start_ticks(pid: int) -> int | None:
    """starttime, field 22 of /proc/<pid>/stat (proc(5)): the clock ticks after boot at which the
    process started. With the boot id it names one process for good, where the PID alone is reused.
    The command name (field 2) may hold spaces and ')', so fields are counted after its last ')'.
    None: gone, or a zombie."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (OSError, ValueError):
        return None
    fields = text.rpartition(")")[2].split()
    return None if fields[0] in ("Z", "X") else int(fields[19])


def identity(pid: int) -> Identity | None:
    """What a state records of a process: its PID, start time and boot (as the kubelet and
    containerd check a container's process by more than its PID)."""
    start = start_ticks(pid)
    return None if start is None else {"pid": pid, "start": start, "boot": boot_id()}


def same_process(ident: Any) -> bool:
    """Whether the process recorded as `ident` still lives (not another that was given its PID):
    psutil's Process.is_running compares (pid, create time) for the same reason before it sends a
    signal, and runc keeps its init's start time (libcontainer BaseState.InitProcessStartTime,
    "clock cycles since boot time") to tell that process from a later one with its PID."""
    if not isinstance(ident, dict) or not isinstance(ident.get("pid"), int) or ident["pid"] <= 0:
        return False
    return ident.get("boot") == boot_id() and start_ticks(ident["pid"]) == ident.get("start")


def supervisor_alive(state: LocalState) -> bool:
    """By its recorded identity, and only while that process proves to be the job's (`is_ours`): a
    state naming some other live process (a PID reused, or a state copied or edited) has no
    supervisor alive. A state written before identities were recorded has only a PID, which is
    trusted for a report but never for a signal (`signal_verified`)."""
    if "supervisor" in state:
        ident = state["supervisor"]
        return same_process(ident) and ident is not None and ours_if_started(ident["pid"], state)
    return pid_alive(state.get("supervisor_pid"))


def launcher_identity(lz: Launcher) -> Identity:
    return {"pid": lz.get("pid"), "start": lz.get("start"), "boot": lz.get("boot")}


def launchers_alive(state: LocalState) -> int:
    """Launchers still the processes recorded (a state without identities: by PID, as before)."""
    launchers = [lz for lz in state.get("launchers", []) if isinstance(lz, dict)]
    return sum(
        same_process(launcher_identity(lz)) and ours_if_started(lz["pid"], state)
        if "start" in lz
        else pid_alive(lz.get("pid"))
        for lz in launchers
    )


def environ_of(pid: int) -> list[bytes]:
    try:
        return Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:  # gone, or not ours to read
        return []


def marked(match: Callable[[bytes], bool]) -> list[int]:
    """Every live process (not this one) with an environment entry that `match`es."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            if any(match(var) for var in environ_of(int(entry.name))):
                found.append(int(entry.name))
    return found


def job_mark(job: str) -> bytes:
    """The environment entry every process of the job carries (inherited from its supervisor)."""
    return f"{JOB_MARK}={job_dir(job)}".encode()


def job_processes(job: str) -> list[int]:
    """Every live process carrying the job's mark, whatever its run: supervisor, launchers, workers,
    etcd, pre-step, and anything that inherited the variable some other way. Enough to hold back
    (`job run` is refused, `cleanup` keeps the files), never to signal: that takes
    `owned_processes`."""
    mark = job_mark(job)
    return marked(lambda var: var == mark)


def run_mark(state: LocalState) -> bytes | None:
    """The environment entry of the run's own random token (`mark` in its state), which only
    processes descended from its supervisor carry; None for a state written before runs had one."""
    return f"{RUN_MARK}={state['mark']}".encode() if state.get("mark") else None


def ours_if_started(pid: int | None, state: LocalState) -> bool:
    """`is_ours` of a recorded PID (None: a launcher not started: none)."""
    return pid is not None and is_ours(pid, state)


def is_ours(pid: int, state: LocalState) -> bool:
    """Whether live process `pid` is proven a process of the run `state` records, as runc tells a
    container's init from a process that took its PID by its start time (libcontainer's
    InitProcessStartTime, /proc/<pid>/stat field 22) and the kubelet's runtime finds a container's
    processes by a membership only its descendants inherit (its cgroup): it started on this boot, no
    earlier than the run's supervisor (its recorded identity), and carries the job's mark and the
    run's own token. A variable copied into an unrelated process, or a process older than the run,
    is not the job's; a state with no supervisor identity proves nothing."""
    sup = state.get("supervisor")
    since = sup.get("start") if isinstance(sup, dict) else None
    if not isinstance(sup, dict) or sup.get("boot") != boot_id() or not isinstance(since, int):
        return False
    started = start_ticks(pid)
    if started is None or started < since:
        return False
    env = environ_of(pid)
    token = run_mark(state)
    return job_mark(state["job"]) in env and (token is None or token in env)


def owned_processes(state: LocalState) -> list[int]:
    """The live processes proven the run's (`is_ours`): what `job stop` may signal."""
    return [pid for pid in job_processes(state["job"]) if is_ours(pid, state)]


def signal_owned(pid: int, sig: int, state: LocalState) -> bool:
    """`sig` to `pid` if it is (still, through a pidfd: `signal_verified`) a process of the run."""
    return signal_verified(pid, sig, lambda: is_ours(pid, state))


def supervisor_mark(job: str, run_id: str) -> str:
    return f"{job}/{run_id}/supervisor"


def signal_verified(pid: int, sig: int, check: Callable[[], bool]) -> bool:
    """`sig` to `pid` only if `check()` holds, with no window for PID reuse between the check and
    the signal: a pidfd (pidfd_open(2)) pins the process that had the PID when it was opened; if
    that one died and the PID went to another, the check sees the other and fails, or
    pidfd_send_signal(2) finds the pinned one gone (ESRCH). Without pidfds (Linux < 5.3) the check
    and kill(2) follow each other. True when sent."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return False
    except (AttributeError, OSError):  # no pidfds here
        if not check():
            return False
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return False
        return True
    try:
        if not check():
            return False
        signal.pidfd_send_signal(fd, sig)
        return True
    except ProcessLookupError:
        return False
    finally:
        os.close(fd)


def _carries(pid: int, entry: bytes) -> bool:
    return entry in environ_of(pid)


def signal_marked(pid: int, sig: int, mark: bytes) -> bool:
    """`sig` to a process found by its mark, if it still carries it (not a process that took its
    PID)."""
    return signal_verified(pid, sig, lambda: _carries(pid, mark))


def signal_recorded(ident: Any, sig: int, state: LocalState) -> bool:
    """`sig` to a process recorded in a state, if it is still that process and proven the run's."""
    if not isinstance(ident, dict) or not isinstance(ident.get("pid"), int) or ident["pid"] <= 0:
        return False
    pid = ident["pid"]
    return signal_verified(pid, sig, lambda: same_process(ident) and is_ours(pid, state))


def pod_mark(spec: dict, node: int, job_dir: str | None = None) -> str:
    """Which pod a process belongs to, inherited by every process of node N's launcher: the local
    stand-in for the container's cgroup. It starts with the job's directory (JOB_MARK), so a job of
    the same name in another FSDPCTL_HOME is never touched."""
    return f"{job_dir or spec['job']}/{spec['run_id']}/node-{node}"


def pod_processes(mark: str) -> list[int]:
    """Every live process carrying `mark` (/proc/<pid>/environ): found by identity, not by a PID
    kept."""
    want = f"{POD_MARK}={mark}".encode()
    return marked(lambda var: var == want)


def kill_pod(mark: str) -> None:
    """SIGKILL to every process of the pod, wherever it sits (the kubelet ending a container); each
    still carrying the mark when the signal goes (`signal_verified`)."""
    exact = f"{POD_MARK}={mark}".encode()
    for pid in pod_processes(mark):
        signal_verified(pid, signal.SIGKILL, partial(_carries, pid, exact))

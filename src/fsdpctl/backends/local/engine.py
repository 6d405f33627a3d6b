"""Adapter: the local backend. Runs a rendered PyTorchJob on this machine, one torchrun launcher per
simulated node, as Kubernetes would run one per pod, with the pod's command and environment.

A detached supervisor process (`python -m fsdpctl.backends.local JOB_DIR`) owns the launchers, so
`job status`, `job logs -f` and `job stop` work from any terminal. Everything lives under the job
directory:

    FSDPCTL_HOME/jobs/<job>/state.json        phase, process identities, exit codes (written atomically)
    FSDPCTL_HOME/jobs/<job>/lock              flock'ed by the supervisor for its life: one run per job
    FSDPCTL_HOME/jobs/<job>/spec.json         what to launch (no secrets: the token is in the environment)
    FSDPCTL_HOME/jobs/<job>/logs/<run>/node-N.log   a pod's output, each line stamped (CRI log format, crilog)
    FSDPCTL_HOME/jobs/<job>/checkpoints/      the pod's /checkpoints volume; survives runs, so runs resume
    FSDPCTL_HOME/jobs/<job>/hosts/node-N/...  node N's hostPath directories (the /local scratch); survive runs
"""

from __future__ import annotations

import dataclasses
import errno
import fcntl
import glob
import json
import os
import secrets
import shutil
import signal
import stat
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from fsdpctl import crilog, files, kstatus, statefile
from fsdpctl.adapters import etcd as etcd_adapter
from fsdpctl.adapters import netns, shell
from fsdpctl.backends.local import kubelet
from fsdpctl.files import home, write_atomic
from fsdpctl.reports import Phase
from fsdptrain import events, resume
from fsdptrain.config import TrainConfig

RECORDED_ACTIVE = (Phase.PENDING, Phase.RUNNING, Phase.STOPPING)
# Orphaned is never recorded: the supervisor died (SIGKILL, OOM) while processes of its job still
# live
ACTIVE = (*RECORDED_ACTIVE, Phase.ORPHANED)
POD_MARK = "FSDPCTL_POD"
# every process of a job carries its job directory: the job's identity on this machine, so two
# FSDPCTL_HOMEs (two users, two test workers) with a job of one name never see each other's
# processes
JOB_MARK = "FSDPCTL_JOB"
# and every process of one run the run's own random token (its state's `mark`): a copied FSDPCTL_JOB
# is not enough to be taken for the job's
RUN_MARK = "FSDPCTL_RUN"
LOCK = "lock"
# every environment variable the trainer reads a setting from (MODEL, SEED, ..., CHECKPOINT_DIR,
# METRICS_FILE)
TRAINER_ENV = frozenset(f.metadata["env"] for f in dataclasses.fields(TrainConfig))
STOP_GRACE_S = 120  # a job rendered without terminationGracePeriodSeconds
LOCK_WAIT_S = 30  # the supervisor's wait for the `job run` that started it to let go of the lock


class LocalJobError(RuntimeError):
    pass


class JobBusy(LocalJobError):
    """`job run` of a job whose lock is held or some process of which still lives."""


class CorruptState(LocalJobError):
    """A state.json that cannot be read as a job's state (a stray or damaged file)."""


def job_dir(job_name: str) -> Path:
    return home() / "jobs" / files.job_name(job_name)


def write_json(path: Path, data: dict) -> None:
    write_atomic(path, json.dumps(data, indent=1))


def read_state(jdir: Path) -> dict | None:
    """The job's state; None when it has none; CorruptState (naming the file) when it is not this
    job's state: not a regular file (a FIFO, a link, a directory), too big, not UTF-8 JSON, the
    wrong shape (fsdpctl.statefile), a newer version's, or another job's (cleanup deletes by it)."""
    path = jdir / "state.json"
    try:
        data = files.read_json(path)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise CorruptState(f"{path} {files.why(e)}") from e
    if problem := statefile.problem(data, jdir.name):
        raise CorruptState(f"{path} {problem}")
    return data


def log_dir(state: dict) -> Path:
    """The run's log directory, derived (never the path the file records: it may be damaged or
    another home's)."""
    return statefile.log_dir(home(), state)


def in_home(state: dict, recorded: str | None) -> Path | None:
    """A path the state records, if it is in this FSDPCTL_HOME (or was in the home the job ran
    from)."""
    return statefile.in_home(home(), state, recorded)


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


def effective_phase(state: dict | None) -> Phase | None:
    """`phase_of` the state; None without one."""
    return None if state is None else phase_of(state)


def phase_of(state: dict) -> Phase:
    """The recorded phase; when the supervisor died without recording an end, Orphaned while a
    process of the job's pods lives, else the end its processes' output tells (`ended`)."""
    if state["phase"] in RECORDED_ACTIVE and not supervisor_alive(state):
        return Phase.ORPHANED if pods_alive(state) else ended(state).phase
    return Phase(state["phase"])


def pods_alive(state: dict) -> bool:
    """Whether any process of the job's pods (its launchers, their workers) lives. etcd and the
    pre-step, which serve the pods and end with them, carry the supervisor's pod mark (they inherit
    its environment)."""
    prefix = f"{POD_MARK}=".encode()

    def of_a_pod(pid: int) -> bool:
        marks = [v for v in _environ(pid) if v.startswith(prefix)]
        return any(not v.endswith(b"/supervisor") for v in marks)

    return any(of_a_pod(pid) for pid in owned_processes(state))


def ended(state: dict) -> kstatus.Ended:
    """How a job whose supervisor died ended, from what its processes did: each launcher's last
    words and the trainer's summary (kstatus.ended)."""
    logs = {_node_of(f): crilog.texts(f) for f in log_files(state)}
    outcomes = [kstatus.launcher_outcome(logs.get(n, [])) for n in range(state["replicas"])]
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
    return kstatus.ended(outcomes, stopped, bool(state.get("stop_requested")))


def settle(state: dict | None) -> dict | None:
    """A job whose supervisor died and whose pods all ended is over: whoever sees it first does what
    the supervisor's end would have (`_ended_by_reader`). Any other state is returned as it is."""
    if (
        state is None
        or state["phase"] not in RECORDED_ACTIVE
        or supervisor_alive(state)
        or pods_alive(state)
    ):
        return state
    return _ended_by_reader(job_dir(state["job"]))


def _ended_by_reader(jdir: Path) -> dict | None:
    """Under the job's lock (one reader settles; a `job run` starting meanwhile holds it and wins):
    the end its processes' output tells is recorded (state.json no longer says Running), the
    processes that served its pods (etcd, the pre-step) are stopped, and its network and temp dirs
    removed."""
    with job_lock(jdir, create=False) as held:
        state = read_state(jdir)
        if (
            not held
            or state is None
            or state["phase"] not in RECORDED_ACTIVE
            or supervisor_alive(state)
        ):
            return state
        end = ended(state)
        end_leftovers(state)
        return _update(
            jdir,
            phase=end.phase,
            finished=time.time(),
            reason=f"supervisor gone; {end.reason}",
            failed_node=end.failed_node,
        )


def leftovers(state: dict) -> list[str]:
    """What an ended job left outside its files that `end_leftovers` removes, in words (cleanup
    lists it)."""
    found = [f"process {pid} of job {state['job']}" for pid in owned_processes(state)]
    if isinstance(state.get("net_index"), int):
        net = netns.Network(state["net_index"], state["job"], state["replicas"])
        if netns.exists(net):
            found.append(
                f"network of job {state['job']}: bridge {net.bridge}, namespaces {net.namespace(0)}.."
            )
    return found


def end_leftovers(state: dict) -> None:
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
    if isinstance(state.get("net_index"), int):
        net = netns.Network(state["net_index"], job, state["replicas"])
        if netns.exists(net):
            netns.destroy(net)
    remove_temp_dirs(job_dir(job), state["replicas"])


def temp_dir(jdir: Path, node: int | str) -> Path:
    """Node N's launcher's TMPDIR: torchrun makes its `torchelastic_*` log dir there
    (tempfile.mkdtemp in torch/distributed/elastic/multiprocessing/api.py, DefaultLogsSpecs, never
    removed by torch), as in a pod's /tmp, which goes with its container. Under the node's pod-local
    disk."""
    return jdir / "nodes" / f"node-{node}" / "tmp"


def remove_temp_dirs(jdir: Path, replicas: int) -> None:
    for node in range(replicas):
        shutil.rmtree(temp_dir(jdir, node), ignore_errors=True)


# ---- process identity: a PID is reused, (boot id, start time, PID) is not --------------------------------


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


def identity(pid: int) -> dict | None:
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


def supervisor_alive(state: dict) -> bool:
    """By its recorded identity, and only while that process proves to be the job's (`is_ours`): a
    state naming some other live process (a PID reused, or a state copied or edited) has no
    supervisor alive. A state written before identities were recorded has only a PID, which is
    trusted for a report but never for a signal (`signal_verified`)."""
    if "supervisor" in state:
        ident = state["supervisor"]
        return same_process(ident) and is_ours(ident["pid"], state)
    return pid_alive(state.get("supervisor_pid"))


def launcher_identity(lz: dict) -> dict:
    return {"pid": lz.get("pid"), "start": lz.get("start"), "boot": lz.get("boot")}


def launchers_alive(state: dict) -> int:
    """Launchers still the processes recorded (a state without identities: by PID, as before)."""
    launchers = [lz for lz in state.get("launchers", []) if isinstance(lz, dict)]
    return sum(
        same_process(launcher_identity(lz)) and is_ours(lz["pid"], state)
        if "start" in lz
        else pid_alive(lz.get("pid"))
        for lz in launchers
    )


def _environ(pid: int) -> list[bytes]:
    try:
        return Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:  # gone, or not ours to read
        return []


def marked(match: Callable[[bytes], bool]) -> list[int]:
    """Every live process (not this one) with an environment entry that `match`es."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            if any(match(var) for var in _environ(int(entry.name))):
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


def run_mark(state: dict) -> bytes | None:
    """The environment entry of the run's own random token (`mark` in its state), which only
    processes descended from its supervisor carry; None for a state written before runs had one."""
    return f"{RUN_MARK}={state['mark']}".encode() if state.get("mark") else None


def is_ours(pid: int, state: dict) -> bool:
    """Whether live process `pid` is proven a process of the run `state` records, as runc tells a
    container's init from a process that took its PID by its start time (libcontainer's
    InitProcessStartTime, /proc/<pid>/stat field 22) and the kubelet's runtime finds a container's
    processes by a membership only its descendants inherit (its cgroup): it started on this boot, no
    earlier than the run's supervisor (its recorded identity), and carries the job's mark and the
    run's own token. A variable copied into an unrelated process, or a process older than the run,
    is not the job's; a state with no supervisor identity proves nothing."""
    sup = state.get("supervisor")
    if (
        not isinstance(sup, dict)
        or sup.get("boot") != boot_id()
        or not isinstance(sup.get("start"), int)
    ):
        return False
    started = start_ticks(pid)
    if started is None or started < sup["start"]:
        return False
    env = _environ(pid)
    token = run_mark(state)
    return job_mark(state["job"]) in env and (token is None or token in env)


def owned_processes(state: dict) -> list[int]:
    """The live processes proven the run's (`is_ours`): what `job stop` may signal."""
    return [pid for pid in job_processes(state["job"]) if is_ours(pid, state)]


def signal_owned(pid: int, sig: int, state: dict) -> bool:
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
    return entry in _environ(pid)


def signal_marked(pid: int, sig: int, mark: bytes) -> bool:
    """`sig` to a process found by its mark, if it still carries it (not a process that took its
    PID)."""
    return signal_verified(pid, sig, lambda: _carries(pid, mark))


def signal_recorded(ident: Any, sig: int, state: dict) -> bool:
    """`sig` to a process recorded in a state, if it is still that process and proven the run's."""
    if not isinstance(ident, dict) or not isinstance(ident.get("pid"), int) or ident["pid"] <= 0:
        return False
    pid = ident["pid"]
    return signal_verified(pid, sig, lambda: same_process(ident) and is_ours(pid, state))


@contextmanager
def job_lock(jdir: Path, wait_s: float = 0, create: bool = True) -> Iterator[bool]:
    """flock(2) on the job's lock file, waiting up to `wait_s`; yields whether it is held. The
    kernel drops it when its holder exits however it exits, so a SIGKILLed supervisor leaves no
    stale lock. Without `create` (a dry run writes nothing) a missing lock file is a lock nobody
    holds."""
    if not create and not os.path.lexists(jdir / LOCK):
        yield True
        return
    jdir.mkdir(parents=True, exist_ok=True)
    fd = _open_lock(jdir / LOCK)
    try:
        yield _flock(fd, wait_s)
    finally:
        os.close(fd)


def _open_lock(path: Path) -> int:
    """The lock file, made if missing; CorruptState when something else is there (a link, which
    O_CREAT would follow to create its target wherever it points; a FIFO; a directory)."""
    try:
        fd = os.open(
            path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644
        )
    except OSError as e:
        what = (
            "is a symbolic link" if e.errno == errno.ELOOP else f"cannot be opened ({e.strerror})"
        )
        raise CorruptState(f"{path} {what}, not the lock file fsdpctl made") from e
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise CorruptState(f"{path} is not a regular file, not the lock file fsdpctl made")
    return fd


def _flock(fd: int, wait_s: float) -> bool:
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)


@dataclass
class Launch:
    node: int
    argv: list[str]
    env: dict[str, str]
    cwd: str | None = None  # the container's working directory when it runs as another user


def launches(
    spec: dict,
    endpoint: str,
    environ: dict[str, str],
    net: netns.Network | None = None,
    user: list[str] | None = None,
) -> list[Launch]:
    """Translate the PyTorchJob's worker container into one launcher per replica on this machine:
    the pod's command and environment, its volumes mapped to directories (`volume_dirs`), and with
    `net` its own network namespace and address (torchrun's --local-addr: what a pod's hostname
    resolves to). As in a pod, the trainer's keys are only the container's: a SEED=abc or
    METRICS_FILE= of the user's shell is dropped. `user`: the argv prefix that runs the container as
    its securityContext's user (kubelet.as_user), who gets a home of its own in the pod's directory,
    as an image has one."""
    total = spec["replicas"] * spec["nproc_per_node"]
    out = []
    for node in range(spec["replicas"]):
        argv = _interpreter(spec["command"])
        for arg in spec["command"][len(argv) :]:
            argv.append(
                f"--rdzv-endpoint={endpoint}" if arg.startswith("--rdzv-endpoint=") else arg
            )
        local_addr = [f"--local-addr={net.address(node)}"] if net is not None else []
        argv = [
            *(net.exec_prefix(node) if net else []),
            *(user or []),
            *argv[:3],
            *local_addr,
            *argv[3:],
        ]
        inherited = {k: v for k, v in environ.items() if k not in TRAINER_ENV}
        env = {
            **inherited,
            **_mapped_env(spec, node),
            POD_MARK: pod_mark(spec, node, environ.get(JOB_MARK)),
        }
        if spec.get("tmp"):  # the pod's /tmp: its own, under the job, removed when the job ends
            env["TMPDIR"] = spec["tmp"].replace("{node}", str(node))
        if (
            net is not None
        ):  # gloo binds the address the hostname resolves to, unless told the interface
            env["GLOO_SOCKET_IFNAME"] = "eth0"
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // total)))
        home = pod_home(spec, node) if user else None
        if home:
            env["HOME"] = home
        out.append(Launch(node, argv, env, home))
    return out


def pod_home(spec: dict, node: int) -> str:
    """The home of a pod's user on its node: in the pod's own directory, so fresh with every pod."""
    return str(Path(spec["pod_root"].replace("{node}", str(node))) / "home")


def pod_mark(spec: dict, node: int, job_dir: str | None = None) -> str:
    """Which pod a process belongs to: every process of node N's launcher inherits it in its
    environment, torchrun's workers too, though torchrun starts them in sessions of their own. It
    stands in for the container's cgroup, by which the runtime finds every process of a container it
    stops. It begins with the job's directory where the supervisor has one (its JOB_MARK), so that
    cutting node 0 of a job in one FSDPCTL_HOME never kills node 0 of a job of the same name in
    another (two users, two test workers)."""
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


def _interpreter(command: list[str]) -> list[str]:
    """The command's program as this machine runs it: the image's `python -m MODULE` (the pre-launch
    check, fsdptrain.launch) or `torchrun` become this interpreter's."""
    if command[0] == "torchrun":
        return [sys.executable, "-m", "torch.distributed.run"]
    return [sys.executable, *command[1:3]]  # python -m MODULE


def _mapped_env(spec: dict, node: int) -> dict[str, str]:
    """The container's environment with every path under a volume mount rewritten to that volume's
    directory for this node (longest mount first, so /fsx/ckpt wins over /fsx)."""
    mounts = sorted(volume_dirs(spec, node).items(), key=lambda kv: -len(kv[0]))
    env = dict(spec["env"])
    for key, value in env.items():
        for mount, directory in mounts:
            if value == mount or value.startswith(mount.rstrip("/") + "/"):
                env[key] = directory + value[len(mount.rstrip("/")) :]
                break
    return env


def resume_refusal(spec: dict, training: TrainConfig, world: int) -> str | None:
    """Why the run `spec` describes must not resume the checkpoint it would (fsdptrain.resume: at or
    past MAX_STEPS, saved with other settings), judged here with CHECKPOINT_DIR and RESUME as node 0
    sees them: `job run` refuses it before anything starts, as the pre-launch check would on every
    node."""
    env = _mapped_env(spec, 0)
    root = Path(env["CHECKPOINT_DIR"]) if env.get("CHECKPOINT_DIR") else None
    mapped = dataclasses.replace(training, resume=env.get("RESUME", training.resume))
    return resume.first_problem(root, mapped, world)


def volume_dirs(spec: dict, node: int) -> dict[str, str]:
    """Pod mount path -> directory on this machine, as the kubelet would give it to that pod: an
    emptyDir is the node's own (a pod's scratch disk), a PersistentVolumeClaim one directory every
    node shares."""
    return {mount: v.replace("{node}", str(node)) for mount, v in spec["volumes"].items()}


def spec_from_job(job: dict, jdir: Path) -> dict:
    worker = job["spec"]["pytorchReplicaSpecs"]["Worker"]
    pod = worker["template"]["spec"]
    container = pod["containers"][0]
    return {
        "volume_kinds": _volume_kinds(pod, container),
        "pod_root": str(jdir / "nodes" / "node-{node}"),
        "run_as": kubelet.run_as(pod, container),
        "annotations": worker["template"].get("metadata", {}).get("annotations", {}),
        "elastic": "elasticPolicy" in job["spec"],
        "job": job["metadata"]["name"],
        "run_id": job["spec"]["elasticPolicy"]["rdzvId"],
        "rdzv_backend": job["spec"]["elasticPolicy"]["rdzvBackend"],
        "replicas": worker["replicas"],
        "nproc_per_node": int(job["spec"]["nprocPerNode"]),
        "command": container["command"],
        "env": {e["name"]: e["value"] for e in container["env"] if "value" in e},
        "volumes": _volumes(pod, container, jdir),
        "grace_s": pod.get("terminationGracePeriodSeconds", STOP_GRACE_S),
        "restart_policy": worker.get("restartPolicy", "Never"),
        "max_restarts": job["spec"]["elasticPolicy"].get("maxRestarts", 0),
        "backoff_limit": job["spec"].get("runPolicy", {}).get("backoffLimit", 0),
        "tmp": str(temp_dir(jdir, "{node}")),
    }


def _volumes(pod: dict, container: dict, jdir: Path) -> dict[str, str]:
    """Mount path -> directory template ('{node}' for per-node emptyDirs, downward API volumes and
    hostPaths). In-memory emptyDirs (/dev/shm) and Secrets (the token travels in the environment)
    are not mapped."""
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    out = {}
    for m in container.get("volumeMounts", []):
        v = volumes.get(m["name"], {})
        if "persistentVolumeClaim" in v:
            out[m["mountPath"]] = str(shared_volume_dir(v["persistentVolumeClaim"]["claimName"]))
        elif ("emptyDir" in v and v["emptyDir"].get("medium") != "Memory") or "downwardAPI" in v:
            out[m["mountPath"]] = str(jdir / "nodes" / "node-{node}" / m["name"])
        elif "hostPath" in v:
            out[m["mountPath"]] = str(host_dir(jdir, "{node}", v["hostPath"]["path"]))
    return out


def _volume_kinds(pod: dict, container: dict) -> dict[str, str]:
    """Mount path -> the kind of volume behind it (persistentVolumeClaim, emptyDir, hostPath, ...)."""
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    kinds = {}
    for m in container.get("volumeMounts", []):
        v = volumes.get(m["name"], {})
        kinds[m["mountPath"]] = next((k for k in v if k != "name"), "")
    return kinds


def host_dir(jdir: Path, node: int | str, path: str) -> Path:
    """A hostPath (the /local scratch) on simulated node N: that node's own disk, which outlives its
    pods (unlike nodes/node-N, a pod's emptyDirs, renewed with each pod) and the job's runs, as a
    node's does."""
    return jdir / "hosts" / f"node-{node}" / path.lstrip("/")


def shared_volume_dir(claim: str) -> Path:
    """A PersistentVolumeClaim on this machine: a directory under FSDPCTL_HOME/volumes that outlives
    jobs."""
    return home() / "volumes" / claim


def start(job: dict, *, secret_env: dict[str, str], prestep: dict | None = None) -> dict:
    """Write the spec and start the detached supervisor; returns the initial state. `prestep`: the
    rendered pre-step Job (fsdpctl.prestep), which the supervisor starts before the launchers."""
    name = job["metadata"]["name"]
    jdir = job_dir(name)
    with job_lock(jdir) as held:
        if (
            not held
        ):  # a supervisor holds it for its life, or another `job run` is starting this job
            raise JobBusy(
                f"job {name!r} is already running: `fsdpctl job stop {name}` first, or pass --replace"
            )
        if busy := job_processes(name):
            raise JobBusy(_busy_note(name, jdir, busy))
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
    that takes the lock once this one lets go finds it; the supervisor then takes the lock itself.
    """
    name = job["metadata"]["name"]
    spec = spec_from_job(job, jdir)
    if prestep is not None:
        spec["prestep"] = prestep_spec(prestep, jdir)
    shutil.rmtree(jdir / "nodes", ignore_errors=True)  # new pods get new emptyDirs
    log_dir = jdir / "logs" / spec["run_id"]
    log_dir.mkdir(parents=True, exist_ok=True)
    write_json(jdir / "spec.json", spec)
    state = {
        "version": statefile.VERSION,
        "job": name,
        "run_id": spec["run_id"],
        "mark": secrets.token_hex(16),  # the run's own token: its processes inherit it (`is_ours`)
        "phase": Phase.PENDING,
        "created": time.time(),
        "replicas": spec["replicas"],
        "log_dir": str(log_dir),
        "checkpoint_dir": _mapped_env(spec, 0).get("CHECKPOINT_DIR"),
        "tensorboard_dir": _mapped_env(spec, 0).get("TENSORBOARD_DIR") or None,
        "nccl_traces": _nccl_traces(spec),
        "max_restarts": spec["max_restarts"],
        "prestep": _prestep_state(spec, log_dir),
        "supervisor_pid": None,
        "launchers": [],
        "stop_requested": False,
        "labels": job["metadata"].get("labels", {}),  # the PyTorchJob's, for `job list -l`
    }
    write_json(jdir / "state.json", state)
    marks = {
        POD_MARK: supervisor_mark(name, spec["run_id"]),
        JOB_MARK: str(jdir),
        RUN_MARK: state["mark"],
    }
    env = {**os.environ, **secret_env, **marks}
    argv = [sys.executable, "-m", "fsdpctl.backends.local", str(jdir)]
    proc = shell.spawn(argv, env=env, log=log_dir / "supervisor.log")  # a session of its own
    state["supervisor_pid"] = proc.pid
    _update(jdir, supervisor_pid=proc.pid, supervisor=identity(proc.pid))
    return state


def _update(jdir: Path, **changes) -> dict:
    state = read_state(jdir) or {}
    state.update(changes)
    write_json(jdir / "state.json", state)
    return state


def stop(job_name: str) -> dict | None:
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
        _update(jdir, stop_requested=True)
    elif phase == Phase.ORPHANED:
        stop_orphans(jdir, state)
    return read_state(jdir)


def stop_orphans(jdir: Path, state: dict) -> None:
    """The supervisor's part, done by `job stop` once it is gone: SIGTERM to each launcher still the
    one recorded (every process proven the run's if none is: `is_ours`), SIGKILL to every process of
    the run when they have ended or the pod's grace period is over; the job ends Stopped with none
    of them left."""
    job = state["job"]
    _update(jdir, phase=Phase.STOPPING, stop_requested=True)
    launchers = [launcher_identity(lz) for lz in state.get("launchers", []) if isinstance(lz, dict)]
    termed = [lz for lz in launchers if signal_recorded(lz, signal.SIGTERM, state)]
    if not termed:
        termed = [
            {"pid": p} for p in owned_processes(state) if signal_owned(p, signal.SIGTERM, state)
        ]
    deadline = time.monotonic() + _grace(jdir)
    while time.monotonic() < deadline and any(is_ours(t["pid"], state) for t in termed):
        time.sleep(0.2)
    for _ in range(50):  # SIGKILL is not ignorable: the kernel takes a moment at most
        left = owned_processes(state)
        if not left:
            break
        for pid in left:
            signal_owned(pid, signal.SIGKILL, state)
        time.sleep(0.1)
    if isinstance(
        state.get("net_index"), int
    ):  # the namespaces and bridge its `finally` did not remove
        netns.destroy(netns.Network(state["net_index"], job, state["replicas"]))
    remove_temp_dirs(jdir, state["replicas"])
    _update(
        jdir,
        phase=Phase.STOPPED,
        finished=time.time(),
        reason="supervisor gone; its processes stopped",
    )


def grace_s(job: str) -> float:
    """The pod's terminationGracePeriodSeconds the job was started with."""
    return _grace(job_dir(job))


def _grace(jdir: Path) -> float:
    """The pod's grace period from the job's spec (a damaged spec: the default)."""
    try:
        grace = files.read_json(jdir / "spec.json").get("grace_s", STOP_GRACE_S)
    except (OSError, ValueError, AttributeError):
        return STOP_GRACE_S
    ok = isinstance(grace, (int, float)) and not isinstance(grace, bool) and 0 <= grace <= 86_400
    return float(grace) if ok else STOP_GRACE_S


def orphan_note(state: dict) -> str:
    """What `job status` says of a job whose supervisor is gone while some of its processes live."""
    running, left = launchers_alive(state), len(owned_processes(state))
    what = f"{running} launchers still running" if running else f"{left} processes still running"
    return f"supervisor gone; {what} (orphaned): `fsdpctl job stop {state['job']}` stops them"


def wait(job_name: str, timeout: float | None = None, poll: float = 0.5) -> dict | None:
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        state = settle(read_state(job_dir(job_name)))
        if effective_phase(state) not in ACTIVE:
            return state
        if deadline is not None and time.monotonic() > deadline:
            return state
        time.sleep(poll)


def list_jobs(skipped: list[str] | None = None) -> list[dict]:
    """Every job's state. A stray file or a damaged state is one line in `skipped` (naming its
    path), and every other job is still listed."""
    root = home() / "jobs"
    states, notes = [], skipped if skipped is not None else []
    for path in sorted(root.iterdir()) if root.is_dir() else []:
        if path.is_symlink() or not path.is_dir() or not files.JOB_NAME.fullmatch(path.name):
            notes.append(f"{path} is not a job directory: skipped")
            continue
        try:
            state = settle(read_state(path))
        except CorruptState as e:
            notes.append(f"{e}: skipped")
            continue
        if state:
            states.append(state)
    return states


def restarts(state: dict) -> int:
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


def _nccl_traces(spec: dict) -> list[str]:
    """Each node's TORCH_NCCL_DEBUG_INFO_TEMP_FILE as mapped on this machine (one, on a shared
    volume)."""
    found = (
        _mapped_env(spec, n).get("TORCH_NCCL_DEBUG_INFO_TEMP_FILE") for n in range(spec["replicas"])
    )
    return sorted({t for t in found if t})


def nccl_dumps(state: dict) -> list[Path]:
    """The NCCL flight recorder's dump files (`<prefix><rank>`), written when a collective timed
    out: looked for only in this home (a prefix a state names elsewhere is not the job's)."""
    prefixes = [
        p for p in (in_home(state, t) for t in state.get("nccl_traces", [])) if p is not None
    ]
    return sorted(d for t in prefixes for d in t.parent.glob(glob.escape(t.name) + "*"))


def log_files(state: dict) -> list[Path]:
    return sorted(log_dir(state).glob("node-*.log"))


def leader_log(state: dict) -> Path | None:
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


# ---- the supervisor process ---------------------------------------------------------------------------


def supervise(jdir: Path) -> int:
    spec = files.read_json(jdir / "spec.json")
    state = read_state(jdir)
    if state is None:
        raise LocalJobError(f"{jdir}: no state.json to supervise")
    # held until this process exits, however it exits: no second run of the job while it lives
    lock = _open_lock(jdir / LOCK)
    if not _flock(lock, LOCK_WAIT_S):
        _update(
            jdir,
            phase=Phase.FAILED,
            finished=time.time(),
            reason="another process holds the job's lock",
        )
        return 1
    _update(jdir, supervisor=identity(os.getpid()))
    logs = log_dir(state)
    stopping = {"flag": False}
    signal.signal(signal.SIGTERM, lambda *_: stopping.update(flag=True))
    server, pods, net = None, [], None
    _make_claims(spec)
    user, why = kubelet.as_user(spec.get("run_as"), _needs(spec, jdir))
    _update(jdir, identity=_identity_note(spec.get("run_as"), user, why))
    pre = _start_prestep(spec, jdir, logs, user)
    try:
        if _wants_network():
            net = netns.claim(spec["job"], spec["replicas"], {f"{spec['job']}-worker-0": 0})
        server, endpoint = _rendezvous(spec, jdir, logs, net)
        # a session of its own per launcher: its process group is the pod's processes
        delays, now = start_delays(os.environ.get(START_DELAYS_ENV, "")), time.monotonic()
        pods = [
            Pod(launch, None, start_at=now + delays.get(launch.node, 0.0))
            for launch in launches(spec, endpoint, dict(os.environ), net, user)
        ]
        _start_due(pods, spec, logs)
        _update(
            jdir,
            phase=Phase.RUNNING,
            started=time.time(),
            rdzv_endpoint=endpoint,
            **_placement(net, pods),
        )
        end = _run(pods, stopping, jdir, spec, net, pre)
    except Exception as e:  # recorded for `job status`; the traceback is in supervisor.log
        _signal(pods, signal.SIGKILL)
        _update(jdir, phase=Phase.FAILED, finished=time.time(), reason=str(e))
        raise
    finally:
        _signal(
            pods, signal.SIGKILL
        )  # a pod's end leaves none of its processes behind (no orphans)
        if server:
            server.stop()
        if net is not None:
            netns.destroy(net)
        _end_prestep(pre)
        remove_temp_dirs(jdir, spec["replicas"])
    _drain(pods)
    _update(
        jdir,
        phase=end.phase,
        finished=time.time(),
        reason=end.reason,
        failed_node=end.failed_node,
        **_placement(net, pods),
    )
    return 0


START_DELAYS_ENV = (
    "FSDPCTL_LOCAL_START_DELAYS"  # NODE=SECONDS[,...]: pods that start late, as on a cluster
)


def start_delays(text: str) -> dict[int, float]:
    """`1=20,3=5`: node 1's pod starts 20 s after the others, node 3's 5 s (an image still pulling,
    a node still joining the node group, a slow volume mount); a malformed item is ignored."""
    found = {}
    for item in filter(None, text.split(",")):
        node, _, seconds = item.partition("=")
        try:
            found[int(node)] = max(0.0, float(seconds))
        except ValueError:
            continue
    return found


@dataclass
class Pod:
    """One replica's launcher, as the operator's pod for it: recreated (`relaunches`) when its exit
    code says so; started at `start_at` (monotonic), evicted when `kill_at` is set (SIGKILL then).
    """

    launch: Launch
    proc: Any  # subprocess.Popen, through shell.spawn; None until the pod starts
    relaunches: int = 0
    judged: bool = False  # its exit has been acted on
    start_at: float = 0.0
    kill_at: float | None = None  # an eviction's end of grace
    evicted: bool = False

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


def _make_claims(spec: dict) -> None:
    """Each claim the pods mount, as a new FSx file system's root (kubelet.make_claim)."""
    for mount, kind in spec.get("volume_kinds", {}).items():
        if kind == "persistentVolumeClaim" and mount in spec["volumes"]:
            kubelet.make_claim(Path(spec["volumes"][mount]))


def _needs(spec: dict, jdir: Path) -> list[str]:
    """What a pod's user must reach: the interpreter and the packages the trainer imports, the job's
    directory (its pods' volumes), the claims, and every existing absolute path its environment
    names."""
    import importlib.util

    import fsdptrain

    torch = importlib.util.find_spec("torch")
    found = [sys.executable, sys.prefix, str(Path(fsdptrain.__file__).parent), str(jdir)]
    if torch is not None and torch.origin:
        found.append(str(Path(torch.origin).parent))
    found += list(spec.get("volumes", {}).values())
    found += [v for v in _mapped_env(spec, 0).values() if v.startswith("/") and Path(v).exists()]
    return [f for f in dict.fromkeys(found) if "{node}" not in f]


def _identity_note(run_as: list[int] | None, user: list[str], why: str | None) -> str:
    """What `job status` says about the user the pods run as."""
    if not run_as:
        return "this machine's user (the pods name no other)"
    uid, gid = run_as
    if user:
        return f"uid {uid}:{gid}, as the pods' securityContext says"
    return f"this machine's user, not uid {uid} ({why})"


def _prepare_pod(spec: dict, node: int, stop_at: str | None = None) -> None:
    """What the kubelet makes before a pod's containers start: its volumes' directories, the
    downward API file of its annotations (with the stop request, once `job stop` asked), its user's
    home."""
    dirs = volume_dirs(spec, node)
    kubelet.make_pod_dirs(dirs, spec.get("volume_kinds", {}))
    annotations = {**spec.get("annotations", {}), **({STOP_ANNOTATION: stop_at} if stop_at else {})}
    for mount, kind in spec.get("volume_kinds", {}).items():
        if kind == "downwardAPI" and mount in dirs:
            kubelet.write_annotations(dirs[mount], annotations)
    home = Path(pod_home(spec, node))
    home.mkdir(parents=True, exist_ok=True)
    if spec.get("run_as") and os.geteuid() == 0:
        os.chown(home, *spec["run_as"])


STOP_ANNOTATION = "fsdpctl.io/stop"  # fsdptrain.disruption.STOP_ANNOTATION


def evict(job_name: str, node: int) -> None:
    """Evict node `node`'s pod, as a drain does: the supervisor's "kubelet" sends the pod's first
    process SIGTERM and SIGKILLs what is left after terminationGracePeriodSeconds; the operator's
    rule then decides (exit 143 is retryable: the pod is made again)."""
    requests = job_dir(job_name) / "evict"
    requests.mkdir(parents=True, exist_ok=True)
    (requests / f"node-{node}").touch()


def prestep_spec(job: dict, jdir: Path) -> dict:
    """The pre-step Job's containers as this machine runs them: this interpreter, each container's
    environment and its paths with the claims mapped: volume-prep's directories (`init`, run as root
    before the rest), then the download with its --marker file (the launchers' trainers wait for
    that file)."""
    pod = job["spec"]["template"]["spec"]
    container = pod["containers"][0]
    command = container["command"]
    at = command.index("--marker") + 1
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    volumes = _volumes(pod, container, jdir)
    mapped = _mapped_env({"env": {**env, "_MARKER": command[at]}, "volumes": volumes}, 0)
    marker = mapped.pop("_MARKER")
    argv = [
        sys.executable,
        *command[1:at],
        marker,
        *command[at + 1 :],
    ]  # the image's `python -m ...`
    spec: dict[str, Any] = {
        "argv": argv,
        "env": mapped,
        "marker": marker,
        "run_as": kubelet.run_as(pod, container),
    }
    for init in pod.get("initContainers", []):
        init_volumes = _volumes(pod, init, jdir)
        args = [_mapped_arg(a, init_volumes) for a in init["command"][3:]]
        spec["init"] = {
            "argv": [sys.executable, *init["command"][1:3], *args],
            "name": init["name"],
        }
    return spec


def _mapped_arg(arg: str, volumes: dict[str, str]) -> str:
    """A command argument that is a pod path (or `--flag=path`) with its mount mapped to its
    directory."""
    flag, eq, value = arg.rpartition("=") if arg.startswith("--") else ("", "", arg)
    mapped = _mapped_env({"env": {"_": value}, "volumes": volumes}, 0)["_"]
    return f"{flag}{eq}{mapped}"


def _prestep_state(spec: dict, log_dir: Path) -> dict | None:
    pre = spec.get("prestep")
    return (
        {"log": str(log_dir / "prestep.log"), "marker": pre["marker"], "rc": None} if pre else None
    )


def _start_prestep(spec: dict, jdir: Path, log_dir: Path, user: list[str]) -> Any:
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
            _update(jdir, prestep={**(_prestep_state(spec, log_dir) or {}), "rc": init.returncode})
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


def _end_prestep(proc: Any) -> None:
    if proc is not None and proc.poll() is None:  # the job ended (or was stopped) before it
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait()


def _spawn(launch: Launch, log_dir: Path) -> Any:
    if launch.env.get("TMPDIR"):  # the pod's /tmp: any user of the pod writes there, as in /tmp
        Path(launch.env["TMPDIR"]).mkdir(parents=True, exist_ok=True)
        os.chmod(launch.env["TMPDIR"], 0o1777)
    cwd = Path(launch.cwd) if launch.cwd else None
    return shell.spawn(
        launch.argv, env=launch.env, log=log_dir / f"node-{launch.node}.log", stamped=True, cwd=cwd
    )


def _start_due(pods: list[Pod], spec: dict, logs: Path, stop_at: str | None = None) -> None:
    """Start the pods whose time has come (a late node's pod waits for its start_at)."""
    for pod in pods:
        if pod.proc is None and time.monotonic() >= pod.start_at:
            _prepare_pod(spec, pod.launch.node, stop_at)
            pod.proc = _spawn(pod.launch, logs)


RELAY_DRAIN_S = 10


def _drain(pods: list[Pod]) -> None:
    """Wait for each pod's log relay to write what its pipes still hold (its processes are gone, so
    it ends), so that the job's end is recorded after its last line: readers of an ended job see it
    all."""
    deadline = time.monotonic() + RELAY_DRAIN_S
    for pod in pods:
        relay = getattr(pod.proc, "relay", None) if pod.proc is not None else None
        if relay is not None:
            try:
                relay.wait(max(0.0, deadline - time.monotonic()))
            except Exception:  # noqa: BLE001 - a relay held open by a stray process: the job ends anyway
                pass


def exit_code(returncode: int) -> int:
    """A launcher's return code as a container reports it: a death by signal N is 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


def verdict(code: int, policy: str) -> str:
    """'done', 'recreate' or 'fail': what the Training Operator does with a replica's container exit
    code under its restartPolicy (v1.9.4 pkg/controller.v1/common/pod.go): ExitCode recreates the
    pod for 128-255 (killed by a signal) and fails the job for 1-127 (pkg/util/train/train_util.go,
    IsRetryableExitCode); OnFailure and Always retry any; Never none."""
    if code == 0:
        return "done"
    if policy == "ExitCode":
        return "recreate" if code >= 128 else "fail"
    return "recreate" if policy in ("OnFailure", "Always") else "fail"


# Not the operator's: it recreates a pod that dies by a signal without bound (backoffLimit counts
# restarts in place, none under ExitCode: v1.9.4 pkg/core/job.go, PastBackoffLimit); the pods bound
# themselves through their start ledger (fsdptrain.disruption.record_start). This only keeps a
# broken local run from looping.
RECREATE_CAP = 100


def _run(
    pods: list[Pod],
    stopping: dict,
    jdir: Path,
    spec: dict,
    net: netns.Network | None,
    pre: Any = None,
) -> kstatus.Ended:
    """Until every launcher has ended: start late pods, evict the ones asked for, recreate the ones
    the operator's policy retries; once the job is decided (a stop, a permanent failure, or success:
    a finished job's running pods are deleted, cleanPodPolicy Running), SIGTERM each launcher (the
    kubelet signals the container's first process, the launcher, which forwards it to torchrun) and
    SIGKILL every process after the pod's grace period. A stop first puts the stop annotation in
    every pod's downward API file (the trainers then read the SIGTERM as a stop, not an eviction).
    Returns how the job ended."""
    outcome: kstatus.Ended | None = None
    sent_at, stop_at = None, None
    while True:
        if outcome is None:
            _start_due(pods, spec, jdir / "logs" / spec["run_id"], stop_at)
            _evictions(pods, jdir, spec)
            _prestep_ended(pre, jdir)
            if stopping["flag"]:
                stop_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
                _request_stop(pods, spec, stop_at)
                _update(jdir, phase=Phase.STOPPING)
                outcome = kstatus.Ended(Phase.STOPPED, None)
            else:
                outcome = _judge(pods, spec, jdir, net)
            if outcome is not None:
                _signal(pods, signal.SIGTERM)
                sent_at = time.monotonic()
        elif time.monotonic() - (sent_at or 0) > spec.get("grace_s", STOP_GRACE_S):
            _signal(pods, signal.SIGKILL)
        if outcome is not None and not any(p.running() for p in pods):
            return outcome
        time.sleep(0.2)


def _request_stop(pods: list[Pod], spec: dict, stop_at: str) -> None:
    """`job stop` through the pods' annotations, as on a cluster: the kubelet rewrites each running
    pod's downward API file with fsdpctl.io/stop (here at once, where a kubelet takes up to its sync
    period)."""
    annotations = {**spec.get("annotations", {}), STOP_ANNOTATION: stop_at}
    for pod in pods:
        if pod.proc is None:
            continue
        for mount, kind in spec.get("volume_kinds", {}).items():
            if kind == "downwardAPI":
                kubelet.write_annotations(volume_dirs(spec, pod.launch.node)[mount], annotations)


def _evictions(pods: list[Pod], jdir: Path, spec: dict) -> None:
    """The kubelet's part of an eviction (`evict`): SIGTERM to the pod's first process at once,
    SIGKILL to every process of the pod when terminationGracePeriodSeconds has passed."""
    requests = jdir / "evict"
    for request in sorted(requests.glob("node-*")) if requests.is_dir() else []:
        request.unlink(missing_ok=True)
        node = int(request.name.rpartition("-")[2])
        pod = next((p for p in pods if p.launch.node == node), None)
        if pod is not None and pod.running() and pod.kill_at is None:
            pod.evicted, pod.kill_at = True, time.monotonic() + spec.get("grace_s", STOP_GRACE_S)
            _log_note(
                jdir, node, f"fsdpctl: node {node} evicted (SIGTERM; SIGKILL after the pod's grace)"
            )
            os.kill(pod.proc.pid, signal.SIGTERM)
    for pod in pods:
        if pod.kill_at is not None and time.monotonic() > pod.kill_at and pod.running():
            kill_pod(pod.launch.env[POD_MARK])


def _prestep_ended(pre: Any, jdir: Path) -> None:
    """Record the pre-step's exit code once it ended (`job status` shows a failed one)."""
    if pre is not None and pre.poll() is not None and not getattr(pre, "recorded", False):
        pre.recorded = True
        state = read_state(jdir) or {}
        if state.get("prestep"):
            _update(jdir, prestep={**state["prestep"], "rc": pre.returncode})


def _judge(
    pods: list[Pod], spec: dict, jdir: Path, net: netns.Network | None
) -> kstatus.Ended | None:
    """Act on launchers that ended since the last look, as the Training Operator v1.9.4 does with a
    worker pod's exit code under its restartPolicy: how the job ended, once it is decided. Any
    worker that succeeded makes an elastic PyTorchJob Succeeded
    (pkg/controller.v1/pytorch/pytorchjob_controller.go, UpdateJobStatus); a non-retryable code
    fails it; a retryable one recreates the pod, and backoffLimit 0 fails the job at the first
    failed pod (pkg/controller.v1/common/job.go, exceedsBackoffLimit)."""
    done = 0
    for pod in pods:
        rc = pod.proc.poll() if pod.proc is not None else None
        if rc is None or pod.judged:
            done += pod.judged and pod.proc is not None and pod.proc.returncode == 0
            continue
        code, limit = exit_code(rc), spec.get("backoff_limit", 0)
        what = verdict(code, spec.get("restart_policy", "Never"))
        pod.judged = True
        kill_pod(pod.launch.env[POD_MARK])  # a container that ended takes its processes with it
        if what == "done":
            done += 1
            if spec.get("elastic") or done == len(pods):
                return kstatus.Ended(Phase.SUCCEEDED, None)
        elif what == "recreate" and limit > 0 and sum(p.relaunches for p in pods) < RECREATE_CAP:
            _recreate(pod, jdir, code)
            _update(jdir, **_placement(net, pods))
        else:
            why = (
                "1-127 are permanent under restartPolicy ExitCode"
                if what == "fail"
                else f"backoffLimit {limit}"
            )
            reason = f"node {pod.launch.node} exited with code {code} ({why})"
            return kstatus.Ended(Phase.FAILED, reason, pod.launch.node)
    return None


def _log_note(jdir: Path, node: int, note: str) -> None:
    state = read_state(jdir)
    logs = log_dir(state) if state else jdir / "logs"
    with open(
        logs / f"node-{node}.log", "a"
    ) as log:  # one write: the old relay may still be appending
        log.write(crilog.format_line(time.time(), "stdout", note))


def _recreate(pod: Pod, jdir: Path, code: int) -> None:
    """A new pod for the replica: fresh emptyDirs, the same log file (marked), the same launch. An
    evicted pod's replacement lands on another node (its own was drained), whose disk has none of
    the old one's hostPath files (the /local scratch): only the claims carry over."""
    node = pod.launch.node
    shutil.rmtree(jdir / "nodes" / f"node-{node}", ignore_errors=True)
    if pod.evicted:
        shutil.rmtree(jdir / "hosts" / f"node-{node}", ignore_errors=True)
    why = "evicted, " if pod.evicted else ""
    _log_note(
        jdir,
        node,
        f"fsdpctl: node {node} {why}exited with code {code}; recreated, as the operator recreates the pod",
    )
    _prepare_pod(files.read_json(jdir / "spec.json"), node)
    state = read_state(jdir)
    logs = log_dir(state) if state else jdir / "logs"
    pod.proc, pod.relaunches, pod.judged = _spawn(pod.launch, logs), pod.relaunches + 1, False
    pod.kill_at, pod.evicted = None, False


def _wants_network() -> bool:
    """Namespaces when this machine allows them (root, iproute2) and FSDPCTL_LOCAL_NETNS is not 0."""
    usable, _ = netns.available()
    return usable and os.environ.get("FSDPCTL_LOCAL_NETNS", "1") != "0"


def network_note(state: dict) -> str:
    """What `job status` says about the nodes' addresses."""
    return state.get("network") or "loopback"


def _rendezvous(
    spec: dict, jdir: Path, log_dir: Path, net: netns.Network | None
) -> tuple[etcd_adapter.EtcdServer | None, str]:
    """(etcd server or None, endpoint). c10d with namespaces: the manifest's own
    `<job>-worker-0:29400`, which each node's hosts file resolves to node 0 as the operator's
    Service does; on loopback a free port. etcd: a server on the host side of the nodes' bridge (or
    loopback)."""
    if spec["rdzv_backend"] == "c10d":
        if net is not None:
            return None, _manifest_endpoint(spec)
        return None, f"127.0.0.1:{etcd_adapter.free_port()}"
    host = net.host_address if net else "127.0.0.1"
    server = etcd_adapter.start(
        jdir / "etcd" / spec["run_id"], log_file=log_dir / "etcd.log", host=host
    )
    return server, server.endpoint


def _manifest_endpoint(spec: dict) -> str:
    return next(a.split("=", 1)[1] for a in spec["command"] if a.startswith("--rdzv-endpoint="))


def _placement(net: netns.Network | None, pods: list[Pod]) -> dict:
    why = netns.available()[1] or "FSDPCTL_LOCAL_NETNS=0"
    note = (
        f"a network namespace per node ({netns.SUBNET_PREFIX}.{net.index}.0/24)"
        if net
        else f"loopback ({why})"
    )
    launchers = [
        {
            "node": p.launch.node,
            **_launcher_identity(p),
            "rc": p.proc.returncode if p.proc is not None else None,
            "address": net.address(p.launch.node) if net else "127.0.0.1",
            "relaunches": p.relaunches,
        }
        for p in pods
    ]
    return {"network": note, "net_index": net.index if net else None, "launchers": launchers}


def _launcher_identity(p: Pod) -> dict:
    """The launcher's identity for the state; a pod not started yet (a late node) has none."""
    if p.proc is None:
        return {"pid": None, "start": None, "boot": None}
    return identity(p.proc.pid) or {"pid": p.proc.pid, "start": None, "boot": None}


def _signal(pods: list[Pod], sig: int) -> None:
    """SIGTERM to each running launcher, as the kubelet sends it to a container's first process;
    SIGKILL to every process of the pod (its mark), as the runtime ends a container after the grace
    period: workers in sessions of their own and orphans of a launcher that already died included.
    """
    for p in pods:
        if sig == signal.SIGKILL:
            kill_pod(p.launch.env[POD_MARK])
        elif p.running():
            try:
                os.kill(p.proc.pid, sig)
            except ProcessLookupError:
                pass

"""`fsdpctl sandbox slurm up|down|status`: a real Slurm cluster on this machine for a user to try
BACKEND=slurm, the cluster the tests run against (tests/slurm_peer.py, the same `slurm_layout`).

Unlike the tests' cluster its daemons are detached (a session of their own, no parent-death signal):
they outlive `up`, until `down`. The state (FSDPCTL_HOME/sandbox/slurm/sandbox.json) records each
daemon by its identity (pid, start time, boot: fsdpctl.backends.local.processes, as the local
supervisor records its launchers), written before anything is started and after each start, so
`down` signals only processes it proves it started, never one found by name or a pid reused since,
and a `up` killed half-way is still undone by `down`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fsdpctl import files
from fsdpctl.adapters import netns, shell
from fsdpctl.backends.local.processes import identity, same_process
from fsdpctl.backends.local.state import Identity
from fsdpctl.errors import BadInput, FsdpctlError
from fsdpctl.job.lock import flock
from fsdpctl.sandbox import containers
from fsdpctl.sandbox.containers import Kit
from fsdpctl.sandbox.slurm_layout import CONTROLLER_BOOT, PARTITION, PROGRAMS, Layout, write_files

NETWORK = "sandbox"  # the namespaces' job name: fsdpctl-<i>-sandbox-<N>
APT = "apt-get install -y slurm-wlm munge iproute2 util-linux"
START_TIMEOUT = 90.0  # until every node is idle; ~3 s on a loaded 2-core machine
STOP_GRACE = 10.0  # SIGTERM to SIGKILL
CANCEL_WAIT = 15.0  # scancel to the jobs' end (KillWait=2 s, and a loaded machine)
MUNGE_PREFIX = "fsdpctl-slurm-"
LOCK_WAIT = START_TIMEOUT + 30  # another `up` may take that long before this one may look
# the paths go into slurm.conf (space-separated Key=value) and SHARED_VOLUME_PATH (its pattern)
SAFE_PATH = re.compile(r"^/[A-Za-z0-9._/-]+$")


def root() -> Path:
    return files.home() / "sandbox" / "slurm"


@dataclass
class Sandbox:
    """A sandbox as its state records it: where it lives and the daemons it started."""

    layout: Layout
    daemons: dict[str, Identity] = field(default_factory=dict)
    containers: Kit | None = None  # pyxis + enroot on every node
    no_containers: str = ""  # why not, in words

    def node_local(self, name: str) -> Path:
        """With containers: node `name`'s directory for enroot's and pyxis's state (its disk)."""
        return self.layout.root / "nodes" / name

    @property
    def shared(self) -> Path:
        """SHARED_VOLUME_PATH: every node sees this machine's file system, so any directory is shared."""
        return self.layout.root / "shared"

    def living(self) -> dict[str, bool]:
        return {name: same_process(ident) for name, ident in self.daemons.items()}

    def complete(self) -> bool:
        """Every daemon started and still the process recorded."""
        living = self.living()
        return set(living) == set(self.layout.daemons()) and all(living.values())


def missing() -> str | None:
    """Why no sandbox can run here, in one line; None when it can."""
    usable, why = netns.available()
    if not usable:
        return why.split(":")[0]
    lacking = [p for p in PROGRAMS if shutil.which(p) is None]
    return f"{', '.join(lacking)} not installed" if lacking else None


def require() -> None:
    why = missing()
    if why is not None:
        raise BadInput(f"no Slurm sandbox here: {why}", hint=f"as root: {APT}")


# ---- the state ----------------------------------------------------------------------------------


def _state_file(where: Path) -> Path:
    return where / "sandbox.json"


def save(sb: Sandbox) -> None:
    lay = sb.layout
    net = {"index": lay.net.index, "job": lay.net.job, "nodes": lay.net.nodes}
    record = {"net": net, "munge_dir": str(lay.munge_dir), "port": lay.port, "daemons": sb.daemons}
    record["containers"] = sb.containers.as_record() if sb.containers else None
    record["no_containers"] = sb.no_containers
    files.write_atomic(_state_file(lay.root), json.dumps(record, indent=1) + "\n")


def load(where: Path) -> Sandbox | None:
    """The sandbox recorded in `where`; None without one. A state that is not one of ours (edited,
    truncated) is refused: `down` would not know what to stop."""
    path = _state_file(where)
    if not path.exists():
        return None
    try:
        raw = files.read_json(path)
        net = netns.Network(
            int(raw["net"]["index"]), str(raw["net"]["job"]), int(raw["net"]["nodes"])
        )
        munge_dir = Path(raw["munge_dir"])
        daemons = {str(k): v for k, v in dict(raw["daemons"]).items()}
        layout = Layout(where, net, munge_dir, int(raw["port"]))
        kit, why = containers.of_record(raw.get("containers")), str(raw.get("no_containers", ""))
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise BadInput(
            f"{path}: not a sandbox state ({files.why(e)})",
            hint=f"remove {where} and whatever it started by hand (`ip netns list`, `ps`)",
        ) from e
    if munge_dir.parent == munge_dir or not munge_dir.name.startswith(MUNGE_PREFIX):
        raise BadInput(
            f"{path}: munge_dir={str(munge_dir)!r} is not a sandbox's", hint=f"remove {path}"
        )
    return Sandbox(layout, daemons, kit, why)


# ---- up -----------------------------------------------------------------------------------------


def daemon_env(layout: Layout) -> dict[str, str]:
    """What the daemons get: a PATH with the sbin directories, SLURM_CONF, and nothing else of this
    environment (no token or key passes into a daemon that outlives the command)."""
    return {"PATH": _daemon_path(), "LANG": "C.UTF-8", "SLURM_CONF": str(layout.conf)}


def _daemon_path() -> str:
    path = os.environ.get("PATH", "/usr/bin:/bin")
    for extra in ("/usr/sbin", "/sbin"):
        if extra not in path.split(":"):
            path += f":{extra}"
    return path


def client_env(layout: Layout) -> dict[str, str]:
    """This environment for a client command: SLURM_CONF the sandbox's, no other cluster's SLURM_*."""
    keep = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
    return keep | {"SLURM_CONF": str(layout.conf)}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def _short_dir() -> Path:
    """munge's and the spool's directory: short (a socket path fits 108 bytes), searchable by all."""
    base = "/run" if os.access("/run", os.W_OK) else None
    made = Path(tempfile.mkdtemp(prefix=MUNGE_PREFIX, dir=base))
    made.chmod(0o755)
    return made


def plan(nodes: int, where: Path) -> Layout:
    """The layout `up` would make now (the network index is the first free one), making nothing."""
    taken: set[int] | None = None if netns.available()[0] else set()
    net = netns.plan(NETWORK, nodes, taken)
    return Layout(where, net, Path("/run") / f"{MUNGE_PREFIX}XXXXXXXX", 6817)


@contextmanager
def locked(where: Path) -> Iterator[None]:
    """One `up` or `down` at a time per FSDPCTL_HOME (two `up`s at once would start two clusters
    and record one): flock(2) on a file beside the sandbox's directory, which `down` removes; the
    kernel drops it when its holder exits, however it exits."""
    files.make_dirs(where.parent)
    path = where.parent / f"{where.name}.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, files.FILE_MODE)
    try:
        if not flock(fd, LOCK_WAIT):
            raise BadInput(
                f"another `fsdpctl sandbox slurm up` or `down` holds {path}",
                hint="wait for it to finish, then run this again",
            )
        yield
    finally:
        os.close(fd)


def up(nodes: int, where: Path) -> tuple[Sandbox, bool]:
    """A running sandbox of `nodes` nodes, every node idle, and whether it ran already. A sandbox
    left half-started (a daemon gone) is taken down first."""
    require()
    if not SAFE_PATH.match(str(where)):
        raise BadInput(
            f"FSDPCTL_HOME={str(files.home())!r}: the sandbox's directory {str(where)!r} would go into "
            "slurm.conf and SHARED_VOLUME_PATH, which take letters, digits and . _ - / only",
            hint="point FSDPCTL_HOME at such a directory for the sandbox",
        )
    with locked(where):
        return _up(nodes, where)


def _up(nodes: int, where: Path) -> tuple[Sandbox, bool]:
    found = load(where)
    if found is not None and found.complete():
        if found.layout.net.nodes != nodes:
            raise BadInput(
                f"a Slurm sandbox of {found.layout.net.nodes} nodes runs here ({where}); "
                f"--nodes={nodes} would be another",
                hint="fsdpctl sandbox slurm down, then up with --nodes",
            )
        return found, True
    if found is not None:
        _down(where)
    return _start(nodes, where), False


def _start(nodes: int, where: Path) -> Sandbox:
    files.make_dirs(where)
    munge_dir = _short_dir()
    try:
        net = netns.claim(NETWORK, nodes)
    except BaseException:
        shutil.rmtree(munge_dir, ignore_errors=True)
        raise
    kit, why = containers.find(_daemon_path())
    sb = Sandbox(Layout(where, net, munge_dir, _free_port()), containers=kit, no_containers=why)
    save(sb)  # from here on, `down` can undo whatever follows
    try:
        _boot(sb)
    except BaseException:
        _down(where)
        raise
    return sb


def _boot(sb: Sandbox) -> None:
    lay = sb.layout
    write_files(lay, sb.containers.plugstack() if sb.containers else "")
    sb.shared.mkdir(exist_ok=True)
    shell.capture(["mungekey", "--create", f"--keyfile={lay.munge_key}"], timeout=20)
    _spawn(sb, "munged", lay.munged_argv())
    _until(sb, lay.munge_socket.exists, "munged's socket", 20)
    _spawn(sb, "slurmctld", [*CONTROLLER_BOOT, "slurmctld", "-D"])
    for node, name in enumerate(lay.names):
        _start_node(sb, node, name)
    _until(sb, lambda: idle(lay) == lay.names, "every node idle", START_TIMEOUT)
    for name in lay.names:  # each node's munged, started by its boot script: by its pid file
        pid = _pid_of(lay.pid_file(f"munged-{name}"), "munged")
        ident = identity(pid) if pid else None
        if ident is None:
            raise FsdpctlError(f"munged of {name} is not running\n{tail(lay)}")
        sb.daemons[f"munged-{name}"] = ident
    save(sb)


def _start_node(sb: Sandbox, node: int, name: str) -> None:
    """slurmd of node `name`; with containers, enroot first on its PATH and, for a build's enroot,
    the node's own directory bound where its enroot.conf looks (containers.prepare_node)."""
    env, bind, kit = daemon_env(sb.layout), None, sb.containers
    if kit is not None:
        bind = containers.prepare_node(kit, sb.node_local(name))
        env |= kit.node_env(env["PATH"])
    _spawn(sb, f"slurmd-{name}", sb.layout.node_argv(node, bind), env)


def _spawn(sb: Sandbox, name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
    """A daemon in the foreground of a session of its own, its output in log/<name>.stderr;
    recorded at once (`ip netns exec`, `unshare` and `sh -c exec` replace themselves: the pid is the
    daemon's)."""
    lay = sb.layout
    env = env or daemon_env(lay)
    proc = shell.spawn(argv, env=env, log=lay.log(f"{name}.stderr"), new_session=True)
    ident = identity(proc.pid)
    if ident is None:
        raise FsdpctlError(f"{name} exited at once\n{tail(lay)}")
    sb.daemons[name] = ident
    save(sb)


def _until(sb: Sandbox, check: Any, what: str, timeout: float) -> None:
    """Poll `check` until true; fail with the logs' tails when a daemon died or past `timeout`."""
    deadline = time.monotonic() + timeout
    while not check():
        dead = [n for n, alive in sb.living().items() if not alive]
        if dead or time.monotonic() > deadline:
            why = f"{', '.join(dead)} exited" if dead else f"not within {timeout:g} s"
            raise FsdpctlError(f"Slurm sandbox: {what}: {why}\n{tail(sb.layout)}")
        time.sleep(0.3)


def _pid_of(path: Path, program: str) -> int | None:
    """The pid in a pid file while that process is still `program`."""
    try:
        pid = int(path.read_text().split()[0])
        argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
    except (OSError, ValueError, IndexError):
        return None
    return pid if Path(argv0.decode(errors="replace")).name == program else None


def tail(layout: Layout, lines: int = 15) -> str:
    """The last lines of every daemon's log that has any."""
    logs = sorted(p for p in (layout.root / "log").glob("*") if p.is_file() and p.stat().st_size)
    return "\n".join(
        f"--- {p}\n" + "\n".join(p.read_text(errors="replace").splitlines()[-lines:]) for p in logs
    )


# ---- reading it -----------------------------------------------------------------------------------


def idle(layout: Layout) -> list[str]:
    """The nodes sinfo lists as idle (`-N`: a line per node; `%T`: the long state name)."""
    return sorted(n for n, state in nodes(layout).items() if state == "idle")


def nodes(layout: Layout) -> dict[str, str]:
    """Each node's state as sinfo says it; empty when slurmctld does not answer."""
    try:
        got = shell.capture(
            ["sinfo", "-h", "-N", "-o", "%N %T"], env=client_env(layout), timeout=20
        )
    except shell.ToolTimeout:
        return {}
    words = got.stdout.split() if got.rc == 0 else []
    return dict(zip(words[::2], words[1::2], strict=False))


def jobs(layout: Layout) -> list[str]:
    """The ids of the sandbox's jobs slurmctld still runs or holds."""
    try:
        got = shell.capture(["squeue", "-h", "-o", "%i"], env=client_env(layout), timeout=20)
    except shell.ToolTimeout:
        return []
    return got.stdout.split() if got.rc == 0 else []


def status(where: Path) -> dict[str, Any] | None:
    sb = load(where)
    if sb is None:
        return None
    living = sb.living()
    up_ = living.get("slurmctld", False)
    return {
        "state": str(where),
        "complete": sb.complete(),
        "daemons": {n: {"pid": pid_of(sb.daemons[n]), "running": a} for n, a in living.items()},
        "nodes": nodes(sb.layout) if up_ else {},
        "jobs": jobs(sb.layout) if up_ else [],
        "containers": containers_text(sb),
        "exports": exports(sb),
    }


def containers_text(sb: Sandbox) -> str:
    """Whether jobs may run in a container (SLURM_CONTAINER_IMAGE), in a line."""
    if sb.containers is None:
        return f"none: {sb.no_containers}" if sb.no_containers else "none"
    return f"pyxis {sb.containers.plugin}, enroot in {sb.containers.bin}"


def exports(sb: Sandbox) -> dict[str, str]:
    """What a shell exports to use the sandbox: the client commands' SLURM_CONF and fsdpctl's
    settings (FSDPCTL_<KEY>): the backend, the shared file system, and the Python on the nodes that
    has fsdptrain (this one's: the nodes are this machine)."""
    return {
        "SLURM_CONF": str(sb.layout.conf),
        "FSDPCTL_BACKEND": "slurm",
        "FSDPCTL_SHARED_VOLUME_PATH": str(sb.shared),
        "FSDPCTL_SLURM_PYTHON": sys.executable,
        "FSDPCTL_SLURM_PARTITION": PARTITION,
    }


# ---- down ---------------------------------------------------------------------------------------


def down(where: Path) -> list[str]:
    """`_down` under the sandbox's lock."""
    with locked(where):
        return _down(where)


def _down(where: Path) -> list[str]:
    """Stop everything the sandbox in `where` started and remove what it made; what was done, a line
    each (empty: no sandbox). Its jobs are cancelled first (their steps end as a cluster ends them),
    then its daemons by identity, then whatever still runs in its nodes' namespaces."""
    sb = load(where)
    if sb is None:
        return []
    lay, done = sb.layout, []
    if same_process(sb.daemons.get("slurmctld")):
        cancelled = jobs(lay)
        if cancelled:
            shell.capture(["scancel", *cancelled], env=client_env(lay), timeout=30)
            _jobs_end(lay)
            done.append(f"cancelled job {', '.join(cancelled)}")
    ours = _recorded_living(sb)
    _terminate(ours)
    done.append(f"stopped {len(ours)} daemon(s)")
    left = [p for node in range(lay.net.nodes) for p in _pids_in(lay.net, node)]
    _terminate(left)
    if left:
        done.append(f"ended {len(left)} process(es) left in the nodes' namespaces")
    netns.destroy(lay.net)
    done.append(f"removed network {lay.net.bridge} and {lay.net.nodes} namespace(s)")
    shutil.rmtree(lay.munge_dir, ignore_errors=True)
    shutil.rmtree(where, ignore_errors=True)
    done.append(f"removed {where} and {lay.munge_dir}")
    return done


def _jobs_end(layout: Layout) -> None:
    """Until slurmctld runs no job of the sandbox any more, at most CANCEL_WAIT: a cancelled job's
    steps get SIGTERM, then SIGKILL after KillWait (2 s), from their slurmstepd, as on a cluster;
    what is left after that is ended below with the namespaces' processes."""
    deadline = time.monotonic() + CANCEL_WAIT
    while _running_jobs(layout) and time.monotonic() < deadline:
        time.sleep(0.3)


def _running_jobs(layout: Layout) -> list[str]:
    try:
        got = shell.capture(
            ["squeue", "-h", "-t", "RUNNING,COMPLETING", "-o", "%i"],
            env=client_env(layout),
            timeout=20,
        )
    except shell.ToolTimeout:
        return []
    return got.stdout.split() if got.rc == 0 else []


def _recorded_living(sb: Sandbox) -> list[int]:
    """The pids of the daemons still the processes recorded, the nodes' first."""
    idents = [sb.daemons.get(name) for name in sb.layout.daemons()]
    return [int(i["pid"] or 0) for i in idents if i is not None and same_process(i)]


def _pids_in(net: netns.Network, node: int) -> list[int]:
    """Every process in the node's network namespace (`ip netns pids`; none once it is gone)."""
    try:
        got = shell.capture(["ip", "netns", "pids", net.namespace(node)], timeout=20)
    except (shell.ToolMissing, shell.ToolTimeout):
        return []
    return [int(p) for p in got.stdout.split() if p.isdigit()]


def _terminate(pids: list[int]) -> None:
    """SIGTERM, then SIGKILL to what still runs after STOP_GRACE."""
    idents = [i for p in pids if (i := identity(p)) is not None]
    for ident in idents:
        _signal(pid_of(ident), signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE
    while (living := [i for i in idents if same_process(i)]) and time.monotonic() < deadline:
        time.sleep(0.2)
    for ident in living:
        _signal(pid_of(ident), signal.SIGKILL)


def pid_of(ident: Identity) -> int:
    return int(ident["pid"] or 0)


def _signal(pid: int, sig: int) -> None:
    if pid <= 0:  # os.kill(0 or -1, ...) would signal a whole group
        return
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass

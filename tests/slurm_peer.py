"""The Slurm peer: a real cluster of Debian's slurm-wlm 22.05 on this machine, started and torn down
by the tests (`running()`, or a fixture built on it), for the Slurm backend (issue 32).

    munged     one per node and one for the controller, as on a cluster, sharing the test's own
               key; each is found at the path AuthInfo=socket= names (see `NODE_BOOT`)
    slurmctld  this machine's network namespace and a UTS namespace of its own (host name
               `slurmctl`), reached at the nodes' bridge address 10.231.<i>.1 on a free port
    slurmd N   network namespace N of `fsdpctl.adapters.netns`, as the local backend's nodes
               (bridge, veth, 10.231.<i>.<10+N>, an /etc/hosts naming every node), and a UTS
               namespace of its own, host name `node<N>`: slurmd finds its NodeName by that name,
               and what it starts (slurmstepd, the batch script, srun's tasks) inherits both

The cluster's files and boot lines are the product's (fsdpctl.sandbox.slurm_layout): the tests run the
very cluster `fsdpctl sandbox slurm up` starts for a user, supervised here instead of detached.
Every file (slurm.conf, cgroup.conf, state, logs, pid files) lives in the test's directory and
SLURM_CONF points the client commands (`Cluster.command`) at it; munge's key and sockets and the
slurmds' spool need a short directory of their own (munged wants its socket's directories
searchable by all, up to /; slurmstepd binds a socket in the spool, at most 108 bytes of path:
under a pytest-xdist worker's directory the test's own spool path was 112 and no job started).
No slurmdbd, so no `sacct`: `scontrol show job` (a finished job is kept for MinJobAge=300 s) and the
jobs' output files are the record.
Bounded in time: every wait has a deadline, and the daemons get SIGTERM when the test process dies
(PR_SET_PDEATHSIG). Teardown stops the daemons by their pid files, kills what is left in each node's
namespace (steps, tasks) and removes the namespaces and links. Without root, iproute2, util-linux or
the packages, `available()` says why in one line and `running()` skips with it.

With `containers=True` (issue 36) every slurmd also runs jobs in containers as HyperPod's and
ParallelCluster's do: pyxis v0.24.0 registered as a SPANK plugin (plugstack.conf, named by
PlugStackConfig=) and enroot v4.1.2 on the slurmds' PATH, both built from ../shared/vendor by
tests/pyxis_peer.py (once per cache key); each node keeps enroot's and pyxis's state in a directory
of its own (its "local disk", bound over the build's node-local mount point in its mount namespace),
and `Cluster.image` is a squashfs that runs the tests' Python, with the checkout and its virtual
environment mounted into every container by the nodes' enroot configuration (mounts.d), as a
cluster's administrator mounts the shared file system.

The configuration follows slurm.conf(5) of Slurm 22.05 (SchedMD/slurm, tag slurm-22-05-8-1,
doc/man/man5/slurm.conf.5); each choice that shapes what a test sees says why where it is made.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import pytest

import pyxis_peer
from conftest import ROOT, scaled
from fsdpctl.adapters import netns
from fsdpctl.sandbox import slurm_layout
from fsdpctl.sandbox.slurm_layout import (  # noqa: F401 - the peer's names, as other tests use them
    CONTROLLER,
    CONTROLLER_BOOT,
    CRED_EXPIRE,
    NODE_BOOT,
    PARTITION,
    PROGRAMS,
    SLURMD_TIMEOUT,
    Layout,
    parse_record,
)

# the cluster itself (its files, slurm.conf, how its daemons boot) is the product's, the one
# `fsdpctl sandbox slurm up` starts for users: fsdpctl.sandbox.slurm_layout
START_TIMEOUT = 60.0  # until every node is idle; ~2 s on this loaded 2-core machine
STOP_GRACE = 10.0  # SIGTERM to SIGKILL
T = TypeVar("T")


def available() -> tuple[bool, str]:
    """(usable, why not): root and iproute2 (netns.available), util-linux, munge, slurm-wlm."""
    usable, why = netns.available()
    if not usable:
        return False, f"no Slurm cluster here: {why}"
    missing = [p for p in PROGRAMS if shutil.which(p) is None]
    if missing:
        return False, f"no Slurm cluster here: {', '.join(missing)} missing (scripts/system-deps)"
    return True, ""


@dataclass
class Cluster(Layout):
    """A running cluster: its directory, the nodes' network (`Layout`), its daemons, its client
    commands."""

    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    containers: pyxis_peer.Build | None = None  # pyxis + enroot on every node
    image: Path | None = None  # with containers: the trainer's squashfs (pyxis_peer.trainer_image)

    @property
    def env(self) -> dict[str, str]:
        """This environment without SLURM_* (a developer's own cluster), with SLURM_CONF; sbatch
        passes it on to the job (--export=ALL), so `scontrol` and `srun` in a script find it."""
        keep = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
        return keep | {"SLURM_CONF": str(self.conf)}

    # ---- client commands ----
    def command(
        self, *argv: str, timeout: float = 30, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """A client command (sinfo, sbatch, scontrol...) on this machine, against the cluster."""
        got = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=timeout)
        if check and got.returncode != 0:
            why = got.stderr.strip()
            raise AssertionError(f"{' '.join(argv)}: rc {got.returncode}: {why}\n{self.logs()}")
        return got

    def sbatch(self, script: str | Path, *options: str) -> int:
        """Submit a batch script; its job id (`sbatch --parsable` prints `id[;cluster]`)."""
        out = self.command("sbatch", "--parsable", *options, str(script)).stdout
        return int(out.strip().split(";")[0])

    def job(self, job_id: int) -> dict[str, str]:
        return parse_record(self.command("scontrol", "-o", "show", "job", str(job_id)).stdout)

    def node(self, name: str) -> dict[str, str]:
        return parse_record(self.command("scontrol", "-o", "show", "node", name).stdout)

    def hostnames(self, expression: str) -> list[str]:
        """A host list expression (`node[0-1]`) expanded by `scontrol show hostnames`."""
        return self.command("scontrol", "show", "hostnames", expression).stdout.split()

    def idle(self) -> list[str]:
        """The nodes sinfo lists as idle (`-N`: a line per node; `%T`: the long state name)."""
        out = self.command("sinfo", "-h", "-N", "-o", "%N %T").stdout.split()
        rows = zip(out[::2], out[1::2], strict=True)
        return sorted(name for name, state in rows if state == "idle")

    def wait_for(self, check: Callable[[], T], what: str, timeout: float = 180) -> T:
        """Poll `check` until it returns something true; past `timeout` (generous: a loaded 2-core
        CI machine slows slurmctld and slurmd), fail naming `what`."""
        timeout = scaled(timeout)  # the machine's load stretches every daemon's answer
        deadline = time.monotonic() + timeout
        while not (got := check()):
            if time.monotonic() > deadline:
                raise AssertionError(f"{what}: not within {timeout:g} s\n{self.logs()}")
            time.sleep(0.3)
        return got

    def logs(self, lines: int = 25) -> str:
        """The last lines of every daemon's log, and its stderr where it died before opening it."""
        found = {p.stem: p for p in (self.root / "log").glob("*.stderr") if p.stat().st_size}
        found |= {p.stem: p for p in (self.root / "log").glob("*.log")}
        return "\n".join(
            f"--- {p.name}\n" + "\n".join(p.read_text(errors="replace").splitlines()[-lines:])
            for p in sorted(found.values())
        )

    # ---- the daemons ----
    def start_node(self, node: int) -> None:
        """slurmd of node N in its network namespace and a new UTS namespace named node<N>. slurmd
        registers as the NodeName of its host name (slurmd.c:_read_config, fatal "Unable to
        determine this slurmd's NodeName" otherwise); `-N NAME` instead would need a build with
        --enable-multiple-slurmd (slurmd(8))."""
        env, bind = self.env, None
        if self.containers is not None:  # this node's local disk where enroot and pyxis look
            bind = (self.node_local(node), self.containers.node_local)
            env = self.node_env(node)
        self._spawn(f"slurmd-{self.names[node]}", self.node_argv(node, bind), env)

    def node_local(self, node: int) -> Path:
        """With containers: node N's directory for enroot's and pyxis's state (its local disk)."""
        return self.munge_dir / "local" / self.names[node]

    def node_env(self, node: int) -> dict[str, str]:
        """slurmd's environment with containers: enroot's bin first on PATH (pyxis runs `enroot`
        by PATH, the one variable it keeps of slurmstepd's: pyxis_slurmstepd.c slurm_clear_env),
        and ENROOT_*_PATH naming this node's directories for an `enroot` run by hand on the node;
        what pyxis runs reads them from enroot.conf (pyxis_peer.Build)."""
        assert self.containers is not None
        build = self.containers
        bound = {k: str(v) for k, v in build.local_dirs().items()}
        return self.env | bound | {"PATH": f"{build.bin}:{os.environ.get('PATH', '')}"}

    def kill_slurmd(self, node: int) -> None:
        """SIGKILL to node N's slurmd alone, as a crash or the OOM killer would: its slurmstepds
        and the job's tasks keep running, unknown to slurmctld until the node registers again.
        (Its munged goes with it here: PR_SET_PDEATHSIG from NODE_BOOT.)"""
        pid = daemon_pid(self.pid_file(f"slurmd-{self.names[node]}"), "slurmd")
        assert pid is not None, f"no slurmd running on {self.names[node]}"
        _signal(pid, signal.SIGKILL)

    def restart_controller(self, down_s: float = 0.0) -> None:
        """slurmctld stopped (SIGTERM: it saves its state to StateSaveLocation, slurmctld(8)), away
        `down_s` seconds, then started again: it reads its jobs back and the nodes re-register, as
        an upgrade or a failover does."""
        pid = daemon_pid(self.pid_file("slurmctld"), "slurmctld")
        assert pid is not None, "no slurmctld running"
        _terminate([pid])
        self.procs["slurmctld"].wait(timeout=STOP_GRACE * 2)
        time.sleep(down_s)  # the outage itself: what a client sees meanwhile is the point
        self._spawn("slurmctld", [*CONTROLLER_BOOT, "slurmctld", "-D"])

    def kill_node(self, node: int) -> None:
        """A power loss: SIGKILL to every process in the node's network namespace (slurmd,
        slurmstepd, the job's tasks)."""
        for pid in self.pids_in(node):
            _signal(pid, signal.SIGKILL)

    def pids_in(self, node: int) -> list[int]:
        """Every process in the node's network namespace (`ip netns pids`)."""
        argv = ["ip", "netns", "pids", self.net.namespace(node)]
        got = subprocess.run(argv, capture_output=True, text=True, timeout=20)
        return [int(p) for p in got.stdout.split()]

    def _spawn(self, daemon: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        """A daemon in the foreground (-D, -F): this process's child, so it dies with it."""
        with open(self.root / "log" / f"{daemon}.stderr", "ab") as err:
            self.procs[daemon] = subprocess.Popen(
                argv,
                env=self.env if env is None else env,
                stdin=subprocess.DEVNULL,
                stdout=err,
                stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent,
            )

    def _start(self) -> None:
        key = f"--keyfile={self.munge_key}"
        subprocess.run(["mungekey", "--create", key], check=True, timeout=20)
        self._spawn("munged", self.munged_argv())
        self.wait_for(self.munge_socket.exists, "munged's socket", timeout=20)
        self._spawn("slurmctld", [*CONTROLLER_BOOT, "slurmctld", "-D"])
        for node in range(self.net.nodes):
            self.start_node(node)
        self.wait_for(lambda: self.idle() == self.names, "every node idle", timeout=START_TIMEOUT)

    def stop(self) -> None:
        """Every daemon by its pid file (SIGTERM, SIGKILL after STOP_GRACE), then whatever is left
        in the nodes' namespaces (the steps and tasks of a killed slurmd); never raises."""
        daemons = self.daemons()
        _terminate([p for d in daemons if (p := daemon_pid(self.pid_file(d), d.split("-")[0]))])
        for node in range(self.net.nodes):
            _terminate(self.pids_in(node))
        for proc in self.procs.values():  # reaped: the pid files were the way to stop them
            try:
                proc.wait(timeout=STOP_GRACE)
            except subprocess.TimeoutExpired:
                proc.kill()


def daemon_pid(path: Path, program: str) -> int | None:
    """The pid in a pid file while that process is still `program` (a killed node's file stays,
    and its pid may be another process's by now)."""
    try:
        pid = int(path.read_text().split()[0])
        argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
    except (OSError, ValueError, IndexError):
        return None
    return pid if Path(argv0.decode(errors="replace")).name == program else None


def alive(pid: int) -> bool:
    """Running, not a zombie (a child that exited and is not reaped yet)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return False


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the test process goes (PR_SET_PDEATHSIG survives
    exec, and `ip netns exec`, `unshare`, `sh -c 'exec'` exec in place), so a killed pytest leaves
    no daemon holding the namespaces. A session of its own: the terminal's Ctrl-C is the test's."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG = 1
    os.setsid()


def _signal(pid: int, sig: int) -> bool:
    try:
        os.kill(pid, sig)
        return True
    except ProcessLookupError:
        return False


def _terminate(pids: list[int]) -> None:
    living = [p for p in pids if _signal(p, signal.SIGTERM)]
    deadline = time.monotonic() + STOP_GRACE
    while living and time.monotonic() < deadline:
        time.sleep(0.2)
        living = [p for p in living if alive(p)]
    for p in living:
        _signal(p, signal.SIGKILL)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def _write_conf(cluster: Cluster) -> None:
    # pyxis when the cluster runs containers
    plugins = cluster.containers.plugstack_line() if cluster.containers is not None else ""
    slurm_layout.write_files(cluster, plugins)


def _name_nodes_first(cluster: Cluster) -> None:
    """Each node's hosts file names the nodes before this machine (slurm_layout.write_hosts)."""
    slurm_layout.write_hosts(cluster)


def _prepare_containers(cluster: Cluster, mounts: Sequence[Path]) -> None:
    """Each node's local directories for enroot and pyxis, and its enroot mounts.d binding
    `mounts` into every container at their own paths (enroot reads ENROOT_CONFIG_PATH/mounts.d
    after the system's: src/runtime.sh mount_dirs)."""
    assert cluster.containers is not None
    for node in range(cluster.net.nodes):
        local = cluster.node_local(node)
        for sub in ("run", "cache", "data", "tmp", "pyxis", "config/mounts.d"):
            (local / sub).mkdir(parents=True, exist_ok=True)
        fstab = local / "config" / "mounts.d" / "50-fsdpctl-peer.fstab"
        fstab.write_text(pyxis_peer.mounts_fstab(mounts))


def container_mounts() -> list[Path]:
    """What the trainer's image lacks: the checkout and the virtual environment the tests run
    (the image has their interpreter, pyxis_peer.trainer_image)."""
    found = [ROOT, Path(sys.prefix)]
    return [p for i, p in enumerate(found) if not any(p.is_relative_to(q) for q in found[:i])]


@contextmanager
def running(
    root: Path, nodes: int = 2, *, containers: bool = False, mounts: Sequence[Path] | None = None
) -> Iterator[Cluster]:
    """A cluster of `nodes` simulated nodes, all idle; on exit its daemons are stopped and its
    namespaces and links gone. `containers`: pyxis and enroot on every node and `Cluster.image`,
    the trainer's image (`mounts`: host paths every container sees, default `container_mounts()`);
    skipped with the reason when they cannot be built here."""
    usable, why = available()
    if containers and usable:
        usable, why = pyxis_peer.available()
    if not usable:
        pytest.skip(why)
    build = pyxis_peer.build() if containers else None
    image = pyxis_peer.trainer_image() if containers else None
    munge_dir = Path(tempfile.mkdtemp(prefix="fsdpctl-munge-"))
    munge_dir.chmod(0o755)  # munged wants its socket's directories searchable by all, up to /
    net = netns.claim("slurm", nodes, {f"node{n}": n for n in range(nodes)})
    cluster = Cluster(root, net, munge_dir, _free_port(), containers=build, image=image)
    try:
        _name_nodes_first(cluster)
        _write_conf(cluster)
        if build is not None:
            _prepare_containers(cluster, container_mounts() if mounts is None else mounts)
        cluster._start()
        yield cluster
    finally:
        cluster.stop()
        netns.destroy(net)
        shutil.rmtree(munge_dir, ignore_errors=True)


@pytest.fixture
def slurm_clusters(tmp_path: Path) -> Iterator[Callable[..., Cluster]]:
    """A factory of running clusters for a test (the conformance suite's Slurm target):
    `slurm_clusters(nodes=2, containers=False, mounts=None)` starts one (~3 s here; with containers
    the first of a machine also builds pyxis, enroot and the image, ~20 s, then cached) and every
    one it started is stopped at teardown. Import it into a test module (`from slurm_peer import
    slurm_clusters`); a longer-lived cluster is `running()` in a fixture of that scope (as
    tests/conformance/places.py does: `running(root, 2, containers=True)` for the container cells)."""
    with ExitStack() as stack:
        made = 0

        def start(
            nodes: int = 2, *, containers: bool = False, mounts: Sequence[Path] | None = None
        ) -> Cluster:
            nonlocal made
            made += 1
            root = tmp_path / f"slurm-{made}"
            return stack.enter_context(running(root, nodes, containers=containers, mounts=mounts))

        yield start

"""A one-machine Slurm cluster on paper: where its files live, its slurm.conf, the nodes' hosts files
and the shell lines that boot its daemons. Pure (it writes files, starts nothing): `fsdpctl sandbox
slurm` (fsdpctl.sandbox.slurm) and the tests' peer (tests/slurm_peer.py) start the same cluster.

    munged     one per node and one for the controller, as on a cluster, sharing one key; each is
               found at the path AuthInfo=socket= names (see `NODE_BOOT`)
    slurmctld  this machine's network namespace and a UTS namespace of its own (host name
               `slurmctl`), reached at the nodes' bridge address 10.231.<i>.1
    slurmd N   network namespace N of `fsdpctl.adapters.netns` (bridge, veth, 10.231.<i>.<10+N>, an
               /etc/hosts naming every node) and a UTS namespace of its own, host name `node<N>`:
               slurmd finds its NodeName by that name, and what it starts (slurmstepd, the batch
               script, srun's tasks) inherits both

The configuration follows slurm.conf(5) of Slurm 22.05 (SchedMD/slurm, tag slurm-22-05-8-1,
doc/man/man5/slurm.conf.5); each choice that shapes what a job sees says why where it is made.
"""

from __future__ import annotations

import os
import re
import socket
from dataclasses import dataclass
from pathlib import Path

from fsdpctl.adapters import netns

CONTROLLER = "slurmctl"
PARTITION = "train"
# what a cluster needs on this machine, beyond root and iproute2 (netns.available)
PROGRAMS: tuple[str, ...] = (
    "munged",
    "mungekey",
    "slurmctld",
    "slurmd",
    "sbatch",
    "srun",
    "squeue",
    "scontrol",
)
PROGRAMS += ("sinfo", "scancel", "unshare", "nsenter", "setpriv", "mount")
# slurmctld pings a node every SlurmdTimeout/3 and sets it DOWN once its last answer is older than
# SlurmdTimeout (slurmctld/controller.c:_slurmctld_background, ping_nodes.c:ping_nodes); measured
# here, a killed node is NOT_RESPONDING after ~7 s and DOWN after ~15 s. Short, as one machine's
# nodes fail only when made to, long enough that a node slowed by a loaded machine is not dead.
SLURMD_TIMEOUT = 6
# a requeued batch job may start again cred_expire + 1 s after its requeue (job_mgr.c:
# batch_requeue_fini sets its begin_time; slurm.conf(5) AuthInfo: it "also controls how long a
# requeued job must wait before starting again"); default 120 s, the least slurm_cred.c takes 5.
# 15: a requeued job reads PENDING (BeginTime) in that window, which 6 s did not always leave to a
# poll on a loaded machine
CRED_EXPIRE = 15
# A node's boot, in its network namespace and the mount namespace `ip netns exec` makes for it: its
# own munged, then slurmd. One munged per node as on a cluster: munged refuses a credential already
# decoded "on this host" (munged(8) DESCRIPTION, NOTES), while a launch message forwarded from node
# to node carries one credential, which Slurm accepts replayed only when built for several slurmds
# on one host (src/plugins/auth/munge/auth_munge.c, MULTIPLE_SLURMD; Debian's is not). Seen here
# with one munged for all: a step failing "Unable to send "ok" to slurmd". Each node's munged is
# bound over the socket directory slurm.conf names, in that node's mount namespace only, so slurmd,
# slurmstepd and srun on the node find their node's munged. setpriv --pdeathsig: munged goes when
# its node's slurmd does. $7/$8: a directory bound over another (the tests' node-local disk).
NODE_BOOT = r"""
set -e
hostname "$1"
mount --bind "$2" "$3"
setpriv --pdeathsig TERM munged -F --socket="$3/munge.socket" --key-file="$4" --pid-file="$5" \
    --seed-file="$2/munged.seed" 2>>"$6" &
tries=0
until [ -S "$3/munge.socket" ]; do
    tries=$((tries + 1)); [ "$tries" -le 300 ] || exit 1; sleep 0.1
done
if [ -n "${7-}" ]; then mount --bind "$7" "$8"; fi
exec slurmd -D
"""
# slurmctld starts only where its host name is SlurmctldHost (controller.c:_controller_index): a UTS
# namespace of its own named so; `unshare`, `sh -c` and `exec` keep one pid, the daemon's
CONTROLLER_BOOT = ["unshare", "--uts", "--", "sh", "-c", 'hostname "$0" && exec "$@"', CONTROLLER]


@dataclass
class Layout:
    """Where one cluster lives: `root` (slurm.conf, state, logs, pid files) and `munge_dir`, a short
    directory of its own for munge's key and sockets and the slurmds' spool (munged wants its
    socket's directories searchable by all, up to /; slurmstepd binds a socket in the spool, at most
    108 bytes of path: under a pytest-xdist worker's directory a spool path was 112 and no job
    started)."""

    root: Path
    net: netns.Network
    munge_dir: Path
    port: int  # slurmctld's

    @property
    def spool(self) -> Path:
        return self.munge_dir / "spool"

    @property
    def names(self) -> list[str]:
        return [f"node{n}" for n in range(self.net.nodes)]

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    @property
    def munge_key(self) -> Path:
        return self.munge_dir / "munge.key"

    @property
    def munge_socket(self) -> Path:
        return self.munge_dir / "run" / "munge.socket"

    def pid_file(self, daemon: str) -> Path:
        return self.root / "run" / f"{daemon}.pid"

    def log(self, name: str) -> Path:
        return self.root / "log" / name

    def munged_argv(self) -> list[str]:
        """The controller's munged, in the foreground (its caller detaches or supervises it)."""
        files = [
            f"--pid-file={self.pid_file('munged')}",
            f"--seed-file={self.munge_dir / 'munged.seed'}",
        ]
        return [
            "munged",
            "-F",
            f"--socket={self.munge_socket}",
            f"--key-file={self.munge_key}",
            *files,
        ]

    def node_argv(self, node: int, bind: tuple[Path, Path] | None = None) -> list[str]:
        """slurmd of node N in its network namespace and a new UTS namespace named node<N>. slurmd
        registers as the NodeName of its host name (slurmd.c:_read_config, fatal "Unable to
        determine this slurmd's NodeName" otherwise); `-N NAME` instead would need a build with
        --enable-multiple-slurmd (slurmd(8)). Makes the node's munge directory."""
        name = self.names[node]
        own = self.munge_dir / name  # this node's munged: its socket (bound over `run`) and seed
        own.mkdir(mode=0o755, exist_ok=True)
        for stale in own.glob("munge.socket*"):  # a killed node's
            stale.unlink()
        args = [name, own, self.munge_dir / "run", self.munge_key]
        args += [self.pid_file(f"munged-{name}"), self.log(f"munged-{name}.log")]
        args += list(bind or ())
        boot = ["unshare", "--uts", "--", "sh", "-c", NODE_BOOT, "boot", *map(str, args)]
        return [*self.net.exec_prefix(node), *boot]

    def daemons(self) -> list[str]:
        """Every daemon's name (its pid file's): the nodes' first, as they are stopped."""
        found = [f"{d}-{name}" for name in self.names for d in ("slurmd", "munged")]
        return [*found, "slurmctld", "munged"]


def parse_record(line: str) -> dict[str, str]:
    """One `scontrol -o show job|node` record: `Key=value` fields separated by spaces, where a value
    may hold spaces (a node's `Reason=Not responding [root@...]`): a field starts at ` Key=`."""
    fields = re.split(r" (?=[A-Za-z][A-Za-z0-9_:/]*=)", line.strip())
    pairs = (f.split("=", 1) for f in fields if "=" in f)
    return {key: value.strip() for key, value in pairs}


def write_files(layout: Layout, plugstack: str = "") -> None:
    """slurm.conf, cgroup.conf, plugstack.conf (`plugstack`: its lines, e.g. pyxis's) and the
    directories they name; the nodes' hosts files."""
    root = layout.root
    for sub in ("state", "log", "run"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    for name in layout.names:
        (layout.spool / name).mkdir(parents=True, exist_ok=True)
    (layout.munge_dir / "run").mkdir(mode=0o755, exist_ok=True)
    # not /etc/slurm's: no SPANK plugin of this machine's
    (root / "plugstack.conf").write_text(plugstack)
    # `ip netns exec` mounts a fresh sysfs (ip-netns(8)), so /sys/fs/cgroup is empty on a node;
    # slurmd 22.05 initializes its cgroup plugin whatever the others (slurmd.c:_slurmd_init,
    # cgroup_g_init) and autodetection fails there (common/cgroup.c:autodetect_cgroup_version).
    # Naming the plugin skips the detection; nothing uses it with proctrack/linuxproc and
    # task/none. cgroup.conf is read from beside slurm.conf.
    (root / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\n")
    layout.conf.write_text(slurm_conf(layout, os.cpu_count() or 1))
    write_hosts(layout)


def write_hosts(layout: Layout) -> None:
    """Each node's hosts file (`ip netns exec` binds /etc/netns/<ns>/hosts over /etc/hosts) with the nodes'
    names before this machine's: a node's address then reverse-resolves to its own name, as on a cluster
    whose nodes are named in DNS or /etc/hosts. torchrun's c10d rendezvous seats each node under
    socket.getfqdn() unless --local-addr is given (torch/distributed/elastic/rendezvous/
    dynamic_rendezvous.py, _NodeDescGenerator.generate), and rank 0's is the workers' master_addr; with
    this machine's name first, every node said `vm`, which on the other nodes resolves to themselves."""
    net = layout.net
    for node in range(net.nodes):
        lines = ["127.0.0.1 localhost"]
        lines += [f"{net.address(n)} {name}" for n, name in enumerate(layout.names)]
        lines.append(f"{net.address(node)} {socket.gethostname()}")
        hosts = netns.ETC_NETNS / net.namespace(node) / "hosts"
        hosts.parent.mkdir(parents=True, exist_ok=True)
        hosts.write_text("\n".join(lines) + "\n")


# how the sandbox schedules, the same for every layout: no mail, accounting or cgroups; a short
# scheduling loop and kill wait, so that tests and a user's first jobs do not wait on defaults
_POLICY = f"""\
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
# the main scheduling loop every 2 s (default 60): a submit or a job's end starts a pass of its
# own, a begin time passing does not, so a requeued job waited up to a minute after its BeginTime
SchedulerParameters=sched_interval=2
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
# a node set DOWN for not responding is back in service when its slurmd registers again
ReturnToService=1
# batch jobs may be requeued (node failure, scontrol requeue) unless submitted --no-requeue
JobRequeue=1
SlurmdTimeout={SLURMD_TIMEOUT}
MessageTimeout=5
# SIGTERM to SIGKILL when a job is cancelled or out of time (default 30 s)
KillWait=2
InactiveLimit=0
# a finished job stays in `scontrol show job` this long: without accounting, its only record
MinJobAge=300
"""


def slurm_conf(layout: Layout, cpus: int) -> str:
    root, net = layout.root, layout.net
    nodes = "\n".join(
        f"NodeName={name} NodeAddr={net.address(n)} CPUs={cpus} State=UNKNOWN"
        for n, name in enumerate(layout.names)
    )
    return f"""\
ClusterName=fsdpctl
# slurmctld starts only where its host name is SlurmctldHost (controller.c:_controller_index):
# the name of its UTS namespace, and the address the nodes reach it at
SlurmctldHost={CONTROLLER}({net.host_address})
SlurmctldPort={layout.port}
SlurmdPort=6818
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={layout.munge_socket},cred_expire={CRED_EXPIRE}
StateSaveLocation={root / "state"}
# %n: the node's name, so the slurmds sharing one file system keep their files apart; in the
# short directory: slurmstepd's socket there must fit sun_path (108 bytes)
SlurmdSpoolDir={layout.spool}/%n
SlurmctldPidFile={layout.pid_file("slurmctld")}
SlurmdPidFile={root / "run"}/slurmd-%n.pid
SlurmctldLogFile={layout.log("slurmctld.log")}
SlurmdLogFile={root / "log"}/slurmd-%n.log
PlugStackConfig={root / "plugstack.conf"}
{_POLICY}{nodes}
PartitionName={PARTITION} Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""

"""Adapter: one Linux network namespace per simulated node, so each local "pod" has an address of
its own.

A pod on Kubernetes has its own network namespace and IP; the PyTorchJob's `<job>-worker-0` Service
gives the address of replica 0, which the other replicas use as MASTER_ADDR and rendezvous endpoint.
Locally, as root with iproute2, each node runs under `ip netns exec` in a namespace joined to a
per-job bridge:

    host: bridge fsbr<i>  10.231.<i>.1/24   (etcd, when used, listens here)
    node N: namespace fsdpctl-<i>-<job>-<N>, veth fsv<i>n<N> <-> eth0 inside, 10.231.<i>.<10+N>/24

The bridge is the job's claim on its index <i>: creating it fails while another job (another
FSDPCTL_HOME, another user, a second `job run` at the same moment) holds it, and every other name
carries <i>, so two jobs of the same name never share or tear down each other's namespaces.

so what breaks on a cluster because nodes do not share an address (a store bound to 127.0.0.1, a
rendezvous endpoint of `localhost`) breaks here too, and a test can cut one node's link (`ip link
set ... down`). The addresses belong to namespaces this machine makes; nothing leaves it. Without
root or iproute2 the local backend falls back to loopback and says so (`available()`).
"""

from __future__ import annotations

import os
import shutil
import socket
import zlib
from dataclasses import dataclass
from pathlib import Path

from fsdpctl.adapters import shell

SUBNET_PREFIX = "10.231"
NODE_HOST_BASE = 10  # node N is .<10+N>; the bridge (host side) is .1
MAX_NODES = 200
ETC_NETNS = Path("/etc/netns")


class NetnsError(RuntimeError):
    pass


class BridgeTaken(NetnsError):
    """The index's bridge exists: another job claimed the subnet since `plan` looked."""


def available() -> tuple[bool, str]:
    """(usable, why not): root and the `ip` tool."""
    if os.geteuid() != 0:
        return False, "not root: simulated nodes share this machine's loopback address"
    if shutil.which("ip") is None:
        return False, "iproute2 (`ip`) is not installed: simulated nodes share the loopback address"
    return True, ""


@dataclass(frozen=True)
class Network:
    """The addresses and names of one job's simulated nodes."""

    index: int  # 1..250: the job's /24 and the suffix of its link names
    job: str
    nodes: int

    @property
    def bridge(self) -> str:
        return f"fsbr{self.index}"

    @property
    def host_address(self) -> str:
        return f"{SUBNET_PREFIX}.{self.index}.1"

    def namespace(self, node: int) -> str:
        # the index: a same-named job elsewhere has another
        return f"fsdpctl-{self.index}-{self.job}-{node}"

    def veth(self, node: int) -> str:
        return f"fsv{self.index}n{node}"  # at most 15 characters: fsv250n199

    def address(self, node: int) -> str:
        return f"{SUBNET_PREFIX}.{self.index}.{NODE_HOST_BASE + node}"

    def exec_prefix(self, node: int) -> list[str]:
        return ["ip", "netns", "exec", self.namespace(node)]


def plan(job: str, nodes: int, taken: set[int] | None = None) -> Network:
    """A subnet index for the job: stable per job name, moved past indexes in use (bridges that
    exist)."""
    if not 1 <= nodes <= MAX_NODES:
        raise NetnsError(
            f"{nodes} simulated nodes: at most {MAX_NODES} get an address of their own"
        )
    taken = _bridges() if taken is None else taken
    start = zlib.crc32(job.encode()) % 250
    for step in range(250):
        index = (start + step) % 250 + 1
        if index not in taken:
            return Network(index, job, nodes)
    raise NetnsError("no free subnet for another local job network (250 jobs running?)")


def _ip(*args: str) -> None:
    got = shell.capture(["ip", *args], timeout=20)
    if got.rc != 0:
        raise NetnsError(f"ip {' '.join(args)}: {got.stderr.strip() or got.stdout.strip()}")


def _bridges() -> set[int]:
    got = shell.capture(["ip", "-o", "link", "show", "type", "bridge"], timeout=20)
    names = [
        line.split(":")[1].strip().split("@")[0] for line in got.stdout.splitlines() if ":" in line
    ]
    return {int(n[4:]) for n in names if n.startswith("fsbr") and n[4:].isdigit()}


def claim(job: str, nodes: int, names: dict[str, int] | None = None) -> Network:
    """`plan` then `create`, moving past an index whose bridge another job made in between (the
    bridge is the claim: `ip link add` fails with File exists for the second of two jobs that
    planned the same one)."""
    taken = _bridges()
    while True:
        net = plan(job, nodes, taken)  # raises once all 250 are taken
        try:
            create(net, names)
            return net
        except BridgeTaken:
            taken.add(net.index)


def create(net: Network, names: dict[str, int] | None = None) -> None:
    """Bridge, then one namespace per node with its veth, address and loopback up, and its own
    /etc/hosts; undone on failure (never another job's bridge: BridgeTaken when it exists). `names`
    (host name -> node) go into every node's hosts file, as cluster DNS would answer them
    (`<job>-worker-0` -> node 0)."""
    try:
        _ip("link", "add", net.bridge, "type", "bridge")
    except NetnsError as e:
        if "File exists" in str(e):
            raise BridgeTaken(
                f"{net.bridge} exists: subnet {net.host_address}/24 is another job's"
            ) from e
        raise
    try:
        _ip("addr", "add", f"{net.host_address}/24", "dev", net.bridge)
        _ip("link", "set", net.bridge, "up")
        for node in range(net.nodes):
            _add_node(net, node)
            _write_hosts(net, node, names or {})
    except (NetnsError, shell.ToolMissing, OSError):
        destroy(net)
        raise


def _write_hosts(net: Network, node: int, names: dict[str, int]) -> None:
    """`ip netns exec` bind-mounts /etc/netns/<ns>/hosts over /etc/hosts (ip-netns(8)): inside, this
    machine's hostname resolves to the node's own address, as a pod's hostname resolves to its pod
    IP; torchrun's c10d backend decides whether it hosts the store by that lookup."""
    lines = ["127.0.0.1 localhost", f"{net.address(node)} {socket.gethostname()}"]
    lines += [f"{net.address(other)} {name}" for name, other in names.items()]
    hosts = ETC_NETNS / net.namespace(node) / "hosts"
    hosts.parent.mkdir(parents=True, exist_ok=True)
    hosts.write_text("\n".join(lines) + "\n")


def _add_node(net: Network, node: int) -> None:
    ns, veth = net.namespace(node), net.veth(node)
    _ip("netns", "add", ns)
    _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
    _ip("link", "set", veth, "master", net.bridge)
    _ip("link", "set", veth, "up")
    _ip("-n", ns, "addr", "add", f"{net.address(node)}/24", "dev", "eth0")
    _ip("-n", ns, "link", "set", "eth0", "up")
    _ip("-n", ns, "link", "set", "lo", "up")


def destroy(net: Network) -> None:
    """Everything `create` made, whatever exists of it; never raises (teardown runs on every
    path)."""
    for node in range(net.nodes):
        for args in (("link", "del", net.veth(node)), ("netns", "del", net.namespace(node))):
            try:
                shell.capture(["ip", *args], timeout=20)
            except (shell.ToolMissing, shell.ToolTimeout):
                pass
    try:
        shell.capture(["ip", "link", "del", net.bridge], timeout=20)
    except (shell.ToolMissing, shell.ToolTimeout):
        pass
    for node in range(net.nodes):
        shutil.rmtree(ETC_NETNS / net.namespace(node), ignore_errors=True)


def cut(net: Network, node: int) -> None:
    """Take one node off the network (its link down), as a failed NIC or a partitioned node would
    be."""
    _ip("link", "set", net.veth(node), "down")


def reconnect(net: Network, node: int) -> None:
    """Undo `cut`: the node's link up again, as after a transient partition; its open TCP
    connections resume once the kernel retransmits."""
    _ip("link", "set", net.veth(node), "up")


def exists(net: Network) -> bool:
    got = shell.capture(["ip", "netns", "list"], timeout=20)
    names = {line.split()[0] for line in got.stdout.splitlines() if line.strip()}
    return any(net.namespace(n) in names for n in range(net.nodes))

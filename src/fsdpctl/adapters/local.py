"""Adapter: the local backend. Runs a rendered PyTorchJob on this machine, one torchrun launcher per
simulated node, as Kubernetes would run one per pod, with the pod's command and environment.

A detached supervisor process (`python -m fsdpctl.adapters.local JOB_DIR`) owns the launchers, so
`job status`, `job logs -f` and `job stop` work from any terminal. Everything lives under the job directory:

    FSDPCTL_HOME/jobs/<job>/state.json        phase, pids, exit codes (written atomically)
    FSDPCTL_HOME/jobs/<job>/spec.json         what to launch (no secrets: the token is in the environment)
    FSDPCTL_HOME/jobs/<job>/logs/<run>/node-N.log
    FSDPCTL_HOME/jobs/<job>/checkpoints/      the pod's /checkpoints volume; survives runs, so runs resume
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from fsdpctl.adapters import etcd as etcd_adapter
from fsdpctl.adapters import netns, shell
from fsdpctl.files import home, write_atomic
from fsdptrain import events

ACTIVE = ("Pending", "Running", "Stopping")
STOP_GRACE_S = 120  # the pod's terminationGracePeriodSeconds


class LocalJobError(RuntimeError):
    pass


def job_dir(job_name: str) -> Path:
    return home() / "jobs" / job_name


def write_json(path: Path, data: dict) -> None:
    write_atomic(path, json.dumps(data, indent=1))


def read_state(jdir: Path) -> dict | None:
    try:
        return json.loads((jdir / "state.json").read_text())
    except FileNotFoundError:
        return None


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


def effective_phase(state: dict | None) -> str | None:
    """The recorded phase, or Failed when the supervisor died without recording an end."""
    if state is None:
        return None
    if state["phase"] in ACTIVE and not pid_alive(state.get("supervisor_pid")):
        return "Failed"
    return state["phase"]


@dataclass
class Launch:
    node: int
    argv: list[str]
    env: dict[str, str]


def launches(
    spec: dict, endpoint: str, environ: dict[str, str], net: netns.Network | None = None
) -> list[Launch]:
    """Translate the PyTorchJob's worker container into one launcher per replica on this machine: the pod's
    command and environment, its volumes mapped to directories (`volume_dirs`), and with `net` its own
    network namespace and address (torchrun's --local-addr: what a pod's hostname resolves to)."""
    total = spec["replicas"] * spec["nproc_per_node"]
    out = []
    for node in range(spec["replicas"]):
        argv = [sys.executable, "-m", "torch.distributed.run"]
        for arg in spec["command"][1:]:  # command[0] is `torchrun`
            argv.append(f"--rdzv-endpoint={endpoint}" if arg.startswith("--rdzv-endpoint=") else arg)
        if net is not None:
            argv = [*net.exec_prefix(node), *argv[:3], f"--local-addr={net.address(node)}", *argv[3:]]
        env = {**environ, **_mapped_env(spec, node)}
        if net is not None:  # gloo binds the address the hostname resolves to, unless told the interface
            env["GLOO_SOCKET_IFNAME"] = "eth0"
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // total)))
        out.append(Launch(node, argv, env))
    return out


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


def volume_dirs(spec: dict, node: int) -> dict[str, str]:
    """Pod mount path -> directory on this machine, as the kubelet would give it to that pod: an emptyDir
    is the node's own (a pod's scratch disk), a PersistentVolumeClaim one directory every node shares."""
    return {mount: v.replace("{node}", str(node)) for mount, v in spec["volumes"].items()}


def spec_from_job(job: dict, jdir: Path) -> dict:
    worker = job["spec"]["pytorchReplicaSpecs"]["Worker"]
    pod = worker["template"]["spec"]
    container = pod["containers"][0]
    return {
        "job": job["metadata"]["name"],
        "run_id": job["spec"]["elasticPolicy"]["rdzvId"],
        "rdzv_backend": job["spec"]["elasticPolicy"]["rdzvBackend"],
        "replicas": worker["replicas"],
        "nproc_per_node": int(job["spec"]["nprocPerNode"]),
        "command": container["command"],
        "env": {e["name"]: e["value"] for e in container["env"] if "value" in e},
        "volumes": _volumes(pod, container, jdir),
        "grace_s": pod.get("terminationGracePeriodSeconds", STOP_GRACE_S),
    }


def _volumes(pod: dict, container: dict, jdir: Path) -> dict[str, str]:
    """Mount path -> directory template ('{node}' for per-node emptyDirs). In-memory emptyDirs (/dev/shm) and
    Secrets (the token travels in the environment) are not mapped."""
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    out = {}
    for m in container.get("volumeMounts", []):
        v = volumes.get(m["name"], {})
        if "persistentVolumeClaim" in v:
            out[m["mountPath"]] = str(shared_volume_dir(v["persistentVolumeClaim"]["claimName"]))
        elif "emptyDir" in v and v["emptyDir"].get("medium") != "Memory":
            out[m["mountPath"]] = str(jdir / "nodes" / "node-{node}" / m["name"])
    return out


def shared_volume_dir(claim: str) -> Path:
    """A PersistentVolumeClaim on this machine: a directory under FSDPCTL_HOME/volumes that outlives jobs."""
    return home() / "volumes" / claim


def start(job: dict, *, secret_env: dict[str, str]) -> dict:
    """Write the spec and start the detached supervisor; returns the initial state."""
    name = job["metadata"]["name"]
    jdir = job_dir(name)
    if effective_phase(read_state(jdir)) in ACTIVE:
        raise LocalJobError(f"job {name!r} is already running: `fsdpctl job stop` first, or pass --replace")
    jdir.mkdir(parents=True, exist_ok=True)
    spec = spec_from_job(job, jdir)
    shutil.rmtree(jdir / "nodes", ignore_errors=True)  # new pods get new emptyDirs
    log_dir = jdir / "logs" / spec["run_id"]
    log_dir.mkdir(parents=True, exist_ok=True)
    write_json(jdir / "spec.json", spec)
    state = {
        "job": name,
        "run_id": spec["run_id"],
        "phase": "Pending",
        "created": time.time(),
        "replicas": spec["replicas"],
        "log_dir": str(log_dir),
        "checkpoint_dir": _mapped_env(spec, 0).get("CHECKPOINT_DIR"),
        "supervisor_pid": None,
        "launchers": [],
        "stop_requested": False,
    }
    write_json(jdir / "state.json", state)
    env = {**os.environ, **secret_env}
    argv = [sys.executable, "-m", "fsdpctl.adapters.local", str(jdir)]
    proc = shell.spawn(argv, env=env, log=log_dir / "supervisor.log")
    state["supervisor_pid"] = proc.pid
    _update(jdir, supervisor_pid=proc.pid)
    return state


def _update(jdir: Path, **changes) -> dict:
    state = read_state(jdir) or {}
    state.update(changes)
    write_json(jdir / "state.json", state)
    return state


def stop(job_name: str) -> dict | None:
    jdir = job_dir(job_name)
    state = read_state(jdir)
    if state is None:
        raise LocalJobError(f"no local job named {job_name!r}: `fsdpctl job list` shows what exists")
    if effective_phase(state) in ACTIVE:
        _update(jdir, stop_requested=True)
        os.kill(state["supervisor_pid"], signal.SIGTERM)
    return read_state(jdir)


def wait(job_name: str, timeout: float | None = None, poll: float = 0.5) -> dict | None:
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        state = read_state(job_dir(job_name))
        if effective_phase(state) not in ACTIVE:
            return state
        if deadline is not None and time.monotonic() > deadline:
            return state
        time.sleep(poll)


def list_jobs() -> list[dict]:
    root = home() / "jobs"
    states = [read_state(p) for p in sorted(root.iterdir())] if root.is_dir() else []
    return [s for s in states if s]


def restarts(state: dict) -> int:
    """Worker-group failures torchrun's elastic agent reported (it restarts the group while MAX_RESTARTS
    allows): its "failed (exitcode:" lines, torch 2.13's wording in torch/distributed/elastic/agent."""
    return sum(f.read_text(errors="replace").count("failed (exitcode:") for f in log_files(state))


def log_files(state: dict) -> list[Path]:
    return sorted(Path(state["log_dir"]).glob("node-*.log"))


def leader_log(state: dict) -> Path | None:
    """The node whose launcher hosts global rank 0 (the one printing progress), as its `leader` event says;
    node 0 until one is seen. After an elastic restart the rendezvous may seat rank 0 elsewhere: the latest
    event wins."""
    files = log_files(state)
    named = [
        (e.time, f)
        for f in files
        for e in events.parse(f.read_text(errors="replace").splitlines())
        if isinstance(e, events.Leader)
    ]
    if named:
        return max(named)[1]
    return files[0] if files else None


# ---- the supervisor process ---------------------------------------------------------------------------


def supervise(jdir: Path) -> int:
    spec = json.loads((jdir / "spec.json").read_text())
    state = read_state(jdir)
    if state is None:
        raise LocalJobError(f"{jdir}: no state.json to supervise")
    log_dir = Path(state["log_dir"])
    stopping = {"flag": False}
    signal.signal(signal.SIGTERM, lambda *_: stopping.update(flag=True))
    server, procs, net = None, [], _network(spec)
    try:
        if net is not None:
            netns.create(net, {f"{spec['job']}-worker-0": net.address(0)})
        server, endpoint = _rendezvous(spec, jdir, log_dir, net)
        for launch in launches(spec, endpoint, dict(os.environ), net):
            # a session of its own per launcher: its process group is the pod's processes
            procs.append(shell.spawn(launch.argv, env=launch.env, log=log_dir / f"node-{launch.node}.log"))
        _update(jdir, phase="Running", started=time.time(), rdzv_endpoint=endpoint, **_placement(net, procs))
        rcs = _wait_all(procs, stopping, jdir, spec.get("grace_s", STOP_GRACE_S))
    except Exception as e:  # recorded for `job status`; the traceback is in supervisor.log
        _terminate(procs, signal.SIGKILL)
        _update(jdir, phase="Failed", finished=time.time(), reason=str(e))
        raise
    finally:
        if server:
            server.stop()
        if net is not None:
            netns.destroy(net)
    phase = "Stopped" if stopping["flag"] else ("Succeeded" if all(rc == 0 for rc in rcs) else "Failed")
    launchers = [
        {"node": i, "pid": p.pid, "rc": rc} for i, (p, rc) in enumerate(zip(procs, rcs, strict=True))
    ]
    _update(jdir, phase=phase, finished=time.time(), launchers=launchers)
    return 0


def _network(spec: dict) -> netns.Network | None:
    """Namespaces when this machine allows them (root, iproute2) and FSDPCTL_LOCAL_NETNS is not 0."""
    usable, _ = netns.available()
    if not usable or os.environ.get("FSDPCTL_LOCAL_NETNS", "1") == "0":
        return None
    return netns.plan(spec["job"], spec["replicas"])


def network_note(state: dict) -> str:
    """What `job status` says about the nodes' addresses."""
    return state.get("network") or "loopback"


def _rendezvous(
    spec: dict, jdir: Path, log_dir: Path, net: netns.Network | None
) -> tuple[etcd_adapter.EtcdServer | None, str]:
    """(etcd server or None, endpoint). c10d with namespaces: the manifest's own `<job>-worker-0:29400`,
    which each node's hosts file resolves to node 0 as the operator's Service does; on loopback a free port.
    etcd: a server on the host side of the nodes' bridge (or loopback)."""
    if spec["rdzv_backend"] == "c10d":
        if net is not None:
            return None, _manifest_endpoint(spec)
        return None, f"127.0.0.1:{etcd_adapter.free_port()}"
    host = net.host_address if net else "127.0.0.1"
    server = etcd_adapter.start(jdir / "etcd" / spec["run_id"], log_file=log_dir / "etcd.log", host=host)
    return server, server.endpoint


def _manifest_endpoint(spec: dict) -> str:
    return next(a.split("=", 1)[1] for a in spec["command"] if a.startswith("--rdzv-endpoint="))


def _placement(net: netns.Network | None, procs: list) -> dict:
    why = netns.available()[1] or "FSDPCTL_LOCAL_NETNS=0"
    note = (
        f"a network namespace per node ({netns.SUBNET_PREFIX}.{net.index}.0/24)"
        if net
        else f"loopback ({why})"
    )
    launchers = [
        {"node": i, "pid": p.pid, "rc": None, "address": net.address(i) if net else "127.0.0.1"}
        for i, p in enumerate(procs)
    ]
    return {"network": note, "launchers": launchers}


def _terminate(procs, sig) -> None:
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, sig)  # the launcher and its workers, as a pod's processes
            except ProcessLookupError:
                pass


def _wait_all(procs, stopping, jdir: Path, grace_s: float) -> list[int]:
    sent_at = None
    while any(p.poll() is None for p in procs):
        if stopping["flag"] and sent_at is None:
            _update(jdir, phase="Stopping")
            _terminate(procs, signal.SIGTERM)
            sent_at = time.monotonic()
        if sent_at is not None and time.monotonic() - sent_at > grace_s:
            _terminate(procs, signal.SIGKILL)
        time.sleep(0.2)
    return [p.returncode for p in procs]


if __name__ == "__main__":
    sys.exit(supervise(Path(sys.argv[1])))

"""The pods a rendered PyTorchJob describes, as the local backend launches them: one torchrun
launcher per simulated node with the pod's command, environment and volumes mapped to directories
here."""

from __future__ import annotations

import dataclasses
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fsdpctl import files
from fsdpctl.adapters import etcd as etcd_adapter
from fsdpctl.adapters import netns
from fsdpctl.adapters import rdzv_store as store
from fsdpctl.backends.local import kubelet
from fsdpctl.backends.local.processes import JOB_MARK, POD_MARK, pod_mark
from fsdpctl.backends.local.state import (
    STOP_GRACE_S,
    host_dir,
    job_dir,
    shared_volume_dir,
    temp_dir,
)
from fsdptrain import resume
from fsdptrain.config import TrainConfig

if TYPE_CHECKING:
    from fsdpctl.job.render import Obj

# every environment variable the trainer reads a setting from (MODEL, SEED, ..., CHECKPOINT_DIR,
# METRICS_FILE)
TRAINER_ENV = frozenset(f.metadata["env"] for f in dataclasses.fields(TrainConfig))


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
        for arg in elastic_command(spec)[len(argv) :]:
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
            **mapped_env(spec, node),
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


def elastic(spec: Obj) -> bool:
    """Whether the job trains on through a lost node (MIN_NODES below JOB_NODES)."""
    replicas = int(spec["replicas"])
    return int(spec.get("min_nodes") or replicas) < replicas


def elastic_command(spec: Obj) -> list[str]:
    """The container's command with the elastic range: torchrun's --nnodes=MIN:MAX (what the
    Training Operator's elasticPolicy minReplicas/maxReplicas mean), and with c10d `is_host=false`
    for every node's agent, whose store the supervisor hosts (`rendezvous`)."""
    if not elastic(spec):
        return list(spec["command"])
    out = []
    for arg in spec["command"]:
        if arg.startswith("--nnodes="):
            arg = f"--nnodes={spec['min_nodes']}:{spec['replicas']}"
        elif arg.startswith("--rdzv-conf=") and spec["rdzv_backend"] == "c10d":
            arg = f"{arg},is_host=false"
        out.append(arg)
    return out


def pod_home(spec: dict, node: int) -> str:
    """The home of a pod's user on its node: in the pod's own directory, so fresh with every pod."""
    return str(Path(spec["pod_root"].replace("{node}", str(node))) / "home")


def _interpreter(command: list[str]) -> list[str]:
    """The command's program as this machine runs it: the image's `python -m MODULE` (the pre-launch
    check, fsdptrain.launch) or `torchrun` become this interpreter's."""
    if command[0] == "torchrun":
        return [sys.executable, "-m", "torch.distributed.run"]
    return [sys.executable, *command[1:3]]  # python -m MODULE


def mapped_env(spec: dict, node: int) -> dict[str, str]:
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
    env = mapped_env(spec, 0)
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
        "min_nodes": job["spec"]["elasticPolicy"].get("minReplicas", worker["replicas"]),
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
    """Mount path -> the kind of volume behind it (persistentVolumeClaim, emptyDir, hostPath,
    ...)."""
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    kinds = {}
    for m in container.get("volumeMounts", []):
        v = volumes.get(m["name"], {})
        kinds[m["mountPath"]] = next((k for k in v if k != "name"), "")
    return kinds


def grace_s(job: str) -> float:
    """The pod's terminationGracePeriodSeconds the job was started with."""
    return grace_in(job_dir(job))


def grace_in(jdir: Path) -> float:
    """The pod's grace period from the job's spec (a damaged spec: the default)."""
    try:
        grace = files.read_json(jdir / "spec.json").get("grace_s", STOP_GRACE_S)
    except (OSError, ValueError, AttributeError):
        return STOP_GRACE_S
    ok = isinstance(grace, (int, float)) and not isinstance(grace, bool) and 0 <= grace <= 86_400
    return float(grace) if ok else STOP_GRACE_S


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
    mapped = mapped_env({"env": {**env, "_MARKER": command[at]}, "volumes": volumes}, 0)
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
    mapped = mapped_env({"env": {"_": value}, "volumes": volumes}, 0)["_"]
    return f"{flag}{eq}{mapped}"


def rendezvous(
    spec: dict, jdir: Path, log_dir: Path, net: netns.Network | None
) -> tuple[etcd_adapter.EtcdServer | store.StoreHost | None, str]:
    """(etcd server, store host or None, endpoint). c10d with namespaces: the manifest's own
    `<job>-worker-0:29400`, which each node's hosts file resolves to node 0 as the operator's
    Service does; on loopback a free port. An elastic c10d job: a store the supervisor hosts
    (fsdptrain.rdzv_store), on no node. etcd: a server on the host side of the nodes' bridge (or
    loopback)."""
    host = net.host_address if net else "127.0.0.1"
    if spec["rdzv_backend"] == "c10d" and elastic(spec):
        env = {k: v for k, v in os.environ.items() if k not in TRAINER_ENV}
        hosted = store.start(host, log_file=log_dir / "rdzv-store.log", env=env)
        return hosted, hosted.endpoint
    if spec["rdzv_backend"] == "c10d":
        if net is not None:
            return None, _manifest_endpoint(spec)
        return None, f"127.0.0.1:{etcd_adapter.free_port()}"
    server = etcd_adapter.start(
        jdir / "etcd" / spec["run_id"], log_file=log_dir / "etcd.log", host=host
    )
    return server, server.endpoint


def _manifest_endpoint(spec: dict) -> str:
    return next(a.split("=", 1)[1] for a in spec["command"] if a.startswith("--rdzv-endpoint="))

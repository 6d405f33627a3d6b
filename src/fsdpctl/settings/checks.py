"""Checks across settings (pure): names and labels, the registry, sharding against the world,
storage, TensorBoard and FSx; each problem one line with its fix."""

from __future__ import annotations

from fsdpctl.job.validate import LABEL_MAX, label_value_problem, qualified_name_problem
from fsdpctl.settings import storage
from fsdpctl.settings.config import Config, parse_node_selector, parse_tolerations
from fsdpctl.settings.rules import GATED_PREFIXES
from fsdptrain.config import ConfigError
from fsdptrain.shapes import job_mesh_shape


def _name_problems(cfg: Config) -> list[str]:
    """The names Kubernetes derives from JOB_NAME must stay DNS labels (at most 63 characters): the
    Training Operator names each pod, and the Service in front of it, `<job>-<replica type>-<index>`
    (pkg/core/utils.go GenGeneralName: `<job>-worker-<n-1>` here, every node a Worker); a TrainJob's
    pods get JobSet's hostname `<job>-node-0-<n-1>` (Kubeflow Trainer v2.3.0, see
    render.trainjob_command)."""
    middle = "-worker-" if cfg.job_kind == "pytorchjob" else "-node-0-"
    longest = f"{cfg.job_name}{middle}{cfg.job_nodes - 1}"
    if len(longest) <= LABEL_MAX:
        return []
    room = LABEL_MAX - (len(longest) - len(cfg.job_name))
    return [
        f"JOB_NAME={cfg.job_name!r} is too long for JOB_NODES={cfg.job_nodes}: its last pod and Service "
        f"{longest!r} would have {len(longest)} characters, over the {LABEL_MAX} of a DNS label; use at most "
        f"{room} characters"
    ]


def _label_problems(cfg: Config) -> list[str]:
    """NODE_SELECTOR and TOLERATIONS keys and values as the API server checks labels and taints."""
    errors = []
    pairs = [
        ("NODE_SELECTOR", cfg.node_selector, k, v)
        for k, v in parse_node_selector(cfg.node_selector).items()
    ]
    pairs += [
        ("TOLERATIONS", cfg.tolerations, t["key"], t.get("value", ""))
        for t in parse_tolerations(cfg.tolerations)
    ]
    for setting, text, key, value in pairs:
        problem = qualified_name_problem(key)
        if problem:
            errors.append(
                f"{setting}={text!r}: key {key!r} is not a Kubernetes label key: {problem}"
            )
        problem = label_value_problem(value)
        if problem:
            errors.append(
                f"{setting}={text!r}: value {value!r} is not a Kubernetes label value: {problem}"
            )
    return errors


def _registry_problems(cfg: Config) -> list[str]:
    _, colon, port = cfg.image_registry.rpartition(":")
    if colon and not 1 <= int(port) <= 65535:
        return [
            f"IMAGE_REGISTRY={cfg.image_registry!r} has port {port}: use a TCP port from 1 to 65535"
        ]
    return []


def cross_checks(cfg: Config) -> list[str]:
    errors = [*_name_problems(cfg), *_label_problems(cfg), *_registry_problems(cfg)]
    t = cfg.training
    try:
        job_mesh_shape(
            t.sharding_strategy,
            cfg.world_size,
            hsdp_shard_size=t.hsdp_shard_size,
            procs_per_node=cfg.procs_per_node,
        )
    except ConfigError as e:
        errors.append(
            f"{e} (world = JOB_NODES {cfg.job_nodes} x {cfg.procs_per_node} processes per node)"
        )
    errors.extend(_elastic_checks(cfg))
    errors.extend(_storage_checks(cfg))
    if cfg.job_kind == "trainjob" and cfg.target.kubernetes:
        if cfg.rdzv_backend != "c10d":
            errors.append(
                f"RDZV_BACKEND={cfg.rdzv_backend!r} does not apply to JOB_KIND=trainjob: the Trainer "
                "starts torchrun with a static rendezvous; use RDZV_BACKEND=c10d or JOB_KIND=pytorchjob"
            )
        if cfg.scheduler_name or cfg.gang_scheduling:
            errors.append(
                "SCHEDULER_NAME/GANG_SCHEDULING apply to JOB_KIND=pytorchjob: a TrainJob takes its "
                "scheduling from the runtime (podGroupPolicy of torch-distributed); unset them"
            )
    if t.pretrained.startswith(GATED_PREFIXES) and not (
        cfg.hf_token.get_secret_value() or cfg.hf_token_file
    ):
        errors.append(
            f"HF_TOKEN is missing: PRETRAINED={t.pretrained!r} is gated on the hub; set HF_TOKEN "
            "or HF_TOKEN_FILE (it goes into a Kubernetes Secret, never into a manifest)"
        )
    return errors


# where MIN_NODES below JOB_NODES is carried out; elsewhere it is refused, never ignored
ELASTIC_BACKENDS = frozenset({"local", "eks", "slurm"})


def elastic_refusal(cfg: Config) -> str | None:
    """MIN_NODES below JOB_NODES where the backend would not carry it out (`admit` refuses it for
    the job's place; `plan` speaks of the cluster whatever BACKEND says, so this is not a check of
    the settings themselves)."""
    if cfg.fewest_nodes == cfg.job_nodes:
        return None
    if cfg.backend in ELASTIC_BACKENDS:
        return kube_elastic_refusal(cfg) if cfg.target.kubernetes else None
    return (
        f"MIN_NODES={cfg.min_nodes} with BACKEND={cfg.backend}: the elastic range is carried out on "
        f"{', '.join(sorted(ELASTIC_BACKENDS))} so far; set MIN_NODES=0 (wait for a lost node)"
    )


def kube_elastic_refusal(cfg: Config) -> str | None:
    """A range on Kubernetes needs a PyTorchJob and a rendezvous that outlives every worker.

    TrainJob: Kubeflow Trainer v2.3.0 has no elastic range. Its torch policy holds only
    `envInjection` (trainer.kubeflow.org_trainingruntimes.yaml, mlPolicy.torch; the elasticPolicy
    of the v2 alphas was dropped) and its torch plugin sets PET_NNODES to the TrainJob's numNodes
    (pkg/runtime/framework/plugins/torch/torch.go), a fixed world.

    c10d: the operator points every worker at worker-0 (rdzvHost), and torch hosts the c10d store
    in the agent whose hostname matches the endpoint (c10d_rendezvous_backend.py _create_tcp_store,
    _matches_machine_hostname) with no failover, so losing node 0 loses the rendezvous of the nodes
    that survive. etcd-v2 keeps the rendezvous state in the job namespace's etcd (`fsdpctl deploy
    etcd`, a Deployment on no worker): EtcdRendezvousBackend, with dead nodes dropped by their
    heartbeats (dynamic_rendezvous.py _sanitize), so node 0 is lost like any other."""
    if cfg.job_kind == "trainjob":
        return (
            f"MIN_NODES={cfg.min_nodes} with JOB_KIND=trainjob: Kubeflow Trainer v2.3 has no elastic "
            "range (its torch policy has no elasticPolicy; the Trainer sets PET_NNODES to numNodes); "
            "use JOB_KIND=pytorchjob, or MIN_NODES=0"
        )
    if cfg.rdzv_backend == "c10d":
        return (
            f"MIN_NODES={cfg.min_nodes} with RDZV_BACKEND=c10d on {cfg.backend}: the c10d store lives in "
            "worker-0's torchrun agent, so losing node 0 would lose the rendezvous of the others; "
            "set RDZV_BACKEND=etcd-v2 (the job namespace's etcd outlives every node), or MIN_NODES=0"
        )
    return None


def _elastic_checks(cfg: Config) -> list[str]:
    """An elastic range (MIN_NODES < JOB_NODES) needs a backend that trains on through a lost node,
    and a world at the minimum that the sharding still divides (fsdptrain.shapes, as at the top)."""
    low = cfg.fewest_nodes
    if low == cfg.job_nodes:
        return []
    t = cfg.training
    try:
        job_mesh_shape(
            t.sharding_strategy,
            low * cfg.procs_per_node,
            hsdp_shard_size=t.hsdp_shard_size,
            procs_per_node=cfg.procs_per_node,
        )
    except ConfigError as e:
        return [
            f"MIN_NODES={cfg.min_nodes}: at the minimum {e}; set MIN_NODES to a node count it holds"
        ]
    return []


def _storage_checks(cfg: Config) -> list[str]:
    """Checkpoints of a multi-node job need one filesystem: DCP writes each rank's shards on the
    disk that rank sees and only rank 0 publishes `latest`
    (torch/distributed/checkpoint/filesystem.py), so on pod-local disks the other nodes keep
    orphaned partial saves and would each decide alone where to resume."""
    errors = []
    if cfg.job_nodes > 1 and not cfg.checkpoint_claim:
        errors.append(
            f"JOB_NODES={cfg.job_nodes} with SHARED_VOLUME='' and CHECKPOINT_PVC='': each node would keep "
            "its own part of every checkpoint on its pod-local disk; set SHARED_VOLUME to a claim every node "
            "mounts (default fsx-claim; locally a directory), or CHECKPOINT_PVC"
        )
    reserved = ("/checkpoints", "/dev/shm", "/var/run/secrets")
    path = cfg.shared_volume_path.rstrip("/")
    if cfg.shared_volume and any(
        path == r or path.startswith(r + "/") or r.startswith(path + "/") for r in reserved
    ):
        errors.append(
            f"SHARED_VOLUME_PATH={cfg.shared_volume_path!r} overlaps a path the pod already mounts "
            f"({', '.join(reserved)}): use another path, e.g. /fsx"
        )
    return errors + _fsx_checks(cfg) + _tensorboard_checks(cfg)


def _tensorboard_checks(cfg: Config) -> list[str]:
    """TENSORBOARD_DIR is a path in the pods: absolute, and on the shared volume when there is one,
    where the event files outlive the pods and `fsdpctl job tensorboard` finds them (locally: its
    directory)."""
    value = cfg.training.tensorboard_dir
    shared = cfg.shared_volume_path.rstrip("/")
    if not value:
        return []
    if not value.startswith("/"):
        return [f"TENSORBOARD_DIR={value!r} is not an absolute path: use e.g. {shared}/tensorboard"]
    if cfg.shared_volume and not value.startswith(shared + "/"):
        return [
            f"TENSORBOARD_DIR={value!r} is not on the shared volume (SHARED_VOLUME_PATH={shared}): the event "
            f"files would vanish with each pod; use e.g. {shared}/tensorboard"
        ]
    return []


def _fsx_checks(cfg: Config) -> list[str]:
    """A static FSx PV needs all three of the file system's names (aws-fsx-csi-driver's
    static_provisioning example: volumeHandle, dnsname, mountname) and a claim to bind. PERSISTENT_2
    takes four throughputs (CreateFileSystem LustreConfiguration.PerUnitStorageThroughput)."""
    if cfg.fsx_throughput_per_tib not in storage.FSX_THROUGHPUTS:
        return [
            f"FSX_THROUGHPUT_PER_TIB={cfg.fsx_throughput_per_tib} is not a PERSISTENT_2 throughput: use one "
            f"of {', '.join(map(str, storage.FSX_THROUGHPUTS))} (MB/s per TiB)"
        ]
    if not cfg.fsx_file_system_id:
        return []
    missing = [
        k for k in ("fsx_dns_name", "fsx_mount_name", "shared_volume") if not getattr(cfg, k)
    ]
    if not missing:
        return []
    return [
        f"FSX_FILE_SYSTEM_ID={cfg.fsx_file_system_id} needs {', '.join(m.upper() for m in missing)}: "
        "the PV mounts the file system by its DNSName and LustreConfiguration.MountName "
        "(aws fsx describe-file-systems) and SHARED_VOLUME names the claim bound to it"
    ]

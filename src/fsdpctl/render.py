"""Manifests from templates: Config -> Kubernetes objects (dicts) -> deterministic YAML. Pure apart
from reading the templates that ship with the package."""

from __future__ import annotations

import hashlib
import json
import math
import re
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from fsdpctl import plan, prestep, volume
from fsdpctl.errors import BadInput
from fsdpctl.redact import redact_obj
from fsdpctl.settings import Config, parse_node_selector, parse_tolerations
from fsdpctl.validate import LABEL_MAX
from fsdptrain import disruption
from fsdptrain.shapes import MODEL_CONFIGS

if TYPE_CHECKING:
    import jinja2

    from fsdpctl.jobspec import JobSpec, Resources

Obj = dict[str, Any]  # a Kubernetes object (or any YAML mapping) as parsed

HF_TOKEN_DIR = (
    "/var/run/secrets/fsdpctl/hf-token"  # the Secret as a file: huggingface_hub reads HF_TOKEN_PATH
)
PODINFO_DIR = (
    "/etc/fsdpctl/pod"  # the downward API volume: the pod's annotations, where a stop request shows
)
STOP_ANNOTATION = disruption.STOP_ANNOTATION
ETCD_IMAGE = "quay.io/coreos/etcd:v3.5.21"  # 3.6 dropped the v2 API torch's etcd rendezvous uses
C10D_PORT, ETCD_PORT = 29400, 2379
POD_CHECKPOINT_ROOT = (
    prestep.CHECKPOINT_MOUNT
)  # where every pod mounts the checkpoint volume; jobs write below
DEFAULT_METRICS_PORT = 9101  # beside DCGM's 9400 and node-exporter's 9100

# NCCL over EFA through aws-ofi-nccl; NCCL_DEBUG=INFO makes the chosen transport visible in the
# logs.
EFA_ENV = {"FI_PROVIDER": "efa", "FI_EFA_USE_DEVICE_RDMA": "1", "FI_EFA_FORK_SAFE": "1"}
COMMON_ENV = {
    "NCCL_DEBUG": "INFO",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
    "PYTHONUNBUFFERED": "1",
    # restarts re-rendezvous reliably only without the shared agent store (seen with c10d/etcd-v2)
    "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
    # torchrun's agent logs its rendezvous result (master_addr: the leader) and each restart of its
    # worker group at INFO; its loggers default to WARNING
    # (torch/distributed/elastic/utils/logging.py, LOGLEVEL)
    "LOGLEVEL": "INFO",
}
# What the references set on GPU pods (awsome-distributed-training's FSDP fsdp.yaml-template): the
# caching allocator grows segments instead of fragmenting them, and NCCL's flight recorder keeps the
# last collectives of every rank and writes them out when one times out
# (TORCH_NCCL_DEBUG_INFO_TEMP_FILE + rank): what hung, where. Inert on CPU (gloo).
GPU_ENV = {
    "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
    "TORCH_NCCL_TRACE_BUFFER_SIZE": "20000",
    "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
}
NCCL_TRACE_PREFIX = "nccl_trace_rank_"  # torch's own file name; the rank is appended

# Local NVMe. nodeadm (AL2023) turns the instance store into one RAID0 array when its NodeConfig
# says spec.instance.localStorage.strategy: RAID0, by running setup-local-disks, which mounts the
# array at $MNT_DIR/0 (MNT_DIR=/mnt/k8s-disks) and bind-mounts the kubelet's and containerd's
# directories onto it (amazon-eks-ami: nodeadm/internal/system/local_disk.go,
# templates/al2023/runtime/bin/setup-local-disks). Both tools put this NodeConfig in the GPU nodes'
# user data (eksctl: overrideBootstrapCommand; terraform: modules/eks-gpu/nvme.tf).
NODE_CONFIG_RAID0 = {
    "apiVersion": "node.eks.aws/v1alpha1",
    "kind": "NodeConfig",
    "spec": {"instance": {"localStorage": {"strategy": "RAID0"}}},
}
# The /local scratch: a directory on that array, which job pods mount (hostPath) when there is no
# shared volume. nodeadm mounts the array in its run phase, after cloud-init has run the user data's
# scripts (nodeadm-run.service: After=cloud-final.service), so a script cannot simply mkdir it: the
# script gives the kubelet a drop-in that makes it, world-writable and sticky as /tmp (non-root pods
# write there too), each time the kubelet starts (after the array is mounted); `-`: never a reason
# for the kubelet not to start.
NODE_SCRATCH_DIR = "/mnt/k8s-disks/0/local"
POD_SCRATCH = "/local"
SCRATCH_DROP_IN = "/etc/systemd/system/kubelet.service.d/90-fsdpctl-local.conf"
SCRATCH_SCRIPT = f"""mkdir -p {SCRATCH_DROP_IN.rsplit("/", 1)[0]}
cat > {SCRATCH_DROP_IN} <<'EOF'
[Service]
ExecStartPre=-/usr/bin/install -d -m 1777 {NODE_SCRATCH_DIR}
EOF
systemctl daemon-reload
"""

# The container's command: fsdptrain.launch checks the trainer's settings on the node and exits 2 on
# a bad one before torchrun exists (torchrun would restart any failing worker group, exit code 2
# included), then becomes torchrun (exec: same process, so the kubelet's SIGTERM reaches torchrun).
LAUNCH = ["python", "-m", "fsdptrain.launch"]

# Graceful stop. On SIGTERM torchrun forwards it to the workers and SIGKILLs them
# TORCH_ELASTIC_SHUTDOWN_TIMEOUT seconds later (default 30: torch/distributed/launcher/api.py, run.py
# --shutdown-timeout), whatever the pod's grace period; the trainer needs that long for its step and its stop
# checkpoint, which goes to the volume at the file system's aggregate throughput (fsdpctl.volume).
CHECKPOINT_BYTES_PER_PARAM = volume.CHECKPOINT_BYTES_PER_PARAM
TORCH_SHUTDOWN_DEFAULT_S = (
    30  # kept on top of the estimate: process-group teardown, the final event lines
)
AGENT_EXIT_S = 30  # torchrun's own exit after its workers', before the kubelet's SIGKILL


def data_dir(name: str) -> Path:
    """Inside a wheel: fsdpctl/<name>; in a checkout: the repository's <name>/ (templates, eksctl)."""
    here = Path(__file__).resolve().parent
    for candidate in (here / name, here.parents[1] / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"fsdpctl's {name}/ not found: reinstall fsdpctl")


@lru_cache(maxsize=1)
def _env() -> jinja2.Environment:
    import jinja2

    loader = jinja2.FileSystemLoader([str(data_dir("templates")), str(data_dir("eksctl"))])
    return jinja2.Environment(
        loader=loader,
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
    )


def render_template(template: str, **values: Any) -> list[Obj]:
    text = _env().get_template(template).render(**values)
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return [doc for doc in yaml.load_all(text, Loader=loader) if doc]


def new_run_id(job_name: str) -> str:
    """A fresh rendezvous id per run: no run ever meets a finished run's closed rendezvous."""
    return f"{job_name[:40]}-{int(time.time()):x}-{secrets.token_hex(3)}"


def stable_run_id(cfg: Config) -> str:
    """For `manifest` without --run-id: same settings, same output (a new id whenever settings
    change)."""
    digest = hashlib.sha256(
        json.dumps(cfg.train_env(), sort_keys=True).encode()
        + cfg.settings.model_dump_json(exclude={"hf_token"}).encode()
    ).hexdigest()
    return f"{cfg.job_name[:40]}-{digest[:10]}"


def label_value(text: str) -> str:
    """At most 63 characters that still end in a letter or digit, as a label value (and a DNS label)
    must (apimachinery pkg/util/validation IsValidLabelValue): a bare [:63] of a 64-128 character
    run id could end in '-', '_' or '.', and the API server would refuse the whole object."""
    return text[:LABEL_MAX].rstrip("-_.")


def labels(cfg: Config, run_id: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "fsdpctl-job",
        "app.kubernetes.io/managed-by": "fsdpctl",
        "fsdpctl.io/job": cfg.job_name,
        "fsdpctl.io/run-id": label_value(run_id),
    }


def secret_name(cfg: Config) -> str:
    return f"{cfg.job_name}-hf-token"


def rendezvous(cfg: Config) -> tuple[str, str, int]:
    """(torchrun backend, host, port). c10d is hosted by the first worker pod's service."""
    if cfg.rdzv_backend == "c10d":
        return "c10d", f"{cfg.job_name}-worker-0", C10D_PORT
    return cfg.rdzv_backend, "etcd", ETCD_PORT


def rendezvous_keys(backend: str, run_id: str) -> list[str]:
    """The etcd (v2 API) keys torchrun's rendezvous leaves for a run: `etcd` keeps run_<id> under
    /torchelastic/p2p, `etcd-v2` keeps /torch/elastic/rendezvous/<id>. c10d keeps nothing in etcd.
    """
    if not run_id:
        return []
    return {
        "etcd": [f"/torchelastic/p2p/run_{run_id}"],
        "etcd-v2": [f"/torch/elastic/rendezvous/{run_id}"],
    }.get(backend, [])


def checkpoint_root(cfg: Config) -> str:
    """Where the pod keeps checkpoints: the checkpoint volume (CHECKPOINT_PVC, or pod-local without
    any shared storage), else the shared volume's checkpoints/ directory."""
    if cfg.checkpoint_pvc or not cfg.shared_volume:
        return POD_CHECKPOINT_ROOT
    return f"{cfg.shared_volume_path.rstrip('/')}/checkpoints"


def checkpoint_dir(cfg: Config, job_name: str) -> str:
    """The job's checkpoints, or a run's own below them (CHECKPOINT_SUBDIR: a rerun's, so that it
    neither resumes nor overwrites the job's)."""
    sub = f"/{cfg.checkpoint_subdir}" if cfg.checkpoint_subdir else ""
    return f"{checkpoint_root(cfg)}/{job_name}{sub}"


def tensorboard_dir(cfg: Config, job_name: str) -> str | None:
    """TENSORBOARD_DIR as the pods get it: the user's directory (on the shared volume: settings
    check it) plus the job's name, so `fsdpctl job tensorboard NAME` shows this job's runs (the
    trainer adds the run id); None when TensorBoard is off."""
    root = cfg.training.tensorboard_dir.rstrip("/")
    return f"{root}/{job_name}" if root else None


def wandb_dir(cfg: Config, job_name: str) -> str | None:
    """WANDB_DIR for a job with WANDB_PROJECT: on the shared volume, where an offline run's files
    outlive the pod (`wandb sync` reads them there); None without one (W&B's default, the working
    directory)."""
    if not cfg.training.wandb_project or not cfg.shared_volume:
        return None
    return f"{cfg.shared_volume_path.rstrip('/')}/wandb/{job_name}"


def nccl_trace_file(cfg: Config, job_name: str) -> str:
    """TORCH_NCCL_DEBUG_INFO_TEMP_FILE: the flight recorder writes `<this><rank>` per rank. On the
    shared volume, where one directory holds every node's; without one, on each node's /local
    scratch. Either way the dumps outlive the pod that wrote them."""
    root = cfg.shared_volume_path.rstrip("/") if cfg.shared_volume else POD_SCRATCH
    return f"{root}/nccl-traces/{job_name}/{NCCL_TRACE_PREFIX}"


def scratch(cfg: Config) -> dict[str, str] | None:
    """The node's /local scratch the pods mount (hostPath: the node's own RAID0, kept across pods
    and jobs): only without a shared volume, which holds the traces and the HF cache otherwise."""
    if cfg.shared_volume:
        return None
    return {"path": NODE_SCRATCH_DIR, "mount": POD_SCRATCH}


@dataclass(frozen=True)
class StopTiming:
    """How long a graceful stop takes: the step in flight plus the stop checkpoint (`expected_s`,
    estimated), torchrun's TORCH_ELASTIC_SHUTDOWN_TIMEOUT (`shutdown_s`) and the pod's
    terminationGracePeriodSeconds (`grace_s`), each longer than the one before."""

    expected_s: float
    shutdown_s: int
    grace_s: int


def checkpoint_bytes_per_node(cfg: Config) -> int:
    """What one node writes per checkpoint for the named MODEL. DCP writes each replicated shard
    once (torch/distributed/checkpoint/_dedup_save_plans.py), so whatever the strategy a save is 12
    bytes per parameter for the whole job, spread over its nodes."""
    params = MODEL_CONFIGS[cfg.training.model].num_params()
    return math.ceil(CHECKPOINT_BYTES_PER_PARAM * params / cfg.job_nodes)


def step_seconds(cfg: Config) -> float:
    """The planner's step time on GPUs; 0 for CPU processes, where a CPU step is not the question."""
    if not cfg.target.gpus:
        return 0.0
    return plan.speed(plan.job_from(cfg, mfu=0.0, price=None)).step_s


def stop_timing(cfg: Config) -> StopTiming:
    """STOP_GRACE_SECONDS, else twice the expected step + save time on top of torch's 30 s; the
    pod's grace outlasts it by AGENT_EXIT_S so torchrun, not the kubelet, ends the workers. The save
    is the whole checkpoint over the volume's aggregate throughput (volume.save_seconds): every node
    writes at once through the same file servers, so more nodes do not make it faster."""
    expected = step_seconds(cfg) + volume.save_seconds(cfg)
    shutdown = cfg.stop_grace_seconds or TORCH_SHUTDOWN_DEFAULT_S + math.ceil(2 * expected)
    return StopTiming(expected, shutdown, shutdown + AGENT_EXIT_S)


def rdzv_conf(cfg: Config) -> list[tuple[str, str]]:
    """torchrun's --rdzv-conf. c10d and etcd-v2 (dynamic rendezvous) read `join_timeout`; the legacy
    `etcd` handler reads `timeout` instead (torch/distributed/elastic/rendezvous/etcd_rendezvous.py,
    create_rdzv_handler), which torchrun otherwise sets to 900 (launcher/api.py), so it gets both.

    c10d also gets `read_timeout`, as long as the join timeout. A node's agent that does not host
    the store connects to it as a TCPStore client that retries only for `read_timeout` (default 60
    s: torch c10d_rendezvous_backend.py, _create_tcp_store), and `join_timeout` does not cover that
    wait: a node that starts more than a minute before the one hosting the store (worker 0, or node
    0 of a TrainJob) exited 1, which the operator takes as permanent. Nodes start minutes apart on a
    real cluster: pulling a ~20 GB CUDA image onto a fresh p5, a node still joining the node group,
    the FSx mount. With both at RDZV_JOIN_TIMEOUT (600 s unless set) one number bounds the start
    skew a job tolerates, whichever node is late. It also bounds a store operation against a store
    host that hangs without closing its socket (one that dies closes it, and the client fails at
    once), which is no worse: the join would time out then too."""
    conf = [("join_timeout", str(cfg.rdzv_join_timeout))]
    if cfg.rdzv_backend == "c10d":
        conf.append(("read_timeout", str(cfg.rdzv_join_timeout)))
    if cfg.rdzv_backend == "etcd":
        conf.append(("timeout", str(cfg.rdzv_join_timeout)))
    return conf


def backoff_limit(cfg: Config) -> int:
    """runPolicy.backoffLimit. The operator compares it with the SUM of container restarts over the
    job's running pods (Training Operator v1.9.4 pkg/core/job.go, PastBackoffLimit), so one
    coordinated restart of every pod costs JOB_NODES: MAX_RESTARTS job-level restarts cost
    MAX_RESTARTS x JOB_NODES. Under restartPolicy ExitCode pods never restart in place (the operator
    recreates them), and 0 makes the first failed pod fail the job (pkg/controller.v1/common/job.go:
    exceedsBackoffLimit)."""
    return cfg.max_restarts * cfg.job_nodes


def render_checkpoint_cleaner(cfg: Config, job_name: str) -> Obj:
    """A one-shot pod that removes one job's checkpoint directory from the claim holding
    checkpoints."""
    return render_template(
        "checkpoint-cleaner.yaml.j2",
        name=label_value(f"fsdpctl-clean-{job_name}"),
        namespace=cfg.job_namespace,
        pvc=cfg.checkpoint_claim,
        image=cfg.image_uri,
        checkpoint_root=POD_CHECKPOINT_ROOT if cfg.checkpoint_pvc else cfg.shared_volume_path,
        path=checkpoint_dir(cfg, job_name),
    )[0]


def _conf_arg(cfg: Config) -> str:
    return "--rdzv-conf=" + ",".join(f"{k}={v}" for k, v in rdzv_conf(cfg))


def launch_command(cfg: Config, run_id: str) -> list[str]:
    """The PyTorchJob's container command: the pre-launch check, then torchrun with an elastic
    rendezvous in which every node's agent restarts the whole worker group after a failure
    (MAX_RESTARTS times)."""
    backend, host, port = rendezvous(cfg)
    return [
        *LAUNCH,
        f"--nnodes={cfg.job_nodes}",
        f"--nproc-per-node={cfg.procs_per_node}",
        f"--rdzv-backend={backend}",
        f"--rdzv-endpoint={host}:{port}",
        f"--rdzv-id={run_id}",
        _conf_arg(cfg),
        f"--max-restarts={cfg.max_restarts}",
        "-m",
        "fsdptrain",
    ]


def trainjob_command(cfg: Config, run_id: str) -> list[str]:
    """The TrainJob's. The Trainer sets PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK and
    PET_MASTER_ADDR/PORT (node 0's pod, `<job>-node-0-0.<job>:29500`; Trainer v2.3.0
    pkg/runtime/framework/plugins/torch/torch.go) for a static rendezvous, under which a torchrun
    restart stays on its node while the others wait out the collective timeout. A c10d rendezvous on
    that endpoint (the kubelet expands $(VAR) from the container's env) lets every node's agent
    restart the whole group; node 0's agent hosts it (torch's _matches_machine_hostname finds the
    endpoint's address among its own)."""
    return [
        *LAUNCH,
        "--rdzv-backend=c10d",
        "--rdzv-endpoint=$(PET_MASTER_ADDR):$(PET_MASTER_PORT)",
        f"--rdzv-id={run_id}",
        _conf_arg(cfg),
        f"--max-restarts={cfg.max_restarts}",
        "-m",
        "fsdptrain",
    ]


def metrics_port(cfg: Config) -> int:
    """On a cluster the trainer always serves /metrics for Prometheus (METRICS_PORT, else 9101);
    locally only when asked."""
    return cfg.training.metrics_port or (DEFAULT_METRICS_PORT if cfg.target.kubernetes else 0)


def pod_annotations(port: int) -> dict[str, str]:
    return {"prometheus.io/scrape": "true", "prometheus.io/port": str(port)} if port else {}


def pod_env(cfg: Config) -> dict[str, str]:
    env = dict(cfg.train_env())
    env["CHECKPOINT_DIR"] = checkpoint_dir(cfg, cfg.job_name)
    if tb := tensorboard_dir(cfg, cfg.job_name):
        env["TENSORBOARD_DIR"] = tb
    if wdir := wandb_dir(cfg, cfg.job_name):
        env["WANDB_DIR"] = wdir
    # with a shared volume one download of models and tokenizers per job; else one per node, kept on
    # its /local scratch for the next job
    env["HF_HOME"] = prestep.hf_home(cfg) if cfg.shared_volume else f"{POD_SCRATCH}/hf-cache"
    if metrics_port(cfg):
        env["METRICS_PORT"] = str(metrics_port(cfg))
    env.update(COMMON_ENV)
    env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] = str(stop_timing(cfg).shutdown_s)
    env.update(GPU_ENV)
    env["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] = nccl_trace_file(cfg, cfg.job_name)
    if cfg.uses_efa:
        env.update(EFA_ENV)
    env[disruption.STOP_FILE_ENV] = f"{PODINFO_DIR}/annotations"
    return env


def starts_env(cfg: Config, run_id: str) -> dict[str, str]:
    """The run's torchrun start budget (fsdptrain.disruption.record_start): the ledger beside the
    job's checkpoints (a claim every pod mounts, when there is one) and JOB_NODES first starts plus
    MAX_RESTARTS restarts of every node, the same count as runPolicy.backoffLimit, which under
    ExitCode never trips."""
    return {
        disruption.STARTS_DIR_ENV: f"{checkpoint_dir(cfg, cfg.job_name)}/.fsdpctl/starts/{run_id}",
        disruption.STARTS_MAX_ENV: str(cfg.job_nodes + backoff_limit(cfg)),
    }


def container_env(cfg: Config) -> list[dict[str, str]]:
    """The container's env list: `pod_env`, then where huggingface_hub finds the token Secret's
    file."""
    return _container_env(pod_env(cfg))


def _container_env(env: Mapping[str, str]) -> list[dict[str, str]]:
    listed = [{"name": name, "value": value} for name, value in env.items()]
    return [*listed, {"name": "HF_TOKEN_PATH", "value": f"{HF_TOKEN_DIR}/HF_TOKEN"}]


def pod_resources(res: Resources) -> tuple[dict[str, str | int], dict[str, str | int]]:
    """(requests, limits) of the pod, from the spec's `Resources`."""
    if res.cpu_limit:
        both: dict[str, str | int] = {"cpu": str(res.cpus), "memory": f"{res.memory_gib}Gi"}
        return both, both
    limits: dict[str, str | int] = {"nvidia.com/gpu": res.gpus, "memory": f"{res.memory_gib}Gi"}
    if res.efa:
        limits["vpc.amazonaws.com/efa"] = res.efa
    if (
        res.hugepages_2mi
    ):  # only where nodes pre-allocate them: a request no node offers stays Pending
        limits["hugepages-2Mi"] = res.hugepages_2mi
    return {**limits, "cpu": str(res.cpus)}, limits


def node_selector(cfg: Config) -> dict[str, str]:
    if not cfg.target.gpus:
        return {}
    return {
        "node.kubernetes.io/instance-type": cfg.instance_type,
        **parse_node_selector(cfg.node_selector),
    }


def tolerations(cfg: Config) -> list[dict[str, str]]:
    if not cfg.target.gpus:
        return []
    return [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        *parse_tolerations(cfg.tolerations),
    ]


def job_values(spec: JobSpec, cfg: Config) -> dict[str, Any]:
    """What pytorchjob.yaml.j2, trainjob.yaml.j2 and their shared pod.j2 read: the spec, and from
    `cfg` only what is Kubernetes' own (namespace, scheduler, node selector, tolerations)."""
    rdzv, st = spec.rendezvous, spec.storage
    env = _container_env(spec.env)
    return dict(
        job_name=spec.name,
        namespace=cfg.job_namespace,
        labels=dict(spec.labels),
        nproc_per_node=spec.procs_per_node,
        nodes=spec.nodes,
        rdzv_backend=rdzv.backend,
        rdzv_host=rdzv.host,
        rdzv_port=rdzv.port,
        rdzv_id=spec.run_id,
        rdzv_conf=list(rdzv.conf),
        max_restarts=spec.restart.max_restarts,
        backoff_limit=spec.restart.backoff_limit,
        grace_s=spec.stop.grace_s,
        image=spec.image,
        command=list(spec.command),
        env=env + [{"name": k, "value": v} for k, v in spec.run_env.items()],
        podinfo_dir=PODINFO_DIR,
        resources=pod_resources(spec.resources),
        hf_token_dir=HF_TOKEN_DIR,
        checkpoint_root=POD_CHECKPOINT_ROOT,
        efa=spec.resources.efa > 0,
        node_selector=node_selector(cfg),
        tolerations=tolerations(cfg),
        scheduler_name=cfg.scheduler_name,
        annotations=pod_annotations(spec.metrics_port),
        gang=cfg.gang_scheduling,
        shm_size=f"{spec.resources.shm_gib}Gi",
        checkpoint_pvc=st.checkpoint_claim,
        shared_volume=st.shared,
        shared_volume_path=st.shared_path,
        scratch={"path": st.scratch[0], "mount": st.scratch[1]} if st.scratch else None,
        secret_name=secret_name(cfg),
    )


JOB_KINDS = {
    "pytorchjob": ("kubeflow.org/v1", "PyTorchJob"),
    "trainjob": ("trainer.kubeflow.org/v1alpha1", "TrainJob"),
}


def job_api(cfg: Config) -> tuple[str, str]:
    """(apiVersion, kind) of the job object. Off Kubernetes (the local backend) always the
    PyTorchJob form."""
    return JOB_KINDS[cfg.job_kind if cfg.target.kubernetes else "pytorchjob"]


def render_job(cfg: Config, run_id: str, record_id: str = "") -> list[Obj]:
    """Namespace, etcd (with an etcd rendezvous), the pre-step, the PodDisruptionBudget and the job:
    everything but the Secret. The job comes last. `record_id`: the run record's (fsdpctl.record),
    which the trainer echoes into its summary and checkpoints."""
    from fsdpctl import jobspec

    values = job_values(jobspec.build(cfg, run_id, record_id), cfg)
    objs = render_namespace(cfg)
    if cfg.rdzv_backend != "c10d":
        objs += render_etcd(cfg)
    objs += render_fetch_job(cfg, run_id)
    objs += render_pdb(cfg, run_id)
    if job_api(cfg)[1] == "TrainJob":
        values["command"] = trainjob_command(cfg, run_id)
        objs += render_template("trainjob.yaml.j2", **values)
    else:
        objs += render_template("pytorchjob.yaml.j2", **values)
    # a token pasted into a key that is not secret (TOKENIZER, IMAGE_TAG) is masked here, once, for
    # every path the objects take: printed, written, applied, or run by the local backend (settings
    # warned)
    return [redact_obj(o) for o in objs]


def prep_dirs(cfg: Config, job_name: str, run_id: str) -> tuple[list[str], list[str]]:
    """(mount points, directories) the pre-step's volume-prep makes ready for the trainer's uid:
    every claim's root, and each directory of the job there: its checkpoints, the HF cache and the
    pre-step's marker, the flight recorder's dumps, TensorBoard's and W&B's files, EXPORT_DIR's
    parent (the export is written beside it, then renamed)."""
    shares = [
        p
        for p, on in (
            (cfg.shared_volume_path, cfg.shared_volume),
            (POD_CHECKPOINT_ROOT, cfg.checkpoint_pvc),
        )
        if on
    ]
    dirs = [
        checkpoint_root(cfg),
        checkpoint_dir(cfg, job_name),
        prestep.marker(cfg, run_id).rsplit("/", 1)[0],
    ]
    if cfg.shared_volume:
        dirs += [prestep.hf_home(cfg), nccl_trace_file(cfg, job_name).rsplit("/", 1)[0]]
    dirs += [d for d in (tensorboard_dir(cfg, job_name), wandb_dir(cfg, job_name)) if d]
    export = cfg.training.export_dir.rstrip("/")
    if export and any(export.startswith(s.rstrip("/") + "/") for s in shares):
        dirs.append(export.rsplit("/", 1)[0])
    mounted = [
        d for d in dict.fromkeys(dirs) if any(d.startswith(s.rstrip("/") + "/") for s in shares)
    ]
    return shares, sorted(mounted)


def render_fetch_job(cfg: Config, run_id: str) -> list[Obj]:
    """The pre-step (fsdpctl.prestep): a one-shot Job that prepares the job's claims (root, nothing
    else) and downloads its hub repos onto the shared volume once; none when the pods mount no
    claim."""
    if not prestep.needed(cfg):
        return []
    shares, dirs = prep_dirs(cfg, cfg.job_name, run_id)
    env = [{"name": k, "value": v} for k, v in prestep.fetch_env(cfg).items()]
    return render_template(
        "fetch-job.yaml.j2",
        name=prestep.job_name(cfg.job_name),
        namespace=cfg.job_namespace,
        # not fsdpctl.io/job: the job's pods are listed by that label, and this pod is not one of
        # its nodes
        labels={
            "app.kubernetes.io/name": "fsdpctl-fetch",
            "app.kubernetes.io/managed-by": "fsdpctl",
            prestep.OF_LABEL: cfg.job_name,
            "fsdpctl.io/run-id": label_value(run_id),
        },
        image=cfg.image_uri,
        command=prestep.fetch_command(cfg, run_id),
        container=prestep.CONTAINER,
        prep_container=prestep.PREP_CONTAINER,
        prep_command=prestep.prep_command(shares, dirs),
        deadline_s=cfg.prestep_timeout,
        env=[*env, {"name": "HF_TOKEN_PATH", "value": f"{HF_TOKEN_DIR}/HF_TOKEN"}],
        hf_token_dir=HF_TOKEN_DIR,
        secret_name=secret_name(cfg),
        shared_volume=cfg.shared_volume,
        shared_volume_path=cfg.shared_volume_path,
        checkpoint_pvc=cfg.checkpoint_pvc,
        checkpoint_root=POD_CHECKPOINT_ROOT,
    )


def render_pdb(cfg: Config, run_id: str) -> list[Obj]:
    """The PodDisruptionBudget of the job's pods (templates/pdb.yaml.j2): one voluntary eviction at
    a time."""
    selector = {"fsdpctl.io/job": cfg.job_name, "fsdpctl.io/run-id": label_value(run_id)}
    return render_template(
        "pdb.yaml.j2",
        job_name=cfg.job_name,
        namespace=cfg.job_namespace,
        labels=labels(cfg, run_id),
        min_available=max(0, cfg.job_nodes - 1),
        selector=selector,
    )


def render_namespace(cfg: Config) -> list[Obj]:
    return render_template(
        "namespace.yaml.j2",
        namespace=cfg.job_namespace,
        labels={"app.kubernetes.io/managed-by": "fsdpctl"},
    )


def render_etcd(cfg: Config) -> list[Obj]:
    etcd_labels = {"app.kubernetes.io/name": "etcd", "app.kubernetes.io/managed-by": "fsdpctl"}
    return render_template(
        "etcd.yaml.j2",
        namespace=cfg.job_namespace,
        etcd_labels=etcd_labels,
        etcd_image=ETCD_IMAGE,
        node_selector_system={},
    )


def render_secret(cfg: Config, token: str, run_id: str) -> Obj:
    """Only for the API call that creates it; never printed or written by `fsdpctl manifest`."""
    return render_template(
        "secret.yaml.j2",
        secret_name=secret_name(cfg),
        namespace=cfg.job_namespace,
        labels=labels(cfg, run_id),
        hf_token=token,
    )[0]


def render_clusterconfig(cfg: Config) -> Obj:
    """The eksctl ClusterConfig for the cluster the settings describe. An existing VPC's subnets are
    keyed by their AZs (eksctl's vpc.subnets.private.<az>.id), which AVAILABILITY_ZONES names in the
    same order (`cluster create` reads them from EC2 when it is empty)."""
    zones = [z for z in cfg.availability_zones.split(",") if z]
    if cfg.subnet_ids and not zones:
        raise BadInput(
            f"PRIVATE_SUBNET_IDS={cfg.private_subnet_ids}: eksctl keys subnets by AZ, and AVAILABILITY_ZONES "
            "is empty",
            hint="set AVAILABILITY_ZONES to each subnet's AZ in the same order, or run `fsdpctl cluster "
            "create`, which reads them from EC2",
        )
    return render_template(
        "clusterconfig.yaml.j2",
        cluster_name=cfg.cluster_name,
        region=cfg.aws_region,
        kubernetes_version=cfg.kubernetes_version,
        zones=zones,
        system_instance_type=cfg.system_instance_type,
        instance_type=cfg.instance_type,
        gpu_group=f"gpu-{cfg.instance_type.split('.')[0]}",
        node_count=cfg.node_count,
        efa=cfg.efa_enabled,
        capacity_reservation_id=cfg.capacity_reservation_id,
        capacity_block=bool(cfg.capacity_reservation_id)
        and cfg.capacity_reservation_type == "capacity-block",
        vpc_id=cfg.vpc_id,
        private_subnets=dict(zip(zones, cfg.subnet_ids, strict=True)) if cfg.subnet_ids else {},
        node_config=yaml.safe_dump(NODE_CONFIG_RAID0, sort_keys=False),
        scratch_script=SCRATCH_SCRIPT,
    )[0]


def terraform_vars(cfg: Config) -> dict[str, Any]:
    """fsdpctl.auto.tfvars.json for terraform/: the same settings, the module's variable names. The
    EFA interface count comes from instances.py: terraform/ keeps no table of its own."""
    zones = [z for z in cfg.availability_zones.split(",") if z] or [
        f"{cfg.aws_region}a",
        f"{cfg.aws_region}b",
    ]
    return {
        "region": cfg.aws_region,
        "cluster_name": cfg.cluster_name,
        "kubernetes_version": cfg.kubernetes_version,
        "availability_zones": zones,
        "vpc_id": cfg.vpc_id,
        "private_subnet_ids": cfg.subnet_ids,
        "instance_type": cfg.instance_type,
        "node_count": cfg.node_count,
        "capacity_reservation_id": cfg.capacity_reservation_id,
        "capacity_reservation_type": cfg.capacity_reservation_type,
        "efa_enabled": cfg.efa_enabled,
        "efa_interfaces": cfg.instance.efa_interfaces,
        "system_instance_type": cfg.system_instance_type,
        "fsx_storage_gib": cfg.fsx_storage_gib if cfg.fsx_create else 0,
        "fsx_throughput": cfg.fsx_throughput_per_tib,
    }


def to_yaml(objs: list[Obj]) -> str:
    dumper = getattr(
        yaml, "CSafeDumper", yaml.SafeDumper
    )  # libyaml when present: same output, faster
    return yaml.dump_all(
        redact_obj(objs), Dumper=dumper, sort_keys=False, default_flow_style=False, width=120
    )


def file_name(obj: Obj) -> str:
    return re.sub(r"[^a-z0-9.-]", "-", f"{obj['kind'].lower()}-{obj['metadata']['name']}.yaml")

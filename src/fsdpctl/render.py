"""Manifests from templates: Config -> Kubernetes objects (dicts) -> deterministic YAML. Pure apart from
reading the templates that ship with the package."""

from __future__ import annotations

import hashlib
import json
import re
import secrets
import time
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from fsdpctl.settings import Config, parse_node_selector, parse_tolerations

if TYPE_CHECKING:
    import jinja2

Obj = dict[str, Any]  # a Kubernetes object (or any YAML mapping) as parsed

HF_TOKEN_DIR = (
    "/var/run/secrets/fsdpctl/hf-token"  # the Secret as a file: huggingface_hub reads HF_TOKEN_PATH
)
ETCD_IMAGE = "quay.io/coreos/etcd:v3.5.21"  # 3.6 dropped the v2 API torch's etcd rendezvous uses
C10D_PORT, ETCD_PORT = 29400, 2379
POD_CHECKPOINT_ROOT = "/checkpoints"  # where every pod mounts the checkpoint volume; jobs write below it
DEFAULT_METRICS_PORT = 9101  # beside DCGM's 9400 and node-exporter's 9100

# NCCL over EFA through aws-ofi-nccl; NCCL_DEBUG=INFO makes the chosen transport visible in the logs.
EFA_ENV = {"FI_PROVIDER": "efa", "FI_EFA_USE_DEVICE_RDMA": "1", "FI_EFA_FORK_SAFE": "1"}
COMMON_ENV = {
    "NCCL_DEBUG": "INFO",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
    "PYTHONUNBUFFERED": "1",
    # restarts re-rendezvous reliably only without the shared agent store (seen with c10d/etcd-v2)
    "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
}


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
        loader=loader, undefined=jinja2.StrictUndefined, keep_trailing_newline=True, autoescape=False
    )


def render_template(template: str, **values: Any) -> list[Obj]:
    text = _env().get_template(template).render(**values)
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return [doc for doc in yaml.load_all(text, Loader=loader) if doc]


def new_run_id(job_name: str) -> str:
    """A fresh rendezvous id per run: no run ever meets a finished run's closed rendezvous."""
    return f"{job_name[:40]}-{int(time.time()):x}-{secrets.token_hex(3)}"


def stable_run_id(cfg: Config) -> str:
    """For `manifest` without --run-id: same settings, same output (a new id whenever settings change)."""
    digest = hashlib.sha256(
        json.dumps(cfg.train_env(), sort_keys=True).encode()
        + cfg.settings.model_dump_json(exclude={"hf_token"}).encode()
    ).hexdigest()
    return f"{cfg.job_name[:40]}-{digest[:10]}"


def labels(cfg: Config, run_id: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "fsdpctl-job",
        "app.kubernetes.io/managed-by": "fsdpctl",
        "fsdpctl.io/job": cfg.job_name,
        "fsdpctl.io/run-id": run_id[:63],
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
    /torchelastic/p2p, `etcd-v2` keeps /torch/elastic/rendezvous/<id>. c10d keeps nothing in etcd."""
    if not run_id:
        return []
    return {
        "etcd": [f"/torchelastic/p2p/run_{run_id}"],
        "etcd-v2": [f"/torch/elastic/rendezvous/{run_id}"],
    }.get(backend, [])


def checkpoint_root(cfg: Config) -> str:
    """Where the pod keeps checkpoints: the checkpoint volume (CHECKPOINT_PVC, or pod-local without any
    shared storage), else the shared volume's checkpoints/ directory."""
    if cfg.checkpoint_pvc or not cfg.shared_volume:
        return POD_CHECKPOINT_ROOT
    return f"{cfg.shared_volume_path.rstrip('/')}/checkpoints"


def checkpoint_dir(cfg: Config, job_name: str) -> str:
    return f"{checkpoint_root(cfg)}/{job_name}"


def render_checkpoint_cleaner(cfg: Config, job_name: str) -> Obj:
    """A one-shot pod that removes one job's checkpoint directory from the claim holding checkpoints."""
    return render_template(
        "checkpoint-cleaner.yaml.j2",
        name=f"fsdpctl-clean-{job_name}"[:63],
        namespace=cfg.job_namespace,
        pvc=cfg.checkpoint_claim,
        image=cfg.image_uri,
        checkpoint_root=POD_CHECKPOINT_ROOT if cfg.checkpoint_pvc else cfg.shared_volume_path,
        path=checkpoint_dir(cfg, job_name),
    )[0]


def launch_command(cfg: Config, run_id: str) -> list[str]:
    backend, host, port = rendezvous(cfg)
    return [
        "torchrun",
        f"--nnodes={cfg.job_nodes}",
        f"--nproc-per-node={cfg.procs_per_node}",
        f"--rdzv-backend={backend}",
        f"--rdzv-endpoint={host}:{port}",
        f"--rdzv-id={run_id}",
        f"--rdzv-conf=join_timeout={cfg.rdzv_join_timeout}",
        f"--max-restarts={cfg.max_restarts}",
        "-m",
        "fsdptrain",
    ]


def metrics_port(cfg: Config) -> int:
    """On a cluster the trainer always serves /metrics for Prometheus (METRICS_PORT, else 9101); locally only
    when asked."""
    return cfg.training.metrics_port or (DEFAULT_METRICS_PORT if cfg.backend == "eks" else 0)


def pod_annotations(cfg: Config) -> dict[str, str]:
    port = metrics_port(cfg)
    return {"prometheus.io/scrape": "true", "prometheus.io/port": str(port)} if port else {}


def pod_env(cfg: Config) -> dict[str, str]:
    env = dict(cfg.train_env())
    env["CHECKPOINT_DIR"] = checkpoint_dir(cfg, cfg.job_name)
    if cfg.shared_volume:  # one download of models and tokenizers per job, not one per node
        env["HF_HOME"] = f"{cfg.shared_volume_path.rstrip('/')}/hf-cache"
    if metrics_port(cfg):
        env["METRICS_PORT"] = str(metrics_port(cfg))
    env.update(COMMON_ENV)
    if cfg.uses_efa:
        env.update(EFA_ENV)
    return env


def container_env(cfg: Config) -> list[dict[str, str]]:
    """The container's env list: `pod_env`, then where huggingface_hub finds the token Secret's file."""
    env = [{"name": name, "value": value} for name, value in pod_env(cfg).items()]
    return [*env, {"name": "HF_TOKEN_PATH", "value": f"{HF_TOKEN_DIR}/HF_TOKEN"}]


def pod_resources(cfg: Config) -> tuple[dict[str, str | int], dict[str, str | int]]:
    """(requests, limits). GPU pods request most of the node's CPUs but set no CPU limit: CFS throttling of
    the data-loading threads would stall the GPUs."""
    if cfg.backend == "local":
        res: dict[str, str | int] = {"cpu": str(cfg.procs_per_node), "memory": "4Gi"}
        return res, res
    inst = cfg.instance
    limits: dict[str, str | int] = {"nvidia.com/gpu": cfg.gpus, "memory": f"{int(inst.memory_gib * 0.8)}Gi"}
    if cfg.uses_efa:
        limits["vpc.amazonaws.com/efa"] = cfg.efa_per_node
        limits["hugepages-2Mi"] = "5120Mi"  # what AWS's EFA NCCL manifests request
    return {**limits, "cpu": str(int(inst.vcpus * 0.9 * cfg.gpus / inst.gpus))}, limits


def node_selector(cfg: Config) -> dict[str, str]:
    if cfg.backend != "eks":
        return {}
    return {"node.kubernetes.io/instance-type": cfg.instance_type, **parse_node_selector(cfg.node_selector)}


def tolerations(cfg: Config) -> list[dict[str, str]]:
    if cfg.backend != "eks":
        return []
    return [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        *parse_tolerations(cfg.tolerations),
    ]


def job_values(cfg: Config, run_id: str) -> dict[str, Any]:
    """What pytorchjob.yaml.j2, trainjob.yaml.j2 and their shared pod.j2 read."""
    backend, host, port = rendezvous(cfg)
    return dict(
        job_name=cfg.job_name,
        namespace=cfg.job_namespace,
        labels=labels(cfg, run_id),
        nproc_per_node=cfg.procs_per_node,
        nodes=cfg.job_nodes,
        rdzv_backend=backend,
        rdzv_host=host,
        rdzv_port=port,
        rdzv_id=run_id,
        join_timeout=cfg.rdzv_join_timeout,
        max_restarts=cfg.max_restarts,
        image=cfg.image_uri,
        command=launch_command(cfg, run_id),
        env=container_env(cfg),
        resources=pod_resources(cfg),
        hf_token_dir=HF_TOKEN_DIR,
        checkpoint_root=POD_CHECKPOINT_ROOT,
        efa=cfg.uses_efa,
        node_selector=node_selector(cfg),
        tolerations=tolerations(cfg),
        scheduler_name=cfg.scheduler_name,
        annotations=pod_annotations(cfg),
        gang=cfg.gang_scheduling,
        shm_size=f"{max(8, cfg.gpus * 8) if cfg.backend == 'eks' else 2}Gi",
        checkpoint_pvc=cfg.checkpoint_pvc,
        shared_volume=cfg.shared_volume,
        shared_volume_path=cfg.shared_volume_path,
        secret_name=secret_name(cfg),
    )


JOB_KINDS = {
    "pytorchjob": ("kubeflow.org/v1", "PyTorchJob"),
    "trainjob": ("trainer.kubeflow.org/v1alpha1", "TrainJob"),
}


def job_api(cfg: Config) -> tuple[str, str]:
    """(apiVersion, kind) of the job object. The local backend always runs the PyTorchJob form."""
    return JOB_KINDS["pytorchjob" if cfg.backend == "local" else cfg.job_kind]


def render_job(cfg: Config, run_id: str) -> list[Obj]:
    """Namespace, etcd (with an etcd rendezvous) and the job: everything but the Secret. The job comes
    last."""
    values = job_values(cfg, run_id)
    objs = render_namespace(cfg)
    if cfg.rdzv_backend != "c10d":
        objs += render_etcd(cfg)
    if job_api(cfg)[1] == "TrainJob":
        values["command"] = ["torchrun", f"--max-restarts={cfg.max_restarts}", "-m", "fsdptrain"]
        return objs + render_template("trainjob.yaml.j2", **values)
    return objs + render_template("pytorchjob.yaml.j2", **values)


def render_namespace(cfg: Config) -> list[Obj]:
    return render_template(
        "namespace.yaml.j2", namespace=cfg.job_namespace, labels={"app.kubernetes.io/managed-by": "fsdpctl"}
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
    """The eksctl ClusterConfig for the cluster the settings describe."""
    zones = [z for z in cfg.availability_zones.split(",") if z]
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
    )[0]


def terraform_vars(cfg: Config) -> dict[str, Any]:
    """fsdpctl.auto.tfvars.json for terraform/: the same settings, the module's variable names. The EFA
    interface count comes from instances.py: terraform/ keeps no table of its own."""
    zones = [z for z in cfg.availability_zones.split(",") if z] or [
        f"{cfg.aws_region}a",
        f"{cfg.aws_region}b",
    ]
    return {
        "region": cfg.aws_region,
        "cluster_name": cfg.cluster_name,
        "kubernetes_version": cfg.kubernetes_version,
        "availability_zones": zones,
        "instance_type": cfg.instance_type,
        "node_count": cfg.node_count,
        "capacity_reservation_id": cfg.capacity_reservation_id,
        "efa_enabled": cfg.efa_enabled,
        "efa_interfaces": cfg.instance.efa_interfaces,
        "system_instance_type": cfg.system_instance_type,
    }


def to_yaml(objs: list[Obj]) -> str:
    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)  # libyaml when present: same output, faster
    return yaml.dump_all(objs, Dumper=dumper, sort_keys=False, default_flow_style=False, width=120)


def file_name(obj: Obj) -> str:
    return re.sub(r"[^a-z0-9.-]", "-", f"{obj['kind'].lower()}-{obj['metadata']['name']}.yaml")

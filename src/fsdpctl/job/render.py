"""Manifests from templates: Config -> Kubernetes objects (dicts) -> deterministic YAML. Pure apart
from reading the templates that ship with the package."""

from __future__ import annotations

import re
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fsdpctl.errors import BadInput
from fsdpctl.job import prestep
from fsdpctl.job.policy import (
    LAUNCH,
    NODE_SCRATCH_DIR,
    POD_CHECKPOINT_ROOT,
    PODINFO_DIR,
    checkpoint_dir,
    checkpoint_root,
    conf_arg,
    nccl_trace_file,
    pod_env,
    tensorboard_dir,
    wandb_dir,
)
from fsdpctl.job.spec import JobSpec, Resources, labels
from fsdpctl.job.spec import build as build_spec
from fsdpctl.job.validate import label_value
from fsdpctl.redact import redact_obj
from fsdpctl.settings import Config, parse_node_selector, parse_tolerations
from fsdptrain import disruption

if TYPE_CHECKING:
    import jinja2


Obj = dict[str, Any]  # a Kubernetes object (or any YAML mapping) as parsed


HF_TOKEN_DIR = (
    "/var/run/secrets/fsdpctl/hf-token"  # the Secret as a file: huggingface_hub reads HF_TOKEN_PATH
)


STOP_ANNOTATION = disruption.STOP_ANNOTATION


ETCD_IMAGE = "quay.io/coreos/etcd:v3.5.21"  # 3.6 dropped the v2 API torch's etcd rendezvous uses


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


# The system node group's root volume: eksctl's default for a managed node group (80 GiB gp3:
# v0.230.0 DefaultNodeVolumeSize, pkg/apis/eksctl.io/v1alpha5/types.go; its schema's volumeSize
# default), written out for eksctl and given to terraform, where EKS's own default
# (aws_eks_node_group disk_size) is 20 GiB.
SYSTEM_VOLUME_GIB = 80


SCRATCH_DROP_IN = "/etc/systemd/system/kubelet.service.d/90-fsdpctl-local.conf"


SCRATCH_SCRIPT = f"""mkdir -p {SCRATCH_DROP_IN.rsplit("/", 1)[0]}
cat > {SCRATCH_DROP_IN} <<'EOF'
[Service]
ExecStartPre=-/usr/bin/install -d -m 1777 {NODE_SCRATCH_DIR}
EOF
systemctl daemon-reload
"""


def data_dir(name: str) -> Path:
    """Inside a wheel: fsdpctl/<name>; in a checkout: the repository's <name>/ (templates,
    eksctl)."""
    package = Path(__file__).resolve().parents[1]  # fsdpctl/, above this module's job/
    for candidate in (package / name, package.parents[1] / name):
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
    import yaml  # here, not at the top: a job verb that renders nothing (job list) never loads it

    text = _env().get_template(template).render(**values)
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return [doc for doc in yaml.load_all(text, Loader=loader) if doc]


def secret_name(cfg: Config) -> str:
    return job_secret_name(cfg.job_name)


def job_secret_name(job: str) -> str:
    """The job's own HF-token Secret (one per job, owned by the job object)."""
    return f"{job}-hf-token"


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
        node_selector=node_selector(cfg),
        tolerations=tolerations(cfg),
    )[0]


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
        conf_arg(cfg),
        f"--max-restarts={cfg.max_restarts}",
        "-m",
        "fsdptrain",
    ]


def pod_annotations(port: int) -> dict[str, str]:
    return {"prometheus.io/scrape": "true", "prometheus.io/port": str(port)} if port else {}


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
        min_nodes=cfg.fewest_nodes,
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
    everything but the Secret. The job comes last. `record_id`: the run record's
    (fsdpctl.job.record), which the trainer echoes into its summary and checkpoints."""
    values = job_values(build_spec(cfg, run_id, record_id), cfg)
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
    """The pre-step (fsdpctl.job.prestep): a one-shot Job that prepares the job's claims (root,
    nothing else) and downloads its hub repos onto the shared volume once; none when the pods mount
    no claim. On the workers' nodes (their nodeSelector and tolerations): its image is theirs."""
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
        node_selector=node_selector(cfg),
        tolerations=tolerations(cfg),
    )


def render_pdb(cfg: Config, run_id: str) -> list[Obj]:
    """The PodDisruptionBudget of the job's pods (templates/pdb.yaml.j2): at the job's minimum.
    Without a range (MIN_NODES unset) every pod is needed and a drain waits for the job to end
    (`job stop`); with one, JOB_NODES - MIN_NODES pods may be evicted and the others train on."""
    selector = {"fsdpctl.io/job": cfg.job_name, "fsdpctl.io/run-id": label_value(run_id)}
    return render_template(
        "pdb.yaml.j2",
        job_name=cfg.job_name,
        namespace=cfg.job_namespace,
        labels=labels(cfg, run_id),
        min_available=cfg.fewest_nodes,
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
    import yaml

    return render_template(
        "clusterconfig.yaml.j2",
        cluster_name=cfg.cluster_name,
        region=cfg.aws_region,
        kubernetes_version=cfg.kubernetes_version,
        zones=zones,
        system_instance_type=cfg.system_instance_type,
        system_volume_gib=SYSTEM_VOLUME_GIB,
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
    EFA interface count comes from plan/instances.py: terraform/ keeps no table of its own."""
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
        "system_volume_size": SYSTEM_VOLUME_GIB,
        "fsx_storage_gib": cfg.fsx_storage_gib if cfg.fsx_create else 0,
        "fsx_throughput": cfg.fsx_throughput_per_tib,
    }


def to_yaml(objs: list[Obj]) -> str:
    import yaml

    dumper = getattr(
        yaml, "CSafeDumper", yaml.SafeDumper
    )  # libyaml when present: same output, faster
    return yaml.dump_all(
        redact_obj(objs), Dumper=dumper, sort_keys=False, default_flow_style=False, width=120
    )


def file_name(obj: Obj) -> str:
    return re.sub(r"[^a-z0-9.-]", "-", f"{obj['kind'].lower()}-{obj['metadata']['name']}.yaml")

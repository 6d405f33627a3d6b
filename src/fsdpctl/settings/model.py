"""The settings declared (pure): `Settings`, the infrastructure keys with their defaults and bounds.
`Config`, the loaded settings with the training ones and their sources, is
`fsdpctl.settings.config`."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    SecretStr,
    ValidationInfo,
    field_validator,
    model_validator,
)

from fsdpctl.plan.instances import INSTANCE_TYPES, InstanceType
from fsdpctl.redact import token_shaped
from fsdpctl.settings.rules import (
    AZ_LIST,
    BACKEND_DEFAULT,
    DNS_1035_LABEL,
    DNS_LABEL,
    EC2_TYPE,
    FSX_DNS,
    IMAGE_TAG,
    INT64_MAX,
    INT_MAX,
    JOB_NAME_DEFAULT,
    REGISTRY,
    SHAPES,
    SUBNET_LIST,
    VPC,
    BackendName,
    JobKind,
    _k,
)
from fsdpctl.targets import TARGETS


class Settings(BaseModel):
    """Everything but training: each field's env/.env key is its name in capitals."""

    # NaN and inf are no setting's value: a float key refuses them by its kind, whatever it is
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    aws_region: str = _k("us-west-2", "aws", "AWS region", pattern=r"^[a-z]{2}(-gov)?-[a-z]+-\d$")
    aws_account_id: str = _k(
        "", "aws", "12-digit account id (default registry: its ECR)", pattern=r"^(\d{12})?$"
    )
    aws_profile: str = _k("", "aws", "AWS CLI profile to use", shape="profile")
    request_timeout: float = _k(
        30.0,
        "aws",
        "seconds to wait for an answer from AWS, the Kubernetes API or the Hub (per request; a profile's "
        "credential_process and a kubeconfig's exec plugin too); then fail naming what did not answer",
        ge=0.1,
        le=3600,
    )
    cluster_name: str = _k(
        "fsdp-eks", "cluster", "EKS cluster name", pattern=r"^[a-zA-Z][-a-zA-Z0-9]{0,99}$"
    )
    cluster_tool: Literal["eksctl", "terraform"] = _k(
        "eksctl", "cluster", "what creates the cluster"
    )
    instance_type: str = _k("p5.48xlarge", "cluster", "GPU node type: " + ", ".join(INSTANCE_TYPES))
    node_count: int = _k(2, "cluster", "GPU nodes in the node group", ge=1, le=64)
    capacity_reservation_id: str = _k(
        "",
        "cluster",
        "Capacity Reservation or Capacity Block (cr-...)",
        pattern=r"^(cr-[0-9a-f]{17})?$",
    )
    capacity_reservation_type: Literal["default", "capacity-block"] = _k(
        "default",
        "cluster",
        "its ReservationType: default (On-Demand) or capacity-block (Capacity Blocks for ML)",
    )
    efa_enabled: bool = _k(True, "cluster", "use EFA (vpc.amazonaws.com/efa) between nodes")
    availability_zones: str = _k(
        "",
        "cluster",
        "comma-separated AZs; the GPU node group uses the first (empty: the reservation's, or eksctl's)",
        pattern=AZ_LIST,
    )
    vpc_id: str = _k(
        "",
        "cluster",
        "an existing VPC (vpc-...) for the cluster, with PRIVATE_SUBNET_IDS (empty: the tool makes a VPC)",
        pattern=VPC,
    )
    private_subnet_ids: str = _k(
        "",
        "cluster",
        "its private subnets (subnet-...,subnet-...), two or more in different AZs; the GPU node group "
        "uses the first",
        pattern=SUBNET_LIST,
    )
    kubernetes_version: str = _k("1.33", "cluster", "EKS Kubernetes version", pattern=r"^1\.\d{2}$")
    system_instance_type: str = _k(
        "m5.xlarge",
        "cluster",
        "instance type of the system node group (etcd, operator)",
        pattern=EC2_TYPE,
    )
    image_registry: str = _k(
        "",
        "image",
        "registry host[:port] (default: the account's ECR in AWS_REGION)",
        pattern=REGISTRY,
    )
    image_repo: str = _k(
        "fsdpctl-trainer", "image", "image repository", pattern=r"^[a-z0-9][a-z0-9._/-]*$"
    )
    image_tag: str = _k(
        "0.1.0", "image", "image tag (never 'latest': pods must be reproducible)", pattern=IMAGE_TAG
    )
    image_login: Literal["ecr", "none"] = _k(
        "ecr",
        "image",
        "how `image push` logs in: ecr (a token from "
        "ecr:GetAuthorizationToken) or none (docker is logged in already)",
    )
    backend: BackendName = _k(
        BACKEND_DEFAULT,
        "job",
        f"where `job run` runs: {' or '.join(t.where for t in TARGETS.values())}",
    )
    job_name: str = _k(
        JOB_NAME_DEFAULT,
        "job",
        "job name (a DNS-1035 label: starts with a letter)",
        pattern=DNS_1035_LABEL,
    )
    job_namespace: str = _k("fsdp", "job", "Kubernetes namespace", pattern=DNS_LABEL)
    job_nodes: int = _k(2, "job", "nodes (pods) in the job; local: simulated nodes", ge=1, le=1024)
    min_nodes: int = _k(
        0,
        "job",
        "the fewest nodes the job trains on after losing some (elastic range MIN_NODES..JOB_NODES; "
        "0: JOB_NODES, no range: a lost node is waited for, as before); local, slurm, and EKS with "
        "JOB_KIND=pytorchjob and RDZV_BACKEND=etcd-v2",
        ge=0,
        le=1024,
    )
    gpus_per_node: int = _k(0, "job", "GPUs per pod (0: all the instance has)", ge=0)
    local_procs_per_node: int = _k(
        1, "job", "local backend: processes per simulated node", ge=1, le=64
    )
    rdzv_backend: Literal["c10d", "etcd", "etcd-v2"] = _k("c10d", "job", "torchrun rendezvous")
    rdzv_join_timeout: int = _k(600, "job", "seconds nodes may take to join the rendezvous", ge=10)
    max_restarts: int = _k(
        3,
        "job",
        "restarts of the whole job after a failure, whatever the node count (torchrun's)",
        ge=0,
    )
    stop_grace_seconds: int = _k(
        0,
        "job",
        "seconds the trainer gets after SIGTERM to finish its step and save (0: from the checkpoint's size)",
        ge=0,
        le=86400,
    )
    prestep_timeout: int = _k(
        7200,
        "job",
        "seconds the trainers wait for the pre-step (volume preparation, hub downloads) before the job fails "
        "with its reason; the pre-step Job's activeDeadlineSeconds",
        ge=10,
        le=7 * 86400,
    )
    hugepages_2mi: str = _k(
        "",
        "job",
        "hugepages-2Mi each GPU pod requests (AWS's EFA manifests: 5120Mi); only where nodes "
        "pre-allocate them (empty: none)",
        pattern=r"^([1-9][0-9]*(Mi|Gi))?$",
    )
    job_kind: JobKind = _k(
        "pytorchjob",
        "job",
        "Kubernetes job API: pytorchjob (Training Operator v1.9.4, kubeflow.org/v1) or trainjob "
        "(Kubeflow Trainer v2.3.0 TrainJob on the torch-distributed runtime)",
    )
    kube_context: str = _k(
        "", "job", "kubeconfig context (empty: the current one)", shape="context"
    )
    node_selector: str = _k(
        "",
        "job",
        "extra node labels GPU pods need: key=value[,key=value]",
        pattern=r"^([A-Za-z0-9./_-]+=[A-Za-z0-9._-]*(,[A-Za-z0-9./_-]+=[A-Za-z0-9._-]*)*)?$",
    )
    tolerations: str = _k(
        "",
        "job",
        "extra taints GPU pods tolerate: key[=value][:Effect][,...] (nvidia.com/gpu is always tolerated)",
        pattern=r"^([A-Za-z0-9./_-]+(=[A-Za-z0-9._-]*)?"
        r"(:(NoSchedule|PreferNoSchedule|NoExecute))?(,[A-Za-z0-9./_-]+(=[A-Za-z0-9._-]*)?"
        r"(:(NoSchedule|PreferNoSchedule|NoExecute))?)*)?$",
    )
    scheduler_name: str = _k(
        "",
        "job",
        "pod scheduler, e.g. volcano (empty: the default scheduler)",
        pattern=r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?)?$",
    )
    gang_scheduling: bool = _k(
        False,
        "job",
        "start all pods or none (PyTorchJob schedulingPolicy.minAvailable; "
        "needs a gang scheduler such as volcano in SCHEDULER_NAME)",
    )
    monitoring_namespace: str = _k(
        "monitoring",
        "job",
        "namespace of Prometheus, Grafana and the DCGM exporter",
        pattern=DNS_LABEL,
    )
    checkpoint_pvc: str = _k(
        "",
        "job",
        "PersistentVolumeClaim for checkpoints only, mounted at /checkpoints (empty: on SHARED_VOLUME)",
        pattern=r"^([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?)?$",
    )
    checkpoint_subdir: str = _k(
        "",
        "job",
        "a checkpoint directory of the run's own under the job's (`job rerun` sets reruns/<run id>); empty: "
        "the job's own, which every `job run` of it resumes",
        pattern=r"^([A-Za-z0-9_-][A-Za-z0-9_.-]*(/[A-Za-z0-9_-][A-Za-z0-9_.-]*)*)?$",
    )
    shared_volume: str = _k(
        "fsx-claim",
        "job",
        "PersistentVolumeClaim every node mounts at SHARED_VOLUME_PATH: data, the Hugging Face cache and "
        "(unless CHECKPOINT_PVC) checkpoints; local backend: a directory under FSDPCTL_HOME/volumes; "
        "empty: none",
        pattern=r"^([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?)?$",
    )
    shared_volume_path: str = _k(
        "/fsx",
        "job",
        "where pods mount SHARED_VOLUME",
        pattern=r"^/[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*$",
    )
    slurm_python: str = _k(
        "python3",
        "job",
        "Slurm: the Python on the nodes that has fsdptrain (a virtual environment on the shared file system; "
        "inside SLURM_CONTAINER_IMAGE: its python)",
        shape="program",
        pattern=r"^[A-Za-z0-9._/+-]+$",
    )
    slurm_container_image: str = _k(
        "",
        "job",
        "Slurm: the trainer's container through pyxis/enroot (srun --container-image: a .sqsh file or "
        "docker://...); empty: SLURM_PYTHON on the nodes themselves",
        pattern=r"^([A-Za-z0-9._/:@#+-]+)?$",
    )
    slurm_partition: str = _k(
        "",
        "job",
        "Slurm: the partition (sbatch --partition; empty: the cluster's default)",
        pattern=r"^([A-Za-z0-9._-]+)?$",
    )
    fsx_file_system_id: str = _k(
        "",
        "job",
        "FSx for Lustre file system (fs-...) `deploy storage` binds SHARED_VOLUME to (empty: no PV or claim)",
        pattern=r"^(fs-[0-9a-f]{8,17})?$",
    )
    fsx_dns_name: str = _k(
        "", "job", "its DNSName (fs-....fsx.<region>.amazonaws.com)", pattern=FSX_DNS
    )
    fsx_mount_name: str = _k(
        "", "job", "its LustreConfiguration.MountName", pattern=r"^[A-Za-z0-9_]*$"
    )
    fsx_storage_gib: int = _k(
        1200,
        "job",
        "its StorageCapacity in GiB (the PV's capacity); unset: sized for what the job keeps there (MODEL, "
        "CHECKPOINT_KEEP, PRETRAINED, EXPORT_DIR): 1200, 2400 or a multiple of 2400",
        shape="fsx_size",
        ge=1,
    )
    fsx_throughput_per_tib: int = _k(
        250,
        "job",
        "its PerUnitStorageThroughput, MB/s per TiB (PERSISTENT_2: 125, 250, 500, 1000): with the size, how "
        "fast checkpoints are written, which sets the stop grace",
        ge=1,
    )
    shared_volume_write_mbps: int = _k(
        0,
        "job",
        "the aggregate write rate, MB/s for all nodes together, of the file system at "
        "SHARED_VOLUME_PATH: how fast checkpoints are written, which sets the stop grace; 0: "
        "FSX_STORAGE_GIB x FSX_THROUGHPUT_PER_TIB where fsdpctl sizes the FSx (EKS), assumed (and "
        "said) on Slurm, whose file system fsdpctl never read",
        ge=0,
    )
    fsx_create: bool = _k(
        True,
        "cluster",
        "cluster create makes an FSX_STORAGE_GIB FSx for Lustre file system in the GPU nodes' subnet "
        "(terraform: its id, DNS name and mount name are outputs; eksctl: made through the AWS API, the "
        "FSX_* lines printed)",
    )
    hf_token: SecretStr = _k(
        SecretStr(""), "secrets", "Hugging Face token (gated Llama-2); never written out"
    )
    hf_token_file: str = _k("", "secrets", "file holding the HF token (instead of HF_TOKEN)")

    @field_validator("hf_token_file", mode="before")
    @classmethod
    def _a_path_not_a_token(cls, value: Any) -> Any:
        """The token itself pasted where its file's path goes: refused (and masked where it shows:
        redact.token_shaped)."""
        if isinstance(value, str) and token_shaped(value):
            raise ValueError(
                "looks like the token itself, not a path: put the token in HF_TOKEN, or in a file "
                "whose path HF_TOKEN_FILE names"
            )
        return value

    @field_validator("*", mode="after")
    @classmethod
    def _int_in_range(cls, value: Any, info: ValidationInfo) -> Any:
        """Every whole number within its range by kind (INT_MAX, else int64), whether or not its
        field declares a maximum."""
        if isinstance(value, int) and not isinstance(value, bool) and info.field_name:
            most = INT_MAX.get(info.field_name.upper(), INT64_MAX)
            if value > most:
                raise ValueError(f"is too large: use at most {most}")
        return value

    @field_validator("*", mode="after")
    @classmethod
    def _has_its_shape(cls, value: Any, info: ValidationInfo) -> Any:
        """A value whose field declares a shape (rules.SHAPES) has it, once it is of its kind and
        within its bounds: the line says what is wrong for where the value goes."""
        field = cls.model_fields.get(info.field_name or "")
        extra = field.json_schema_extra if field else None
        shape = SHAPES.get(str(extra.get("shape", ""))) if isinstance(extra, dict) else None
        if shape is not None and not shape.fits(value):
            raise ValueError(shape.says)
        return value

    @model_validator(mode="after")
    def _instance_known(self) -> Settings:
        """The checks across fields, every one of them: one line each in one error (a first problem
        never hides a second)."""
        lines = []
        if self.image_tag == "latest":
            lines.append(
                "IMAGE_TAG='latest' is not allowed: pin a version so every pod runs the same image"
            )
        if self.instance_type not in INSTANCE_TYPES:
            lines.append(
                f"INSTANCE_TYPE={self.instance_type!r} is not supported: use one of "
                f"{', '.join(INSTANCE_TYPES)}"
            )
        if self.gang_scheduling and not self.scheduler_name:
            lines.append(
                "GANG_SCHEDULING=true needs SCHEDULER_NAME (e.g. volcano): the default scheduler "
                "does not start pods as a group"
            )
        lines += self._existing_vpc()
        if self.min_nodes > self.job_nodes:
            lines.append(
                f"MIN_NODES={self.min_nodes} exceeds JOB_NODES={self.job_nodes}: the elastic range is "
                f"MIN_NODES..JOB_NODES; set MIN_NODES to at most {self.job_nodes} (0: JOB_NODES)"
            )
        if self.instance_type in INSTANCE_TYPES and self.gpus_per_node > self.instance.gpus:
            lines.append(
                f"GPUS_PER_NODE={self.gpus_per_node} exceeds the {self.instance.gpus} GPUs of a "
                f"{self.instance_type}: use at most {self.instance.gpus} (0 = all)"
            )
        if lines:
            raise ValueError("\n".join(lines))
        return self

    def _existing_vpc(self) -> list[str]:
        """Both or neither; eksctl wants two or more private subnets (MinRequiredSubnets) keyed by
        AZ, so one per AZ, and AVAILABILITY_ZONES, when set, names each subnet's AZ in order."""
        subnets, zones = self.subnet_ids, [z for z in self.availability_zones.split(",") if z]
        lines = []
        if self.vpc_id and not subnets:
            lines.append(
                f"VPC_ID={self.vpc_id} needs PRIVATE_SUBNET_IDS: set the VPC's private subnets "
                "(two or more, in different AZs)"
            )
        if subnets and not self.vpc_id:
            lines.append(
                f"PRIVATE_SUBNET_IDS={self.private_subnet_ids} needs VPC_ID: set the VPC they belong to"
            )
        if len(subnets) == 1 or len(set(subnets)) != len(subnets):
            lines.append(
                f"PRIVATE_SUBNET_IDS={self.private_subnet_ids} names too few subnets: give two or more "
                "distinct ones, in different AZs (EKS needs two AZs)"
            )
        if subnets and zones and (len(zones) != len(subnets) or len(set(zones)) != len(zones)):
            lines.append(
                f"AVAILABILITY_ZONES={self.availability_zones} does not pair with PRIVATE_SUBNET_IDS: "
                "give each subnet's AZ in the same order, one subnet per AZ (or leave it empty: "
                "`cluster create` reads them from EC2)"
            )
        return lines

    @property
    def fewest_nodes(self) -> int:
        """The bottom of the elastic range: MIN_NODES, or JOB_NODES where it is 0 (no range)."""
        return self.min_nodes or self.job_nodes

    @property
    def subnet_ids(self) -> list[str]:
        return [s for s in self.private_subnet_ids.split(",") if s]

    @property
    def instance(self) -> InstanceType:
        return INSTANCE_TYPES[self.instance_type]

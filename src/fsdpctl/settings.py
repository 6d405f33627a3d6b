"""Settings: one typed object, loaded once, with the precedence flags > environment > .env > defaults.

The environment is read only under the FSDPCTL_ prefix (FSDPCTL_MODEL; a stray SEED or MODEL= in a shell is
someone else's), except the few keys whose own tools read the plain name with the same meaning (SHARED_ENV);
.env is fsdpctl's own file and takes the plain names. Each value's source is kept, and every error line names
it (`.env line 3`, `environment FSDPCTL_SEED`, `--set`, `--model`).

Infrastructure keys (AWS, cluster, image, job) are declared here; training keys (MODEL, SHARDING_STRATEGY,
...) are the trainer's own (`fsdptrain.config.TrainConfig`), so both read one vocabulary and one validator.
Pure: reads no file and no environment itself; `load()` is handed the layers.
"""

from __future__ import annotations

import dataclasses
import difflib
import io
import math
import re
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    SkipValidation,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import ErrorDetails

from fsdpctl import volume
from fsdpctl.errors import BadInput, SettingsError
from fsdpctl.instances import INSTANCE_TYPES, InstanceType
from fsdpctl.redact import MASK, SECRET_ENV, redact, secret_kind
from fsdpctl.targets import NAMES, Target, target
from fsdpctl.validate import LABEL_MAX, label_value_problem, qualified_name_problem
from fsdptrain.config import MODEL_DEFAULTS, ConfigError, TrainConfig, parse_value, with_model_defaults
from fsdptrain.shapes import job_mesh_shape

# value shapes the settings accept
FSX_DNS = r"^(fs-[0-9a-f]{8,17}\.fsx\.[a-z]{2}(-gov)?-[a-z]+-\d\.amazonaws\.com(\.cn)?)?$"
AZ_LIST = r"^([a-z]{2}(-gov)?-[a-z]+-\d[a-z](,[a-z]{2}(-gov)?-[a-z]+-\d[a-z])*)?$"
EC2_TYPE = r"^[a-z0-9-]+\.[a-z0-9]+$"
REGISTRY = r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?(:[0-9]{1,5})?)?$"
IMAGE_TAG = r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$"
DNS_LABEL = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
VPC = r"^(vpc-[0-9a-f]{8,17})?$"
SUBNET_LIST = r"^(subnet-[0-9a-f]{8,17}(,subnet-[0-9a-f]{8,17})*)?$"
# A job's name is a DNS-1035 label (starts with a letter): the Training Operator's webhook refuses any other
# (pkg/webhooks/pytorch/pytorchjob_webhook.go: NameIsDNS1035Label), and the Services named after its pods are
# DNS-1035 labels too.
DNS_1035_LABEL = r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$"
# Every value travels to the trainer as an environment string `KEY=value`; Linux refuses execve with E2BIG for
# any one string over MAX_ARG_STRLEN (32 pages = 128 KiB: include/uapi/linux/binfmts.h). Half of that leaves
# room for the key and for the other values; anything longer is a paste gone wrong, not a setting.
MAX_VALUE_BYTES = 64 * 1024
TOKEN_FILE_HINT = "put the token (hf_...) alone in the file, or set HF_TOKEN"
# Whole numbers end up in C int64 fields (torch.manual_seed adds per-shard offsets to SEED and refuses beyond
# 2**64-1; Kubernetes int64 fields; timedelta(seconds=...) for the timeouts): one range for all, tighter
# ranges where the value has one of its own.
INT64_MAX = 2**63 - 1
TIMEDELTA_MAX_SECONDS = 999_999_999 * 86_400  # datetime.timedelta.max, in whole days
INT_MAX = {
    "METRICS_PORT": 65535,  # a TCP port (0: off)
    "COLLECTIVE_TIMEOUT": TIMEDELTA_MAX_SECONDS,  # torch's init_process_group(timeout=timedelta(...))
    "RDZV_JOIN_TIMEOUT": TIMEDELTA_MAX_SECONDS,  # torchrun's rendezvous join_timeout, a timedelta too
}
GATED_PREFIXES = ("meta-llama/",)
# keys whose value is a secret (masked by `redacted`, never written)
SECRET_KEYS = ("HF_TOKEN",)
# Keys the job derives itself rather than taking from the user.
TRAIN_KEYS_DERIVED = {"checkpoint_dir", "metrics_file"}
# The environment's settings: FSDPCTL_<KEY>. The plain names are the trainer's (pods get MODEL=, SEED=): in a
# user's shell they belong to something else, and are not read.
ENV_PREFIX = "FSDPCTL_"
# ...except these, which their own tools read by the plain name with the same meaning: huggingface_hub
# (HF_TOKEN), the AWS SDKs and CLI (AWS_REGION, AWS_PROFILE). FSDPCTL_<KEY> wins when both are set.
SHARED_ENV = ("HF_TOKEN", "AWS_REGION", "AWS_PROFILE")
# FSDPCTL_ variables that are fsdpctl's own, not settings (an unknown FSDPCTL_ variable is warned about):
# the state and .env paths, the offline mirrors, the local backend's switch and its process marks, and the
# test suite's switches (FSDPCTL_TEST_*, FSDPCTL_UPDATE_GOLDEN).
OWN_ENV = (
    "FSDPCTL_HOME",
    "FSDPCTL_ENV_FILE",
    "FSDPCTL_CRD_DIR",
    "FSDPCTL_MANIFESTS",
    "FSDPCTL_TF_PLUGIN_DIR",
    "FSDPCTL_LOCAL_NETNS",
    "FSDPCTL_LOCAL_RUN_AS",
    "FSDPCTL_LOCAL_START_DELAYS",
    "FSDPCTL_POD",
    "FSDPCTL_JOB",
    "FSDPCTL_RUN",
    "FSDPCTL_SHARED",
    "FSDPCTL_CHECKOV",
    "FSDPCTL_UPDATE_GOLDEN",
)
OWN_ENV_PREFIXES = ("FSDPCTL_TEST_",)
# The source of a value the named model chose (fsdptrain.config.MODEL_DEFAULTS) because the user set none.
MODEL_DEFAULT = "model default"
CAPPED_DEFAULT = "default, at most MAX_STEPS"  # WARMUP_STEPS of a run shorter than its default warmup
# The source of a value computed from other settings because the user set none (FSX_STORAGE_GIB: sized for
# what the job keeps on the volume, fsdpctl.volume); .env.example leaves these keys commented out too.
DERIVED = "derived"
DERIVED_KEYS = ("FSX_STORAGE_GIB",)


def _k(default: Any, group: str, help: str, **constraints: Any) -> Any:
    return Field(default, description=help, json_schema_extra={"group": group}, **constraints)


# BACKEND's values: the registered places (fsdpctl.targets), checked as a Literal would be
if TYPE_CHECKING:
    BackendName = str
else:
    BackendName = Literal[NAMES]


class Settings(BaseModel):
    """Everything but training: each field's env/.env key is its name in capitals."""

    # NaN and inf are no setting's value: a float key refuses them by its kind, whatever it is
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    aws_region: str = _k("us-west-2", "aws", "AWS region", pattern=r"^[a-z]{2}(-gov)?-[a-z]+-\d$")
    aws_account_id: str = _k(
        "", "aws", "12-digit account id (default registry: its ECR)", pattern=r"^(\d{12})?$"
    )
    aws_profile: str = _k("", "aws", "AWS CLI profile to use")
    request_timeout: float = _k(
        30.0,
        "aws",
        "seconds to wait for an answer from AWS, the Kubernetes API or the Hub (per request; a profile's "
        "credential_process and a kubeconfig's exec plugin too); then fail naming what did not answer",
        ge=0.1,
        le=3600,
    )
    cluster_name: str = _k("fsdp-eks", "cluster", "EKS cluster name", pattern=r"^[a-zA-Z][-a-zA-Z0-9]{0,99}$")
    cluster_tool: Literal["eksctl", "terraform"] = _k("eksctl", "cluster", "what creates the cluster")
    instance_type: str = _k("p5.48xlarge", "cluster", "GPU node type: " + ", ".join(INSTANCE_TYPES))
    node_count: int = _k(2, "cluster", "GPU nodes in the node group", ge=1, le=64)
    capacity_reservation_id: str = _k(
        "", "cluster", "Capacity Reservation or Capacity Block (cr-...)", pattern=r"^(cr-[0-9a-f]{17})?$"
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
        "m5.xlarge", "cluster", "instance type of the system node group (etcd, operator)", pattern=EC2_TYPE
    )
    image_registry: str = _k(
        "", "image", "registry host[:port] (default: the account's ECR in AWS_REGION)", pattern=REGISTRY
    )
    image_repo: str = _k("fsdpctl-trainer", "image", "image repository", pattern=r"^[a-z0-9][a-z0-9._/-]*$")
    image_tag: str = _k(
        "0.1.0", "image", "image tag (never 'latest': pods must be reproducible)", pattern=IMAGE_TAG
    )
    image_login: Literal["ecr", "none"] = _k(
        "ecr",
        "image",
        "how `image push` logs in: ecr (a token from "
        "ecr:GetAuthorizationToken) or none (docker is logged in already)",
    )
    backend: BackendName = _k("local", "job", "where `job run` runs: this machine or the cluster")
    job_name: str = _k(
        "fsdp", "job", "job name (a DNS-1035 label: starts with a letter)", pattern=DNS_1035_LABEL
    )
    job_namespace: str = _k("fsdp", "job", "Kubernetes namespace", pattern=DNS_LABEL)
    job_nodes: int = _k(2, "job", "nodes (pods) in the job; local: simulated nodes", ge=1, le=1024)
    gpus_per_node: int = _k(0, "job", "GPUs per pod (0: all the instance has)", ge=0)
    local_procs_per_node: int = _k(1, "job", "local backend: processes per simulated node", ge=1, le=64)
    rdzv_backend: Literal["c10d", "etcd", "etcd-v2"] = _k("c10d", "job", "torchrun rendezvous")
    rdzv_join_timeout: int = _k(600, "job", "seconds nodes may take to join the rendezvous", ge=10)
    max_restarts: int = _k(
        3, "job", "restarts of the whole job after a failure, whatever the node count (torchrun's)", ge=0
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
    job_kind: Literal["pytorchjob", "trainjob"] = _k(
        "pytorchjob",
        "job",
        "Kubernetes job API: pytorchjob (Training Operator v1.9.4, kubeflow.org/v1) or trainjob "
        "(Kubeflow Trainer v2.3.0 TrainJob on the torch-distributed runtime)",
    )
    kube_context: str = _k("", "job", "kubeconfig context (empty: the current one)")
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
        "monitoring", "job", "namespace of Prometheus, Grafana and the DCGM exporter", pattern=DNS_LABEL
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
        "/fsx", "job", "where pods mount SHARED_VOLUME", pattern=r"^/[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*$"
    )
    fsx_file_system_id: str = _k(
        "",
        "job",
        "FSx for Lustre file system (fs-...) `deploy storage` binds SHARED_VOLUME to (empty: no PV or claim)",
        pattern=r"^(fs-[0-9a-f]{8,17})?$",
    )
    fsx_dns_name: str = _k("", "job", "its DNSName (fs-....fsx.<region>.amazonaws.com)", pattern=FSX_DNS)
    fsx_mount_name: str = _k("", "job", "its LustreConfiguration.MountName", pattern=r"^[A-Za-z0-9_]*$")
    fsx_storage_gib: int = _k(
        1200,
        "job",
        "its StorageCapacity in GiB (the PV's capacity); unset: sized for what the job keeps there (MODEL, "
        "CHECKPOINT_KEEP, PRETRAINED, EXPORT_DIR): 1200, 2400 or a multiple of 2400",
        ge=1,
    )
    fsx_throughput_per_tib: int = _k(
        250,
        "job",
        "its PerUnitStorageThroughput, MB/s per TiB (PERSISTENT_2: 125, 250, 500, 1000): with the size, how "
        "fast checkpoints are written, which sets the stop grace",
        ge=1,
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

    @field_validator("*", mode="after")
    @classmethod
    def _int_in_range(cls, value: Any, info: ValidationInfo) -> Any:
        """Every whole number within its range by kind (INT_MAX, else int64), whether or not its field
        declares a maximum."""
        if isinstance(value, int) and not isinstance(value, bool) and info.field_name:
            most = INT_MAX.get(info.field_name.upper(), INT64_MAX)
            if value > most:
                raise ValueError(f"is too large: use at most {most}")
        return value

    @model_validator(mode="after")
    def _instance_known(self) -> Settings:
        if self.image_tag == "latest":
            raise ValueError(
                "IMAGE_TAG='latest' is not allowed: pin a version so every pod runs the same image"
            )
        if self.instance_type not in INSTANCE_TYPES:
            raise ValueError(
                f"INSTANCE_TYPE={self.instance_type!r} is not supported: use one of "
                f"{', '.join(INSTANCE_TYPES)}"
            )
        if self.gang_scheduling and not self.scheduler_name:
            raise ValueError(
                "GANG_SCHEDULING=true needs SCHEDULER_NAME (e.g. volcano): the default scheduler "
                "does not start pods as a group"
            )
        self._existing_vpc()
        if self.gpus_per_node > self.instance.gpus:
            raise ValueError(
                f"GPUS_PER_NODE={self.gpus_per_node} exceeds the {self.instance.gpus} GPUs of a "
                f"{self.instance_type}: use at most {self.instance.gpus} (0 = all)"
            )
        return self

    def _existing_vpc(self) -> None:
        """Both or neither; eksctl wants two or more private subnets (MinRequiredSubnets) keyed by AZ, so one
        per AZ, and AVAILABILITY_ZONES, when set, names each subnet's AZ in order."""
        subnets, zones = self.subnet_ids, [z for z in self.availability_zones.split(",") if z]
        if self.vpc_id and not subnets:
            raise ValueError(
                f"VPC_ID={self.vpc_id} needs PRIVATE_SUBNET_IDS: set the VPC's private subnets "
                "(two or more, in different AZs)"
            )
        if subnets and not self.vpc_id:
            raise ValueError(
                f"PRIVATE_SUBNET_IDS={self.private_subnet_ids} needs VPC_ID: set the VPC they belong to"
            )
        if len(subnets) == 1 or len(set(subnets)) != len(subnets):
            raise ValueError(
                f"PRIVATE_SUBNET_IDS={self.private_subnet_ids} names too few subnets: give two or more "
                "distinct ones, in different AZs (EKS needs two AZs)"
            )
        if subnets and zones and (len(zones) != len(subnets) or len(set(zones)) != len(zones)):
            raise ValueError(
                f"AVAILABILITY_ZONES={self.availability_zones} does not pair with PRIVATE_SUBNET_IDS: "
                "give each subnet's AZ in the same order, one subnet per AZ (or leave it empty: "
                "`cluster create` reads them from EC2)"
            )

    @property
    def subnet_ids(self) -> list[str]:
        return [s for s in self.private_subnet_ids.split(",") if s]

    @property
    def instance(self) -> InstanceType:
        return INSTANCE_TYPES[self.instance_type]


class Config(Settings):
    """Settings + training values + derived numbers, as every command sees them. A subclass of Settings, so
    `cfg.job_name` is a typed field (no `__getattr__`); built by `load()` from already-validated parts."""

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True, allow_inf_nan=False)

    training: SkipValidation[TrainConfig] = Field(default_factory=TrainConfig)
    # KEY -> default | model default | <.env path> line N | environment FSDPCTL_<KEY> | --set | --<option>
    sources: dict[str, str] = Field(default_factory=dict)
    warnings: tuple[str, ...] = ()

    @classmethod
    def of(
        cls,
        settings: Settings,
        training: TrainConfig,
        sources: dict[str, str] | None = None,
        warnings: tuple[str, ...] = (),
    ) -> Config:
        values = {name: getattr(settings, name) for name in Settings.model_fields}
        return cls.model_construct(**values, training=training, sources=sources or {}, warnings=warnings)

    @property
    def settings(self) -> Settings:
        """The infrastructure settings alone (for hashing them without the training values)."""
        return Settings.model_construct(**{name: getattr(self, name) for name in Settings.model_fields})

    @property
    def gpus(self) -> int:
        return self.gpus_per_node or self.instance.gpus

    @property
    def target(self) -> Target:
        """What the place BACKEND names is (fsdpctl.targets)."""
        return target(self.backend)

    @property
    def procs_per_node(self) -> int:
        return self.gpus if self.target.gpus else self.local_procs_per_node

    @property
    def world_size(self) -> int:
        return self.job_nodes * self.procs_per_node

    @property
    def efa_per_node(self) -> int:
        """EFA interfaces each GPU node gets: all its instance type has (instances.py), or none."""
        return self.instance.efa_interfaces if self.efa_enabled else 0

    @property
    def uses_efa(self) -> bool:
        """Whether the job's pods run NCCL over EFA: on the cluster, with EFA_ENABLED and an instance type
        that has interfaces. The one answer for the pod's EFA request, environment and security context,
        and for the warning when NCCL falls back to sockets."""
        return self.target.gpus and self.efa_per_node > 0

    @property
    def checkpoint_claim(self) -> str:
        """The claim that holds checkpoints: CHECKPOINT_PVC, else SHARED_VOLUME; '' means pod-local disks."""
        return self.checkpoint_pvc or self.shared_volume

    def ecr_registry(self, account: str) -> str:
        """The ECR registry host of `account` in AWS_REGION."""
        return f"{account}.dkr.ecr.{self.aws_region}.amazonaws.com"

    @property
    def registry(self) -> str:
        """IMAGE_REGISTRY, else the ECR of AWS_ACCOUNT_ID; '' when neither is set (then STS knows)."""
        if self.image_registry:
            return self.image_registry
        return self.ecr_registry(self.aws_account_id) if self.aws_account_id else ""

    def image_uri_in(self, registry: str) -> str:
        """registry/IMAGE_REPO:IMAGE_TAG (no registry: the bare name)."""
        name = f"{self.image_repo}:{self.image_tag}"
        return f"{registry}/{name}" if registry else name

    @property
    def image_uri(self) -> str:
        return self.image_uri_in(self.registry)

    def hf_token_value(self, read_file: Callable[[str], str] | None = None) -> str:
        """The token itself, for the Secret only. `read_file` is injected so this module stays free of I/O."""
        if self.hf_token.get_secret_value():
            return self.hf_token.get_secret_value()
        if not (self.hf_token_file and read_file):
            return ""
        where = f"HF_TOKEN_FILE={self.hf_token_file!r}"
        try:
            token = read_file(self.hf_token_file).strip()
        except UnicodeDecodeError as e:  # a binary file: say where, never what
            raise BadInput(
                f"{where} is not text (byte {e.start} is not UTF-8)", hint=TOKEN_FILE_HINT
            ) from None
        # it becomes an environment string and an HTTP header: printable, one word, a sane size
        if len(token) > MAX_VALUE_BYTES or not (token.isprintable() and token.isascii()) or " " in token:
            raise BadInput(f"{where} does not hold one token (printable, no spaces)", hint=TOKEN_FILE_HINT)
        return token

    def train_env(self) -> dict[str, str]:
        """The trainer's settings as environment variables (what the pod gets), all keys, stable order."""
        out = {}
        for f in dataclasses.fields(TrainConfig):
            if f.name in TRAIN_KEYS_DERIVED:
                continue
            value = getattr(self.training, f.name)
            out[f.metadata["env"]] = str(value).lower() if isinstance(value, bool) else str(value)
        return out


def parse_node_selector(text: str) -> dict[str, str]:
    return dict(item.split("=", 1) for item in text.split(",") if item)


def parse_tolerations(text: str) -> list[dict[str, str]]:
    out = []
    for item in filter(None, text.split(",")):
        rest, _, effect = item.partition(":")
        key, eq, value = rest.partition("=")
        tol = {"key": key, "operator": "Equal" if eq else "Exists"}
        if eq:
            tol["value"] = value
        if effect:
            tol["effect"] = effect
        out.append(tol)
    return out


def setting_keys() -> dict[str, str]:
    """KEY -> field name for every key fsdpctl reads."""
    keys = {name.upper(): name for name in Settings.model_fields}
    for f in dataclasses.fields(TrainConfig):
        if f.name not in TRAIN_KEYS_DERIVED:
            keys[f.metadata["env"]] = f.name
    return keys


class Dotenv(dict[str, str]):
    """A .env file's KEY -> value, with the line each key was last set on (`lines`): errors name it."""

    def __init__(
        self, values: Mapping[str, str] | None = None, lines: Mapping[str, int] | None = None
    ) -> None:
        super().__init__(values or {})
        self.lines = dict(lines or {})


def parse_dotenv(text: str, origin: str = ".env") -> Dotenv:
    """KEY=VALUE lines (python-dotenv's grammar); a line it cannot parse is an error, not a silent skip."""
    from dotenv.parser import parse_stream

    values, bad = Dotenv(), []
    for binding in parse_stream(io.StringIO(text)):
        # python-dotenv's Binding.original.line is where the binding's text starts, blank lines before its
        # key included (dotenv/parser.py parse_binding reads leading whitespace into the binding)
        start = binding.original.string
        line = binding.original.line + start[: len(start) - len(start.lstrip())].count("\n")
        if binding.error:
            shown = _masked_line(start.strip())  # masked, then cut: no part of a secret
            bad.append(f"{origin} line {line}: cannot parse {shown[:40]!r}: write KEY=VALUE")
        elif binding.key:
            values[binding.key] = binding.value or ""
            values.lines[binding.key] = line
    if bad:
        raise SettingsError(bad)
    return values


# the name a line (or a --set) starts with, however what follows is written: KEY=, KEY:, KEY value
_LEADING_KEY = re.compile(r"\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)")


def _masked_line(line: str) -> str:
    """A .env line (or --set) as an error may quote it: secret-shaped values masked, and everything after a
    secret's own name, whatever separates them (HF_TOKEN="abc... with its quote unclosed, `HF_TOKEN abc`,
    `HF_TOKEN:abc`: the value has no shape to recognise, its place says it)."""
    m = _LEADING_KEY.match(line)
    if m and m.group(1).removeprefix(ENV_PREFIX) in (*SECRET_ENV, *SECRET_KEYS) and line[m.end() :].strip():
        return f"{line[: m.end()]} {MASK}"
    return redact(line)


def masked_line(line: str) -> str:
    return _masked_line(line)


def _shown_key(key: str) -> str:
    """A .env key as a warning may name it: python-dotenv takes `HF_TOKEN:abc` (no `=`) as a key with no
    value, so a key that is not a name shows only up to where it stops being one."""
    if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.\-]*", key):
        return key
    m = _LEADING_KEY.match(key)
    head = m.group(1) if m else ""
    return f"{head}... ({len(key) - len(head)} more characters, not a name)"


def secret_warnings(raw: Mapping[str, str], sources: Mapping[str, str]) -> list[str]:
    """A token pasted into a key that is not secret (TOKENIZER, IMAGE_TAG, DATASET_SPLIT), or a URL with a
    password (DATASET=https://user:pass@host/...), would reach the manifests and the pods' environment in
    clear: every output masks it, and this warning names the key. HF_TOKEN and HF_TOKEN_FILE both set: the
    file is never read, and this says so (which one wins)."""
    found = []
    if raw.get("HF_TOKEN") and raw.get("HF_TOKEN_FILE"):
        found.append(
            f"HF_TOKEN_FILE ({sources.get('HF_TOKEN_FILE', 'default')}) is not read: HF_TOKEN "
            f"({sources.get('HF_TOKEN', 'default')}) is set too, and wins; unset one of them"
        )
    for key, value in raw.items():
        kind = None if key in SECRET_KEYS else secret_kind(value)
        fix = (
            "so the job gets *** for the password too: give the job its credentials another way"
            if kind == "a URL with a password"
            else "so the job gets ***; put secrets in HF_TOKEN or HF_TOKEN_FILE"
        )
        if kind:
            found.append(
                f"{key} ({sources.get(key, 'default')}) looks like {kind}: masked in every output, {fix}"
            )
    return found


def load(
    *,
    dotenv: Mapping[str, str] | None = None,
    environ: Mapping[str, str] | None = None,
    flags: Mapping[str, str] | None = None,
    dotenv_name: str = ".env",
    set_by: Mapping[str, str] | None = None,
) -> Config:
    """Merge the layers (later wins) and validate everything; raises SettingsError listing every problem, each
    line naming where its value came from. `environ` is the process environment as it is (only FSDPCTL_<KEY>
    and SHARED_ENV are read from it); `set_by`: the command option that set a flag's key (default --set)."""
    keys = setting_keys()
    raw: dict[str, str] = {}
    sources = {key: "default" for key in keys}
    warnings = _dotenv_warnings(dotenv or {}, keys, dotenv_name)
    env_values, env_sources, env_warnings = environment_settings(environ or {}, keys)
    warnings.extend(env_warnings)
    lines = getattr(dotenv, "lines", {})
    for key, value in (dotenv or {}).items():
        if key in keys:
            raw[key] = value
            sources[key] = f"{dotenv_name} line {lines[key]}" if key in lines else dotenv_name
    for key, value in env_values.items():
        raw[key], sources[key] = value, env_sources[key]
    for key, value in (flags or {}).items():
        if key not in keys:
            close = difflib.get_close_matches(key, keys, n=1)
            hint = f": did you mean {close[0]}?" if close else ""
            raise SettingsError([f"--set {key}: unknown key{hint}"])
        raw[key], sources[key] = value, (set_by or {}).get(key, "--set")
    warnings.extend(secret_warnings(raw, sources))
    try:
        return _validate(raw, keys, sources, tuple(warnings))
    except SettingsError as e:
        shown = {key: (value, repr(value)) for key, value in raw.items()}
        raise SettingsError(with_sources(e.lines, shown, sources, raw.get("MODEL", "")), e.warnings) from None


def _dotenv_warnings(dotenv: Mapping[str, str], keys: Mapping[str, str], name: str) -> list[str]:
    """A key of .env that is no setting: named with its line and the key it was likely meant to be (the plain
    name, for a FSDPCTL_<KEY> copied from the environment's spelling)."""
    warnings, lines = [], getattr(dotenv, "lines", {})
    for key in dotenv:
        if key in keys:
            continue
        where = f"{name} line {lines[key]}" if key in lines else name
        plain = key.removeprefix(ENV_PREFIX)
        if _shown_key(key) != key:  # `HF_TOKEN:value`, `HF_TOKEN value`: the value must not be echoed
            head = _shown_key(key).split("...")[0]
            hint = f": write {head}=VALUE" if head.removeprefix(ENV_PREFIX) in keys else ": it is ignored"
            warnings.append(f"{where}: unknown key {_shown_key(key)}{hint}")
            continue
        if key != plain and plain in keys:
            hint = f": did you mean {plain}? ({name} takes the plain names; FSDPCTL_ is the environment's)"
        else:
            close = difflib.get_close_matches(key, keys, n=1)
            hint = f": did you mean {close[0]}?" if close else ": it is ignored"
        warnings.append(f"{where}: unknown key {key}{hint}")
    return warnings


def environment_settings(
    environ: Mapping[str, str], keys: Mapping[str, str]
) -> tuple[dict[str, str], dict[str, str], list[str]]:
    """The settings the process environment gives: KEY -> value and KEY -> source (`environment VAR`), read
    from FSDPCTL_<KEY> and, for SHARED_ENV, the plain name (FSDPCTL_<KEY> wins); and a warning for each
    FSDPCTL_ variable that is neither a setting nor fsdpctl's own (OWN_ENV), with the name it may mean."""
    values, sources, warnings = {}, {}, []
    for key in SHARED_ENV:
        if key in environ:
            values[key], sources[key] = environ[key], f"environment {key}"
    known = [ENV_PREFIX + key for key in keys] + list(OWN_ENV)
    for var in sorted(environ):
        if not var.startswith(ENV_PREFIX):
            continue
        key = var.removeprefix(ENV_PREFIX)
        if key in keys:
            values[key], sources[key] = environ[var], f"environment {var}"
        elif var not in OWN_ENV and not var.startswith(OWN_ENV_PREFIXES):
            close = difflib.get_close_matches(var, known, n=1)
            hint = f": did you mean {close[0]}?" if close else ": it is ignored"
            warnings.append(f"environment: unknown variable {var}{hint}")
    return values, sources, warnings


def with_sources(
    lines: list[str], shown: Mapping[str, tuple[str, ...]], sources: Mapping[str, str], model: str
) -> list[str]:
    """Error lines with where each named value came from, after the value: `SEED='abc' (environment
    FSDPCTL_SEED) is not ...`. The key a line starts with is its subject, so it is always annotated; a key
    named further on only where the text after its `=` is its value as given (one of `shown[key]`), so a
    suggested fix (`set JOB_NODES=2`) is not. A default (a model's too) is named only as the subject: a line
    about a value nobody set says so (`WARMUP_STEPS=5 (default) exceeds ...`)."""
    return [_with_sources(line, shown, sources, model) for line in lines]


# KEY= where KEY is a whole word (not the tail of another key, nor inside a path)
_KEY_AT = re.compile(r"(?<![A-Za-z0-9_/.-])([A-Z][A-Z0-9_]*)=")
# a value as the lines write it: a Python repr of a string, a <size>, or a run up to a space or a parenthesis
_VALUE = re.compile(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|<[^>]*>|[^\s()]*")


def _with_sources(
    line: str, shown: Mapping[str, tuple[str, ...]], sources: Mapping[str, str], model: str
) -> str:
    out, at, done = [], 0, set()
    for m in _KEY_AT.finditer(line):
        key = m.group(1)
        source = sources.get(key, "default")
        # a default is named where the line is about it; among others it needs no word
        unset = source in ("default", MODEL_DEFAULT, DERIVED) and m.start() != 0
        if key in done or unset or m.start() < at:
            continue
        value = _VALUE.match(line, m.end())
        end = value.end() if value else m.end()
        text = line[m.end() : end].rstrip(":.,;")
        end = m.end() + len(text)
        if m.start() != 0 and text not in shown.get(key, ()):
            continue
        done.add(key)
        where = {MODEL_DEFAULT: f"model default for {model}", DERIVED: f"derived for MODEL={model}"}.get(
            source, source
        )
        out.append(line[at:end] + f" ({where})")
        at = end
    return "".join(out) + line[at:]


def config_shown(cfg: Config) -> dict[str, tuple[str, ...]]:
    """How lines built from a loaded Config may write each key's value (str, repr, a bool in lower case)."""
    values = redacted(cfg)
    return {key: (str(v), repr(v), str(v).lower()) for key, v in values.items()}


def annotate(lines: list[str], cfg: Config) -> list[str]:
    """`with_sources` for lines built from a loaded Config (placement and fit problems)."""
    return with_sources(lines, config_shown(cfg), cfg.sources, cfg.training.model)


def _validate(
    raw: dict[str, str], keys: dict[str, str], sources: dict[str, str], warnings: tuple[str, ...]
) -> Config:
    errors = _raw_problems(raw)
    raw = {k: v for k, v in raw.items() if not any(line.startswith(k + "=") for line in errors)}
    infra = {keys[k]: v for k, v in raw.items() if keys[k] in Settings.model_fields}
    settings = None
    try:
        settings = Settings(**infra)
    except ValidationError as e:
        errors.extend(_pydantic_lines(e, raw))
    train_values = {}
    for key, value in raw.items():
        name = keys[key]
        if name in Settings.model_fields:
            continue
        try:
            train_values[name] = parse_value(name, value)
        except ConfigError as e:
            errors.append(str(e))
            continue
        problem = _kind_problem(key, value, train_values[name])
        if problem:
            errors.append(problem)
            del train_values[name]
    train_values, defaulted = with_model_defaults(train_values)  # the named model's, where the user set none
    key_of = {name: key for key, name in keys.items()}
    named = train_values.get("model", TrainConfig.model) in MODEL_DEFAULTS  # else only the capped warmup
    sources.update({key_of[name]: MODEL_DEFAULT if named else CAPPED_DEFAULT for name in defaulted})
    training = TrainConfig(**train_values)  # values that failed to parse were reported above
    errors.extend(training.problems(check_paths=False))
    if errors or settings is None:  # settings is None only when its errors were listed
        raise SettingsError(errors, warnings)
    cfg = Config.of(settings, training, sources, warnings)
    if "FSX_STORAGE_GIB" not in raw:  # sized for what this job keeps on the volume (fsdpctl.volume)
        sources["FSX_STORAGE_GIB"] = DERIVED
        sized = settings.model_copy(update={"fsx_storage_gib": volume.default_fsx_gib(cfg)})
        cfg = Config.of(sized, training, sources, warnings)
    errors = _cross_checks(cfg)
    if errors:
        raise SettingsError(errors, warnings)
    return cfg


def _raw_problems(raw: Mapping[str, str]) -> list[str]:
    """What no value of any key may be, before its kind is looked at: longer than MAX_VALUE_BYTES (the line
    names the size, not the value), or holding a NUL byte (no environment string can carry one: execve
    ends it there)."""
    errors = []
    for key, value in raw.items():
        size = len(value.encode("utf-8", "surrogateescape"))
        if size > MAX_VALUE_BYTES:
            errors.append(
                f"{key}=<{size} bytes> is too long: use at most {MAX_VALUE_BYTES} bytes (each value reaches "
                "the trainer as one environment string, which Linux caps at 128 KiB: E2BIG)"
            )
        elif "\x00" in value:
            errors.append(
                f"{key}={value!r} holds a NUL byte: remove it (no environment string can carry one)"
            )
    return errors


def _kind_problem(key: str, raw: str, value: Any) -> str | None:
    """The same rules by kind for the trainer's keys as Settings has for its own: a float is finite, a whole
    number within INT_MAX (else int64)."""
    if isinstance(value, float) and not math.isfinite(value):
        return f"{key}={raw!r} is not a finite number: give one, e.g. 0.001"
    if isinstance(value, int) and not isinstance(value, bool):
        most = INT_MAX.get(key, INT64_MAX)
        if value > most:
            return f"{key}={raw!r} is too large: use at most {most}"
    return None


def _name_problems(cfg: Config) -> list[str]:
    """The names Kubernetes derives from JOB_NAME must stay DNS labels (at most 63 characters): the
    Training Operator names each pod, and the Service in front of it, `<job>-<replica type>-<index>`
    (pkg/core/utils.go GenGeneralName: `<job>-worker-<n-1>` here, every node a Worker); a TrainJob's pods
    get JobSet's hostname `<job>-node-0-<n-1>` (Kubeflow Trainer v2.3.0, see render.trainjob_command)."""
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
        ("NODE_SELECTOR", cfg.node_selector, k, v) for k, v in parse_node_selector(cfg.node_selector).items()
    ]
    pairs += [
        ("TOLERATIONS", cfg.tolerations, t["key"], t.get("value", ""))
        for t in parse_tolerations(cfg.tolerations)
    ]
    for setting, text, key, value in pairs:
        problem = qualified_name_problem(key)
        if problem:
            errors.append(f"{setting}={text!r}: key {key!r} is not a Kubernetes label key: {problem}")
        problem = label_value_problem(value)
        if problem:
            errors.append(f"{setting}={text!r}: value {value!r} is not a Kubernetes label value: {problem}")
    return errors


def _registry_problems(cfg: Config) -> list[str]:
    _, colon, port = cfg.image_registry.rpartition(":")
    if colon and not 1 <= int(port) <= 65535:
        return [f"IMAGE_REGISTRY={cfg.image_registry!r} has port {port}: use a TCP port from 1 to 65535"]
    return []


def _cross_checks(cfg: Config) -> list[str]:
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
        errors.append(f"{e} (world = JOB_NODES {cfg.job_nodes} x {cfg.procs_per_node} processes per node)")
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
    if t.pretrained.startswith(GATED_PREFIXES) and not (cfg.hf_token.get_secret_value() or cfg.hf_token_file):
        errors.append(
            f"HF_TOKEN is missing: PRETRAINED={t.pretrained!r} is gated on the hub; set HF_TOKEN "
            "or HF_TOKEN_FILE (it goes into a Kubernetes Secret, never into a manifest)"
        )
    return errors


def _storage_checks(cfg: Config) -> list[str]:
    """Checkpoints of a multi-node job need one filesystem: DCP writes each rank's shards on the disk that
    rank sees and only rank 0 publishes `latest` (torch/distributed/checkpoint/filesystem.py), so on pod-local
    disks the other nodes keep orphaned partial saves and would each decide alone where to resume."""
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
    """TENSORBOARD_DIR is a path in the pods: absolute, and on the shared volume when there is one, where the
    event files outlive the pods and `fsdpctl job tensorboard` finds them (locally: its directory)."""
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
    """A static FSx PV needs all three of the file system's names (aws-fsx-csi-driver's static_provisioning
    example: volumeHandle, dnsname, mountname) and a claim to bind. PERSISTENT_2 takes four throughputs
    (CreateFileSystem LustreConfiguration.PerUnitStorageThroughput)."""
    if cfg.fsx_throughput_per_tib not in volume.FSX_THROUGHPUTS:
        return [
            f"FSX_THROUGHPUT_PER_TIB={cfg.fsx_throughput_per_tib} is not a PERSISTENT_2 throughput: use one "
            f"of {', '.join(map(str, volume.FSX_THROUGHPUTS))} (MB/s per TiB)"
        ]
    if not cfg.fsx_file_system_id:
        return []
    missing = [k for k in ("fsx_dns_name", "fsx_mount_name", "shared_volume") if not getattr(cfg, k)]
    if not missing:
        return []
    return [
        f"FSX_FILE_SYSTEM_ID={cfg.fsx_file_system_id} needs {', '.join(m.upper() for m in missing)}: "
        "the PV mounts the file system by its DNSName and LustreConfiguration.MountName "
        "(aws fsx describe-file-systems) and SHARED_VOLUME names the claim bound to it"
    ]


# A local job beyond this many processes per core spends its time switching between them: the collectives
# time out before the steps end.
LOCAL_PROCS_PER_CORE = 4


def placement_problems(
    cfg: Config, *, cores: int, exists: Callable[[str], bool], mounts: Mapping[str, str]
) -> list[str]:
    """What cannot be scheduled where the job would run, one line each with the fix (`--force` may run it
    anyway). The readers are injected, so this stays free of I/O: `cores` of this machine, `exists` for a path
    on it, `mounts` the pod mount paths the local backend maps to directories here (claim -> FSDPCTL_HOME/
    volumes/<claim>). Paths inside a cluster's pods cannot be checked from here, so on EKS only the token
    file (read here, into the Secret) is."""
    errors = []
    if cfg.hf_token_file and not cfg.hf_token.get_secret_value() and not exists(cfg.hf_token_file):
        errors.append(f"HF_TOKEN_FILE={cfg.hf_token_file!r} does not exist: check the path, or set HF_TOKEN")
    if cfg.target.kubernetes and cfg.job_nodes > cfg.node_count:
        errors.append(
            f"JOB_NODES={cfg.job_nodes} exceeds NODE_COUNT={cfg.node_count}, the GPU nodes of the node "
            f"group: the other pods would stay Pending; set JOB_NODES={cfg.node_count}, or NODE_COUNT="
            f"{cfg.job_nodes} and grow the node group"
        )
    if not cfg.target.on_this_machine:
        return errors
    most = LOCAL_PROCS_PER_CORE * cores
    if cfg.world_size > most:
        errors.append(
            f"JOB_NODES={cfg.job_nodes} x LOCAL_PROCS_PER_NODE={cfg.local_procs_per_node} is "
            f"{cfg.world_size} local processes for this machine's {cores} cores: use at most {most} "
            f"({LOCAL_PROCS_PER_CORE} per core), or BACKEND=eks"
        )
    t = cfg.training
    paths = (
        ("DATASET", t.dataset),
        ("TOKENIZER", t.tokenizer),
        ("PRETRAINED", t.pretrained),
        ("RESUME", t.resume),
    )
    for key, value in paths:
        if value.startswith(("/", "./", "../", "~")) and not exists(local_path(value, mounts)):
            where = _mapped(value, mounts)
            errors.append(f"{key}={value!r} does not exist on this machine{where}: put it there or fix {key}")
    return errors


def local_path(path: str, mounts: Mapping[str, str]) -> str:
    """Where a pod path is on this machine under the local backend: below a mapped mount (the longest one
    that holds it), that mount's directory; any other path is the machine's own."""
    for mount in sorted(mounts, key=len, reverse=True):
        root = mount.rstrip("/")
        if path == root or path.startswith(root + "/"):
            return mounts[mount] + path[len(root) :]
    return path


def _mapped(path: str, mounts: Mapping[str, str]) -> str:
    here = local_path(path, mounts)
    return f" (the local backend reads it at {here})" if here != path else ""


def _pydantic_lines(e: ValidationError, raw: dict[str, str]) -> list[str]:
    lines = []
    for err in e.errors():
        if not err["loc"]:  # model-level checks already name their key
            lines.append(re.sub(r"^Value error, ", "", err["msg"]))
            continue
        key = str(err["loc"][0]).upper()
        lines.append(f"{key}={raw.get(key, '')!r} {_explain(err)}")
    return lines


def _explain(err: ErrorDetails) -> str:
    kind, ctx = err["type"], err.get("ctx", {})
    if kind == "literal_error":
        return "is not allowed: use one of " + str(ctx["expected"]).replace("'", "").replace(" or ", ", ")
    if kind == "string_pattern_mismatch":
        return f"is not valid: it must match {ctx['pattern']}"
    if kind == "int_parsing":
        return "is not a whole number: give one, e.g. 2"
    if kind == "float_parsing":
        return "is not a number: give one, e.g. 30"
    if kind == "bool_parsing":
        return "is not a boolean: use true or false"
    if kind == "greater_than_equal":
        return f"is too small: use at least {_bound(ctx['ge'])}"
    if kind == "less_than_equal":
        return f"is too large: use at most {_bound(ctx['le'])}"
    if kind == "value_error":  # a field validator's own words
        return re.sub(r"^Value error, ", "", err["msg"])
    if kind == "finite_number":
        return "is not a finite number: give one, e.g. 0.001"
    return f"is not valid: {err['msg']}"


def _bound(x: Any) -> Any:
    """A bound as a person writes it: 3600, not the 3600.0 a float field makes of it."""
    return int(x) if isinstance(x, float) and x.is_integer() else x


def redacted(cfg: Config) -> dict[str, Any]:
    """All values by KEY, secrets masked: what `config show` prints."""
    out: dict[str, Any] = {}
    for key, name in setting_keys().items():
        if name in Settings.model_fields:
            value = getattr(cfg.settings, name)
            if isinstance(value, SecretStr):
                value = "***" if value.get_secret_value() else ""
        else:
            value = getattr(cfg.training, name)
        out[key] = value
    return out


def derived(cfg: Config) -> dict[str, Any]:
    return {
        "gpus_per_node": cfg.gpus,
        "procs_per_node": cfg.procs_per_node,
        "world_size": cfg.world_size,
        "efa_per_node": cfg.efa_per_node,
        "image_uri": cfg.image_uri,
        "gpu": cfg.settings.instance.gpu,
        "gpu_memory_gib": cfg.settings.instance.gpu_memory_gib,
    }

"""The shapes and bounds setting values take, the environment's prefix rules and the sources a value
may have (pure): what the other settings modules share."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, cast

from fsdpctl.settings.storage import FSX_FIRST_GIB, FSX_STEP_GIB
from fsdpctl.targets import NAMES

# value shapes the settings accept
FSX_DNS = r"^(fs-[0-9a-f]{8,17}\.fsx\.[a-z]{2}(-gov)?-[a-z]+-\d\.amazonaws\.com(\.cn)?)?$"
AZ_LIST = r"^([a-z]{2}(-gov)?-[a-z]+-\d[a-z](,[a-z]{2}(-gov)?-[a-z]+-\d[a-z])*)?$"
EC2_TYPE = r"^[a-z0-9-]+\.[a-z0-9]+$"
REGISTRY = r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?(:[0-9]{1,5})?)?$"
IMAGE_TAG = r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$"
DNS_LABEL = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
VPC = r"^(vpc-[0-9a-f]{8,17})?$"
SUBNET_LIST = r"^(subnet-[0-9a-f]{8,17}(,subnet-[0-9a-f]{8,17})*)?$"
# A job's name is a DNS-1035 label (starts with a letter): the Training Operator's webhook refuses
# any other (pkg/webhooks/pytorch/pytorchjob_webhook.go: NameIsDNS1035Label), and the Services named
# after its pods are DNS-1035 labels too.
DNS_1035_LABEL = r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$"
# JOB_KIND's values (Settings.job_kind), which a job's recorded placement may name too
JobKind = Literal["pytorchjob", "trainjob"]
# The defaults of the keys the read verbs read without the model (fsdpctl.settings.reading):
# Settings declares its fields with these very values.
BACKEND_DEFAULT = "local"
JOB_NAME_DEFAULT = "fsdp"
# Every value travels to the trainer as an environment string `KEY=value`; Linux refuses execve with
# E2BIG for any one string over MAX_ARG_STRLEN (32 pages = 128 KiB: include/uapi/linux/binfmts.h).
# Half of that leaves room for the key and for the other values; anything longer is a paste gone
# wrong, not a setting.
MAX_VALUE_BYTES = 64 * 1024
TOKEN_FILE_HINT = "put the token (hf_...) alone in the file, or set HF_TOKEN"
# Whole numbers end up in C int64 fields (torch.manual_seed adds per-shard offsets to SEED and
# refuses beyond 2**64-1; Kubernetes int64 fields; timedelta(seconds=...) for the timeouts): one
# range for all, tighter ranges where the value has one of its own.
INT64_MAX = 2**63 - 1
TIMEDELTA_MAX_SECONDS = 999_999_999 * 86_400  # datetime.timedelta.max, in whole days
INT_MAX = {
    "METRICS_PORT": 65535,  # a TCP port (0: off)
    # torch's init_process_group(timeout=timedelta(...))
    "COLLECTIVE_TIMEOUT": TIMEDELTA_MAX_SECONDS,
    # torchrun's rendezvous join_timeout, a timedelta too
    "RDZV_JOIN_TIMEOUT": TIMEDELTA_MAX_SECONDS,
}
GATED_PREFIXES = ("meta-llama/",)
# keys whose value is a secret (masked by `redacted`, never written)
SECRET_KEYS = ("HF_TOKEN",)
# keys whose value is the path of a file holding a secret: the secret itself pasted there (one
# token-shaped word: redact.token_shaped) is refused, and masked wherever the value shows
PATH_KEYS = ("HF_TOKEN_FILE",)
# Keys the job derives itself rather than taking from the user.
TRAIN_KEYS_DERIVED = {"checkpoint_dir", "metrics_file"}
# The environment's settings: FSDPCTL_<KEY>. The plain names are the trainer's (pods get MODEL=,
# SEED=): in a user's shell they belong to something else, and are not read.
ENV_PREFIX = "FSDPCTL_"
# ...except these, which their own tools read by the plain name with the same meaning:
# huggingface_hub (HF_TOKEN), the AWS SDKs and CLI (AWS_REGION, AWS_PROFILE). FSDPCTL_<KEY> wins
# when both are set.
SHARED_ENV = ("HF_TOKEN", "AWS_REGION", "AWS_PROFILE")
# FSDPCTL_ variables that are fsdpctl's own, not settings (an unknown FSDPCTL_ variable is warned
# about): the state and .env paths, the offline mirrors, the local backend's switch and its process
# marks, and the test suite's switches (FSDPCTL_TEST_*, FSDPCTL_UPDATE_GOLDEN).
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
    "FSDPCTL_RDZV_HOST",  # a Slurm elastic job's batch script tells its tasks where the store is
)
OWN_ENV_PREFIXES = ("FSDPCTL_TEST_",)
# The source of a value the named model chose (fsdptrain.config.MODEL_DEFAULTS) because the user set
# none.
MODEL_DEFAULT = "model default"
CAPPED_DEFAULT = (
    "default, at most MAX_STEPS"  # WARMUP_STEPS of a run shorter than its default warmup
)
# The source of a value computed from other settings because the user set none (FSX_STORAGE_GIB:
# sized for what the job keeps on the volume, fsdpctl.plan.volume); .env.example leaves these keys
# commented out too.
DERIVED = "derived"
DERIVED_KEYS = ("FSX_STORAGE_GIB",)


# ---- shapes: what a value must look like where it goes, declared beside the setting (`_k(shape=...)`)


@dataclass(frozen=True)
class Shape:
    """A value's shape for its destination: `fits` says whether a value has it, `says` what is wrong
    when it has not, with the fix (it follows `KEY='value' `)."""

    fits: Callable[[Any], bool]
    says: str


def _no_option(value: str) -> bool:
    return not value.startswith("-")


def _one_line_name(value: str) -> bool:
    return value == value.strip() and value.isprintable()


def _profile_name(value: str) -> bool:
    return _one_line_name(value) and not any(c in value for c in "[]")


# The FSx for Lustre sizes of the SSD deployment types (SCRATCH_2, PERSISTENT_1, PERSISTENT_2):
# "1200 GiB, 2400 GiB, and increments of 2400 GiB" (FSx API Reference, CreateFileSystem,
# StorageCapacity: volume.FSX_FIRST_GIB, FSX_STEP_GIB), an Integer field (at most 2147483647)
FSX_MAX_GIB = (2**31 - 1) // FSX_STEP_GIB * FSX_STEP_GIB


def _fsx_size(value: int) -> bool:
    return value == FSX_FIRST_GIB or (value % FSX_STEP_GIB == 0 and 0 < value <= FSX_MAX_GIB)


SHAPES = {
    # a program srun or sbatch runs: a leading '-' would be read as one of their options
    # (`SLURM_PYTHON=--export` became `srun --export ...`)
    "program": Shape(
        _no_option,
        "starts with '-': srun would read it as an option, not a program; give the program's path, "
        "e.g. /fsx/venv/bin/python",
    ),
    # a profile is a section of the AWS config file (`[profile NAME]`, botocore/configloader.py
    # raw_config_parse through configparser): one line, no brackets, no spaces around it
    "profile": Shape(
        _profile_name,
        "is not a profile name: one line of printable characters with no brackets and no spaces "
        "around it (`aws configure list-profiles` lists them)",
    ),
    # a context is a name in the kubeconfig (`kubectl config get-contexts -o name`)
    "context": Shape(
        _one_line_name,
        "is not a context name: one line of printable characters with no spaces around it "
        "(`kubectl config get-contexts -o name` lists them)",
    ),
    "fsx_size": Shape(
        _fsx_size,
        f"is not a size FSx for Lustre takes: use {FSX_FIRST_GIB}, {FSX_STEP_GIB} or a multiple of "
        f"{FSX_STEP_GIB} up to {FSX_MAX_GIB} (GiB; SSD deployment types, CreateFileSystem "
        "StorageCapacity)",
    ),
}


def _k(default: Any, group: str, help: str, shape: str = "", **constraints: Any) -> Any:
    # pydantic here, not at the top: a reader of a few keys (settings.reading) imports this module
    from pydantic import Field

    extra: dict[str, Any] = {"group": group, **({"shape": shape} if shape else {})}
    return Field(
        default, description=help, json_schema_extra=cast("JsonDict", extra), **constraints
    )


# BACKEND's values: the registered places (fsdpctl.targets), checked as a Literal would be
if TYPE_CHECKING:
    from pydantic.config import JsonDict

    BackendName = str
else:
    BackendName = Literal[NAMES]

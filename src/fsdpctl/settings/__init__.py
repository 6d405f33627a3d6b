"""Settings: one typed object, loaded once, with the precedence flags > environment > .env >
defaults.

The environment is read only under the FSDPCTL_ prefix (FSDPCTL_MODEL; a stray SEED or MODEL= in a
shell is someone else's), except the few keys whose own tools read the plain name with the same
meaning (SHARED_ENV); .env is fsdpctl's own file and takes the plain names. Each value's source is
kept, and every error line names it (`.env line 3`, `environment FSDPCTL_SEED`, `--set`, `--model`).

Infrastructure keys (AWS, cluster, image, job) are declared here; training keys (MODEL,
SHARDING_STRATEGY, ...) are the trainer's own (`fsdptrain.config.TrainConfig`), so both read one
vocabulary and one validator. Pure: reads no file and no environment itself; `load()` is handed the
layers.
"""

from __future__ import annotations

from fsdpctl.settings.config import Config, parse_node_selector, parse_tolerations, setting_keys
from fsdpctl.settings.dotenv import (
    Dotenv,
    environment_settings,
    masked_line,
    parse_dotenv,
    secret_warnings,
    secrets_by_place,
)
from fsdpctl.settings.load import annotate, config_shown, derived, load, redacted, with_sources
from fsdpctl.settings.model import Settings
from fsdpctl.settings.placement import LOCAL_PROCS_PER_CORE, local_path, placement_problems
from fsdpctl.settings.rules import (
    AZ_LIST,
    CAPPED_DEFAULT,
    DERIVED,
    DERIVED_KEYS,
    DNS_1035_LABEL,
    DNS_LABEL,
    EC2_TYPE,
    ENV_PREFIX,
    FSX_DNS,
    GATED_PREFIXES,
    IMAGE_TAG,
    INT64_MAX,
    INT_MAX,
    MAX_VALUE_BYTES,
    MODEL_DEFAULT,
    OWN_ENV,
    OWN_ENV_PREFIXES,
    REGISTRY,
    SECRET_KEYS,
    SHARED_ENV,
    SUBNET_LIST,
    TIMEDELTA_MAX_SECONDS,
    TOKEN_FILE_HINT,
    TRAIN_KEYS_DERIVED,
    VPC,
    BackendName,
)

__all__ = [
    "AZ_LIST",
    "BackendName",
    "CAPPED_DEFAULT",
    "Config",
    "DERIVED",
    "DERIVED_KEYS",
    "DNS_1035_LABEL",
    "DNS_LABEL",
    "Dotenv",
    "EC2_TYPE",
    "ENV_PREFIX",
    "FSX_DNS",
    "GATED_PREFIXES",
    "IMAGE_TAG",
    "INT64_MAX",
    "INT_MAX",
    "LOCAL_PROCS_PER_CORE",
    "MAX_VALUE_BYTES",
    "MODEL_DEFAULT",
    "OWN_ENV",
    "OWN_ENV_PREFIXES",
    "REGISTRY",
    "SECRET_KEYS",
    "SHARED_ENV",
    "SUBNET_LIST",
    "Settings",
    "TIMEDELTA_MAX_SECONDS",
    "TOKEN_FILE_HINT",
    "TRAIN_KEYS_DERIVED",
    "VPC",
    "annotate",
    "config_shown",
    "derived",
    "environment_settings",
    "load",
    "local_path",
    "masked_line",
    "parse_dotenv",
    "parse_node_selector",
    "parse_tolerations",
    "placement_problems",
    "redacted",
    "secret_warnings",
    "secrets_by_place",
    "setting_keys",
    "with_sources",
]

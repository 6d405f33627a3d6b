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

Loaded lazily (PEP 562): a name is imported from its module the first time it is asked for, so a
command that reads a few keys (`job list`, `job status`: fsdpctl.settings.reading) imports neither
pydantic nor the model (docs/code-layout.md, "How commands load").
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fsdpctl.settings.config import Config, parse_node_selector, parse_tolerations, setting_keys
    from fsdpctl.settings.dotenv import (
        Dotenv,
        environment_settings,
        masked_line,
        parse_dotenv,
        secret_warnings,
        secrets_by_place,
    )
    from fsdpctl.settings.lines import with_sources
    from fsdpctl.settings.load import annotate, config_shown, derived, load, redacted
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

# name -> the module that defines it
_WHERE = {
    "Config": "fsdpctl.settings.config",
    "parse_node_selector": "fsdpctl.settings.config",
    "parse_tolerations": "fsdpctl.settings.config",
    "setting_keys": "fsdpctl.settings.config",
    "Dotenv": "fsdpctl.settings.dotenv",
    "environment_settings": "fsdpctl.settings.dotenv",
    "masked_line": "fsdpctl.settings.dotenv",
    "parse_dotenv": "fsdpctl.settings.dotenv",
    "secret_warnings": "fsdpctl.settings.dotenv",
    "secrets_by_place": "fsdpctl.settings.dotenv",
    "annotate": "fsdpctl.settings.load",
    "config_shown": "fsdpctl.settings.load",
    "derived": "fsdpctl.settings.load",
    "load": "fsdpctl.settings.load",
    "redacted": "fsdpctl.settings.load",
    "with_sources": "fsdpctl.settings.lines",
    "Settings": "fsdpctl.settings.model",
    "LOCAL_PROCS_PER_CORE": "fsdpctl.settings.placement",
    "local_path": "fsdpctl.settings.placement",
    "placement_problems": "fsdpctl.settings.placement",
    "AZ_LIST": "fsdpctl.settings.rules",
    "CAPPED_DEFAULT": "fsdpctl.settings.rules",
    "DERIVED": "fsdpctl.settings.rules",
    "DERIVED_KEYS": "fsdpctl.settings.rules",
    "DNS_1035_LABEL": "fsdpctl.settings.rules",
    "DNS_LABEL": "fsdpctl.settings.rules",
    "EC2_TYPE": "fsdpctl.settings.rules",
    "ENV_PREFIX": "fsdpctl.settings.rules",
    "FSX_DNS": "fsdpctl.settings.rules",
    "GATED_PREFIXES": "fsdpctl.settings.rules",
    "IMAGE_TAG": "fsdpctl.settings.rules",
    "INT64_MAX": "fsdpctl.settings.rules",
    "INT_MAX": "fsdpctl.settings.rules",
    "MAX_VALUE_BYTES": "fsdpctl.settings.rules",
    "MODEL_DEFAULT": "fsdpctl.settings.rules",
    "OWN_ENV": "fsdpctl.settings.rules",
    "OWN_ENV_PREFIXES": "fsdpctl.settings.rules",
    "REGISTRY": "fsdpctl.settings.rules",
    "SECRET_KEYS": "fsdpctl.settings.rules",
    "SHARED_ENV": "fsdpctl.settings.rules",
    "SUBNET_LIST": "fsdpctl.settings.rules",
    "TIMEDELTA_MAX_SECONDS": "fsdpctl.settings.rules",
    "TOKEN_FILE_HINT": "fsdpctl.settings.rules",
    "TRAIN_KEYS_DERIVED": "fsdpctl.settings.rules",
    "VPC": "fsdpctl.settings.rules",
    "BackendName": "fsdpctl.settings.rules",
}


class _Package(types.ModuleType):
    """The import system sets a submodule as its package's attribute once it has run it; the
    package's `load` is the function `load` of the module of that name (as it was when this file
    imported everything at once), not that module."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "load" and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_WHERE[name]), name)
    globals()[name] = value  # asked once
    return value


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

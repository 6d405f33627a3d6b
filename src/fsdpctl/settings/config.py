"""The loaded settings (pure): `Config`, the infrastructure keys of `Settings`
(fsdpctl.settings.model) with the training ones (fsdptrain.config.TrainConfig), their sources and
the numbers derived from them, as every command sees them; and the parsers and key table built on
the declaration."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from pydantic import ConfigDict, Field, SkipValidation

from fsdpctl.errors import BadInput
from fsdpctl.settings.model import Settings
from fsdpctl.settings.rules import MAX_VALUE_BYTES, TOKEN_FILE_HINT, TRAIN_KEYS_DERIVED
from fsdpctl.targets import Target, target
from fsdptrain.config import TrainConfig


class Config(Settings):
    """Settings + training values + derived numbers, as every command sees them. A subclass of
    Settings, so `cfg.job_name` is a typed field (no `__getattr__`); built by `load()` from
    already-validated parts."""

    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        arbitrary_types_allowed=True,
        allow_inf_nan=False,
        defer_build=True,
    )

    training: SkipValidation[TrainConfig] = Field(default_factory=TrainConfig)
    # KEY -> default | model default | <.env path> line N | environment FSDPCTL_<KEY> | --set |
    # --<option>
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
        return cls.model_construct(
            **values, training=training, sources=sources or {}, warnings=warnings
        )

    @property
    def settings(self) -> Settings:
        """The infrastructure settings alone (for hashing them without the training values)."""
        return Settings.model_construct(
            **{name: getattr(self, name) for name in Settings.model_fields}
        )

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
        """EFA interfaces each GPU node gets: all its instance type has (plan/instances.py), or
        none."""
        return self.instance.efa_interfaces if self.efa_enabled else 0

    @property
    def uses_efa(self) -> bool:
        """Whether the job's pods run NCCL over EFA: on the cluster, with EFA_ENABLED and an
        instance type that has interfaces. The one answer for the pod's EFA request, environment and
        security context, and for the warning when NCCL falls back to sockets."""
        return self.target.gpus and self.efa_per_node > 0

    @property
    def checkpoint_claim(self) -> str:
        """The claim that holds checkpoints: CHECKPOINT_PVC, else SHARED_VOLUME; '' means pod-local
        disks."""
        return self.checkpoint_pvc or self.shared_volume

    def ecr_registry(self, account: str) -> str:
        """The ECR registry host of `account` in AWS_REGION."""
        return f"{account}.dkr.ecr.{self.aws_region}.amazonaws.com"

    @property
    def registry(self) -> str:
        """IMAGE_REGISTRY, else the ECR of AWS_ACCOUNT_ID; '' when neither is set (then STS
        knows)."""
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
        """The token itself, for the Secret only. `read_file` is injected so this module stays free
        of I/O."""
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
        if (
            len(token) > MAX_VALUE_BYTES
            or not (token.isprintable() and token.isascii())
            or " " in token
        ):
            raise BadInput(
                f"{where} does not hold one token (printable, no spaces)", hint=TOKEN_FILE_HINT
            )
        return token

    def train_env(self) -> dict[str, str]:
        """The trainer's settings as environment variables (what the pod gets), all keys, stable
        order."""
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

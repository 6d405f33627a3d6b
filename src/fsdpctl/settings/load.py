"""Settings loaded (pure: `load()` is handed the layers): merged with the precedence flags >
environment > .env > defaults, validated, every error line naming where its value came from."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any, TypedDict

from pydantic import (
    SecretStr,
    ValidationError,
)
from pydantic_core import ErrorDetails

from fsdpctl.errors import SettingsError
from fsdpctl.redact import MASK, token_shaped
from fsdpctl.settings import storage
from fsdpctl.settings.checks import cross_checks
from fsdpctl.settings.config import Config, setting_keys
from fsdpctl.settings.dotenv import (
    dotenv_warnings,
    environment_settings,
    escaped,
    secret_warnings,
    unknown_hint,
)
from fsdpctl.settings.lines import dotenv_source, raw_problems, with_sources
from fsdpctl.settings.model import Settings
from fsdpctl.settings.rules import (
    CAPPED_DEFAULT,
    DERIVED,
    INT64_MAX,
    INT_MAX,
    MODEL_DEFAULT,
    PATH_KEYS,
)
from fsdptrain.config import (
    MODEL_DEFAULTS,
    ConfigError,
    TrainConfig,
    parse_value,
    with_model_defaults,
)


def load(
    *,
    dotenv: Mapping[str, str] | None = None,
    environ: Mapping[str, str] | None = None,
    flags: Mapping[str, str] | None = None,
    dotenv_name: str = ".env",
    set_by: Mapping[str, str] | None = None,
) -> Config:
    """Merge the layers (later wins) and validate everything; raises SettingsError listing every
    problem, each line naming where its value came from. `environ` is the process environment as it
    is (only FSDPCTL_<KEY> and SHARED_ENV are read from it); `set_by`: the command option that set a
    flag's key (default --set)."""
    keys = setting_keys()
    dotenv = {} if dotenv is None else dotenv
    raw: dict[str, str] = {}
    sources = {key: "default" for key in keys}
    warnings = dotenv_warnings(dotenv, keys, dotenv_name)
    env_values, env_sources, env_warnings = environment_settings(environ or {}, keys)
    warnings.extend(env_warnings)
    for key, value in dotenv.items():
        if key in keys:
            raw[key] = value
            sources[key] = dotenv_source(dotenv, key, dotenv_name)
    for key, value in env_values.items():
        raw[key], sources[key] = value, env_sources[key]
    for key, value in (flags or {}).items():
        if key not in keys:
            hint = unknown_hint(key, keys).removesuffix(": it is ignored")
            raise SettingsError([f"--set {escaped(key)}: unknown key{hint}"])
        raw[key], sources[key] = value, (set_by or {}).get(key, "--set")
    warnings.extend(secret_warnings(raw, sources))
    try:
        return _validate(raw, keys, sources, tuple(warnings))
    except SettingsError as e:
        shown = {key: (value, repr(value)) for key, value in raw.items()}
        raise SettingsError(
            with_sources(e.lines, shown, sources, raw.get("MODEL", "")), e.warnings
        ) from None


def config_shown(cfg: Config) -> dict[str, tuple[str, ...]]:
    """How lines built from a loaded Config may write each key's value (str, repr, a bool in lower
    case)."""
    values = redacted(cfg)
    return {key: (str(v), repr(v), str(v).lower()) for key, v in values.items()}


def annotate(lines: list[str], cfg: Config) -> list[str]:
    """`with_sources` for lines built from a loaded Config (placement and fit problems)."""
    return with_sources(lines, config_shown(cfg), cfg.sources, cfg.training.model)


def _validate(
    raw: dict[str, str], keys: dict[str, str], sources: dict[str, str], warnings: tuple[str, ...]
) -> Config:
    errors = raw_problems(raw)
    raw = {k: v for k, v in raw.items() if not any(line.startswith(k + "=") for line in errors)}
    infra = {keys[k]: v for k, v in raw.items() if keys[k] in Settings.model_fields}
    settings = None
    try:
        settings = Settings(**infra)
    except ValidationError as e:
        errors.extend(_pydantic_lines(e, raw))
        errors.extend(_across_the_rest(e, infra, raw, errors))
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
    train_values, defaulted = with_model_defaults(
        train_values
    )  # the named model's, where the user set none
    key_of = {name: key for key, name in keys.items()}
    named = (
        train_values.get("model", TrainConfig.model) in MODEL_DEFAULTS
    )  # else only the capped warmup
    sources.update({key_of[name]: MODEL_DEFAULT if named else CAPPED_DEFAULT for name in defaulted})
    training = TrainConfig(**train_values)  # values that failed to parse were reported above
    errors.extend(training.problems(check_paths=False))
    if errors or settings is None:  # settings is None only when its errors were listed
        raise SettingsError(errors, warnings)
    cfg = Config.of(settings, training, sources, warnings)
    if (
        "FSX_STORAGE_GIB" not in raw
    ):  # sized for what this job keeps on the volume (fsdpctl.plan.volume)
        sources["FSX_STORAGE_GIB"] = DERIVED
        sized = settings.model_copy(update={"fsx_storage_gib": storage.default_fsx_gib(cfg)})
        cfg = Config.of(sized, training, sources, warnings)
    errors = cross_checks(cfg)
    if errors:
        raise SettingsError(errors, warnings)
    return cfg


def _kind_problem(key: str, raw: str, value: Any) -> str | None:
    """The same rules by kind for the trainer's keys as Settings has for its own: a float is finite,
    a whole number within INT_MAX (else int64)."""
    if isinstance(value, float) and not math.isfinite(value):
        return f"{key}={raw!r} is not a finite number: give one, e.g. 0.001"
    if isinstance(value, int) and not isinstance(value, bool):
        most = INT_MAX.get(key, INT64_MAX)
        if value > most:
            return f"{key}={raw!r} is too large: use at most {most}"
    return None


def _across_the_rest(
    e: ValidationError, infra: dict[str, str], raw: dict[str, str], said: list[str]
) -> list[str]:
    """The checks across fields (Settings._instance_known) on the values that passed their own:
    pydantic skips them once a field fails, so `JOB_NODES=0` hid `IMAGE_TAG=latest`. The failed
    fields take their defaults for this look only; its lines are the ones not said already."""
    failed = {str(err["loc"][0]) for err in e.errors() if err["loc"]}
    if not failed:
        return []
    try:
        Settings(**{k: v for k, v in infra.items() if k not in failed})
    except ValidationError as again:
        names = {k.upper() for k in failed}  # a line about a failed key would judge its default
        return [
            x
            for x in _pydantic_lines(again, raw)
            if x not in said and not any(re.search(rf"\b{n}\b", x) for n in names)
        ]
    return []


def _pydantic_lines(e: ValidationError, raw: dict[str, str]) -> list[str]:
    lines = []
    for err in e.errors():
        if not err["loc"]:  # model-level checks already name their key, one line each
            lines += re.sub(r"^Value error, ", "", err["msg"]).split("\n")
            continue
        key = str(err["loc"][0]).upper()
        value = raw.get(key, "")
        # a secret by its place: the token pasted where a path goes is not quoted back
        shown = MASK if key in PATH_KEYS and token_shaped(value) else repr(value)
        lines.append(f"{key}={shown} {_explain(err)}")
    return lines


def _explain(err: ErrorDetails) -> str:
    kind, ctx = err["type"], err.get("ctx", {})
    if kind == "literal_error":
        return "is not allowed: use one of " + str(ctx["expected"]).replace("'", "").replace(
            " or ", ", "
        )
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


class Derived(TypedDict):
    """What the settings imply (`config show`: `derived`): the instance type's GPUs and the job's
    world."""

    gpus_per_node: int
    procs_per_node: int
    world_size: int
    efa_per_node: int
    image_uri: str
    gpu: str
    gpu_memory_gib: float


def derived(cfg: Config) -> Derived:
    return {
        "gpus_per_node": cfg.gpus,
        "procs_per_node": cfg.procs_per_node,
        "world_size": cfg.world_size,
        "efa_per_node": cfg.efa_per_node,
        "image_uri": cfg.image_uri,
        "gpu": cfg.settings.instance.gpu,
        "gpu_memory_gib": cfg.settings.instance.gpu_memory_gib,
    }

"""A few keys read without the model (pure): what `job list` and `job status` need to find a job
(BACKEND, JOB_NAME), read as `load()` reads them and checked as `Settings` checks them, without
importing pydantic or building the model (about a third of those verbs' CPU: docs/code-layout.md,
"How commands load").

The same layers with the same precedence (flags > environment FSDPCTL_<KEY> > .env > defaults), the
same defaults (rules.BACKEND_DEFAULT, rules.JOB_NAME_DEFAULT, which Settings declares its fields
with), the same checks (a Literal's values, a field's pattern, rules' size and NUL limits) and the
same error lines, each naming where its value came from. Like kubectl, which reads only the parts
of a kubeconfig a command uses, a verb that reads these keys does not look at the others: a bad
value of a key it does not read is for `config validate` and the verbs that use it.
`tests/test_settings_reading.py` holds this equal to `load()` on generated layers.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from fsdpctl.errors import SettingsError
from fsdpctl.settings.dotenv import environment_settings
from fsdpctl.settings.lines import dotenv_source, raw_problems, with_sources
from fsdpctl.settings.rules import BACKEND_DEFAULT, DNS_1035_LABEL, JOB_NAME_DEFAULT
from fsdpctl.targets import NAMES


@dataclass(frozen=True)
class Key:
    """How Settings declares a key read here: its default, and a Literal's values or a pattern."""

    default: str
    allowed: tuple[str, ...] = ()
    pattern: str = ""

    def problem(self, value: str) -> str | None:
        """What Settings says of a value that is not this key's (load._explain's words)."""
        if self.allowed and value not in self.allowed:
            return "is not allowed: use one of " + ", ".join(self.allowed)
        if self.pattern and re.fullmatch(self.pattern, value) is None:
            return f"is not valid: it must match {self.pattern}"
        return None


# in the order Settings declares them (its error lines come in that order)
KEYS = {
    "BACKEND": Key(BACKEND_DEFAULT, allowed=NAMES),
    "JOB_NAME": Key(JOB_NAME_DEFAULT, pattern=DNS_1035_LABEL),
}


def read(
    keys: Sequence[str],
    *,
    dotenv: Mapping[str, str],
    environ: Mapping[str, str],
    flags: Mapping[str, str],
    dotenv_name: str = ".env",
) -> dict[str, str]:
    """KEY -> value of each of `keys` (of KEYS); raises SettingsError with load()'s line for each
    bad one, naming where it came from. `flags` holds only keys of `keys` (the caller loads the
    whole settings for any other: a --set of an unknown or unread key is checked there)."""
    raw, sources = _layers(keys, dotenv, environ, flags, dotenv_name)
    errors = raw_problems(raw)
    said = {line.split("=", 1)[0] for line in errors}
    values = {key: KEYS[key].default for key in keys}
    for key in (k for k in KEYS if k in keys):
        if key not in raw or key in said:  # unset, or its size or NUL said already
            continue
        problem = KEYS[key].problem(raw[key])
        if problem:
            errors.append(f"{key}={raw[key]!r} {problem}")
        values[key] = raw[key]
    if errors:
        shown = {key: (value, repr(value)) for key, value in raw.items()}
        raise SettingsError(with_sources(errors, shown, sources, ""))
    return values


def _layers(
    keys: Sequence[str],
    dotenv: Mapping[str, str],
    environ: Mapping[str, str],
    flags: Mapping[str, str],
    dotenv_name: str,
) -> tuple[dict[str, str], dict[str, str]]:
    """The raw values of `keys` and where each came from, later layers winning (as load() merges
    them, in the same order)."""
    raw: dict[str, str] = {}
    sources: dict[str, str] = {}
    for key, value in dotenv.items():
        if key in keys:
            raw[key], sources[key] = value, dotenv_source(dotenv, key, dotenv_name)
    env_values, env_sources, _ = environment_settings(environ, {k: k.lower() for k in keys})
    for key, value in env_values.items():
        if key in keys:  # (SHARED_ENV's plain names come whatever was asked)
            raw[key], sources[key] = value, env_sources[key]
    for key, value in flags.items():
        raw[key], sources[key] = value, "--set"
    return raw, sources

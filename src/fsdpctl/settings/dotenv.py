"""Where values come from (pure): .env parsing, the FSDPCTL_ prefix of the environment, and the
warnings about a key that is none or a secret in a plain one."""

from __future__ import annotations

import difflib
import io
import re
from collections.abc import Mapping

from fsdpctl.errors import SettingsError
from fsdpctl.redact import MASK, SECRET_ENV, redact, secret_kind
from fsdpctl.settings.rules import ENV_PREFIX, OWN_ENV, OWN_ENV_PREFIXES, SECRET_KEYS, SHARED_ENV


class Dotenv(dict[str, str]):
    """A .env file's KEY -> value, with the line each key was last set on (`lines`): errors name it."""

    def __init__(
        self, values: Mapping[str, str] | None = None, lines: Mapping[str, int] | None = None
    ) -> None:
        super().__init__(values or {})
        self.lines = dict(lines or {})


def parse_dotenv(text: str, origin: str = ".env") -> Dotenv:
    """KEY=VALUE lines (python-dotenv's grammar); a line it cannot parse is an error, not a silent
    skip."""
    from dotenv.parser import parse_stream

    values, bad = Dotenv(), []
    for binding in parse_stream(io.StringIO(text)):
        # python-dotenv's Binding.original.line is where the binding's text starts, blank lines
        # before its key included (dotenv/parser.py parse_binding reads leading whitespace into the
        # binding)
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
    """A .env line (or --set) as an error may quote it: secret-shaped values masked, and everything
    after a secret's own name, whatever separates them (HF_TOKEN="abc... with its quote unclosed,
    `HF_TOKEN abc`, `HF_TOKEN:abc`: the value has no shape to recognise, its place says it)."""
    m = _LEADING_KEY.match(line)
    if (
        m
        and m.group(1).removeprefix(ENV_PREFIX) in (*SECRET_ENV, *SECRET_KEYS)
        and line[m.end() :].strip()
    ):
        return f"{line[: m.end()]} {MASK}"
    return redact(line)


def masked_line(line: str) -> str:
    return _masked_line(line)


def _shown_key(key: str) -> str:
    """A .env key as a warning may name it: python-dotenv takes `HF_TOKEN:abc` (no `=`) as a key
    with no value, so a key that is not a name shows only up to where it stops being one."""
    if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.\-]*", key):
        return key
    m = _LEADING_KEY.match(key)
    head = m.group(1) if m else ""
    return f"{head}... ({len(key) - len(head)} more characters, not a name)"


def secret_warnings(raw: Mapping[str, str], sources: Mapping[str, str]) -> list[str]:
    """A token pasted into a key that is not secret (TOKENIZER, IMAGE_TAG, DATASET_SPLIT), or a URL
    with a password (DATASET=https://user:pass@host/...), would reach the manifests and the pods'
    environment in clear: every output masks it, and this warning names the key. HF_TOKEN and
    HF_TOKEN_FILE both set: the file is never read, and this says so (which one wins)."""
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


def dotenv_warnings(dotenv: Mapping[str, str], keys: Mapping[str, str], name: str) -> list[str]:
    """A key of .env that is no setting: named with its line and the key it was likely meant to be
    (the plain name, for a FSDPCTL_<KEY> copied from the environment's spelling)."""
    warnings, lines = [], getattr(dotenv, "lines", {})
    for key in dotenv:
        if key in keys:
            continue
        where = f"{name} line {lines[key]}" if key in lines else name
        plain = key.removeprefix(ENV_PREFIX)
        if (
            _shown_key(key) != key
        ):  # `HF_TOKEN:value`, `HF_TOKEN value`: the value must not be echoed
            head = _shown_key(key).split("...")[0]
            hint = (
                f": write {head}=VALUE"
                if head.removeprefix(ENV_PREFIX) in keys
                else ": it is ignored"
            )
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
    """The settings the process environment gives: KEY -> value and KEY -> source (`environment
    VAR`), read from FSDPCTL_<KEY> and, for SHARED_ENV, the plain name (FSDPCTL_<KEY> wins); and a
    warning for each FSDPCTL_ variable that is neither a setting nor fsdpctl's own (OWN_ENV), with
    the name it may mean."""
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

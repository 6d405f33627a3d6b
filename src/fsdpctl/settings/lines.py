"""The lines every reader of the settings writes (pure): where a value came from, what no value of
any key may be, and each error line annotated with its value's source. Shared by the full load
(fsdpctl.settings.load) and the read verbs' reader of a few keys (fsdpctl.settings.reading), so both
say the same thing in the same words; no pydantic here."""

from __future__ import annotations

import re
from collections.abc import Mapping

from fsdpctl.settings.rules import DERIVED, MAX_VALUE_BYTES, MODEL_DEFAULT


def dotenv_source(dotenv: Mapping[str, str], key: str, name: str) -> str:
    """Where `key` of a settings file was set: its file and line (`.env line 3`)."""
    where = getattr(dotenv, "where", None)
    if where:
        return str(where(key, name))
    lines = getattr(dotenv, "lines", {})
    return f"{name} line {lines[key]}" if key in lines else name


def raw_problems(raw: Mapping[str, str]) -> list[str]:
    """What no value of any key may be, before its kind is looked at: longer than MAX_VALUE_BYTES
    (the line names the size, not the value), or holding a NUL byte (no environment string can carry
    one: execve ends it there)."""
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


def with_sources(
    lines: list[str], shown: Mapping[str, tuple[str, ...]], sources: Mapping[str, str], model: str
) -> list[str]:
    """Error lines with where each named value came from, after the value: `SEED='abc' (environment
    FSDPCTL_SEED) is not ...`. The key a line starts with is its subject, so it is always annotated;
    a key named further on only where the text after its `=` is its value as given (one of
    `shown[key]`), so a suggested fix (`set JOB_NODES=2`) is not. A default (a model's too) is named
    only as the subject: a line about a value nobody set says so (`WARMUP_STEPS=5 (default) exceeds
    ...`)."""
    return [_with_sources(line, shown, sources, model) for line in lines]


# KEY= where KEY is a whole word (not the tail of another key, nor inside a path)
_KEY_AT = re.compile(r"(?<![A-Za-z0-9_/.-])([A-Z][A-Z0-9_]*)=")
# a value as the lines write it: a Python repr of a string, a <size>, or a run up to a space or a
# parenthesis
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
        where = {
            MODEL_DEFAULT: f"model default for {model}",
            DERIVED: f"derived for MODEL={model}",
        }.get(source, source)
        out.append(line[at:end] + f" ({where})")
        at = end
    return "".join(out) + line[at:]

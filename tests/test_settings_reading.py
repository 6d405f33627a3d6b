"""The read verbs' reader of a few keys (fsdpctl.settings.reading) against the whole load
(fsdpctl.settings.load, pydantic's Settings): for generated .env / environment / flag layers, the
same value of every key it reads, and the same refusal line (value, source, fix) for a bad one.

Peer: the model itself, `load()` as every other command runs it (pydantic 2's validation of
Settings: a Literal's values, a field's `pattern`, pydantic-core's regex); the reader imports none of
it. What differs by design, and is asserted as such: the reader does not look at keys it does not
read (a bad JOB_NODES is for `config validate`), and so not at the checks across keys either
(JOB_NAME too long for JOB_NODES' pod names, settings.checks).
"""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fsdpctl.errors import ExitCode, SettingsError
from fsdpctl.settings import Settings, load, parse_dotenv, reading
from fsdpctl.targets import NAMES

KEYS = tuple(reading.KEYS)
# values near the edges of each key's rules, and any text
VALUES = st.one_of(
    st.sampled_from(
        [
            *NAMES,
            "Local",
            " eks",
            "fsdp",
            "a",
            "a-",
            "-a",
            "1job",
            "job-1",
            "x" * 63,
            "x" * 64,
            "fsdp\n",
            "",
            "a\x00b",
            "é",
        ]
    ),
    st.text(st.characters(blacklist_categories=("Cs",)), max_size=70),
    st.from_regex(r"[a-z][-a-z0-9]{0,62}", fullmatch=True),
)
LAYER = st.dictionaries(st.sampled_from(KEYS), VALUES, max_size=2)
# a key the reader does not read, good or bad: never its business
OTHER = st.dictionaries(
    st.sampled_from(["JOB_NODES", "MODEL", "IMAGE_TAG"]),
    st.sampled_from(["0", "2", "7b", "latest", "v1", "nonsense"]),
    max_size=2,
)
CROSS = "is too long for JOB_NODES"  # settings.checks: the pods' names, from JOB_NAME and JOB_NODES


def _dotenv(values: dict[str, str]) -> dict[str, str]:
    """A parsed .env (sources `.env line N`) where its lines can hold the values, else the mapping
    itself (source `.env`)."""
    if all(re.fullmatch(r"[A-Za-z0-9_.-]*", v) for v in values.values()):
        return parse_dotenv("".join(f"{k}={v}\n" for k, v in values.items()))
    return values


def _both(
    dotenv: dict[str, str], environ: dict[str, str], flags: dict[str, str]
) -> tuple[dict[str, str] | list[str], object]:
    """What the reader gives (values or error lines), and what load() gives (a Config or lines)."""
    try:
        light: dict[str, str] | list[str] = reading.read(
            KEYS, dotenv=dotenv, environ=environ, flags=flags
        )
    except SettingsError as e:
        light = e.lines
    try:
        full: object = load(dotenv=dotenv, environ=environ, flags=flags)
    except SettingsError as e:
        full = e.lines
    return light, full


@settings(max_examples=80, derandomize=True, deadline=None)
@given(dotenv=LAYER, env=LAYER, flags=LAYER, other=OTHER, where=st.sampled_from(["env", ".env"]))
def test_the_reader_agrees_with_the_whole_load(
    dotenv: dict[str, str],
    env: dict[str, str],
    flags: dict[str, str],
    other: dict[str, str],
    where: str,
) -> None:
    """Every key it reads has load()'s value, with the same precedence (flags > FSDPCTL_<KEY> >
    .env > default); a bad one is refused with load()'s very line (its value, where it came from,
    the fix). Keys it does not read (`other`, in .env or the environment) change nothing of it."""
    environ = {f"FSDPCTL_{k}": v for k, v in env.items()}
    file = {**dotenv}
    if where == "env":
        environ.update({f"FSDPCTL_{k}": v for k, v in other.items()})
    else:
        file.update(other)
    light, full = _both(_dotenv(file), environ, flags)
    if isinstance(full, Settings):
        assert light == {k: getattr(full, k.lower()) for k in KEYS}
        return
    assert isinstance(full, list)
    mine = [line for line in full if line.startswith(tuple(f"{k}=" for k in KEYS))]
    if isinstance(light, dict):  # its keys are good: load() refused something else
        assert all(CROSS in line for line in mine), mine
        return
    assert light == [line for line in mine if CROSS not in line]


def test_its_keys_are_the_models() -> None:
    """One declaration: each key it reads has the model's default, and the model's Literal values
    or pattern (Settings' field info)."""
    for key, rule in reading.KEYS.items():
        field = Settings.model_fields[key.lower()]
        assert field.default == rule.default
        patterns = [m.pattern for m in field.metadata if hasattr(m, "pattern")]
        assert patterns == ([rule.pattern] if rule.pattern else [])
        if rule.allowed:
            assert Settings.model_fields[key.lower()].annotation.__args__ == rule.allowed


@pytest.mark.parametrize(
    ("setting", "verb", "code"),
    [
        # a key it reads, bad: the line names it, its value, where it came from and the fix
        ("BACKEND=nowhere", ("job", "list"), ExitCode.BAD_INPUT),
        ("BACKEND=nowhere", ("job", "status", "x"), ExitCode.BAD_INPUT),
        ("JOB_NAME=Bad_Name", ("job", "status"), ExitCode.BAD_INPUT),
        # a key it does not read: not its business (kubectl reads only what it uses)
        ("JOB_NODES=0", ("job", "list"), ExitCode.OK),
        ("JOB_NODES=0", ("job", "status", "x"), ExitCode.JOB_NOT_FOUND),
    ],
)
def test_a_read_verb_refuses_a_bad_key_it_reads_and_only_those(cli, setting, verb, code) -> None:
    """Through the CLI: a bad BACKEND or JOB_NAME in .env is refused with load()'s line naming
    `.env line 1` (exit 2), whatever else is set; a bad key the verb does not read is not."""
    (cli.cwd / ".env").write_text(setting + "\n")
    r = cli(*verb)
    assert r.exit_code == code, r.output
    if code == ExitCode.BAD_INPUT:
        key, value = setting.split("=")
        assert f"{key}={value!r} (.env line 1) is not" in r.said
        assert "Traceback" not in r.output


def test_a_set_of_a_key_it_does_not_read_is_checked_as_ever(cli) -> None:
    """--set is a word of this command line: a key the verb does not read is still checked (the
    whole settings are loaded for it), an unknown one refused."""
    r = cli("--set", "JOB_NODES=0", "job", "list")
    assert r.exit_code == ExitCode.BAD_INPUT and "JOB_NODES='0' (--set) is too small" in r.said
    r = cli("--set", "NO_SUCH_KEY=1", "job", "status", "x")
    assert r.exit_code == ExitCode.BAD_INPUT and "unknown key" in r.said

"""Settings from the environment only as FSDPCTL_<KEY> (issue 16): a stray SEED=abc or MODEL= in a
shell is another program's and changes no command; FSDPCTL_<KEY> is read, below flags and above
.env; HF_TOKEN, AWS_REGION and AWS_PROFILE are read plain too, as huggingface_hub (HF_TOKEN:
huggingface_hub/constants.py, `os.environ.get("HF_TOKEN")`) and the AWS SDKs and CLI (AWS_REGION,
AWS_PROFILE: the AWS SDKs and Tools Reference Guide, "Environment variables support") read them, the
prefixed form winning. Every value's source is exact (`.env line N`, `environment FSDPCTL_SEED`,
`--set`, the command option) and every error line names it. Through the real CLI (the `cli` fixture)
and tests/invariants.py, plus the pure parts (parse_dotenv's line numbers, the local backend's
launch environment)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import ROOT
from fsdpctl.settings import OWN_ENV, OWN_ENV_PREFIXES, SHARED_ENV, load, parse_dotenv, setting_keys

sys.path.insert(0, str(Path(__file__).parent))
from invariants import check_outcome, snapshot  # noqa: E402
from test_bad_input import CASES, EXTRA  # noqa: E402

KEYS = sorted(setting_keys())
PLAIN_IGNORED = [k for k in KEYS if k not in SHARED_ENV]  # plain names fsdpctl must not read
GARBAGE = ("abc", "", "-1", "nan", "1e400", " ", "-", "0x10", "true", "None", "x" * 300, "${HOME}")
COMMANDS = (("config", "show", "-o", "json"), ("plan", "-o", "json"), ("job", "list", "-o", "json"))


def _outputs(cli) -> list[tuple[int, str, str]]:
    return [(r.exit_code, r.stdout, r.stderr) for r in (cli(*args) for args in COMMANDS)]


# ---- a stray plain name changes nothing --------------------------------------------------------------------


def test_garbage_in_every_plain_name_changes_no_command(cli, monkeypatch):
    """Every setting's plain name set at once to garbage ('abc', '', '-1', 'nan', ...): config show,
    plan and job list exit 0 and print exactly what they print without it (stderr too: not even a
    warning)."""
    clean = _outputs(cli)
    assert [code for code, _, _ in clean] == [0, 0, 0], clean
    for i, key in enumerate(PLAIN_IGNORED):
        monkeypatch.setenv(key, GARBAGE[i % len(GARBAGE)])
    assert _outputs(cli) == clean


@settings(
    max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(stray=st.dictionaries(st.sampled_from(PLAIN_IGNORED), st.sampled_from(GARBAGE), min_size=1))
def test_any_sample_of_stray_plain_names_changes_nothing(cli, monkeypatch, stray):
    clean = cli("config", "show", "-o", "json")
    with monkeypatch.context() as m:
        for key, value in stray.items():
            m.setenv(key, value)
        shown = cli("config", "show", "-o", "json")
    assert (shown.exit_code, shown.stdout, shown.stderr) == (0, clean.stdout, "")


def test_a_local_jobs_trainer_gets_the_jobs_values_not_the_shells(cli, tmp_path):
    """The local backend runs a pod's command with this machine's environment under the container's:
    as in a pod, every key the trainer reads (fsdptrain.config.TrainConfig's env names) is the
    container's only. A stray SEED=abc or MODEL= cannot reach a trainer, nor METRICS_FILE, which the
    container does not set."""
    from fsdpctl.backends.local import engine as local
    from fsdpctl.job import render
    from fsdptrain.config import TrainConfig

    cfg = load()
    spec = local.spec_from_job(render.render_job(cfg, "r1")[-1], tmp_path)
    trainer_keys = {f.metadata["env"] for f in __import__("dataclasses").fields(TrainConfig)}
    shell = {key: "abc" for key in trainer_keys} | {
        "MODEL": "",
        "PATH": "/usr/bin",
        "LANG": "C.UTF-8",
    }
    for launch in local.launches(spec, "127.0.0.1:1", shell):
        container = local.mapped_env(
            spec, launch.node
        )  # the container's, its volume paths mapped here
        for key in trainer_keys:
            assert launch.env.get(key) == container.get(key) and launch.env.get(key) != "abc", key
        assert launch.env["SEED"] == cfg.train_env()["SEED"] and launch.env["MODEL"] == "tiny"
        assert "METRICS_FILE" not in launch.env
        assert (launch.env["PATH"], launch.env["LANG"]) == (
            "/usr/bin",
            "C.UTF-8",
        )  # the rest passes


# ---- the prefixed form is read, and its bad value named ----------------------------------------------------


def test_every_key_is_read_under_its_prefix(cli, monkeypatch):
    """FSDPCTL_<KEY> for every key at once, each at a valid value (.env.example's): config show
    reports the value and `environment FSDPCTL_<KEY>` as its source."""
    values = parse_dotenv((ROOT / ".env.example").read_text())
    defaults = json.loads(cli("config", "show", "-o", "json").stdout)["settings"]
    for key in KEYS:
        monkeypatch.setenv(f"FSDPCTL_{key}", values.get(key, str(defaults[key])))
    r = cli("config", "show", "-o", "json")
    assert (r.exit_code, r.stderr) == (0, ""), r.output
    shown = json.loads(r.stdout)
    assert shown["sources"] == {key: f"environment FSDPCTL_{key}" for key in KEYS}
    assert shown["settings"] == defaults


def _first_bad_value() -> dict[str, str]:
    first: dict[str, str] = {}
    for key, value, _, _ in CASES:
        first.setdefault(key, value)
    return first


def test_a_bad_value_of_every_key_under_its_prefix_is_named_by_its_variable(cli, monkeypatch):
    """A bad FSDPCTL_<KEY> for every key (tests/test_bad_input.py's first case; a value over the
    size limit for free-text keys), all at once: exit 2, and each key has exactly one error line,
    which names its variable right after the value. Keys whose check needs the others valid
    (model-level checks) run alone."""
    bad = _first_bad_value()
    values = {key: bad.get(key, "a" * (64 * 1024 + 1)) for key in KEYS}
    for key, value in values.items():
        monkeypatch.setenv(f"FSDPCTL_{key}", value)
    r = cli("config", "validate")
    assert r.exit_code == 2
    errors = [line for line in r.stderr.splitlines() if line.startswith("error: ")]
    named = {key: [e for e in errors if f"(environment FSDPCTL_{key})" in e] for key in KEYS}
    assert all(e.startswith("error: ") and "(environment FSDPCTL_" in e for e in errors), errors
    alone = [key for key, lines in named.items() if not lines]
    assert all(len(lines) <= 1 for lines in named.values()), named
    assert len(alone) <= 3, alone  # the few checks that only run on otherwise valid settings
    for key in alone:
        monkeypatch.delenv(f"FSDPCTL_{key}")
    for key in alone:
        with monkeypatch.context() as m:
            for other in KEYS:
                m.delenv(f"FSDPCTL_{other}", raising=False)
            m.setenv(f"FSDPCTL_{key}", values[key])
            r = cli("config", "validate")
        [line] = [ln for ln in r.stderr.splitlines() if ln.startswith("error: ")]
        assert r.exit_code == 2 and f"{key}=" in line and f"(environment FSDPCTL_{key})" in line, (
            line
        )


SAMPLE = [case for case in CASES if case[0] in set(KEYS[::9])]


@pytest.mark.parametrize(
    "key, value, fix",
    [(k, v, f) for k, v, _, f in SAMPLE],
    ids=[f"{k}={v!r}" for k, v, _, _ in SAMPLE],
)
def test_a_bad_prefixed_value_is_one_line_naming_the_variable(
    cli, tmp_path, monkeypatch, key, value, fix
):
    """A sample of test_bad_input's cases through the environment: one line, exit 2, nothing
    written, the line names `KEY=value (environment FSDPCTL_KEY)` and ends with the same fix as from
    .env."""
    (tmp_path / ".env").write_text(EXTRA.get(key, ""))
    monkeypatch.setenv(f"FSDPCTL_{key}", value)
    before = snapshot(tmp_path)
    r = cli("manifest", "--out-dir", "out")
    after = snapshot(tmp_path)
    check_outcome(r, written_before=before, written_after=after, names=(key,), allowed_codes=(2,))
    [line] = [ln for ln in r.stderr.splitlines() if ln.startswith("error: ")]
    assert f"(environment FSDPCTL_{key})" in line and line.endswith(fix), line


# ---- precedence, with the source named from each layer -----------------------------------------------------

# per key: distinct valid values, one per layer (a key with two allowed values gets two layers), and
# a bad one
LAYERED = {
    "SEED": (("7", "8", "9"), "abc"),
    "MAX_STEPS": (("40", "50", "60"), "-1"),
    "JOB_NODES": (("1", "3", "4"), "0"),
    "MODEL": (("7b", "13b", "70b"), "gpt"),
    "LR": (("0.1", "0.2", "0.3"), "nan"),
    "JOB_NAME": (("a", "b", "c"), "A_B"),
    "TOKENIZER": (("t1", "t2", "t3"), "x" * (64 * 1024 + 1)),
    "BACKEND": (("eks", "local"), "gpu"),
    "EFA_ENABLED": (("false", "true"), "maybe"),
    "RDZV_BACKEND": (("etcd", "etcd-v2", "c10d"), "zk"),
    "AWS_REGION": (("eu-west-1", "us-east-1", "ap-south-1"), "mars"),
}
LAYERS = ("dotenv", "env", "flag")


def _dotenv(key: str, value: str, pad: int) -> tuple[str, int]:
    """A .env with `pad` lines of comments and blanks around the key's line, and that line's number."""
    before = ["# settings", "", "export JOB_NAMESPACE=team", "  ", "#KEY=old"][:pad]
    return "\n".join([*before, f"export {key}={value}  # the value", "", "# end"]) + "\n", len(
        before
    ) + 1


@settings(
    max_examples=16, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    key=st.sampled_from(sorted(LAYERED)),
    layers=st.sets(st.sampled_from(LAYERS)),
    bad=st.sampled_from(LAYERS + (None,)),
    pad=st.integers(0, 5),
)
def test_flag_over_environment_over_dotenv_over_default(cli, monkeypatch, key, layers, bad, pad):
    """Any key, any subset of layers, each with its own value (one of them, or none, bad): the
    highest layer set wins and is the source config show names; a bad value only matters where it
    wins, and then its error line names that layer exactly (`--set`, `environment FSDPCTL_KEY`,
    `.env line N`). A garbage plain-named variable beside it never counts."""
    goods, bad_value = LAYERED[key]
    used = [layer for layer in LAYERS if layer in layers][: len(goods)]
    value = {layer: bad_value if layer == bad else goods[i] for i, layer in enumerate(used)}
    env_file, args = cli.cwd / ".env", []
    env_file.unlink(missing_ok=True)
    source = {"flag": "--set", "env": f"environment FSDPCTL_{key}", "dotenv": ""}
    with monkeypatch.context() as m:
        m.setenv(key, "garbage") if key not in SHARED_ENV else None
        if "dotenv" in value:
            text, line = _dotenv(key, value["dotenv"], pad)
            env_file.write_text(text)
            source["dotenv"] = f".env line {line}"
        if "env" in value:
            m.setenv(f"FSDPCTL_{key}", value["env"])
        if "flag" in value:
            args = ["--set", f"{key}={value['flag']}"]
        r = cli(*args, "config", "show", "-o", "json")
    top = used[-1] if used else None
    if top is not None and top == bad:
        errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error: ")]
        assert r.exit_code == 2 and len(errors) == 1, r.output
        assert errors[0].startswith(f"error: {key}=") and f"({source[top]})" in errors[0], errors[0]
        return
    assert r.exit_code == 0, r.output
    shown = json.loads(r.stdout)
    if top is None:
        assert shown["sources"][key] == "default"
    else:
        assert shown["sources"][key] == source[top]
        assert str(shown["settings"][key]).lower() == str(
            float(value[top]) if key == "LR" else value[top]
        )


@settings(max_examples=60, deadline=None)
@given(
    entries=st.lists(
        st.one_of(
            st.just(("blank",)),
            st.just(("comment",)),
            st.tuples(
                st.just("kv"),
                st.sampled_from(["SEED", "MODEL", "LR", "JOB_NAME"]),
                st.from_regex(r"[a-z0-9.]{0,6}", fullmatch=True),
                st.sampled_from(
                    ["plain", "export", "spaced", "single", "double", "comment", "multiline"]
                ),
            ),
        ),
        max_size=12,
    )
)
def test_dotenv_line_numbers_for_generated_files(entries):
    """parse_dotenv keeps the line each key was last set on, through blank lines, comments,
    `export`, spaces around `=`, quotes, inline comments and quoted values over several lines
    (python-dotenv's grammar)."""
    lines: list[str] = []
    want: dict[str, tuple[str, int]] = {}
    for entry in entries:
        if entry[0] == "blank":
            lines.append("")
        elif entry[0] == "comment":
            lines.append("# MODEL=not-this")
        else:
            _, key, value, style = entry
            written = {
                "plain": f"{key}={value}",
                "export": f"export {key}={value}",
                "spaced": f"  {key} = {value}",
                "single": f"{key}='{value}'",
                "double": f'{key}="{value}"',
                "comment": f"{key}={value} # note",
                "multiline": f'{key}="{value}\nmore"',
            }[style]
            want[key] = (value + ("\nmore" if style == "multiline" else ""), len(lines) + 1)
            lines.extend(written.split("\n"))
    parsed = parse_dotenv("\n".join(lines) + "\n")
    assert dict(parsed) == {key: value for key, (value, _) in want.items()}
    assert parsed.lines == {key: line for key, (_, line) in want.items()}


def test_the_env_file_is_named_as_given(cli, tmp_path):
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "prod.env").write_text("# prod\n\nSEED=5\nJOB_NODES=abc\n")
    r = cli("--env-file", "conf/prod.env", "config", "show")
    assert r.exit_code == 2
    assert r.stderr.splitlines() == [
        "error: JOB_NODES='abc' (conf/prod.env line 4) is not a whole number: give one, e.g. 2"
    ]
    (conf / "prod.env").write_text("# prod\n\nSEED=5\n")
    shown = json.loads(cli("--env-file", "conf/prod.env", "config", "show", "-o", "json").stdout)
    assert shown["sources"]["SEED"] == "conf/prod.env line 3"


# ---- HF_TOKEN, AWS_REGION, AWS_PROFILE: their tools' names, read plain too ---------------------------------

TOKEN = "hf_abcdefghijklmnopqrstuvwxyz0123456789"


@pytest.mark.parametrize(
    "key, plain, prefixed",
    [
        ("HF_TOKEN", TOKEN, TOKEN.replace("a", "b")),
        ("AWS_REGION", "eu-west-1", "ap-south-1"),
        ("AWS_PROFILE", "ml", "research"),
    ],
)
def test_the_shared_names_are_read_plain_and_the_prefix_wins(
    cli, monkeypatch, key, plain, prefixed
):
    monkeypatch.setenv(key, plain)
    shown = json.loads(cli("config", "show", "-o", "json").stdout)
    assert shown["sources"][key] == f"environment {key}"
    monkeypatch.setenv(f"FSDPCTL_{key}", prefixed)
    r = cli("config", "show", "-o", "json")
    shown = json.loads(r.stdout)
    assert shown["sources"][key] == f"environment FSDPCTL_{key}"
    if key == "HF_TOKEN":  # masked, whichever name it came by
        assert shown["settings"][key] == "***"
        assert TOKEN[:10] not in r.output and prefixed[:10] not in r.output
    else:
        assert shown["settings"][key] == prefixed


def test_a_bad_shared_value_names_the_plain_variable(cli, monkeypatch):
    monkeypatch.setenv("AWS_REGION", "mars")
    r = cli("config", "validate")
    assert r.exit_code == 2
    assert r.stderr.startswith(
        "error: AWS_REGION='mars' (environment AWS_REGION) is not valid: it must"
    )
    monkeypatch.setenv(
        "FSDPCTL_AWS_REGION", "us-east-1"
    )  # the prefixed one wins: the plain one is moot
    assert cli("config", "validate").exit_code == 0


# ---- unknown FSDPCTL_ variables, FSDPCTL_ keys in .env -----------------------------------------------------


def test_an_unknown_prefixed_variable_warns_with_the_name_it_may_mean(cli, monkeypatch):
    monkeypatch.setenv("FSDPCTL_MODLE", "7b")
    monkeypatch.setenv("FSDPCTL_ENV_FILES", "x")
    for var in OWN_ENV:  # fsdpctl's own variables are no settings and no mistakes
        if var not in ("FSDPCTL_HOME", "FSDPCTL_ENV_FILE"):
            monkeypatch.setenv(var, "0")
    monkeypatch.setenv("FSDPCTL_TEST_ANYTHING", "1")
    r = cli("config", "show", "-o", "json")
    assert r.exit_code == 0
    assert r.stderr.splitlines() == [
        "warning: environment: unknown variable FSDPCTL_ENV_FILES: did you mean FSDPCTL_ENV_FILE?",
        "warning: environment: unknown variable FSDPCTL_MODLE: did you mean FSDPCTL_MODEL?",
    ]


def test_each_warning_is_given_once_however_often_the_settings_load(monkeypatch, capsys, cli):
    """A command may load the settings more than once (with overrides: cluster create's AZs from
    EC2)."""
    from fsdpctl.cli.common import AppState

    monkeypatch.setenv("FSDPCTL_MODLE", "7b")
    (cli.cwd / ".env").write_text("SHARDING_STRATEGIE=FULL_SHARD\n")
    state = AppState(env_file=Path(".env"))
    state.config()
    state.config(BACKEND="eks")
    state.config(AVAILABILITY_ZONES="us-west-2a", set_by={"AVAILABILITY_ZONES": "EC2"})
    err = capsys.readouterr().err
    assert err.count("FSDPCTL_MODLE") == 1 and err.count("SHARDING_STRATEGIE") == 1, err


def test_a_prefixed_key_in_dotenv_warns_to_use_the_plain_name(cli):
    (cli.cwd / ".env").write_text("MODEL=7b\nFSDPCTL_SEED=3\n")
    r = cli("config", "show", "-o", "json")
    assert r.exit_code == 0 and json.loads(r.stdout)["settings"]["SEED"] == 1234
    assert r.stderr.startswith("warning: .env line 2: unknown key FSDPCTL_SEED: did you mean SEED?")


def test_every_fsdpctl_variable_the_code_reads_is_known():
    """Every FSDPCTL_ name in the sources and the Makefile is fsdpctl's own (OWN_ENV) or a
    setting's: none of them may be warned about as unknown."""
    found = set()
    for path in [*ROOT.joinpath("src").rglob("*.py"), ROOT / "Makefile"]:
        found |= set(re.findall(r"\bFSDPCTL_[A-Z0-9_]*[A-Z0-9]\b", path.read_text()))
    known = {f"FSDPCTL_{key}" for key in KEYS} | set(OWN_ENV)
    assert {v for v in found if v not in known and not v.startswith(OWN_ENV_PREFIXES)} == set()


# ---- where a value came from, in every error: options, and checks over several keys ------------------------


def test_a_command_option_is_named_as_the_source(cli):
    r = cli("plan", "--nodes", "0")
    assert r.exit_code == 2
    assert r.stderr.splitlines() == ["error: JOB_NODES='0' (--nodes) is too small: use at least 1"]


def test_each_named_value_of_a_check_over_several_keys_says_where_it_came_from(cli, monkeypatch):
    """JOB_NODES over NODE_COUNT on EKS (config validate's placement check): both values named with
    their sources; the suggested values are not (they came from nowhere)."""
    (cli.cwd / ".env").write_text("# the node group\nNODE_COUNT=2\n")
    monkeypatch.setenv("FSDPCTL_BACKEND", "eks")
    monkeypatch.setenv("FSDPCTL_IMAGE_REGISTRY", "registry.example.com:5000")
    monkeypatch.setenv("FSDPCTL_JOB_NODES", "3")
    r = cli("config", "validate")
    assert r.exit_code == 2
    [line] = r.stderr.splitlines()
    assert line.startswith(
        "error: JOB_NODES=3 (environment FSDPCTL_JOB_NODES) exceeds NODE_COUNT=2 (.env line 2), the GPU nodes"
    ), line
    assert line.count("(") == 2 and "set JOB_NODES=2, or NODE_COUNT=3 and grow" in line

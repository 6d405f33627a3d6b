"""The CLI fuzzer (issue 15): every command of the typer app and every settings key, with generated
values through the three ways in (a `.env` file, the environment, `--set`) and through each option,
and generated file-system situations for every path the CLI takes (missing, a directory, a FIFO, a
binary or unreadable file, a read-only file system, a full disk on a 1 MB tmpfs this test mounts
when it runs as root). Every case must keep the invariants of tests/invariants.py (`check_outcome`,
shared with tests/test_bad_input.py): a documented exit code, no traceback without --debug, one
error line naming what was wrong, no secret-shaped value in any output or written file, nothing
written by a failed command; and no "internal error" (an exception fsdpctl did not expect, which the
CLI turns into one line), no hang.

The commands and keys are enumerated from the app (`typer.main.get_command`) and from fsdpctl.settings, so a
new command, option or key is fuzzed without a change here. Cases run in process through the `cli` runner of
tests/conftest.py (click's CliRunner), each in a fresh directory with its own FSDPCTL_HOME, no network (AWS
endpoints, HTTP(S) proxies at a closed local port, KUBECONFIG at nothing), commands that change state with
--dry-run. Budget: FSDPCTL_TEST_FUZZ_EXAMPLES (the slow run's default below; `make fuzz` runs more), a
fixed seed (`derandomize=True`), so CI sees the same cases every run. The cases run are counted and printed.

What the real systems do with these inputs, as the invariants assume it: POSIX open(2) of a FIFO
blocks until a writer opens it (fifo(7)), so a reader must refuse one first; a write to a full tmpfs
fails with ENOSPC and one on a read-only mount with EROFS even for root (mount(8), tmpfs(5));
execve(2) refuses an argument or environment string over MAX_ARG_STRLEN (131072 bytes) with E2BIG;
environment strings cannot hold NUL (execve(2)), so NUL only reaches fsdpctl through a .env file or
--set.
"""

from __future__ import annotations

import contextlib
import enum
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import typing
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from conftest import invoke, isolate, scaled
from fsdpctl.redact import MASK, SHAPES
from hub_peer import fresh_hub_client
from invariants import DOCUMENTED, JOB_WAIT, check_outcome, snapshot

# ---- what there is to fuzz, enumerated -----------------------------------------------------------------


@dataclass(frozen=True)
class Param:
    flag: str  # "--out-dir"; "" for a positional argument
    kind: str  # "flag", "path", "int", "float", "choice", "text"
    choices: tuple[str, ...] = ()
    label: str = ""  # how an error names it: the flag, or a positional argument's name in capitals


@dataclass(frozen=True)
class Command:
    path: tuple[str, ...]
    params: tuple[Param, ...]
    dry_run: bool  # has --dry-run: always given, so nothing really starts


# options that never return by design (they follow a job until Ctrl-C) or start real processes on
# this machine (torchrun all-reduce); each has its own tests (tests/test_cli.py,
# tests/test_doctor.py)
ENDLESS_OR_REAL = {
    "--watch",
    "--follow",
    "--collectives",
    "--dry-run-server",
    "--install-completion",
}


def _kind(param) -> tuple[str, tuple[str, ...]]:
    ann = param.type_descriptor.annotation if param.type_descriptor else str
    if typing.get_origin(ann) is not None and type(None) in typing.get_args(ann):
        ann = next(a for a in typing.get_args(ann) if a is not type(None))
    if param.param_type_name == "option" and param.is_flag:
        return "flag", ()
    if isinstance(ann, type) and issubclass(ann, enum.Enum):
        return "choice", tuple(str(m.value) for m in ann)
    if ann is Path:
        return "path", ()
    if ann in (int, float):
        return ann.__name__, ()
    return "text", ()


def commands() -> list[Command]:
    """Every leaf command of the app, with its options and arguments."""
    import typer.main

    from fsdpctl.cli import app

    found = []

    def walk(cmd, path):
        if hasattr(cmd, "commands"):
            for name, sub in sorted(cmd.commands.items()):
                walk(sub, (*path, name))
            return
        params = []
        for p in cmd.params:
            flag = p.opts[0] if p.param_type_name == "option" else ""
            if flag in ENDLESS_OR_REAL or flag in ("--dry-run", "--help", "-h"):
                continue
            kind, choices = _kind(p)
            params.append(Param(flag, kind, choices, flag or str(p.name).upper()))
        has_dry_run = any(
            p.param_type_name == "option" and "--dry-run" in p.opts for p in cmd.params
        )
        found.append(Command(path, tuple(params), has_dry_run))

    walk(typer.main.get_command(app), ())
    return found


COMMANDS = commands()


def setting_keys() -> list[str]:
    from fsdpctl.settings import setting_keys

    return sorted(setting_keys())


KEYS = setting_keys()
# keys that name a file or directory on this machine (the local backend reads them here)
PATH_KEYS = ("HF_TOKEN_FILE", "DATASET", "TOKENIZER", "PRETRAINED")


# ---- generated values ------------------------------------------------------------------------------------

SECRET_SHAPES = (
    st.text(
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789", min_size=34, max_size=34
    ).map(lambda s: "hf_" + s),
    st.text("ABCDEFGHIJKLMNOPQRSTUVWXYZ234567", min_size=16, max_size=16).map(lambda s: "AKIA" + s),
    st.text("ABCDEFGHIJKLMNOPQRSTUVWXYZ234567", min_size=16, max_size=16).map(lambda s: "ASIA" + s),
    st.text(
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789", min_size=36, max_size=36
    ).map(lambda s: "ghp_" + s),
)
secrets = st.one_of(*SECRET_SHAPES)
TRICKY = (
    "",
    " ",
    "nan",
    "NaN",
    "inf",
    "-inf",
    "1e309",
    "-0",
    "0",
    "-1",
    "1.5",
    "0x10",
    "1_000",
    str(2**63),
    str(2**64 + 1),
    str(-(2**63) - 1),
    "9" * 400,
    "true",
    "yes",
    "maybe",
    "None",
    "null",
    "../..",
    "../../x",
    "/",
    ".",
    "~",
    "~root/x",
    "/etc/passwd",
    "a/../../b",
    "x" * 300,
    "é",
    "日本語",
    "🙂",
    "a\nb",
    "a\rb",
    "a\tb",
    "\x1b[31mred",
    "[red]x[/]",
    "$(id)",
    "`id`",
    "a b",
    "'",
    '"',
    "\\",
    "-h",
    "--set",
    "=",
    "A=B",
    "latest",
    "meta-llama/Llama-2-7b-hf",
)
scalars = st.one_of(
    st.sampled_from(TRICKY),
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.text(max_size=40),  # any unicode, control characters included (no surrogates: not encodable)
    secrets,
)
HUGE = "y" * 200_000  # beyond MAX_ARG_STRLEN: a launch would fail with E2BIG
values = st.one_of(scalars, st.just(HUGE), scalars.map(lambda s: s + "\x00"))


def _defaults() -> dict[str, str]:
    """Each key's default as its text: a value the key accepts, so a case with junk in one key and
    valid values in the others reaches the checks past settings validation."""
    import dataclasses

    from fsdpctl.settings import Settings, setting_keys
    from fsdptrain.config import TrainConfig

    out = {}
    train = {f.name: f for f in dataclasses.fields(TrainConfig)}
    for key, name in setting_keys().items():
        if name in Settings.model_fields:
            value = Settings.model_fields[name].default
            value = getattr(value, "get_secret_value", lambda v=value: v)()
        else:
            f = train[name]
            value = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        out[key] = str(value).lower() if isinstance(value, bool) else str(value)
    return out


DEFAULTS = _defaults()
# values options commonly take, so that a case gets past click's parsing and the settings to the
# command
PLAUSIBLE = (
    "local",
    "eks",
    "tiny",
    "7b",
    "fsdp",
    "p5.48xlarge",
    "FULL_SHARD",
    "bf16",
    "fp32",
    "abc123",
    "1",
)


def for_key(key: str) -> st.SearchStrategy[str]:
    """A value for `key`: generated junk, or (as often) one the key accepts, so later checks run
    too."""
    return st.one_of(values, st.just(DEFAULTS.get(key, "")), st.sampled_from(PLAUSIBLE))


def for_option(kind: str) -> st.SearchStrategy[str]:
    plausible = {
        "int": st.integers(0, 8).map(str),
        "float": st.floats(0.01, 1.0).map(str),
    }.get(kind, st.sampled_from(PLAUSIBLE))
    return st.one_of(values, plausible, plausible)


# ---- file-system situations ------------------------------------------------------------------------------

SITUATIONS = (
    "missing",
    "missing-parent",
    "empty-dir",
    "file",
    "empty-file",
    "binary-file",
    "fifo",
    "unreadable",
    "read-only",
    "full-disk",
    "dotdot",
    "symlink-loop",
)


@dataclass
class Mounts:
    """A full 1 MB tmpfs and a read-only one (root only; elsewhere a full disk cannot be had and
    read-only is a chmod 555 directory, which root would ignore)."""

    full: Path | None = None
    read_only: Path | None = None
    made: list[Path] = field(default_factory=list)


def _mount(path: Path, *options: str) -> bool:
    path.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", ",".join(("size=1m", *options)), "tmpfs", str(path)],
        capture_output=True,
    )
    return r.returncode == 0


@pytest.fixture(scope="module")
def mounts(tmp_path_factory) -> Iterator[Mounts]:
    base = tmp_path_factory.mktemp("mounts")
    m = Mounts()
    if os.geteuid() == 0 and shutil.which("mount"):
        if _mount(base / "full"):
            m.full, m.made = base / "full", [*m.made, base / "full"]
            with open(m.full / "filler", "wb") as f, contextlib.suppress(OSError):
                while True:
                    f.write(b"\0" * 65536)
        if _mount(base / "ro", "ro"):
            m.read_only, m.made = base / "ro", [*m.made, base / "ro"]
    yield m
    for path in m.made:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def situate(kind: str, root: Path, name: str, mounts: Mounts) -> Path:
    """A path of the given kind below `root` (or on a mount), made on disk."""
    path = root / "fs" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "missing":
        return path
    if kind == "missing-parent":
        return root / "fs" / "nowhere" / "deeper" / name
    if kind == "empty-dir":
        path.mkdir()
    elif kind == "file":
        path.write_text("A=1\n")
    elif kind == "empty-file":
        path.touch()
    elif kind == "binary-file":
        path.write_bytes(b"\xff\xfe\x00\x80HF\x00\xc3(" * 8)
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "unreadable":
        path.write_text("A=1\n")
        path.chmod(0)
    elif kind == "read-only":
        if mounts.read_only:
            return mounts.read_only / name
        path.mkdir()
        path.chmod(0o555)
        return path / "inside"
    elif kind == "full-disk":
        return (mounts.full or path.parent) / f"{name}-{os.getpid()}"
    elif kind == "dotdot":
        return Path(os.path.relpath(root / "fs" / "..", root)) / ".." / name
    elif kind == "symlink-loop":
        path.symlink_to(path)
    return path


# ---- one case --------------------------------------------------------------------------------------------


@dataclass
class Case:
    command: Command
    argv: list[str]
    dotenv: dict[str, str]
    environ: dict[str, str]
    names: list[str]  # what an error line may name: the keys, flags, paths and values given
    secrets: list[str]
    debug: bool
    home: Path | None = None  # FSDPCTL_HOME, when the case puts it somewhere odd


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed once this returns: connections are refused at once


@st.composite
def cases(draw, root: Path, mounts: Mounts) -> Case:
    command = draw(st.sampled_from(COMMANDS))
    debug = draw(st.booleans())
    dotenv: dict[str, str] = {}
    environ: dict[str, str] = {}
    sets: list[str] = []
    names: list[str] = []
    for key in draw(st.lists(st.sampled_from(KEYS), max_size=3, unique=True)):
        if key in PATH_KEYS and draw(st.booleans()):
            value = str(situate(draw(st.sampled_from(SITUATIONS)), root, key.lower(), mounts))
        else:
            value = draw(for_key(key))
        channel = draw(st.sampled_from(("dotenv", "env", "set")))
        if channel == "env" and "\x00" not in value:
            environ[f"FSDPCTL_{key}"] = value
        elif channel == "set" or "\x00" in value and channel == "env":
            sets += ["--set", f"{key}={value}"]
        else:
            dotenv[key] = value
        names += [key, value]
    argv = ["--debug"] if debug else []
    if draw(st.integers(0, 9)) == 0:  # the settings file itself in an odd place
        env_file = situate(draw(st.sampled_from(SITUATIONS)), root, "settings.env", mounts)
        argv += ["--env-file", str(env_file)]
        names += ["--env-file", str(env_file)]
    argv += [*sets, *command.path]
    if command.dry_run:
        argv.append("--dry-run")
    for p in command.params:
        if draw(st.integers(0, 2)) != 0:  # each option in a third of the cases
            continue
        if p.kind == "flag":
            argv.append(p.flag)
            continue
        if p.kind == "path":
            value = str(
                situate(draw(st.sampled_from(SITUATIONS)), root, p.flag.strip("-") or "arg", mounts)
            )
        elif p.kind == "choice":
            value = draw(st.one_of(st.sampled_from(p.choices), st.sampled_from(p.choices), scalars))
        else:
            value = draw(for_option(p.kind))
        if (
            "\x00" in value
        ):  # click's runner passes it, a real shell cannot: argv strings end at NUL
            value = value.replace("\x00", "")
        argv += [p.flag, value] if p.flag else ["--", value] if value.startswith("-") else [value]
        names += [p.flag or value, value]
    home = None
    if draw(st.integers(0, 14)) == 0:
        home = situate(draw(st.sampled_from(SITUATIONS)), root, "home", mounts)
        names += ["FSDPCTL_HOME", str(home)]
    found = [
        s
        for s in (*dotenv.values(), *environ.values(), *argv)
        for shape in SHAPES
        if shape.search(s)
    ]
    return Case(command, argv, dotenv, environ, names, found, debug, home)


@contextlib.contextmanager
def sealed(case: Case, root: Path) -> Iterator[None]:
    """The case's environment, working directory and FSDPCTL_HOME; everything put back after."""
    port = _closed_port()
    env = {
        "FSDPCTL_HOME": str(case.home or root / "home"),
        "KUBECONFIG": str(root / "no-kubeconfig"),
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
        "AWS_ACCESS_KEY_ID": "fuzzing",
        "AWS_SECRET_ACCESS_KEY": "fuzzing",
        "AWS_MAX_ATTEMPTS": "1",
        "AWS_EC2_METADATA_DISABLED": "true",
        "HTTP_PROXY": f"http://127.0.0.1:{port}",
        "HTTPS_PROXY": f"http://127.0.0.1:{port}",
        "NO_PROXY": "",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        **case.environ,
    }
    saved = {k: os.environ.get(k) for k in env}
    cwd = os.getcwd()
    os.environ.update(env)
    os.chdir(root)
    try:
        yield
    finally:
        os.chdir(cwd)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        fresh_hub_client()  # a client made under the case's proxies would outlive it


class Hang(Exception):
    pass


def _alarm(signum, frame):
    raise Hang("the command did not return within the case's time limit")


CASE_SECONDS = 30
# what a bad-input line may name besides what the case gave: a key it did not set but needs (DATASET
# for `data fetch`), or the settings file and FSDPCTL_HOME
NAMEABLE = (*KEYS, "--set", "--env-file", "FSDPCTL_HOME", ".env")
RAN: list[tuple[str, int]] = []  # (command, exit code) of each case run, for the run's summary line


def run_case(case: Case, root: Path, mounts: Mounts) -> None:
    if case.dotenv:
        (root / ".env").write_bytes(
            "".join(f"{k}={_quoted(v)}\n" for k, v in case.dotenv.items()).encode(
                "utf-8", "surrogateescape"
            )
        )
    watched = [root, *mounts.made]
    with sealed(case, root):
        before = snapshot(*watched)
        previous = signal.signal(signal.SIGALRM, _alarm)
        signal.alarm(math.ceil(scaled(CASE_SECONDS)))  # a busy machine imports transformers slower
        try:
            result = invoke(*case.argv, catch_exceptions=True)
        finally:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, previous)
        after = snapshot(*watched)
    RAN.append((" ".join(case.command.path), result.exit_code))
    if isinstance(result.exception, Hang):
        pytest.fail(f"hang: fsdpctl {' '.join(map(repr, case.argv))}")
    where = f"\ncase: fsdpctl {case.argv!r}\n.env: {case.dotenv!r}\nenv: {case.environ!r}"
    assert "internal error" not in result.stderr, (
        f"an exception fsdpctl did not expect{where}\n{result.stderr}"
    )
    allowed = JOB_WAIT if case.command.path == ("job", "wait") else DOCUMENTED
    try:
        check_outcome(
            result,
            written_before=before,
            written_after=after,
            secrets=case.secrets,
            allowed_codes=allowed,
            # a secret-shaped value is named as *** (masked like every line)
            # (or as Python's repr shows it: '\x86' for a control character)
            names=[
                *case.names,
                *(repr(n)[1:-1] for n in case.names),
                *NAMEABLE,
                *(p.label for p in case.command.params),
                *[MASK] * bool(case.secrets),
            ]
            if result.exit_code == 2
            else (),
            debug=case.debug,
        )
    except AssertionError as e:
        raise AssertionError(f"{e}{where}") from None


def _quoted(value: str) -> str:
    """The value as a .env line holds it: double-quoted with python-dotenv's escapes."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def fuzz(mounts: Mounts, tmp_base: Path, examples: int) -> None:
    """`examples` cases; a failing one fails the test (shrunk to its smallest form with
    FSDPCTL_TEST_FUZZ_SHRINK=1). FSDPCTL_TEST_FUZZ_COLLECT=1 runs them all and lists every distinct
    failure instead."""
    collect = os.environ.get("FSDPCTL_TEST_FUZZ_COLLECT") == "1"
    failures: dict[str, str] = {}

    @settings(
        max_examples=examples,
        derandomize=True,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
        phases=[Phase.generate, Phase.shrink]
        if os.environ.get("FSDPCTL_TEST_FUZZ_SHRINK")
        else [Phase.generate],
    )
    @given(st.data())
    def one(data) -> None:
        root = Path(tempfile.mkdtemp(dir=tmp_base))
        try:
            case = data.draw(cases(root, mounts))
            try:
                run_case(case, root, mounts)
            except (AssertionError, pytest.fail.Exception) as e:
                if not collect:
                    raise
                first = str(e).splitlines()[0]
                failures.setdefault(f"{' '.join(case.command.path)}: {first[:160]}", str(e)[:4000])
        finally:
            _clean(root, mounts)

    RAN.clear()
    one()
    commands = {name for name, _ in RAN}
    codes = {code: sum(1 for _, c in RAN if c == code) for code in sorted({c for _, c in RAN})}
    line = f"fuzz: {len(RAN)} cases over {len(commands)} commands, exit codes {codes}"
    print("\n" + line, file=sys.stderr)
    (tmp_base / "fuzz-count.txt").write_text(line + "\n")
    assert not failures, f"{len(failures)} distinct failures:\n" + "\n\n".join(failures.values())


def _clean(root: Path, mounts: Mounts) -> None:
    with contextlib.suppress(OSError):
        for p in root.rglob("*"):
            if not p.is_symlink():
                p.chmod(0o700)
    shutil.rmtree(root, ignore_errors=True)
    for made in mounts.made:  # what a case wrote on the mounts (not the filler)
        for p in made.iterdir():
            if p.name != "filler":
                shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)


@pytest.fixture
def fuzz_base(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    isolate(
        monkeypatch, tmp_path
    )  # no setting or FSDPCTL_* variable of this machine leaks into a case
    monkeypatch.delenv("HF_TOKEN", raising=False)
    return tmp_path


# the CI budget: under 3 minutes on 2 cores (docs/testing.md "The CLI fuzzer"); `make fuzz` sets
# FSDPCTL_TEST_FUZZ_EXAMPLES higher
EXAMPLES = int(os.environ.get("FSDPCTL_TEST_FUZZ_EXAMPLES", "1500"))
FAST_EXAMPLES = 40


def test_every_command_and_key_is_fuzzed():
    """The enumeration is the app's and the settings': every leaf command, and every key fsdpctl
    reads."""
    from fsdpctl.settings import setting_keys

    paths = {c.path for c in COMMANDS}
    assert {("manifest",), ("job", "run"), ("cluster", "create"), ("config", "show")} <= paths
    assert set(KEYS) == set(setting_keys()) and "TOKENIZER" in KEYS
    state_changing = [c.path for c in COMMANDS if c.dry_run]
    assert {("job", "run"), ("deploy", "all"), ("quickstart",)} <= set(state_changing)


def test_fuzz_smoke(mounts, fuzz_base):
    """A few cases in the fast suite: the fuzzer itself works."""
    fuzz(mounts, fuzz_base, FAST_EXAMPLES)


@pytest.mark.slow
def test_fuzz_cli(mounts, fuzz_base):
    """The full budget (CI and `make fuzz`)."""
    fuzz(mounts, fuzz_base, EXAMPLES)


# ---- defects the fuzzer found that issue 15's examples did not name, each kept as a plain example ---------


def test_found_an_aws_profile_that_does_not_exist_is_one_line_naming_it(cli, tmp_path, monkeypatch):
    """boto3.Session(profile_name=...) raises botocore's ProfileNotFound at once when neither
    ~/.aws/config nor ~/.aws/credentials has the profile (boto3 docs, "Credentials": profiles); it
    escaped as an internal error. Now: exit 2, AWS_PROFILE named, with the fix."""
    (tmp_path / "aws-config").write_text("[default]\nregion = us-east-1\n")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "aws-config"))
    said = "AWS_PROFILE='no-such-profile' is not a profile"
    for args in (["cluster", "check"], ["image", "push", "--dry-run"]):
        result = cli("--set", "AWS_PROFILE=no-such-profile", *args)
        assert result.exit_code == 2, (args, result.stderr)
        assert result.stderr.startswith(f"error: {said}"), result.stderr
    # cluster delete used to write its clusterconfig.yaml before the lookup failed: now nothing is
    # left
    result = cli("--set", "AWS_PROFILE=no-such-profile", "cluster", "delete", "--dry-run")
    assert result.exit_code == 2 and said in result.stderr, result.stderr
    assert not (cli.home / "clusters").exists()
    # a dry run plans without AWS where it must: it warns with the same words and goes on
    result = cli("--set", "AWS_PROFILE=no-such-profile", "cluster", "create", "--dry-run")
    assert result.exit_code == 0 and said in result.stderr, result.stderr


def test_found_fsdpctl_home_on_a_read_only_file_system_is_one_line_naming_the_path(
    cli, mounts, monkeypatch
):
    """mkdir(2) on a read-only mount fails with EROFS, for root too (mount(8) `ro`); `cluster create
    --dry-run` (which writes the eksctl input under FSDPCTL_HOME) let that OSError escape as an internal
    error. Now any OSError with a path is one line naming it, exit 1."""
    if mounts.read_only is None:
        pytest.skip("a read-only mount needs root and mount(8)")
    monkeypatch.setenv("FSDPCTL_HOME", str(mounts.read_only / "home"))
    result = cli("cluster", "create", "--dry-run")
    assert result.exit_code == 1, result.stderr
    error = next(line for line in result.stderr.splitlines() if line.startswith("error:"))
    assert error.startswith(
        f"error: cannot write or read {mounts.read_only / 'home'}: the file system is read-only"
    )
    assert "internal error" not in result.stderr and "Traceback" not in result.stderr

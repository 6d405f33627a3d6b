"""Outside files through one door each (issue 37): the settings files (--env-file, repeatable), the
AWS config and credentials files and the kubeconfig, whatever is at their path, give the command's
result or one line naming the file (and the line), exit 2, within a bound, nothing written.

What each reader does by itself, read in its source, and why fsdpctl reads first (fsdpctl.outside):
- open(2) of a FIFO blocks until a writer opens it (fifo(7)); a link to /dev/zero reads forever
  (null(4)); /proc/self/environ is NUL-separated text of size 0 in stat(2) (proc(5)).
- botocore (configloader.raw_config_parse): a path that is not `os.path.isfile` is skipped in silence
  (a directory, a FIFO: the user's file ignored), configparser's errors and UnicodeDecodeError become
  ConfigParseError; the `int` conversion of max_attempts / AWS_MAX_ATTEMPTS
  (configprovider.BOTOCORE_DEFAUT_SESSION_VARIABLES) and the endpoint check (endpoint.py
  create_endpoint: "Invalid endpoint") raise ValueError from deep inside the first request.
- the kubernetes client (config/kube_config.py KubeConfigMerger): splits $KUBECONFIG at ':',
  `os.path.exists` then `yaml.safe_load(open(path))`: a FIFO hangs, a directory is IsADirectoryError,
  YAML that is no mapping is a TypeError in `_merge`.
- python-dotenv's grammar for the settings file (dotenv/parser.py); docker's repeated --env-file:
  the files are read in order and a later one's variable wins ("docker run" reference, --env-file).

Peers: the real file system (FIFOs, sockets, a link to /dev/zero, /proc), real botocore and the real
kubernetes client reading what passed the door, and the moto server for a good AWS configuration.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import invoke
from invariants import check_outcome, error_lines, snapshot

SECONDS = 30  # a case that has not answered by then hangs (a FIFO being waited on)


class Hang(Exception):
    pass


@contextlib.contextmanager
def bounded() -> Iterator[None]:
    def alarm(signum, frame):
        raise Hang("no answer within the case's time limit")

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(SECONDS)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


# ---- the doors: how each file is named, and a command that reads it --------------------------------------


def env_file(path: Path) -> tuple[tuple[str, ...], dict[str, str]]:
    return ("--env-file", str(path), "config", "validate"), {}


def aws_config(path: Path) -> tuple[tuple[str, ...], dict[str, str]]:
    return ("cluster", "check"), {"AWS_CONFIG_FILE": str(path)}


def aws_credentials(path: Path) -> tuple[tuple[str, ...], dict[str, str]]:
    return ("cluster", "check"), {"AWS_SHARED_CREDENTIALS_FILE": str(path)}


def kubeconfig(path: Path) -> tuple[tuple[str, ...], dict[str, str]]:
    return ("--set", "BACKEND=eks", "job", "list"), {"KUBECONFIG": str(path)}


DOORS = {
    "--env-file": env_file,
    "AWS_CONFIG_FILE": aws_config,
    "AWS_SHARED_CREDENTIALS_FILE": aws_credentials,
    "KUBECONFIG": kubeconfig,
}
# text each door's parser refuses, and what its line says
UNPARSABLE = {
    "--env-file": ("MODEL=7b\nDATASET='no closing quote\n", "line 2: cannot parse"),
    "AWS_CONFIG_FILE": ("region = us-east-1\n[default]\n", "line 1"),
    "AWS_SHARED_CREDENTIALS_FILE": ("[default]\nx = 1\n[default]\n", "line 3"),
    "KUBECONFIG": ("clusters: [\n  - name: a\n", "is not YAML"),
}


def situate(kind: str, door: str, at: Path) -> Path:
    """A file of the given bad kind at `at`."""
    if kind == "fifo":
        os.mkfifo(at)
    elif kind == "socket":
        s = socket.socket(socket.AF_UNIX)
        s.bind(str(at))  # left bound: the path stays a socket for the case
        _SOCKETS.append(s)
    elif kind == "directory":
        at.mkdir()
    elif kind == "dev-zero":
        at.symlink_to("/dev/zero")
    elif kind == "proc-environ":
        at.symlink_to("/proc/self/environ")
    elif kind == "nul":
        at.write_bytes(b"[default]\nregion = us-east-1\x00\n")
    elif kind == "huge":
        at.write_bytes(b"#" * (17 * 1024 * 1024))
    elif kind == "latin-1":
        at.write_bytes("# caf\xe9\n".encode("latin-1"))
    elif kind == "unparsable":
        at.write_text(UNPARSABLE[door][0])
    return at


_SOCKETS: list[socket.socket] = []
KINDS = (
    "fifo",
    "socket",
    "directory",
    "dev-zero",
    "proc-environ",
    "nul",
    "huge",
    "latin-1",
    "unparsable",
)
WHAT = {
    "fifo": "is not a regular file (a FIFO",
    "socket": "is not a regular file (a socket",
    "directory": "is a directory",
    "dev-zero": "is not a regular file (a character device",
    "proc-environ": "holds a NUL byte",
    "nul": "holds a NUL byte (line 2)",
    "huge": "bytes",
    "latin-1": "is not UTF-8 text (line 1",
}


@pytest.fixture
def outside(cli, monkeypatch) -> Path:
    """The isolated CLI with AWS credentials that go nowhere (a closed port): nothing here may
    reach an outside system before the file is refused."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("REQUEST_TIMEOUT", "1")
    return cli.cwd


def run_case(root: Path, door: str, path: Path, monkeypatch) -> object:
    args, env = DOORS[door](path)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    before = snapshot(root)
    with bounded():
        result = invoke("--set", "REQUEST_TIMEOUT=1", *args, catch_exceptions=True)
    assert not isinstance(result.exception, Hang), f"{door} {path}: hang"
    check_outcome(
        result,
        written_before=before,
        written_after=snapshot(root),
        names=(str(path),),
        allowed_codes=(2,),
    )
    return result


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    "door",
    [
        # the credentials file passes the config file's door (aws_config._door): slow lane only
        pytest.param(d, marks=pytest.mark.slow) if d == "AWS_SHARED_CREDENTIALS_FILE" else d
        for d in DOORS
    ],
)
def test_every_door_refuses_every_bad_kind_with_one_line(outside, monkeypatch, door, kind):
    """Each outside file x each bad kind: exit 2, one error line naming the path and what it is,
    within the bound (a FIFO is refused before it is opened), nothing written."""
    path = situate(kind, door, outside / f"the-{kind}")
    result = run_case(outside, door, path, monkeypatch)
    [line] = error_lines(result.stderr)
    said = UNPARSABLE[door][1] if kind == "unparsable" else WHAT[kind]
    assert str(path) in line and said in line, result.stderr


@settings(
    max_examples=30,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(door=st.sampled_from(list(DOORS)), content=st.binary(max_size=300))
def test_any_content_is_read_or_refused_in_one_line(outside, monkeypatch, door, content):
    """Generated bytes in each file: whatever they are, no traceback, no internal error; refused,
    it is one line naming the file."""
    path = outside / "generated"
    path.write_bytes(content)
    args, env = DOORS[door](path)
    with monkeypatch.context() as m, bounded():
        for k, v in env.items():
            m.setenv(k, v)
        result = invoke("--set", "REQUEST_TIMEOUT=1", *args, catch_exceptions=True)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "internal error" not in result.stderr and "Traceback" not in result.stderr, (
        content,
        result.stderr,
    )
    mentions = [line for line in error_lines(result.stderr) if str(path) in line]
    if result.exit_code == 2 and mentions:
        assert len(mentions) == 1, result.stderr


# ---- AWS settings botocore converts or checks late ------------------------------------------------------

NOT_WHOLE = st.text(
    st.characters(codec="ascii", exclude_categories=["Cc"]), min_size=1, max_size=8
).filter(lambda s: not s.strip().lstrip("+-").isdigit())
NOT_URL = st.one_of(
    st.text(
        st.characters(codec="ascii", exclude_categories=["Cc"]), min_size=1, max_size=20
    ).filter(lambda s: "://" not in s),
    st.sampled_from(
        ["not a url", "http://", "://host", "http:// spaced.host", "ftp//x", "host:80"]
    ),
)


@settings(
    max_examples=20,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(var=st.sampled_from(["AWS_MAX_ATTEMPTS", "AWS_METADATA_SERVICE_TIMEOUT"]), value=NOT_WHOLE)
def test_an_aws_number_that_is_not_one_is_named(outside, monkeypatch, var, value):
    with monkeypatch.context() as m, bounded():  # each example its own environment
        m.setenv(var, value)
        r = invoke("cluster", "check")
    assert r.exit_code == 2, r.output
    [line] = error_lines(r.stderr)
    assert line.startswith(f"error: {var}={value!r} (environment) is not a whole number"), line


@settings(
    max_examples=20,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(var=st.sampled_from(["AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_EC2"]), value=NOT_URL)
def test_an_aws_endpoint_that_is_not_a_url_is_named(outside, monkeypatch, var, value):
    """botocore.utils.is_valid_endpoint_url decides, as create_endpoint does."""
    from botocore.utils import is_valid_endpoint_url, is_valid_ipv6_endpoint_url

    if is_valid_endpoint_url(value) or is_valid_ipv6_endpoint_url(value):
        return  # botocore takes it: so does fsdpctl
    with monkeypatch.context() as m, bounded():
        m.setenv(var, value)
        r = invoke("cluster", "check")
    assert r.exit_code == 2, r.output
    [line] = error_lines(r.stderr)
    assert line.startswith(f"error: {var}={value!r} (environment) is not a URL"), line


@pytest.mark.parametrize(
    "text, said",
    [
        (
            "[default]\nregion = us-east-1\nmax_attempts = many\n",
            "line 3 [default]: max_attempts = 'many'",
        ),
        ("[default]\nendpoint_url = not a url\n", "line 2 [default]: endpoint_url = 'not a url'"),
        ("[default]\ns3 =\n  addressing_style\n", "line 2: [default] s3: each line of its nested"),
    ],
)
def test_an_aws_config_value_botocore_cannot_take_names_the_file_and_line(
    outside, monkeypatch, text, said
):
    (outside / "aws-config").write_text(text)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(outside / "aws-config"))
    monkeypatch.delenv("AWS_MAX_ATTEMPTS")
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    r = invoke("cluster", "check")
    assert r.exit_code == 2, r.output
    [line] = error_lines(r.stderr)
    assert str(outside / "aws-config") in line and said in line, line


def test_a_good_aws_config_passes_the_door(aws_env, cli, monkeypatch):
    """The positive case against the moto server: a profile with its own region and max_attempts,
    credentials in the credentials file; `cluster check` reaches AWS (no refusal of the files)."""
    (cli.cwd / "config").write_text("[profile dev]\nregion = us-east-1\nmax_attempts = 3\n")
    (cli.cwd / "credentials").write_text(
        "[dev]\naws_access_key_id = testing\naws_secret_access_key = testing\n"
    )
    monkeypatch.setenv("AWS_CONFIG_FILE", str(cli.cwd / "config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(cli.cwd / "credentials"))
    r = invoke("--set", "AWS_PROFILE=dev", "cluster", "check", "-o", "json")
    assert r.exit_code in (0, 1), r.output
    assert json.loads(r.stdout)["checks"], r.output


def test_a_kubeconfig_list_skips_what_is_not_there_as_the_client_does(outside, monkeypatch):
    """KUBECONFIG=a:missing:b: the missing one is skipped (KubeConfigMerger: os.path.exists), the
    others pass the door; the client then tries the server (a closed port: exit 1, not 2)."""
    good = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:9"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }
    (outside / "a").write_text(json.dumps(good))
    (outside / "b").write_text("{}\n")
    monkeypatch.setenv("KUBECONFIG", f"{outside / 'a'}:{outside / 'missing'}:{outside / 'b'}")
    with bounded():
        r = invoke("--set", "BACKEND=eks", "--set", "REQUEST_TIMEOUT=1", "job", "list")
    assert r.exit_code == 1 and "KUBECONFIG" not in r.stderr, r.output


# ---- repeated --env-file ---------------------------------------------------------------------------------

ENV_VALUES = st.dictionaries(
    st.sampled_from(["SEED", "MAX_STEPS", "JOB_NAME", "WANDB_PROJECT"]),
    st.sampled_from(["1", "7", "42", "alpha", "beta-2"]),
    max_size=4,
)


@settings(
    max_examples=20,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(files=st.lists(ENV_VALUES, min_size=1, max_size=3))
def test_repeated_env_files_are_read_in_order_and_a_later_one_wins(cli, files):
    """`--env-file a --env-file b`: every file applies, b's keys over a's (docker's order); each
    value's source names the file and line it came from. Nothing is dropped in silence."""
    args, expected, where = [], {}, {}
    for n, values in enumerate(files):
        path = cli.cwd / f"{n}.env"
        lines = [f"{k}={v}" for k, v in values.items() if k != "JOB_NAME" or not v.isdigit()]
        path.write_text("".join(line + "\n" for line in lines))
        args += ["--env-file", path.name]
        for i, line in enumerate(lines, 1):
            k, v = line.split("=", 1)
            expected[k], where[k] = v, f"{path.name} line {i}"
    r = invoke(*args, "config", "show", "-o", "json")
    if r.exit_code != 0:  # a value a key refuses: each line names the file it came from
        lines = error_lines(r.stderr)
        assert r.exit_code == 2 and lines, r.stderr
        assert all(any(w in line for w in where.values()) for line in lines), r.stderr
        return
    shown = json.loads(r.stdout)
    for k, v in expected.items():
        assert str(shown["settings"][k]) == v and shown["sources"][k] == where[k], (k, shown)


def test_dev_null_is_the_empty_file(outside, monkeypatch):
    """`AWS_CONFIG_FILE=/dev/null` is how a user says "no config" (botocore reads it as absent:
    not os.path.isfile); through the door it is the empty file, not a refused device."""
    monkeypatch.setenv("AWS_CONFIG_FILE", os.devnull)
    with bounded():
        r = invoke("--env-file", os.devnull, "--set", "REQUEST_TIMEOUT=1", "cluster", "check")
    assert r.exit_code in (0, 1) and "AWS_CONFIG_FILE" not in r.stderr, r.output


@pytest.mark.parametrize(
    "config, said",
    [
        (
            "[default]\ncredential_process = /nonexistent/helper --flag\n",
            "error: the AWS profile's credential_process /nonexistent/helper cannot be run",
        ),
        (
            "[default]\nca_bundle = /nonexistent/ca.pem\n",
            "ca_bundle = '/nonexistent/ca.pem' is not a file",
        ),
    ],
    ids=["credential_process missing", "ca_bundle missing"],
)
def test_a_profile_naming_what_is_not_there_is_one_line(outside, monkeypatch, config, said):
    """botocore runs credential_process with Popen (credentials.py ProcessProvider: a missing
    program is FileNotFoundError, which escaped as an internal error) and loads ca_bundle at the first
    https connection."""
    (outside / "config").write_text(config)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(outside / "config"))
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_CA_BUNDLE"):
        monkeypatch.delenv(var, raising=False)
    with bounded():
        r = invoke("--set", "REQUEST_TIMEOUT=1", "cluster", "check")
    assert r.exit_code == 2, r.output
    [line] = error_lines(r.stderr)
    assert said in line, line


JUNK = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.sampled_from(["", "x", "c", "u"])),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(
            st.sampled_from(["name", "cluster", "user", "context", "server", "token"]),
            inner,
            max_size=3,
        ),
    ),
    max_leaves=8,
)
ENTRY = {
    "clusters": st.fixed_dictionaries(
        {"name": st.sampled_from(["c", "d"])},
        optional={"cluster": st.one_of(JUNK, st.just({"server": "https://127.0.0.1:9"}))},
    ),
    "contexts": st.fixed_dictionaries(
        {"name": st.sampled_from(["x", "y"])},
        optional={"context": st.one_of(JUNK, st.just({"cluster": "c", "user": "u"}))},
    ),
    "users": st.fixed_dictionaries(
        {"name": st.sampled_from(["u", "v"])},
        optional={"user": st.one_of(JUNK, st.just({"token": "t"}))},
    ),
}


@settings(
    max_examples=25,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    doc=st.fixed_dictionaries(
        {},
        optional={
            **{k: st.one_of(st.lists(v, max_size=2), JUNK) for k, v in ENTRY.items()},
            "current-context": st.one_of(st.sampled_from(["x", "y"]), JUNK),
        },
    )
)
def test_any_kubeconfig_shape_is_read_or_refused_in_one_line(outside, monkeypatch, doc):
    """Generated kubeconfig documents, right and wrong in every part: the client connects (a closed
    port: exit 1), says the kubeconfig names no cluster (exit 1), or the door refuses it (exit 2);
    never an internal error."""
    path = outside / "kubeconfig"
    path.write_text(json.dumps(doc))
    with monkeypatch.context() as m, bounded():
        m.setenv("KUBECONFIG", str(path))
        r = invoke("--set", "BACKEND=eks", "--set", "REQUEST_TIMEOUT=1", "job", "list")
    assert "internal error" not in r.stderr and "Traceback" not in r.stderr, (doc, r.stderr)
    assert r.exit_code in (1, 2) and len(error_lines(r.stderr)) == 1, (doc, r.output)


@settings(
    max_examples=15,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    secret=st.text(
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789/+", min_size=40, max_size=40
    ),
    shape=st.sampled_from(
        [
            "aws_secret_access_key {s}\n",  # no '=': not `key = value`
            "aws_secret_access_key = {s}\n[default]\n",  # before any section
            "[default]\naws_secret_access_key = {s}\n[default]\n",  # a section twice
            "[default]\nx\n{s}\n",
        ]
    ),
)
def test_a_broken_credentials_file_never_shows_what_it_holds(outside, monkeypatch, secret, shape):
    """The line of a credentials file that does not parse is named by number, never quoted: it may be
    the secret access key itself."""
    (outside / "credentials").write_text(shape.format(s=secret))
    with monkeypatch.context() as m, bounded():
        m.setenv("AWS_SHARED_CREDENTIALS_FILE", str(outside / "credentials"))
        r = invoke("--debug", "cluster", "check")
    assert r.exit_code == 2, r.output
    assert secret not in r.output and secret[:20] not in r.output, r.output

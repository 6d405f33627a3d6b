"""Nothing waits forever on the outside (issue 29): every command of the app, run against outside
systems that accept a connection and never answer, returns within its deadline and says what did not
answer.

Peers: a local TCP server that accepts every connection and never writes a byte (what an API server
behind a dead proxy, a black-holed load balancer or a hung process looks like to a client: the
connection is made, no answer comes), standing in for the Kubernetes API server (https and http: the
TLS handshake never completes on the first), the AWS endpoints (AWS_ENDPOINT_URL) and the Hugging
Face Hub (HF_ENDPOINT); and helper processes that never return: an AWS profile's
`credential_process` and a kubeconfig's exec plugin.

What the clients do by themselves (read in their sources): the kubernetes client sends a request
with no timeout unless `_request_timeout` is given (kubernetes/client/rest.py: None becomes
urllib3's no timeout), and retries under urllib3's default Retry(3); botocore waits 60 s to connect
and 60 s per read (botocore/config.py, connect_timeout and read_timeout) and retries a read timeout
(retryhandler.py EXCEPTION_MAP GENERAL_CONNECTION_ERROR includes ReadTimeoutError; 4 retries in
legacy mode); botocore runs `credential_process` and waits with `p.communicate()`, no timeout
(credentials.py ProcessProvider); the kubernetes client runs an exec plugin and waits with
`process.communicate()`, no timeout (config/exec_provider.py ExecProvider.run); huggingface_hub's
client is made with `timeout=None` and HfApi.repo_info passes `timeout=None` (utils/_http.py
default_client_factory, hf_api.py). fsdpctl gives each of them REQUEST_TIMEOUT, kubectl's
--request-timeout in spirit.

The commands are enumerated from the typer app, so a new command is run here without a change. Each
runs in process with REQUEST_TIMEOUT=1 under an alarm; invariants: it returns before the alarm, its
exit code is a documented one, no internal error or traceback, and a failure is one line naming what
did not answer (the endpoint's address, the credential_process, the exec plugin) or REQUEST_TIMEOUT.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import SHARED, CliResult, invoke
from invariants import DOCUMENTED, JOB_WAIT, TRACEBACK, error_lines

# per command; with REQUEST_TIMEOUT=1 the slowest (several AWS calls, each tried twice) take ~10
ALARM_S = 45
# commands that reach nothing outside this machine by design, or run the trainer: they have their
# own tests
LOCAL_ONLY = {("quickstart",), ("doctor",), ("plan",), ("config", "show"), ("config", "validate")}
LOCAL_ONLY |= {("manifest",), ("image", "build")}
# `deploy fetch` reads GitHub's release files, not AWS, Kubernetes or the Hub, and reads no setting
# (so a bad one cannot keep a user from fetching): its deadline is the download adapter's own 60 s
# per request
LOCAL_ONLY |= {("deploy", "fetch")}
# the one-machine Slurm: daemons of this machine, no endpoint of AWS, Kubernetes or the Hub
LOCAL_ONLY |= {("sandbox", "slurm", verb) for verb in ("up", "down", "status")}


class Silent:
    """A TCP server on 127.0.0.1 that accepts every connection, reads nothing and writes nothing."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(128)
        self.port = self.sock.getsockname()[1]
        self.held: list[socket.socket] = []
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        self.sock.settimeout(0.2)
        while not self.stopping.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.held.append(conn)  # kept open, never answered

    def close(self) -> None:
        self.stopping.set()
        self.thread.join(5)
        for conn in [*self.held, self.sock]:
            conn.close()


@pytest.fixture(scope="module")
def silent() -> Iterator[Silent]:
    server = Silent()
    yield server
    server.close()


def _kubeconfig(path: Path, server: str, exec_plugin: list[str] | None = None) -> Path:
    user: dict = {"token": "not-a-secret-just-a-token"}
    if exec_plugin:
        user = {
            "exec": {
                "apiVersion": "client.authentication.k8s.io/v1beta1",
                "command": exec_plugin[0],
                "args": exec_plugin[1:],
                "interactiveMode": "Never",
            }
        }
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "c", "cluster": {"server": server, "insecure-skip-tls-verify": True}}
        ],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }
    path.write_text(json.dumps(config))
    return path


# a helper that never returns; its own words, so that the test finds it and only it among the
# processes
HANG = [sys.executable, "-c", f"import time; time.sleep(600)  # silent-endpoints {os.getpid()}"]


@dataclass(frozen=True)
class Outside:
    """Where every outside system is, and the words a failure must name."""

    env: dict[str, str]
    names: tuple[str, ...]


def silent_servers(silent: Silent, tmp: Path, scheme: str) -> Outside:
    at = f"127.0.0.1:{silent.port}"
    kubeconfig = _kubeconfig(tmp / f"kubeconfig-{scheme}", f"{scheme}://{at}")
    env = {
        "KUBECONFIG": str(kubeconfig),
        "AWS_ENDPOINT_URL": f"http://{at}",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_CONFIG_FILE": str(tmp / "no-aws-config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp / "no-aws-credentials"),
        "AWS_EC2_METADATA_DISABLED": "true",
        "HF_ENDPOINT": f"http://{at}",
        # the release files the deploy verbs apply: the vendored mirror
        "FSDPCTL_MANIFESTS": str(SHARED / "vendor"),
    }
    return Outside(env, (at, "REQUEST_TIMEOUT"))


def hanging_helpers(silent: Silent, tmp: Path) -> Outside:
    """The endpoints are silent too, but the helpers that fetch credentials come first and never
    return."""
    aws_config = tmp / "aws-config"
    aws_config.write_text(
        f"[profile stuck]\nregion = us-east-1\ncredential_process = {shlex.join(HANG)}\n"
    )
    kubeconfig = _kubeconfig(tmp / "kubeconfig-exec", f"https://127.0.0.1:{silent.port}", HANG)
    env = {
        "KUBECONFIG": str(kubeconfig),
        "AWS_CONFIG_FILE": str(aws_config),
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp / "no-aws-credentials"),
        "AWS_PROFILE": "stuck",
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{silent.port}",
        "AWS_EC2_METADATA_DISABLED": "true",
        "HF_ENDPOINT": f"http://127.0.0.1:{silent.port}",
        "FSDPCTL_MANIFESTS": str(SHARED / "vendor"),
    }
    return Outside(
        env, ("credential_process", "exec plugin", f"127.0.0.1:{silent.port}", "REQUEST_TIMEOUT")
    )


# ---- the commands ---------------------------------------------------------------------------------------


def commands() -> list[tuple[str, ...]]:
    """Every leaf command of the app, as a command line that reaches its outside system: BACKEND=eks
    for the job verbs, names for the positional arguments, repo ids for the hub, --dry-run=server
    where the API server is asked to check (that talks to it), and --dry-run where a command would
    otherwise change something outside (a client dry run may still read from AWS or the cluster)."""
    import typer.main

    from fsdpctl.cli import app

    def walk(cmd, path):
        subs = getattr(cmd, "commands", None)
        if subs:
            for name, sub in sorted(subs.items()):
                yield from walk(sub, (*path, name))
        else:
            yield path, cmd

    lines = []
    for path, cmd in walk(typer.main.get_command(app), ()):
        if path in LOCAL_ONLY:
            continue
        opts = {o for p in cmd.params for o in getattr(p, "opts", ())}
        args = [p for p in cmd.params if p.param_type_name == "argument"]
        # the hub's: a repo id and a cache directory of its own (the default is the cluster's
        # volume)
        positional = {
            ("job", "diff"): ["a-job", "b-job"],
            ("model", "fetch"): ["org/model", "--to", "hf"],
        }
        positional[("data", "fetch")] = ["org/data", "--to", "hf"]
        line = [*path, *positional.get(path, ["fsdp"] * len(args))]
        if "--dry-run-server" in opts:
            lines.append((*line, "--dry-run=server"))
        if "--dry-run" in opts:
            line.append("--dry-run")
        if "--yes" in opts:
            line.append("--yes")
        lines.append(tuple(line))
    return lines


# ---- running one, and what must hold -----------------------------------------------------------------------


class Hang(BaseException):
    pass


def _alarm(signum, frame):
    raise Hang(f"no return within {ALARM_S} s")


DEADLINE_S = 0.3  # REQUEST_TIMEOUT here: every wait on a silent endpoint is this long
SETTINGS = ("--set", "BACKEND=eks", "--set", f"REQUEST_TIMEOUT={DEADLINE_S}")


def run(args: tuple[str, ...]) -> tuple[CliResult, float]:
    """In process, under an alarm."""
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(ALARM_S)
    started = time.monotonic()
    try:
        result = invoke(*SETTINGS, *args, catch_exceptions=True)
    except Hang as e:
        result = CliResult(-1, "", "", "", e)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    return result, time.monotonic() - started


def broken(args: tuple[str, ...], result: CliResult, took: float, outside: Outside) -> list[str]:
    said = f"fsdpctl {' '.join(args)}: rc={result.exit_code} after {took:.1f} s\n{result.stderr[-1500:]}"
    if isinstance(result.exception, Hang):
        return [f"hung: {said}"]
    found = []
    allowed = JOB_WAIT if args[:2] == ("job", "wait") else DOCUMENTED
    if "internal error" in result.stderr or (
        result.exception is not None and not isinstance(result.exception, SystemExit)
    ):
        found.append(f"internal error: {said} {result.exception!r}")
    elif result.exit_code not in allowed:
        found.append(f"undocumented exit code: {said}")
    if TRACEBACK in result.stderr:
        found.append(f"traceback: {said}")
    errors = error_lines(result.stderr)
    if len(errors) > 1:
        found.append(f"more than one error line: {said}")
    # a failure that waited (at least one deadline) says what did not answer: on its error line, or
    # (`cluster check`, a report of checks) in the report it printed; one that failed at once did
    # not wait on anything outside (a local precondition: a release file missing from the mirror)
    told = errors or result.stdout.splitlines()
    local = [
        str(SHARED / "vendor")
    ]  # a release file of the mirror, named: a failure before any request
    if result.exit_code == 1 and not any(
        n in line for line in told for n in [*outside.names, *local]
    ):
        found.append(f"a failure that does not say what did not answer: {said}")
    return found


def _each(outside: Outside, monkeypatch) -> tuple[list[str], list[str]]:
    for key, value in outside.env.items():
        monkeypatch.setenv(key, value)
    from fsdptrain.hub import _DEADLINE
    from hub_peer import fresh_hub_client

    fresh_hub_client()
    failures, seen = [], []
    try:
        for args in commands():
            result, took = run(args)
            seen.append(f"{' '.join(args)}: {result.exit_code} in {took:.1f} s")
            failures += broken(args, result, took, outside)
    finally:
        _DEADLINE.seconds = None  # the hub client is shared by the process: no deadline left behind
    return failures, seen


@pytest.mark.slow
def test_every_command_returns_against_endpoints_that_never_answer(
    silent, cli, tmp_path, monkeypatch
):
    """The Kubernetes API (https: a TLS handshake that never completes), AWS and the Hub all accept
    and never answer: every command returns within its deadline and names the endpoint or
    REQUEST_TIMEOUT. (An http API server that reads the request and never answers: the fast lane's
    `job list` case.)"""
    failures, seen = _each(silent_servers(silent, tmp_path, "https"), monkeypatch)
    print("\n" + "\n".join(seen), file=sys.stderr)
    assert not failures, f"{len(failures)} commands broke:\n\n" + "\n\n".join(failures)


@pytest.mark.slow
def test_every_command_returns_when_the_credential_helpers_never_return(
    silent, cli, tmp_path, monkeypatch
):
    """An AWS profile whose credential_process and a kubeconfig whose exec plugin never return: each
    is killed at the deadline and named."""
    failures, seen = _each(hanging_helpers(silent, tmp_path), monkeypatch)
    print("\n" + "\n".join(seen), file=sys.stderr)
    assert not failures, f"{len(failures)} commands broke:\n\n" + "\n\n".join(failures)


@pytest.mark.parametrize(
    "args",
    [
        pytest.param(("cluster", "status"), marks=pytest.mark.slow),
        ("job", "list"),
        ("deploy", "status"),
        pytest.param(("model", "fetch", "org/model", "--to", "hf"), marks=pytest.mark.slow),
    ],
    ids=" ".join,
)
def test_the_named_silent_endpoint_cases_return_naming_it(silent, cli, tmp_path, monkeypatch, args):
    """The cases the issue names, in the fast lane: `cluster status`, `job list --backend eks` and
    `deploy status` against an API that accepts and never answers, and `model fetch` against such a
    hub."""
    outside = silent_servers(silent, tmp_path, "http" if args == ("job", "list") else "https")
    for key, value in outside.env.items():
        monkeypatch.setenv(key, value)
    from fsdptrain.hub import _DEADLINE
    from hub_peer import fresh_hub_client

    fresh_hub_client()
    try:
        result, took = run(args)
    finally:
        _DEADLINE.seconds = None
    assert not broken(args, result, took, outside), result.stderr
    assert result.exit_code == 1 and took < 10, (took, result.stderr)


def test_a_credential_process_that_never_returns_is_killed_and_named(
    silent, cli, tmp_path, monkeypatch
):
    """`cluster status` with a profile whose credential_process never returns (the issue's case):
    one line naming it, exit 1, within the deadline, and the helper is not left running."""
    outside = hanging_helpers(silent, tmp_path)
    for key, value in outside.env.items():
        monkeypatch.setenv(key, value)
    result, took = run(("cluster", "status"))
    assert result.exit_code == 1 and took < 10, result.stderr
    assert (
        f"credential_process of AWS profile 'stuck' did not finish within {DEADLINE_S:g} s"
        in result.stderr
    )
    assert len(error_lines(result.stderr)) == 1
    still = [p for p in Path("/proc").iterdir() if p.name.isdigit() and _is_hang(p)]
    assert not still, "the credential_process was left running"


def _is_hang(proc: Path) -> bool:
    try:
        argv = (proc / "cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return argv[:3] == [a.encode() for a in HANG] and os.getppid() != int(proc.name)

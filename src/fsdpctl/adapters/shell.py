"""Adapter: every outside program fsdpctl starts goes through here.

- `run`: a tool the user sees work (eksctl, terraform, docker build/push), its output streamed line
  by line and appended to a log file; with `dry_run` nothing runs and the exact command line is
  reported instead.
- `capture`: a short query whose output is read (`docker version`, `nvidia-smi`, `fi_info`), bounded
  in time.
- `spawn`: a long-lived process fsdpctl supervises (torchrun launchers, etcd), detached from the
  terminal.

A program that is not on PATH raises `ToolMissing` (one line and how to install it), a `capture`
past its time limit raises `ToolTimeout`; both are fsdpctl errors, so a command needs no conversion
of its own.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import stat
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from fsdpctl import files
from fsdpctl.errors import FsdpctlError
from fsdpctl.redact import redact

INSTALL_HINTS = {
    "eksctl": "install eksctl: https://eksctl.io/installation/ (a single binary; `eksctl version` to check)",
    "terraform": "install terraform >= 1.6: https://developer.hashicorp.com/terraform/install",
    "docker": "install Docker (Debian: apt-get install docker.io) and start the engine",
    "etcd": "apt-get install etcd-server (or use RDZV_BACKEND=c10d)",
    "tensorboard": "pip install 'fsdpctl[trackers]' (it brings the tensorboard command)",
}


class ToolMissing(FsdpctlError):
    def __init__(self, tool: str):
        super().__init__(
            f"{tool} is not installed or not on PATH",
            hint=INSTALL_HINTS.get(tool, f"install {tool}"),
        )
        self.tool = tool


class ToolTimeout(FsdpctlError):
    def __init__(self, argv: list[str], timeout: float):
        super().__init__(f"`{shlex.join(argv)}` did not finish within {timeout:g} s")
        self.timeout = timeout


@dataclass(frozen=True)
class Command:
    argv: list[str]
    env: dict[str, str]  # only what is added to the caller's environment
    cwd: Path | None = None

    def shell_line(self) -> str:
        """The command as a user would type it: `cd DIR && KEY=VALUE ... tool args`."""
        prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items()))
        cd = f"cd {shlex.quote(str(self.cwd))} && " if self.cwd else ""
        return cd + (prefix + " " if prefix else "") + shlex.join(self.argv)


# How an outside program's output is read: as UTF-8 whatever the locale (sbatch, scontrol, kubectl,
# git print UTF-8 or ASCII), a byte that is not UTF-8 shown escaped (`\xff`) rather than an
# internal error (UnicodeDecodeError) in the middle of a verb. A line still reads, and what is
# parsed from it (an id, a state) is checked by its parser as any other text.
DECODING: dict[str, Any] = {"encoding": "utf-8", "errors": "backslashreplace"}


@dataclass(frozen=True)
class Captured:
    rc: int
    stdout: str
    stderr: str


def which(program: str) -> str:
    """The program's path; ToolMissing (named by its base name) when it is not there."""
    exe = shutil.which(program)
    if exe is None:
        raise ToolMissing(Path(program).name)
    return exe


def replace_process(argv: list[str]) -> NoReturn:
    """This process becomes `argv` (os.execv): a long-running tool (TensorBoard) owns the terminal,
    its Ctrl-C and the exit code. The program is looked up beside this Python first (its virtual
    environment's bin/, where pip put it), then on PATH."""
    here = str(Path(sys.executable).parent)
    exe = shutil.which(argv[0], path=os.pathsep.join([here, os.environ.get("PATH", "")]))
    if exe is None:
        raise ToolMissing(argv[0])
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(exe, [exe, *argv[1:]])


def run(
    cmd: Command,
    *,
    log_file: Path,
    on_line: Callable[[str], None] | None = None,
    stdin_text: str | None = None,
    dry_run: bool = False,
) -> int:
    """Run to completion, streaming each output line to `on_line` and appending it to `log_file`;
    returns the exit code.

    `stdin_text` (a password for `docker login --password-stdin`) goes to the process only, never to
    the log. With `dry_run` the program is neither looked up nor started and the log is not touched:
    `on_line` receives the one line `cmd.shell_line()` (what would run, where, with which added
    environment) and the result is 0.
    """
    if dry_run:
        if on_line:
            on_line(cmd.shell_line())
        return 0
    exe = which(cmd.argv[0])
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with _append(log_file, text=True) as log:
        log.write(redact(f"$ {cmd.shell_line()}\n"))
        log.flush()
        with subprocess.Popen(
            [exe, *cmd.argv[1:]],
            env={**os.environ, **cmd.env},
            cwd=cmd.cwd,
            text=True,
            **DECODING,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL if stdin_text is None else subprocess.PIPE,
        ) as proc:
            assert proc.stdout is not None  # both are PIPEs above
            if proc.stdin is not None:
                proc.stdin.write(stdin_text or "")
                proc.stdin.close()
            for line in proc.stdout:
                log.write(redact(line))
                if on_line:
                    on_line(line.rstrip("\n"))
            return proc.wait()


LOG_MODE = 0o644  # a log anyone on the machine may read, only its writer write, whatever the umask


def _append(path: Path, text: bool = False) -> Any:
    """`path` opened to append to, made with LOG_MODE; a log of ours that others may write (made
    under umask 000) loses that write bit."""
    fd = files.open_append(path, LOG_MODE)  # a link or FIFO there: refused, never followed
    st = os.fstat(fd)
    if st.st_uid == os.geteuid() and st.st_mode & 0o022:
        os.fchmod(fd, stat.S_IMODE(st.st_mode) & ~0o022)
    return os.fdopen(fd, "a" if text else "ab")


def capture(
    argv: list[str], *, timeout: float, env: dict[str, str] | None = None, cwd: Path | None = None
) -> Captured:
    """Run to completion and return its exit code and output. `env` is the whole environment of the
    program (None: this process's). ToolMissing when the program is absent, ToolTimeout (the process
    killed) after `timeout` seconds."""
    exe = which(argv[0])
    # its own process group, so that a timeout (or Ctrl-C) also ends what it started: a child left
    # holding the output pipes would keep us waiting after the program itself was killed
    with subprocess.Popen(
        [exe, *argv[1:]],
        env=env,
        cwd=cwd,
        text=True,
        **DECODING,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    ) as proc:
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired as e:
            _kill_group(proc)
            raise ToolTimeout(argv, timeout) from e
        except BaseException:
            _kill_group(proc)
            raise
    return Captured(proc.returncode, stdout, stderr)


def _kill_group(proc: subprocess.Popen[str]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:  # gone already
        pass
    proc.communicate()


def spawn(
    argv: list[str],
    *,
    env: dict[str, str],
    log: Path | None = None,
    cwd: Path | None = None,
    new_session: bool = True,
    stamped: bool = False,
) -> subprocess.Popen[bytes]:
    """Start a process that outlives this call; the caller waits for it or stops it. `env` is its
    whole environment; stdin is /dev/null, stdout and stderr are appended to `log` (discarded
    without one); `new_session` detaches it from the terminal's signals (Ctrl-C stops fsdpctl, not
    the job). `stamped`: the output goes through a log relay that writes each line in the CRI log
    format with its time, as a container runtime does (fsdpctl.adapters.logrelay); the relay is the
    returned process's `relay` attribute."""
    exe = which(argv[0])
    if stamped and log is not None:
        return _spawn_relayed([exe, *argv[1:]], env=env, log=log, cwd=cwd, new_session=new_session)
    with _append(log) if log is not None else open(os.devnull, "wb") as sink:
        return subprocess.Popen(
            [exe, *argv[1:]],
            env=env,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=new_session,
        )


# what the relay needs from this environment to import fsdpctl; nothing else (no secrets, no pod
# marks: the relay is the runtime's, not the pod's; it ends when the pod's last process closes the
# pipes)
RELAY_ENV = ("PATH", "PYTHONPATH", "PYTHONDONTWRITEBYTECODE", "LANG", "LC_ALL", "HOME")


def _spawn_relayed(
    argv: list[str], *, env: dict[str, str], log: Path, cwd: Path | None, new_session: bool
) -> subprocess.Popen[bytes]:
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    try:
        relay = subprocess.Popen(
            [sys.executable, "-m", "fsdpctl.adapters.logrelay", str(log), str(err_r)],
            env={k: v for k, v in os.environ.items() if k in RELAY_ENV},
            stdin=out_r,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            pass_fds=(err_r,),
            start_new_session=True,
        )
        try:
            proc = subprocess.Popen(
                argv,
                env=env,
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=out_w,
                stderr=err_w,
                start_new_session=new_session,
            )
        except BaseException:
            relay.kill()
            relay.wait()
            raise
    # the children hold their ends now: the relay sees EOF once the process and its children end
    finally:
        for fd in (out_r, out_w, err_r, err_w):
            os.close(fd)
    proc.relay = relay  # type: ignore[attr-defined]
    return proc


# ---- processes a library starts for fsdpctl ------------------------------------------------------


class Overdue(BaseException):
    """A process a library started did not end within its deadline. A BaseException: the kubernetes
    client runs its exec plugin inside `except Exception` (kube_config.py `_load_from_exec_plugin`),
    which would turn a hang into a log line and a request without credentials; this one reaches the
    adapter that gave the deadline, which says it in fsdpctl's words."""

    def __init__(self, what: str, deadline: float):
        super().__init__(f"{what} did not finish within {deadline:g} s")
        self.what, self.deadline = what, deadline


def bounded_popen(deadline: float, what: str) -> type[subprocess.Popen]:
    """A Popen for a library that starts a helper process and waits on it with no timeout of its
    own: botocore's ProcessProvider (`credential_process`: `p.communicate()`) and the kubernetes
    client's ExecProvider (a kubeconfig's exec plugin, e.g. `aws eks get-token`:
    `process.communicate()`). Its communicate waits at most `deadline` seconds, then kills the
    helper and raises Overdue."""

    class Bounded(subprocess.Popen):
        def communicate(self, input=None, timeout=None):  # noqa: A002 - Popen's own signature
            try:
                return super().communicate(input, deadline if timeout is None else timeout)
            except subprocess.TimeoutExpired:
                self.kill()
                super().communicate()
                raise Overdue(what, deadline) from None

    return Bounded


def end(proc: subprocess.Popen[bytes], timeout: float = 10) -> None:
    """A helper process this adapter started (etcd, the rendezvous store) ended: SIGTERM, SIGKILL
    after `timeout`, reaped either way (no zombie left)."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

"""stdout and stderr are fallible (issue 37): every view command, whatever stream it meets, ends with
one line and exit 1 (a reader that went away, `| head`: nothing and exit 141, as Unix tools that die
of SIGPIPE; issue 44), never a traceback or an internal error; data formats are written byte for byte;
terminal text never carries a raw control or escape sequence; a narrow terminal gets `key: value`
lines.

What the streams do, as the real systems do it: a write to /dev/full fails with ENOSPC (null(4):
"Writes to /dev/full fail with an ENOSPC error"); a write to a pipe whose reading end is closed fails
with EPIPE once SIGPIPE is ignored, as CPython ignores it at start (pipe(7); Python's signal module
docs, "Note on SIGPIPE"); a command started with `>&-` has no descriptor 1, which CPython turns into
`sys.stdout = None` (Python's sys docs: "stdin, stdout and stderr ... can be None"); an encoding that
has no byte for a character raises UnicodeEncodeError on write (PYTHONIOENCODING=ascii). GNU
coreutils answer each with one line, `write error: <strerror>`, and exit 1, or exit 1 alone when
stderr is gone too (gnulib lib/closeout.c close_stdout, lib/close-stream.c: EBADF with nothing
written is no error).

Peers: the real streams themselves, in process (the view command runs with sys.stdout pointed at
/dev/full, at a pipe whose reader is closed, at an ASCII-only text stream, or None) and through the
real executable (`fsdpctl ... >/dev/full`, `>&-`, `>&- 2>&-`, a reader that closes early,
PYTHONIOENCODING=ascii); a pseudo-terminal (pty(7)) 10 columns wide for the narrow table; the jobs
they read are real local jobs, run by the real supervisor (tests/state_home.py).
"""

from __future__ import annotations

import contextlib
import fcntl
import io
import os
import pty
import select
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import state_home
from conftest import FSDPCTL_EXE, invoke

LOST = "error: cannot write to stdout: "

# every command that shows something on stdout, with what it needs to show it (the jobs of state_home)
VIEWS: tuple[tuple[str, ...], ...] = (
    ("job", "list"),
    ("job", "status", "alpha"),
    ("job", "status", "beta", "-o", "json"),
    ("job", "logs", "alpha"),
    ("job", "logs", "beta", "--all"),
    ("job", "describe", "alpha"),
    ("job", "describe", "alpha", "-o", "env"),
    ("job", "describe", "beta", "-o", "yaml"),
    ("job", "history", "alpha"),
    ("job", "diff", "alpha", "beta"),
    ("plan",),
    ("config", "show"),
    ("config", "show", "-o", "yaml"),
    ("config", "validate", "-o", "json"),
    ("manifest", "-o", "json"),
    ("--help",),
    ("job", "--help"),
    ("job", "list", "--help"),
    ("--version",),
)
SITUATIONS = ("full", "epipe", "closed", "closed-both", "ascii")


@pytest.fixture(scope="module")
def home(tmp_path_factory) -> Iterator[Path]:
    """Two ended local jobs (tests/state_home.py), alpha and beta, read by every case."""
    root = tmp_path_factory.mktemp("streams")
    template, home = root / "template", root / "home"
    saved = {k: os.environ.get(k) for k in ("FSDPCTL_HOME", "FSDPCTL_LOCAL_NETNS")}
    os.environ.update(FSDPCTL_HOME=str(template), FSDPCTL_LOCAL_NETNS="0")
    try:
        state_home.build(template)
    finally:
        for k, v in saved.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    state_home.copy(template, home)
    yield home


@pytest.fixture
def room(cli, home, monkeypatch) -> Path:
    monkeypatch.setenv("FSDPCTL_HOME", str(home))
    monkeypatch.setenv("FSDPCTL_LOCAL_NETNS", "0")
    # a value no ASCII stream can take, so the `ascii` case has something to refuse
    (cli.cwd / ".env").write_text("DATASET_SPLIT=train-été\n")
    return cli.cwd


@contextlib.contextmanager
def streams(situation: str, err_path: Path) -> Iterator[None]:
    """sys.stdout (and for closed-both sys.stderr) as the situation has them; stderr into a file."""
    saved = sys.stdout, sys.stderr
    opened: list[io.IOBase] = []
    err = open(err_path, "w", encoding="utf-8")  # noqa: SIM115
    opened.append(err)
    if situation == "full":
        out = open("/dev/full", "w", encoding="utf-8")  # noqa: SIM115
        opened.append(out)
    elif situation == "epipe":
        read, write = os.pipe()
        os.close(read)  # the reader went away before anything was written
        out = os.fdopen(write, "w", encoding="utf-8")
        opened.append(out)
    elif situation == "ascii":
        out = io.TextIOWrapper(io.BytesIO(), encoding="ascii", errors="strict")
        opened.append(out)
    else:
        out = None
    sys.stdout = out
    sys.stderr = None if situation == "closed-both" else err
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved
        for f in opened:
            with contextlib.suppress(OSError, ValueError):
                f.close()


def run_in(situation: str, args: tuple[str, ...], tmp: Path) -> tuple[int, str]:
    """The command as the executable runs it (fsdpctl.cli.main: the group, then streams.finish), in
    this process, with the situation's streams; (exit code, stderr)."""
    import typer.main

    from fsdpctl.cli import app
    from fsdpctl.cli import streams as out_streams
    from fsdpctl.redact import forget

    forget()
    command = typer.main.get_command(app)
    err_path = tmp / "stderr.txt"
    with streams(situation, err_path):
        try:
            command.main(list(args), prog_name="fsdpctl")
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
        code = out_streams.finish(code)
    return code, err_path.read_text()


def check(situation: str, args: tuple[str, ...], code: int, stderr: str) -> None:
    """The invariant: exit 1 and, where stderr stands, its last line says stdout was lost and no
    other line is an error; never a traceback or an internal error. An ASCII stream may take all a
    command says (then it succeeds)."""
    said = f"fsdpctl {' '.join(args)} [{situation}]: exit {code}\n{stderr}"
    assert "Traceback" not in stderr and "internal error" not in stderr, said
    if situation == "ascii" and code == 0:
        return
    if situation == "epipe":  # a reader gone (`| head`): silent, 141, as Unix tools (issue 44)
        assert code == 141 and not [x for x in stderr.splitlines() if x.startswith("error:")], said
        return
    assert code == 1, said
    if situation == "closed-both":
        assert stderr == "", said
        return
    lines = stderr.splitlines()
    assert lines and lines[-1].startswith(LOST), said
    assert [line for line in lines if line.startswith("error:")] == [lines[-1]], said
    reason = {"full": "(ENOSPC)", "epipe": "(EPIPE)", "closed": "(EBADF)", "ascii": "U+"}
    assert reason[situation] in lines[-1], said


@pytest.mark.slow  # 3-7 s: the fast lane keeps under 2 minutes; no training processes, so
@pytest.mark.beside  # CI runs it beside the serial slow lane
def test_every_view_command_on_every_stream_that_fails(room, tmp_path):
    """The whole product: each view command x each situation, in process (about a second for all)."""
    for args in VIEWS:
        for situation in SITUATIONS:
            code, stderr = run_in(situation, args, tmp_path)
            check(situation, args, code, stderr)


@settings(
    max_examples=15,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    args=st.sampled_from(VIEWS),
    situation=st.sampled_from(SITUATIONS),
    debug=st.booleans(),
    warned=st.lists(st.sampled_from(["NO_SUCH_KEY=1", "MODLE=7b", "FSDPCTL_X=1"]), max_size=2),
)
def test_a_lost_stdout_is_one_line_whatever_else_the_command_says(
    room, tmp_path, args, situation, debug, warned
):
    """Generated: with --debug, and with warnings on stderr before the loss, it is still one error
    line (a warning is not an error) and exit 1; --debug adds no traceback for a lost stream."""
    (room / ".env").write_text("DATASET_SPLIT=train-été\n" + "".join(f"{w}\n" for w in warned))
    code, stderr = run_in(situation, (*(("--debug",) if debug else ()), *args), tmp_path)
    check(situation, args, code, stderr)


# ---- the real executable ---------------------------------------------------------------------------------


def _exe() -> list[str]:
    return [str(FSDPCTL_EXE)] if FSDPCTL_EXE.exists() else [sys.executable, "-m", "fsdpctl.cli"]


REAL = {
    "full": ">/dev/full",
    "closed": ">&-",
    "closed-both": ">&- 2>&-",
}


REAL_CASES = [
    *((("config", "show"), s) for s in (*REAL, "epipe", "ascii")),
    (("--help",), "full"),
    (("--help",), "epipe"),
    (("job", "list"), "closed"),
]


# in the fast lane: one case per way the interpreter meets the stream (at a write, at start, at its
# last flush); the others in the slow lane
FAST_REAL = {
    (("config", "show"), "full"),
    (("config", "show"), "closed-both"),
    (("--help",), "epipe"),
}


@pytest.mark.parametrize(
    "args, situation",
    [
        pytest.param(a, s, marks=() if (a, s) in FAST_REAL else pytest.mark.slow)
        for a, s in REAL_CASES
    ],
    ids=[f"{' '.join(a)}-{s}" for a, s in REAL_CASES],
)
def test_the_real_executable(room, situation, args):
    """As a shell starts it: the redirection applies to the process itself, so the interpreter's own
    start (stdout None) and exit (its last flush) are in the case; nothing is written twice or
    reported as "Exception ignored", and the exit code is the shell's."""
    command = " ".join([*map(_quote, _exe()), *map(_quote, args)])
    env = {**os.environ}
    if situation == "ascii":
        env["PYTHONIOENCODING"] = "ascii"
    if situation == "epipe":
        proc = subprocess.Popen(
            ["sh", "-c", f"exec {command}"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            env=env,
        )
        proc.stdout.close()  # the reader is gone before the command has written anything
        stderr = proc.stderr.read().decode()
        code = proc.wait(timeout=120)
    else:
        p = subprocess.run(
            ["sh", "-c", f"{command} {REAL.get(situation, '>/dev/null')}"],
            capture_output=True,
            env=env,
            timeout=120,
            stdin=subprocess.DEVNULL,
        )
        code, stderr = p.returncode, p.stderr.decode()
    assert "Exception ignored" not in stderr, stderr
    check(situation, args, code, stderr)


def _quote(word: str) -> str:
    import shlex

    return shlex.quote(word)


def test_a_command_that_writes_nothing_to_a_closed_stdout_succeeds(room):
    """close_stream: EBADF with nothing pending is not a failure (`true >&-` exits 0); a command
    that writes only to stderr (`config validate` says its ✓ there) succeeds with stdout closed."""
    p = subprocess.run(
        ["sh", "-c", " ".join(map(_quote, [*_exe(), "config", "validate"])) + " >&-"],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert p.returncode == 0 and "settings valid" in p.stderr, p.stderr


def test_a_closed_stdout_is_not_reused_by_a_file_the_command_opens(room, tmp_path):
    """With descriptor 1 closed, the next open(2) returns 1 (the lowest free number): a file written
    there would become stdout. The executable puts /dev/null on it first, so `manifest --out-dir`
    writes its files whole and stdout's write still fails once."""
    out = tmp_path / "out"
    p = subprocess.run(
        ["sh", "-c", " ".join(map(_quote, [*_exe(), "manifest", "--out-dir", str(out)])) + " >&-"],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert "Traceback" not in p.stderr, p.stderr
    for f in out.rglob("*.yaml"):
        text = f.read_text()
        assert text.startswith(("apiVersion", "#", "---", "kind")), (f, text[:200])


# ---- byte-exact data, escaped terminal text ------------------------------------------------------------

TRICKY_VALUES = st.text(
    alphabet=st.sampled_from(list("ab =#'\"\\$\t\r\n é") + ["\x1b", "\x07", "\x00"]), max_size=12
).filter(lambda v: "\x00" not in v)


@settings(
    max_examples=20,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(value=TRICKY_VALUES)
def test_describe_env_reproduces_every_value_byte_for_byte(cli, value):
    """`job describe -o env` is the .env that reproduces the run: read back by python-dotenv (the
    grammar fsdpctl's own reader follows), every setting is the value the run had, TABs and CRs
    and quotes included (rich's rendering turned a TAB into spaces and dropped a CR)."""
    from dotenv import dotenv_values

    from fsdpctl.job import store as record_store
    from fsdpctl.settings import load

    cfg = load(flags={"DATASET_SPLIT": value, "JOB_NAME": "exact"})
    rec = record_store.new(cfg, "exact-run-1")
    record_store.save(rec)
    r = invoke("job", "describe", rec["id"], "-o", "env")
    assert r.exit_code == 0, r.output
    back = dotenv_values(stream=io.StringIO(r.stdout), interpolate=False)
    assert back["DATASET_SPLIT"] == value
    assert back == {k: v for k, v in rec["settings"].items()}


CONTROL = st.sampled_from(
    [
        "\x1b]0;pwned\x07",
        "\x1b[2J",
        "\x1b[31m",
        "\x9b31m",
        "\r",
        "\x08",
        "\x7f",
        "\u202e",
        "\x00",
        "\x1b]8;;x\x1b\\",
    ]
)


@settings(
    max_examples=25,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    parts=st.lists(st.one_of(CONTROL, st.text("abc-_./", max_size=4)), min_size=1, max_size=5),
    key=st.sampled_from(["DATASET_SPLIT", "WANDB_PROJECT", "JOB_NAME", "NO_SUCH_KEY", "MODEL"]),
    command=st.sampled_from(
        [("config", "show"), ("config", "validate"), ("plan",), ("job", "list")]
    ),
)
def test_no_control_sequence_reaches_the_terminal(cli, parts, key, command):
    """Generated: control characters and escape sequences (OSC set-title, CSI, 8-bit CSI, a bidi
    override, a hyperlink) in a setting's value, shown by a table, an error or a warning, are
    printed escaped: no byte of ECMA-48's C0 (but newline) or C1 sets reaches either stream raw."""
    from fsdpctl.cli.streams import CONTROLS

    value = "".join(parts)
    quoted = (
        value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\r", "\\r")
    )
    (cli.cwd / ".env").write_text(f'{key}="{quoted}"\n', encoding="utf-8")
    r = invoke(*command)
    for name, text in (("stdout", r.stdout), ("stderr", r.stderr)):
        raw = CONTROLS.search(text.replace("\t", " "))
        assert raw is None, f"{name} holds {raw.group(0)!r}:\n{text}"


# ---- a narrow terminal -------------------------------------------------------------------------------


def _table_at(width: int, table) -> str:
    from rich.console import Console

    console = Console(file=io.StringIO(), width=width, force_terminal=True, color_system=None)
    console.print(table)
    return console.file.getvalue()


def _report(job: str, run_id: str) -> dict:
    return {
        "job": job,
        "backend": "local",
        "phase": "Running",
        "run_id": run_id,
        "nodes": 2,
        "nodes_running": 2,
        "restarts": 0,
        "age_s": 65.0,
        "step": 3,
        "max_steps": 10,
        "loss": 2.5,
        "leader": "node-0",
        "leader_log": f"/var/log/{job}/node-0.log",
        "checkpoint": None,
        "reason": None,
        "problems": [],
        "stalled": False,
        "labels": {},
        "prestep": None,
        "network": None,
        "tokens_per_s": 1.0,
    }


@pytest.mark.parametrize("width", [10, 20, 30])
def test_a_narrow_terminal_gets_key_value_lines(width):
    """A table that cannot give each column room shows each row as `key: value` lines, every value
    whole (wrapped, never cut to nothing)."""
    from fsdpctl.cli import job_view

    reports = [_report("alpha", "alpha-run-1"), _report("beta-long-name", "beta-run-2")]
    text = _table_at(width, job_view.list_table(reports))
    flat = "".join(text.split())
    for r in reports:
        for value in (r["job"], r["run_id"], "Running", "3/10"):
            assert "".join(value.split()) in flat, text
    assert "job:" in text and "run:" in text, text
    wide = _table_at(200, job_view.list_table(reports))
    assert "job:" not in wide and wide.splitlines()[0].split()[:2] == ["job", "backend"], wide


def test_a_ten_column_pseudo_terminal_shows_job_list_as_lines(room):
    """The real executable on a pseudo-terminal of 10 columns (TIOCSWINSZ, tty_ioctl(4)): rich takes
    the size from the terminal; `job list` shows every job by name, not zero-width columns."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 10, 0, 0))
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    proc = subprocess.Popen(
        [*_exe(), "job", "list"],
        stdin=follower,
        stdout=follower,
        stderr=follower,
        env=env,
        close_fds=True,
    )
    os.close(follower)
    out = b""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        ready, _, _ = select.select([leader], [], [], 1)
        if ready:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO: the other side closed
                break
            if not chunk:
                break
            out += chunk
        elif proc.poll() is not None:
            break
    os.close(leader)
    assert proc.wait(timeout=30) == 0, out
    text = out.decode(errors="replace")
    flat = "".join(text.split())
    assert "job:alpha" in flat and "job:beta" in flat, text


LIVE = """
import time
from rich.progress import Progress
from fsdpctl.cli.common import err, out
with err.status("waiting"):
    time.sleep(0.3)
with Progress(console=err) as bar:
    task = bar.add_task("training", total=3)
    for _ in range(3):
        bar.update(task, advance=1)
        out.print("a line on stdout while the bar shows")
        print("a plain print while the bar shows")
err.print("done")
"""


def test_a_live_display_on_a_terminal_writes_through_the_one_writer(tmp_path):
    """On a terminal rich's live displays (the follow's progress bar, a spinner) put their own
    FileProxy in sys.stdout and sys.stderr (rich/live.py, redirect_stdout/redirect_stderr): the
    writer writes to the stream behind it, as rich's Console.file does (`rich_proxied_file`), else
    each write came back to it without end. A pseudo-terminal (pty(7)) as the terminal, bounded."""
    leader, follower = pty.openpty()
    env = {**os.environ, "TERM": "xterm-256color"}
    env.pop("NO_COLOR", None)
    proc = subprocess.Popen(
        [sys.executable, "-c", LIVE], stdin=follower, stdout=follower, stderr=follower, env=env
    )
    os.close(follower)
    out = b""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        ready, _, _ = select.select([leader], [], [], 0.5)
        if ready:
            try:
                chunk = os.read(leader, 65536)
            except OSError:
                break
            if not chunk:
                break
            out += chunk
        elif proc.poll() is not None:
            break
    os.close(leader)
    try:
        code = proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail(f"the live display did not end: {out[-500:]!r}")
    assert code == 0, out
    text = out.decode(errors="replace")
    assert text.count("a line on stdout while the bar shows") == 3, text
    assert text.count("a plain print while the bar shows") == 3 and "done" in text, text


def test_a_followed_job_speaks_off_a_terminal(capsys, monkeypatch):
    """Off a terminal no bar is drawn (rich draws its live display only on one), and a followed job
    or quickstart was silent until its end (65 s in the quickstart; issue 44). Now: a plain line when
    its stage changes, and one every PLAIN_EVERY_S while it stays."""
    from fsdpctl.cli import job_view

    clock = [100.0]
    monkeypatch.setattr(job_view.time, "monotonic", lambda: clock[0])
    base = {"phase": "Running", "max_steps": None, "prestep": None, "step": 0, "loss": None}
    seen = [
        {**base, "phase": "Pending"},
        {**base, "stage": "rendezvous 1/2"},
        {**base, "stage": "rendezvous 1/2"},  # the same stage: nothing new to say
        {**base, "stage": "loading data"},
        {**base, "max_steps": 600, "step": 3, "loss": 4.5, "tokens_per_s": 900.0},
        {**base, "max_steps": 600, "step": 9, "loss": 4.1, "tokens_per_s": 910.0},  # < 30 s
    ]
    spoken = job_view.Spoken("first")
    for r in seen:
        spoken.say(r)
        clock[0] += 5
    clock[0] += job_view.PLAIN_EVERY_S
    spoken.say({**base, "max_steps": 600, "step": 200, "loss": 3.0, "tokens_per_s": 905.0})
    lines = capsys.readouterr().err.splitlines()
    assert lines == [
        "first: pending ...",
        "first: rendezvous 1/2 ...",
        "first: loading data ...",
        "first: step 3/600 | loss 4.5000 | 900 tok/s",
        "first: step 200/600 | loss 3.0000 | 905 tok/s",
    ]

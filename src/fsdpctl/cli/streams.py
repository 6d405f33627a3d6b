"""The one writer of fsdpctl's stdout and stderr. Every console (fsdpctl.cli.common `out`, `err`),
every data document (-o json/yaml/env) and the CLI's own last lines write through here, so a stream
that cannot take the text is met in one place, as GNU coreutils meet it (gnulib lib/closeout.c
close_stdout and lib/close-stream.c close_stream): a failed write to stdout (ENOSPC on /dev/full,
EPIPE from a reader that closed, EBADF from `>&-`, EIO from a terminal gone, an encoding that has no
such character) is one line on stderr, `error: cannot write to stdout: <reason>`, and exit 1; when
stderr is gone too, the exit code alone. A reader that went away (EPIPE: `fsdpctl job logs | head`)
gets no line and exit 141, as a Unix tool that SIGPIPE ended (CPython ignores SIGPIPE, so here it is
an error to meet, not a death). A stdout that is closed but never written to is no error
(close_stream: EBADF with nothing pending). A failure on stderr is silent and makes a command that
would have succeeded exit 1 (close_stdout: `_exit (exit_failure)` when stderr does not close).

Data formats are written byte-exact: UTF-8 to the stream's bytes, never through the console's
rendering (rich expands a TAB to spaces and drops a CR). Terminal text is shown with its control
and escape characters escaped (`escape_controls`): a value holding ESC ] 0 ; ... BEL (OSC: set the
window title) or a CSI sequence is printed as `\\x1b]0;...`, never obeyed by the terminal."""

from __future__ import annotations

import errno
import io
import os
import re
import sys
from typing import Any, Literal

from fsdpctl.errors import ExitCode

Name = Literal["stdout", "stderr"]

# ---- terminal text -------------------------------------------------------------------------------

# C0 controls but TAB and LF, DEL, the C1 controls (U+0080-U+009F: U+009B is a one-character CSI on
# terminals that take 8-bit controls, ECMA-48 section 5.3), and Unicode's bidirectional overrides
# and isolates (U+202A-U+202E, U+2066-U+2069: they reorder what a terminal shows, CVE-2021-42574)
CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


# ...and in one value (a table's cell): TAB and LF too, which would break the row
CONTROLS_IN_A_VALUE = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
NAMED = {"\r": "\\r", "\n": "\\n", "\t": "\\t"}


# lone surrogates: a byte that was not UTF-8 in a path or in what an outside program printed, as
# Python gives it (surrogateescape: U+DC80-U+DCFF for bytes 0x80-0xFF; PEP 383). No stream can
# encode one (sys.stdout raises UnicodeEncodeError): shown as the byte it was, `\xff`.
SURROGATES = re.compile("[\ud800-\udfff]")


def _surrogate(m: re.Match[str]) -> str:
    c = ord(m.group(0))
    return f"\\x{c - 0xDC00:02x}" if 0xDC80 <= c <= 0xDCFF else f"\\u{c:04x}"


def escape_surrogates(text: str) -> str:
    """`text` with each lone surrogate shown escaped: the byte it stands for (`\\xff`)."""
    return SURROGATES.sub(_surrogate, text)


def _escaped(m: re.Match[str]) -> str:
    c = m.group(0)
    if c in NAMED:
        return NAMED[c]
    return f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}"


def escape_controls(text: str, *, value: bool = False) -> str:
    """`text` with every control character shown escaped (`\\x1b`, `\\r`, `\\u202e`); TAB and
    newlines stay, unless `value` (one value, one line: `\\t`, `\\n`)."""
    return escape_surrogates((CONTROLS_IN_A_VALUE if value else CONTROLS).sub(_escaped, text))


# ---- the streams ---------------------------------------------------------------------------------


class OutputLost(BaseException):  # noqa: N818 (a BaseException, as KeyboardInterrupt is)
    """stdout cannot take what the command writes. A BaseException so that no `except Exception`
    of a command takes it for its own failure: the command ends here (the CLI says so in one line,
    exit 1)."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


# what went wrong on each stream, in this process (the in-process test runner resets it per run)
_lost: dict[str, str] = {}


def reset() -> None:
    """A fresh start, as a new process has (tests/conftest.py runs fsdpctl in process)."""
    _lost.clear()


def _stream(name: Name) -> Any:
    """The stream as it is now. While rich shows a live display (a progress bar, a spinner) on a
    terminal it puts its own FileProxy in sys.stdout and sys.stderr, which prints into the console:
    the stream behind it is written to (rich's own Console.file does the same: `rich_proxied_file`),
    else every write would come back here, without end."""
    stream = sys.stdout if name == "stdout" else sys.stderr
    return getattr(stream, "rich_proxied_file", stream)


def _reason(e: BaseException, stream: Any) -> str:
    """Why a write failed, in words a user can act on."""
    if isinstance(e, UnicodeEncodeError):
        bad = e.object[e.start : e.start + 1]
        encoding = getattr(stream, "encoding", None) or e.encoding
        return (
            f"its encoding {encoding} has no {bad!r} (U+{ord(bad):04X}); set PYTHONIOENCODING=utf-8 "
            "or a UTF-8 locale (LANG=C.UTF-8)"
        )
    if isinstance(e, OSError) and e.errno is not None:
        return f"{os.strerror(e.errno)} ({errno.errorcode.get(e.errno, e.errno)})"
    return "it is closed (EBADF)"  # ValueError: I/O operation on a closed file


def write(name: Name, text: str) -> None:
    """Write `text` to stdout or stderr and flush it. stdout: OutputLost when it cannot take it.
    stderr: never raises (there is nowhere left to say it); remembered, and the exit code says it.
    """
    if not text:
        return
    if name in _lost:
        if name == "stdout":
            raise OutputLost(_lost[name])
        return
    stream = _stream(name)
    try:
        if stream is None:  # the interpreter found the descriptor closed at start (`>&-`)
            raise OSError(errno.EBADF, os.strerror(errno.EBADF))
        text = escape_surrogates(text)  # never encodable: a non-UTF-8 byte shown as `\xff`
        if name == "stderr":
            text = _encodable(text, stream)
        stream.write(text)
        stream.flush()
    except (OSError, ValueError, UnicodeEncodeError) as e:
        _lost[name] = _reason(e, stream)
        _quiet(name)
        if name == "stdout":
            raise OutputLost(_lost[name]) from None


def write_data(text: str) -> None:
    """A data document (-o json/yaml/env) byte for byte: UTF-8 to the stream's bytes, whatever the
    stream's text encoding is (JSON and YAML are ASCII as fsdpctl writes them; a .env is UTF-8, the
    encoding fsdpctl reads it in), with no console between."""
    stream = _stream("stdout")
    raw = getattr(stream, "buffer", None)
    if raw is None or "stdout" in _lost:
        write("stdout", text)
        return
    try:
        stream.flush()  # what the console wrote before comes first
        # byte for byte: a value's byte that was not UTF-8 goes out as that byte (a .env that
        # reproduces it); JSON and YAML escape it themselves (\udcff)
        try:
            data = text.encode("utf-8", "surrogateescape")
        except UnicodeEncodeError:  # a surrogate no byte stands for: shown escaped
            data = escape_surrogates(text).encode("utf-8")
        raw.write(data)
        raw.flush()
    except (OSError, ValueError) as e:
        _lost["stdout"] = _reason(e, stream)
        _quiet("stdout")
        raise OutputLost(_lost["stdout"]) from None


def _encodable(text: str, stream: Any) -> str:
    """Messages reach stderr whatever its encoding: a character it has no byte for is escaped
    (`\\u2713`), as Python's own stderr does by default (its errors handler is backslashreplace)."""
    encoding = getattr(stream, "encoding", None) or "utf-8"
    try:
        text.encode(encoding)
    except (UnicodeEncodeError, LookupError):
        try:
            return text.encode(encoding, "backslashreplace").decode(encoding)
        except LookupError:
            return text.encode("ascii", "backslashreplace").decode("ascii")
    return text


def _quiet(name: Name) -> None:
    """After a failed write the stream still holds what it could not write, and the interpreter
    would try again as it exits ("Exception ignored ... BrokenPipeError", exit 120). In the real
    process the descriptor is pointed at /dev/null (Python's documentation, "Note on SIGPIPE"); a
    stream that is not the process's own (the test runner's) is left alone."""
    stream: Any = _stream(name)
    raw = getattr(getattr(stream, "buffer", None), "raw", None)
    if isinstance(raw, _ClosedRaw):
        raw.quiet = True
        return
    original = sys.__stdout__ if name == "stdout" else sys.__stderr__
    if stream is None or stream is not original:
        return
    try:
        fd = getattr(stream, "fileno")()  # noqa: B009 (mypy narrows stream to the original)
    except (OSError, ValueError, io.UnsupportedOperation):
        return
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, fd)
    finally:
        os.close(null)


def lost(name: Name) -> str | None:
    """Why `name` could not be written to in this process, or None."""
    return _lost.get(name)


def say_lost(why: str) -> None:
    """The one line for a stdout that could not be written to (on stderr, while it stands). None
    for a reader that went away (`fsdpctl job logs | head`): Unix tools are silent there (they die
    of SIGPIPE, which CPython ignores), and the exit code says it (BROKEN_PIPE, `finish`)."""
    if not why.endswith(EPIPE_MARK):
        write("stderr", f"error: cannot write to stdout: {why}\n")


# how `_reason` ends the words for EPIPE
EPIPE_MARK = f"({errno.errorcode[errno.EPIPE]})"


def output_error(e: BaseException) -> str | None:
    """Why an error that escaped click's own writing (help, --version, a usage error) is a lost
    stdout, or None when it is something else; stdout is then counted lost (said once)."""
    if isinstance(e, UnicodeEncodeError) or (
        isinstance(e, OSError) and not e.filename and e.errno in OUTPUT_ERRNOS
    ):
        _lost["stdout"] = _reason(e, sys.stdout)
        _quiet("stdout")
        return _lost["stdout"]
    return None


def unpacified() -> str | None:
    """Why stdout was lost when click's main met EPIPE writing its help: it wraps both streams in
    its PacifyFlushWrapper and exits 1 without a word (click/core.py BaseCommand.main). The streams
    are unwrapped, and the reason returned; None when that did not happen."""
    from typer._click.utils import PacifyFlushWrapper

    if not isinstance(sys.stdout, PacifyFlushWrapper):
        return None
    sys.stdout = sys.stdout.wrapped
    if isinstance(sys.stderr, PacifyFlushWrapper):
        sys.stderr = sys.stderr.wrapped
    _lost["stdout"] = _reason(OSError(errno.EPIPE, ""), sys.stdout)
    _quiet("stdout")
    return _lost["stdout"]


def broken_stdout(e: BaseException) -> str | None:
    """Whether an error a command did not expect is stdout failing under click's own writing (a
    subcommand's --help, click's `echo`), from where it was raised; None for anything else (a
    socket's EPIPE, say)."""
    if not isinstance(e, OSError | UnicodeEncodeError):
        return None
    tb = e.__traceback__
    while tb is not None:
        frame = tb.tb_frame
        if frame.f_code.co_name == "echo" and "click" in str(frame.f_globals.get("__name__")):
            if frame.f_locals.get("err"):
                _lost["stderr"] = _reason(e, sys.stderr)
                _quiet("stderr")
                return None
            return output_error(e)
        tb = tb.tb_next
    return None


# what a write to a standard stream fails with (write(2)): a full or over-quota file system, a
# reader gone, a descriptor closed, a terminal hung up, a file over its size limit
OUTPUT_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EPIPE, errno.EBADF, errno.EIO, errno.EFBIG)


def finish(code: int) -> int:
    """The exit code once everything is written (close_stdout): stdout flushed, and a failure
    there said in one line (exit 1); a stderr that could not be written to turns success into 1."""
    stream = sys.stdout
    if stream is not None and "stdout" not in _lost:
        try:
            stream.flush()
        except (OSError, ValueError, UnicodeEncodeError) as e:
            _lost["stdout"] = _reason(e, stream)
            _quiet("stdout")
            say_lost(_lost["stdout"])
            code = code or 1
    if sys.stderr is not None and "stderr" not in _lost:
        try:
            sys.stderr.flush()
        except (OSError, ValueError):
            _lost["stderr"] = "closed"
            _quiet("stderr")
    if _lost.get("stdout", "").endswith(EPIPE_MARK):  # its reader went away (`| head`)
        return BROKEN_PIPE
    if "stderr" in _lost and code == 0:
        return 1
    return code


# 128 + SIGPIPE: what a shell reports for `yes | head`'s yes, and git's code there
BROKEN_PIPE = int(ExitCode.BROKEN_PIPE)


class _ClosedRaw(io.RawIOBase):
    """A standard stream the process started without (`>&-`): a write fails with EBADF, as a write
    to the closed descriptor would; once said, what is left is dropped (the interpreter's flush at
    exit must not say it again)."""

    quiet = False

    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        if self.quiet:
            return len(b)
        raise OSError(errno.EBADF, os.strerror(errno.EBADF))


def guard_std_descriptors() -> None:
    """At the start of the real process: a standard descriptor the process was started without
    gets /dev/null (so that the next file fsdpctl opens, or a child it starts, never takes its
    number: a state file must not become stdout), and its Python stream one whose every write fails
    with EBADF (`closed_streams`)."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
            continue
        except OSError:
            pass
        null = os.open(os.devnull, os.O_RDWR)
        if null != fd:
            os.dup2(null, fd)
            os.close(null)
    closed_streams()


def closed_streams() -> None:
    """sys.stdout or sys.stderr that the interpreter set to None (its descriptor was closed at
    start, `>&-`) becomes a stream whose writes fail with EBADF, as a write to the closed
    descriptor would (coreutils' `echo x >&-`: write error: Bad file descriptor), so that every
    writer, click's included (its `echo` drops text for a None stream in silence), meets it."""
    for name in ("stdout", "stderr"):
        if getattr(sys, name) is None:
            closed = io.TextIOWrapper(io.BufferedWriter(_ClosedRaw()), encoding="utf-8")
            setattr(sys, name, closed)
            if getattr(sys, f"__{name}__") is None:
                setattr(sys, f"__{name}__", closed)


class Sink:
    """The file a console writes to: whatever sys.stdout (sys.stderr) is at the time of the write
    (the test runner swaps them), through `write`."""

    def __init__(self, name: Name) -> None:
        self.name = name

    def write(self, text: str) -> int:
        write(self.name, text)
        return len(text)

    def flush(self) -> None:
        pass  # every write is flushed

    def isatty(self) -> bool:
        stream = _stream(self.name)
        try:
            return bool(stream is not None and stream.isatty())
        except (ValueError, OSError):
            return False

    def fileno(self) -> int:
        stream = _stream(self.name)
        if stream is None:
            raise io.UnsupportedOperation("closed")
        return int(stream.fileno())

    @property
    def encoding(self) -> str:
        return getattr(_stream(self.name), "encoding", None) or "utf-8"

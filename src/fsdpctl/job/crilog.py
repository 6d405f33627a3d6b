"""Container log lines as the kubelet keeps them (pure): the CRI log format, the `--since` durations
and the RFC 3339 times of `kubectl logs --timestamps`.

A local pod's output is written by a relay (fsdpctl.adapters.logrelay) the way containerd's CRI
plugin writes a container's (pkg/cri/io/logger.go): one line per output line, `<RFC3339Nano>
<stdout|stderr> <F|P> <text>`, P marking a piece of a line longer than the buffer. The kubelet reads
those files back (pkg/kubelet/kuberuntime/logs/logs.go, parseCRILog) and so do fsdpctl's readers,
through `read`/`texts`. A line that is not in that format (a log written before the relay, a test's
plain file) is kept whole, with no time.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol, TypeVar

STREAMS = ("stdout", "stderr")
FULL, PARTIAL = "F", "P"
MAX_LINE = (
    16 * 1024
)  # containerd's default max_container_log_line_size: longer output is split into P pieces
_CRI = re.compile(
    r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:\d\d)) (stdout|stderr) ([A-Z:]+) ?"
)
_DURATION = re.compile(r"(?:(\d+(?:\.\d+)?)(h|ms|m|s))+")
_PART = re.compile(r"(\d+(?:\.\d+)?)(h|ms|m|s)")
_UNIT_S = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}


@dataclass(frozen=True)
class Line:
    """One log line: its text (no newline), when the runtime read it (None: not known) and its
    stream."""

    text: str
    time: float | None = None
    stream: str = "stdout"


@dataclass(frozen=True)
class LogLine:
    """One line of a job's log: where it comes from (locally {"node": "node-1"}; on a cluster
    {"pod": NAME, "container": C}), the text the program printed and when the runtime read it (None:
    not known)."""

    where: dict[str, str]
    text: str
    time: float | None = None

    @property
    def prefix(self) -> str:
        """`[node-1]`, or `[pod/NAME/CONTAINER]` as `kubectl logs --prefix` writes it (kubectl's
        pkg/cmd/logs/logs.go, addPrefixIfNeeded)."""
        if "pod" in self.where:
            return f"[pod/{self.where['pod']}/{self.where.get('container', '')}]"
        return f"[{self.where.get('node', '?')}]"


def rfc3339(t: float) -> str:
    """A time as the kubelet prints it before a line with ?timestamps=true: UTC, nine fraction
    digits (types.RFC3339NanoFixed, "2006-01-02T15:04:05.000000000Z07:00")."""
    whole = int(t // 1)
    nanos = round((t - whole) * 1e9)
    if nanos >= 10**9:
        whole, nanos = whole + 1, nanos - 10**9
    return datetime.fromtimestamp(whole, UTC).strftime("%Y-%m-%dT%H:%M:%S") + f".{nanos:09d}Z"


def parse_time(text: str) -> float:
    """An RFC 3339 time with any number of fraction digits (Go's RFC3339Nano drops trailing zeros);
    ValueError when it is not one."""
    head, _, rest = text.partition(".")
    digits = re.match(r"\d*", rest).group() if rest else ""  # type: ignore[union-attr]
    zone = rest[len(digits) :] if rest else head[19:]
    base = datetime.fromisoformat(head[:19] + (zone.replace("Z", "+00:00") or "+00:00"))
    return base.timestamp() + (int(digits) / 10 ** len(digits) if digits else 0.0)


def format_line(t: float, stream: str, text: str, tag: str = FULL) -> str:
    """One CRI log line with its newline (containerd writes RFC3339Nano; RFC3339NanoFixed reads the
    same)."""
    return f"{_head(t, stream, tag)}{text}\n"


def format_bytes(t: float, stream: str, data: bytes, tag: str = FULL) -> bytes:
    """`format_line` of the program's bytes as they came: containerd splits a long line at 16 KiB of
    bytes, not of characters, and writes each piece raw, so a character cut in two is whole again
    once the pieces are joined (decoding each piece alone would turn both halves into U+FFFD for
    good)."""
    return _head(t, stream, tag).encode() + data + b"\n"


def _head(t: float, stream: str, tag: str) -> str:
    return f"{rfc3339(t)} {stream} {tag} "


def raw_lines(data: bytes) -> list[str]:
    """A log file's bytes as its raw lines: split at newlines only (a program's \\r stays in its
    line, as containerd splits), each byte kept (undecodable ones as surrogates) so that the pieces
    of a line join byte for byte before `lines` decodes them."""
    text = data.decode("utf-8", "surrogateescape")
    if not text:
        return []
    return text.removesuffix("\n").split("\n")


def raw_bytes(raws: Iterable[str]) -> bytes:
    """`raw_lines` back to the file's bytes, each line with its newline."""
    return "".join(f"{r}\n" for r in raws).encode("utf-8", "surrogateescape")


def _text(joined: str) -> str:
    """A whole line's text: its bytes decoded, what is not UTF-8 replaced (U+FFFD), as the kubelet's
    reader hands on the bytes and a terminal shows them."""
    return joined.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def parse_line(raw: str) -> tuple[Line, bool]:
    """(the line, whether it is a partial piece) of one line of a log file, without its newline."""
    m = _CRI.match(raw)
    if m is None:
        return Line(raw), False
    try:
        t = parse_time(m.group(1))
    except ValueError:
        return Line(raw), False
    return Line(raw[m.end() :], t, m.group(2)), m.group(3).split(":")[0] == PARTIAL


def lines(raws: Iterable[str]) -> Iterator[Line]:
    """The lines of a log's raw lines, partial pieces joined to the line they start (its time is the
    first piece's, as the runtime read it first)."""
    held: dict[
        str, list[Line]
    ] = {}  # stream -> its pieces so far: the other stream's lines may come between
    for raw in raws:
        line, partial = parse_line(raw)
        pieces = held.setdefault(line.stream, [])
        pieces.append(line)
        if not partial:
            yield _joined(held.pop(line.stream))
    # a log that ends mid-line (the writer was killed, or its last line had no newline): what there
    # is
    yield from (_joined(pieces) for pieces in held.values())


def _joined(pieces: list[Line]) -> Line:
    return Line(_text("".join(p.text for p in pieces)), pieces[0].time, pieces[0].stream)


# A log is read whole by `job status` and the failure readers; one far larger than any run writes (a
# 300 MiB sparse file, a link to /dev/zero) is read from its last this many bytes, with a warning.
READ_MAX = 64 * 1024 * 1024


def read(path: Path) -> list[Line]:
    """Every line of a log file; none when it is not there (yet). A log that is not a regular file
    (a FIFO, a link, a directory) is skipped with a warning naming it, and one over READ_MAX is read
    from its end (fsdpctl.files: never opened in a way that blocks, never read without a bound)."""
    from fsdpctl import files

    try:
        data, cut = files.read_tail(path, READ_MAX)
    except FileNotFoundError:
        return []
    except OSError as e:
        files.skipped(path, files.why(e))
        return []
    if cut:
        files.skipped(
            path, f"is over {READ_MAX >> 20} MiB", f"only its last {READ_MAX >> 20} MiB read"
        )
    return list(lines(raw_lines(data)))


def texts(path: Path) -> list[str]:
    """A log file's lines as the program printed them: what the trainer's event parser and the
    failure readers look at."""
    return [line.text for line in read(path)]


def since_seconds(value: str) -> float:
    """A `--since` duration in Go's time.ParseDuration units kubectl accepts (10s, 5m, 2h, 1h30m,
    500ms); ValueError for anything else (a bare number, a negative or zero duration, another unit).
    """
    if not _DURATION.fullmatch(value):
        raise ValueError(value)
    seconds = sum(float(n) * _UNIT_S[unit] for n, unit in _PART.findall(value))
    if seconds <= 0:
        raise ValueError(value)
    return seconds


class Timed(Protocol):
    """A line with the time its runtime read it (Line, LogLine)."""

    @property
    def time(self) -> float | None: ...


T = TypeVar("T", bound=Timed)


def select(found: list[T], *, tail: int | None, since: float | None) -> list[T]:
    """The kubelet's choice among a log's lines (ReadLogs): the last `tail` lines, then those read
    at or after `since` (epoch seconds); a line with no time cannot be shown to be recent and is
    left out."""
    chosen = found[-tail:] if tail is not None and tail >= 0 else found
    if tail == 0:
        chosen = []
    if since is None:
        return chosen
    return [line for line in chosen if line.time is not None and line.time >= since]


def complete(raws: list[str]) -> tuple[list[Line], list[str]]:
    """The lines a reader following a log can show now, and the raw lines to hold until more is
    written: the partial pieces of a line whose last piece has not come yet (the kubelet waits the
    same way)."""
    done: list[Line] = []
    held: list[str] = []
    open_: set[str] = set()  # the streams in the middle of a line
    for raw in raws:
        held.append(raw)
        line, partial = parse_line(raw)
        (open_.add if partial else open_.discard)(line.stream)
        if not open_:  # (the other stream's lines behind an open one wait with it: the order stays)
            done.extend(lines(held))
            held = []
    return done, held

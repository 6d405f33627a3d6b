"""fsdpctl's own files: where they live (FSDPCTL_HOME) and writing them so a reader never sees half
of one."""

from __future__ import annotations

import errno
import json
import os
import re
import stat
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

from fsdpctl.errors import BadInput
from fsdpctl.redact import redact

# A job name becomes a directory (and, on a cluster, a DNS label): a Kubernetes DNS-1123 label, so
# no '/', '..' or NUL walks out of FSDPCTL_HOME. A run id becomes a directory too (logs/<run-id>),
# and the rdzv id.
JOB_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
RUN_ID = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,126}[A-Za-z0-9])?")


# The XDG Base Directory Specification
# (https://specifications.freedesktop.org/basedir-spec/latest/): "$XDG_STATE_HOME defines the base
# directory relative to which user-specific state files should be stored. If $XDG_STATE_HOME is
# either not set or empty, a default equal to $HOME/.local/state should be used", and "all paths set
# in these environment variables must be absolute. If an implementation encounters a relative path
# in any of these variables it should consider the path invalid and ignore it."
OLD_DEFAULT = Path(".fsdpctl")  # before: under the current directory, so a `cd` lost every job


def default_home() -> Path:
    """fsdpctl's directory under the user's state base: one place, whatever the current
    directory."""
    xdg = os.environ.get("XDG_STATE_HOME", "")
    base = Path(xdg) if os.path.isabs(xdg) else Path.home() / ".local" / "state"
    return base / "fsdpctl"


def home() -> Path:
    """Jobs, clusters, caches: FSDPCTL_HOME, default $XDG_STATE_HOME/fsdpctl
    (~/.local/state/fsdpctl). Bad input when it (or the nearest part of it that exists) is not a
    directory: every path under it would fail later, half-written."""
    raw = os.environ.get("FSDPCTL_HOME") or str(default_home())
    try:
        path = Path(raw).resolve()
    except (
        OSError,
        RuntimeError,
    ) as e:  # a symlink loop: RuntimeError up to Python 3.12, then ELOOP
        raise BadInput(
            f"FSDPCTL_HOME={raw!r} cannot be resolved ({e})",
            hint="point FSDPCTL_HOME at a directory (a symlink that leads to one), or unset it",
        ) from e
    existing = next((p for p in (path, *path.parents) if p.exists()), None)
    if existing is not None and not existing.is_dir():
        where = "" if existing == path else f": {existing} is a file"
        raise BadInput(
            f"FSDPCTL_HOME={raw!r} is not a directory{where}",
            hint="point FSDPCTL_HOME at a directory, or unset it (default $XDG_STATE_HOME/fsdpctl, "
            "else ~/.local/state/fsdpctl)",
        )
    return path


def _has_jobs(root: Path) -> bool:
    jobs = root / "jobs"
    return jobs.is_dir() and any(JOB_NAME.fullmatch(p.name) for p in jobs.iterdir())


def old_home_notice() -> str | None:
    """One line when ./.fsdpctl (the old default) holds jobs but the state directory in use holds
    none: the jobs are not moved (a move behind the user's back could split a running job from its
    supervisor), but the user is told where state lives now and how to keep the old place."""
    if os.environ.get("FSDPCTL_HOME"):
        return None
    try:
        if not _has_jobs(OLD_DEFAULT) or _has_jobs(default_home()):
            return None
    except OSError:  # an unreadable directory: no notice rather than a failure before the command
        return None
    return (
        f"state now lives in {default_home()} (no jobs there yet); ./.fsdpctl holds jobs from before: "
        "to keep using it, set FSDPCTL_HOME=./.fsdpctl"
    )


def job_name(value: str) -> str:
    """`value` if it is a job name; bad input otherwise, before any path is built from it."""
    if not JOB_NAME.fullmatch(value):
        raise BadInput(
            f"job name {value!r} is not a valid name",
            hint="use lowercase letters, digits and '-', at most 63 characters (a DNS label)",
        )
    return value


def run_id(value: str) -> str:
    """`value` if it is a run id (a directory name and the rendezvous id); bad input otherwise."""
    if not RUN_ID.fullmatch(value) or ".." in value:
        raise BadInput(
            f"--run-id {value!r} is not a valid run id",
            hint="use letters, digits, '-', '_' and '.', at most 128 characters, no '..'",
        )
    return value


# ---- reading back what fsdpctl wrote: untrusted input --------------------------------------------
#
# A file under FSDPCTL_HOME may since have become anything: a FIFO (open(2) for reading blocks until
# a writer comes: fifo(7)), a link to /dev/zero (a read that never ends), a directory, a file too
# big to be one fsdpctl wrote. fsdpctl writes regular files only (write_atomic) and makes no links,
# so it reads them back as such: opened without following a link and without blocking, checked on
# the descriptor (no window for a swap between a check and the open), and read up to a limit.

STATE_MAX_BYTES = (
    16 * 1024 * 1024
)  # a state, spec, record or placement: kilobytes (a record with manifests)
KINDS = {
    stat.S_IFIFO: "a FIFO",
    stat.S_IFSOCK: "a socket",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFDIR: "a directory",
    stat.S_IFLNK: "a symbolic link",
}


class NotOurs(OSError):
    """What is at a path fsdpctl wrote a regular file to is something else now (or far too big to be
    its own). An OSError, so the readers that take an unreadable file as damaged take this one too;
    `why` says what it is, in words."""

    def __init__(self, path: Path, why: str):
        super().__init__(errno.EINVAL, why, str(path))
        self.why = why


class Skipped(UserWarning):
    """A damaged file a reader skipped and went on without (a log that is a FIFO): a Python warning
    where no command listens; the CLI prints each as one `warning:` line naming the file
    (`on_skipped`)."""


def _python_warning(line: str) -> None:
    warnings.warn(Skipped(line), stacklevel=4)


_sink: Callable[[str], None] = _python_warning
_said: set[str] = set()


def on_skipped(sink: Callable[[str], None]) -> None:
    """Where `skipped` lines go from now on (the CLI: its warning line), each once."""
    global _sink
    _sink = sink
    _said.clear()


def skipped(path: Path | str, why: str, done: str = "skipped") -> None:
    """Say once that the file at `path` {why}, and what the reader did without it."""
    line = f"{path} {why}: {done}"
    if line not in _said:
        _said.add(line)
        _sink(line)


def why(e: BaseException) -> str:
    """What was wrong with a file, in words, for a line that names it."""
    if isinstance(e, NotOurs):
        return e.why
    if isinstance(e, UnicodeDecodeError):
        return f"is not UTF-8 text (byte {e.start})"
    if isinstance(e, TooDeep):
        return str(e)
    if isinstance(e, ValueError):
        return "is not valid JSON (cut short, or not fsdpctl's)"
    if isinstance(e, OSError):
        return f"cannot be read ({e.strerror or type(e).__name__})"
    return f"cannot be read ({type(e).__name__})"


# The errors a file system gives that are the file system's, not a file's: what is wrong and what
# fixes it, in words (errno(3); ENOSPC is both "no space" and "no inodes": statvfs(3) says which).
FS_ERRORS = {
    errno.EROFS: "the file system is read-only",
    errno.ENOSPC: "no space left on the device",
    errno.EDQUOT: "the disk quota is used up",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
    errno.ENOTDIR: "a part of the path is a file, not a directory",
}


def fs_error(e: OSError, path: Path | str | None = None) -> str | None:
    """What a file system error means, in words; None when it is not one of the file system's own
    (a missing file, a link, a FIFO: the file's, see NotOurs)."""
    said = FS_ERRORS.get(e.errno or 0)
    if e.errno == errno.ENOSPC and path is not None and _no_inodes(Path(path)):
        said = "no inodes left on the device (space remains, but no file can be made)"
    return said


def _no_inodes(path: Path) -> bool:
    for p in (path, *path.parents):
        try:
            st = os.statvfs(p)
        except OSError:
            continue
        return st.f_files > 0 and st.f_favail == 0
    return False


def open_regular(path: Path, *, follow_links: bool = False) -> BinaryIO:
    """`path` opened for reading if it is a regular file; NotOurs naming what it is otherwise. A
    file of fsdpctl's (under FSDPCTL_HOME) is also refused when a symbolic link leads to it (fsdpctl
    makes none); `follow_links`: a file the user named (a token file may well be a link)."""
    if not follow_links:
        _no_link_from(_home_of(path), path)
    flags = (
        os.O_RDONLY
        | os.O_NONBLOCK
        | os.O_CLOEXEC
        | os.O_NOCTTY
        | (0 if follow_links else os.O_NOFOLLOW)
    )
    try:
        fd = os.open(path, flags)
    except OSError as e:
        if e.errno == errno.ELOOP and not follow_links:
            raise NotOurs(path, "is a symbolic link, not the file fsdpctl wrote there") from None
        raise
    return os.fdopen(_regular(fd, path, "not a regular file"), "rb")


def _regular(fd: int, path: Path, said: str) -> int:
    """`fd`, blocking again, when it is a regular file (checked on the descriptor: no window for a
    swap between a check and the open); closed and NotOurs naming what it is otherwise."""
    kind = stat.S_IFMT(os.fstat(fd).st_mode)
    if kind != stat.S_IFREG:
        os.close(fd)
        raise NotOurs(path, f"is {KINDS.get(kind, 'not a regular file')}, {said}")
    os.set_blocking(fd, True)
    return fd


def read_regular(path: Path, limit: int = STATE_MAX_BYTES, *, follow_links: bool = False) -> bytes:
    """The bytes of a regular file (see `open_regular`); NotOurs when it is over `limit` bytes."""
    with open_regular(path, follow_links=follow_links) as f:
        size = os.fstat(f.fileno()).st_size
        data = f.read(limit + 1) if size <= limit else b""
    if size > limit or len(data) > limit:
        raise NotOurs(
            path,
            f"is {max(size, len(data))} bytes, over the {limit} any file fsdpctl writes there has",
        )
    return data


# How deep a document fsdpctl writes nests: a record's settings and manifests are a few levels. A
# deeper one is damaged or planted; parsing it would end in RecursionError (CPython's json recurses
# once per level), so its depth is measured before it is parsed.
JSON_MAX_DEPTH = 64
_JSON_TOKENS = re.compile(rb'"(?:[^"\\]|\\.)*"|[\[{]|[\]}]')


class TooDeep(ValueError):
    """A JSON document nested deeper than any fsdpctl writes."""


def json_depth(data: bytes, limit: int = JSON_MAX_DEPTH) -> int:
    """How deep `data` nests its arrays and objects (strings skipped), counted up to `limit` + 1:
    linear in the size, no recursion."""
    depth = deepest = 0
    for m in _JSON_TOKENS.finditer(data):
        c = m.group()[:1]
        if c in (b"[", b"{"):
            depth += 1
            deepest = max(deepest, depth)
            if deepest > limit:
                break
        elif c in (b"]", b"}"):
            depth -= 1
    return deepest


def loads(data: bytes, *, depth: int = JSON_MAX_DEPTH) -> Any:
    """JSON bytes from a file or a place that is not trusted: TooDeep over `depth` levels, ValueError
    when not UTF-8 JSON; NaN and Infinity refused (fsdpctl writes neither)."""
    if data.count(b"[") + data.count(b"{") > depth and json_depth(data, depth) > depth:
        raise TooDeep(f"nests deeper than the {depth} levels any file fsdpctl writes has")
    return json.loads(data.decode("utf-8"), parse_constant=_no_constant)


def read_json(path: Path, limit: int = STATE_MAX_BYTES) -> Any:
    """A JSON file fsdpctl wrote: its document (`loads`: size, depth and constants limited);
    OSError (NotOurs) or ValueError (not UTF-8, not JSON, too deep) otherwise."""
    return loads(read_regular(path, limit))


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def read_tail(path: Path, limit: int) -> tuple[bytes, bool]:
    """The last `limit` bytes of a regular file (from the first line that starts in them), and
    whether that is less than the whole file: what a log reader takes of a log of any size."""
    with open_regular(path) as f:
        size = os.fstat(f.fileno()).st_size
        if size <= limit:
            return f.read(limit), False
        f.seek(size - limit)
        data = f.read(limit)
    return data[data.find(b"\n") + 1 :] if b"\n" in data else b"", True


def _home_of(path: Path) -> Path | None:
    try:
        root = home()
    except BadInput:
        return None
    return root if path.is_relative_to(root) else None


def _no_link_from(root: Path | None, path: Path) -> None:
    """No symbolic link on the way from `root` down to `path` (fsdpctl makes none): a job directory
    or a log directory linked elsewhere is not fsdpctl's to read or delete through."""
    if root is None or not path.is_relative_to(root):
        return
    at = root
    for part in path.relative_to(root).parts[:-1]:
        at = at / part
        try:
            if stat.S_ISLNK(os.lstat(at).st_mode):
                raise NotOurs(
                    path, f"is reached through {at}, a symbolic link fsdpctl did not make"
                )
        except FileNotFoundError:
            return


def no_link_to(path: Path) -> None:
    """NotOurs when `path`, under FSDPCTL_HOME, is reached through a symbolic link (a job or run
    directory replaced by one): what a writer checks before it makes anything there."""
    _no_link_from(_home_of(path), path)


def open_append(path: Path | str, mode: int) -> int:
    """A log opened to append to (made with `mode` when missing): a descriptor. What is at the path
    must be a regular file reached without a link (under FSDPCTL_HOME, no link on the way; the file
    itself never followed: O_NOFOLLOW) and is opened without blocking (a FIFO planted there with no
    reader is refused at once, ENXIO, not waited on: fifo(7)); NotOurs otherwise."""
    path = Path(path)
    no_link_to(path)
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
    try:
        fd = os.open(path, flags, mode)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENXIO, errno.EISDIR):
            raise NotOurs(path, f"is {kind_of(path)}, not a log fsdpctl writes") from None
        raise
    return _regular(fd, path, "not a log fsdpctl writes")


def kind_of(path: Path) -> str:
    """What is at `path`, in words (not following a link): 'a FIFO', 'a regular file', ..."""
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return "missing"
    return (
        "a regular file"
        if stat.S_ISREG(mode)
        else KINDS.get(stat.S_IFMT(mode), "not a regular file")
    )


def reached_without_link(path: Path, root: Path) -> bool:
    """Whether `path` (itself included) is reached from `root` without a symbolic link."""
    try:
        _no_link_from(root, path / "x")
    except NotOurs:
        return False
    return True


# Modes of what fsdpctl makes, set explicitly rather than left to the umask (under umask 000 a job's
# state, its spec and a batch script would be world-writable, and its supervisor, root's, reads the
# spec back): files only their owner reads and writes; directories others may enter (a local pod
# that runs as the job's user walks through the job's directory to its volumes) but not change.
FILE_MODE = 0o600
DIR_MODE = 0o755
PRIVATE_DIR_MODE = 0o700


def make_dirs(path: Path, mode: int = DIR_MODE) -> None:
    """`path` and each missing parent, each made with exactly `mode` (mkdir's mode is masked by the
    umask: chmod after); what exists is left as it is."""
    missing = []
    for p in (path, *path.parents):
        if os.path.lexists(p):
            break
        missing.append(p)
    for p in reversed(missing):
        try:
            p.mkdir(mode)
        except FileExistsError:  # made meanwhile by another fsdpctl: its mode is its maker's
            continue
        os.chmod(p, mode)


def temp_beside(path: Path, mode: int = FILE_MODE) -> tuple[int, Path]:
    """A new temp file beside `path` for a writer that replaces `path` with it: (its descriptor,
    its path). mkstemp's name (random, made with O_EXCL|O_NOFOLLOW: a link, a hard link or a FIFO
    planted at a name guessed beforehand is never opened, written through or waited on), its mode
    `mode` whatever the umask."""
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, mode)
    except BaseException:
        os.close(fd)
        os.unlink(name)
        raise
    return fd, Path(name)


def write_atomic(path: Path, text: str, mode: int = FILE_MODE) -> None:
    """A temp file beside the target (`temp_beside`), then os.replace; the parent is created, the
    temp file never left. Under FSDPCTL_HOME no symbolic link is followed on the way to the target
    (a job or run directory replaced by a link is refused: NotOurs, naming it), and a link at the
    target itself is replaced, never written through (rename(2) replaces the link). No secret is
    ever written, whatever key it was pasted into (`redact`)."""
    no_link_to(path)
    make_dirs(path.parent)
    no_link_to(path)  # made meanwhile: checked again, now that it exists
    if os.path.islink(path.parent):  # a run directory on a shared volume, anywhere: its own
        raise NotOurs(path, f"would be written through {path.parent}, a symbolic link")
    fd, tmp = temp_beside(path, mode)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(_encoded(redact(text)))
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _encoded(text: str) -> bytes:
    """UTF-8; a path's byte that was not UTF-8 (a surrogate escape, PEP 383) written back as that
    byte, so a script names the very path (FSDPCTL_HOME with such a byte); any other lone surrogate
    (only from a damaged file read back) escaped rather than an internal error."""
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace")

"""A job's lock: FSDPCTL_HOME/jobs/<job>/lock, flock(2)'ed by every verb that changes the job (run,
resume, rerun, stop, cleanup) for as long as it changes it.

The kernel drops a flock when its holder exits, however it exits, so a killed fsdpctl leaves no
stale lock. A verb waits a bounded time for a holder to let go (a `--replace` while the old job's
supervisor exits, a second `job run` of the same name at the same instant), then says who holds it.
Who holds it is asked of the kernel (/proc/locks), never written: a verb that fails leaves the
job's files as they were.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from fsdpctl import files
from fsdpctl.errors import ExitCode, FsdpctlError

NAME = "lock"
WAIT_S = 30.0  # a verb's wait for another verb on the same job (a stop request, a start, a cleanup)
HOLDER_MAX = 4096


class CorruptLock(FsdpctlError):
    """What is at the lock's path is not the lock file fsdpctl made (a link, a FIFO, a
    directory)."""

    def __init__(self, message: str):
        super().__init__(
            message, hint="remove it; fsdpctl makes a new one", code=ExitCode.BAD_INPUT
        )


class Unwritable(CorruptLock):
    """The job's lock cannot be made or opened because of the file system (read-only, full, no
    inodes, permissions): said as that, never as a lock to remove (the lock is fine; the place is
    not). A CorruptLock for the verbs that pass over a job whose lock they cannot take (cleanup
    keeps it, with this line)."""

    def __init__(self, path: Path, why: str):
        FsdpctlError.__init__(
            self,
            f"{path}: the job's lock cannot be made or opened: {why}",
            hint="free space or inodes, make the file system writable or fix its permissions, or "
            "point FSDPCTL_HOME elsewhere; then run the command again",
            code=ExitCode.FAILURE,
        )


class Busy(FsdpctlError):
    """Another process held the job's lock for the whole wait."""

    def __init__(self, job: str, holder: str, waited: float):
        super().__init__(
            f"job {job} is busy: {holder} holds its lock (waited {waited:.0f} s)",
            hint="wait for it to finish, then run the command again",
            code=ExitCode.BAD_INPUT,
        )


def open_lock(path: Path, *, create: bool = True) -> int | None:
    """The lock file's descriptor, made (mode 0600) if missing and `create`; None when it is missing
    and not to be made. CorruptLock when something else is at the path: O_NOFOLLOW, so a link is
    never followed to create or lock its target; a FIFO is opened without blocking and refused."""
    flags = os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
    files.no_link_to(path)  # a job directory replaced by a link: no lock made or taken through it
    try:
        if create:
            files.make_dirs(path.parent)
            flags |= os.O_CREAT
        fd = os.open(path, flags, files.FILE_MODE)
    except FileNotFoundError:
        if create:
            raise
        return None
    except OSError as e:
        if (fs := files.fs_error(e, path.parent)) is not None:
            raise Unwritable(path, fs) from e
        what = (
            "is a symbolic link" if e.errno == errno.ELOOP else f"cannot be opened ({e.strerror})"
        )
        raise CorruptLock(f"{path} {what}, not the lock file fsdpctl made") from e
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise CorruptLock(f"{path} is not a regular file, not the lock file fsdpctl made")
    return fd


def flock(fd: int, wait_s: float) -> bool:
    """The exclusive flock on `fd`, trying until `wait_s` has passed; whether it is held."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)


def holder(fd: int) -> str:
    """Who holds the flock on `fd`'s file, as the kernel says (/proc/locks: "FLOCK ADVISORY WRITE
    <pid> <major>:<minor>:<inode>", proc(5)) with that process's command line; nothing is written to
    learn it (a verb that fails must leave the job's files as they were)."""
    st = os.fstat(fd)
    want = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    try:
        table = Path("/proc/locks").read_text()
    except OSError:
        return "another process"
    for line in table.splitlines():
        fields = line.split()
        if len(fields) >= 6 and fields[1] == "FLOCK" and fields[5] == want and fields[4].isdigit():
            return f"pid {fields[4]} ({_command(int(fields[4]))})"
    return "another process"


def _command(pid: int) -> str:
    """A process's command line, shortened, printable (it is shown in a line)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()[:HOLDER_MAX]
    except OSError:
        return "gone"
    words = [w.decode("utf-8", "replace") for w in raw.split(b"\0") if w]
    text = " ".join(Path(words[0]).name if i == 0 else w for i, w in enumerate(words))
    text = "".join(c if c.isprintable() else "?" for c in text)
    return text[:120] or "no command line"


@contextmanager
def held(jdir: Path, *, wait_s: float | None = None, create: bool = True) -> Iterator[bool]:
    """The job's lock, held for the block. Yields whether it is held: False only without `create`
    when there is no lock file (nothing to lock: a dry run writes nothing) — the block then runs
    without it. Busy (exit 2, naming the holder) when another process holds it past `wait_s`."""
    wait_s = WAIT_S if wait_s is None else wait_s
    path = jdir / NAME
    fd = open_lock(path, create=create)
    if fd is None:
        yield False
        return
    try:
        start = time.monotonic()
        if not flock(fd, wait_s):
            raise Busy(jdir.name, holder(fd), time.monotonic() - start)
        yield True
    finally:
        os.close(fd)


@contextmanager
def try_held(jdir: Path) -> Iterator[bool]:
    """The lock if it is free now, without waiting: what a reader takes before it writes what it
    learnt (a settled end). Yields False when it is not held (busy, not a lock file, or a home that
    cannot take the file: read-only, full): the reader then writes nothing."""
    try:
        fd = open_lock(jdir / NAME, create=True)
    except (CorruptLock, OSError):
        fd = None
    if fd is None:
        yield False
        return
    try:
        yield flock(fd, 0)
    finally:
        os.close(fd)

"""The one door for a text file fsdpctl reads but does not own: the settings file (.env,
--env-file), the AWS config and credentials files, a kubeconfig. Whatever is at the path, the
answer is the text or one line naming the file, what is wrong with it and the fix (BadInput, exit
2):

- its kind is looked at before it is opened, and again on the opened descriptor: a directory is
  refused, and so is a FIFO, a socket or a device (open(2) of a FIFO blocks until a writer comes,
  fifo(7); a link to /dev/zero never ends);
- it is opened without blocking and read up to a bound: no file far larger than its kind ever is
  is read whole into memory;
- it is text: UTF-8 with no NUL byte (/proc/self/environ is NUL-separated: it is refused, not read
  as one long line);
- a line the parser after it cannot take is named by its number (`ParseError`).

A file named by the user may be a symbolic link (a kubeconfig often is): the link is followed."""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from fsdpctl.errors import BadInput

KINDS = {
    stat.S_IFIFO: "a FIFO",
    stat.S_IFSOCK: "a socket",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
}


@dataclass(frozen=True)
class Door:
    """How one kind of outside file is named and bounded: `what` names it in a line (`--env-file
    a.env`, `KUBECONFIG /x/config`), `noun` says what it should be, `limit` its size at most, `hint`
    the fix."""

    what: str
    noun: str
    limit: int
    hint: str
    missing_hint: str = ""  # the fix when there is no file at all, when it differs

    def refuse(self, path: Path | str, why: str) -> BadInput:
        missing = why == "does not exist" and self.missing_hint
        return BadInput(
            f"{self.what} {path} {why}", hint=self.missing_hint if missing else self.hint
        )


def read_text(door: Door, path: Path | str, *, missing_ok: bool = False) -> str | None:
    """The text of the file at `path`; None when it does not exist and `missing_ok`; BadInput
    naming it otherwise."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        if missing_ok:
            return None
        raise door.refuse(path, "does not exist") from None
    except OSError as e:  # a file where a folder should be, permissions, a link loop
        raise door.refuse(path, f"cannot be read: {e.strerror}") from None
    if _is_devnull(st):  # `AWS_CONFIG_FILE=/dev/null`: the usual way to say "no such file"
        return ""
    _check_kind(door, path, st)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as e:
        raise door.refuse(path, f"cannot be read: {e.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        _check_kind(door, path, os.fstat(fd))  # what was opened: no swap since the check
        try:
            data = f.read(door.limit + 1)
        except OSError as e:  # EIO, EISDIR
            raise door.refuse(path, f"cannot be read: {e.strerror}") from None
    if len(data) > door.limit:  # a file under /proc says size 0 and has more
        raise door.refuse(
            path, f"has over {door.limit} bytes: {door.noun} has at most {door.limit}"
        )
    return text_of(door, path, data)


def text_of(door: Door, path: Path | str, data: bytes) -> str:
    """`data` as text: UTF-8 with no NUL byte; else the line that is not."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise door.refuse(
            path, f"is not UTF-8 text (line {line}: byte {e.start} is {data[e.start]:#04x})"
        ) from None
    if "\0" in text:
        line = text.count("\n", 0, text.index("\0")) + 1
        raise door.refuse(path, f"holds a NUL byte (line {line}): it is not a text file")
    return text


def _is_devnull(st: os.stat_result) -> bool:
    try:
        null = os.stat(os.devnull)
    except OSError:
        return False
    return stat.S_ISCHR(st.st_mode) and st.st_rdev == null.st_rdev


def _check_kind(door: Door, path: Path | str, st: os.stat_result) -> None:
    if stat.S_ISDIR(st.st_mode):
        raise door.refuse(path, "is a directory, not a file")
    if not stat.S_ISREG(st.st_mode):
        kind = KINDS.get(stat.S_IFMT(st.st_mode), "not a file")
        raise door.refuse(
            path, f"is not a regular file ({kind}: reading it could block or never end)"
        )
    if st.st_size > door.limit:
        raise door.refuse(path, f"has {st.st_size} bytes: {door.noun} has at most {door.limit}")


def parse_error(door: Door, path: Path | str, line: int | None, why: str) -> BadInput:
    """One line for a file its parser refused: the file, the line, why."""
    where = f"line {line}: " if line else ""
    return door.refuse(path, f"{where}{why}")

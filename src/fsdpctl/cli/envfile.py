"""The .env file a command reads (--env-file, FSDPCTL_ENV_FILE, else ./.env): a regular file of
bounded size, read without blocking, parsed as KEY=VALUE lines; anything else is one line naming
the path (exit 2)."""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from pathlib import Path

from fsdpctl.errors import BadInput

# A settings file is a few KB; anything far larger is not one (and would be read whole into memory).
ENV_FILE_MAX_BYTES = 1024 * 1024


def read_env_file(path: Path, *, given: bool = True) -> Mapping[str, str]:
    """The KEY=VALUE lines of the settings file. `given`: named by the user, so it must exist (the
    default .env may be absent). Anything but a readable UTF-8 regular file is one line naming the
    path, exit 2: the file type is checked before opening (open() on a FIFO blocks until a writer
    comes: a hang), and again on the opened descriptor, opened without blocking, so a swap between
    the two cannot hang it either."""
    from fsdpctl.settings import parse_dotenv

    try:
        st = os.stat(path)
    except FileNotFoundError:
        if not given:
            return {}
        raise BadInput(
            f"--env-file {path} does not exist", hint="create it from .env.example"
        ) from None
    except (
        OSError
    ) as e:  # a file where a folder should be, permissions, a link loop, a name too long
        raise BadInput(
            f"--env-file {path} cannot be read: {e.strerror}", hint=_ENV_FILE_HINT
        ) from None
    _check_env_file_kind(path, st)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError as e:
        raise BadInput(
            f"--env-file {path} cannot be read: {e.strerror}", hint=_ENV_FILE_HINT
        ) from None
    with os.fdopen(fd, "rb") as f:
        _check_env_file_kind(path, os.fstat(fd))
        try:
            data = f.read(ENV_FILE_MAX_BYTES + 1)
        except OSError as e:  # EISDIR, EIO
            raise BadInput(
                f"--env-file {path} cannot be read: {e.strerror}", hint=_ENV_FILE_HINT
            ) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BadInput(
            f"--env-file {path} is not UTF-8 text (byte {e.start} is {data[e.start]:#04x})",
            hint="save it as UTF-8 KEY=VALUE lines",
        ) from None
    return parse_dotenv(text, str(path))


_ENV_FILE_HINT = "name a readable KEY=VALUE file (see .env.example)"


def _check_env_file_kind(path: Path, st: os.stat_result) -> None:
    if stat.S_ISDIR(st.st_mode):
        raise BadInput(
            f"--env-file {path} is a directory, not a file", hint=f"name the file, e.g. {path}/.env"
        )
    if not stat.S_ISREG(st.st_mode):
        raise BadInput(
            f"--env-file {path} is not a regular file (a FIFO, socket or device would be waited on)",
            hint=_ENV_FILE_HINT,
        )
    if st.st_size > ENV_FILE_MAX_BYTES:
        raise BadInput(
            f"--env-file {path} has {st.st_size} bytes: a settings file has at most {ENV_FILE_MAX_BYTES}",
            hint=_ENV_FILE_HINT,
        )

"""The settings files a command reads (--env-file, repeatable; FSDPCTL_ENV_FILE; else ./.env),
through the one door for outside files (fsdpctl.outside: a regular UTF-8 text file with no NUL byte,
of bounded size, read without blocking), parsed as KEY=VALUE lines; anything else is one line naming
the path (exit 2). Several files are read in the order given, a later one's key winning over an
earlier one's, as docker's repeated --env-file does."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from fsdpctl.outside import Door, read_text
from fsdpctl.settings.dotenv import Dotenv, merged

# A settings file is a few KB; anything far larger is not one (and would be read whole into memory).
ENV_FILE_MAX_BYTES = 1024 * 1024


DOOR = Door(
    what="--env-file",
    noun="a settings file",
    limit=ENV_FILE_MAX_BYTES,
    hint="name a readable KEY=VALUE text file (see .env.example)",
    missing_hint="create it from .env.example",
)


def read_env_file(path: Path, *, given: bool = True) -> Dotenv:
    """The KEY=VALUE lines of one settings file. `given`: named by the user, so it must exist (the
    default .env may be absent)."""
    from fsdpctl.settings import parse_dotenv

    text = read_text(DOOR, path, missing_ok=not given)
    return Dotenv() if text is None else parse_dotenv(text, str(path))


def read_env_files(paths: Sequence[Path], *, given: bool = True) -> Dotenv:
    """The settings files in order, merged: a key of a later file wins (settings.dotenv.merged)."""
    return merged([read_env_file(p, given=given) for p in paths])

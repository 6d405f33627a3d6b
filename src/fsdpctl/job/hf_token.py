"""The Hugging Face token a job gets besides its spec (JobSpec.secret_env), read at the last
moment."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from fsdpctl import files
from fsdpctl.errors import BadInput
from fsdpctl.redact import add_secrets

if TYPE_CHECKING:
    from fsdpctl.settings import Config

TOKEN_FILE_MAX = 64 * 1024  # a token is tens of bytes


def _read_file(path: str) -> str:
    """The token file's text: a regular file, opened without blocking (a FIFO there is refused, not
    waited on) and read up to a bound (a link to /dev/zero ends there)."""
    try:
        data = files.read_regular(Path(path).expanduser(), TOKEN_FILE_MAX, follow_links=True)
    except OSError as e:
        raise BadInput(f"HF_TOKEN_FILE={path!r} {files.why(e)}", hint="fix the path") from e
    return data.decode("utf-8")


def secret_env(cfg: Config) -> dict[str, str]:
    """HF_TOKEN for the local launchers' environment or the EKS Secret; empty when no token is
    set."""
    token = cfg.hf_token_value(_read_file)
    add_secrets(token)  # a token from HF_TOKEN_FILE is masked like one from HF_TOKEN
    return {"HF_TOKEN": token} if token else {}

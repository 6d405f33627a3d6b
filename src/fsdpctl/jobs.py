"""What both backends hand a job besides its manifest: the secrets, read at the last moment."""

from __future__ import annotations

from pathlib import Path

from fsdpctl.errors import BadInput
from fsdpctl.redact import remember
from fsdpctl.settings import Config


def _read_file(path: str) -> str:
    try:
        return Path(path).expanduser().read_text()
    except OSError as e:
        raise BadInput(f"HF_TOKEN_FILE={path!r} cannot be read ({e.strerror})", hint="fix the path") from e


def secret_env(cfg: Config) -> dict[str, str]:
    """HF_TOKEN for the local launchers' environment or the EKS Secret; empty when no token is set."""
    token = cfg.hf_token_value(_read_file)
    remember(token)  # a token from HF_TOKEN_FILE is masked like one from HF_TOKEN
    return {"HF_TOKEN": token} if token else {}

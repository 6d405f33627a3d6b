"""Adapter: the Hugging Face Hub. The download itself is fsdptrain.fetch (huggingface_hub), the same
code the job's pre-step runs in its pod, so a workstation pre-stages exactly what a job would fetch;
this adapter gives it the endpoint and turns its failures into fsdpctl's errors and exit codes."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from fsdpctl.errors import BadInput, FsdpctlError
from fsdptrain.fetch import Fetched, FetchError, Progress, Target


def fetch(
    wanted: list[Target],
    hf_home: Path,
    *,
    token: str,
    dry_run: bool,
    on_progress: Callable[[Progress], None],
    timeout: float = 30,
) -> list[Fetched]:
    """Each repo into the cache HF_HOME/hub (HF_ENDPOINT: another hub or a mirror). A wrong id or a
    missing or refused token: exit 2, with nothing written; an unreachable hub: exit 1 (run again:
    what is complete stays)."""
    try:
        import huggingface_hub  # noqa: F401 - only to say what is missing
    except ImportError as e:
        raise FsdpctlError(
            "huggingface_hub is not installed", hint="pip install 'fsdpctl[train]'"
        ) from e
    from fsdptrain.fetch import fetch_all, hub_deadline

    hub_deadline(
        timeout
    )  # REQUEST_TIMEOUT: a hub that accepts and never answers is one line, exit 1
    try:
        return fetch_all(
            wanted,
            hf_home / "hub",
            token=token,
            endpoint=os.environ.get("HF_ENDPOINT") or None,
            report=on_progress,
            dry_run=dry_run,
        )
    except FetchError as e:
        if e.permanent:
            raise BadInput(str(e), hint=_hint(str(e))) from e
        raise FsdpctlError(
            str(e), hint="check the network (HF_ENDPOINT for a mirror) and run it again"
        ) from e


def _hint(message: str) -> str:
    if "gated" in message or "token" in message:
        return "HF_TOKEN=hf_... (or HF_TOKEN_FILE) of an account granted access on the repo's page"
    return "check the repo id on the hub (namespace/name)"

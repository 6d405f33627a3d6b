"""Job orchestration shared by the commands: render the job for the chosen backend and hand it over."""

from __future__ import annotations

from pathlib import Path

from fsdpctl import render
from fsdpctl.errors import BadInput, FsdpctlError
from fsdpctl.settings import Config


def _read_file(path: str) -> str:
    try:
        return Path(path).expanduser().read_text()
    except OSError as e:
        raise BadInput(f"HF_TOKEN_FILE={path!r} cannot be read ({e.strerror})", hint="fix the path") from e


def secret_env(cfg: Config) -> dict[str, str]:
    token = cfg.hf_token_value(_read_file)
    return {"HF_TOKEN": token} if token else {}


def run_local(cfg: Config, *, run_id: str | None, replace: bool) -> dict:
    from fsdpctl.adapters import local

    run_id = run_id or render.new_run_id(cfg.job_name)
    job = render.render_job(cfg, run_id)[-1]
    if replace:
        state = local.read_state(local.job_dir(cfg.job_name))
        if local.effective_phase(state) in local.ACTIVE:
            local.stop(cfg.job_name)
            local.wait(cfg.job_name)
    try:
        return local.start(job, checkpoint_mount=render.POD_CHECKPOINT_ROOT, secret_env=secret_env(cfg))
    except local.LocalJobError as e:
        raise FsdpctlError(str(e)) from e

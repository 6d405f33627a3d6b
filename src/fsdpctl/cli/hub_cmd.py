"""fsdpctl model fetch | data fetch: repos from the Hugging Face Hub into the cache a job reads,
ahead of the job (fsdpctl.job.prestep). Pre-staged, the job's own pre-step finds them complete and
downloads nothing."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from fsdpctl.cli.common import (
    DryRunOpt,
    Output,
    OutputOpt,
    command_group,
    emit,
    err,
    ok,
    out,
    state,
)

model_app = command_group("Models on the Hugging Face Hub: pre-stage one where jobs read it.")
data_app = command_group("Data sets on the Hugging Face Hub: pre-stage one where jobs read it.")

ToOpt = Annotated[
    Path | None,
    typer.Option(
        "--to",
        help="an HF_HOME: the cache goes to DIR/hub (default locally: the shared volume's hf-cache, "
        "FSDPCTL_HOME/volumes/SHARED_VOLUME/hf-cache, which jobs mount at SHARED_VOLUME_PATH/hf-cache)",
    ),
]
RevisionOpt = Annotated[str, typer.Option("--revision", help="branch, tag or commit")]
AFTER = (
    "Files land through temp files renamed into place, and a repo counts as present only when every file "
    "is: an interrupted fetch is finished by the next one. The token (HF_TOKEN or HF_TOKEN_FILE) is never "
    "printed."
)


RepoArg = Annotated[
    str | None,
    typer.Argument(
        help="hub id, namespace/name (default: a model's PRETRAINED and TOKENIZER, a data set's DATASET)"
    ),
]
MODEL_HELP = f"""Download a model repo (*.safetensors, *.json, tokenizer files) once;
again: nothing downloaded. Prints the snapshot directory.

{AFTER}

Example: fsdpctl --set HF_TOKEN_FILE=~/.hf-token model fetch meta-llama/Llama-2-7b-hf --to /fsx/hf-cache"""
DATA_HELP = f"""Download a data set repo (all its files) once; again: nothing downloaded.
Prints the snapshot directory; the trainer streams DATASET from it when the job runs offline.

{AFTER}

Example: fsdpctl data fetch HuggingFaceFW/fineweb-edu --to /fsx/hf-cache --dry-run"""


def _fetch_command(kind: str) -> Callable[..., None]:
    """`model fetch` and `data fetch`: one command, told which kind of repo it fetches."""

    def fetch(
        ctx: typer.Context,
        repo: RepoArg = None,
        to: ToOpt = None,
        revision: RevisionOpt = "main",
        dry_run: DryRunOpt = False,
        output: Output = OutputOpt,
    ) -> None:
        _fetch(ctx, kind, repo, to, revision, dry_run, output)

    return fetch


model_app.command("fetch", help=MODEL_HELP)(_fetch_command("model"))
data_app.command("fetch", help=DATA_HELP)(_fetch_command("dataset"))


def _fetch(
    ctx: typer.Context,
    kind: str,
    repo: str | None,
    to: Path | None,
    revision: str,
    dry_run: bool,
    output: Output = Output.table,
) -> None:
    from fsdpctl.adapters import hub
    from fsdpctl.files import home
    from fsdpctl.job import prestep
    from fsdpctl.job.hf_token import secret_env

    cfg = state(ctx).config()
    wanted = prestep.command_targets(cfg, kind, repo, revision)
    dest = prestep.destination(cfg, to, home() / "volumes")
    token = secret_env(cfg).get("HF_TOKEN", "")
    err.print(f"{'dry run: ' if dry_run else ''}into {dest / 'hub'}", markup=False)
    fetched = hub.fetch(
        wanted,
        dest,
        token=token,
        dry_run=dry_run,
        on_progress=lambda p: err.print(prestep.progress_line(p), markup=False),
        timeout=cfg.request_timeout,
    )
    for f in fetched:
        ok(prestep.result_line(f, dry_run))
    repos = [
        {
            "repo": f.target.repo_id,
            "kind": f.target.kind,
            "revision": f.target.revision,
            "sha": f.sha,
        }
        | {"path": f.path, "files": len(f.files), "bytes": f.bytes_total, "missing": len(f.missing)}
        | {"bytes_missing": f.bytes_missing}
        for f in fetched
    ]
    if not emit(
        {"dry_run": "client" if dry_run else "none", "hf_home": str(dest), "repos": repos}, output
    ):
        for f in fetched:
            out.print(f.path, markup=False)

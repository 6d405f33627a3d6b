"""fsdpctl manifest: renders through `fsdpctl.job.render`, checks and writes through
`fsdpctl.cluster.manifests`."""

from __future__ import annotations

import errno
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from fsdpctl.cli.admission import admit
from fsdpctl.cli.common import ForceOpt, ok, out, state, warn
from fsdpctl.errors import BadInput, FsdpctlError

if TYPE_CHECKING:
    from fsdpctl.cluster import manifests
    from fsdpctl.settings import Config


class Format(str, Enum):
    yaml = "yaml"
    json = "json"


# the options, in the command's order
FormatOpt = Annotated[Format, typer.Option("--output", "-o", help="yaml or json")]
OutDirOpt = Annotated[
    Path | None,
    typer.Option(
        "--out-dir",
        help="write one file per object here (all or none); the job's stale files go",
    ),
]
RunIdOpt = Annotated[
    str | None, typer.Option("--run-id", help="rendezvous id (default: a hash of the settings)")
]
ValidateOpt = Annotated[
    bool, typer.Option("--validate", help="check each object against the real schemas")
]
CrdDirOpt = Annotated[
    Path | None,
    typer.Option(
        "--crd-dir",
        envvar="FSDPCTL_CRD_DIR",
        help="dir with the PyTorchJob CRD YAML (for --validate)",
    ),
]


def manifest(
    ctx: typer.Context,
    output: FormatOpt = Format.yaml,
    out_dir: OutDirOpt = None,
    run_id: RunIdOpt = None,
    validate: ValidateOpt = False,
    crd_dir: CrdDirOpt = None,
    force: ForceOpt = False,
) -> None:
    """Render the job's Kubernetes objects (Namespace, etcd if used, PyTorchJob) from the settings.

    The HF token Secret is never printed: `fsdpctl job run` creates it through the API. A job that
    does not fit or cannot be scheduled is refused (exit 2, nothing printed or written) unless
    --force.

    Example: fsdpctl --set BACKEND=eks --set MODEL=7b manifest --run-id "fsdp-$(date +%s)" | kubectl
    apply -f -
    """
    from fsdpctl import files
    from fsdpctl.cluster import manifests
    from fsdpctl.job import policy as jobpolicy
    from fsdpctl.job import render

    run_id = files.run_id(run_id) if run_id is not None else None  # as `job run --run-id` takes it
    cfg = state(ctx).config()
    admit(cfg, force=force, starts=False)
    if cfg.target.manifest:  # a place that renders the job as text of its own (a batch script)
        _print_script(
            cfg, run_id, kube_only=validate or out_dir is not None or output != Format.yaml
        )
        return
    objs = render.render_job(cfg, run_id or jobpolicy.stable_run_id(cfg))
    if validate:
        from fsdpctl.job.validate import KUBERNETES_VERSION

        manifests.check(objs, crd_dir)
        ok(f"{len(objs)} objects valid against Kubernetes {KUBERNETES_VERSION} and the CRD schemas")
    if out_dir is None:
        out.print(manifests.text(objs, output.value), end="", markup=False)
        return
    _say_written(_write_dir(objs, out_dir, output.value, cfg.job_name))


def _print_script(cfg: Config, run_id: str | None, *, kube_only: bool) -> None:
    """The job as its place's own text (a batch script); the options that only mean something for
    Kubernetes objects (`kube_only`: -o, --out-dir, --validate) are refused."""
    from fsdpctl.job import policy as jobpolicy
    from fsdpctl.targets import resolve

    if kube_only:
        raise BadInput(
            f"BACKEND={cfg.backend} renders the job as one script, not Kubernetes objects",
            hint="drop -o, --out-dir and --validate",
        )
    text = resolve(cfg.target.manifest)(cfg, run_id or jobpolicy.stable_run_id(cfg))
    out.print(text, end="", markup=False)


def _say_written(done: manifests.Written) -> None:
    for path in done.files:
        ok(f"wrote {path}")
    for path in done.removed:
        ok(f"removed {path} (an earlier render's, not in this one)")
    for path in done.kept:
        warn(
            f"kept {path}: an earlier render wrote it, and it was changed since; remove it if stale"
        )


def _write_dir(objs: list[dict], out_dir: Path, fmt: str, job: str) -> manifests.Written:
    """manifests.write_dir (all files or none), its OSError as one line naming --out-dir, exit 2
    (exit 1 for a full disk: not the input's fault); the folders it made for them removed again when
    it failed."""
    from fsdpctl.cluster import manifests

    made = [p for p in (out_dir, *out_dir.parents) if not p.exists()]
    try:
        return manifests.write_dir(objs, out_dir, fmt, job)
    except (OSError, BadInput) as e:
        for folder in made:  # deepest first, and only while empty
            try:
                folder.rmdir()
            except OSError:
                break
        if isinstance(e, BadInput):
            raise
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise FsdpctlError(
                f"--out-dir {out_dir}: no space left on its device; nothing was written",
                hint="free some space there, or choose another --out-dir",
            ) from None
        if out_dir.exists() and not out_dir.is_dir() or e.errno == errno.ENOTDIR:
            why = "is not a directory (a file is in the way)"
        else:
            why = f"cannot be written: {e.strerror}"
        raise BadInput(
            f"--out-dir {out_dir} {why}", hint="name a directory you can write"
        ) from None

"""fsdpctl manifest"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Annotated

import typer

from fsdpctl.cli.common import ok, out, state
from fsdpctl.errors import BadInput, FsdpctlError


def load_crd_schemas(crd_dir: Path) -> dict:
    import yaml

    from fsdpctl.validate import crd_schemas

    files = sorted(crd_dir.rglob("*.yaml"))
    if not files:
        raise BadInput(
            f"--crd-dir {crd_dir} holds no CRD YAML files",
            hint="point it at the Training Operator v1.9.4 manifests (kubeflow.org_pytorchjobs.yaml)",
        )
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # the CRD is 600 KB: libyaml is 10x faster
    docs = [d for f in files for d in yaml.load_all(f.read_text(), Loader=loader) if isinstance(d, dict)]
    return crd_schemas(docs)


def write_dir(objs: list[dict], out_dir: Path) -> list[Path]:
    """All files or none: written to a temp dir beside the target, then moved in."""
    from fsdpctl import render

    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out_dir, prefix=".manifest-"))
    try:
        names = []
        for obj in objs:
            name = render.file_name(obj)
            (tmp / name).write_text(render.to_yaml([obj]))
            names.append(name)
        for name in names:
            os.replace(tmp / name, out_dir / name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return [out_dir / n for n in names]


def manifest(
    ctx: typer.Context,
    out_dir: Annotated[
        Path | None, typer.Option("--out-dir", "-o", help="write one file per object here")
    ] = None,
    run_id: Annotated[
        str | None, typer.Option("--run-id", help="rendezvous id (default: a hash of the settings)")
    ] = None,
    validate: Annotated[
        bool, typer.Option("--validate", help="check each object against the real schemas")
    ] = False,
    crd_dir: Annotated[
        Path | None,
        typer.Option(
            "--crd-dir", envvar="FSDPCTL_CRD_DIR", help="dir with the PyTorchJob CRD YAML (for --validate)"
        ),
    ] = None,
) -> None:
    """Render the job's Kubernetes objects (Namespace, etcd if used, PyTorchJob) from the settings.

    The HF token Secret is never printed: `fsdpctl job run` creates it through the API.

    Example: fsdpctl --set BACKEND=eks --set MODEL=7b manifest --run-id "fsdp-$(date +%s)" | kubectl apply -f -
    """
    from fsdpctl import render

    cfg = state(ctx).config()
    objs = render.render_job(cfg, run_id or render.stable_run_id(cfg))
    if validate:
        if crd_dir is None:
            raise BadInput(
                "--validate needs --crd-dir (or FSDPCTL_CRD_DIR)",
                hint="the dir holding kubeflow.org_pytorchjobs.yaml from Training Operator v1.9.4",
            )
        from fsdpctl.validate import KUBERNETES_VERSION
        from fsdpctl.validate import validate as check

        problems = check(objs, load_crd_schemas(crd_dir))
        if problems:
            raise FsdpctlError(f"{len(problems)} schema problem(s): " + "; ".join(problems))
        ok(f"{len(objs)} objects valid against Kubernetes {KUBERNETES_VERSION} and the CRD schemas")
    if out_dir is None:
        out.print(render.to_yaml(objs), end="", markup=False)
        return
    for path in write_dir(objs, out_dir):
        ok(f"wrote {path}")

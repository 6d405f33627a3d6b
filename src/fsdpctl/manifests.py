"""`fsdpctl manifest`: the job's objects as YAML (a multi-document stream) or JSON (a v1 List, what
`kubectl get -o json` prints for several objects), checked against the real schemas, or written one file per
object, all files or none."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from fsdpctl import render
from fsdpctl.errors import BadInput, FsdpctlError
from fsdpctl.redact import redact_obj

Obj = dict[str, Any]
FORMATS = ("yaml", "json")


def text(objs: list[Obj], fmt: str = "yaml") -> str:
    if fmt == "json":
        return json.dumps({"apiVersion": "v1", "kind": "List", "items": redact_obj(objs)}, indent=2) + "\n"
    return render.to_yaml(objs)


def file_name(obj: Obj, fmt: str = "yaml") -> str:
    """kind-name.yaml (or .json), lower case, safe as a file name."""
    return render.file_name(obj).removesuffix(".yaml") + f".{fmt}"


def write_dir(objs: list[Obj], out_dir: Path, fmt: str = "yaml") -> list[Path]:
    """All files or none: written to a temp dir beside the target, then moved in."""
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out_dir, prefix=".manifest-"))
    try:
        names = []
        for obj in objs:
            name = file_name(obj, fmt)
            body = json.dumps(redact_obj(obj), indent=2) + "\n" if fmt == "json" else render.to_yaml([obj])
            (tmp / name).write_text(body)
            names.append(name)
        for name in names:
            os.replace(tmp / name, out_dir / name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return [out_dir / n for n in names]


def load_crd_schemas(crd_dir: Path) -> dict[tuple[str, str], Obj]:
    """The openAPIV3Schema of every CRD in the YAML files under `crd_dir`."""
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


def check(objs: list[Obj], crd_dir: Path | None) -> None:
    """Every object against the Kubernetes OpenAPI and the CRD schemas in `crd_dir`; one error listing every
    problem."""
    from fsdpctl.validate import validate

    if crd_dir is None:
        raise BadInput(
            "--validate needs --crd-dir (or FSDPCTL_CRD_DIR)",
            hint="the dir holding kubeflow.org_pytorchjobs.yaml from Training Operator v1.9.4",
        )
    problems = validate(objs, load_crd_schemas(crd_dir))
    if problems:
        raise FsdpctlError(f"{len(problems)} schema problem(s): " + "; ".join(problems))

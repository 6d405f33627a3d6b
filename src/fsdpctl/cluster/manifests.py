"""`fsdpctl manifest`: the job's objects as YAML (a multi-document stream) or JSON (a v1 List, what
`kubectl get -o json` prints for several objects), checked against the real schemas, or written one
file per object, all files or none."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fsdpctl.errors import BadInput, FsdpctlError
from fsdpctl.job import render
from fsdpctl.redact import redact_obj

Obj = dict[str, Any]
FORMATS = ("yaml", "json")


def text(objs: list[Obj], fmt: str = "yaml") -> str:
    if fmt == "json":
        return (
            json.dumps({"apiVersion": "v1", "kind": "List", "items": redact_obj(objs)}, indent=2)
            + "\n"
        )
    return render.to_yaml(objs)


def file_name(obj: Obj, fmt: str = "yaml") -> str:
    """kind-name.yaml (or .json), lower case, safe as a file name."""
    return render.file_name(obj).removesuffix(".yaml") + f".{fmt}"


def index_name(job: str) -> str:
    """The list of the files fsdpctl wrote into an --out-dir for `job`, in `sha256sum` format. Its
    suffix is not one `kubectl apply -f DIR` reads (k8s.io/cli-runtime resource/visitor.go:
    ignoreFile takes only .json, .yaml and .yml, hidden names included), so the directory still
    applies as it is."""
    return f".fsdpctl-{job}.sha256"


def read_index(path: Path) -> dict[str, str]:
    """name -> sha256 from an index file; {} when there is none. A line fsdpctl did not write is
    skipped."""
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return {}
    pairs = (line.split("  ", 1) for line in lines)
    return {name: digest for digest, name in (p for p in pairs if len(p) == 2) if "/" not in name}


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _file_sha(path: Path) -> str | None:
    """The sha256 of a regular file (not followed through a link: fsdpctl writes none); None for
    anything else, which is never fsdpctl's (a FIFO is not opened: its open(2) would wait for a
    writer)."""
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            return None
        return _sha256(path.read_bytes())
    except OSError:  # gone, or unreadable: not a file fsdpctl can vouch for
        return None


@dataclass
class Written:
    files: list[Path]
    removed: list[Path]  # files of the same job an earlier render wrote that this one does not
    kept: list[Path]  # such files changed since fsdpctl wrote them: never deleted


def write_dir(objs: list[Obj], out_dir: Path, fmt: str = "yaml", job: str = "") -> Written:
    """All files or none: written to a temp dir beside the target, then moved in. A file in the way
    that fsdpctl did not write (listed in no job's index with the same sha256, and not already what
    this render writes) is refused before anything is written (BadInput). The files of `job` from an
    earlier render (its index, either format) that this render does not produce are removed, unless
    changed since."""
    job = job or next((o["metadata"]["name"] for o in objs if o["kind"] != "Namespace"), "job")
    bodies = {file_name(obj, fmt): _body(obj, fmt).encode() for obj in objs}
    out_dir.mkdir(parents=True, exist_ok=True)
    ours = read_index(out_dir / index_name(job))
    others = [read_index(i) for i in out_dir.glob(".fsdpctl-*.sha256") if i.name != index_name(job)]
    theirs = {(name, digest) for index in [ours, *others] for name, digest in index.items()}
    # a file another job's index lists too (their common Namespace) is theirs still: never stale
    stale = {n: d for n, d in ours.items() if n not in bodies and not any(n in o for o in others)}
    for name, body in bodies.items():
        path = out_dir / name
        if os.path.lexists(path) and _file_sha(path) not in {
            _sha256(body),
            *(d for n, d in theirs if n == name),
        }:
            raise BadInput(
                f"--out-dir {out_dir}: {name} is in the way (fsdpctl did not write it, or it was changed "
                "since); nothing was written",
                hint="move it away, or choose another --out-dir",
            )
    tmp = Path(tempfile.mkdtemp(dir=out_dir, prefix=".manifest-"))
    try:
        for name, body in bodies.items():
            (tmp / name).write_bytes(body)
        index = "".join(f"{_sha256(body)}  {name}\n" for name, body in sorted(bodies.items()))
        (tmp / "index").write_text(index)
        for name in bodies:
            os.replace(tmp / name, out_dir / name)
        removed, kept = _remove_stale(out_dir, stale)
        os.replace(
            tmp / "index", out_dir / index_name(job)
        )  # last: a crash before it leaves the old list
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return Written([out_dir / n for n in bodies], removed, kept)


def _body(obj: Obj, fmt: str) -> str:
    return json.dumps(redact_obj(obj), indent=2) + "\n" if fmt == "json" else render.to_yaml([obj])


def _remove_stale(out_dir: Path, stale: dict[str, str]) -> tuple[list[Path], list[Path]]:
    """Each stale file removed when it still holds what fsdpctl wrote; one changed since is kept."""
    removed, kept = [], []
    for name, digest in sorted(stale.items()):
        path = out_dir / name
        if not path.is_file() or path.is_symlink():
            continue
        if _file_sha(path) == digest:
            path.unlink()
            removed.append(path)
        else:
            kept.append(path)
    return removed, kept


def load_crd_schemas(crd_dir: Path) -> dict[tuple[str, str], Obj]:
    """The openAPIV3Schema of every CRD in the YAML files under `crd_dir`."""
    import yaml

    from fsdpctl.job.validate import crd_schemas

    files = sorted(crd_dir.rglob("*.yaml"))
    if not files:
        raise BadInput(
            f"--crd-dir {crd_dir} holds no CRD YAML files",
            hint="point it at the Training Operator v1.9.4 manifests (kubeflow.org_pytorchjobs.yaml)",
        )
    loader = getattr(
        yaml, "CSafeLoader", yaml.SafeLoader
    )  # the CRD is 600 KB: libyaml is 10x faster
    docs = [
        d for f in files for d in yaml.load_all(f.read_text(), Loader=loader) if isinstance(d, dict)
    ]
    return crd_schemas(docs)


def check(objs: list[Obj], crd_dir: Path | None) -> None:
    """Every object against the Kubernetes OpenAPI and the CRD schemas in `crd_dir`; one error
    listing every problem."""
    from fsdpctl.job.validate import validate

    if crd_dir is None:
        raise BadInput(
            "--validate needs --crd-dir (or FSDPCTL_CRD_DIR)",
            hint="the dir holding kubeflow.org_pytorchjobs.yaml from Training Operator v1.9.4",
        )
    problems = validate(objs, load_crd_schemas(crd_dir))
    if problems:
        raise FsdpctlError(f"{len(problems)} schema problem(s): " + "; ".join(problems))

"""What `fsdpctl deploy` puts on a cluster: etcd (fsdpctl's template), the job operator (the pinned upstream
release in templates/releases.yaml, read from a mirror or the cache and checked by sha256) and monitoring
(fsdpctl's templates). Pure apart from reading files it is pointed at; the command applies the objects."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from fsdpctl import render
from fsdpctl.errors import FsdpctlError
from fsdpctl.settings import Config

COMPONENTS = ("etcd", "operator", "monitoring")
VERSION_LABEL = "app.kubernetes.io/version"
PART_OF = "app.kubernetes.io/part-of"
MONITORING_VERSION = "1"  # of fsdpctl's monitoring bundle; the images inside are pinned in the template
DASHBOARD_METRICS = (
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_MEM_COPY_UTIL",
    "DCGM_FI_DEV_XID_ERRORS",
    "DCGM_FI_DEV_SM_CLOCK",
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_POWER_USAGE",
    "fsdptrain_tokens_per_second",
    "fsdptrain_loss",
    "fsdptrain_mfu",
)


@dataclass
class Component:
    name: str
    version: str
    objects: list[dict]
    ready: list[dict] = field(default_factory=list)  # {kind, namespace, name} that must become ready
    requires: list[dict] = field(
        default_factory=list
    )  # ... installed by other means, with its `install` command


def releases() -> dict:
    return yaml.safe_load((render.data_dir("templates") / "releases.yaml").read_text())


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def release_file(entry: dict, sources: list[Path]) -> Path:
    """The first copy in `sources` whose sha256 matches the pin; a copy that differs is refused, loudly."""
    for base in sources:
        candidate = base / entry["path"]
        if not candidate.is_file():
            continue
        if sha256(candidate) != entry["sha256"]:
            raise FsdpctlError(
                f"{candidate} does not match its pinned sha256 {entry['sha256'][:12]}...",
                hint="remove it and fetch the pinned release again (`fsdpctl deploy fetch`)",
            )
        return candidate
    where = ", ".join(str(s) for s in sources) or "nowhere"
    how = "`fsdpctl deploy fetch`" if entry.get("url") else "render it as templates/releases.yaml says"
    raise FsdpctlError(
        f"{entry['path']} is not in {where}",
        hint=f"{how}, or point --from (FSDPCTL_MANIFESTS) at a mirror holding it",
    )


def operator(cfg: Config, sources: list[Path]) -> Component:
    rel = releases()[cfg.job_kind]
    objs = []
    for entry in rel["files"]:
        path = release_file(entry, sources)
        objs += [
            o
            for o in yaml.load_all(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
            if o
        ]
    return Component(
        "operator", f"{rel['name']} {rel['version']}", objs, rel["ready"], rel.get("requires", [])
    )


def etcd(cfg: Config) -> Component:
    objs = render.render_namespace(cfg) + render.render_etcd(cfg)
    return Component(
        "etcd",
        render.ETCD_IMAGE.rsplit(":", 1)[1],
        objs,
        [{"kind": "Deployment", "namespace": cfg.job_namespace, "name": "etcd"}],
    )


def monitoring(cfg: Config) -> Component:
    dashboard = (render.data_dir("templates") / "grafana-dashboard.json").read_text()
    objs = render.render_template(
        "monitoring.yaml.j2",
        namespace=cfg.monitoring_namespace,
        version=MONITORING_VERSION,
        dashboard=json.dumps(json.loads(dashboard), indent=1),
        job_namespace=cfg.job_namespace,
    )
    ready = [
        {"kind": o["kind"], "namespace": o["metadata"]["namespace"], "name": o["metadata"]["name"]}
        for o in objs
        if o["kind"] in ("Deployment", "DaemonSet")
    ]
    return Component("monitoring", f"fsdpctl-monitoring {MONITORING_VERSION}", objs, ready)


def components(cfg: Config, which: str, sources: list[Path]) -> list[Component]:
    names = COMPONENTS if which == "all" else (which,)
    build = {
        "etcd": lambda: etcd(cfg),
        "operator": lambda: operator(cfg, sources),
        "monitoring": lambda: monitoring(cfg),
    }
    return [build[n]() for n in names]


def is_ready(obj: dict | None) -> bool:
    """Deployments: every replica available; DaemonSets: every scheduled pod ready; CRDs: Established."""
    if obj is None:
        return False
    status = obj.get("status") or {}
    if obj["kind"] == "Deployment":
        return status.get("availableReplicas", 0) >= (obj.get("spec", {}).get("replicas", 1) or 1)
    if obj["kind"] == "DaemonSet":
        want = status.get("desiredNumberScheduled")
        return want is not None and status.get("numberReady", 0) >= want
    if obj["kind"] == "CustomResourceDefinition":
        return any(
            c.get("type") == "Established" and c.get("status") == "True"
            for c in status.get("conditions") or []
        )
    return True

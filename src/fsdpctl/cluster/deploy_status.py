"""What is installed on the cluster (`deploy status`): each component's workloads and CRDs, the GPU
nodes and what they offer, and what `job run` needs that is missing, with the command that adds
it."""

from __future__ import annotations

from typing import TYPE_CHECKING, TypedDict, cast

from fsdpctl.cluster.deploy import (
    FSX,
    GPU_RESOURCES,
    GPU_ROLE,
    PLUGINS,
    VERSION_LABEL,
    Component,
    get,
    is_ready,
    releases,
)
from fsdpctl.job import render
from fsdpctl.settings import Config

if TYPE_CHECKING:
    from fsdpctl.adapters.kube import Kube
    from fsdpctl.job.kube_shapes import Node


def requirements(kube: Kube, comp: Component) -> tuple[list[dict], list[dict]]:
    """What the component needs but fsdpctl does not install, split into (missing, present)."""
    missing = [r for r in comp.requires if get(kube, r) is None]
    return missing, [r for r in comp.requires if r not in missing]


def missing_message(comp: Component, req: dict[str, str]) -> str:
    return (
        f"{comp.name}: {req['kind']}/{req['name']} in {req['namespace']} is not installed; jobs will stay "
        f"pending until it is: {req['install']}"
    )


def installed_probes(cfg: Config) -> list[dict[str, str]]:
    """The workloads whose presence tells what is deployed: etcd, the operator's, monitoring's."""
    rel = releases()[cfg.job_kind]
    probes = [
        {"component": "etcd", "kind": "Deployment", "namespace": cfg.job_namespace, "name": "etcd"}
    ]
    probes += [
        {"component": "operator", "kind": r["kind"], "namespace": r["namespace"], "name": r["name"]}
        for r in rel.get("ready", []) + rel.get("requires", [])
    ]
    probes += [{"component": "plugins", **r} for r in releases()[PLUGINS]["ready"]]
    probes += [{"component": "storage", **r} for r in releases()[FSX]["ready"]]
    probes += [
        {"component": "monitoring", "kind": k, "namespace": cfg.monitoring_namespace, "name": n}
        for k, n in (
            ("Deployment", "prometheus"),
            ("Deployment", "grafana"),
            ("DaemonSet", "dcgm-exporter"),
        )
    ]
    return probes


class ComponentRow(TypedDict):
    """A row of `deploy status` (`status`): one deployed object and whether it is ready."""

    component: str
    object: str  # Kind/name, CRD <name>, Node/<name>
    namespace: str  # '-' for a cluster-scoped one
    installed: bool
    version: str  # '-' when not known
    ready: bool


def _workload_row(kube: Kube, probe: dict[str, str]) -> ComponentRow:
    obj = get(kube, probe)
    version = "-"
    if obj is not None:
        image = obj["spec"]["template"]["spec"]["containers"][0]["image"]
        version = obj["metadata"].get("labels", {}).get(VERSION_LABEL) or image.rsplit(":", 1)[-1]
    return {
        "component": probe["component"],
        "object": f"{probe['kind']}/{probe['name']}",
        "namespace": probe["namespace"],
        "installed": obj is not None,
        "version": version,
        "ready": is_ready(obj),
    }


def _crd_row(kube: Kube, cfg: Config) -> ComponentRow:
    """The job CRD as discovery serves it: its name is `<plural>.<group>`, the plural the CRD
    declares."""
    from fsdpctl.adapters.kube import KubeError

    api, kind = render.job_api(cfg)
    group, version = api.split("/")
    try:
        crd: str | None = f"{kube.resource(api, kind).plural}.{group}"
    except KubeError as e:
        if e.status != 404:
            raise
        crd = None
    return {
        "component": "operator",
        "object": f"CRD {crd}" if crd else f"CRD of {kind} ({api})",
        "namespace": "-",
        "installed": crd is not None,
        "version": version,
        "ready": crd is not None,
    }


def node_rows(nodes: list[Node], efa: bool) -> list[ComponentRow]:
    """Per GPU node (fsdpctl's role label or one of its instance types), what the device plugins
    made allocatable: ready when it offers GPUs and, with EFA on, EFA interfaces."""
    from fsdpctl.plan.instances import INSTANCE_TYPES

    wanted = GPU_RESOURCES if efa else GPU_RESOURCES[:1]
    rows: list[ComponentRow] = []
    for node in nodes:
        labels = node["metadata"].get("labels") or {}
        gpu_role = labels.get(GPU_ROLE[0]) == GPU_ROLE[1]
        if not gpu_role and labels.get("node.kubernetes.io/instance-type") not in INSTANCE_TYPES:
            continue
        allocatable = (node.get("status") or {}).get("allocatable") or {}
        have = {r: str(allocatable.get(r, "0")) for r in wanted}
        rows.append(
            {
                "component": "plugins",
                "object": f"Node/{node['metadata']['name']}",
                "namespace": "-",
                "installed": True,
                "version": " ".join(f"{r}={n}" for r, n in have.items()),
                "ready": all(n != "0" for n in have.values()),
            }
        )
    return rows


def status(kube: Kube, cfg: Config) -> list[ComponentRow]:
    """What is installed, at which version, and whether it is ready: one row per probe, the job CRD
    and, per GPU node, whether its GPUs and EFA interfaces are allocatable."""
    rows = [_workload_row(kube, p) for p in installed_probes(cfg)] + [_crd_row(kube, cfg)]
    # the API server's Node list, parsed JSON: the fields node_rows reads are Node's
    nodes = cast("list[Node]", kube.list("v1", "Node"))
    return rows + node_rows(nodes, cfg.efa_per_node > 0)

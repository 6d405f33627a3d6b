"""What `fsdpctl deploy` puts on a cluster and how: etcd (fsdpctl's template), the job operator, the
NVIDIA and EFA device plugins and the FSx for Lustre CSI driver (pinned upstream releases in
templates/releases.yaml, read from a mirror or the cache and checked by sha256; the plugins patched
to tolerate fsdpctl's GPU taint; the driver with a static PV and claim of the settings' file system)
and monitoring (fsdpctl's templates). Building the components reads only the files it is pointed at;
applying them (unless the cluster holds them already), waiting for readiness and reading what is
installed go through the Kubernetes adapter; `fetch` fills the cache through the download adapter.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict, cast

import yaml

from fsdpctl.errors import FsdpctlError
from fsdpctl.job import render
from fsdpctl.settings import Config

if TYPE_CHECKING:
    from fsdpctl.adapters.kube import Kube
    from fsdpctl.job.kube_shapes import (
        Affinity,
        NodeSelectorRequirement,
        PodSpec,
        Toleration,
        Workload,
    )


COMPONENTS = ("etcd", "operator", "plugins", "storage", "monitoring")


VERSION_LABEL = "app.kubernetes.io/version"


PART_OF = "app.kubernetes.io/part-of"


MONITORING_VERSION = (
    "1"  # of fsdpctl's monitoring bundle; the images inside are pinned in the template
)


PLUGINS = "device-plugins"  # its key in templates/releases.yaml


FSX = "fsx-csi-driver"  # likewise


FSX_DRIVER = "fsx.csi.aws.com"


# what kustomize's `namespace:` leaves alone in the FSx base: the cluster-scoped kinds
CLUSTER_SCOPED = {
    "CSIDriver",
    "ClusterRole",
    "ClusterRoleBinding",
    "PersistentVolume",
    "StorageClass",
}


# The taints fsdpctl puts on its GPU node groups (eksctl/clusterconfig.yaml.j2,
# terraform/modules/eks-gpu) and the label it gives them: the device plugins must tolerate the
# first, GPU-only DaemonSets select the second.
GPU_TAINTS = ({"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"},)


GPU_ROLE = ("fsdpctl.io/role", "gpu")


GPU_RESOURCES = (
    "nvidia.com/gpu",
    "vpc.amazonaws.com/efa",
)  # what the NVIDIA and EFA plugins advertise


# The EKS add-on images' registry account (eksctl fills the `%s` of its EFA manifest with
# `api.EKSResourceAccountID(region)`): 602401143452 except in these regions (AWS, "Amazon container
# image registries" in the EKS user guide).
EKS_IMAGE_ACCOUNTS = {
    "af-south-1": "877085696533",
    "ap-east-1": "800184023465",
    "eu-south-1": "590381155156",
    "me-south-1": "558608220178",
    "cn-north-1": "918309763551",
    "cn-northwest-1": "961992271922",
    "us-gov-west-1": "013241004608",
    "us-gov-east-1": "151742754352",
}


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
    ready: list[dict] = field(
        default_factory=list
    )  # {kind, namespace, name} that must become ready
    # ... and what must be installed by other means, each with the `install` command that does it
    requires: list[dict] = field(default_factory=list)


def releases() -> dict:
    return yaml.safe_load((render.data_dir("templates") / "releases.yaml").read_text())


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def release_file(entry: dict, sources: list[Path]) -> Path:
    """The first copy in `sources` whose sha256 matches the pin; a copy that differs is refused,
    loudly."""
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
    how = (
        "`fsdpctl deploy fetch`"
        if entry.get("url")
        else "render it as templates/releases.yaml says"
    )
    raise FsdpctlError(
        f"{entry['path']} is not in {where}",
        hint=f"{how}, or point --from (FSDPCTL_MANIFESTS) at a mirror holding it",
    )


def yaml_documents(path: Path) -> list[dict[str, Any]]:
    """The non-empty documents of a release file, a fresh copy on each call. Parsed once per process
    and file version: the operator's standalone-install.yaml is 3.7 MB, seconds of CPU for PyYAML
    even with libyaml, and a session (or a test run) applies it many times. The objects go to the
    API server as JSON, so the JSON round trip keeps all they carry."""
    st = path.stat()
    return list(json.loads(_parsed(path, st.st_mtime_ns, st.st_size)))


@functools.lru_cache(maxsize=16)
def _parsed(path: Path, mtime_ns: int, size: int) -> str:
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return json.dumps([o for o in yaml.load_all(path.read_text(), Loader=loader) if o])


def operator(cfg: Config, sources: list[Path]) -> Component:
    rel = releases()[cfg.job_kind]
    objs = []
    for entry in rel["files"]:
        path = release_file(entry, sources)
        objs += yaml_documents(path)
    return Component(
        "operator", f"{rel['name']} {rel['version']}", objs, rel["ready"], rel.get("requires", [])
    )


def gpu_node_affinity() -> Affinity:
    """GPU nodes by labels EKS 1.33 nodes carry (`nvidia.com/gpu.present` needs GPU Feature
    Discovery, or nodeadm on kubelet >= 1.35): the kubelet's instance type among fsdpctl's GPU
    types, or fsdpctl's node-group role."""
    from fsdpctl.plan.instances import INSTANCE_TYPES

    terms: list[NodeSelectorRequirement] = [
        {
            "key": "node.kubernetes.io/instance-type",
            "operator": "In",
            "values": sorted(INSTANCE_TYPES),
        },
        {"key": GPU_ROLE[0], "operator": "In", "values": [GPU_ROLE[1]]},
    ]
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [t]} for t in terms]
            }
        }
    }


def eks_image_registry(region: str) -> str:
    suffix = "amazonaws.com.cn" if region.startswith("cn-") else "amazonaws.com"
    return f"{EKS_IMAGE_ACCOUNTS.get(region, '602401143452')}.dkr.ecr.{region}.{suffix}"


def _tolerating(pod: PodSpec, region: str) -> None:
    """eksctl's plugin manifests as eksctl itself finishes them, plus what eksctl leaves out: a
    toleration of every fsdpctl GPU taint (eksctl's EFADevicePlugin.SetTolerations returns nil) and,
    for the NVIDIA plugin, which has no affinity of its own, GPU nodes only."""
    tolerations = pod.setdefault("tolerations", [])
    for taint in GPU_TAINTS:
        wanted: Toleration = {"key": taint["key"], "operator": "Exists", "effect": taint["effect"]}
        if wanted not in tolerations:
            tolerations.append(wanted)
    if "affinity" not in pod:
        pod["affinity"] = gpu_node_affinity()
    for c in pod["containers"]:  # eksctl's EFA manifest names its image "%s.dkr.ecr.%s.%s/eks/..."
        c["image"] = c["image"].replace("%s.dkr.ecr.%s.%s", eks_image_registry(region))


def plugins(cfg: Config, sources: list[Path]) -> Component:
    """The NVIDIA and EFA device plugins as eksctl installs them, under eksctl's names in
    kube-system: on an eksctl cluster the server-side apply patches eksctl's own DaemonSets, on a
    terraform cluster it creates them."""
    rel = releases()[PLUGINS]
    objs = []
    for entry in rel["files"]:
        for obj in yaml_documents(release_file(entry, sources)):
            _tolerating(obj["spec"]["template"]["spec"], cfg.aws_region)
            objs.append(obj)
    return Component("plugins", f"{rel['name']} {rel['version']}", objs, rel["ready"])


def _in_namespace(obj: dict[str, Any], namespace: str) -> dict[str, Any]:
    """What the FSx base's kustomization (`namespace: kube-system`) does to an object: namespaced
    objects and ServiceAccount subjects into `namespace`; and, as the server would, no null fields
    (the chart renders `terminationGracePeriodSeconds:` empty)."""

    def drop_nulls(v: Any) -> Any:
        if isinstance(v, dict):
            return {k: drop_nulls(x) for k, x in v.items() if x is not None}
        return [drop_nulls(x) for x in v] if isinstance(v, list) else v

    obj = drop_nulls(obj)
    if obj["kind"] not in CLUSTER_SCOPED:
        obj["metadata"]["namespace"] = namespace
    for subject in obj.get("subjects", []):
        if subject["kind"] == "ServiceAccount":
            subject["namespace"] = namespace
    return obj


def fsx_volume(cfg: Config) -> list[dict[str, Any]]:
    """The static PV of FSX_FILE_SYSTEM_ID and the SHARED_VOLUME claim bound to it, as
    aws-fsx-csi-driver's examples/kubernetes/static_provisioning writes them (empty
    storageClassName: no provisioner steps in)."""
    if not cfg.fsx_file_system_id:
        return []
    pv_name = f"{cfg.shared_volume}-{cfg.fsx_file_system_id}"
    size = f"{cfg.fsx_storage_gib}Gi"
    pv = {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": pv_name},
        "spec": {
            "capacity": {"storage": size},
            "volumeMode": "Filesystem",
            "accessModes": ["ReadWriteMany"],
            "mountOptions": ["flock"],
            "persistentVolumeReclaimPolicy": "Retain",  # deleting the claim never touches the data
            "storageClassName": "",
            "claimRef": {"namespace": cfg.job_namespace, "name": cfg.shared_volume},
            "csi": {
                "driver": FSX_DRIVER,
                "volumeHandle": cfg.fsx_file_system_id,
                "volumeAttributes": {"dnsname": cfg.fsx_dns_name, "mountname": cfg.fsx_mount_name},
            },
        },
    }
    pvc = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": cfg.shared_volume, "namespace": cfg.job_namespace},
        "spec": {
            "accessModes": ["ReadWriteMany"],
            "storageClassName": "",
            "resources": {"requests": {"storage": size}},
            "volumeName": pv_name,
        },
    }
    return [pv, pvc]


def storage(cfg: Config, sources: list[Path]) -> Component:
    """The FSx for Lustre CSI driver (its kustomize base, pinned) and, when the settings name a file
    system, the job namespace, the PV and the SHARED_VOLUME claim on it."""
    rel = releases()[FSX]
    objs = []
    for entry in rel["files"]:
        for obj in yaml_documents(release_file(entry, sources)):
            objs.append(_in_namespace(obj, rel["namespace"]))
    volume = fsx_volume(cfg)
    if volume:
        objs += render.render_namespace(cfg) + volume
    return Component("storage", f"{rel['name']} {rel['version']}", objs, rel["ready"])


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
        gpu_affinity=gpu_node_affinity(),
        tools_image=cfg.image_uri,
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
        "plugins": lambda: plugins(cfg, sources),
        "storage": lambda: storage(cfg, sources),
        "monitoring": lambda: monitoring(cfg),
    }
    return [build[n]() for n in names]


def is_ready(obj: Workload | None) -> bool:
    """Deployments: every replica available; DaemonSets: every scheduled pod ready; CRDs:
    Established."""
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


# --- on the cluster -------------------------------------------------------------------------------


def contains(have: Any, want: Any) -> bool:
    """Every field fsdpctl sets has that value on the server (the server adds its own; those do not
    count)."""
    if isinstance(want, dict):
        return isinstance(have, dict) and all(
            k in have and contains(have[k], v) for k, v in want.items()
        )
    if isinstance(want, list):
        return isinstance(have, list) and len(have) == len(want) and all(map(contains, have, want))
    return bool(have == want)


class ApplyCounts(TypedDict):
    """What an apply did to a component's objects, as kubectl apply says it per object."""

    created: int
    configured: int
    unchanged: int


def apply(kube: Kube, comp: Component, *, server_dry_run: bool = False) -> ApplyCounts:
    """Server-side apply of each object unless the cluster already holds exactly it, so that a rerun
    changes nothing and says so: how many objects were created, configured and left unchanged."""
    counts: ApplyCounts = {"created": 0, "configured": 0, "unchanged": 0}
    for obj in comp.objects:
        meta = obj["metadata"]
        current = kube.get(obj["apiVersion"], obj["kind"], meta["name"], meta.get("namespace"))
        if current is not None and contains(current, obj):
            counts["unchanged"] += 1
            continue
        kube.apply(obj, dry_run=server_dry_run)
        counts["configured" if current is not None else "created"] += 1
    return counts


def summary(counts: ApplyCounts) -> str:
    return ", ".join(f"{n} {what}" for what, n in counts.items() if n)


def get(kube: Kube, ref: dict[str, str]) -> Workload | None:
    # the API server's answer for an apps/v1 kind (Deployment, DaemonSet), parsed JSON: the adapter
    # checked that it is that object (Kube.get), the fields read from it are Workload's
    return cast("Workload | None", kube.get("apps/v1", ref["kind"], ref["name"], ref["namespace"]))


def wait_ready(
    kube: Kube,
    name: str,
    refs: list[dict],
    timeout: float,
    on_wait: Callable[[int], None] | None = None,
    poll: float = 1.0,
) -> None:
    """Until every workload in `refs` is ready (`on_wait` hears how many are not yet); after
    `timeout` seconds an error naming those still not ready."""
    deadline = time.monotonic() + timeout
    pending = list(refs)
    while pending := [r for r in pending if not is_ready(get(kube, r))]:
        if time.monotonic() > deadline:
            names = ", ".join(f"{r['kind']}/{r['name']} in {r['namespace']}" for r in pending)
            raise FsdpctlError(
                f"{name}: not ready after {timeout:.0f} s: {names}",
                hint="kubectl describe the pods (image pulls, node capacity); rerun to keep waiting",
            )
        if on_wait:
            on_wait(len(pending))
        time.sleep(poll)


# --- the release cache ----------------------------------------------------------------------------

CACHED, FETCHED, UNPUBLISHED, WOULD_FETCH = "cached", "fetched", "unpublished", "would fetch"


def fetch(cache: Path, on_file: Callable[[str, str], None], dry_run: bool = False) -> None:
    """Download each pinned release file that upstream publishes as a single file into `cache`,
    checking its sha256 before it replaces anything; `on_file(path, CACHED | FETCHED | UNPUBLISHED |
    WOULD_FETCH)` for every file (`dry_run`: nothing downloaded or written, what would be is
    WOULD_FETCH)."""
    from fsdpctl.adapters.download import download

    for rel in releases().values():
        for entry in rel["files"]:
            target = cache / entry["path"]
            if target.is_file() and sha256(target) == entry["sha256"]:
                on_file(entry["path"], CACHED)
                continue
            if not entry.get("url"):
                on_file(entry["path"], UNPUBLISHED)
                continue
            if dry_run:
                on_file(entry["path"], WOULD_FETCH)
                continue
            part = download(entry["url"], target.with_suffix(".part"))
            if sha256(part) != entry["sha256"]:
                part.unlink()
                raise FsdpctlError(
                    f"{entry['url']} does not match the pinned sha256",
                    hint="report it: the pin is wrong or the download was altered",
                )
            os.replace(part, target)
            on_file(entry["path"], FETCHED)

"""The Kubernetes objects fsdpctl reads by field (fsdpctl.job.kube_shapes) are the Kubernetes API's.

Peers: the Kubernetes OpenAPI of the version fsdpctl targets (kubernetes-validate's JSON schemas of
it, `_definitions.json`, as tests/kube_peer.py reads them) for the names and kinds of every field;
the Kubernetes API peer (tests/kube_peer.py: built-ins validated against that OpenAPI, status
written through the /status subresource as a controller or the kubelet does) for objects read back
through the adapter and the typed readers (`deploy.get`, `deploy.is_ready`,
`deploy_status.node_rows`).
"""

from __future__ import annotations

import inspect
import json
from typing import Any, get_args, get_origin, get_type_hints, is_typeddict

import pytest

from fsdpctl.cluster import deploy, deploy_status
from fsdpctl.job import kube_shapes
from kube_peer import Peer, schemas_dir
from test_aws_shapes import KINDS, conformance

CORE, APPS, META = (
    "io.k8s.api.core.v1.",
    "io.k8s.api.apps.v1.",
    "io.k8s.apimachinery.pkg.apis.meta.v1.",
)
BATCH = "io.k8s.api.batch.v1."
# each TypedDict: the API types it is a part of (a field must be in one of them, of the same kind)
MODEL = {
    kube_shapes.ObjectMeta: [META + "ObjectMeta"],
    kube_shapes.NodeSelectorRequirement: [CORE + "NodeSelectorRequirement"],
    kube_shapes.NodeSelectorTerm: [CORE + "NodeSelectorTerm"],
    kube_shapes.NodeSelector: [CORE + "NodeSelector"],
    kube_shapes.NodeAffinity: [CORE + "NodeAffinity"],
    kube_shapes.Affinity: [CORE + "Affinity"],
    kube_shapes.Toleration: [CORE + "Toleration"],
    kube_shapes.Container: [CORE + "Container"],
    kube_shapes.PodSpec: [CORE + "PodSpec"],
    kube_shapes.PodTemplateSpec: [CORE + "PodTemplateSpec"],
    kube_shapes.WorkloadCondition: [APPS + "DeploymentCondition", APPS + "DaemonSetCondition"],
    kube_shapes.WorkloadSpec: [APPS + "DeploymentSpec", APPS + "DaemonSetSpec"],
    kube_shapes.WorkloadStatus: [APPS + "DeploymentStatus", APPS + "DaemonSetStatus"],
    kube_shapes.Workload: [APPS + "Deployment", APPS + "DaemonSet"],
    kube_shapes.NodeStatus: [CORE + "NodeStatus"],
    kube_shapes.Node: [CORE + "Node"],
    kube_shapes.JobCondition: [BATCH + "JobCondition"],
    kube_shapes.JobStatus: [BATCH + "JobStatus"],
    kube_shapes.BatchJob: [BATCH + "Job"],
}


@pytest.fixture(scope="module")
def defs() -> dict[str, Any]:
    return json.loads((schemas_dir() / "_definitions.json").read_text())["$defs"]


def _types(prop: dict[str, Any], defs: dict[str, Any]) -> set[str]:
    """A property's JSON types (a $ref followed; a Quantity is a string or a number)."""
    if "$ref" in prop:
        target = defs[prop["$ref"].rsplit("/", 1)[1]]
        if "oneOf" in target:
            return {t for o in target["oneOf"] for t in _types(o, defs)}
        return {"object"} if "properties" in target else _types(target, defs)
    kinds = prop.get("type", [])
    return ({kinds} if isinstance(kinds, str) else set(kinds)) - {"null"}


def disagreements(
    hint: Any, props: list[dict[str, Any]], defs: dict[str, Any], where: str
) -> list[str]:
    """Where `hint` disagrees with the schema properties `props` (one per API type it stands for)."""
    if hint in KINDS:
        bad = [p for p in props if KINDS[hint] not in _types(p, defs)]
        return (
            [f"{where}: {hint.__name__}, the API's {sorted(_types(bad[0], defs))}"] if bad else []
        )
    if get_origin(hint) is list:
        if any("array" not in _types(p, defs) for p in props):
            return [f"{where}: a list, not the API's"]
        return disagreements(get_args(hint)[0], [p["items"] for p in props], defs, where + "[]")
    if get_origin(hint) is dict:
        if any("additionalProperties" not in p for p in props):
            return [f"{where}: a map, not the API's"]
        return disagreements(
            get_args(hint)[1], [p["additionalProperties"] for p in props], defs, where + "{}"
        )
    if is_typeddict(hint):
        if any("$ref" not in p for p in props):
            return [f"{where}: an object, not the API's"]
        return shape_disagreements(hint, [p["$ref"].rsplit("/", 1)[1] for p in props], defs, where)
    return [f"{where}: {hint} has no API kind"]


def shape_disagreements(td: Any, names: list[str], defs: dict[str, Any], where: str) -> list[str]:
    """Each field of `td` is a property of one of the API types `names`, of the same kind there;
    what `td` requires, the API requires too (an answer always has it)."""
    found = []
    types = [defs[n] for n in names]
    for field, hint in get_type_hints(td).items():
        props = [t["properties"][field] for t in types if field in t.get("properties", {})]
        if not props:
            found.append(f"{where}.{field}: in none of {names}")
        else:
            found += disagreements(hint, props, defs, f"{where}.{field}")
    for field in td.__required_keys__:
        if any(field not in t.get("required", []) for t in types):
            found.append(f"{where}.{field}: required here, optional in the API")
    return found


def test_every_shape_names_its_api_types():
    classes = {c for _, c in inspect.getmembers(kube_shapes, inspect.isclass) if is_typeddict(c)}
    assert classes == set(MODEL)


@pytest.mark.parametrize("td", list(MODEL), ids=lambda td: td.__name__)
def test_each_field_is_the_apis_field_of_the_same_kind(td, defs):
    """A misspelt or mistyped field (`allocateable`, replicas as str) fails here, not as a None read
    from every real object; nested types are compared through the API's own references."""
    assert shape_disagreements(td, MODEL[td], defs, td.__name__) == []


def test_the_check_catches_a_wrong_field(defs):
    from typing import TypedDict

    class Bad(TypedDict, total=False):
        allocateable: dict[str, str]
        capacity: list[str]

    found = shape_disagreements(Bad, [CORE + "NodeStatus"], defs, "Bad")
    assert [f.split(":")[0] for f in found] == ["Bad.allocateable", "Bad.capacity"]


def _workload(kind: str, name: str) -> dict[str, Any]:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": kind,
        "metadata": {"name": name, "namespace": "kube-system", "labels": labels},
        "spec": {
            **({"replicas": 2} if kind == "Deployment" else {}),
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{"name": name, "image": f"example/{name}:v1.2"}]},
            },
        },
    }


def test_objects_read_back_from_the_api_are_the_declared_shapes(tmp_path):
    """A Deployment, a DaemonSet and a GPU Node created in the API peer, their status written as
    their controllers and the kubelet write it, read back through the adapter: each conforms to
    its TypedDict, and the typed readers decide from them as from the fields they name."""
    from fsdpctl.adapters.kube import Kube

    peer = Peer(tmp_path)
    try:
        kube = Kube.connect(kubeconfig=str(peer.kubeconfig))
        dep, ds = _workload("Deployment", "ctl"), _workload("DaemonSet", "plugin")
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": "gpu-a", "labels": {"fsdpctl.io/role": "gpu"}},
            "status": {"allocatable": {"cpu": "191450m", "nvidia.com/gpu": "8"}},
        }
        for obj, status in (
            (
                dep,
                {"availableReplicas": 1, "conditions": [{"type": "Available", "status": "False"}]},
            ),
            (
                ds,
                {
                    "currentNumberScheduled": 1,
                    "numberMisscheduled": 0,
                    "desiredNumberScheduled": 1,
                    "numberReady": 1,
                },
            ),
            (node, node["status"]),
        ):
            kube.create(obj)
            meta = obj["metadata"]
            path = (
                f"/apis/apps/v1/namespaces/{meta['namespace']}/{obj['kind'].lower()}s/{meta['name']}/status"
                if obj["apiVersion"] == "apps/v1"
                else f"/api/v1/nodes/{meta['name']}/status"
            )
            kube.request("PUT", path, body={**obj, "status": status})
        ref = {"kind": "Deployment", "name": "ctl", "namespace": "kube-system"}
        got_dep = deploy.get(kube, ref)
        got_ds = deploy.get(kube, {**ref, "kind": "DaemonSet", "name": "plugin"})
        nodes = kube.list("v1", "Node")
    finally:
        peer.close()
    answers = [(got_dep, kube_shapes.Workload), (got_ds, kube_shapes.Workload)]
    answers += [(n, kube_shapes.Node) for n in nodes]
    assert [e for value, td in answers for e in conformance(value, td, td.__name__)] == []
    assert got_dep is not None and got_dep["status"]["availableReplicas"] == 1
    assert not deploy.is_ready(got_dep)  # 1 of 2 replicas available
    assert deploy.is_ready(got_ds)  # 1 of 1 scheduled is ready
    [row] = deploy_status.node_rows(nodes, efa=False)
    assert (row["object"], row["version"], row["ready"]) == ("Node/gpu-a", "nvidia.com/gpu=8", True)

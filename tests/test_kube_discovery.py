"""fsdpctl resolves every kind through the API's discovery (adapters/kube.py): plural, scope and
subresources come from the server, aggregated discovery where it is served and the plain documents
where not, read once per connection; a CRD fsdpctl applies resolves from its own spec until the
server lists it. Against the peer serving kube-apiserver's own discovery documents (kube_peer.py).
"""

from __future__ import annotations

import json
import re

import pytest

from conftest import SHARED
from fsdpctl.adapters.kube import Kube, KubeError
from kube_peer import DISCOVERY, Peer, documents

VENDOR = SHARED / "vendor"
PYTORCHJOB_CRD = VENDOR / "kubeflow-training-operator-v1.9.4" / "kubeflow.org_pytorchjobs.yaml"
DISCOVERY_PATH = re.compile(r"^/(api|apis)(/[^/]+){0,2}/?$")
# the kinds issue 18 named: cluster-scoped, which a hand-kept table had sent to namespaced paths
CLUSTER_SCOPED = (
    "CSIDriver",
    "CSINode",
    "PersistentVolume",
    "VolumeAttachment",
    "RuntimeClass",
    "IngressClass",
    "APIService",
)


@pytest.fixture(params=["aggregated", "plain"])
def peer(request, tmp_path):
    p = Peer(tmp_path, aggregated=request.param == "aggregated")
    yield p
    p.close()


def kube(peer) -> Kube:
    return Kube.connect(kubeconfig=str(peer.kubeconfig))


def discovery_reads(peer, since: int = 0) -> list[str]:
    return [q.url.path for q in peer.requests()[since:] if DISCOVERY_PATH.match(q.url.path)]


def vendored() -> list[tuple[str, dict]]:
    """(group version, APIResource) for every top-level resource in the vendored documents."""
    out = []
    for f in sorted(DISCOVERY.glob("api*__*.json")):
        doc = json.loads(f.read_text())
        out += [(doc["groupVersion"], r) for r in doc["resources"] if "/" not in r["name"]]
    return out


def test_every_kind_the_server_serves_resolves_to_its_plural_and_scope(peer):
    k = kube(peer)
    for gv, r in vendored():
        base = f"/api/{gv}" if "/" not in gv else f"/apis/{gv}"
        res = k.resource(gv, r["kind"])
        assert (res.plural, res.namespaced) == (r["name"], r["namespaced"]), (gv, r["kind"])
        where = f"/namespaces/team/{r['name']}" if r["namespaced"] else f"/{r['name']}"
        assert k.path(gv, r["kind"], "team", "x") == f"{base}{where}/x"
    scopes = {r["kind"]: r["namespaced"] for _, r in vendored()}
    assert not any(scopes[kind] for kind in CLUSTER_SCOPED)
    assert (
        "log" in k.resource("v1", "Pod").subresources
        and k.resource("apps/v1", "Deployment").namespaced
    )
    with pytest.raises(ValueError, match="namespaced"):
        k.path("v1", "ConfigMap", None, "x")  # a namespaced object needs its namespace


def test_discovery_is_read_once_per_connection(peer):
    k = kube(peer)
    for api, kind in [
        ("apps/v1", "Deployment"),
        ("v1", "Pod"),
        ("apps/v1", "DaemonSet"),
        ("storage.k8s.io/v1", "CSIDriver"),
    ]:
        k.resource(api, kind)
    k.resource("v1", "Secret")
    if peer.api.aggregated:  # two documents say everything
        assert discovery_reads(peer) == ["/apis", "/api"]
    else:  # the group list, then only the group versions needed
        assert discovery_reads(peer) == [
            "/apis",
            "/api",
            "/apis/apps/v1",
            "/api/v1",
            "/apis/storage.k8s.io/v1",
        ]
    accept = [q.headers.get("Accept", "") for q in peer.requests() if q.url.path == "/apis"][0]
    assert accept.startswith("application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList")
    before = len(peer.requests())
    kube(peer).resource("v1", "Pod")  # a new connection reads afresh
    assert discovery_reads(peer, before)


def test_a_crd_applied_resolves_from_its_own_spec(peer):
    k = kube(peer)
    k.resource(
        "apiextensions.k8s.io/v1", "CustomResourceDefinition"
    )  # discovery read before the CRD exists
    before = len(peer.requests())
    k.apply(documents(PYTORCHJOB_CRD)[0])
    res = k.resource("kubeflow.org/v1", "PyTorchJob")
    assert (res.plural, res.namespaced, res.subresources) == (
        "pytorchjobs",
        True,
        ("status", "scale"),
    )
    assert discovery_reads(peer, before) == []  # from the CRD, not by reading discovery again
    k.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team"}})
    job = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": "j", "namespace": "team"},
        "spec": {"pytorchReplicaSpecs": {}},
    }
    k.apply(job)
    assert peer.requests()[-1].url.path == "/apis/kubeflow.org/v1/namespaces/team/pytorchjobs/j"
    assert k.get("kubeflow.org/v1", "PyTorchJob", "j", "team")["metadata"]["name"] == "j"


def test_a_crd_someone_else_installs_is_found_by_reading_discovery_again(peer):
    k = kube(peer)
    k.resource("v1", "Pod")
    crd = documents(PYTORCHJOB_CRD)[0]
    crd["spec"]["scope"] = "Cluster"  # its scope comes from the server, whatever it is
    kube(peer).apply(crd)
    before = len(peer.requests())
    assert not k.resource("kubeflow.org/v1", "PyTorchJob").namespaced
    assert discovery_reads(peer, before)[:1] == ["/apis"]
    assert (
        k.path("kubeflow.org/v1", "PyTorchJob", "team", "j")
        == "/apis/kubeflow.org/v1/pytorchjobs/j"
    )


def test_a_kind_the_server_does_not_serve_is_the_apis_404(peer):
    k = kube(peer)
    with pytest.raises(KubeError) as e:
        k.list("kubeflow.org/v1", "PyTorchJob", "fsdp")
    assert (
        e.value.status == 404
        and "the server could not find the requested resource" in e.value.message
    )
    assert k.get("kubeflow.org/v1", "PyTorchJob", "j", "fsdp") is None
    assert k.delete("kubeflow.org/v1", "PyTorchJob", "j", "fsdp") is False
    assert (
        discovery_reads(peer).count("/apis") == 2
    )  # read once more for a kind it lacks, not on every call


def test_writes_ask_for_strict_field_validation(peer):
    k = kube(peer)
    k.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team"}})
    cm = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "c", "namespace": "team"},
        "dataa": {},
    }
    with pytest.raises(KubeError) as created:
        k.create(cm)
    assert created.value.status == 400 and 'unknown field "dataa"' in created.value.message
    with pytest.raises(KubeError) as applied:
        k.apply(cm)
    assert (
        applied.value.status == 500
        and ".dataa: field not declared in schema" in applied.value.message
    )
    assert all(
        q.params.get("fieldValidation") == "Strict"
        for q in peer.requests()
        if q.method.value in ("POST", "PATCH")
    )


def test_a_dry_run_cannot_check_what_its_own_namespace_or_crd_would_hold(peer):
    """kubernetes/kubernetes#83562: a server dry run creates nothing, so what lives in a namespace
    or is of a CRD the same dry run 'created' is refused by the server; fsdpctl lists it as
    unchecked instead."""
    k = kube(peer)
    k.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "new"}}, dry_run=True)
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "new"}}
    assert k.apply(cm, dry_run=True) == cm
    k.apply(documents(PYTORCHJOB_CRD)[0], dry_run=True)
    job = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": "j", "namespace": "default"},
    }
    k.apply(job, dry_run=True)
    assert k.unchecked == ["ConfigMap/c", "PyTorchJob/j"]
    with pytest.raises(KubeError) as e:  # a namespace nobody creates is the server's 404
        k.apply({**cm, "metadata": {"name": "c", "namespace": "absent"}}, dry_run=True)
    assert e.value.message == 'namespaces "absent" not found'
    assert "new" not in peer.api.namespaces and peer.objects("customresourcedefinitions") == []

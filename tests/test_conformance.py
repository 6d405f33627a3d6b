"""Everything fsdpctl creates on a cluster, sent through fsdpctl's own adapter to the peer that
answers as kube-apiserver (kube_peer.py): every `deploy` component (etcd, the operator as Training
Operator v1.9.4 and as Trainer v2.3.0, the NVIDIA and EFA device plugins, monitoring), the job of
both kinds with its namespace and etcd, its Secret and the checkpoint cleaner. Each object lands at
the path the server's discovery gives, in the scope the real server expects (the other scope's path
is a 404), passes strict field validation and is stored as sent, nothing pruned.

The expected paths are computed here, apart from the adapter: from kube-apiserver's discovery
documents (../shared/vendor/kubernetes-discovery) and from the CRDs in the pinned releases."""

from __future__ import annotations

import base64
import json

import pytest

from conftest import SHARED
from fsdpctl.adapters.kube import Kube, KubeError
from fsdpctl.cluster import deploy
from fsdpctl.job import render
from fsdpctl.settings import load
from kube_peer import DISCOVERY, Peer, documents

VENDOR = SHARED / "vendor"
FSX = VENDOR / "aws-fsx-csi-driver-chart-1.17.0"
TOKEN = "hf_ConformanceTokenAbCdEfGhIjKlMnOp"


def scopes() -> dict[tuple[str, str], tuple[str, bool]]:
    """(apiVersion, kind) -> (plural, namespaced): the server's documents, then the releases' CRDs."""
    out: dict[tuple[str, str], tuple[str, bool]] = {}
    for f in DISCOVERY.glob("api*__*.json"):
        doc = json.loads(f.read_text())
        out |= {
            (doc["groupVersion"], r["kind"]): (r["name"], r["namespaced"])
            for r in doc["resources"]
            if "/" not in r["name"]
        }
    for f in [
        *VENDOR.glob("kubeflow-training-operator-v1.9.4/*.yaml"),
        *VENDOR.glob("kubeflow-trainer-v2.3.0/*.yaml"),
    ]:
        for crd in documents(f):
            if crd["kind"] == "CustomResourceDefinition":
                spec = crd["spec"]
                for v in spec["versions"]:
                    out[(f"{spec['group']}/{v['name']}", spec["names"]["kind"])] = (
                        spec["names"]["plural"],
                        spec["scope"] == "Namespaced",
                    )
    return out


SCOPES = scopes()


def expected(obj: dict) -> tuple[str, str]:
    """(the object's path, the same name under the other scope)."""
    plural, namespaced = SCOPES[(obj["apiVersion"], obj["kind"])]
    base = (
        f"/api/{obj['apiVersion']}"
        if "/" not in obj["apiVersion"]
        else f"/apis/{obj['apiVersion']}"
    )
    name, ns = obj["metadata"]["name"], obj["metadata"].get("namespace") or "fsdp"
    scoped, cluster = f"{base}/namespaces/{ns}/{plural}/{name}", f"{base}/{plural}/{name}"
    return (scoped, cluster) if namespaced else (cluster, scoped)


@pytest.fixture
def peer(tmp_path):
    p = Peer(tmp_path)
    yield p
    p.close()


def land(peer, k: Kube, obj: dict, create: bool = False) -> None:
    """Sent as fsdpctl sends it (server-side apply; create for jobs and the cleaner): at the
    expected path, stored as sent, and not found under the other scope."""
    path, other = expected(obj)
    before = len(peer.requests())
    k.create(obj) if create else k.apply(obj)
    [sent] = [q for q in peer.requests()[before:] if q.method.value in ("POST", "PATCH")]
    assert sent.url.path == (path.rsplit("/", 1)[0] if create else path), obj["kind"]
    stored = k.request("GET", path)
    if "/namespaces/" not in path:  # the server drops a namespace given to a cluster-scoped object
        obj = {**obj, "metadata": {k: v for k, v in obj["metadata"].items() if k != "namespace"}}
    if obj["kind"] == "Secret" and "stringData" in obj:  # kept as base64 data, never as sent
        data = {k: base64.b64encode(v.encode()).decode() for k, v in obj["stringData"].items()}
        obj = {**{k: v for k, v in obj.items() if k != "stringData"}, "data": data}
    assert deploy.contains(stored, obj), (
        f"{obj['kind']}/{obj['metadata']['name']} changed on the way in"
    )
    with pytest.raises(KubeError) as wrong:
        k.request("GET", other)
    assert wrong.value.status == 404, other


FS_ID = "fs-0199e5a63bd90f796"  # upstream's static_provisioning_pv.yaml
# what adds objects: a hub model (the pre-step Job) and a file system (deploy storage: CSI driver,
# PV, claim)
EVERYTHING = {
    "PRETRAINED": "org/tiny-llama",
    "FSX_FILE_SYSTEM_ID": FS_ID,
    "FSX_DNS_NAME": f"{FS_ID}.fsx.us-west-2.amazonaws.com",
    "FSX_MOUNT_NAME": "abcdefgh",
}


def config(**more: str):
    settings = {"BACKEND": "eks", "CHECKPOINT_PVC": "fsx-claim", **EVERYTHING, **more}
    return load(flags=settings)


def test_everything_fsdpctl_creates_lands_where_discovery_says(peer):
    k = Kube.connect(kubeconfig=str(peer.kubeconfig))
    landed: set[tuple[str, str]] = set()
    for kind, rdzv in (("pytorchjob", "etcd-v2"), ("trainjob", "c10d")):
        cfg = config(JOB_KIND=kind, RDZV_BACKEND=rdzv)
        for comp in deploy.components(cfg, "all" if kind == "pytorchjob" else "operator", [VENDOR]):
            for obj in comp.objects:
                land(peer, k, obj)
                landed.add((obj["apiVersion"], obj["kind"]))
        *infra, job = render.render_job(cfg, "fsdp-run-1")
        for obj in [*infra, render.render_secret(cfg, TOKEN, "fsdp-run-1")]:
            land(peer, k, obj)
        land(peer, k, job, create=True)
        landed |= {(o["apiVersion"], o["kind"]) for o in [*infra, job]}
    land(peer, k, render.render_checkpoint_cleaner(config(), "fsdp"), create=True)
    assert {
        ("kubeflow.org/v1", "PyTorchJob"),
        ("trainer.kubeflow.org/v1alpha1", "TrainJob"),
        ("v1", "Namespace"),
    } <= landed
    assert (
        "trainer.kubeflow.org/v1alpha1",
        "ClusterTrainingRuntime",
    ) in landed  # cluster-scoped custom kind
    assert {
        ("batch/v1", "Job"),
        ("v1", "PersistentVolume"),
        ("storage.k8s.io/v1", "CSIDriver"),
    } <= landed
    assert ("admissionregistration.k8s.io/v1", "ValidatingWebhookConfiguration") in landed
    for ds in deploy.plugins(config(), [VENDOR]).objects:  # part of "all", under eksctl's names
        assert k.get("apps/v1", "DaemonSet", ds["metadata"]["name"], "kube-system") is not None
    cluster = {kind for (api, kind) in landed if not SCOPES[(api, kind)][1]}
    assert {"Namespace", "CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding"} <= cluster


@pytest.mark.parametrize(
    "manifest, kind",
    [
        ("base/csidriver.yaml", "CSIDriver"),
        ("examples/static_provisioning_pv.yaml", "PersistentVolume"),
    ],
)
def test_a_cluster_scoped_kind_lives_at_its_cluster_path_and_nowhere_else(peer, manifest, kind):
    """The FSx CSI driver's own CSIDriver and PersistentVolume (aws-fsx-csi-driver 1.17.0): a
    hand-kept table sent them to a namespaced path, which the real server answers with 404."""
    [obj] = documents(FSX / manifest)
    assert obj["kind"] == kind
    k = Kube.connect(kubeconfig=str(peer.kubeconfig))
    k.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "fsdp"}})
    land(
        peer, k, {**obj, "metadata": {**obj["metadata"], "namespace": "fsdp"}}
    )  # a namespace is ignored
    path, namespaced = expected(obj)
    assert "/namespaces/" not in path and "/namespaces/fsdp/" in namespaced
    for method, url, content in [
        ("GET", namespaced, "application/json"),
        ("PATCH", namespaced, "application/apply-patch+yaml"),
        ("POST", namespaced.rsplit("/", 1)[0], "application/json"),
    ]:
        with pytest.raises(KubeError) as refused:
            k.request(method, url, body=obj, content_type=content, query={"fieldManager": "t"})
        assert (refused.value.status, refused.value.message) == (
            404,
            "the server could not find the requested resource",
        )
    assert [o["metadata"]["name"] for o in peer.objects(path.split("/")[-2])] == [
        obj["metadata"]["name"]
    ]


def test_a_namespaced_claim_is_refused_at_the_cluster_path(peer):
    """The reverse: FSx's PersistentVolumeClaim lives in a namespace; named at the cluster path it
    is a 404, created there a 405."""
    [claim] = documents(FSX / "examples/static_provisioning_claim.yaml")
    k = Kube.connect(kubeconfig=str(peer.kubeconfig))
    k.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "fsdp"}})
    land(peer, k, {**claim, "metadata": {**claim["metadata"], "namespace": "fsdp"}})
    with pytest.raises(KubeError) as refused:
        k.request("POST", "/api/v1/persistentvolumeclaims", body=claim)
    assert refused.value.status == 405

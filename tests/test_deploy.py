"""fsdpctl.cluster.deploy apart from the cluster (the cluster side is in test_kube.py): the diff that
makes a rerun a no-op, the probes `deploy status` reads, and `fetch` filling the release cache from
a real HTTP server on 127.0.0.1 (each file's sha256 checked before it replaces anything)."""

from __future__ import annotations

import hashlib
import http.server
import re
import threading
import urllib.parse

import pytest

from conftest import SHARED
from fsdpctl.adapters.download import DownloadError
from fsdpctl.cluster import deploy, deploy_status
from fsdpctl.errors import FsdpctlError
from fsdpctl.settings import load


def test_contains_ignores_what_the_server_adds_and_nothing_else():
    want = {"metadata": {"name": "etcd", "labels": {"a": "1"}}, "spec": {"ports": [{"port": 2379}]}}
    have = {
        "metadata": {"name": "etcd", "labels": {"a": "1"}, "uid": "u-1", "resourceVersion": "7"},
        "spec": {"ports": [{"port": 2379, "protocol": "TCP"}], "clusterIP": "10.0.0.1"},
        "status": {},
    }
    assert deploy.contains(have, want)
    assert not deploy.contains({**have, "metadata": {"name": "etcd", "labels": {"a": "2"}}}, want)
    two_ports = {**have, "spec": {"ports": [{"port": 2379}, {"port": 2380}]}}
    assert not deploy.contains(two_ports, want)  # a list is compared whole, not as a subset
    assert not deploy.contains({"metadata": {"name": "etcd"}}, want)
    assert deploy.contains(3, 3) and not deploy.contains("3", 3)


def test_summary_names_only_what_happened():
    assert (
        deploy.summary({"created": 2, "configured": 0, "unchanged": 12})
        == "2 created, 12 unchanged"
    )


def test_status_probes_follow_the_job_kind_and_namespaces():
    v1 = deploy_status.installed_probes(
        load(dotenv={"JOB_NAMESPACE": "team-a", "MONITORING_NAMESPACE": "mon"})
    )
    assert v1[0] == {
        "component": "etcd",
        "kind": "Deployment",
        "namespace": "team-a",
        "name": "etcd",
    }
    assert {
        "component": "operator",
        "kind": "Deployment",
        "namespace": "kubeflow",
        "name": "training-operator",
    } in v1
    assert {(p["name"], p["namespace"]) for p in v1 if p["component"] == "monitoring"} == {
        ("prometheus", "mon"),
        ("grafana", "mon"),
        ("dcgm-exporter", "mon"),
    }
    v2 = deploy_status.installed_probes(load(dotenv={"JOB_KIND": "trainjob"}))
    assert [p["name"] for p in v2 if p["component"] == "operator"] == [
        "kubeflow-trainer-controller-manager"
    ]
    assert [(p["name"], p["namespace"]) for p in v2 if p["component"] == "plugins"] == [
        ("nvidia-device-plugin-daemonset", "kube-system"),
        ("aws-efa-k8s-device-plugin", "kube-system"),
    ]
    assert [(p["kind"], p["name"]) for p in v2 if p["component"] == "storage"] == [
        ("Deployment", "fsx-csi-controller"),
        ("DaemonSet", "fsx-csi-node"),
    ]


def test_plugins_are_eksctls_manifests_finished_as_eksctl_does_plus_the_gpu_toleration():
    """eksctl v0.230.0 pkg/addons/assets/efa-device-plugin.yaml names its image
    "%s.dkr.ecr.%s.%s/..." (eksctl fills in the EKS image account, the region and the DNS suffix);
    fsdpctl does the same and adds the GPU taint's toleration that EFADevicePlugin.SetTolerations
    (pkg/addons/device_plugin.go) leaves out."""
    cfg = load(dotenv={"AWS_REGION": "eu-west-1"})
    objs = {o["metadata"]["name"]: o for o in deploy.plugins(cfg, [SHARED / "vendor"]).objects}
    efa = objs["aws-efa-k8s-device-plugin"]["spec"]["template"]["spec"]
    assert efa["containers"][0]["image"] == (
        "602401143452.dkr.ecr.eu-west-1.amazonaws.com/eks/aws-efa-k8s-device-plugin:v0.5.4"
    )
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in efa[
        "tolerations"
    ]
    assert efa["tolerations"][:2] == [  # eksctl's own stay
        {"key": "CriticalAddonsOnly", "operator": "Exists"},
        {"key": "aws.amazon.com/efa", "operator": "Exists", "effect": "NoSchedule"},
    ]
    assert "eks.amazonaws.com/compute-type" in str(efa["affinity"])  # eksctl's affinity kept
    nvidia = objs["nvidia-device-plugin-daemonset"]["spec"]["template"]["spec"]
    assert (
        nvidia["containers"][0]["image"] == "nvcr.io/nvidia/k8s-device-plugin:v0.19.3"
    )  # the tag's file
    assert nvidia["affinity"] == deploy.gpu_node_affinity()  # eksctl's has none: GPU nodes only
    assert (
        deploy.eks_image_registry("cn-north-1")
        == "918309763551.dkr.ecr.cn-north-1.amazonaws.com.cn"
    )


VERSION = re.compile(r"v?(\d+\.\d+\.\d+)")


def _sums() -> dict[str, str]:
    lines = (SHARED / "vendor/SHA256SUMS").read_text().splitlines()
    return {
        path.removeprefix("./"): digest for digest, path in (line.split() for line in lines if line)
    }


@pytest.mark.parametrize(
    "pinned",
    [f for rel in deploy.releases().values() for f in rel["files"]],
    ids=lambda f: f["path"],
)
def test_every_pin_is_what_its_url_serves_at_its_tag(pinned):
    """Issue 27, defect 5. A pin names a file by URL and sha256; fsdpctl downloads the URL and
    refuses any other bytes, so the pin must be the sha256 of what that URL serves. The vendored
    copy in ../shared/vendor is the upstream tag's own file (eksctl-io/eksctl tag v0.230.0 = commit
    5e725db6f743, pkg/addons/assets/nvidia-device-plugin.yaml: NVIDIA device plugin v0.19.3, sha256
    3b298ec5...; the pin 325835e0... was a later untagged commit's v0.20.0 file, which a download
    from the tag's URL never matches). For every pinned file: its sha256 is the vendored copy's
    (SHA256SUMS), the URL's file name is the vendored file's, and the URL's ref is the tag the
    vendored folder is named after (kubeflow/trainer v2.3.0, eksctl v0.230.0, aws-fsx-csi-driver
    helm-chart-...-1.17.0). Kustomize-rendered files (no URL) are held to their vendored sha256
    alone."""
    sums = _sums()
    assert sums[pinned["path"]] == pinned["sha256"], "the pin is not the vendored upstream file"
    assert (
        hashlib.sha256((SHARED / "vendor" / pinned["path"]).read_bytes()).hexdigest()
        == pinned["sha256"]
    )
    if not pinned["url"]:
        return
    url = urllib.parse.urlsplit(pinned["url"])
    assert url.scheme == "https" and url.netloc == "raw.githubusercontent.com", pinned["url"]
    _owner, _repo, ref, *path = url.path.lstrip("/").split("/")
    assert path[-1] == pinned["path"].rsplit("/", 1)[1], (
        "the URL names another file than the vendored one"
    )
    folder = pinned["path"].split("/", 1)[0]
    assert VERSION.search(ref) and VERSION.search(folder), (ref, folder)
    assert VERSION.search(ref).group(1) == VERSION.search(folder).group(1), (
        f"the URL's ref {ref} is not the tag of the vendored copy {folder}"
    )
    assert ref not in ("main", "master"), "a branch serves whatever it holds today: pin a tag"


@pytest.fixture
def upstream(tmp_path):
    """A real HTTP server on 127.0.0.1 serving tmp_path/www."""
    www = tmp_path / "www"
    www.mkdir()

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *a, **kw):
            super().__init__(*a, directory=str(www), **kw)

        def log_message(self, *a):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield www, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_fetch_caches_verified_files_and_names_the_unpublished(upstream, tmp_path, monkeypatch):
    www, url = upstream
    (www / "crd.yaml").write_text("kind: CustomResourceDefinition\n")
    pin = hashlib.sha256(b"kind: CustomResourceDefinition\n").hexdigest()
    files = [
        {"path": "rel/crd.yaml", "sha256": pin, "url": f"{url}/crd.yaml"},
        {"path": "rel/rendered.yaml", "sha256": "0" * 64, "url": ""},
    ]
    monkeypatch.setattr(deploy, "releases", lambda: {"trainjob": {"files": files}})
    cache, said = tmp_path / "cache", []
    deploy.fetch(cache, lambda path, outcome: said.append((path, outcome)))
    assert said == [("rel/crd.yaml", deploy.FETCHED), ("rel/rendered.yaml", deploy.UNPUBLISHED)]
    assert (cache / "rel/crd.yaml").read_text() == "kind: CustomResourceDefinition\n"
    said.clear()
    deploy.fetch(cache, lambda path, outcome: said.append((path, outcome)))
    assert said[0] == ("rel/crd.yaml", deploy.CACHED)


def test_fetch_refuses_a_file_that_differs_from_its_pin_and_keeps_nothing(
    upstream, tmp_path, monkeypatch
):
    www, url = upstream
    (www / "crd.yaml").write_text("tampered\n")
    files = [{"path": "rel/crd.yaml", "sha256": "f" * 64, "url": f"{url}/crd.yaml"}]
    monkeypatch.setattr(deploy, "releases", lambda: {"pytorchjob": {"files": files}})
    with pytest.raises(FsdpctlError, match="does not match the pinned sha256"):
        deploy.fetch(tmp_path / "cache", lambda *_: None)
    assert list((tmp_path / "cache").rglob("*")) == [tmp_path / "cache" / "rel"]
    files[0]["url"] = f"{url}/missing.yaml"
    with pytest.raises(
        DownloadError, match=f"cannot download {url}/missing.yaml: HTTP 404 File not found"
    ):
        deploy.fetch(tmp_path / "cache", lambda *_: None)

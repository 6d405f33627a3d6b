"""`fsdpctl deploy storage` (issue 14, shared storage): the FSx for Lustre CSI driver as
kubernetes-sigs/aws-fsx-csi-driver ships it (../shared/vendor/aws-fsx-csi-driver-chart-1.17.0,
driver v1.9.0: the kustomize base deploy/kubernetes/base/ and
examples/kubernetes/static_provisioning/), pinned by sha256, and the static PersistentVolume of the
settings' file system with the SHARED_VOLUME claim bound to it; checked against the Kubernetes 1.33
OpenAPI, the scheduler's rules (test_scheduling) and kube-apiserver's discovery (test_conformance).
"""

from __future__ import annotations

import shutil

import pytest
import yaml

from conftest import SHARED
from fsdpctl.cluster import deploy
from fsdpctl.errors import FsdpctlError, SettingsError
from fsdpctl.job import render
from fsdpctl.job.validate import validate
from fsdpctl.settings import load

FSX = SHARED / "vendor" / "aws-fsx-csi-driver-chart-1.17.0"
FS_ID = "fs-0199e5a63bd90f796"  # the id of upstream's static_provisioning_pv.yaml
FS = {
    "FSX_FILE_SYSTEM_ID": FS_ID,
    "FSX_DNS_NAME": f"{FS_ID}.fsx.us-west-2.amazonaws.com",
    "FSX_MOUNT_NAME": "abcdefgh",
}


def cfg(**more: str):
    return load(flags={"BACKEND": "eks", **more})


def upstream(name: str) -> list[dict]:
    return [o for o in yaml.safe_load_all((FSX / name).read_text()) if o]


def test_the_driver_is_the_pinned_kustomize_base_in_its_namespace():
    """Every file of upstream's base/kustomization.yaml `resources`, in its order, pinned by the
    sha256 the vendor's SHA256SUMS gives; every namespaced object (and each ServiceAccount subject)
    put in the kustomization's `namespace`, as kustomize does; the cluster-scoped ones left without
    one."""
    kustomization = yaml.safe_load((FSX / "base/kustomization.yaml").read_text())
    rel = deploy.releases()[deploy.FSX]
    assert [e["path"].rsplit("/", 1)[1] for e in rel["files"]] == kustomization["resources"]
    sums = dict(
        reversed(line.split())
        for line in (SHARED / "vendor/SHA256SUMS").read_text().splitlines()
        if line
    )
    assert all(sums[f"./{e['path']}"] == e["sha256"] for e in rel["files"])
    assert rel["namespace"] == kustomization["namespace"] == "kube-system"
    comp = deploy.storage(cfg(), [SHARED / "vendor"])
    shipped = [o for f in kustomization["resources"] for o in upstream(f"base/{f}")]
    assert [(o["kind"], o["metadata"]["name"]) for o in comp.objects] == [
        (o["kind"], o["metadata"]["name"]) for o in shipped
    ]  # no FSX_FILE_SYSTEM_ID: the driver only
    for obj in comp.objects:
        scoped = obj["kind"] in {"CSIDriver", "ClusterRole", "ClusterRoleBinding"}
        assert obj["metadata"].get("namespace") == (None if scoped else "kube-system"), obj["kind"]
        assert all(s.get("namespace") == "kube-system" for s in obj.get("subjects", []))
    [node] = [o for o in comp.objects if o["kind"] == "DaemonSet"]
    images = {c["image"] for c in node["spec"]["template"]["spec"]["containers"]}
    assert "public.ecr.aws/fsx-csi-driver/aws-fsx-csi-driver:v1.9.0" in images
    assert (
        "terminationGracePeriodSeconds" not in node["spec"]["template"]["spec"]
    )  # the chart's null
    assert comp.ready == [
        {"kind": "Deployment", "namespace": "kube-system", "name": "fsx-csi-controller"},
        {"kind": "DaemonSet", "namespace": "kube-system", "name": "fsx-csi-node"},
    ]


def test_a_changed_driver_file_is_refused(tmp_path):
    """The pin holds: a mirror whose node DaemonSet differs from upstream's by one byte is refused."""
    mirror = tmp_path / "mirror"
    shutil.copytree(FSX, mirror / FSX.name)
    changed = mirror / FSX.name / "base/node-daemonset.yaml"
    changed.write_text(changed.read_text() + "\n")
    with pytest.raises(FsdpctlError, match="does not match its pinned sha256"):
        deploy.storage(cfg(), [mirror])


def test_the_static_volume_is_upstreams_example_bound_to_the_jobs_claim():
    """With FSX_FILE_SYSTEM_ID: upstream's examples/static_provisioning_pv.yaml and _claim.yaml with
    the settings' file system, size and names; the claim is SHARED_VOLUME in JOB_NAMESPACE (the one
    the job's pods mount), bound both ways (PV claimRef, claim volumeName)."""
    c = cfg(**FS, FSX_STORAGE_GIB="2400", SHARED_VOLUME="team-fsx", JOB_NAMESPACE="team-a")
    objs = deploy.storage(c, [SHARED / "vendor"]).objects
    [pv] = [o for o in objs if o["kind"] == "PersistentVolume"]
    [pvc] = [o for o in objs if o["kind"] == "PersistentVolumeClaim"]
    assert [o["metadata"]["name"] for o in objs if o["kind"] == "Namespace"] == ["team-a"]
    [up_pv], [up_pvc] = (
        upstream("examples/static_provisioning_pv.yaml"),
        upstream("examples/static_provisioning_claim.yaml"),
    )
    assert pv["spec"]["csi"] == {
        **up_pv["spec"]["csi"],
        "volumeAttributes": {"dnsname": FS["FSX_DNS_NAME"], "mountname": "abcdefgh"},
    }
    assert pv["spec"]["capacity"] == pvc["spec"]["resources"]["requests"] == {"storage": "2400Gi"}
    for key in ("volumeMode", "accessModes", "mountOptions", "persistentVolumeReclaimPolicy"):
        assert pv["spec"][key] == up_pv["spec"][key], key
    assert pvc["spec"]["accessModes"] == up_pvc["spec"]["accessModes"] == ["ReadWriteMany"]
    assert pvc["spec"]["storageClassName"] == up_pvc["spec"]["storageClassName"] == ""
    assert pvc["metadata"] == {"name": "team-fsx", "namespace": "team-a"}
    assert pv["spec"]["claimRef"] == {"namespace": "team-a", "name": "team-fsx"}
    assert pvc["spec"]["volumeName"] == pv["metadata"]["name"]
    job = render.render_job(c, "fsdp-run-1")[-1]
    pod = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
    claims = {
        v["persistentVolumeClaim"]["claimName"]
        for v in pod["volumes"]
        if "persistentVolumeClaim" in v
    }
    assert "team-fsx" in claims


def test_everything_deploy_storage_applies_validates():
    """Against the Kubernetes 1.33 OpenAPI (kubernetes-validate), strict: the driver's objects and
    the PV, claim and namespace."""
    objs = deploy.storage(cfg(**FS), [SHARED / "vendor"]).objects
    assert {"PersistentVolume", "PersistentVolumeClaim", "CSIDriver"} <= {o["kind"] for o in objs}
    assert validate(objs, {}) == []


def test_a_file_system_without_its_names_is_refused():
    """The PV mounts by DNS name and mount name (upstream's static example needs both) into a claim."""
    with pytest.raises(SettingsError, match="FSX_DNS_NAME, FSX_MOUNT_NAME"):
        cfg(FSX_FILE_SYSTEM_ID=FS_ID)
    with pytest.raises(SettingsError, match="SHARED_VOLUME"):
        cfg(**FS, SHARED_VOLUME="", JOB_NODES="1")
    with pytest.raises(SettingsError):
        cfg(FSX_FILE_SYSTEM_ID="fsx-claim")


@pytest.mark.parametrize("tool", ["eksctl", "terraform"])
@pytest.mark.parametrize("instance", ["p4de.24xlarge", "p5.48xlarge", "p5e.48xlarge"])
def test_the_fsx_node_plugin_lands_on_the_gpu_nodes(tool, instance):
    """The node DaemonSet mounts Lustre for the job's pods, so it must run on the tainted GPU nodes
    of both renders: upstream's `tolerations: [{operator: Exists}]` and its not-Fargate affinity, by
    the scheduler's rules as test_scheduling implements them; the nodes also carry
    `kubernetes.io/os: linux`, which the kubelet sets on every Linux node (its well-known labels)
    and upstream's nodeSelector asks for."""
    from test_scheduling import cluster_nodes, lands

    gpu, system = cluster_nodes(tool, instance)
    for node in (gpu, system):
        assert not lands(upstream("base/node-daemonset.yaml")[0]["spec"]["template"]["spec"], node)
        node["labels"]["kubernetes.io/os"] = "linux"
    [node] = [
        o for o in deploy.storage(cfg(), [SHARED / "vendor"]).objects if o["kind"] == "DaemonSet"
    ]
    assert lands(node["spec"]["template"]["spec"], gpu)
    assert lands(node["spec"]["template"]["spec"], system)


def test_storage_lands_where_discovery_says(tmp_path):
    """Through fsdpctl's adapter to the kube-apiserver peer: the PersistentVolume and CSIDriver at
    their cluster paths (a namespaced path is a 404), the claim in the job namespace, every object
    stored as sent; a second apply changes nothing."""
    from fsdpctl.adapters.kube import Kube
    from kube_peer import Peer
    from test_conformance import land

    peer = Peer(tmp_path)
    try:
        k = Kube.connect(kubeconfig=str(peer.kubeconfig))
        comp = deploy.storage(cfg(**FS), [SHARED / "vendor"])
        for obj in comp.objects:
            land(peer, k, obj)
        assert k.request("GET", f"/api/v1/persistentvolumes/fsx-claim-{FS_ID}")["spec"]["csi"][
            "driver"
        ] == ("fsx.csi.aws.com")
        assert deploy.apply(k, comp)["unchanged"] == len(comp.objects)
    finally:
        peer.close()


def test_deploy_storage_dry_run_prints_the_objects(cli, monkeypatch):
    """`fsdpctl deploy storage --dry-run --from <mirror>` prints the driver, the PV and the claim,
    sends nothing."""
    for key, value in {"BACKEND": "eks", **FS}.items():
        monkeypatch.setenv(f"FSDPCTL_{key}", value)
    result = cli("deploy", "storage", "--dry-run", "--from", str(SHARED / "vendor"))
    assert result.exit_code == 0, result.output
    kinds = [o["kind"] for o in yaml.safe_load_all(result.stdout) if o]
    assert kinds[0] == "CSIDriver" and kinds[-2:] == ["PersistentVolume", "PersistentVolumeClaim"]

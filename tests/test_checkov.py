"""checkov (offline, --skip-download) over terraform/, docker/ and rendered manifests. Peer: the
real checkov 3.3 in its own virtual environment (`make test` makes .venv-checkov; its pins clash
with boto3's), skipped with the reason when absent.

Offline, checkov reports no severities, so every finding is treated as one to explain: the findings
must equal ACCEPTED exactly. A new finding fails this test until it is fixed or explained here; a
fixed one must leave the list. False positives are suppressed where they stand (`checkov:skip`
comments saying why)."""

from __future__ import annotations

import fnmatch
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import ROOT
from fsdpctl.cluster import deploy
from fsdpctl.job import render
from fsdpctl.settings import load

ACCEPTED = {
    # terraform/: defaults a user changes with a variable, kept because fsdpctl must work from a
    # laptop
    (
        "CKV_AWS_39",
        "aws_eks_cluster.this",
    ): "public API endpoint: fsdpctl runs from outside the VPC; "
    "endpoint_public_access=false keeps it private",
    (
        "CKV_AWS_38",
        "aws_eks_cluster.this",
    ): "0.0.0.0/0 by default; narrow public_access_cidrs to your egress",
    (
        "CKV2_AWS_11",
        "aws_vpc.this",
    ): "no VPC flow logs: at EFA rates they cost more than they tell; "
    "organisations that need them log at the account level",
    # etcd Deployment
    (
        "CKV_K8S_43",
        "Deployment.etcd",
    ): "pinned by version tag (v3.5.21); the digest differs per mirror",
    ("CKV_K8S_15", "Deployment.etcd"): "IfNotPresent with a pinned tag: Always only adds pulls",
    # the trainer pods (PyTorchJob replica templates, scanned as Pods: checkov skips custom
    # resources)
    (
        "CKV_K8S_43",
        "Pod.fsdp-worker*",
    ): "IMAGE_TAG is a pinned version ('latest' is refused by the settings)",
    (
        "CKV_K8S_15",
        "Pod.fsdp-worker*",
    ): "IfNotPresent: 16 nodes pulling a 20 GB image again on every restart",
    (
        "CKV_K8S_8",
        "Pod.fsdp-worker*",
    ): "no liveness probe: a training step can take minutes; hung jobs are "
    "found by `job status` (no step for HUNG_AFTER seconds)",
    ("CKV_K8S_9", "Pod.fsdp-worker*"): "no readiness probe: workers serve no traffic",
    (
        "CKV_K8S_22",
        "Pod.fsdp-worker*",
    ): "writable root: torch, NCCL and the HF cache write under $HOME and /tmp",
    (
        "CKV_K8S_40",
        "Pod.fsdp-worker*",
    ): "uid 1000, the image's user, so PVC files stay readable by it",
    (
        "CKV2_K8S_6",
        "Pod.fsdp-worker*",
    ): "no NetworkPolicy: NCCL opens ephemeral ports between every pair of "
    "workers; the namespace is the job's own",
    (
        "CKV_K8S_11",
        "Pod.fsdp-worker*",
    ): "CPU requested, not limited: CFS throttling of data loaders stalls GPUs",
    # EFA pods only: registering memory with the EFA device needs CAP_IPC_LOCK, which only root
    # receives
    ("CKV_K8S_23", "Pod.fsdp-worker-efa"): "root for CAP_IPC_LOCK (EFA)",
    ("CKV_K8S_37", "Pod.fsdp-worker-efa"): "adds IPC_LOCK (EFA); nothing else",
    ("CKV_K8S_25", "Pod.fsdp-worker-efa"): "adds IPC_LOCK (EFA); nothing else",
    ("CKV_K8S_20", "Pod.fsdp-worker-efa"): "root with IPC_LOCK (EFA)",
    (
        "CKV_K8S_28",
        "Pod.fsdp-worker-efa",
    ): "root with IPC_LOCK (EFA); NET_RAW is not dropped by runtime default",
    # monitoring (fsdpctl deploy monitoring) and the checkpoint cleaner (cleanup --checkpoints)
    ("CKV_K8S_43", "*"): "images pinned by version tag; the digest differs per mirror",
    ("CKV_K8S_15", "*"): "IfNotPresent with a pinned tag: Always only adds pulls",
    (
        "CKV_K8S_38",
        "Deployment.prometheus",
    ): "Prometheus discovers pods and endpoints through the API: it needs its token (read-only ClusterRole)",
    (
        "CKV_K8S_23",
        "DaemonSet.dcgm-exporter",
    ): "DCGM reads every GPU on the node: root, as NVIDIA ships it",
    ("CKV_K8S_40", "DaemonSet.dcgm-exporter"): "root, as above",
    (
        "CKV_K8S_25",
        "DaemonSet.dcgm-exporter",
    ): "adds SYS_ADMIN, which DCGM's profiling metrics need; drops the rest",
    (
        "CKV_K8S_39",
        "DaemonSet.dcgm-exporter",
    ): "SYS_ADMIN for DCGM profiling metrics (SM occupancy, tensor activity)",
    (
        "CKV_K8S_22",
        "DaemonSet.*",
    ): "dcgm-exporter writes its DCGM state",
    ("CKV_K8S_17", "DaemonSet.*top"): "hostPID is the point of htop/nvtop: the node's processes",
    (
        "CKV_K8S_40",
        "DaemonSet.*top",
    ): "uid 1000, the trainer image's user (it ships htop and nvtop)",
    ("CKV_K8S_8", "DaemonSet.*top"): "an idle shell for kubectl exec: nothing to probe",
    ("CKV_K8S_9", "DaemonSet.*top"): "serves no traffic",
    # the pre-step (a batch Job): its volume-prep makes the job's directories on the claims, then
    # the download
    (
        "CKV2_K8S_6",
        "Pod.fsdp-fetch",
    ): "no NetworkPolicy: the download reaches the hub (or HF_ENDPOINT); the "
    "namespace is the job's own",
    (
        "CKV_K8S_22",
        "Job.fsdp-fetch",
    ): "writable root for the download: huggingface_hub keeps its locks and temp "
    "files under HOME too; volume-prep's root is read-only",
    (
        "CKV_K8S_25",
        "Job.fsdp-fetch",
    ): "volume-prep adds CHOWN, FOWNER and DAC_OVERRIDE (all else dropped): a new "
    "FSx file system's root is root's, 0755, and the kubelet applies no fsGroup to it",
    (
        "CKV_K8S_40",
        "Job.fsdp-fetch",
    ): "uid 1000, the image's user, which the job's directories are made for",
    (
        "CKV_K8S_23",
        "Pod.fsdpctl-clean-*",
    ): "root with DAC_OVERRIDE and FOWNER only: EFA trainers write as root",
    (
        "CKV_K8S_25",
        "Pod.fsdpctl-clean-*",
    ): "adds DAC_OVERRIDE and FOWNER (all else dropped), as above",
    ("CKV_K8S_8", "Pod.fsdpctl-clean-*"): "a one-shot rm: nothing to probe",
    ("CKV_K8S_9", "Pod.fsdpctl-clean-*"): "serves no traffic",
    ("CKV_K8S_40", "Pod.fsdpctl-clean-*"): "root, as above",
}


def _checkov() -> str | None:
    for candidate in (
        os.environ.get("FSDPCTL_CHECKOV"),
        shutil.which("checkov"),
        str(ROOT / ".venv-checkov" / "bin" / "checkov"),
    ):
        if candidate and Path(candidate).is_file():
            return candidate
    return None


def _write_manifests(out: Path) -> None:
    """The objects `fsdpctl manifest` renders for three set-ups, plus each PyTorchJob's pod template
    as a Pod; what `deploy monitoring` applies and the pod `cleanup --checkpoints` starts."""
    setups = {
        "fsdp-worker-efa": {"BACKEND": "eks", "RDZV_BACKEND": "etcd"},
        "fsdp-worker": {"BACKEND": "eks", "EFA_ENABLED": "false", "INSTANCE_TYPE": "p4de.24xlarge"},
        "local": {},
    }
    for name, flags in setups.items():
        objs = render.render_job(load(flags=flags), "run-1")
        for obj in objs:
            if obj["kind"] == "PyTorchJob" and name != "local":
                template = obj["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]
                objs.append(
                    {
                        "apiVersion": "v1",
                        "kind": "Pod",
                        "spec": template["spec"],
                        "metadata": {**template["metadata"], "name": name, "namespace": "fsdp"},
                    }
                )
        (out / f"{name}.yaml").write_text(render.to_yaml(objs))
    cfg = load(flags={"BACKEND": "eks", "CHECKPOINT_PVC": "fsx"})
    extra = deploy.monitoring(cfg).objects + [render.render_checkpoint_cleaner(cfg, "fsdp")]
    # a directory of its own: checkov matches NetworkPolicies to pods across namespaces within one
    # directory
    (out.parent / "deploy").mkdir()
    (out.parent / "deploy" / "deploy.yaml").write_text(render.to_yaml(extra))


def _findings(report: list[dict]) -> tuple[set[tuple[str, str]], dict[str, tuple[int, int]]]:
    found, summary = set(), {}
    for block in report:
        summary[block["check_type"]] = (block["summary"]["passed"], block["summary"]["failed"])
        for f in block["results"]["failed_checks"]:
            parts = f["resource"].split(".")
            # terraform: module.eks_gpu.TYPE.NAME; kubernetes: KIND.NAMESPACE.NAME[.labels...]
            resource = (
                ".".join(parts[-2:])
                if f["resource"].startswith("module.")
                else f"{parts[0]}.{parts[2]}"
            )
            found.add((f["check_id"], resource))
    return found, summary


@pytest.mark.slow
@pytest.mark.skipif(
    _checkov() is None, reason="checkov not found (make test creates .venv-checkov)"
)
def test_checkov_findings_are_all_fixed_or_explained(tmp_path):
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    _write_manifests(manifests)
    r = subprocess.run(
        [
            _checkov(),
            "--skip-download",
            "--quiet",
            "--compact",
            "-o",
            "json",
            "--framework",
            "terraform",
            "dockerfile",
            "kubernetes",
            "-d",
            str(ROOT / "terraform"),
            "-d",
            str(ROOT / "docker"),
            "-d",
            str(manifests),
            "-d",
            str(tmp_path / "deploy"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode in (0, 1), r.stderr[-2000:]  # 1: findings
    report, decoder, text = [], json.JSONDecoder(), r.stdout.strip()
    while text:  # one JSON document per -d
        doc, end = decoder.raw_decode(text)
        report += doc if isinstance(doc, list) else [doc]
        text = text[end:].strip()
    found, summary = _findings(report)
    print("checkov passed/failed:", summary)
    assert {"terraform", "dockerfile", "kubernetes"} <= set(summary)
    explained = lambda f, a: f[0] == a[0] and fnmatch.fnmatchcase(f[1], a[1])  # noqa: E731
    new = sorted(f for f in found if not any(explained(f, a) for a in ACCEPTED))
    assert new == [], f"new findings {new}: fix them or explain them in ACCEPTED"
    stale = sorted(a for a in ACCEPTED if not any(explained(f, a) for f in found))
    assert stale == [], f"fixed findings {stale}: take them out of ACCEPTED"

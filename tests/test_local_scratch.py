"""Local NVMe and the /local scratch (issue 14): the GPU nodes' instance store as one RAID0 array,
and a directory on it that job pods mount at /local when there is no shared volume, for NCCL's
flight-recorder dumps and the Hugging Face cache.

Sources: nodeadm's NodeConfig (amazon-eks-ami nodeadm/api/v1alpha1/nodeconfig_types.go,
spec.instance.localStorage.strategy RAID0) runs setup-local-disks
(nodeadm/internal/system/local_disk.go), which mounts the array at $MNT_DIR/0 with
MNT_DIR=/mnt/k8s-disks (templates/al2023/runtime/bin/setup-local-disks), in nodeadm's run phase,
after cloud-init (templates/al2023/runtime/rootfs/etc/systemd/system/nodeadm-run.service:
After=cloud-final.service). eksctl v0.230 adds an AmazonLinux2023 node group's
overrideBootstrapCommand to the user data as a NodeConfig MIME part and each preBootstrapCommand as
a `#!/bin/bash` part (pkg/nodebootstrap/al2023.go), and refuses overrideBootstrapCommand without a
custom AMI for any other family (pkg/apis/eksctl.io/v1alpha5/validation.go)."""

from __future__ import annotations

import configparser
import email
import json
import os
import re
import shlex
import stat
import subprocess

import pytest
import yaml

from conftest import ROOT, SHARED, prefixed
from fsdpctl.backends.local import engine as local
from fsdpctl.job import policy as jobpolicy
from fsdpctl.job import render
from fsdpctl.job.validate import validate
from fsdpctl.plan.instances import INSTANCE_TYPES
from fsdpctl.settings import load
from test_manifests import schemas  # noqa: F401 - the fixture: CRD schemas for validate()
from test_prestep import hub, tiny_model  # noqa: F401 - the Hub peer fixture serving a tiny Llama

SCHEMA = SHARED / "vendor" / "eksctl-v0.230.0" / "clusterconfig-v1alpha5.schema.json"
NO_SHARED = {"SHARED_VOLUME": "", "CHECKPOINT_PVC": "ckpt"}  # 2 nodes need a claim for checkpoints
JOB_KINDS = {"pytorchjob": "c10d", "trainjob": "c10d"}


def pod_of(job: dict) -> dict:
    """The worker pod spec of either job kind (a TrainJob's is its runtime patch)."""
    if job["kind"] == "PyTorchJob":
        return job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
    [patch] = job["spec"]["runtimePatches"]
    return patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]["template"][
        "spec"
    ]["template"]["spec"]


def env_of(cfg) -> dict[str, str]:
    return {e["name"]: e["value"] for e in render.container_env(cfg)}


CASES = [
    (instance, kind, efa)
    for instance in INSTANCE_TYPES
    for kind in JOB_KINDS
    for efa in ("true", "false")
]


@pytest.mark.parametrize("instance, kind, efa", CASES)
def test_without_a_shared_volume_the_traces_and_the_hf_cache_go_to_the_nodes_scratch(
    schemas,  # noqa: F811
    instance,
    kind,
    efa,
):
    """Every instance type, job kind and EFA setting: without SHARED_VOLUME the worker mounts the
    node's scratch directory (hostPath, the path the node's user data makes) at /local, and both
    TORCH_NCCL_DEBUG_INFO_TEMP_FILE and HF_HOME lie under that mount; with a shared volume there is
    no hostPath and both lie on the shared volume, as before. The job still validates against its
    CRD."""
    base = {"BACKEND": "eks", "INSTANCE_TYPE": instance, "JOB_KIND": kind, "EFA_ENABLED": efa}
    for settings, root in [(NO_SHARED, "/local"), ({}, "/fsx")]:
        cfg = load(dotenv={**base, **settings})
        objs = render.render_job(cfg, "r")
        assert validate(objs, schemas) == []
        pod = pod_of(objs[-1])
        host = [v for v in pod["volumes"] if "hostPath" in v]
        if settings:
            assert host == [
                {
                    "name": "scratch",
                    "hostPath": {"path": jobpolicy.NODE_SCRATCH_DIR, "type": "DirectoryOrCreate"},
                }
            ]
            mounts = {m["name"]: m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
            assert mounts["scratch"] == "/local"
        else:
            assert host == []
        env = env_of(cfg)
        assert env["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"].startswith(f"{root}/nccl-traces/")
        assert env["HF_HOME"] == f"{root}/hf-cache"


def _user_data_parts(text: str) -> dict[str, str]:
    message = email.message_from_string(text)
    return {p.get_content_type(): p.get_payload() for p in message.walk() if not p.is_multipart()}


def terraform_user_data() -> dict[str, str]:
    """The GPU launch template's user data as nvme.tf writes it (the heredoc, its indentation
    removed as terraform's <<- does), by MIME content type."""
    text = (ROOT / "terraform/modules/eks-gpu/nvme.tf").read_text()
    body = re.search(r"<<-EOT\n(.*?)\n\s*EOT", text, re.S)[1]  # type: ignore[index]
    lines = body.splitlines()
    indent = min(len(line) - len(line.lstrip()) for line in lines if line.strip())
    return _user_data_parts("\n".join(line[indent:] for line in lines) + "\n")


@pytest.mark.parametrize("instance", list(INSTANCE_TYPES))
def test_both_tools_give_the_gpu_nodes_the_same_raid0_and_scratch(instance):
    """eksctl's ClusterConfig and terraform's launch template carry one NodeConfig (RAID0) and one
    script; the eksctl one validates against eksctl's schema, is on an AmazonLinux2023 node group
    (the only family eksctl lets carry overrideBootstrapCommand without a custom AMI), and the
    system node group gets neither."""
    import jsonschema

    cc = render.render_clusterconfig(load(dotenv={"INSTANCE_TYPE": instance}))
    assert list(jsonschema.Draft7Validator(json.loads(SCHEMA.read_text())).iter_errors(cc)) == []
    system, gpu = cc["managedNodeGroups"]
    assert gpu["amiFamily"] == "AmazonLinux2023" and "ami" not in gpu
    assert yaml.safe_load(gpu["overrideBootstrapCommand"]) == render.NODE_CONFIG_RAID0
    assert gpu["preBootstrapCommands"] == [render.SCRATCH_SCRIPT]
    assert not {"overrideBootstrapCommand", "preBootstrapCommands"} & set(system)
    parts = terraform_user_data()
    assert yaml.safe_load(parts["application/node.eks.aws"]) == render.NODE_CONFIG_RAID0
    script = parts["text/x-shellscript"]
    assert script.startswith("#!/bin/bash\n") and script.removeprefix("#!/bin/bash\n").strip() == (
        render.SCRATCH_SCRIPT.strip()
    )


def test_the_script_makes_the_directory_the_pods_mount_when_the_kubelet_starts(tmp_path):
    """The script run for real (bash), its root moved under tmp_path and systemctl recorded: it
    writes a kubelet drop-in and reloads systemd; the drop-in's ExecStartPre, run as systemd would
    when the kubelet starts (after nodeadm mounted the array), makes exactly the pods' hostPath,
    mode 1777 (non-root pods write there), and running it again (a kubelet restart) changes nothing.
    Its `-` prefix: a failure there never keeps the kubelet from starting (systemd.service,
    ExecStartPre)."""
    root = tmp_path / "node"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "systemctl").write_text(f'#!/bin/sh\necho "$@" >> {tmp_path}/systemctl.log\n')
    (bin_dir / "systemctl").chmod(0o755)
    script = render.SCRATCH_SCRIPT.replace("/etc/", f"{root}/etc/")
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    subprocess.run(["bash", "-euc", script], env=env, check=True, timeout=30)
    assert (tmp_path / "systemctl.log").read_text() == "daemon-reload\n"
    drop_in = root / render.SCRATCH_DROP_IN.lstrip("/")
    unit = configparser.ConfigParser(interpolation=None)
    unit.read_string(drop_in.read_text())
    command = unit["Service"]["ExecStartPre"]
    assert command.startswith("-/")  # systemd: a failing command with `-` is not fatal
    argv = shlex.split(command[1:])
    pod = pod_of(render.render_job(load(dotenv={"BACKEND": "eks", **NO_SHARED}), "r")[-1])
    [host] = [v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v]
    assert argv[-1] == host == jobpolicy.NODE_SCRATCH_DIR
    made = root / host.lstrip("/")
    for _ in range(2):
        subprocess.run([*argv[:-1], str(made)], check=True, timeout=30)
        assert stat.S_IMODE(made.stat().st_mode) == 0o1777 and made.is_dir()


def test_the_local_backend_gives_each_node_its_own_scratch_that_outlives_its_pods(
    tmp_path, monkeypatch
):
    """The local backend maps the hostPath to a directory of that simulated node under the job
    (jobs/<job>/hosts/node-N/<path>), one per node, apart from the pod's emptyDirs (nodes/node-N,
    renewed with each pod): the traces and the HF cache of node N land there."""
    monkeypatch.setenv("FSDPCTL_HOME", str(tmp_path))
    cfg = load(dotenv={**NO_SHARED, "JOB_NODES": "3"})
    jdir = tmp_path / "jobs" / cfg.job_name
    spec = local.spec_from_job(render.render_job(cfg, "r")[-1], jdir)
    scratches = []
    for node in range(3):
        scratch = jdir / "hosts" / f"node-{node}" / jobpolicy.NODE_SCRATCH_DIR.lstrip("/")
        env = local.mapped_env(spec, node)
        assert env["HF_HOME"] == f"{scratch}/hf-cache"
        assert (
            env["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == f"{scratch}/nccl-traces/fsdp/nccl_trace_rank_"
        )
        assert local.volume_dirs(spec, node)["/local"] == str(scratch)
        scratches.append(scratch)
    assert len(set(scratches)) == 3
    assert local.nccl_traces(spec) == sorted(
        f"{s}/nccl-traces/fsdp/nccl_trace_rank_" for s in scratches
    )
    # with a shared volume nothing is mapped to a node's disk
    shared = local.spec_from_job(render.render_job(load(dotenv={}), "r")[-1], jdir)
    assert "/local" not in shared["volumes"] and not any(
        "/hosts/" in v for v in shared["volumes"].values()
    )


@pytest.mark.slow
def test_a_two_node_local_job_keeps_its_traces_and_hf_cache_on_each_nodes_scratch(
    cli,
    hub,  # noqa: F811
    assets,
):
    """A real two-node local job with a hub model and no shared volume (so no pre-step: each node's
    local rank 0 downloads for its node, fsdptrain.fetch.before_process_group): the model arrives
    once per node, in that node's /local/hf-cache, and each node's pre-launch check made its
    flight-recorder directory under its own /local; nothing of either lands on another node's disk
    or in the pods' emptyDirs."""
    from test_prestep import MODEL, file_gets

    assert hub.endpoint  # the fixture is what serves MODEL
    settings = {
        **prefixed(
            {
                **NO_SHARED,
                "PRETRAINED": MODEL,
                "DATASET": str(assets[0]),
                "MAX_STEPS": "2",
                "SEQ_LEN": "32",
                "PRECISION": "fp32",
                "WARMUP_STEPS": "1",
                "JOB_NODES": "2",
            }
        ),
        "HF_ENDPOINT": hub.endpoint,
        # loopback: the Hub peer listens on this namespace's 127.0.0.1, which a node's namespace
        # cannot reach
        "FSDPCTL_LOCAL_NETNS": "0",
    }
    started = cli.run("job", "run", "--detach", env=settings)
    assert started.exit_code == 0, started.output
    waited = cli.run("job", "wait", "--timeout", "400", env=settings, timeout=440)
    jdir = cli.home / "jobs" / "fsdp"
    assert waited.exit_code == 0, "".join(
        p.read_text()[-2000:] for p in jdir.glob("logs/*/node-*.log")
    )
    assert file_gets(hub)["model.safetensors"] == 2  # one download per node
    for node in (0, 1):
        scratch = jdir / "hosts" / f"node-{node}" / jobpolicy.NODE_SCRATCH_DIR.lstrip("/")
        assert list(
            (scratch / "hf-cache" / "hub").glob("models--org--tiny-llama/snapshots/*/config.json")
        )
        assert (scratch / "nccl-traces" / "fsdp").is_dir()
    assert not list(jdir.glob("nodes/**/hf-cache")) and not list(jdir.glob("nodes/**/nccl-traces"))

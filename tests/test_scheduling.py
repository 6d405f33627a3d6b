"""Where the DaemonSets a job needs would run: every node group fsdpctl renders (eksctl ClusterConfig and
the terraform module, for p4de, p5 and p5e) as nodes with their labels and taints, and every DaemonSet that
must run on the GPU nodes (the NVIDIA and EFA device plugins as `fsdpctl deploy plugins` applies them, the
DCGM exporter, htop and nvtop), matched with the scheduler's rules, implemented here apart from fsdpctl:
- taints/tolerations: k8s.io/api/core/v1 `Toleration.ToleratesTaint` (toleration.go): an empty effect matches
  every effect, an empty key with operator Exists matches every taint, Exists ignores the value, Equal (or no
  operator) compares it; only NoSchedule and NoExecute taints keep a new pod off a node (the TaintToleration
  filter plugin);
- node affinity: k8s.io/component-helpers `scheduling/corev1/nodeaffinity` (nodeSelectorTerms are ORed, the
  matchExpressions of one term ANDed, a term without expressions matches nothing; In, NotIn, Exists,
  DoesNotExist, Gt, Lt) plus the pod's nodeSelector, every pair of which must match.
Nodes carry what EKS gives managed node groups: the group's labels and taints (the EKS API's NO_SCHEDULE is
the node's NoSchedule) and the kubelet's `node.kubernetes.io/instance-type`. Not `nvidia.com/gpu.present`:
only GPU Feature Discovery or nodeadm for kubelet >= 1.35 set it (amazon-eks-ami
nodeadm/internal/kubelet/config.go), and clusters default to 1.33."""

from __future__ import annotations

import hcl2
import pytest
import yaml

from conftest import ROOT, SHARED
from fsdpctl.cluster import deploy, deploy_status
from fsdpctl.job import policy as jobpolicy
from fsdpctl.job import render
from fsdpctl.settings import load

VENDOR = SHARED / "vendor"
INSTANCES = ("p4de.24xlarge", "p5.48xlarge", "p5e.48xlarge")
BLOCKING = ("NoSchedule", "NoExecute")
EKS_EFFECTS = {
    "NO_SCHEDULE": "NoSchedule",
    "NO_EXECUTE": "NoExecute",
    "PREFER_NO_SCHEDULE": "PreferNoSchedule",
}


# --- the scheduler's rules ---------------------------------------------------------------------------------


def tolerates(toleration: dict, taint: dict) -> bool:
    if toleration.get("effect") and toleration["effect"] != taint["effect"]:
        return False
    if toleration.get("key") and toleration["key"] != taint["key"]:
        return False
    operator = toleration.get("operator") or "Equal"
    if operator == "Exists":
        return True
    return bool(toleration.get("key")) and toleration.get("value", "") == taint.get("value", "")


def expression_matches(expr: dict, labels: dict[str, str]) -> bool:
    key, op, values = expr["key"], expr["operator"], expr.get("values", [])
    present = key in labels
    if op == "In":
        return present and labels[key] in values
    if op == "NotIn":
        return not present or labels[key] not in values
    if op == "Exists":
        return present
    if op == "DoesNotExist":
        return not present
    if op in ("Gt", "Lt"):
        [bound] = values
        if not present or not labels[key].lstrip("-").isdigit():
            return False
        return int(labels[key]) > int(bound) if op == "Gt" else int(labels[key]) < int(bound)
    raise AssertionError(f"unknown operator {op}")


def affinity_matches(pod: dict, labels: dict[str, str]) -> bool:
    if any(labels.get(k) != v for k, v in (pod.get("nodeSelector") or {}).items()):
        return False
    required = ((pod.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    )
    if required is None:
        return True
    return any(
        bool(term.get("matchExpressions"))
        and all(expression_matches(e, labels) for e in term["matchExpressions"])
        for term in required["nodeSelectorTerms"]
    )


def lands(pod: dict, node: dict) -> bool:
    tolerations = pod.get("tolerations") or []
    untolerated = [
        t
        for t in node["taints"]
        if t["effect"] in BLOCKING and not any(tolerates(tol, t) for tol in tolerations)
    ]
    return not untolerated and affinity_matches(pod, node["labels"])


def test_the_rules_themselves():
    """The matcher can say no: each rule on a case where it fails and one where it holds."""
    taint = {"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}
    assert tolerates({"operator": "Exists"}, taint)  # empty key + Exists: every taint
    assert not tolerates(
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoExecute"}, taint
    )
    assert tolerates({"key": "nvidia.com/gpu", "value": "true"}, taint)  # no operator means Equal
    assert not tolerates({"key": "nvidia.com/gpu", "operator": "Equal", "value": "false"}, taint)
    assert not tolerates({"key": "aws.amazon.com/efa", "operator": "Exists"}, taint)
    node = {"labels": {"a": "1", "b": "x"}, "taints": [{"key": "k", "effect": "PreferNoSchedule"}]}
    term = {
        "matchExpressions": [
            {"key": "a", "operator": "In", "values": ["1"]},
            {"key": "c", "operator": "Exists"},
        ]
    }
    pod = {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {}}}}
    required = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    required["nodeSelectorTerms"] = [term]
    assert not lands(pod, node)  # AND within a term
    required["nodeSelectorTerms"] = [
        term,
        {"matchExpressions": [{"key": "c", "operator": "DoesNotExist"}]},
    ]
    assert lands(pod, node)  # OR across terms; a PreferNoSchedule taint does not block
    required["nodeSelectorTerms"] = [{"matchExpressions": []}]
    assert not lands(pod, node)
    assert lands(
        {
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {"key": "b", "operator": "NotIn", "values": ["y"]},
                                    {"key": "a", "operator": "Gt", "values": ["0"]},
                                ]
                            }
                        ]
                    }
                }
            }
        },
        node,
    )
    assert not lands({"nodeSelector": {"b": "y"}}, node)
    assert not lands({}, {"labels": {}, "taints": [taint]})


# --- the nodes fsdpctl's clusters have ---------------------------------------------------------------------


def _node(instance_type: str, labels: dict, taints: list[dict]) -> dict:
    return {
        "labels": {**labels, "node.kubernetes.io/instance-type": instance_type},
        "taints": taints,
    }


def eksctl_nodes(instance: str) -> dict[str, dict]:
    cc = render.render_clusterconfig(load(dotenv={"INSTANCE_TYPE": instance}))
    return {
        g["name"]: _node(g["instanceType"], g.get("labels", {}), g.get("taints", []))
        for g in cc["managedNodeGroups"]
    }


def _unquote(v: str) -> str:
    return v.strip('"')


def terraform_nodes(instance: str) -> dict[str, dict]:
    tfvars = render.terraform_vars(load(dotenv={"INSTANCE_TYPE": instance}))
    module = hcl2.load((ROOT / "terraform/modules/eks-gpu/main.tf").open())
    groups = {
        _unquote(name): body
        for block in module["resource"]
        for kind, resources in block.items()
        if _unquote(kind) == "aws_eks_node_group"
        for name, body in resources.items()
    }
    nodes = {}
    for name, g in groups.items():
        # the GPU group names its type unless a Capacity Block's launch template does (issue 27,
        # defect 8): `${var.capacity_block ? null : [var.instance_type]}` here, without a block
        types = g["instance_types"]
        [itype] = (
            [f"${{{types.rpartition('[')[2].rstrip(']}')}}}"] if isinstance(types, str) else types
        )
        assert itype.startswith("${var.") and itype.endswith("}"), itype
        taints = [
            {
                "key": _unquote(t["key"]),
                "value": _unquote(t["value"]),
                "effect": EKS_EFFECTS[_unquote(t["effect"])],
            }
            for t in g.get("taint", [])
        ]
        labels = {_unquote(k): _unquote(v) for k, v in g.get("labels", {}).items()}
        nodes[name] = _node(tfvars[itype[len("${var.") : -1]], labels, taints)
    return nodes


def cluster_nodes(tool: str, instance: str) -> tuple[dict, dict]:
    """(GPU node, system node) as the tool's render makes them."""
    nodes = eksctl_nodes(instance) if tool == "eksctl" else terraform_nodes(instance)
    [gpu] = [
        n for n in nodes.values() if n["labels"]["node.kubernetes.io/instance-type"] == instance
    ]
    [system] = [n for n in nodes.values() if n is not gpu]
    assert gpu["taints"], "the GPU node group is tainted on both paths"
    return gpu, system


# --- the DaemonSets ----------------------------------------------------------------------------------------


def daemonsets() -> dict[str, tuple[dict, bool]]:
    """name -> (pod spec, GPU nodes only) for what fsdpctl deploys."""
    cfg = load(flags={"BACKEND": "eks"})
    objs = deploy.plugins(cfg, [VENDOR]).objects + deploy.monitoring(cfg).objects
    gpu_only = {
        "nvidia-device-plugin-daemonset",
        "aws-efa-k8s-device-plugin",
        "dcgm-exporter",
        "nvtop",
        "htop",
    }
    out = {
        o["metadata"]["name"]: (o["spec"]["template"]["spec"], o["metadata"]["name"] in gpu_only)
        for o in objs
        if o["kind"] == "DaemonSet"
    }
    assert set(out) == gpu_only
    return out


@pytest.mark.parametrize("tool", ["eksctl", "terraform"])
@pytest.mark.parametrize("instance", INSTANCES)
def test_every_daemonset_lands_on_the_gpu_nodes_and_gpu_only_ones_nowhere_else(tool, instance):
    """Defects 1 and 3 of issue 14 fixed: both device plugins (eksctl v0.230.0 pkg/addons/assets,
    patched by `deploy.plugins`), the DCGM exporter, nvtop and htop land on the GPU nodes of both
    tools' renders and not on the system nodes (htop runs the trainer's image: issue 36, S4)."""
    gpu, system = cluster_nodes(tool, instance)
    assert "nvidia.com/gpu.present" not in gpu["labels"]
    for name, (pod, gpu_only) in daemonsets().items():
        assert lands(pod, gpu), f"{name} does not land on the {tool} {instance} GPU nodes"
        if gpu_only:
            assert not lands(pod, system), f"{name} lands on the {tool} system nodes"


@pytest.mark.parametrize("shared", ["fsx-claim", ""])
@pytest.mark.parametrize("tool", ["eksctl", "terraform"])
@pytest.mark.parametrize("instance", INSTANCES)
def test_the_job_pods_land_on_gpu_nodes_that_make_their_local_scratch(tool, instance, shared):
    """The worker pod, with the shared volume or with the /local scratch (hostPath) without one,
    lands on the tool's GPU nodes and not on its system nodes; and the GPU node group is the one
    whose user data makes that directory (eksctl: preBootstrapCommands; terraform: the GPU launch
    template's user data, nvme.tf), the system nodes' does not."""
    cfg = load(
        dotenv={
            "BACKEND": "eks",
            "INSTANCE_TYPE": instance,
            "SHARED_VOLUME": shared,
            "CHECKPOINT_PVC": "c",
        }
    )
    pod = render.render_job(cfg, "r")[-1]["spec"]["pytorchReplicaSpecs"]["Worker"]["template"][
        "spec"
    ]
    gpu, system = cluster_nodes(tool, instance)
    assert lands(pod, gpu) and not lands(pod, system)
    hosts = [v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v]
    assert hosts == ([] if shared else [jobpolicy.NODE_SCRATCH_DIR])
    if tool == "eksctl":
        groups = render.render_clusterconfig(load(dotenv={"INSTANCE_TYPE": instance}))[
            "managedNodeGroups"
        ]
        made = {
            g["name"]: jobpolicy.NODE_SCRATCH_DIR in "".join(g.get("preBootstrapCommands", []))
            for g in groups
        }
        assert made == {"system": False, f"gpu-{instance.split('.')[0]}": True}
    else:
        module = hcl2.load((ROOT / "terraform/modules/eks-gpu/main.tf").open())
        templates = [b for b in module["resource"] if '"aws_launch_template"' in b]
        assert [list(t['"aws_launch_template"']) for t in templates] == [
            ['"gpu"']
        ]  # the system group: none
        assert "local.gpu_user_data" in templates[0]['"aws_launch_template"']['"gpu"']["user_data"]
        assert (
            jobpolicy.NODE_SCRATCH_DIR in (ROOT / "terraform/modules/eks-gpu/nvme.tf").read_text()
        )


@pytest.mark.parametrize("tool", ["eksctl", "terraform"])
@pytest.mark.parametrize("instance", INSTANCES)
def test_eksctls_own_efa_plugin_does_not_reach_the_tainted_gpu_nodes(tool, instance):
    """Defect 1 of issue 14 as shipped: eksctl v0.230.0's efa-device-plugin.yaml (pkg/addons/assets;
    its EFADevicePlugin.SetTolerations in pkg/addons/device_plugin.go adds nothing) tolerates only
    CriticalAddonsOnly and aws.amazon.com/efa, so the GPU nodes never run it; its affinity alone
    would allow them."""
    gpu, _ = cluster_nodes(tool, instance)
    [upstream] = [
        o
        for o in yaml.safe_load_all(
            (VENDOR / "eksctl-v0.230.0/addons/efa-device-plugin.yaml").read_text()
        )
        if o
    ]
    pod = upstream["spec"]["template"]["spec"]
    assert affinity_matches(pod, gpu["labels"])
    assert not lands(pod, gpu)


@pytest.mark.parametrize("instance", INSTANCES)
def test_the_old_monitoring_selector_lands_nowhere(instance):
    """Defect 3 of issue 14 as it was: `nodeSelector: nvidia.com/gpu.present=true` matches no node
    of either render on Kubernetes 1.33 (the label needs GPU Feature Discovery, or nodeadm for
    kubelet >= 1.35)."""
    old = {
        "nodeSelector": {"nvidia.com/gpu.present": "true"},
        "tolerations": [{"operator": "Exists"}],
    }
    for tool in ("eksctl", "terraform"):
        assert not any(lands(old, n) for n in cluster_nodes(tool, instance))


# --- the trainer's image stays off the system nodes (issue 36, S4) ----------------------------------------


def trainer_image_pods(cfg) -> dict[str, dict]:
    """name -> pod spec of everything fsdpctl renders that runs the trainer's image (IMAGE_URI): the
    worker pods (PyTorchJob, or a TrainJob's runtime patch, which carries the same nodeSelector and
    tolerations), the pre-step Job, the checkpoint cleaner, and the monitoring DaemonSets."""
    objs = render.render_job(cfg, "r")
    pods = {}
    for o in objs:
        if o["kind"] == "PyTorchJob":
            pods["worker"] = o["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
        if o["kind"] == "TrainJob":
            [patch] = o["spec"]["runtimePatches"]
            [job] = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
            pods["worker"] = job["template"]["spec"]["template"]["spec"]
        if o["kind"] == "Job":
            pods["pre-step"] = o["spec"]["template"]["spec"]
            assert o["spec"]["template"]["spec"]["containers"][0]["image"] == cfg.image_uri
    pods["checkpoint-cleaner"] = render.render_checkpoint_cleaner(cfg, "fsdp")["spec"]
    for o in deploy.monitoring(cfg).objects:
        spec = o["spec"]["template"]["spec"] if o["kind"] == "DaemonSet" else {}
        if any(c["image"] == cfg.image_uri for c in spec.get("containers", [])):
            pods[o["metadata"]["name"]] = spec
    assert set(pods) == {"worker", "pre-step", "checkpoint-cleaner", "htop", "nvtop"}
    return pods


@pytest.mark.parametrize("kind", ["pytorchjob", "trainjob"])
@pytest.mark.parametrize("tool", ["eksctl", "terraform"])
@pytest.mark.parametrize("instance", INSTANCES)
def test_nothing_with_the_trainers_image_lands_on_the_system_nodes(tool, instance, kind):
    """Issue 36, S4: the pre-step Job had no nodeSelector and htop no affinity, so both pulled the
    trainer's ~20 GB image onto a system node, whose root volume was EKS's default 20 GiB on
    terraform (CreateNodegroup diskSize, botocore's eks service model). Now every pod that runs
    that image selects the nodes the workers run on (their nodeSelector and tolerations, with the
    NODE_SELECTOR and TOLERATIONS a user adds) and lands on the GPU nodes, never on the system
    ones; the objects stay valid Kubernetes 1.33 objects (kubernetes-validate, strict)."""
    from fsdpctl.job.validate import validate

    extra = {"NODE_SELECTOR": "team=ml", "TOLERATIONS": "dedicated=ml:NoSchedule"}
    cfg = load(dotenv={"BACKEND": "eks", "INSTANCE_TYPE": instance, "JOB_KIND": kind, **extra})
    gpu, system = cluster_nodes(tool, instance)
    # the job's own pods follow NODE_SELECTOR and TOLERATIONS onto nodes a user labelled and tainted
    # so; the monitoring DaemonSets are the cluster's, made for fsdpctl's own GPU node groups
    marked = {
        "labels": {**gpu["labels"], "team": "ml"},
        "taints": [*gpu["taints"], {"key": "dedicated", "value": "ml", "effect": "NoSchedule"}],
    }
    for name, pod in trainer_image_pods(cfg).items():
        where = gpu if name in ("htop", "nvtop") else marked
        assert lands(pod, where), f"{name} does not land on the {tool} {instance} GPU nodes"
        assert not lands(pod, system), f"{name} lands on the {tool} system nodes"
    objs = [o for o in render.render_job(cfg, "r") if o["kind"] == "Job"]
    assert validate([*objs, render.render_checkpoint_cleaner(cfg, "fsdp")], {}) == []


# EKS's kube-reserved CPU on a node (amazon-eks-ami nodeadm internal/kubelet/config.go,
# getCPUMillicoresToReserve: 6% of the first core, 1% of the second, 0.5% of the next two, 0.25% of
# the rest) and memory (255 MiB + 11 MiB per pod of maxPods; 250 pods bounds every GPU type's).
def _kube_reserved(vcpus: int) -> tuple[float, float]:
    cores = [0.06, 0.01, 0.005, 0.005] + [0.0025] * max(0, vcpus - 4)
    return sum(cores[:vcpus]), (255 + 11 * 250) / 1024


def _requests(pod: dict) -> tuple[float, float]:
    """(CPUs, GiB) the scheduler counts for a pod: the larger of its containers' sum and its
    largest init container (k8s.io/component-helpers resource/helpers.go, PodRequests)."""

    def one(c: dict) -> tuple[float, float]:
        r = (c.get("resources") or {}).get("requests") or {}
        cpu = str(r.get("cpu", "0"))
        mem = str(r.get("memory", "0"))
        cpus = float(cpu[:-1]) / 1000 if cpu.endswith("m") else float(cpu)
        gib = (
            float(mem[:-2]) / (1024 if mem.endswith("Mi") else 1) if mem[-2:] in ("Mi", "Gi") else 0
        )
        return cpus, gib

    main = [one(c) for c in pod["containers"]]
    init = [one(c) for c in pod.get("initContainers", [])] or [(0.0, 0.0)]
    return (
        max(sum(c for c, _ in main), max(c for c, _ in init)),
        max(sum(m for _, m in main), max(m for _, m in init)),
    )


@pytest.mark.parametrize("instance", INSTANCES)
def test_the_pre_step_fits_on_a_gpu_node_beside_its_worker(instance):
    """The pre-step now runs on the GPU nodes, where the workers' pods are created at the same
    moment and wait for its marker: if a worker's requests left no room beside it, the pre-step
    would stay Pending and the job would wait out PRESTEP_TIMEOUT. A worker requests 90% of the
    node's CPUs and 80% of its memory; with every DaemonSet fsdpctl deploys there and EKS's
    kube-reserved, the pre-step still fits on a node that runs a worker (the FSx CSI node plugin
    included: aws-fsx-csi-driver deploy/kubernetes/base/node-daemonset.yaml)."""
    from fsdpctl.plan.instances import INSTANCE_TYPES

    cfg = load(dotenv={"BACKEND": "eks", "INSTANCE_TYPE": instance})
    pods = trainer_image_pods(cfg)
    node = INSTANCE_TYPES[instance]
    cpu, mem = _kube_reserved(node.vcpus)
    for name in ("worker", "pre-step"):
        c, m = _requests(pods[name])
        cpu, mem = cpu + c, mem + m
    fsx = [o for o in deploy.storage(cfg, [VENDOR]).objects if o["kind"] == "DaemonSet"]
    assert fsx  # the FSx CSI driver's node plugin runs on every node too
    for pod in [p for p, _ in daemonsets().values()] + [o["spec"]["template"]["spec"] for o in fsx]:
        c, m = _requests(pod)
        cpu, mem = cpu + c, mem + m
    assert cpu <= node.vcpus and mem <= node.memory_gib, (cpu, mem)


# --- what the plugins made allocatable, and a Pending pod that lacks it ------------------------------------


def _node_obj(name: str, labels: dict[str, str], allocatable: dict[str, str]) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "status": {"allocatable": {"cpu": "191450m", **allocatable}},
    }


def test_deploy_status_shows_per_gpu_node_what_the_plugins_made_allocatable(tmp_path):
    """`deploy status` lists the Nodes (v1 Node, through fsdpctl's adapter and the API peer, status
    written through the /status subresource as the kubelet does): a p5 node the EFA plugin never
    reached (defect 1) is not ready and shows vpc.amazonaws.com/efa=0; the system node is not
    listed."""
    from fsdpctl.adapters.kube import Kube
    from kube_peer import Peer

    peer = Peer(tmp_path)
    try:
        k = Kube.connect(kubeconfig=str(peer.kubeconfig))
        p5 = {"node.kubernetes.io/instance-type": "p5.48xlarge", "fsdpctl.io/role": "gpu"}
        nodes = [
            _node_obj("gpu-a", p5, {"nvidia.com/gpu": "8", "vpc.amazonaws.com/efa": "32"}),
            _node_obj("gpu-b", p5, {"nvidia.com/gpu": "8"}),
            _node_obj("system-a", {"node.kubernetes.io/instance-type": "m5.xlarge"}, {}),
        ]
        for node in nodes:
            k.create(node)
            k.request("PUT", f"/api/v1/nodes/{node['metadata']['name']}/status", body=node)
        rows = deploy_status.status(
            k, load(flags={"BACKEND": "eks", "INSTANCE_TYPE": "p5.48xlarge"})
        )
    finally:
        peer.close()
    assert [r for r in rows if r["object"].startswith("Node/")] == [
        {
            "component": "plugins",
            "object": "Node/gpu-a",
            "namespace": "-",
            "installed": True,
            "version": "nvidia.com/gpu=8 vpc.amazonaws.com/efa=32",
            "ready": True,
        },
        {
            "component": "plugins",
            "object": "Node/gpu-b",
            "namespace": "-",
            "installed": True,
            "version": "nvidia.com/gpu=8 vpc.amazonaws.com/efa=0",
            "ready": False,
        },
    ]
    off = deploy_status.node_rows(nodes, efa=False)
    assert [(r["object"], r["version"], r["ready"]) for r in off] == [
        ("Node/gpu-a", "nvidia.com/gpu=8", True),
        ("Node/gpu-b", "nvidia.com/gpu=8", True),
    ]


def test_a_pending_pod_names_the_plugin_that_would_advertise_what_it_lacks():
    """The scheduler's own wording (kube-scheduler NodeResourcesFit: "Insufficient <resource>") on a
    pod that asks for EFA interfaces no node advertises: the problem names the EFA device plugin."""
    from fsdpctl.job import kstatus

    message = (
        "0/3 nodes are available: 1 Insufficient vpc.amazonaws.com/efa, "
        "2 node(s) didn't match Pod's node affinity/selector."
    )
    pod = {
        "metadata": {"name": "fsdp-run-1-worker-0"},
        "status": {
            "phase": "Pending",
            "conditions": [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": message,
                }
            ],
        },
    }
    [problem] = kstatus.scheduling_problems([pod], {})
    assert problem.startswith(f"fsdp-run-1-worker-0: Unschedulable: {message}")
    assert (
        "EFA device plugin (kube-system/aws-efa-k8s-device-plugin)" in problem
        and "NVIDIA" not in problem
    )
    assert "fsdpctl deploy plugins" in problem
    event = {
        "reason": "FailedScheduling",
        "message": "0/2 nodes are available: 2 Insufficient nvidia.com/gpu.",
    }
    [problem] = kstatus.scheduling_problems(
        [{**pod, "status": {"phase": "Pending"}}], {pod["metadata"]["name"]: [event]}
    )
    assert "NVIDIA device plugin" in problem and "EFA" not in problem
    busy = {
        "reason": "FailedScheduling",
        "message": "0/2 nodes are available: 2 node(s) had untolerated taint.",
    }
    [problem] = kstatus.scheduling_problems(
        [{**pod, "status": {"phase": "Pending"}}], {pod["metadata"]["name"]: [busy]}
    )
    assert "plugin" not in problem


def test_on_an_eksctl_cluster_deploy_plugins_patches_eksctls_own_daemonsets(tmp_path):
    """The choice for eksctl clusters: fsdpctl applies the plugins under the names eksctl gives them
    (eksctl v0.230.0 pkg/addons/assets), so the EFA DaemonSet eksctl created (here sent as eksctl
    sends it, by create) is patched in place by server-side apply, not doubled by a second plugin on
    the same devices; afterwards it lands on the GPU nodes, and a rerun changes nothing."""
    from fsdpctl.adapters.kube import Kube
    from kube_peer import Peer

    cfg = load(flags={"BACKEND": "eks"})
    [eksctls] = [
        o
        for o in yaml.safe_load_all(
            (VENDOR / "eksctl-v0.230.0/addons/efa-device-plugin.yaml").read_text()
        )
        if o
    ]
    for c in eksctls["spec"]["template"]["spec"]["containers"]:  # as eksctl fills in the image
        c["image"] = c["image"].replace(
            "%s.dkr.ecr.%s.%s", deploy.eks_image_registry(cfg.aws_region)
        )
    gpu, _ = cluster_nodes("eksctl", "p5.48xlarge")
    peer = Peer(tmp_path)
    try:
        k = Kube.connect(kubeconfig=str(peer.kubeconfig))
        k.create(eksctls)
        before = k.get("apps/v1", "DaemonSet", "aws-efa-k8s-device-plugin", "kube-system")
        assert not lands(before["spec"]["template"]["spec"], gpu)
        comp = deploy.plugins(cfg, [VENDOR])
        assert deploy.apply(k, comp) == {"created": 1, "configured": 1, "unchanged": 0}
        stored = k.list("apps/v1", "DaemonSet", "kube-system")
        assert deploy.apply(k, comp) == {"created": 0, "configured": 0, "unchanged": 2}
    finally:
        peer.close()
    names = sorted(d["metadata"]["name"] for d in stored)
    assert names == ["aws-efa-k8s-device-plugin", "nvidia-device-plugin-daemonset"]
    assert all(lands(d["spec"]["template"]["spec"], gpu) for d in stored)

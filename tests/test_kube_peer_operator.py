"""The cluster behind the Kubernetes API peer (kube_peer_operator.py) held to the upstream rules it
follows, and fsdpctl's EKS backend run on it end to end.

1. The controllers' rules, pure, over generated inputs: the PyTorchJob controller (Training
   Operator v1.9.4) agrees with the restart rules of kube_peer_kubelet (themselves cited: common/
   pod.go ReconcilePods, train_util.go IsRetryableExitCode, pytorchjob_controller.go
   UpdateJobStatus) for every sequence of container exits, and with backoffLimit 0
   (common/job.go, exceedsBackoffLimit); its conditions follow pkg/util/status.go; the batch/v1
   Job controller (Kubernetes v1.33 pkg/controller/job) counts each ended pod once and fails or
   completes by podFailurePolicy, backoffLimit and completions; the scheduler never puts a pod where
   its selector, a taint or a node's allocatable says no (pkg/scheduler/framework/plugins).
2. The kubelet through the API, with small `python -c` containers: the environment and volumes
   from Secrets, ConfigMaps and the downward API (pkg/kubelet/kubelet_pods.go, a missing key is
   CreateContainerConfigError), the stop annotation reaching the downward API file, a deletion's or
   an eviction's SIGTERM then SIGKILL after the grace period (killPod), an unschedulable pod in the
   scheduler's words.
3. fsdpctl's EKS backend on it, real torchrun on CPU with gloo: a 1-node and a 2-node tiny job train
   to MAX_STEPS with the local backend's losses, step for step; `job stop` writes its checkpoint and
   `job resume` continues with the losses of a run never stopped; a pod killed by SIGKILL is
   recreated (exit 137 is retryable) and the job resumes with those losses too.

Peers: the API peer (kube_peer.py, kmock) for every object, this cluster for the controllers and
the kubelets, the local backend's supervisor (real torchrun) for the reference losses.
"""

from __future__ import annotations

import copy
import functools
import json
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kube_peer_kubelet as rules
import kube_peer_operator as op
from conftest import SHARED, fsdpctl_process, prefixed
from fsdpctl.job import kstatus, record, render
from fsdpctl.settings import load, setting_keys
from fsdptrain import events

VENDOR = SHARED / "vendor"
REGISTRY = "registry.example.com:5000"
NS = "fsdp"


def scale(seconds: float) -> float:
    """A deadline on a machine that may be loaded (four other test processes on two cores)."""
    return seconds * float(os.environ.get("FSDPCTL_TEST_TIME_SCALE", "1"))


def until(what: str, check: Callable[[], Any], timeout: float = 120) -> Any:
    deadline = time.monotonic() + scale(timeout)
    while not (got := check()):
        assert time.monotonic() < deadline, f"{what}: not within {timeout:g} s"
        time.sleep(0.1)
    return got


# ---- 1. the controllers' rules ---------------------------------------------------------------------------


def rendered(kind: str = "PyTorchJob", **more: str) -> dict:
    """The job or pre-step Job fsdpctl renders, as the API stores it (a uid, the namespace)."""
    return copy.deepcopy(_rendered(kind, tuple(sorted(more.items()))))


@functools.lru_cache(maxsize=32)
def _rendered(kind: str, more: tuple[tuple[str, str], ...]) -> dict:
    cfg = load(
        dotenv={
            "BACKEND": "eks",
            "IMAGE_REGISTRY": REGISTRY,
            "MODEL": "tiny",
            "GPUS_PER_NODE": "1",
            **dict(more),
        }
    )
    [obj] = [o for o in render.render_job(cfg, "run-1") if o["kind"] == kind]
    obj["metadata"]["uid"] = f"uid-{kind}"
    return obj


class Sim:
    """The operator's passes over a simulated set of pods, each pod Running as soon as it is made
    (the kubelet's part), a deleted one gone at once (its processes end within its grace)."""

    def __init__(self, job: dict):
        self.job, self.pods, self.services, self.made = job, {}, {}, 0

    def settle(self, at: float = 0.0) -> None:
        for _ in range(20):
            plan = op.pytorchjob_plan(
                self.job, list(self.pods.values()), list(self.services.values()), at
            )
            if not (plan.creates or plan.deletes or plan.status):
                return
            self.apply(plan)
        raise AssertionError("the operator never settled")

    def apply(self, plan: op.Plan) -> None:
        for obj in plan.creates:
            name = obj["metadata"]["name"]
            obj = {**copy.deepcopy(obj), "status": {"phase": "Running"}}
            obj["metadata"]["uid"] = f"{name}-{self.made}"
            if obj["kind"] == "Pod":
                self.made += 1
                self.pods[name] = obj
            else:
                self.services[name] = obj
        for _, kind, _, name in plan.deletes:
            (self.pods if kind == "Pod" else self.services).pop(name, None)
        if plan.status is not None:
            self.job["status"] = plan.status

    def end(self, node: int, code: int) -> None:
        pod = self.pods.get(f"{self.job['metadata']['name']}-worker-{node}")
        if pod is None or op.terminal(pod):
            return
        pod["status"] = {
            "phase": "Succeeded" if code == 0 else "Failed",
            "containerStatuses": [
                {"name": "pytorch", "restartCount": 0, "state": {"terminated": {"exitCode": code}}}
            ],
        }

    @property
    def phase(self) -> str:
        return kstatus.phase(self.job)


ENDS = st.lists(
    st.tuples(st.integers(0, 2), st.sampled_from([0, 1, 2, 127, 128 + 9, 128 + 15, 255])),
    max_size=6,
)


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(nodes=st.integers(1, 3), restarts=st.integers(0, 2), ends=ENDS)
def test_the_operator_agrees_with_the_restart_rules_for_every_sequence_of_exits(
    nodes, restarts, ends
):
    """A rendered PyTorchJob (restartPolicy ExitCode, an elasticPolicy, backoffLimit MAX_RESTARTS x
    JOB_NODES) and any sequence of its workers' container exits: after each, the job is what
    kube_peer_kubelet.pytorchjob says (a retryable exit recreates the pod, showing Restarting until
    it runs again; 1-127 fails the job; any 0 succeeds it), except that backoffLimit 0 fails it at
    its first failed pod (exceedsBackoffLimit: previousRetry + 1 > 0). Every pod is
    `<job>-worker-<i>` with the operator's labels, one per index."""
    sim = Sim(rendered(JOB_NODES=str(nodes), MAX_RESTARTS=str(restarts)))
    sim.settle()
    assert sim.phase == "Running" and sorted(sim.pods) == [f"fsdp-worker-{i}" for i in range(nodes)]
    limit = restarts * nodes
    applied: list[rules.End] = []
    for node, code in ends:
        if node >= nodes or sim.phase in ("Succeeded", "Failed"):
            continue
        sim.end(node, code)
        applied.append(rules.End(node, code))
        if code >= 128 and limit > 0:  # one pass: the pod is deleted, the job Restarting
            sim.apply(
                op.pytorchjob_plan(sim.job, list(sim.pods.values()), list(sim.services.values()), 0)
            )
            assert sim.phase == "Restarting", sim.job["status"]
        sim.settle()
        want = rules.pytorchjob(applied, nodes)
        if limit == 0 and want.phase != "Succeeded" and any(e.code for e in applied):
            want = rules.Outcome("Failed", "backoffLimit 0")
        assert sim.phase == want.phase, (
            applied,
            sim.job["status"],
        )
        if want.phase == "Running":
            assert sim.made == nodes + want.recreated
    for name, pod in sim.pods.items():
        labels = pod["metadata"]["labels"]
        assert name == f"fsdp-worker-{labels[op.REPLICA_INDEX_LABEL]}"
        assert labels[op.JOB_NAME_LABEL] == "fsdp" and labels[op.REPLICA_TYPE_LABEL] == "worker"
        assert pod["spec"]["restartPolicy"] == "Never"  # ExitCode, as core.SetRestartPolicy sets it


@settings(max_examples=80, deadline=None)
@given(
    steps=st.lists(
        st.tuples(
            st.sampled_from(["Created", "Running", "Restarting", "Succeeded", "Failed"]),
            st.sampled_from(["True", "False"]),
        ),
        max_size=8,
    )
)
def test_conditions_follow_update_job_conditions(steps):
    """pkg/util/status.go UpdateJobConditions over any sequence: Running and Restarting never both,
    one condition per type, nothing changes once Failed is True, and a Succeeded or Failed turns
    Running False."""
    status: dict = {}
    for ctype, value in steps:
        before = copy.deepcopy(status)
        op.set_condition(status, ctype, value, f"PyTorchJob{ctype}", "m")
        types = [c["type"] for c in status.get("conditions", [])]
        assert len(types) == len(set(types)) and not {"Running", "Restarting"} <= set(types)
        if op.has_condition(before, "Failed"):
            assert status == before
        if value == "True" and ctype in ("Succeeded", "Failed") and status != before:
            assert not any(
                c["type"] == "Running" and c["status"] == "True" for c in status["conditions"]
            )


def test_a_pod_gets_the_operators_environment_port_and_service():
    """createNewPod and CreateNewService on a rendered 2-node job: the template's container plus
    PYTHONUNBUFFERED, PET_NPROC_PER_NODE and the elastic PET_* (envvar.go, elastic.go), the
    default port pytorchjob-port 23456 (pytorch_defaults.go), worker 0 labelled job-role master, a
    headless Service per replica selecting it, all controlled by the job."""
    job = rendered(JOB_NODES="2")
    plan = op.pytorchjob_plan(job, [], [], 0)
    pods = {o["metadata"]["name"]: o for o in plan.creates if o["kind"] == "Pod"}
    services = {o["metadata"]["name"]: o for o in plan.creates if o["kind"] == "Service"}
    assert sorted(pods) == sorted(services) == ["fsdp-worker-0", "fsdp-worker-1"]
    env = {e["name"]: e["value"] for e in pods["fsdp-worker-1"]["spec"]["containers"][0]["env"]}
    elastic = job["spec"]["elasticPolicy"]
    assert env["PET_RDZV_ENDPOINT"] == f"{elastic['rdzvHost']}:{elastic['rdzvPort']}"
    assert env["PET_NNODES"] == "2:2" and env["PET_RDZV_ID"] == elastic["rdzvId"]
    assert env["PET_NPROC_PER_NODE"] == "1" and env["PET_MAX_RESTARTS"] == str(
        elastic["maxRestarts"]
    )
    assert pods["fsdp-worker-0"]["metadata"]["labels"][op.JOB_ROLE_LABEL] == "master"
    assert op.JOB_ROLE_LABEL not in pods["fsdp-worker-1"]["metadata"]["labels"]
    ports = pods["fsdp-worker-0"]["spec"]["containers"][0]["ports"]
    assert {"name": "pytorchjob-port", "containerPort": 23456} in ports
    svc = services["fsdp-worker-1"]["spec"]
    assert svc["clusterIP"] == "None" and svc["selector"][op.REPLICA_INDEX_LABEL] == "1"
    for obj in [*pods.values(), *services.values()]:
        [ref] = obj["metadata"]["ownerReferences"]
        assert ref["controller"] and ref["blockOwnerDeletion"] and ref["uid"] == "uid-PyTorchJob"
    # the template's own labels stay (fsdpctl lists a job's pods by fsdpctl.io/job)
    assert pods["fsdp-worker-1"]["metadata"]["labels"]["fsdpctl.io/job"] == "fsdp"


OUTCOMES = st.lists(
    st.one_of(
        st.tuples(st.just("fetch"), st.sampled_from([0, 1, 2, 3, 137])),
        st.tuples(st.just("volume-prep"), st.sampled_from([1, 3])),
        st.tuples(st.just("evicted"), st.just(143)),
    ),
    max_size=7,
)


@settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck))
@given(outcomes=OUTCOMES)
def test_the_prestep_job_counts_each_ended_pod_once_and_ends_by_its_policy(outcomes):
    """The rendered pre-step Job (backoffLimit 3, podFailurePolicy: FailJob on fetch 1-2 and
    volume-prep 1, Ignore on DisruptionTarget) through the Job controller's passes, its pod ending
    each time as drawn: fetch 0 completes it; a FailJob exit fails it at once naming the container
    and code; an eviction is not counted; any other failure counts once (recorded in
    uncountedTerminatedPods, its tracking finalizer removed, then counted), and the fourth fails it
    (BackoffLimitExceeded). No pod keeps the finalizer once the job has ended."""
    job = rendered("Job")
    pods: dict[str, dict] = {}
    made = 0

    def settle() -> None:
        nonlocal made
        for _ in range(30):
            plan = op.job_plan(job, list(pods.values()), 10**9, None)
            if not (plan.creates or plan.deletes or plan.patches or plan.status):
                return
            for obj in plan.creates:
                made += 1
                obj = {**copy.deepcopy(obj), "status": {"phase": "Running"}}
                obj["metadata"] |= {"name": f"fsdp-fetch-{made}", "uid": f"p{made}"}
                pods[obj["metadata"]["name"]] = obj
            for *_, name in plan.deletes:
                pods.pop(name, None)
            for *_, name, patch in plan.patches:
                pods[name]["metadata"]["finalizers"] = patch["metadata"]["finalizers"] or []
            if plan.status is not None:
                job["status"] = plan.status
        raise AssertionError("the Job controller never settled")

    settle()
    counted = 0
    want = None
    last = ("", 0)
    for what, code in outcomes:
        if want is not None:
            break
        last = (what, code)
        [pod] = [p for p in pods.values() if not op.terminal(p)]
        container = "fetch" if what == "evicted" else what
        pod["status"] = {
            "phase": "Succeeded" if code == 0 else "Failed",
            "conditions": [{"type": "DisruptionTarget", "status": "True"}]
            if what == "evicted"
            else [],
            "containerStatuses": [{"name": container, "state": {"terminated": {"exitCode": code}}}],
        }
        counted += code != 0 and what != "evicted"
        if code == 0:
            want = ("Complete", "CompletionsReached")
        elif (what, code) in (("fetch", 1), ("fetch", 2), ("volume-prep", 1)):
            want = ("Failed", "PodFailurePolicy")
        elif counted > 3:
            want = ("Failed", "BackoffLimitExceeded")
        settle()
    status = job.get("status") or {}
    if want is None:
        assert not op.has_condition(status, "Failed") and not op.has_condition(status, "Complete")
        assert status.get("active") == 1
    else:
        cond = next(c for c in status["conditions"] if c["type"] == want[0])
        assert cond["reason"] == want[1], status
        if want[1] == "PodFailurePolicy":
            assert cond["message"].startswith(f"Container {last[0]} for pod {NS}/fsdp-fetch-")
            assert f"failed with exit code {last[1]} matching FailJob rule" in cond["message"]
        assert not any(op._tracked(p) for p in pods.values())
    assert status.get("failed", 0) == counted and not status.get("uncountedTerminatedPods")


NODE = st.fixed_dictionaries(
    {
        "type": st.sampled_from(["p5.48xlarge", "p4de.24xlarge"]),
        "tainted": st.booleans(),
        "unschedulable": st.booleans(),
    }
)
POD = st.fixed_dictionaries(
    {
        "type": st.sampled_from(["p5.48xlarge", "p4de.24xlarge", None]),
        "tolerates": st.booleans(),
        "gpus": st.integers(0, 8),
        "efa": st.sampled_from([0, 4, 32]),
        "cpu": st.sampled_from(["500m", "21", "96"]),
    }
)


@settings(max_examples=60, deadline=None)
@given(nodes=st.lists(NODE, min_size=1, max_size=3), pods=st.lists(POD, max_size=8))
def test_the_scheduler_never_overcommits_and_honours_selector_taints_and_cordons(nodes, pods):
    """Pods placed one after the other: each bound pod's node matches its nodeSelector, has no taint
    it does not tolerate and is not cordoned, and no node holds more than its allocatable of any
    resource; a pod left unbound says `0/N nodes are available` with a reason that holds for every
    node (framework.FitError)."""
    node_objs = []
    for i, n in enumerate(nodes):
        node = op.node_object(f"n{i}", n["type"])
        node["spec"]["taints"] = node["spec"]["taints"] if n["tainted"] else []
        node["spec"]["unschedulable"] = n["unschedulable"]
        node["status"] = op.node_status(node, f"10.0.0.{i}")
        node_objs.append(node)
    placed: list[dict] = []
    for i, p in enumerate(pods):
        requests = {
            "cpu": p["cpu"],
            "nvidia.com/gpu": str(p["gpus"]),
            "vpc.amazonaws.com/efa": str(p["efa"]),
        }
        pod = {
            "metadata": {"name": f"p{i}", "namespace": NS},
            "spec": {
                "nodeSelector": {"node.kubernetes.io/instance-type": p["type"]}
                if p["type"]
                else {},
                "tolerations": [
                    {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
                ]
                if p["tolerates"]
                else [],
                "containers": [{"name": "c", "resources": {"requests": requests}}],
            },
        }
        where, why = op.schedule(pod, node_objs, placed, set())
        if where is None:
            assert why.startswith(f"0/{len(nodes)} nodes are available: "), why
            continue
        pod["spec"]["nodeName"] = where
        placed.append(pod)
        node = next(n for n in node_objs if n["metadata"]["name"] == where)
        assert not node["spec"]["unschedulable"]
        assert all(
            node["metadata"]["labels"].get(k) == v for k, v in pod["spec"]["nodeSelector"].items()
        )
        assert all(op.tolerated(t, pod["spec"]["tolerations"]) for t in node["spec"]["taints"])
    for node in node_objs:
        mine = [p for p in placed if p["spec"]["nodeName"] == node["metadata"]["name"]]
        for resource, allocatable in node["status"]["allocatable"].items():
            used = sum(op.pod_requests(p).get(resource, 0) for p in mine)
            assert used <= op.quantity(allocatable), (node["metadata"]["name"], resource)


def test_the_kubelets_expansion_and_downward_api_format():
    """$(VAR) from earlier variables, $$ an escaped $, an unknown reference kept
    (third_party/forked/golang/expansion); a downward API map as sorted key="value" lines with Go's
    quoting (pkg/fieldpath FormatMap)."""
    env = {"A": "x", "B": "y"}
    assert op.expand("$(A)-$(B)-$(C)-$$(A)", env) == "x-y-$(C)-$(A)"
    assert op.format_map({"b": 'say "hi"', "a": "1"}) == 'a="1"\nb="say \\"hi\\""\n'


# ---- 2. the kubelet through the API ---------------------------------------------------------------------


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[op.Cluster]:
    """The API peer with this module's cluster and the namespace pods go in."""
    from kube_peer import Peer

    peer = Peer(tmp_path)
    c = op.Cluster(peer, tmp_path / "cluster").start()
    c.kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    try:
        yield c
    finally:
        c.close()
        peer.close()
    assert not c.errors, c.errors  # a pass that failed, or a write the API refused


TOLERATE = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]


def small_pod(name: str, code: str, **spec: Any) -> dict:
    """A pod whose container is `python -c CODE`, on the GPU nodes."""
    container = {
        "name": "main",
        "image": f"{REGISTRY}/fsdpctl-trainer:0.1.0",
        "command": ["python", "-c", code],
    }
    container |= spec.pop("container", {})
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "restartPolicy": "Never",
            "tolerations": TOLERATE,
            "containers": [container],
            **spec,
        },
    }


def pod_of(c: op.Cluster, name: str) -> dict | None:
    return c.kube.get("v1", "Pod", name, NS)


def logs(c: op.Cluster, name: str) -> str:
    return "\n".join(c.kube.logs(NS, name))


@pytest.mark.slow
def test_a_container_gets_its_secret_configmap_and_downward_api_and_its_output_is_served(cluster):
    """A pod whose env names a Secret key that is not there waits in CreateContainerConfigError
    (kubelet_pods.go makeEnvironmentVariables: `secret "tok" not found`); once the Secret exists it
    runs with the key's value, a ConfigMap's key as a file, its own name through the downward API,
    $(VAR) expanded in its args; it ends Succeeded with exit code 0 and its output is what pods/log
    serves."""
    code = (
        "import os, sys; print('token', os.environ['TOKEN']); print('pod', os.environ['ME']);"
        "print('file', open(os.environ['CFG']).read()); print('arg', sys.argv[1])"
    )
    pod = small_pod(
        "reader",
        code,
        container={
            "args": ["$(GREETING)-there"],
            "env": [
                {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "tok", "key": "t"}}},
                {"name": "ME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                {"name": "CFG", "value": "/etc/cfg/greeting"},
                {"name": "GREETING", "value": "hello"},
            ],
            "volumeMounts": [{"name": "cfg", "mountPath": "/etc/cfg"}],
        },
        volumes=[{"name": "cfg", "configMap": {"name": "settings"}}],
    )
    cluster.kube.apply(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "settings", "namespace": NS},
            "data": {"greeting": "hi from a file"},
        }
    )
    cluster.kube.create(pod)

    def waiting() -> str:
        found = pod_of(cluster, "reader") or {}
        [cs] = (found.get("status") or {}).get("containerStatuses") or [{}]
        return ((cs.get("state") or {}).get("waiting") or {}).get("reason", "")

    until("the config error", lambda: waiting() == "CreateContainerConfigError")
    [cs] = pod_of(cluster, "reader")["status"]["containerStatuses"]
    assert cs["state"]["waiting"]["message"] == 'secret "tok" not found'
    cluster.kube.apply(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "tok", "namespace": NS},
            "stringData": {"t": "s3"},
        }
    )
    done = until("the pod's end", lambda: op.terminal(p := pod_of(cluster, "reader") or {}) and p)
    assert done["status"]["phase"] == "Succeeded", done["status"]
    [cs] = done["status"]["containerStatuses"]
    assert (
        cs["state"]["terminated"]["exitCode"] == 0
        and cs["state"]["terminated"]["reason"] == "Completed"
    )
    assert done["spec"]["nodeName"] in cluster.node_names
    out = until("its log", lambda: "arg" in (text := logs(cluster, "reader")) and text)
    assert out.splitlines() == ["token s3", "pod reader", "file hi from a file", "arg hello-there"]


@pytest.mark.slow
def test_the_stop_annotation_reaches_the_downward_api_file(cluster):
    """A running pod's downward API file holds its annotations (fieldRef metadata.annotations) and is
    rewritten when they change: the pod waits for `fsdpctl.io/stop`, which fsdpctl's `job stop`
    merge-patches onto it, sees it and exits 0 (the trainer's way, fsdptrain.disruption: it finds
    the file through its environment, FSDPTRAIN_STOP_FILE, whose path the kubelet here maps)."""
    code = (
        "import os, time\n"
        "while True:\n"
        "    text = open(os.environ['INFO']).read()\n"
        "    if 'fsdpctl.io/stop' in text:\n"
        "        print(text, end=''); break\n"
        "    print('waiting', flush=True); time.sleep(0.1)\n"
    )
    pod = small_pod(
        "stopper",
        code,
        container={
            "env": [{"name": "INFO", "value": "/etc/podinfo/annotations"}],
            "volumeMounts": [{"name": "podinfo", "mountPath": "/etc/podinfo"}],
        },
        volumes=[
            {
                "name": "podinfo",
                "downwardAPI": {
                    "items": [
                        {"path": "annotations", "fieldRef": {"fieldPath": "metadata.annotations"}}
                    ]
                },
            }
        ],
    )
    pod["metadata"]["annotations"] = {"a": "1"}
    cluster.kube.create(pod)
    until("it runs", lambda: "waiting" in logs(cluster, "stopper"))
    stamp = {"metadata": {"annotations": {"fsdpctl.io/stop": "2026-01-01T00:00:00Z"}}}
    cluster.kube.merge_patch("v1", "Pod", "stopper", NS, stamp)
    done = until("its end", lambda: op.terminal(p := pod_of(cluster, "stopper") or {}) and p)
    assert done["status"]["phase"] == "Succeeded"
    lines = until("its log", lambda: "a=" in (t := logs(cluster, "stopper")) and t).splitlines()
    assert lines[-2:] == ['a="1"', 'fsdpctl.io/stop="2026-01-01T00:00:00Z"']


@pytest.mark.slow
@pytest.mark.parametrize("how", ["delete", "evict"])
def test_a_deleted_or_evicted_pod_gets_sigterm_then_sigkill_after_its_grace(cluster, how):
    """A container that ignores SIGTERM, deleted (DELETE, the grace period of its spec) or evicted
    (pods/eviction: DisruptionTarget, then the same deletion): it gets SIGTERM at once, SIGKILL
    once terminationGracePeriodSeconds (3) has passed, and the pod is gone from the API after that,
    not before; none of its processes is left."""
    code = (
        "import signal, time\n"
        "signal.signal(signal.SIGTERM, lambda *a: print('TERM', flush=True))\n"
        "print('up', flush=True)\n"
        "time.sleep(600)\n"
    )
    cluster.kube.create(small_pod("stubborn", code, terminationGracePeriodSeconds=3))
    until("it runs", lambda: "up" in logs(cluster, "stubborn"))
    [pid] = cluster.processes(NS, "stubborn")
    began = time.monotonic()
    if how == "delete":
        cluster.kube.delete("v1", "Pod", "stubborn", NS, propagation="Background")
    else:
        path = cluster.kube.path("v1", "Pod", NS, "stubborn", "eviction")
        body = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": "stubborn", "namespace": NS},
        }
        cluster.kube.request("POST", path, body=body)
    until("its SIGTERM", lambda: "TERM" in logs(cluster, "stubborn"))
    until("the pod gone", lambda: pod_of(cluster, "stubborn") is None, timeout=60)
    assert time.monotonic() - began >= 3
    assert not Path(f"/proc/{pid}").exists() or _zombie(pid)


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] == "Z"
    except OSError:
        return True


def test_an_unschedulable_pod_says_why_in_the_schedulers_words(cluster):
    """A pod that tolerates no taint, on the cluster's two tainted GPU nodes: PodScheduled False,
    Unschedulable, `0/2 nodes are available: 2 node(s) had untolerated taint {nvidia.com/gpu:
    true}` (TaintToleration's reason, FitError's form), which `job status` shows."""
    pod = small_pod("nowhere", "print(1)")
    pod["spec"].pop("tolerations")
    cluster.kube.create(pod)

    def said() -> str:
        found = pod_of(cluster, "nowhere") or {}
        conds = (found.get("status") or {}).get("conditions") or []
        return next((c["message"] for c in conds if c["type"] == "PodScheduled"), "")

    why = until("the scheduler's answer", said)
    assert why.startswith(
        "0/2 nodes are available: 2 node(s) had untolerated taint {nvidia.com/gpu: true}"
    )
    assert kstatus.scheduling_problems([pod_of(cluster, "nowhere")], {}) == [
        f"nowhere: Unschedulable: {why}"
    ]


# ---- 3. fsdpctl's EKS backend on it, against the local backend ------------------------------------------

TINY = {
    "MODEL": "tiny",
    "SEQ_LEN": "64",
    "MAX_STEPS": "6",
    "WARMUP_STEPS": "2",
    "CHECKPOINT_INTERVAL": "3",
    "PRECISION": "fp32",
    "MAX_RESTARTS": "1",
}
EKS = {"BACKEND": "eks", "IMAGE_REGISTRY": REGISTRY, "GPUS_PER_NODE": "1"}
LOCAL = {"BACKEND": "local", "LOCAL_PROCS_PER_NODE": "1"}


class Bench:
    """fsdpctl as from another terminal (its own home, no settings of this machine's), against the
    API peer with its cluster (`deploy operator` applied, the shared claim there) and on the local
    backend."""

    def __init__(self, root: Path):
        from kube_peer import Peer

        self.root = root
        self.peer = Peer(root)
        self.cluster = op.Cluster(self.peer, root / "cluster").start()
        keys = set(setting_keys())
        base = {
            k: v for k, v in os.environ.items() if k not in keys and not k.startswith("FSDPCTL_")
        }
        keep = {
            k: v for k, v in os.environ.items() if k.startswith(("FSDPCTL_SHARED", "FSDPCTL_TEST_"))
        }
        (root / "home").mkdir()
        self.base = {
            **base,
            **keep,
            "FSDPCTL_HOME": str(root / "home"),
            "XDG_STATE_HOME": str(root / "state"),
            "KUBECONFIG": str(self.peer.kubeconfig),
            "FSDPCTL_MANIFESTS": str(VENDOR),
            "FSDPCTL_LOCAL_NETNS": "0",
            "NO_COLOR": "1",
            "COLUMNS": "200",
        }
        r = self.run("deploy", "operator", "--timeout", "60", **EKS)
        assert r.returncode == 0, r.stdout + r.stderr
        k = self.cluster.kube
        k.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
        claim = {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": "fsx-claim", "namespace": NS},
            "spec": {
                "accessModes": ["ReadWriteMany"],
                "resources": {"requests": {"storage": "1200Gi"}},
            },
        }
        k.apply(claim)

    def run(
        self, *args: str, timeout: float = 600, **settings: str
    ) -> subprocess.CompletedProcess[str]:
        return fsdpctl_process(
            *args, env={**self.base, **prefixed(settings)}, timeout=scale(timeout)
        )

    def close(self) -> None:
        self.cluster.close()
        self.peer.close()

    def leader_lines(self, job: str) -> list[str]:
        """The leader pod's log as the API serves it (what `job logs` reads)."""
        return list(self.cluster.kube.logs(NS, f"{job}-worker-0", "pytorch"))

    def local_losses(self, job: str) -> dict[int, float]:
        from fsdpctl.job import crilog

        logs = sorted((self.root / "home" / "jobs" / job / "logs").glob("*/node-*.log"))
        return record.losses([line for p in logs for line in crilog.texts(p)])


@pytest.fixture(scope="module")
def bench(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bench]:
    b = Bench(tmp_path_factory.mktemp("bench"))
    try:
        yield b
    finally:
        b.close()
    assert not b.cluster.errors, b.cluster.errors  # a pass that failed, or a write refused


def _trained(b: Bench, job: str, backend: dict, **settings: str) -> float:
    began = time.monotonic()
    r = b.run("job", "run", **{**backend, **TINY, **settings, "JOB_NAME": job})
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return time.monotonic() - began


@pytest.mark.slow
@pytest.mark.parametrize("nodes", ["1", "2"])
def test_a_job_trains_on_the_cluster_with_the_local_backends_losses(bench, nodes):
    """`fsdpctl job run` (followed to its end) of the tiny model on JOB_NODES pods, one trainer
    process each: it ends Succeeded at MAX_STEPS and its leader's log has every step's loss equal,
    to the bit, to the local backend's run of the same settings (same world, same data, same threads
    per process). Each pod is Succeeded and kept with its headless Service, or, where another
    worker's success was seen while it still ran, deleted with its Service after the job's
    Succeeded (elastic: any worker's success ends the job, and cleanPodPolicy Running deletes the
    pods still running: pytorchjob_controller.go UpdateJobStatus, common/job.go
    DeletePodsAndServices). `job status` reads the step from the leader while its pod is there."""
    job = f"train-{nodes}"
    took = {
        "eks": _trained(bench, job, EKS, JOB_NODES=nodes),
        "local": _trained(bench, f"{job}-local", LOCAL, JOB_NODES=nodes),
    }
    print(
        f"\n{nodes}-node tiny job wall time: eks {took['eks']:.1f} s, local {took['local']:.1f} s"
    )
    [leader_log] = bench.cluster.node_logs(NS, f"{job}-worker-0", "pytorch")
    eks = record.losses(leader_log.splitlines())
    assert sorted(eks) == list(range(1, 7)), eks
    assert eks == bench.local_losses(f"{job}-local")
    listed = bench.cluster.kube.list("v1", "Pod", NS, {op.JOB_NAME_LABEL: job})
    kept = {p["metadata"]["name"]: p for p in listed}
    assert {p["status"]["phase"] for p in kept.values()} == {"Succeeded"}
    done_at = min(
        rv
        for rv, j in versions(bench, ("kubeflow.org", "pytorchjobs", NS, job), with_rv=True)
        if op.has_condition(j["status"], "Succeeded")
    )
    for i in range(int(nodes)):
        name = f"{job}-worker-{i}"
        if name not in kept:
            pod_versions = versions(bench, ("", "pods", NS, name), with_rv=True)
            deleted = [rv for rv, p in pod_versions if op.deleting(p)]
            assert deleted and min(deleted) > done_at, name
    print(f"pods kept after the job: {sorted(kept)}")
    services = bench.cluster.kube.list("v1", "Service", NS, {op.JOB_NAME_LABEL: job})
    assert sorted(s["metadata"]["name"] for s in services) == sorted(kept)
    status = json.loads(bench.run("job", "status", job, "-o", "json", JOB_NAME=job, **EKS).stdout)
    assert status["phase"] == "Succeeded" and status["nodes"] == int(nodes)
    if f"{job}-worker-0" in kept:
        assert status["step"] == 6 and record.losses(bench.leader_lines(job)) == eks


LONG = {"MAX_STEPS": "300", "CHECKPOINT_INTERVAL": "50", "MAX_RESTARTS": "1"}


@pytest.fixture(scope="module")
def reference(bench: Bench) -> dict[int, float]:
    """An uninterrupted 1-node run of LONG on the local backend: the losses a stopped or killed
    run must continue with."""
    _trained(bench, "ref", LOCAL, JOB_NODES="1", **LONG)
    losses = bench.local_losses("ref")
    assert sorted(losses) == list(range(1, 301))
    return losses


def versions(b: Bench, key: tuple[str, str, str, str], with_rv: bool = False) -> list[Any]:
    """Every version of one object the API stored, oldest first (the peer's event history, as a
    watch from the start sees it); with `with_rv`, each as (resourceVersion, object)."""
    store = b.peer.api.store

    def grab() -> list[Any]:
        found = [(rv, json.loads(json.dumps(c))) for rv, k, c, _ in store.history if k == key and c]
        return found if with_rv else [o for _, o in found]

    return b.peer.call(grab)


def _step_seen(b: Bench, job: str, pod: str, step: int) -> bool:
    try:
        seen = record.losses(list(b.cluster.kube.logs(NS, pod, "pytorch")))
    except Exception:  # noqa: BLE001 - not started yet
        return False
    return max(seen, default=0) >= step


@pytest.mark.slow
def test_a_stopped_job_resumes_with_the_losses_of_a_run_never_stopped(bench, reference):
    """`job stop` of a running job: the stop annotation reaches the trainer through its downward API
    file, it saves at the step it is on and exits 0, the job is deleted (foreground) once its pod
    ended, and the checkpoint is `latest` on the claim; `job resume` starts a new run from it
    (RESUME=auto, the run record's settings), which trains to MAX_STEPS with, from the step after
    the stop, exactly the losses of the uninterrupted run."""
    job = "pausing"
    r = bench.run("job", "run", "-d", **{**EKS, **TINY, **LONG, "JOB_NAME": job, "JOB_NODES": "1"})
    assert r.returncode == 0, r.stderr
    until("step 20", lambda: _step_seen(bench, job, f"{job}-worker-0", 20), timeout=240)
    began = time.monotonic()
    stop = bench.run("job", "stop", job, JOB_NAME=job, **EKS)
    took = time.monotonic() - began
    assert stop.returncode == 0, stop.stdout + stop.stderr
    assert bench.peer.objects("pytorchjobs") == [] or all(
        o["metadata"]["name"] != job for o in bench.peer.objects("pytorchjobs")
    )
    [first_run] = bench.cluster.node_logs(NS, f"{job}-worker-0", "pytorch")
    assert "stop requested (fsdpctl job stop): stopped at step" in first_run
    ckpts = bench.cluster.root / "volumes" / NS / "fsx-claim" / "checkpoints" / job
    latest = (ckpts / "latest").read_text().strip()
    stopped_at = int(latest.rpartition("-")[2])
    assert 20 <= stopped_at < 300 and (ckpts / latest / "meta.json").is_file(), latest
    print(f"\njob stop took {took:.1f} s (stopped at step {stopped_at})")
    resumed = bench.run("job", "resume", job, JOB_NAME=job, **EKS)
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    lines = bench.leader_lines(job)
    start = next(e for e in events.parse(lines) if isinstance(e, events.Start))
    assert start.start_step == stopped_at
    losses = record.losses(lines)
    assert sorted(losses) == list(range(stopped_at + 1, 301))
    assert losses == {s: reference[s] for s in losses}


@pytest.mark.slow
def test_a_killed_pod_is_recreated_and_the_job_resumes(bench, reference):
    """SIGKILL to every process of the running pod (a node lost): its container ends with 137, the
    pod Failed; the operator deletes it and makes `<job>-worker-0` again (IsRetryableExitCode), the
    job Restarting meanwhile; the new pod resumes from the last periodic checkpoint on the claim and
    trains to MAX_STEPS Succeeded, with the uninterrupted run's losses."""
    job = "killed"
    r = bench.run("job", "run", "-d", **{**EKS, **TINY, **LONG, "JOB_NAME": job, "JOB_NODES": "1"})
    assert r.returncode == 0, r.stderr
    pod = f"{job}-worker-0"
    until("step 60", lambda: _step_seen(bench, job, pod, 60), timeout=240)
    first = pod_of(bench.cluster, pod)["metadata"]["uid"]
    assert bench.cluster.kill(NS, pod) > 0
    waited = bench.run("job", "wait", job, "--timeout", "400", JOB_NAME=job, **EKS)
    assert waited.returncode == 0, waited.stdout + waited.stderr
    # every version of the job and of its pods the API stored, as a watch from the start saw them
    jobs, pods = (
        versions(bench, ("kubeflow.org", "pytorchjobs", NS, job)),
        versions(bench, ("", "pods", NS, pod)),
    )
    assert "Restarting" in [kstatus.phase(j) for j in jobs]
    ended = [p for p in pods if p["metadata"]["uid"] == first and p["status"]["phase"] == "Failed"]
    [cs] = ended[-1]["status"]["containerStatuses"]
    assert cs["state"]["terminated"]["exitCode"] == 128 + 9
    assert pod_of(bench.cluster, pod)["metadata"]["uid"] != first
    job_obj = bench.cluster.kube.get("kubeflow.org/v1", "PyTorchJob", job, NS)
    assert kstatus.phase(job_obj) == "Succeeded"
    lines = bench.leader_lines(job)
    losses = record.losses(lines)
    resumed_from = min(losses) - 1
    assert resumed_from >= 50 and resumed_from % 50 == 0, resumed_from
    assert max(losses) == 300 and losses == {s: reference[s] for s in losses}

"""The job's PodDisruptionBudget refuses voluntary disruption while the job runs (issue 36, S5).

The old budget (minAvailable JOB_NODES-1) let a drain evict one pod; the other nodes then waited
RDZV_JOIN_TIMEOUT (600 s) for a replacement p5, which rarely boots, joins and pulls a ~20 GB image in
that time, and the job failed about ten minutes after the drain. Now every pod of a running job is
needed (minAvailable JOB_NODES) and a pod that runs but is not Ready never holds a drain
(unhealthyPodEvictionPolicy AlwaysAllow): a drain waits until `fsdpctl job stop` has checkpointed and
ended the job, whose finished pods the eviction API lets go without a look at any budget. With an
elastic range (MIN_NODES, issue 43) the budget is at the minimum instead, and a drain takes
JOB_NODES - MIN_NODES Ready pods: tests/test_elastic_eks.py holds it to the same rules.

Peers: the rendered budget against the real Kubernetes 1.33 schema (kubernetes-validate, strict); the
Kubernetes API peer (tests/kube_peer.py) with its eviction subresource and disruption controller
(tests/kube_peer_disruption.py, after kubernetes pkg/registry/core/pod/storage/eviction.go and
pkg/controller/disruption/disruption.go), reached by the real `kubernetes` client, and by the real
`kubectl drain` (k8s.io/kubectl pkg/drain: it cordons the node, evicts through policy/v1 and retries a
429 every 5 s until its --timeout); its kubelet (tests/kube_peer_kubelet.py) ends the pods on `job
stop` as the trainer would."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kube_peer_disruption as rules
from fsdpctl.job import render
from fsdpctl.settings import load
from kube_peer import wait_for
from test_kube import cli, install_operator, peer  # noqa: F401 (the fixture)

EKS = {"BACKEND": "eks", "AWS_ACCOUNT_ID": "123456789012", "INSTANCE_TYPE": "p5.48xlarge"}
STATES = ("ready", "unready", "pending", "succeeded", "failed", "terminating")


def _budget_and_template(nodes: int, kind: str) -> tuple[dict, dict]:
    """The rendered budget, and the metadata of the worker pods it must select (the pods' own
    labels, as the operator copies them from the template)."""
    cfg = load(dotenv={**EKS, "JOB_NODES": str(nodes), "NODE_COUNT": str(nodes), "JOB_KIND": kind})
    objs = render.render_job(cfg, "run-1")
    [budget] = [o for o in objs if o["kind"] == "PodDisruptionBudget"]
    job = objs[-1]
    if kind == "pytorchjob":
        template = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]
    else:
        [patch] = job["spec"]["runtimePatches"]
        [replicated] = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
        template = replicated["template"]["spec"]["template"]
    return budget, template


def _pod(i: int, state: str, template: dict, namespace: str = "fsdp") -> dict:
    phase = {"pending": "Pending", "succeeded": "Succeeded", "failed": "Failed"}.get(
        state, "Running"
    )
    meta = {
        "name": f"w-{i}",
        "namespace": namespace,
        "labels": dict(template["metadata"]["labels"]),
    }
    if state == "terminating":
        meta["deletionTimestamp"] = "2026-12-06T10:00:00Z"
    ready = "True" if state in ("ready", "terminating") else "False"
    return {
        "metadata": meta,
        "status": {"phase": phase, "conditions": [{"type": "Ready", "status": ready}]},
    }


@pytest.mark.parametrize("kind", ["pytorchjob", "trainjob"])
def test_the_budget_needs_every_pod_and_lets_unhealthy_ones_go(kind):
    """minAvailable JOB_NODES, an integer (the disruption controller counts the pods its selector
    finds, getExpectedPodCount, whatever their controller), AlwaysAllow for pods that are not Ready,
    and the pods' own labels as the selector; a valid policy/v1 object on Kubernetes 1.33."""
    from fsdpctl.job.validate import validate

    budget, template = _budget_and_template(16, kind)
    assert budget["apiVersion"] == "policy/v1" and budget["spec"]["minAvailable"] == 16
    assert budget["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    assert "maxUnavailable" not in budget["spec"]
    assert (
        budget["spec"]["selector"]["matchLabels"].items() <= template["metadata"]["labels"].items()
    )
    assert validate([budget], {}) == []


@settings(max_examples=80, deadline=None, derandomize=True)
@given(
    nodes=st.integers(1, 32),
    kind=st.sampled_from(["pytorchjob", "trainjob"]),
    data=st.data(),
)
def test_no_ready_pod_of_a_running_job_can_be_evicted(nodes, kind, data):
    """Over job sizes, job kinds and every mix of pod states, evictions tried in any order under the
    eviction API's rules: a Ready pod of the job is never evicted while it runs (429 with the budget's
    DisruptionBudget cause naming how many healthy pods it needs), whatever else has gone; a pod that
    runs unready, is Pending, has finished or is already being deleted always goes. So a drain never
    takes a healthy node out of a running job, and never waits on a broken pod."""
    budget, template = _budget_and_template(nodes, kind)
    states = data.draw(st.lists(st.sampled_from(STATES), min_size=nodes, max_size=nodes))
    pods = [_pod(i, s, template) for i, s in enumerate(states)]
    order = data.draw(st.permutations(range(nodes)))
    for i in order:
        refusal = rules.eviction(pods[i], [budget], pods)
        if states[i] == "ready":
            assert refusal is not None and refusal.code == 429, states
            assert refusal.message == rules.TOO_MANY
            [cause] = refusal.causes
            assert f"needs {nodes} healthy pods" in cause["message"]
        else:
            assert refusal is None, (states[i], refusal)
            pods[i]["metadata"]["deletionTimestamp"] = "2026-12-06T10:00:00Z"  # on its way out


def test_the_old_budget_let_a_drain_take_a_healthy_node():
    """The rules can say yes to a healthy pod: under the old minAvailable JOB_NODES-1 a drain
    evicted one Ready pod of a running 16-node job, and refused the next."""
    budget, template = _budget_and_template(16, "pytorchjob")
    budget["spec"]["minAvailable"] = 15
    pods = [_pod(i, "ready", template) for i in range(16)]
    assert rules.eviction(pods[0], [budget], pods) is None
    pods[0]["metadata"]["deletionTimestamp"] = "2026-12-06T10:00:00Z"
    assert rules.eviction(pods[1], [budget], pods) is not None


def test_the_peers_eviction_rules_answer_as_eviction_go_does():
    """The peer's own rules on the cases the job's budget does not reach: no budget, a plain delete;
    two budgets over one pod, a 500 (EvictionREST.Create); a budget whose status needs a
    controller's scale (maxUnavailable, or a percentage) the controller could not compute, 429
    "still being processed" (checkAndDecrement, ObservedGeneration < Generation); the default
    IfHealthyBudget lets an unready pod go only while the budget is met."""
    budget, template = _budget_and_template(2, "pytorchjob")
    pods = [_pod(0, "ready", template), _pod(1, "unready", template)]
    assert rules.eviction(pods[0], [], pods) is None
    twice = rules.eviction(pods[0], [budget, budget], pods)
    assert twice is not None and twice.code == 500 and twice.message == rules.MANY_BUDGETS
    scaled = {**budget, "spec": {**budget["spec"], "maxUnavailable": 1}}
    del scaled["spec"]["minAvailable"]
    pending = rules.eviction(pods[0], [scaled], pods)
    assert pending is not None and "still being processed" in pending.causes[0]["message"]
    default = {**budget, "spec": {**budget["spec"], "minAvailable": 1}}
    del default["spec"]["unhealthyPodEvictionPolicy"]
    assert rules.eviction(pods[1], [default], pods) is None  # 1 healthy of 1 desired: met
    default["spec"]["minAvailable"] = 2
    assert rules.eviction(pods[1], [default], pods) is not None  # short of healthy pods: kept


def _worker_pods(api, k, nodes: int) -> list[str]:
    """What the Training Operator and the kubelet would make of the PyTorchJob: its Worker pods,
    owned by it (controller), on nodes n0.., Running and Ready."""
    [job] = api.objects("pytorchjobs")
    template = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]
    owner = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "name": job["metadata"]["name"],
        "uid": job["metadata"]["uid"],
        "controller": True,
    }
    names = []
    for i in range(nodes):
        name = f"fsdp-worker-{i}"
        meta = {"name": name, "namespace": "fsdp", "labels": template["metadata"]["labels"]}
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {**meta, "ownerReferences": [owner]},
            "spec": {
                "nodeName": f"n{i}",
                "terminationGracePeriodSeconds": 30,
                "containers": [{"name": "pytorch", "image": "x"}],
                "volumes": [{"name": "shm", "emptyDir": {"medium": "Memory"}}],
            },
        }
        k.create(pod)
        status = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
        k.request(
            "PATCH",
            f"/api/v1/namespaces/fsdp/pods/{name}/status",
            content_type="application/merge-patch+json",
            body={"status": status},
        )
        names.append(name)
    return names


def _evict(core, name: str):
    """One eviction through the real client (policy/v1 Eviction on pods/NAME/eviction): None when
    the pod was evicted, else the API's refusal (status, body)."""
    from kubernetes.client import V1DeleteOptions, V1Eviction, V1ObjectMeta
    from kubernetes.client.exceptions import ApiException

    body = V1Eviction(
        metadata=V1ObjectMeta(name=name, namespace="fsdp"), delete_options=V1DeleteOptions()
    )
    try:
        core.create_namespaced_pod_eviction(name, "fsdp", body)
    except ApiException as e:
        return e.status, json.loads(e.body)
    return None


def test_a_running_job_refuses_every_eviction_until_it_is_stopped(peer):  # noqa: F811
    """Through the API peer, as a drain would ask: `job run` creates the budget owned by the job;
    every Ready worker's eviction is 429 with the DisruptionBudget cause; a worker that runs but is
    not Ready (crash-looping) is evicted at once, marked DisruptionTarget as the API server marks it;
    `job stop` asks the trainers (the peer's kubelet ends each pod as the trainer does, exit 0) and
    deletes the job, whose budget goes with it, and nothing is left to refuse a drain."""
    from kubernetes import client, config

    from test_kube import kube

    install_operator(peer)
    assert cli("job", "run", "-d", JOB_NODES="4", NODE_COUNT="4").exit_code == 0
    [budget] = peer.objects("poddisruptionbudgets")
    assert budget["spec"]["minAvailable"] == 4
    assert [o["kind"] for o in budget["metadata"]["ownerReferences"]] == ["PyTorchJob"]
    k = kube(peer)
    names = _worker_pods(peer, k, 4)
    core = client.CoreV1Api(config.new_client_from_config(str(peer.kubeconfig)))
    for name in names:
        refused = _evict(core, name)
        assert refused is not None, name
        code, body = refused
        assert code == 429 and body["reason"] == "TooManyRequests"
        assert body["message"] == rules.TOO_MANY
        [cause] = body["details"]["causes"]
        assert cause == {
            "type": "DisruptionBudget",
            "message": "The disruption budget fsdp needs 4 healthy pods and has 4 currently",
        }
    k.request(
        "PATCH",
        f"/api/v1/namespaces/fsdp/pods/{names[3]}/status",
        content_type="application/merge-patch+json",
        body={"status": {"conditions": [{"type": "Ready", "status": "False"}]}},
    )
    assert _evict(core, names[3]) is None
    [gone] = [p for p in peer.objects("pods") if p["metadata"]["name"] == names[3]]
    assert gone["metadata"]["deletionTimestamp"]
    assert any(c["type"] == "DisruptionTarget" for c in gone["status"]["conditions"])
    assert _evict(core, names[0])[0] == 429  # the others still hold

    r = cli("job", "stop")
    assert r.exit_code == 0, r.output
    wait_for(lambda: not peer.objects("poddisruptionbudgets"))
    for name in names[:3]:  # finished (the eviction API lets them go) or already collected
        outcome = _evict(core, name)
        assert outcome is None or outcome[0] == 404, outcome


@pytest.mark.slow
@pytest.mark.skipif(not shutil.which("kubectl"), reason="kubectl is not installed")
def test_kubectl_drain_waits_for_the_job_and_finishes_once_it_is_stopped(peer, tmp_path):  # noqa: F811
    """The real `kubectl drain` against the API peer: it cordons the node, finds the worker pod on
    it, evicts through policy/v1 and gets 429 from the budget, says so ("Cannot evict pod as it
    would violate the pod's disruption budget") and retries until its --timeout, leaving the pod
    running and the node cordoned. After `fsdpctl job stop` the same drain completes: the stopped
    job's pods are gone or finished, and finished pods are evicted without a look at any budget."""
    from test_kube import kube

    install_operator(peer)
    assert cli("job", "run", "-d", JOB_NODES="2").exit_code == 0
    k = kube(peer)
    for i in range(2):
        k.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": f"n{i}"}})
    names = _worker_pods(peer, k, 2)
    env = {"KUBECONFIG": str(peer.kubeconfig), "HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    drain = [
        "kubectl",
        "drain",
        "n0",
        "--ignore-daemonsets",
        "--delete-emptydir-data",
        "--timeout=7s",
    ]
    held = subprocess.run(drain, env=env, capture_output=True, text=True, timeout=120)
    assert held.returncode != 0, held.stdout + held.stderr
    assert "Cannot evict pod as it would violate the pod's disruption budget" in held.stderr
    assert f'error when evicting pods/"{names[0]}" -n "fsdp" (will retry after 5s)' in held.stderr
    [node] = [n for n in peer.objects("nodes") if n["metadata"]["name"] == "n0"]
    assert node["spec"]["unschedulable"] is True
    assert {p["metadata"]["name"] for p in peer.objects("pods")} >= set(names)

    assert cli("job", "stop").exit_code == 0
    done = subprocess.run(drain, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "node/n0 drained" in done.stdout

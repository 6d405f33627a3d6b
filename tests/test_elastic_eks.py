"""Issue 43 on EKS: the elastic range (MIN_NODES..JOB_NODES) on the PyTorchJob, a rendezvous no
worker hosts, the PodDisruptionBudget at the minimum, TrainJob refused.

Upstream, as each test names it:
- Training Operator v1.9.4 (kubeflow/trainer tag v1.9.4): elasticPolicy minReplicas/maxReplicas
  become PET_NNODES=min:max and rdzvHost:rdzvPort PET_RDZV_ENDPOINT (pkg/controller.v1/pytorch/
  elastic.go), a pod killed by a signal (exit 128-255) is made again under restartPolicy ExitCode
  (pkg/util/train/train_util.go IsRetryableExitCode), and with an elasticPolicy one Worker's
  success ends the job (pytorchjob_controller.go UpdateJobStatus); the CRD's schema in
  ../shared/vendor/kubeflow-training-operator-v1.9.4.
- torch 2.13 (this venv): torchrun takes --nnodes=MIN:MAX (torch/distributed/run.py); the c10d
  store is hosted by the agent whose hostname matches the endpoint
  (elastic/rendezvous/c10d_rendezvous_backend.py _create_tcp_store), the etcd-v2 backend keeps the
  rendezvous in etcd (etcd_rendezvous_backend.py) and drops dead nodes by their heartbeats
  (dynamic_rendezvous.py).
- Kubeflow Trainer v2.3.0: the torch policy of a runtime has no elasticPolicy (the vendored
  trainer.kubeflow.org_clustertrainingruntimes.yaml, mlPolicy.torch holds envInjection only).
- Kubernetes v1.33 eviction and disruption controller: tests/kube_peer_disruption.py.

Peers: the vendored CRD schemas (strict), the operator's passes of tests/kube_peer_operator.py
(its v1.9.4 rules) over simulated pods, the eviction rules of tests/kube_peer_disruption.py, and
the Kubernetes API peer (tests/kube_peer.py) that `fsdpctl job run` talks to through the real
`kubernetes` client."""

from __future__ import annotations

import copy
import functools
import inspect
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kube_peer_disruption as rules
import kube_peer_operator as op
from conftest import SHARED, yaml_docs
from fsdpctl.job import render
from fsdpctl.job.validate import crd_schemas, validate
from fsdpctl.settings import load
from fsdpctl.settings.checks import elastic_refusal
from test_kube import cli, install_operator, peer  # noqa: F401 (the fixture)
from test_kube_peer_operator import Sim

VENDOR = SHARED / "vendor"
CRD = VENDOR / "kubeflow-training-operator-v1.9.4" / "kubeflow.org_pytorchjobs.yaml"
RUNTIMES_CRD = (
    VENDOR / "kubeflow-trainer-v2.3.0" / "trainer.kubeflow.org_clustertrainingruntimes.yaml"
)
EKS = {
    "BACKEND": "eks",
    "AWS_ACCOUNT_ID": "123456789012",
    "INSTANCE_TYPE": "p5.48xlarge",
    "RDZV_BACKEND": "etcd-v2",
}
READY = "ready"
STATES = (READY, "unready", "pending", "succeeded", "failed", "terminating")


def elastic(nodes: int, low: int, **more: str):
    return load(
        dotenv={
            **EKS,
            "JOB_NODES": str(nodes),
            "NODE_COUNT": str(nodes),
            "MIN_NODES": str(low),
            **more,
        }
    )


def _objs(nodes: int, low: int, **more: str) -> dict[str, dict]:
    return {o["kind"]: o for o in render.render_job(elastic(nodes, low, **more), "run-1")}


@functools.cache
def schemas() -> dict:
    return crd_schemas(list(yaml_docs(CRD)))


@settings(max_examples=12, deadline=None, derandomize=True)
@given(nodes=st.integers(1, 32), data=st.data(), gang=st.booleans())
def test_the_range_is_the_pytorchjobs_and_the_budget_is_at_its_minimum(nodes, data, gang):
    """For every range (MIN_NODES 0 = none): the PyTorchJob validates against the v1.9.4 CRD; its
    elasticPolicy says minReplicas MIN, maxReplicas JOB_NODES (PET_NNODES min:max, elastic.go) and
    the container's torchrun the same --nnodes, which torchrun takes over the environment; the
    rendezvous is etcd-v2 on the namespace's etcd Service (no worker hosts it), the gang's and the
    budget's minAvailable are the minimum, and settings admit it on EKS."""
    low = data.draw(st.integers(0, nodes))
    gang_settings = {"GANG_SCHEDULING": "true", "SCHEDULER_NAME": "volcano"} if gang else {}
    objs = _objs(nodes, low, **gang_settings)
    want = low or nodes
    job = objs["PyTorchJob"]
    assert validate([job], schemas()) == []
    policy = job["spec"]["elasticPolicy"]
    assert (policy["minReplicas"], policy["maxReplicas"]) == (want, nodes)
    assert job["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == nodes
    [container] = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"]
    flags = [a for a in container["command"] if a.startswith("--nnodes=")]
    assert flags == [f"--nnodes={want}:{nodes}" if want < nodes else f"--nnodes={nodes}"]
    assert f"--rdzv-endpoint={policy['rdzvHost']}:{policy['rdzvPort']}" in container["command"]
    assert policy["rdzvHost"] == objs["Service"]["metadata"]["name"] == "etcd"
    assert objs["Deployment"]["metadata"]["name"] == "etcd"
    assert objs["PodDisruptionBudget"]["spec"]["minAvailable"] == want
    if gang:
        assert job["spec"]["runPolicy"]["schedulingPolicy"]["minAvailable"] == want
    assert elastic_refusal(elastic(nodes, low)) is None


@settings(max_examples=20, deadline=None, derandomize=True)
@given(nodes=st.integers(2, 16), data=st.data())
def test_a_range_with_c10d_or_a_trainjob_is_refused_in_one_line(nodes, data):
    """c10d would put the store in worker-0's agent (c10d_rendezvous_backend.py), so node 0 would
    be special: refused, naming RDZV_BACKEND=etcd-v2. A TrainJob has no range in Trainer v2.3:
    refused, naming JOB_KIND=pytorchjob. Each line names MIN_NODES and its value and ends with the
    fix; without a range neither is refused."""
    low = data.draw(st.integers(1, nodes - 1))
    c10d = elastic_refusal(elastic(nodes, low, RDZV_BACKEND="c10d"))
    assert c10d is not None and c10d.startswith(f"MIN_NODES={low} with RDZV_BACKEND=c10d")
    assert "set RDZV_BACKEND=etcd-v2" in c10d and "\n" not in c10d
    trainjob = elastic_refusal(elastic(nodes, low, JOB_KIND="trainjob", RDZV_BACKEND="c10d"))
    assert trainjob is not None and trainjob.startswith(f"MIN_NODES={low} with JOB_KIND=trainjob")
    assert "use JOB_KIND=pytorchjob" in trainjob and "\n" not in trainjob
    for kind in ("pytorchjob", "trainjob"):
        assert elastic_refusal(elastic(nodes, 0, JOB_KIND=kind, RDZV_BACKEND="c10d")) is None


def test_trainer_v2_3_has_no_elastic_range():
    """What the TrainJob refusal stands on: the vendored v2.3.0 runtime CRD's torch policy has no
    elasticPolicy (nor any min/max node field), and the TrainJob's trainer only numNodes."""
    [crd] = [d for d in yaml_docs(RUNTIMES_CRD) if d.get("kind") == "CustomResourceDefinition"]
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    torch = spec["properties"]["mlPolicy"]["properties"]["torch"]["properties"]
    assert "elasticPolicy" not in torch and not any("node" in k.lower() for k in torch)
    source = inspect.getsource(elastic_refusal)
    assert "kube_elastic_refusal" in source  # the refusal is what admission calls


def _sim(nodes: int, low: int) -> Sim:
    job = copy.deepcopy(_objs(nodes, low)["PyTorchJob"])
    job["metadata"]["uid"] = "uid-PyTorchJob"
    return Sim(job)


@settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    nodes=st.integers(2, 4),
    data=st.data(),
    lost=st.lists(st.tuples(st.integers(0, 3), st.sampled_from([128 + 9, 128 + 15])), max_size=4),
)
def test_a_lost_node_any_node_is_made_again_and_the_job_never_fails(nodes, data, lost):
    """Under the operator's v1.9.4 passes, a range job whose pods are lost one after another (a
    node gone: SIGKILL, or SIGTERM of an eviction), worker-0 among them: every pod carries
    PET_NNODES min:max and the etcd endpoint, none hosts anything the others need (the same env
    for every index), each lost pod is made again under its own name (retryable exit), the job is
    Restarting or Running, never Failed, and ends Succeeded when a worker succeeds (elastic)."""
    low = data.draw(st.integers(1, nodes - 1))
    sim = _sim(nodes, low)
    sim.settle()
    envs = []
    for name, pod in sorted(sim.pods.items()):
        env = {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"]}
        assert env["PET_NNODES"] == f"{low}:{nodes}" and env["PET_RDZV_BACKEND"] == "etcd-v2"
        assert env["PET_RDZV_ENDPOINT"].startswith("etcd:"), name
        envs.append({k: v for k, v in env.items() if k.startswith("PET_")})
    assert all(e == envs[0] for e in envs)
    made = sim.made
    for node, code in lost:
        if node >= nodes:
            continue
        sim.end(node, code)
        sim.settle()
        assert sim.phase in ("Running", "Restarting"), sim.job["status"]
        made += 1
        assert sim.made == made and f"fsdp-worker-{node}" in sim.pods
    sim.end(data.draw(st.integers(0, nodes - 1)), 0)
    sim.settle()
    assert sim.phase == "Succeeded"


def _pod(i: int, state: str, labels: dict) -> dict:
    phase = {"pending": "Pending", "succeeded": "Succeeded", "failed": "Failed"}.get(
        state, "Running"
    )
    meta = {"name": f"w-{i}", "namespace": "fsdp", "labels": dict(labels)}
    if state == "terminating":
        meta["deletionTimestamp"] = "2026-12-06T10:00:00Z"
    ready = "True" if state in (READY, "terminating") else "False"
    return {
        "metadata": meta,
        "status": {"phase": phase, "conditions": [{"type": "Ready", "status": ready}]},
    }


def _healthy(pods: list[dict]) -> int:
    return sum(rules.ready(p) and not p["metadata"].get("deletionTimestamp") for p in pods)


@settings(max_examples=25, deadline=None, derandomize=True)
@given(nodes=st.integers(2, 32), data=st.data())
def test_a_drain_takes_ready_pods_down_to_the_minimum_and_no_further(nodes, data):
    """Over ranges, every mix of pod states and any eviction order (the eviction API's rules,
    kube_peer_disruption.py): a Ready pod goes exactly while more than MIN_NODES pods are healthy,
    else 429 naming MIN_NODES as the healthy pods needed; the job never has fewer healthy pods than
    its minimum through evictions, and pods not Ready always go. So a drain or a managed node group
    update takes JOB_NODES - MIN_NODES nodes and waits for the rest."""
    low = data.draw(st.integers(1, nodes - 1))
    objs = _objs(nodes, low)
    budget = objs["PodDisruptionBudget"]
    labels = objs["PyTorchJob"]["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["metadata"]
    states = data.draw(st.lists(st.sampled_from(STATES), min_size=nodes, max_size=nodes))
    pods = [_pod(i, s, labels["labels"]) for i, s in enumerate(states)]
    for i in data.draw(st.permutations(range(nodes))):
        before = _healthy(pods)
        refusal = rules.eviction(pods[i], [budget], pods)
        if states[i] == READY and before <= low:
            assert refusal is not None and refusal.code == 429
            [cause] = refusal.causes
            assert f"needs {low} healthy pods and has {before}" in cause["message"]
            continue
        assert refusal is None, (states[i], before, low)
        pods[i]["metadata"]["deletionTimestamp"] = "2026-12-06T10:00:00Z"
        if states[i] == READY:
            assert _healthy(pods) >= low


@pytest.mark.slow
def test_job_run_puts_the_range_on_the_cluster_and_a_drain_stops_at_the_minimum(peer):  # noqa: F811
    """`job run` of a 4-node job with MIN_NODES=2 through the API peer: the PyTorchJob carries the
    range and the budget (owned by the job) minAvailable 2; `job status` names the world changes
    the pods' logs hold (each printed by rank 0 of its world, on whichever pod that was) and counts
    the loss, not the growth, as a restart; a drain's evictions
    take two Ready workers (worker-0, the old store host, first) and the third gets 429 from the
    budget. With
    RDZV_BACKEND=c10d the same run is refused (exit 2, one line) before anything is made."""
    from kubernetes import client, config

    from test_disruption_budget import _evict, _worker_pods
    from test_elastic_local import _world
    from test_kube import kube, step_line

    install_operator(peer)
    refused = cli("job", "run", "-d", JOB_NODES="4", NODE_COUNT="4", MIN_NODES="2")
    assert refused.exit_code == 2, refused.output
    assert "MIN_NODES=2 with RDZV_BACKEND=c10d" in refused.stderr
    assert "Traceback" not in refused.output and peer.objects("pytorchjobs") == []
    r = cli(
        "job", "run", "-d", JOB_NODES="4", NODE_COUNT="4", MIN_NODES="2", RDZV_BACKEND="etcd-v2"
    )
    assert r.exit_code == 0, r.output
    [job] = peer.objects("pytorchjobs")
    assert (
        job["spec"]["elasticPolicy"]["minReplicas"],
        job["spec"]["elasticPolicy"]["maxReplicas"],
    ) == (2, 4)
    [budget] = peer.objects("poddisruptionbudgets")
    assert budget["spec"]["minAvailable"] == 2
    assert [o["kind"] for o in budget["metadata"]["ownerReferences"]] == ["PyTorchJob"]
    names = _worker_pods(peer, kube(peer), 4)
    # node 0 lost: rank 0 of the 2-node world was on worker-1, which printed its steps and the
    # world event; worker-0's new pod is rank 0 again after the growth
    peer.api.logs[("fsdp", names[1])] = "\n".join([_world(10, 4, 2, 10.0), step_line(15)])
    # the leader's log after a loss and a return, as torch 2.13's agent and the trainer print them
    # (agent/server/api.py _invoke_run: "will restart worker group" after a failure, and again for
    # a node waiting, which spends no restart; fsdptrain.elastic's `world` event at each resume)
    peer.api.logs[("fsdp", names[0])] = "\n".join(
        [
            step_line(12),
            "[default] Worker group FAILED. 3/3 attempts left; will restart worker group",
            step_line(21),
            "[default] Detected 1 new nodes from group_rank=0; will restart worker group",
            _world(20, 2, 4, 20.0),
            step_line(25),
        ]
    )
    status = json.loads(cli("job", "status", "-o", "json").stdout)
    assert status["world_changes"] == ["4 → 2 nodes at step 10", "2 → 4 nodes at step 20"]
    assert status["restarts"] == 1 and status["step"] == 25, status  # the growth is no restart
    core = client.CoreV1Api(config.new_client_from_config(str(peer.kubeconfig)))
    assert _evict(core, names[0]) is None and _evict(core, names[1]) is None
    code, body = _evict(core, names[2])
    assert code == 429 and body["message"] == rules.TOO_MANY
    [cause] = body["details"]["causes"]
    assert cause["message"] == "The disruption budget fsdp needs 2 healthy pods and has 2 currently"
    assert op.has_condition(job.get("status") or {}, "Failed") is False


def _ledger(count: int) -> str:
    from fsdptrain.disruption import RESTART_LINE

    return RESTART_LINE.format(count=count, most=9)


GROWTH = "[default] Detected 1 new nodes from group_rank=0; will restart worker group"
FAILED = "[default] Worker group FAILED. 2/2 attempts left; will restart worker group"


def _peer_cells_logs() -> dict[str, tuple[list[list[str]], int]]:
    """Each EKS cell's pods' logs as the cells on the peer's cluster left them (3 pods; the ledger
    lines of fsdptrain.disruption, torch 2.13's agent lines, fsdptrain.elastic's `world` events),
    with the restarts users count: one loss or one drain each. After the end only the leader's pod
    keeps its log (cleanPodPolicy Running deleted the others with theirs)."""
    from test_elastic_local import _world
    from test_kube import step_line

    shrink, grow = _world(10, 3, 2, 10.0), _world(31, 2, 3, 20.0)
    return {
        # worker-0 SIGKILLed: its new pod joined (ledger start 4) and is rank 0 at the end; the
        # survivors' growth lines and their rejoins' starts went with their pods
        "node 0 lost, at the end": ([[_ledger(4), grow, step_line(40)], [], []], 1),
        "node 0 lost, on 2 nodes": ([[], [FAILED, shrink, step_line(15)], [FAILED]], 1),
        # worker-1 SIGKILLed: the survivors' agents restarted their group (FAILED), grew back
        # (GROWTH) and their launchers rejoined (starts 5, 6) after the new pod's start 4
        "a non-store node lost, at the end": (
            [[step_line(12), FAILED, shrink, GROWTH, _ledger(5), grow, step_line(40)], [], []],
            1,
        ),
        # worker-1 drained: the survivors rejoined (4, 5), its new pod started (6), the survivors
        # rejoined again at the growth (7, 8)
        "a drain, at the end": (
            [[_ledger(4), shrink, GROWTH, _ledger(7), grow, step_line(40)], [], []],
            1,
        ),
        "a drain, grown back": (
            [
                [_ledger(4), shrink, GROWTH, _ledger(7), grow, step_line(33)],
                [_ledger(6)],
                [_ledger(5), GROWTH, _ledger(8)],
            ],
            1,
        ),
    }


def test_job_status_counts_a_loss_or_a_drain_once_whichever_pods_kept_their_logs(peer):  # noqa: F811
    """`job status` of a range job through the API peer, over the logs each EKS cell's pods left
    (_peer_cells_logs): one restart for one loss or one drain, whether or not the logs it reads
    hold the growth back. A growth is no restart, but it is taken off only the logs that show it
    (the agents' "Detected N new nodes ...; will restart worker group", torch 2.13 agent/server/
    api.py _invoke_run, and their launchers' ledger starts after it): the joining pod's log holds
    neither, so after node 0's loss the kept leader's log said 0 restarts while the growth was
    subtracted from a count that never held it."""
    from test_disruption_budget import _worker_pods
    from test_kube import kube

    install_operator(peer)
    r = cli(
        "job", "run", "-d", JOB_NODES="3", NODE_COUNT="3", MIN_NODES="2", RDZV_BACKEND="etcd-v2"
    )
    assert r.exit_code == 0, r.output
    names = _worker_pods(peer, kube(peer), 3)
    for case, (logs, want) in _peer_cells_logs().items():
        for name, lines in zip(names, logs, strict=True):
            peer.api.logs[("fsdp", name)] = "\n".join(lines)
        status = json.loads(cli("job", "status", "-o", "json").stdout)
        assert status["restarts"] == want, (case, status["restarts"])


@pytest.mark.parametrize(
    "step, record, done",
    [(40, "r1", True), (45, "r1", True), (39, "r1", False), (40, "r0", False)],
    ids=["its last step", "past it", "before it", "another run's"],
)
def test_a_worker_group_started_after_the_runs_last_save_ends_0(
    tmp_path, monkeypatch, capsys, step, record, done
):
    """Found by the drain cell on the peer's cluster (MAX_STEPS=40): the new pod joined as the two
    others saved their last step, their agents restarted the group for it (torch 2.13
    agent/server/api.py, num_nodes_waiting), and each new worker refused the run's own checkpoint at
    MAX_STEPS (exit 2, "nothing is left to train") until torchrun gave up: a job that had trained
    to its end failed. A worker whose run's own checkpoint (meta.json's record_id this run's) is at
    MAX_STEPS or past now ends 0 before any process group, rank 0 saying so with the launcher's
    `finished` line (fsdptrain.launch.already_finished, the same verdict); another run's, or one
    before MAX_STEPS, goes on to the resume check and training as before."""
    from fsdptrain import __main__ as entry
    from fsdptrain import events
    from fsdptrain.config import from_sources
    from fsdptrain.launch import finished_run

    root = tmp_path / "ckpt" / f"step-{step:08d}"
    root.mkdir(parents=True)
    (root / "meta.json").write_text(json.dumps({"step": step, "record_id": record, "loss": 2.5}))
    (root.parent / "latest").write_text(root.name)
    env = {"CHECKPOINT_DIR": str(root.parent), "MAX_STEPS": "40", "FSDPTRAIN_RECORD_ID": "r1"}
    for k, v in {**env, "RANK": "0"}.items():
        monkeypatch.setenv(k, v)
    if not done:
        assert finished_run(from_sources([], env), env) is None
        return

    def goes_on(*_, **__):  # the checks before training: a finished run never gets there
        raise AssertionError("a finished run went on to train")

    monkeypatch.setattr(entry, "check", goes_on)
    assert entry.main([]) == 0
    out = capsys.readouterr().out.splitlines()
    [finished] = [e for e in events.parse(out) if isinstance(e, events.Finished)]
    assert (finished.step, finished.max_steps, finished.record_id) == (step, 40, "r1")


# ---- the rendezvous EKS uses, on real torchrun and a real etcd ----------------------------------------


@pytest.mark.slow
@pytest.mark.extended
def test_node_0_lost_on_the_etcd_v2_rendezvous_is_any_nodes_loss(tmp_path, monkeypatch):
    """What the EKS range stands on, run where a real etcd (3.5, v2 API on) and real torchrun run:
    the local backend with RDZV_BACKEND=etcd-v2 (its etcd on no node, as the job namespace's etcd is
    on no worker), 3 nodes, MIN_NODES=2, node 0 SIGKILLed at step 12 and not made again. The two
    others train on from the last checkpoint to Succeeded (etcd_rendezvous_backend.py holds the
    state, dynamic_rendezvous.py drops node 0 by its heartbeat): at most CHECKPOINT_INTERVAL steps
    lost, every block of data trained, one restart, and `job status` names the change. With c10d
    on EKS the store would have died with node 0 (refused above)."""
    import test_elastic_local as cell
    from fsdpctl.backends.local import engine as local
    from fsdpctl.backends.local.backend import LocalBackend
    from fsdpctl.backends.local.report import job_report
    from fsdpctl.job import world

    real_load = cell.load
    monkeypatch.setattr(
        cell, "load", lambda dotenv: real_load(dotenv={**dotenv, "RDZV_BACKEND": "etcd-v2"})
    )
    cell._start(tmp_path, monkeypatch)
    cfg_seen = LocalBackend(load(dotenv={"JOB_NAME": "t"}))
    cell._wait_step(cell.LOSE_AT)
    local.lose("t", 0)
    state = local.wait("t", timeout=600)
    report = job_report(state, float("inf"))
    assert report["phase"] == "Succeeded" and report["step"] == cell.STEPS, report
    lines = cfg_seen.run_lines("t", state["run_id"]) or []
    # the rendezvous was the etcd server's (pods.rendezvous starts it for etcd and etcd-v2)
    assert (local.job_dir("t") / "etcd" / state["run_id"]).is_dir()
    [change] = world.changes(lines)
    assert report["world_changes"] == [f"3 → 2 nodes at step {change['step']}: node-0 lost"]
    assert report["restarts"] == 1, report
    assert 0 <= cell._steps_lost(lines, change) <= cell.INTERVAL
    taken = cell._taken(tmp_path / "trace")
    assert set(taken) == set(range(cell.STEPS * cell.GLOBAL_BATCH))
    _supervisor_gone(state["supervisor_pid"])


def _supervisor_gone(pid: int, timeout: float = 120) -> None:
    """The supervisor ends on its own once the job ended (it stops the etcd server it started):
    waited for, so the test leaves nothing running. Not our child: its /proc entry is watched."""
    import time
    from pathlib import Path

    def alive() -> bool:
        try:
            return "State:\tZ" not in Path(f"/proc/{pid}/status").read_text(errors="replace")
        except FileNotFoundError:
            return False

    deadline = time.monotonic() + timeout
    while alive():
        assert time.monotonic() < deadline, f"supervisor {pid} still runs"
        time.sleep(0.2)


# ---- the API peer's cluster: real torchrun in its pods, a real etcd in a pod --------------------------

PEER_JOB = {
    "SEQ_LEN": "64",
    "PRECISION": "fp32",
    "WARMUP_STEPS": "2",
    "MODEL": "tiny",
    "JOB_NODES": "3",
    "NODE_COUNT": "3",
    "MIN_NODES": "2",
    "RDZV_BACKEND": "etcd-v2",
    "MAX_STEPS": "40",
    "CHECKPOINT_INTERVAL": "5",
    "CHECKPOINT_KEEP": "20",
    "MAX_RESTARTS": "2",
    "MICRO_BATCH_SIZE": "2",
    "GRAD_ACCUM_STEPS": "2",
    "LOG_INTERVAL": "1",
}


def _etcd_pod(port: int, peer_port: int) -> dict:
    """What the etcd Deployment's ReplicaSet would make (the API peer has no Deployment
    controller): one pod the `etcd` Service selects, running this machine's etcd (3.4, v2 API on)
    on the port the peer's cluster gives that Service, its data on an emptyDir."""
    env = {
        "ETCD_NAME": "etcd",
        "ETCD_DATA_DIR": "/var/lib/etcd",
        "ETCD_ENABLE_V2": "true",
        "ETCD_LISTEN_CLIENT_URLS": f"http://0.0.0.0:{port}",
        "ETCD_ADVERTISE_CLIENT_URLS": f"http://etcd:{port}",
        "ETCD_LISTEN_PEER_URLS": f"http://127.0.0.1:{peer_port}",
        "ETCD_INITIAL_ADVERTISE_PEER_URLS": f"http://127.0.0.1:{peer_port}",
        "ETCD_INITIAL_CLUSTER": f"etcd=http://127.0.0.1:{peer_port}",
    }
    container = {
        "name": "etcd",
        "image": "quay.io/coreos/etcd:v3.5.21",
        # the peer's kubelets start the image's python (this interpreter), which becomes etcd
        "command": ["python", "-c", "import os; os.execvp('etcd', ['etcd'])"],
        "env": [{"name": k, "value": v} for k, v in env.items()],
        "volumeMounts": [{"name": "data", "mountPath": "/var/lib/etcd"}],
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "etcd-0",
            "namespace": "fsdp",
            "labels": {"app.kubernetes.io/name": "etcd"},
        },
        "spec": {
            "restartPolicy": "Never",
            "tolerations": [
                {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
            ],
            "containers": [container],
            "volumes": [{"name": "data", "emptyDir": {}}],
        },
    }


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _healthy_etcd(port: int) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
            return b"true" in r.read()
    except OSError:
        return False


def _cordon(k, names: list[str], on: bool) -> None:
    for name in names:
        k.request(
            "PATCH",
            f"/api/v1/nodes/{name}",
            content_type="application/merge-patch+json",
            body={"spec": {"unschedulable": on}},
        )


def _all_lines(b, job: str) -> list[str]:
    """Every container's whole log of the job's pods, kept by the peer's kubelets on disk (pods
    the operator deleted included)."""
    return [
        line
        for i in range(3)
        for text in b.cluster.node_logs("fsdp", f"{job}-worker-{i}", "pytorch")
        for line in text.splitlines()
    ]


def _worlds(b, job: str) -> list:
    from fsdpctl.job import world

    return world.changes(_all_lines(b, job))


def _peer_bench(tmp_path, monkeypatch, job: str):
    """The API peer's cluster of three GPU nodes (one pod each; the Bench's has two by default)
    with the etcd pod behind the `etcd` Service, healthy; and the settings of a range job there."""
    from test_kube_peer_operator import EKS as PEER_EKS
    from test_kube_peer_operator import Bench, until

    monkeypatch.setattr(
        op.Cluster.__init__, "__kwdefaults__", {"nodes": 3, "instance_type": "p5.48xlarge"}
    )
    b = Bench(tmp_path)
    try:
        port = _free_port()
        b.cluster.ports[("fsdp", "etcd", 2379)] = port
        b.cluster.kube.apply(_etcd_pod(port, _free_port()))
        until("etcd healthy", lambda: _healthy_etcd(port), timeout=60)
    except BaseException:
        b.close()
        raise
    return b, {**PEER_EKS, **PEER_JOB, "JOB_NAME": job}


PEER_STEPS = int(PEER_JOB["MAX_STEPS"])
PEER_INTERVAL = int(PEER_JOB["CHECKPOINT_INTERVAL"])
# sequences (blocks) per step: MICRO_BATCH_SIZE 2 x GRAD_ACCUM_STEPS 2 x 3 pods of one rank each; 2
# pods keep it with accumulation 3 (fsdptrain.elastic's constant global batch)
PEER_GLOBAL_BATCH = 12


def _traced(tmp_path, monkeypatch):
    """FSDPTRAIN_TRACE for the pods (the peer's kubelets inject it, kube_peer_operator.INJECTED): each
    rank's data positions (fsdptrain.data.Loader), what the cells count."""
    trace = tmp_path / "trace"
    trace.mkdir()
    monkeypatch.setenv("FSDPTRAIN_TRACE", str(trace))
    return trace


def _status(b, job: str, settings_: dict) -> dict:
    return json.loads(b.run("job", "status", job, "-o", "json", **settings_).stdout)


def _shrunk(b, job: str, settings_: dict) -> tuple:
    """The first world change (3 -> 2) in the pods' logs, and `job status` then: the job goes on
    (Running or Restarting, never Failed), status names the change and follows rank 0 to its pod."""
    from test_kube_peer_operator import until

    until("3 -> 2", lambda: len(_worlds(b, job)) >= 1, timeout=300)
    shrink = _worlds(b, job)[0]
    assert (shrink["from_nodes"], shrink["to_nodes"]) == (3, 2), shrink
    on_two = _status(b, job, settings_)
    assert on_two["world_changes"] == [f"3 → 2 nodes at step {shrink['step']}"], on_two
    assert on_two["step"] >= shrink["step"] and on_two["phase"] in ("Running", "Restarting")
    return shrink, on_two


def _grown_back_and_accounted(
    b, job: str, settings_: dict, trace, steps: int = PEER_STEPS
) -> tuple:
    """After the uncordon: the job grows back to 3 and ends Succeeded at MAX_STEPS (`steps`); both
    world changes are in the pods' logs; each costs at most CHECKPOINT_INTERVAL steps; every block
    of the data is trained (tests/test_elastic_local.py's count over the trainer's data trace), again
    only for the steps lost and at most the one in flight at each change. `job status` and `job
    history` after the end name both changes, though the pods still running when an elastic
    PyTorchJob succeeds were deleted with their logs (cleanPodPolicy Running), the shrink's among
    them where node 0 was lost: the leader's summary carries the whole history. Returns (lines,
    changes, `job status`, `job history`'s last row) for the cell's own assertions."""
    from fsdpctl.job import record
    from test_elastic_local import _steps_lost, _taken
    from test_kube_peer_operator import until

    until("2 -> 3", lambda: len(_worlds(b, job)) >= 2, timeout=300)
    waited = b.run("job", "wait", job, "--timeout", "400", **settings_)
    assert waited.returncode == 0, waited.stdout + waited.stderr
    got = b.cluster.kube.get("kubeflow.org/v1", "PyTorchJob", job, "fsdp")
    assert op.has_condition(got["status"], "Succeeded") and not op.has_condition(
        got["status"], "Failed"
    )
    lines, changes = _all_lines(b, job), _worlds(b, job)
    assert [(c["from_nodes"], c["to_nodes"]) for c in changes] == [(3, 2), (2, 3)]
    assert max(record.losses(lines)) == steps
    lost = [_steps_lost(lines, c) for c in changes]
    assert all(0 <= n <= PEER_INTERVAL for n in lost), lost
    taken, total = _taken(trace), steps * PEER_GLOBAL_BATCH
    assert set(taken) == set(range(total))  # no sample skipped
    extra = len(taken) - total
    assert sum(lost) * PEER_GLOBAL_BATCH <= extra <= (sum(lost) + len(changes)) * PEER_GLOBAL_BATCH
    status = _status(b, job, settings_)
    assert status["phase"] == "Succeeded" and status["step"] == steps, status
    said = [
        f"3 → 2 nodes at step {changes[0]['step']}",
        f"2 → 3 nodes at step {changes[1]['step']}",
    ]
    assert status["world_changes"] == said, status
    rows = json.loads(b.run("job", "history", job, "-o", "json", **settings_).stdout)
    assert rows[-1]["outcome"] == f"Succeeded at step {steps}", rows
    assert rows[-1]["world"] == "; ".join(said), rows  # the run record keeps both
    print(
        f"\nsteps lost {lost}, {extra} blocks again; status {status.get('world_changes')}, "
        f"{status['restarts']} restarts; history {rows[-1]}"
    )
    return lines, changes, status, rows[-1]


@pytest.mark.slow
@pytest.mark.extended
@pytest.mark.parametrize("lost", [0, 1], ids=["node 0", "non-store node"])
def test_on_the_peer_cluster_node_0_lost_trains_on_and_grows_back(tmp_path, monkeypatch, lost):
    """`job run` of 3 pods, MIN_NODES=2, etcd-v2, on the API peer's cluster (the operator's v1.9.4
    passes, kubelets running real torchrun on CPU, an etcd pod behind the `etcd` Service). With
    every node cordoned (no room for a replacement), worker-`lost` is SIGKILLed at step 12 (node 0,
    whose agent hosted nothing since etcd-v2 keeps the rendezvous in etcd, or a non-store node:
    the same event): the operator makes its pod again (Pending: nowhere to go; a pod killed by a
    signal is retried, train_util.go IsRetryableExitCode) and the job is never Failed; the other
    two re-rendezvous on etcd (torch 2.13 dynamic_rendezvous.py drops the lost node by its
    heartbeat) and train on from the last checkpoint on 2 nodes. Uncordoned, the pod runs, joins
    as a waiting node and the job grows back to 3 (agent/server/api.py: num_nodes_waiting restarts
    the group, spending no restart); it ends Succeeded at MAX_STEPS. `job status` on 2 nodes
    follows rank 0 to its pod: the step, the change, one restart; each change costs at most
    CHECKPOINT_INTERVAL steps and every block of the data is trained, again only for those."""
    from test_kube_peer_operator import _step_seen, until

    job = "el"
    trace = _traced(tmp_path, monkeypatch)
    b, settings_ = _peer_bench(tmp_path, monkeypatch, job)
    try:
        r = b.run("job", "run", "-d", **settings_)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
        until("step 12", lambda: _step_seen(b, job, f"{job}-worker-0", 12), timeout=300)
        _cordon(b.cluster.kube, b.cluster.node_names, True)
        assert b.cluster.kill("fsdp", f"{job}-worker-{lost}") > 0
        _, on_two = _shrunk(b, job, settings_)
        assert on_two["restarts"] == 1, on_two  # the loss, as users count it
        _cordon(b.cluster.kube, b.cluster.node_names, False)
        *_, status, _ = _grown_back_and_accounted(b, job, settings_, trace)
        assert status["restarts"] == 1, status  # the loss; the growth is no restart to users
    finally:
        b.close()


def _core(b):
    from kubernetes import client, config

    return client.CoreV1Api(config.new_client_from_config(str(b.peer.kubeconfig)))


def _drain(b, node: str) -> dict[str, object]:
    """`kubectl drain NODE --ignore-daemonsets --delete-emptydir-data` as kubectl v1.33 does it
    (kubernetes staging/src/k8s.io/kubectl/pkg/drain): cordon (cordon.go, spec.unschedulable),
    the node's pods in every namespace (drain.go GetPodsForDeletion: field selector spec.nodeName),
    less DaemonSet and mirror pods (filters.go; a pod without a controller would need --force, so
    none is expected here), then each one's policy/v1 Eviction through the real client (drain.go
    EvictPod). Each pod's answer: None when evicted, else the API's (status, body); kubectl would
    retry a 429 every 5 s, which the cell does itself where it means to."""
    from test_disruption_budget import _evict

    _cordon(b.cluster.kube, [node], True)
    found = _core(b).list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}").items
    answers: dict[str, object] = {}
    for pod in found:
        meta = pod.metadata
        controller = next((o for o in meta.owner_references or [] if o.controller), None)
        if (controller and controller.kind == "DaemonSet") or "kubernetes.io/config.mirror" in (
            meta.annotations or {}
        ):
            continue
        assert controller is not None, f"{meta.name} has no controller: kubectl drain needs --force"
        answers[meta.name] = _evict(_core(b), meta.name)
    return answers


def _pod_of(b, name: str) -> dict:
    return b.cluster.kube.get("v1", "Pod", name, "fsdp") or {}


def _unschedulable(pod: dict) -> str:
    """The scheduler's PodScheduled=False message of a Pending pod, else ''."""
    if pod.get("spec", {}).get("nodeName") or pod.get("status", {}).get("phase") != "Pending":
        return ""
    conditions = pod.get("status", {}).get("conditions") or []
    return next((c.get("message", "") for c in conditions if c["type"] == "PodScheduled"), "")


@pytest.mark.slow
@pytest.mark.extended
def test_on_the_peer_cluster_a_drain_of_one_node_trains_on_at_the_minimum_and_grows_back(
    tmp_path, monkeypatch
):
    """On the API peer's cluster (the operator's v1.9.4 passes, kubelets running real torchrun on
    CPU, the etcd pod), a 3-pod MIN_NODES=2 job training; one node drained as `kubectl drain` does
    it (_drain: cordon, then the eviction API; a node that does not hold the etcd pod, as on EKS
    etcd runs on the system node group). The budget (minAvailable 2) lets the eviction through
    (kubernetes v1.33 eviction.go checkAndDecrement, kube_peer_disruption.py); the evicted pod
    is deleted with its grace: SIGTERM, the trainer's disruption path (fsdptrain.disruption: every
    rank checkpoints the step it is on, the evicted pod ends 143, the others' launchers start
    torchrun again). The operator makes the pod again (v1.9.4: a missing replica is created) and
    it stays Pending: its node is cordoned and each other node's memory and EFA are taken by a
    worker (a p5 holds one). The job trains on on 2 nodes having lost no step (the save was at
    the step the ranks were on, so no block of data is trained twice); while at the minimum a
    second eviction is refused, 429 with the budget's cause. Uncordoned, the pod runs, joins as a
    waiting node (torch 2.13 agent/server/api.py num_nodes_waiting) and the job grows back to 3;
    Succeeded at MAX_STEPS, every block of the data trained, `job status` and `job history` name
    the changes and one restart (the survivors' rejoin; the growth none)."""
    from test_disruption_budget import _evict
    from test_elastic_local import _steps_lost, _taken
    from test_kube_peer_operator import _step_seen, until

    job = "ed"
    workers = [f"{job}-worker-{i}" for i in range(3)]
    trace = _traced(tmp_path, monkeypatch)
    b, settings_ = _peer_bench(tmp_path, monkeypatch, job)
    # room for the growth: the new pod starts (its launcher, torchrun, the rendezvous) while the
    # two train on, which took 18 to over 26 steps on a busy machine; a growth at the last step is
    # not what this cell plays
    steps = 60
    settings_ = {**settings_, "MAX_STEPS": str(steps)}
    try:
        r = b.run("job", "run", "-d", **settings_)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
        until("step 12", lambda: _step_seen(b, job, workers[0], 12), timeout=300)
        etcd_node = _pod_of(b, "etcd-0")["spec"]["nodeName"]
        victim = next(w for w in (workers[1], workers[2]) if _node(b, w) != etcd_node)
        node, uid = _node(b, victim), _pod_of(b, victim)["metadata"]["uid"]
        answers = _drain(b, node)  # the pre-step's finished pod may be there too: let go
        assert answers.get(victim, "absent") is None and set(answers.values()) == {None}, answers
        assert [w for w in workers if w in answers] == [victim]
        until("made again", lambda: _pod_of(b, victim).get("metadata", {}).get("uid", uid) != uid)
        why = until("Pending", lambda: _unschedulable(_pod_of(b, victim)), timeout=60)
        assert "1 node(s) were unschedulable" in why and "2 Insufficient memory" in why, why
        shrink, on_two = _shrunk(b, job, settings_)
        survivor = next(w for w in workers if w != victim)
        code, body = _evict(_core(b), survivor)  # the second node's drain, at the minimum
        assert code == 429 and body["message"] == rules.TOO_MANY, body
        [cause] = body["details"]["causes"]
        assert (
            cause["message"]
            == f"The disruption budget {job} needs 2 healthy pods and has 2 currently"
        )
        assert _unschedulable(_pod_of(b, victim)), "the evicted pod's replacement stays Pending"
        # one restart of the job: the survivors' launchers started torchrun again to rejoin
        # (fsdptrain.launch), which the run's start ledger counts (kstatus.ledger_restarts)
        assert on_two["restarts"] == 1, on_two
        _cordon(b.cluster.kube, [node], False)
        lines, changes, status, _ = _grown_back_and_accounted(b, job, settings_, trace, steps)
        assert _steps_lost(lines, changes[0]) == 0  # the disruption's checkpoint, at its step
        # so every block of data is trained exactly once: each change came by SIGTERM (the eviction,
        # then the agents' restart for the waiting node), and the ranks agree on it between steps,
        # before the next step takes a micro-batch (fsdptrain.data.Loader.next_batch traces it)
        assert sorted(_taken(trace)) == list(range(steps * PEER_GLOBAL_BATCH))
        assert status["restarts"] == 1, status  # the growth is no restart to users
    finally:
        b.close()


def _node(b, name: str) -> str | None:
    return _pod_of(b, name).get("spec", {}).get("nodeName")


def _survivors_failed(b, job: str, pods: list[str]) -> bool:
    """A survivor's agent saw its group fail and restarts it (torch 2.13 agent/server/api.py
    _invoke_run logs "... attempts left; will restart worker group"): it is between worlds."""
    return any(
        "attempts left; will restart worker group" in text
        for pod in pods
        for text in b.cluster.node_logs("fsdp", pod, "pytorch")
    )


@pytest.mark.slow
@pytest.mark.extended
def test_on_the_peer_cluster_a_stop_during_the_re_rendezvous_ends_stopped_and_resumes(
    tmp_path, monkeypatch
):
    """On the API peer's cluster as above (the operator's v1.9.4 passes, real torchrun, the etcd
    pod): worker-1 SIGKILLed at step 12 with every node cordoned (its new pod Pending), and `job
    stop` while the survivors' agents are between worlds (their group failed, torch 2.13
    agent/server/api.py; no trainer runs, so none can save a stop checkpoint). The stop ends the
    job Stopped, not Failed (engine.stop: the stop annotation, then a foreground delete that the
    garbage collector carries to the pods); no pod and no process of the job is left; `job
    history` says Stopped. `job resume` (uncordoned, all 3 nodes) trains from the last periodic
    checkpoint to MAX_STEPS: every step 1..MAX_STEPS trained (the data position is the step's, one
    global integer, fsdptrain.elastic's constant global batch), at most CHECKPOINT_INTERVAL again."""
    from fsdpctl.job import record
    from fsdptrain import events
    from test_kube_peer_operator import _step_seen, until

    job = "es"
    pods = [f"{job}-worker-{i}" for i in range(3)]
    b, settings_ = _peer_bench(tmp_path, monkeypatch, job)
    try:
        assert b.run("job", "run", "-d", **settings_).returncode == 0
        until("step 12", lambda: _step_seen(b, job, pods[0], 12), timeout=300)
        _cordon(b.cluster.kube, b.cluster.node_names, True)
        assert b.cluster.kill("fsdp", pods[1]) > 0
        until("between worlds", lambda: _survivors_failed(b, job, [pods[0], pods[2]]), timeout=300)
        assert _worlds(b, job) == []  # no step on the smaller world yet
        stop = b.run("job", "stop", job, **settings_)
        assert stop.returncode == 0, stop.stdout + stop.stderr
        first = _all_lines(b, job)
        assert [o for o in b.peer.objects("pods") if o["metadata"]["name"] in pods] == []
        assert all(b.cluster.processes("fsdp", p) == [] for p in pods)
        assert all(
            o["metadata"]["name"] != job for o in b.peer.objects("pytorchjobs")
        )  # deleted, not Failed
        status = json.loads(b.run("job", "status", job, "-o", "json", **settings_).stdout)
        assert status["phase"] == "Stopped", status
        rows = json.loads(b.run("job", "history", job, "-o", "json", **settings_).stdout)
        print(f"\nhistory after the stop: {rows}")
        assert rows[-1]["outcome"].startswith("Stopped"), rows
        ckpts = b.cluster.root / "volumes" / "fsdp" / "fsx-claim" / "checkpoints" / job
        latest = (ckpts / "latest").read_text().strip()
        saved = int(latest.rpartition("-")[2])
        before = record.losses(first)
        assert 12 - 5 <= saved <= max(before) and (ckpts / latest / "meta.json").is_file()
        _cordon(b.cluster.kube, b.cluster.node_names, False)
        resumed = b.run("job", "resume", job, **settings_)
        assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
        lines = b.leader_lines(job)
        start = next(e for e in events.parse(lines) if isinstance(e, events.Start))
        assert start.start_step == saved
        after = record.losses(lines)
        assert sorted(after) == list(range(saved + 1, 41))
        assert set(before) | set(after) == set(range(1, 41))  # every step's data trained
        assert 0 <= max(before) - saved <= 5  # trained again: at most CHECKPOINT_INTERVAL
        print(f"stopped between worlds; resumed from step {saved}, {max(before) - saved} again")
    finally:
        b.close()

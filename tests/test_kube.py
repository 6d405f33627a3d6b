"""The Kubernetes side (deploy, job run/status/logs/list/wait/stop, cleanup, monitor top) driven
through the CLI against the API peer (tests/kube_peer.py: an API server on kmock's HTTP machinery
that answers as kube-apiserver does for discovery, scopes, selectors, resourceVersion, field
validation, admission and garbage collection; test_kube_peer.py holds it to that), reached by the
real `kubernetes` client through a kubeconfig. It has no controllers and no kubelet, so the tests
play them: they set job conditions and pod status through the API and give pods their log text. With
FSDPCTL_TEST_KUBECONFIG set, test_real_cluster runs the non-destructive part against that cluster
instead."""

from __future__ import annotations

import base64
import json
import os
import shutil
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest
import yaml

from conftest import SHARED, invoke, isolate, scaled
from fsdpctl.adapters.kube import Kube
from kube_peer import Peer, wait_for

VENDOR = SHARED / "vendor"
TOKEN = "hf_KubeTestTokenAbCdEfGhIjKlMnOpQr12"


def said(r) -> str:
    return " ".join(r.output.split())


@pytest.fixture
def peer(tmp_path, monkeypatch):
    isolate(
        monkeypatch, tmp_path
    )  # the `cli` fixture's sealed room: own home and cwd, no settings from env
    p = Peer(tmp_path)
    monkeypatch.setenv("KUBECONFIG", str(p.kubeconfig))
    monkeypatch.setenv("FSDPCTL_BACKEND", "eks")
    monkeypatch.setenv("FSDPCTL_MANIFESTS", str(VENDOR))
    monkeypatch.setenv(
        "FSDPCTL_IMAGE_REGISTRY", REGISTRY
    )  # a job's image must name one (EksBackend.run)
    yield p
    p.close()


REGISTRY = "registry.example.com:5000"


def cli(*args: str, **env):
    """fsdpctl in process (conftest.invoke), each keyword a --set; isolated under the `peer`
    fixture."""
    return invoke(*[a for k, v in env.items() for a in ("--set", f"{k}={v}")], *args)


def kube(peer) -> Kube:
    return Kube.connect(kubeconfig=str(peer.kubeconfig))


def become_ready(peer, kind: str, namespace: str, name: str) -> threading.Thread:
    """Plays the controller: once the object exists, reports it available."""

    def run():
        k = kube(peer)
        api = "apps/v1"
        wait_for(lambda: k.get(api, kind, name, namespace) is not None, 20)
        status = (
            {"replicas": 1, "availableReplicas": 1}
            if kind == "Deployment"
            else {"desiredNumberScheduled": 2, "numberReady": 2}
        )
        k.request(
            "PATCH",
            f"/apis/apps/v1/namespaces/{namespace}/{kind.lower()}s/{name}/status",
            body={"status": status},
            content_type="application/merge-patch+json",
        )

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def install_operator(peer, **settings):
    """The operator, plus the shared claim (SHARED_VOLUME, default fsx-claim) a job's pods mount."""
    ready = become_ready(peer, "Deployment", "kubeflow", "training-operator")
    r = cli("deploy", "operator", "--timeout", str(round(scaled(60))), **settings)
    assert r.exit_code == 0, r.output
    ready.join()
    add_claim(
        peer, settings.get("JOB_NAMESPACE", "fsdp"), settings.get("SHARED_VOLUME", "fsx-claim")
    )
    return r


def add_claim(peer, namespace: str, name: str) -> None:
    """What `deploy storage` (or an admin) leaves behind: the namespace and a bound claim in it."""
    k = kube(peer)
    k.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    claim = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "accessModes": ["ReadWriteMany"],
            "resources": {"requests": {"storage": "1200Gi"}},
        },
    }
    k.apply(claim)


def set_condition(k: Kube, job: dict, cond: str, message: str = "") -> None:
    api, kind, ns, name = (
        job["apiVersion"],
        job["kind"],
        job["metadata"]["namespace"],
        job["metadata"]["name"],
    )
    k.request(
        "PATCH",
        k.path(api, kind, ns, name, "status"),
        content_type="application/merge-patch+json",
        body={
            "status": {
                "conditions": [
                    # a metav1.Condition (TrainJob) needs a reason: the peer validates like the
                    # server
                    {
                        "type": cond,
                        "status": "True",
                        "reason": cond,
                        "message": message,
                        "lastTransitionTime": "2026-12-02T10:00:00Z",
                    }
                ]
            }
        },
    )


def add_pod(
    k: Kube,
    peer,
    job: str,
    index: int,
    phase: str = "Running",
    log: str = "",
    owner: dict | None = None,
    **status,
) -> str:
    """A pod of `job` as the operator makes it; with `owner` (the job object) it carries the
    ownerReference the operator sets (controller: true)."""
    name = f"{job}-worker-{index}"
    refs = (
        [
            {
                "apiVersion": owner["apiVersion"],
                "kind": owner["kind"],
                "name": owner["metadata"]["name"],
                "uid": owner["metadata"]["uid"],
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
        if owner
        else []
    )
    k.create(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": "fsdp",
                "labels": {
                    "fsdpctl.io/job": job,
                    "training.kubeflow.org/replica-index": str(index),
                },
                **({"ownerReferences": refs} if refs else {}),
            },
            "spec": {"containers": [{"name": "pytorch", "image": "x"}]},
        }
    )
    k.request(
        "PATCH",
        f"/api/v1/namespaces/fsdp/pods/{name}/status",
        content_type="application/merge-patch+json",
        body={"status": {"phase": phase, **status}},
    )
    peer.api.logs[("fsdp", name)] = log
    return name


def in_fsdp(peer, plural: str) -> list[dict]:
    """The job namespace's objects (the operator's own, e.g. its webhook Secret, live in kubeflow)."""
    return [o for o in peer.objects(plural) if o["metadata"].get("namespace") == "fsdp"]


def step_line(step: int, max_steps: int = 100, loss: float = 3.5) -> str:
    return json.dumps(
        {
            "event": "step",
            "step": step,
            "max_steps": max_steps,
            "loss": loss,
            "tokens_per_s": 51234.0,
            "step_time_s": 1.5,
            "time": time.time(),
            "mfu": 0.41,
        }
    )


# --- deploy -------------------------------------------------------------------------------------------------


def test_deploy_operator_is_idempotent_and_waits_for_readiness(peer):
    r = install_operator(peer)
    assert "operator (Kubeflow Training Operator v1.9.4): 14 created" in said(
        r
    ) and "operator ready" in said(r)
    assert {c["metadata"]["name"] for c in peer.objects("customresourcedefinitions")} >= {
        "pytorchjobs.kubeflow.org"
    }
    patches = len(peer.requests())
    r = cli("deploy", "operator", "--timeout", "5")
    assert r.exit_code == 0 and "14 unchanged" in said(r), r.output
    sent = [req for req in peer.requests()[patches:] if req.method.value == "PATCH"]
    assert sent == []  # the second run sent no change at all
    r = cli("deploy", "status", "-o", "json")
    rows = {row["object"]: row for row in json.loads(r.stdout)}
    assert (
        rows["Deployment/training-operator"]["ready"]
        and rows["CRD pytorchjobs.kubeflow.org"]["installed"]
    )
    assert not rows["Deployment/etcd"]["installed"]


def test_deploy_refuses_a_release_file_that_does_not_match_its_pin(peer, tmp_path):
    mirror = tmp_path / "mirror" / "kubeflow-training-operator-v1.9.4"
    mirror.mkdir(parents=True)
    shutil.copy(VENDOR / "kubeflow-training-operator-v1.9.4" / "standalone-install.yaml", mirror)
    with open(mirror / "standalone-install.yaml", "a") as f:
        f.write("# tampered\n")
    r = cli("deploy", "operator", "--from", str(tmp_path / "mirror"))
    assert r.exit_code == 1 and "does not match its pinned sha256" in said(r)
    assert peer.objects("customresourcedefinitions") == []
    (tmp_path / "empty").mkdir()
    r = cli("deploy", "operator", "--from", str(tmp_path / "empty"))
    assert r.exit_code == 1 and "is not in" in said(r) and "mirror" in said(r)
    # a --from that is no directory at all is bad input, refused before anything (issue 37)
    r = cli("deploy", "operator", "--from", str(tmp_path / "nowhere"))
    assert r.exit_code == 2 and f"--from {tmp_path / 'nowhere'} does not exist" in said(r)


def test_deploy_etcd_times_out_when_nothing_becomes_ready(peer):
    r = cli("deploy", "etcd", "--timeout", "1")
    assert r.exit_code == 1 and "etcd: not ready after 1 s: Deployment/etcd in fsdp" in said(r)
    assert {d["metadata"]["name"] for d in peer.objects("deployments")} == {"etcd"}
    assert peer.api.namespaces["fsdp"]["metadata"]["name"] == "fsdp"


def test_deploy_monitoring_dry_runs(peer):
    r = cli("deploy", "monitoring", "--dry-run")
    assert r.exit_code == 0
    objs = list(yaml.safe_load_all(r.stdout))
    dashboard = json.loads(
        next(o for o in objs if o["metadata"]["name"] == "grafana-dashboards")["data"][
            "fsdp-training.json"
        ]
    )
    exprs = " ".join(t["expr"] for p in dashboard["panels"] for t in p["targets"])
    for metric in (
        "DCGM_FI_DEV_GPU_UTIL",
        "DCGM_FI_DEV_MEM_COPY_UTIL",
        "DCGM_FI_DEV_XID_ERRORS",
        "DCGM_FI_DEV_SM_CLOCK",
        "DCGM_FI_DEV_GPU_TEMP",
        "DCGM_FI_DEV_POWER_USAGE",
        "fsdptrain_tokens_per_second",
        "fsdptrain_loss",
        "fsdptrain_mfu",
    ):
        assert metric in exprs
    assert {"htop", "nvtop", "dcgm-exporter"} <= {
        o["metadata"]["name"] for o in objs if o["kind"] == "DaemonSet"
    }
    r = cli("deploy", "monitoring", "--dry-run=server")
    assert r.exit_code == 0 and "accepted by the API server (dry run)" in said(r)
    assert peer.objects("deployments") == [] and "monitoring" not in peer.api.namespaces


def test_deploy_dry_run_sends_nothing_and_dry_run_server_asks_the_api(peer):
    """One --dry-run: bare it prints the objects without a request; `--dry-run=server` (also spelled
    `--dry-run-server`) sends every object as a dryRun=All apply; without it the objects are stored.
    """
    r = cli("deploy", "etcd", "--dry-run")
    assert r.exit_code == 0, r.output
    kinds = [o["kind"] for o in yaml.safe_load_all(r.stdout)]
    assert (
        "Deployment" in kinds and f"dry run (client): {len(kinds)} objects; nothing sent" in said(r)
    )
    assert peer.requests() == [] and peer.objects("deployments") == []
    for spelling in (["--dry-run=server"], ["--dry-run-server"]):
        before = len(peer.requests())
        r = cli("deploy", "etcd", *spelling)
        assert r.exit_code == 0, (spelling, r.output)
        assert "objects accepted by the API server (dry run)" in said(r) and "ready" not in said(r)
        applied = [q for q in peer.requests()[before:] if q.method.value == "PATCH"]
        assert applied and all(q.params.get("dryRun") == "All" for q in applied), spelling
    assert peer.objects("deployments") == [] and "fsdp" not in peer.api.namespaces
    assert cli("deploy", "etcd", "--dry-run", "server").exit_code == 2  # the value needs '='
    # both at once is refused (kubectl takes one value), not one of them picked: nothing sent
    before = len(peer.requests())
    assert cli("deploy", "etcd", "--dry-run", "--dry-run=server").exit_code == 2
    assert len(peer.requests()) == before
    r = cli("deploy", "etcd", "--timeout", "1")
    assert r.exit_code == 1 and {d["metadata"]["name"] for d in peer.objects("deployments")} == {
        "etcd"
    }


# --- jobs ---------------------------------------------------------------------------------------------------


def test_job_run_needs_the_crd_and_names_the_fix(peer):
    r = cli("job", "run", "-d")
    assert r.exit_code == 1
    assert "the PyTorchJob CRD (kubeflow.org/v1) is not installed" in said(
        r
    ) and "fsdpctl deploy operator" in said(r)


def test_job_run_creates_secret_and_job_and_refuses_a_second(peer, monkeypatch):
    install_operator(peer)
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    r = cli("job", "run", "-d")
    assert r.exit_code == 0, r.output
    assert TOKEN not in r.output
    [secret] = in_fsdp(peer, "secrets")
    # the API server keeps stringData as base64 data (kube_peer._converted)
    assert "stringData" not in secret and secret["metadata"]["name"] == "fsdp-hf-token"
    assert base64.b64decode(secret["data"]["HF_TOKEN"]).decode() == TOKEN
    [job] = peer.objects("pytorchjobs")
    first_id = job["spec"]["elasticPolicy"]["rdzvId"]
    assert job["spec"]["pytorchReplicaSpecs"]["Worker"][
        "replicas"
    ] == 2 and TOKEN not in json.dumps(job)
    r = cli("job", "run", "-d")
    assert r.exit_code == 2 and "job fsdp is running" in said(r) and "--replace" in said(r)
    r = cli("job", "run", "-d", "--replace")
    assert r.exit_code == 0, r.output
    [job] = peer.objects("pytorchjobs")
    assert job["spec"]["elasticPolicy"]["rdzvId"] != first_id  # a fresh rendezvous id per run
    r = cli("job", "run", "--dry-run")
    assert r.exit_code == 0 and "nothing was created" in said(r)


def test_status_reads_progress_leader_pending_reasons_and_the_network_path(peer):
    install_operator(peer)
    assert cli("job", "run", "-d").exit_code == 0
    k = kube(peer)
    [job] = peer.objects("pytorchjobs")
    set_condition(k, job, "Running")
    agent = "[default] Starting worker group\n  master_addr=fsdp-worker-1\n  master_port=29400\n"
    log = (
        agent
        + "NCCL INFO NET/Socket : Using [0]eth0:10.0.0.5<0>\n"
        + "\n".join(step_line(s) for s in (1, 2, 40))
        + "\n"
    )
    add_pod(k, peer, "fsdp", 0, log=agent)
    add_pod(k, peer, "fsdp", 1, log=log, containerStatuses=[{"name": "pytorch", "restartCount": 2}])
    add_pod(
        k,
        peer,
        "fsdp",
        2,
        phase="Pending",
        conditions=[
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": "0/3 nodes are available: 3 Insufficient vpc.amazonaws.com/efa.",
            }
        ],
    )
    add_pod(
        k,
        peer,
        "fsdp",
        3,
        phase="Pending",
        containerStatuses=[
            {
                "name": "pytorch",
                "restartCount": 0,
                "state": {
                    "waiting": {
                        "reason": "ImagePullBackOff",
                        "message": 'Back-off pulling image "x:v1"',
                    }
                },
            }
        ],
    )
    r = cli("job", "status", "-o", "json")
    assert r.exit_code == 0, r.output
    s = json.loads(r.stdout)
    assert (s["phase"], s["step"], s["max_steps"], s["loss"], s["leader"]) == (
        "Running",
        40,
        100,
        3.5,
        "fsdp-worker-1",
    )
    assert (
        s["pods"] == {"Running": 2, "Pending": 2}
        and s["restarts"] == 2
        and s["network"] == "socket"
    )
    assert "Insufficient vpc.amazonaws.com/efa" in s["problems"][0]
    assert 'fsdp-worker-3: ImagePullBackOff: Back-off pulling image "x:v1"' in s["problems"]
    r = cli("job", "status")
    text = said(r)
    assert (
        "step 40/100 (40%)" in text
        and "NCCL fell back to TCP sockets" in text
        and "51234 tokens/s" in text
    )
    r = cli("job", "status", "--stall-after", "0")
    assert "may be hung" in said(r)
    r = cli("job", "list", "-o", "json")
    assert [j["job"] for j in json.loads(r.stdout)] == ["fsdp"]


def test_a_job_ended_by_a_pod_that_found_the_run_finished_reports_the_run_s_end(
    peer, tmp_path, capsys
):
    """A node dies after the last checkpoint and before its pod ended (the exit barrier, the
    followers' LEADER_FIRST_S): the operator recreates worker-0, whose launcher finds the run's own
    checkpoint at MAX_STEPS and ends 0 at once (fsdptrain.launch.already_finished), which ends the
    elastic PyTorchJob Succeeded (Training Operator v1.9.4 pytorchjob_controller.go,
    UpdateJobStatus); the leader's log went with its old pod. `job status` used to say Succeeded at
    step 0; it reads the launcher's `finished` line (printed here by the real launcher code) as the
    run's end: step 30/30 and the checkpoint's loss. Peer: the Kubernetes API peer serving the pod's
    log."""
    from fsdptrain import launch

    root = tmp_path / "ckpt" / "step-00000030"
    root.mkdir(parents=True)
    (root / "meta.json").write_text(json.dumps({"step": 30, "record_id": "r1", "loss": 2.25}))
    (root.parent / "latest").write_text(root.name)
    environ = {"CHECKPOINT_DIR": str(root.parent), "MAX_STEPS": "30", "FSDPTRAIN_RECORD_ID": "r1"}
    done = launch.already_finished(["--nnodes=2", "-m", "fsdptrain"], environ)
    assert done is not None
    launch.say_finished(done)
    log = capsys.readouterr().out
    install_operator(peer)
    assert cli("job", "run", "-d").exit_code == 0
    k = kube(peer)
    [job] = peer.objects("pytorchjobs")
    set_condition(k, job, "Succeeded")
    add_pod(k, peer, "fsdp", 0, phase="Succeeded", log=log)
    r = cli("job", "status", "-o", "json")
    assert r.exit_code == 0, r.output
    s = json.loads(r.stdout)
    assert (s["phase"], s["step"], s["max_steps"], s["loss"]) == ("Succeeded", 30, 30, 2.25), s
    assert s["checkpoint"] == str(root)
    text = said(cli("job", "status"))
    assert "step 30/30 (100%)" in text and "2.2500" in text, text
    logs = said(cli("job", "logs"))
    assert "nothing left to train" in logs or "already trained to MAX_STEPS=30" in logs, logs


@pytest.mark.slow  # 3-7 s: the fast lane keeps under 2 minutes; no training processes, so
@pytest.mark.beside  # CI runs it beside the serial slow lane
def test_run_follows_the_job_to_its_end_and_status_watch_stops_there(peer):
    """`job run` without -d: a progress bar from the leader's step lines until the job's condition
    says done."""
    install_operator(peer)
    k = kube(peer)

    def controller():
        wait_for(lambda: peer.objects("pytorchjobs"), 20)
        [job] = peer.objects("pytorchjobs")
        add_pod(
            k,
            peer,
            "fsdp",
            0,
            log="master_addr=fsdp-worker-0\nNCCL INFO NET/Socket : Using [0]eth0\n"
            + "\n".join(step_line(s, 8, loss=4.0 - s / 10) for s in range(1, 9))
            + "\n",
        )
        time.sleep(2.5)  # at least one poll sees it running
        set_condition(k, job, "Succeeded")

    t = threading.Thread(target=controller, daemon=True)
    t.start()
    r = cli("job", "run")
    t.join()
    assert r.exit_code == 0, r.output
    assert "job fsdp succeeded: loss 3.2000 at step 8" in said(r)
    assert "NCCL fell back to TCP sockets" in said(r)  # the EFA check runs right after launch too
    r = cli("job", "status", "-w")
    assert r.exit_code == 0 and "Succeeded" in said(r) and "step 8/8 (100%)" in said(r)


def test_logs_leader_one_pod_all_pods_and_follow(peer):
    install_operator(peer)
    assert cli("job", "run", "-d").exit_code == 0
    k = kube(peer)
    add_pod(k, peer, "fsdp", 0, log="master_addr=fsdp-worker-0\nleader line\n")
    add_pod(k, peer, "fsdp", 1, log="worker line\n")
    r = cli("job", "logs")
    assert r.stdout.splitlines() == ["master_addr=fsdp-worker-0", "leader line"]
    r = cli("job", "logs", "--pod", "fsdp-worker-1", "-f")
    assert r.stdout.splitlines() == ["worker line"]
    r = cli("job", "logs", "--all", "-f")
    assert sorted(r.stdout.splitlines()) == [  # kubectl logs --prefix: [pod/NAME/CONTAINER]
        "[pod/fsdp-worker-0/pytorch] leader line",
        "[pod/fsdp-worker-0/pytorch] master_addr=fsdp-worker-0",
        "[pod/fsdp-worker-1/pytorch] worker line",
    ]
    r = cli("job", "logs", "--pod", "nope")
    assert r.exit_code == 1 and "has no pod 'nope'" in said(r)


def test_logs_options_reach_the_api_as_pod_log_options(peer):
    """--since and the times: kubectl's --since maps to PodLogOptions sinceSeconds (whole seconds,
    rounded up: kubectl's logs.go), and fsdpctl always asks timestamps=true so that --timestamps and
    -o json have each line's time. --tail counts the lines fsdpctl prints (a trainer event shown as
    its human line, or hidden, is not one: issue 38), so it is not the API's tailLines, which counts
    every line: the pod's log since then is asked whole (the kubelet keeps a bounded file) and its
    last printed lines taken here (tests/kube_peer.py)."""
    from fsdpctl.job import crilog

    install_operator(peer)
    assert cli("job", "run", "-d").exit_code == 0
    k = kube(peer)
    now = time.time()
    old, new = now - 3600, now - 5
    step = (
        '{"event":"step","step":2,"max_steps":4,"loss":3.5,"step_time_s":1.0,"time":1.0,'
        '"tokens_per_s":9.0}'
    )
    log0 = "".join(
        crilog.format_line(t, "stdout", x)
        for t, x in [(old, "old line"), (new, step), (new, "new")]
    )
    add_pod(k, peer, "fsdp", 0, log=log0)
    add_pod(
        k,
        peer,
        "fsdp",
        1,
        log=crilog.format_line(old, "stderr", "w old") + crilog.format_line(new, "stdout", "w new"),
    )
    before = len(peer.requests())
    r = cli("job", "logs", "--all", "--since", "90s", "--tail", "5", "--timestamps")
    assert r.exit_code == 0, r.output
    assert r.stdout.splitlines() == [
        # the step event: the trainer's own line
        f"[pod/fsdp-worker-0/pytorch] {crilog.rfc3339(new)} new",
        f"[pod/fsdp-worker-1/pytorch] {crilog.rfc3339(new)} w new",
    ]
    asked = [
        q.params for q in peer.requests()[before:] if str(q.url).split("?")[0].endswith("/log")
    ]
    assert [(q.get("tailLines"), q.get("sinceSeconds"), q.get("timestamps")) for q in asked][
        -2:
    ] == [
        (None, "90", "true"),
        (None, "90", "true"),
    ]
    records = [json.loads(x) for x in cli("job", "logs", "-o", "json").stdout.splitlines()]
    assert records[1] == {
        "pod": "fsdp-worker-0",
        "container": "pytorch",
        "time": crilog.rfc3339(new),
        "event": {**json.loads(step), "lr": None, "grad_norm": None, "data_wait_frac": None,
                  "tokens_per_s_per_device": None, "tflops_per_device": None, "mfu": None},
    }  # fmt: skip
    assert [x["text"] for x in records if "text" in x] == ["old line", "new"]
    assert cli("job", "logs", "--tail", "1").stdout == "new\n"


@pytest.mark.parametrize("outcome, code", [("Succeeded", 0), ("Failed", 3), ("deleted", 6)])
def test_wait_exit_codes_follow_the_watch(peer, outcome, code):
    install_operator(peer)
    assert cli("job", "run", "-d").exit_code == 0
    k = kube(peer)
    [job] = peer.objects("pytorchjobs")

    def finish():
        time.sleep(0.5)
        if outcome == "deleted":
            k.delete("kubeflow.org/v1", "PyTorchJob", "fsdp", "fsdp")
        else:
            set_condition(k, job, outcome, "worker 1 exited 137")

    threading.Thread(target=finish, daemon=True).start()
    r = cli("job", "wait", "--timeout", "30")
    assert r.exit_code == code, r.output


def test_wait_timeout_and_not_found(peer):
    install_operator(peer)
    assert cli("job", "wait", "--timeout", "1").exit_code == 4
    assert cli("job", "run", "-d").exit_code == 0
    t0 = time.monotonic()
    assert cli("job", "wait", "--timeout", "1").exit_code == 5
    assert time.monotonic() - t0 < 10


def test_stop_deletes_with_foreground_propagation(peer):
    install_operator(peer)
    assert cli("job", "run", "-d").exit_code == 0
    assert cli("job", "stop", "--dry-run").exit_code == 0 and len(peer.objects("pytorchjobs")) == 1
    r = cli("job", "stop")
    assert r.exit_code == 0 and "stopped and deleted" in said(r)
    assert peer.objects("pytorchjobs") == []
    delete = [q for q in peer.requests() if q.method.value == "DELETE"][-1]
    assert delete.data["propagationPolicy"] == "Foreground"
    assert "nothing to stop" in said(cli("job", "stop"))
    # deleted, yet the job fsdpctl stopped is Stopped (its state here says so), as on every backend
    stopped = json.loads(cli("job", "status", "-o", "json").stdout)
    assert stopped["phase"] == "Stopped" and "job resume" in stopped["reason"], stopped
    assert cli("job", "run", "-d").exit_code == 0  # a new run: no longer the stopped one
    assert json.loads(cli("job", "status", "-o", "json").stdout)["phase"] != "Stopped"


@pytest.mark.skipif(
    not shutil.which("etcd"), reason="etcd-server not installed (scripts/system-deps installs it)"
)
def test_cleanup_removes_finished_jobs_pods_secret_and_real_etcd_keys(peer, tmp_path):
    """The rendezvous keys live in a real etcd (Debian etcd-server, v2 API), reached through the API
    server's service proxy, which the peer forwards to it."""
    from fsdpctl.adapters import etcd as etcd_adapter

    server = etcd_adapter.start(tmp_path / "etcd", log_file=tmp_path / "etcd.log")

    def forward(method, rest, query, body):
        url = f"http://{server.endpoint}{rest}" + (
            "?" + urllib.parse.urlencode(query) if query else ""
        )
        try:
            with urllib.request.urlopen(urllib.request.Request(url, method=method), timeout=5) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    settings = {"RDZV_BACKEND": "etcd-v2", "CHECKPOINT_PVC": "fsx"}
    try:
        peer.api.proxies[("fsdp", "etcd", 2379)] = forward
        install_operator(peer)
        add_claim(peer, "fsdp", "fsx")
        assert cli("job", "run", "-d", **settings).exit_code == 0
        [job] = peer.objects("pytorchjobs")
        key = f"http://{server.endpoint}/v2/keys/torch/elastic/rendezvous/{job['spec']['elasticPolicy']['rdzvId']}"
        urllib.request.urlopen(
            urllib.request.Request(
                key,
                data=b"value=closed",
                method="PUT",
                headers={"Content-Type": "application/x-www-form-urlencoded"},
            )
        )
        k = kube(peer)
        add_pod(k, peer, "fsdp", 0, phase="Succeeded", owner=job)

        r = cli("cleanup", **settings)  # still running: untouched
        assert r.exit_code == 0 and "0 items" in said(r) and len(peer.objects("pytorchjobs")) == 1

        set_condition(k, job, "Succeeded")
        r = cli("cleanup", "--dry-run", **settings)
        assert "would remove PyTorchJob/fsdp" in said(
            r
        ) and "would remove Pod/fsdp-worker-0" in said(r)
        assert (
            "etcd key /torch/elastic/rendezvous/" in said(r)
            and len(peer.objects("pytorchjobs")) == 1
        )

        r = cli("cleanup", "--yes", **settings)
        assert r.exit_code == 0 and "checkpoints kept" in said(r), r.output
        assert (
            peer.objects("pytorchjobs") == []
            and peer.objects("pods") == []
            and in_fsdp(peer, "secrets") == []
        )
        with pytest.raises(urllib.error.HTTPError) as gone:
            urllib.request.urlopen(key)
        assert gone.value.code == 404  # the key is gone from the real etcd

        assert cli("job", "run", "-d", **settings).exit_code == 0
        set_condition(k, peer.objects("pytorchjobs")[0], "Failed", "OOM")
        r = cli("cleanup", "--checkpoints", "--yes", **settings)
        assert r.exit_code == 0, r.output
        [cleaner] = peer.objects("pods")
        assert cleaner["spec"]["containers"][0]["command"] == ["rm", "-rf", "/checkpoints/fsdp"]
        assert cleaner["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"] == "fsx"
    finally:
        server.stop()


def test_trainjob_deploy_run_and_status(peer):
    """JOB_KIND=trainjob: Trainer v2.3.0 CRDs + torch-distributed runtime, a TrainJob, its Complete
    condition."""
    r = cli("deploy", "operator", "--timeout", "1", JOB_KIND="trainjob")
    assert r.exit_code == 0 and "Kubeflow Trainer (CRDs and runtimes) v2.3.0" in said(r), r.output
    assert "kubeflow-trainer-controller-manager in kubeflow-system is not installed" in said(r)
    assert "overlays/manager?ref=v2.3.0" in said(r)
    assert "torch-distributed" in {
        o["metadata"]["name"] for o in peer.objects("clustertrainingruntimes")
    }
    add_claim(peer, "fsdp", "fsx-claim")
    assert cli("job", "run", "-d", JOB_KIND="trainjob").exit_code == 0
    [job] = peer.objects("trainjobs")
    assert (
        job["spec"]["runtimeRef"]["name"] == "torch-distributed"
        and job["spec"]["trainer"]["numNodes"] == 2
    )
    k = kube(peer)
    set_condition(k, job, "Complete")
    r = cli("job", "status", "-o", "json", JOB_KIND="trainjob")
    assert (
        json.loads(r.stdout)["phase"] == "Succeeded" and json.loads(r.stdout)["kind"] == "TrainJob"
    )
    assert cli("job", "wait", JOB_KIND="trainjob").exit_code == 0


def test_clear_errors_for_no_cluster_and_forbidden(peer, tmp_path, monkeypatch):
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing-kubeconfig"))
    r = cli("job", "list")
    assert r.exit_code == 1 and "no Kubernetes cluster to talk to" in said(r)
    assert "aws eks update-kubeconfig --name fsdp-eks --region us-west-2" in said(r)
    r = cli("job", "list", KUBE_CONTEXT="nope")
    assert r.exit_code == 1 and "fix KUBE_CONTEXT" in said(r)
    monkeypatch.setenv("KUBECONFIG", str(peer.kubeconfig))
    install_operator(peer)
    peer.api.forbidden.add("pytorchjobs")
    r = cli("job", "list")
    assert (
        r.exit_code == 1
        and "forbidden" in said(r)
        and "kubectl auth can-i --list -n fsdp" in said(r)
    )


def test_a_missing_namespace_names_the_setting():
    from fsdpctl.adapters.kube import KubeError
    from fsdpctl.backends.eks.api import explain
    from fsdpctl.settings import load

    e = explain(
        KubeError(404, "NotFound", 'namespaces "team-a" not found'),
        load(flags={"BACKEND": "eks", "JOB_NAMESPACE": "team-a"}),
        "reading job fsdp",
    )
    assert str(e) == "reading job fsdp: namespace team-a does not exist"
    assert "fix JOB_NAMESPACE" in e.hint


def test_monitor_top_reads_prometheus_through_the_api(peer):
    r = cli("monitor", "top")
    assert (
        r.exit_code == 1
        and "no metrics source answers" in said(r)
        and "fsdpctl deploy monitoring" in said(r)
    )

    def prometheus(method, rest, query, body):
        q = query["query"]
        rows = (
            []
            if "pod" in q and "Hostname" not in q
            else [
                {
                    "metric": {"Hostname": "ip-10-0-0-1"},
                    "value": [0, "97" if "UTIL" in q else "650"],
                }
            ]
        )
        if "by (namespace, pod)" in q:
            rows = [{"metric": {"namespace": "fsdp", "pod": "fsdp-worker-0"}, "value": [0, "93.5"]}]
        return 200, json.dumps(
            {"status": "success", "data": {"resultType": "vector", "result": rows}}
        ).encode()

    peer.api.proxies[("monitoring", "prometheus", 9090)] = prometheus
    r = cli("monitor", "top", "-o", "json")
    snap = json.loads(r.stdout)
    assert snap["nodes"][0]["node"] == "ip-10-0-0-1" and snap["nodes"][0]["util"] == 97.0
    assert snap["pods"] == [{"namespace": "fsdp", "pod": "fsdp-worker-0", "util": 93.5}]
    assert "ip-10-0-0-1" in cli("monitor", "top").stdout


@pytest.mark.skipif(
    not os.environ.get("FSDPCTL_TEST_KUBECONFIG"),
    reason="FSDPCTL_TEST_KUBECONFIG not set: no real cluster (kind/k3s/EKS) to run against",
)
def test_real_cluster(monkeypatch, tmp_path):
    """The same commands against a real API server; only server-side dry runs and reads, nothing is
    left."""
    isolate(monkeypatch, tmp_path)
    monkeypatch.setenv("KUBECONFIG", os.environ["FSDPCTL_TEST_KUBECONFIG"])
    monkeypatch.setenv("FSDPCTL_BACKEND", "eks")
    monkeypatch.setenv("FSDPCTL_MANIFESTS", str(VENDOR))
    monkeypatch.setenv(
        "FSDPCTL_IMAGE_REGISTRY", REGISTRY
    )  # a job's image must name one (EksBackend.run)
    assert cli("deploy", "etcd", "--dry-run=server").exit_code == 0
    assert cli("deploy", "monitoring", "--dry-run=server").exit_code == 0
    assert cli("deploy", "status").exit_code == 0
    rows = json.loads(cli("deploy", "status", "-o", "json").stdout)
    [crd] = [row for row in rows if row["object"].startswith("CRD")]
    r = cli("job", "list")
    if crd["installed"]:  # what this cluster has decides the one right answer
        assert r.exit_code == 0, r.output
    else:
        assert r.exit_code == 1, r.output
        assert "the PyTorchJob CRD (kubeflow.org/v1) is not installed" in said(r), r.output

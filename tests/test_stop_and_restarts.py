"""What the real systems do with a rendered job when it stops, fails or hangs (issue 13, defects 4,
5, 8, 9), checked against their own code where it runs here (torch 2.13's torchrun parser,
LaunchConfig and etcd rendezvous handler) and against the sources cited in each test where it does
not (Training Operator v1.9.4, Kubeflow Trainer v2.3.0, JobSet v0.12.0). The local runs are real:
torchrun, gloo, the local supervisor."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from conftest import SHARED, yaml_docs
from fsdpctl.backends.local import engine as local
from fsdpctl.backends.local.report import job_report
from fsdpctl.job import kstatus, render
from fsdpctl.job import policy as jobpolicy
from fsdpctl.plan import volume
from fsdpctl.settings import load

VENDOR = SHARED / "vendor"

CLUSTER = {"BACKEND": "eks", "AWS_ACCOUNT_ID": "123456789012", "INSTANCE_TYPE": "p5.48xlarge"}


def eks(**more: str):
    return load(dotenv={**CLUSTER, **more})


def worker(job: dict) -> dict:
    return job["spec"]["pytorchReplicaSpecs"]["Worker"]


def container_env(job: dict) -> dict[str, str]:
    pod = worker(job)["template"]["spec"]
    return {e["name"]: e["value"] for e in pod["containers"][0]["env"] if "value" in e}


def torchrun_config(command: list[str], environ: dict[str, str] | None = None):
    """torch 2.13's own reading of a container command: `python -m fsdptrain.launch ARGS` execs
    torchrun with ARGS, which torchrun parses (PET_* variables as defaults) into its LaunchConfig.
    """
    from torch.distributed.run import config_from_args, parse_args

    args = command[1:] if command[0] == "torchrun" else command[len(jobpolicy.LAUNCH) :]
    saved = dict(os.environ)
    os.environ.update(environ or {})
    try:
        config, _, _ = config_from_args(parse_args(args))
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return config


# ---- 4. graceful stop ------------------------------------------------------------------------------------


def test_torchrun_waits_for_the_stop_checkpoint_of_a_70b_job():
    """torchrun SIGKILLs its workers TORCH_ELASTIC_SHUTDOWN_TIMEOUT after forwarding SIGTERM (torch
    2.13 torch/distributed/launcher/api.py LaunchConfig: the variable, else 30 s), whatever the
    pod's grace period. A 70B job on 16 p5 nodes writes 12 bytes per parameter (fp32 weights + AdamW
    moments, DCP deduplicated) per save: ~52 GB per node, over 50 s even at 1 GB/s. The rendered env
    must give torchrun more than the expected save, and the pod's grace must outlast torchrun."""
    from torch.distributed.launcher.api import LaunchConfig

    from fsdptrain.shapes import MODEL_CONFIGS

    cfg = eks(JOB_NODES="16", MODEL="70b")
    job = render.render_job(cfg, "r")[-1]
    env = container_env(job)
    write_s_at_1gbps = 12 * MODEL_CONFIGS["70b"].num_params() / 16 / 1e9
    assert write_s_at_1gbps > 50

    def torchrun_shutdown_timeout(value: str | None) -> int:
        saved = os.environ.pop("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", None)
        try:
            if value is not None:
                os.environ["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] = value
            return LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=1).shutdown_timeout
        finally:
            os.environ.pop("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", None)
            if saved is not None:
                os.environ["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] = saved

    assert torchrun_shutdown_timeout(None) == 30  # what the old pods gave the trainer
    given = torchrun_shutdown_timeout(env.get("TORCH_ELASTIC_SHUTDOWN_TIMEOUT"))
    assert given > 2 * write_s_at_1gbps
    timing = jobpolicy.stop_timing(cfg)
    write_s = volume.checkpoint_bytes(cfg) / volume.write_rate(
        cfg
    )  # the whole save at FSx's aggregate rate
    assert given == timing.shutdown_s >= 2 * timing.expected_s > 2 * write_s
    grace = worker(job)["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace == timing.grace_s >= given + jobpolicy.AGENT_EXIT_S


def test_stop_grace_seconds_overrides_and_small_jobs_keep_torchs_floor():
    assert jobpolicy.stop_timing(eks(STOP_GRACE_SECONDS="900")).shutdown_s == 900
    tiny = jobpolicy.stop_timing(load(dotenv={}))  # local, tiny model: a few MB per save
    assert (
        tiny.shutdown_s == jobpolicy.TORCH_SHUTDOWN_DEFAULT_S + 1 and tiny.grace_s > tiny.shutdown_s
    )
    # FSx's throughput is the file system's, for all its clients together: more nodes save no faster
    saves = {volume.save_seconds(eks(JOB_NODES=str(n), MODEL="70b")) for n in (32, 16, 8)}
    assert len(saves) == 1


# ---- 5. restart budget -----------------------------------------------------------------------------------


@pytest.mark.parametrize("nodes", [1, 2, 16])
def test_the_budget_is_job_restarts_whatever_the_node_count(nodes):
    """Training Operator v1.9.4 pkg/core/job.go PastBackoffLimit: the job fails once the SUM of
    container restarts over its running pods reaches runPolicy.backoffLimit. One coordinated restart
    of a job restarts every pod once, so MAX_RESTARTS=3 must cover 3 x nodes; with the old
    `max_restarts + 1` = 4, 16 nodes failed at the first restart. The pods use restartPolicy
    ExitCode (pkg/core/pod.go SetRestartPolicy makes the pod's own policy Never;
    pkg/controller.v1/common/pod.go recreates a pod only for a retryable code)."""
    cfg = load(dotenv={"JOB_NODES": str(nodes), "MAX_RESTARTS": "3"})
    job = render.render_job(cfg, "r")[-1]
    limit = job["spec"]["runPolicy"]["backoffLimit"]

    def past_backoff_limit(restarts_per_pod: int) -> bool:  # the Go function, for OnFailure pods
        total = restarts_per_pod * nodes
        return total > 0 if limit == 0 else total >= limit

    assert not past_backoff_limit(2) and limit == 3 * nodes
    assert worker(job)["restartPolicy"] == "ExitCode"
    assert job["spec"]["elasticPolicy"]["maxRestarts"] == 3
    assert (
        torchrun_config(worker(job)["template"]["spec"]["containers"][0]["command"]).max_restarts
        == 3
    )


@pytest.mark.parametrize(
    "settings", [{}, {"JOB_NODES": "2"}, {"JOB_NODES": "16", "MAX_RESTARTS": "0"}]
)
def test_a_failed_job_frees_the_nodes_its_other_pods_still_hold(settings):
    """Training Operator v1.9.4 pkg/controller.v1/common/job.go DeletePodsAndServices, run by
    ReconcileJobs once the job has a Failed or Succeeded condition: cleanPodPolicy None deletes
    nothing, so the other nodes of a job failed by one replica's exit 2 kept running (and holding
    their GPUs) under a Failed job; Running deletes the Running and Pending pods and keeps the
    finished ones (their logs). The local supervisor SIGTERMs the other launchers at a permanent
    failure, the same thing. The CRD (../shared/vendor, kubeflow.org_pytorchjobs.yaml) types the
    field as a free string; the values the controller compares with are
    pkg/apis/kubeflow.org/v1/common_types.go's All, Running and None."""
    job = render.render_job(load(dotenv=settings), "r")[-1]
    policy = job["spec"]["runPolicy"]["cleanPodPolicy"]
    crd_file = VENDOR / "kubeflow-training-operator-v1.9.4/kubeflow.org_pytorchjobs.yaml"
    (crd,) = yaml_docs(crd_file)
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    field = schema["properties"]["spec"]["properties"]["runPolicy"]["properties"]["cleanPodPolicy"]
    assert field["type"] == "string" and policy in ("All", "Running", "None")

    def deleted(phase: str) -> bool:  # the Go function, for a finished job
        if policy == "None":
            return False
        return policy == "All" or phase in ("Running", "Pending")

    assert [deleted(p) for p in ("Running", "Pending", "Succeeded", "Failed")] == [
        True,
        True,
        False,
        False,
    ]


def test_operator_exit_code_verdicts_as_the_supervisor_applies_them():
    """pkg/util/train/train_util.go IsRetryableExitCode: exitCode >= 128; the supervisor judges a
    launcher's exit as the operator judges the container's (a death by signal N reads 128 + N)."""
    assert [local.exit_code(rc) for rc in (0, 2, 1, -9, -15, 137)] == [0, 2, 1, 137, 143, 137]
    assert [local.verdict(c, "ExitCode") for c in (0, 1, 2, 127, 128, 137, 255)] == [
        "done",
        "fail",
        "fail",
        "fail",
        "recreate",
        "recreate",
        "recreate",
    ]
    assert local.verdict(2, "OnFailure") == "recreate" and local.verdict(137, "Never") == "fail"


def test_a_bad_setting_ends_before_torchrun(monkeypatch, tmp_path, capsys):
    """The container command runs fsdptrain.launch: a setting that can never work exits 2 there, so
    torchrun (whose agent restarts the worker group after any failure, exit 2 included:
    torch/distributed/elastic/ agent/server/api.py _invoke_run) never starts; a good one runs
    torchrun with the same arguments."""
    from fsdptrain import launch

    execs = []
    monkeypatch.setattr(launch, "run_torchrun", lambda argv, environ, **_: execs.append(argv) or 0)
    cfg = load(dotenv={"JOB_NODES": "2", "SHARED_VOLUME": "fsx-claim"})
    command = jobpolicy.launch_command(cfg, "r")
    args = command[3:]
    monkeypatch.setenv(
        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE", str(tmp_path / "traces/job/nccl_trace_rank_")
    )

    monkeypatch.setenv("DATASET", str(tmp_path / "missing.txt"))
    assert launch.main(args) == 2 and execs == []
    err = capsys.readouterr().err.strip()
    assert (
        err.startswith("fsdptrain: error: DATASET=") and "does not exist" in err and "\n" not in err
    )

    monkeypatch.setenv("DATASET", "builtin")
    monkeypatch.setenv("SHARDING_STRATEGY", "HYBRID_SHARD")
    monkeypatch.setenv("HSDP_SHARD_SIZE", "3")  # 2 nodes x 1 process: 3 does not divide 2
    assert launch.main(args) == 2 and execs == []
    assert "HSDP_SHARD_SIZE=3" in capsys.readouterr().err

    monkeypatch.delenv("HSDP_SHARD_SIZE")
    launch.main(args)
    assert execs and execs[0] == args
    assert (tmp_path / "traces/job").is_dir()  # NCCL makes no directory for its dumps


def test_torchrun_option_parsing_follows_the_trainer_env():
    from fsdptrain import launch

    assert launch.sizes(["--nnodes=2", "--nproc-per-node", "4"], {}) == (8, 4)
    assert launch.sizes(["--nnodes=1:3", "--nproc_per_node=2"], {}) == (6, 2)
    assert launch.sizes([], {"PET_NNODES": "16", "PET_NPROC_PER_NODE": "8"}) == (128, 8)
    assert launch.sizes(["--nproc-per-node=gpu"], {}) is None
    assert launch.trainer_args(["--nnodes=2", "-m", "fsdptrain", "--max-steps", "3"]) == [
        "--max-steps",
        "3",
    ]
    assert launch.trainer_args(["--nnodes=2", "-m", "other"]) is None


def _state(home: Path, logs: dict[int, str], relaunches: dict[int, int] | None = None) -> dict:
    """A state whose node logs are where the local backend keeps them (FSDPCTL_HOME must be `home`)."""
    log_dir = home / "jobs" / "j" / "logs" / "r"
    log_dir.mkdir(parents=True, exist_ok=True)
    for node, text in logs.items():
        (log_dir / f"node-{node}.log").write_text(text)
    launchers = [
        {"node": n, "pid": 0, "rc": 1, "relaunches": (relaunches or {}).get(n, 0)} for n in logs
    ]
    return {"job": "j", "run_id": "r", "log_dir": str(log_dir), "launchers": launchers}


def _agent_attempts(attempts: int, max_restarts: int) -> str:
    """What torch 2.13's agent and its process context log on one node when every attempt fails."""
    lines = []
    for i in range(attempts):
        lines.append(
            "torch.distributed.elastic.multiprocessing.api: failed (exitcode: 2) local_rank: 0"
        )
        if i < max_restarts:
            left = max_restarts - i
            lines.append(f"[default] Worker group FAILED. {left}/{max_restarts} attempts left;")
            lines[-1] += " will restart worker group"
    return "\n".join(lines) + "\n"


def test_status_counts_job_restarts_not_node_failures(tmp_path, monkeypatch):
    """MAX_RESTARTS=3 on 2 nodes, every attempt failing: 4 attempts x 2 nodes = 8 'failed (exitcode'
    lines, which `job status` used to report as 8 restarts. Each node's agent logged 3 group
    restarts: the job restarted 3 times. A recreated node (its launcher killed) counts once more on
    that node."""
    monkeypatch.setenv("FSDPCTL_HOME", str(tmp_path))
    state = _state(tmp_path, {0: _agent_attempts(4, 3), 1: _agent_attempts(4, 3)})
    assert local.restarts(state) == 3
    monkeypatch.setenv("FSDPCTL_HOME", str(tmp_path / "b"))
    state = _state(tmp_path / "b", {0: _agent_attempts(1, 3), 1: ""}, {1: 1})
    assert (
        local.restarts(state) == 1
    )  # node 1 recreated once, node 0's agent restarted the group once
    pods = [
        {"status": {"containerStatuses": [{"restartCount": 2}]}},
        {"status": {"containerStatuses": [{"restartCount": 2}]}},
    ]
    assert kstatus.restarts(pods) == 2  # a coordinated restart of both pods, twice: not 4
    assert (
        kstatus.restarts([], _agent_attempts(3, 3).splitlines()) == 3
    )  # the leader's agent, in place


# ---- 8. the GPU-side environment -------------------------------------------------------------------------


def test_gpu_environment_and_flight_recorder_paths():
    """The references' GPU env (awsome-distributed-training FSDP fsdp.yaml-template): expandable
    segments and the NCCL flight recorder, dumping where the dumps outlive the pod: the shared
    volume, or else the node's /local scratch (its instance store, a hostPath)."""
    env = container_env(render.render_job(eks(JOB_NODES="2"), "r")[-1])
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert (env["TORCH_NCCL_TRACE_BUFFER_SIZE"], env["TORCH_NCCL_DUMP_ON_TIMEOUT"]) == (
        "20000",
        "1",
    )
    assert env["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == "/fsx/nccl-traces/fsdp/nccl_trace_rank_"
    alone = container_env(render.render_job(eks(JOB_NODES="1", SHARED_VOLUME=""), "r")[-1])
    assert alone["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == "/local/nccl-traces/fsdp/nccl_trace_rank_"


def test_join_timeout_reaches_the_legacy_etcd_handler(monkeypatch):
    """torch 2.13 torch/distributed/elastic/rendezvous/etcd_rendezvous.py create_rdzv_handler reads
    `timeout`, not `join_timeout`, and torchrun's LaunchConfig fills an absent `timeout` with 900
    (launcher/api.py): so RDZV_JOIN_TIMEOUT=1800 used to become 900. The rendered command, parsed by
    torchrun itself, must carry both. The handler is built by torch's own function; only the etcd
    client and the rendezvous object are captured."""
    from torch.distributed.elastic.rendezvous import RendezvousParameters
    from torch.distributed.elastic.rendezvous import etcd_rendezvous as er

    cfg = eks(RDZV_BACKEND="etcd", RDZV_JOIN_TIMEOUT="1800", JOB_NODES="4")
    job = render.render_job(cfg, "r")[-1]
    config = torchrun_config(worker(job)["template"]["spec"]["containers"][0]["command"])
    seen = {}
    monkeypatch.setattr(er, "_create_etcd_client", lambda params: object())
    monkeypatch.setattr(er, "EtcdRendezvous", lambda **kw: seen.update(kw))
    monkeypatch.setattr(er, "EtcdRendezvousHandler", lambda **kw: None)
    er.create_rdzv_handler(
        RendezvousParameters(
            backend=config.rdzv_backend,
            endpoint=config.rdzv_endpoint,
            run_id=config.run_id,
            min_nodes=config.min_nodes,
            max_nodes=config.max_nodes,
            **config.rdzv_configs,
        )
    )
    assert seen["timeout"] == 1800
    conf = {c["key"]: c["value"] for c in job["spec"]["elasticPolicy"]["rdzvConf"]}
    assert conf == {"join_timeout": "1800", "timeout": "1800"}
    c10d = eks(RDZV_JOIN_TIMEOUT="1800")
    # dynamic rendezvous reads join_timeout; the TCPStore client's wait is read_timeout
    # (test_first_run.py)
    assert jobpolicy.rdzv_conf(c10d) == [("join_timeout", "1800"), ("read_timeout", "1800")]


def test_hugepages_only_when_asked():
    """The EKS AL2023 NVIDIA AMI allocates no hugepages (amazon-eks-ami
    templates/al2023/provisioners/ install-efa.sh runs efa_installer.sh --minimal; nodeadm sets no
    vm.nr_hugepages), and a pod requesting hugepages-2Mi a node does not have stays Pending; so it
    is a setting, off by default."""

    def limits(cfg):
        return worker(render.render_job(cfg, "r")[-1])["template"]["spec"]["containers"][0][
            "resources"
        ]

    assert "hugepages-2Mi" not in limits(eks())["limits"]
    asked = limits(eks(HUGEPAGES_2MI="5120Mi"))
    assert asked["limits"]["hugepages-2Mi"] == asked["requests"]["hugepages-2Mi"] == "5120Mi"


def test_status_names_the_flight_recorder_dumps_of_a_hung_local_job(tmp_path, monkeypatch):
    monkeypatch.setenv("FSDPCTL_HOME", str(tmp_path))
    cfg = load(dotenv={"JOB_NODES": "2"})
    spec = local.spec_from_job(render.render_job(cfg, "r")[-1], tmp_path / "jobs/fsdp")
    prefix = local.nccl_traces(spec)
    assert prefix == [str(tmp_path / "volumes/fsx-claim/nccl-traces/fsdp/nccl_trace_rank_")]
    log_dir = tmp_path / "jobs" / "fsdp" / "logs" / "r"
    log_dir.mkdir(parents=True)
    (log_dir / "node-0.log").write_text("")
    state = {
        "job": "fsdp",
        "run_id": "r",
        "phase": "Running",
        "created": time.time() - 60,
        "started": time.time() - 60,
        "replicas": 2,
        "log_dir": str(log_dir),
        "checkpoint_dir": None,
        "supervisor_pid": os.getpid(),
        "launchers": [],
        "nccl_traces": prefix,
    }
    hung = job_report(state, stall_after=1)
    assert hung["stalled"] and f"{prefix[0]}<rank>" in hung["problems"][-1]
    Path(prefix[0]).parent.mkdir(parents=True)
    for rank in (0, 1):
        Path(f"{prefix[0]}{rank}").write_bytes(b"pickle")
    hung = job_report(state, stall_after=1)
    assert hung["problems"][-1].endswith(f"{prefix[0]}0, {prefix[0]}1")
    assert not job_report(state, stall_after=3600)["problems"]


# ---- 9. TrainJob restarts ----------------------------------------------------------------------------------


def test_trainjob_restarts_the_whole_group_through_a_c10d_rendezvous():
    """Kubeflow Trainer v2.3.0 (pkg/runtime/framework/plugins/torch/torch.go) gives torchrun
    PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK and PET_MASTER_ADDR/PORT =
    <job>-node-0-0.<job>:29500: alone they make a static rendezvous, where a restart stays on one
    node. The command names a c10d rendezvous on that endpoint; torchrun's own parser, given the
    pod's env as the kubelet expands it, must see c10d, all nodes, and MAX_RESTARTS."""
    cfg = eks(JOB_KIND="trainjob", JOB_NODES="4", MAX_RESTARTS="2")
    command = render.render_job(cfg, "r")[-1]["spec"]["trainer"]["command"]
    pet = {
        "PET_NNODES": "4",
        "PET_NPROC_PER_NODE": "8",
        "PET_NODE_RANK": "2",
        "PET_MASTER_ADDR": "fsdp-node-0-0.fsdp",
        "PET_MASTER_PORT": "29500",
    }
    expanded = [arg.replace("$(PET_MASTER_ADDR)", "fsdp-node-0-0.fsdp") for arg in command]
    expanded = [arg.replace("$(PET_MASTER_PORT)", "29500") for arg in expanded]
    config = torchrun_config(expanded, pet)
    assert (config.rdzv_backend, config.rdzv_endpoint) == ("c10d", "fsdp-node-0-0.fsdp:29500")
    assert (config.min_nodes, config.max_nodes, config.nproc_per_node, config.max_restarts) == (
        4,
        4,
        8,
        2,
    )
    assert config.run_id == "r"


def test_status_says_what_a_failure_does_for_each_kind():
    """TrainJob: after torchrun's budget the containers restart in place under JobSet's default
    restartPolicy OnFailure (jobset v0.12.0 pkg/webhooks/jobset_webhook.go Default) until the child
    Job's backoffLimit (batch/v1 default 6; torch-distributed sets none, and the TrainJob's
    runtimePatches schema has no field for it), then the JobSet fails (no failurePolicy:
    pkg/controllers/failure_policy.go)."""
    trainjob = kstatus.on_failure("TrainJob", 3)
    assert "MAX_RESTARTS=3" in trainjob and "backoffLimit of 6" in trainjob and "exit 2" in trainjob
    pytorchjob = kstatus.on_failure("PyTorchJob", 3)
    assert "fails it at once" in pytorchjob and "recreated" in pytorchjob


# ---- the local runs ----------------------------------------------------------------------------------------


def _start(tmp_path: Path, monkeypatch, **settings: str) -> dict:
    """A rendered job started through the local adapter (bypassing fsdpctl's own checks of local
    paths)."""
    monkeypatch.setenv("FSDPCTL_HOME", str(tmp_path / "home"))
    base = {"SEQ_LEN": "64", "PRECISION": "fp32", "WARMUP_STEPS": "2", "JOB_NAME": "t"}
    cfg = load(dotenv={**base, **settings})
    objs = render.render_job(cfg, jobpolicy.new_run_id(cfg.job_name))
    prestep = next(
        (o for o in objs if o["kind"] == "Job"), None
    )  # it prepares the claim the trainers wait on
    return local.start(objs[-1], secret_env={}, prestep=prestep)


def _wait_step(name: str, step: int, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while job_report(local.read_state(local.job_dir(name)), float("inf"))["step"] < step:
        assert time.monotonic() < deadline, local.read_state(local.job_dir(name))
        time.sleep(0.5)


@pytest.mark.slow
def test_a_bad_setting_fails_a_local_job_once_without_restarts(tmp_path, monkeypatch):
    """DATASET on the shared volume where nothing is (the .env.example cluster case before the data
    is staged), MAX_RESTARTS=3, 2 nodes: each node's pre-launch check exits 2, the supervisor does
    not recreate (1-127 are permanent under ExitCode), torchrun never starts, and `job status` shows
    0 restarts (it showed 8 after torchrun retried 4 times on each node). The first node to exit 2
    fails the job, and the job's teardown SIGTERMs a node still in its check (the operator deletes a
    failed job's running pods: training-operator v1.9.4 pkg/controller.v1/common/job.go,
    deletePodsAndServices on a finished job), so the other node ends with 2 or -15: a race the
    kubelet has too, never a restart nor a started torchrun."""
    _start(tmp_path, monkeypatch, DATASET="/fsx/data/none.jsonl", MAX_RESTARTS="3")
    state = local.wait("t", timeout=120)
    report = job_report(state, float("inf"))
    assert report["phase"] == "Failed" and report["restarts"] == 0, report
    assert "exited with code 2" in report["reason"] and "permanent" in report["reason"]
    codes = {lz["node"]: lz["rc"] for lz in state["launchers"]}
    assert 2 in codes.values() and set(codes.values()) <= {2, -signal.SIGTERM}, codes
    for node, log in enumerate(local.log_files(state)):
        text = log.read_text()
        assert "elastic" not in text and "relaunch" not in text.lower(), text
        if codes[node] == 2:
            assert "fsdptrain: error: DATASET='" in text, text


@pytest.mark.slow
def test_job_stop_waits_for_a_slow_stop_checkpoint(tmp_path, monkeypatch):
    """A save slowed to 12 s (FSDPTRAIN_FAILPOINT=slow-save:12, as a large model on a slow volume):
    with STOP_GRACE_SECONDS=40 rendered into TORCH_ELASTIC_SHUTDOWN_TIMEOUT, `job stop` ends Stopped
    with the stop checkpoint complete; with 5 s, torchrun's SIGKILL cuts the same save and nothing
    new becomes `latest`: the variable, not luck, is what saves it."""
    monkeypatch.setenv("FSDPTRAIN_FAILPOINT", "slow-save:12")
    results = {}
    for grace in ("40", "5"):
        home = tmp_path / grace
        state = _start(home, monkeypatch, MAX_STEPS="100000", STOP_GRACE_SECONDS=grace)
        _wait_step("t", 3)
        local.stop("t")
        state = local.wait("t", timeout=120)
        assert state["phase"] == "Stopped", state
        root = home / "home/volumes/fsx-claim/checkpoints/t"
        latest = root / "latest"
        results[grace] = (
            latest.is_file() and (root / latest.read_text().strip() / "meta.json").is_file(),
        )
        spec = json.loads((local.job_dir("t") / "spec.json").read_text())
        assert spec["env"]["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] == grace
    assert results == {"40": (True,), "5": (False,)}


@pytest.mark.slow
@pytest.mark.parametrize("victim", [0, 1], ids=["store host", "other node"])
def test_a_killed_node_is_recreated_and_the_job_resumes(tmp_path, monkeypatch, victim):
    """A node's launcher killed by SIGKILL (exit 137, as an OOM-killed or lost pod): the Training
    Operator recreates a pod whose exit code is retryable (>= 128 under ExitCode), and so does the
    supervisor, with a fresh emptyDir; the job resumes from the shared checkpoint and succeeds;
    `job status` counts one restart. Node 1 killed: the surviving agent re-opens the c10d rendezvous
    it hosts and the new torchrun joins it. Node 0 killed (it hosts the store: `<job>-worker-0`,
    which each node's hosts file resolves to node 0's own address): node 1's agent loses the store
    and exits 1 (torch c10d_rendezvous_backend.py `_call_store`, RendezvousConnectionError), and its
    launcher starts torchrun again to join the store node 0's new pod hosts (tests/test_store_host.py
    has the rule); before that rule the job failed on node 1's permanent 1."""
    _start(tmp_path, monkeypatch, MAX_STEPS="60", CHECKPOINT_INTERVAL="10", MAX_RESTARTS="2")
    _wait_step("t", 15)
    victim_pid = local.read_state(local.job_dir("t"))["launchers"][victim]["pid"]
    os.killpg(victim_pid, signal.SIGKILL)
    state = local.wait("t", timeout=300)
    report = job_report(state, float("inf"))
    assert report["phase"] == "Succeeded" and report["step"] == 60, report
    assert [lz["relaunches"] for lz in state["launchers"]] == [int(n == victim) for n in (0, 1)]
    assert report["restarts"] == 1, (
        report
    )  # one new rendezvous round of the job, whichever node logged it
    logs = {f.stem: f.read_text() for f in local.log_files(state)}
    assert "exited with code 137; recreated" in logs[f"node-{victim}"]
    assert any("resumed from" in text for text in logs.values())
    if victim == 0:
        assert "the rendezvous store went away with the node hosting it" in logs["node-1"]

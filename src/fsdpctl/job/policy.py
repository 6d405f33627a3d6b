"""What a job is, whichever backend runs it (pure): where its files go, how its nodes start
(torchrun's command and rendezvous), the trainer's environment, its restart budget and how long a
graceful stop takes. `fsdpctl.job.spec` gathers these into the JobSpec every backend renders."""

from __future__ import annotations

import hashlib
import json
import math
import secrets
import time
from dataclasses import dataclass

from fsdpctl.job import prestep
from fsdpctl.plan import planner as plan
from fsdpctl.plan import steptime, volume
from fsdpctl.settings import Config
from fsdptrain import disruption
from fsdptrain.events import seconds_text
from fsdptrain.shapes import MODEL_CONFIGS

PODINFO_DIR = (
    "/etc/fsdpctl/pod"  # the downward API volume: the pod's annotations, where a stop request shows
)


C10D_PORT, ETCD_PORT = 29400, 2379


POD_CHECKPOINT_ROOT = (
    prestep.CHECKPOINT_MOUNT
)  # where every pod mounts the checkpoint volume; jobs write below


DEFAULT_METRICS_PORT = 9101  # beside DCGM's 9400 and node-exporter's 9100


# NCCL over EFA through aws-ofi-nccl; NCCL_DEBUG=INFO makes the chosen transport visible in the
# logs.
EFA_ENV = {"FI_PROVIDER": "efa", "FI_EFA_USE_DEVICE_RDMA": "1", "FI_EFA_FORK_SAFE": "1"}


# how long a follower node's pod outlives the leader's on Kubernetes: longer than a kubelet takes to
# report the leader's container ended (PLEG's 1 s relist, then the status manager's update) and the
# operator to see it
LEADER_FIRST_S = 10

COMMON_ENV = {
    "NCCL_DEBUG": "INFO",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
    "PYTHONUNBUFFERED": "1",
    # restarts re-rendezvous reliably only without the shared agent store (seen with c10d/etcd-v2)
    "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
    # torchrun's agent logs its rendezvous result (master_addr: the leader) and each restart of its
    # worker group at INFO; its loggers default to WARNING
    # (torch/distributed/elastic/utils/logging.py, LOGLEVEL)
    "LOGLEVEL": "INFO",
}


# What the references set on GPU pods (awsome-distributed-training's FSDP fsdp.yaml-template): the
# caching allocator grows segments instead of fragmenting them, and NCCL's flight recorder keeps the
# last collectives of every rank and writes them out when one times out
# (TORCH_NCCL_DEBUG_INFO_TEMP_FILE + rank): what hung, where. Inert on CPU (gloo).
GPU_ENV = {
    "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
    "TORCH_NCCL_TRACE_BUFFER_SIZE": "20000",
    "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
}


NCCL_TRACE_PREFIX = "nccl_trace_rank_"  # torch's own file name; the rank is appended


# The /local scratch: a directory on that array, which job pods mount (hostPath) when there is no
# shared volume. nodeadm mounts the array in its run phase, after cloud-init has run the user data's
# scripts (nodeadm-run.service: After=cloud-final.service), so a script cannot simply mkdir it: the
# script gives the kubelet a drop-in that makes it, world-writable and sticky as /tmp (non-root pods
# write there too), each time the kubelet starts (after the array is mounted); `-`: never a reason
# for the kubelet not to start.
NODE_SCRATCH_DIR = "/mnt/k8s-disks/0/local"


POD_SCRATCH = "/local"


# The container's command: fsdptrain.launch checks the trainer's settings on the node and exits 2 on
# a bad one before torchrun exists (torchrun would restart any failing worker group, exit code 2
# included), then becomes torchrun (exec: same process, so the kubelet's SIGTERM reaches torchrun).
LAUNCH = ["python", "-m", "fsdptrain.launch"]


# Graceful stop. On SIGTERM torchrun forwards it to the workers and SIGKILLs them
# TORCH_ELASTIC_SHUTDOWN_TIMEOUT seconds later (default 30: torch/distributed/launcher/api.py,
# run.py --shutdown-timeout), whatever the pod's grace period; the trainer needs that long for its
# step and its stop checkpoint, which goes to the volume at the file system's aggregate throughput
# (fsdpctl.plan.volume).
CHECKPOINT_BYTES_PER_PARAM = volume.CHECKPOINT_BYTES_PER_PARAM


TORCH_SHUTDOWN_DEFAULT_S = (
    30  # kept on top of the estimate: process-group teardown, the final event lines
)


AGENT_EXIT_S = 30  # torchrun's own exit after its workers', before the kubelet's SIGKILL


def new_run_id(job_name: str) -> str:
    """A fresh rendezvous id per run: no run ever meets a finished run's closed rendezvous."""
    return f"{job_name[:40]}-{int(time.time()):x}-{secrets.token_hex(3)}"


def stable_run_id(cfg: Config) -> str:
    """For `manifest` without --run-id: same settings, same output (a new id whenever settings
    change)."""
    digest = hashlib.sha256(
        json.dumps(cfg.train_env(), sort_keys=True).encode()
        + cfg.settings.model_dump_json(exclude={"hf_token"}).encode()
    ).hexdigest()
    return f"{cfg.job_name[:40]}-{digest[:10]}"


def rendezvous(cfg: Config) -> tuple[str, str, int]:
    """(torchrun backend, host, port). c10d is hosted by the first worker pod's service."""
    if cfg.rdzv_backend == "c10d":
        return "c10d", f"{cfg.job_name}-worker-0", C10D_PORT
    return cfg.rdzv_backend, "etcd", ETCD_PORT


def rendezvous_keys(backend: str, run_id: str) -> list[str]:
    """The etcd (v2 API) keys torchrun's rendezvous leaves for a run: `etcd` keeps run_<id> under
    /torchelastic/p2p, `etcd-v2` keeps /torch/elastic/rendezvous/<id>. c10d keeps nothing in etcd.
    """
    if not run_id:
        return []
    return {
        "etcd": [f"/torchelastic/p2p/run_{run_id}"],
        "etcd-v2": [f"/torch/elastic/rendezvous/{run_id}"],
    }.get(backend, [])


def checkpoint_root(cfg: Config) -> str:
    """Where the pod keeps checkpoints: the checkpoint volume (CHECKPOINT_PVC, or pod-local without
    any shared storage), else the shared volume's checkpoints/ directory."""
    if cfg.checkpoint_pvc or not cfg.shared_volume:
        return POD_CHECKPOINT_ROOT
    return f"{cfg.shared_volume_path.rstrip('/')}/checkpoints"


def checkpoint_dir(cfg: Config, job_name: str) -> str:
    """The job's checkpoints, or a run's own below them (CHECKPOINT_SUBDIR: a rerun's, so that it
    neither resumes nor overwrites the job's)."""
    sub = f"/{cfg.checkpoint_subdir}" if cfg.checkpoint_subdir else ""
    return f"{checkpoint_root(cfg)}/{job_name}{sub}"


def tensorboard_dir(cfg: Config, job_name: str) -> str | None:
    """TENSORBOARD_DIR as the pods get it: the user's directory (on the shared volume: settings
    check it) plus the job's name, so `fsdpctl job tensorboard NAME` shows this job's runs (the
    trainer adds the run id); None when TensorBoard is off."""
    root = cfg.training.tensorboard_dir.rstrip("/")
    return f"{root}/{job_name}" if root else None


def wandb_dir(cfg: Config, job_name: str) -> str | None:
    """WANDB_DIR for a job with WANDB_PROJECT: on the shared volume, where an offline run's files
    outlive the pod (`wandb sync` reads them there); None without one (W&B's default, the working
    directory)."""
    if not cfg.training.wandb_project or not cfg.shared_volume:
        return None
    return f"{cfg.shared_volume_path.rstrip('/')}/wandb/{job_name}"


def nccl_trace_file(cfg: Config, job_name: str) -> str:
    """TORCH_NCCL_DEBUG_INFO_TEMP_FILE: the flight recorder writes `<this><rank>` per rank. On the
    shared volume, where one directory holds every node's; without one, on each node's /local
    scratch. Either way the dumps outlive the pod that wrote them."""
    root = cfg.shared_volume_path.rstrip("/") if cfg.shared_volume else POD_SCRATCH
    return f"{root}/nccl-traces/{job_name}/{NCCL_TRACE_PREFIX}"


def scratch(cfg: Config) -> dict[str, str] | None:
    """The node's /local scratch the pods mount (hostPath: the node's own RAID0, kept across pods
    and jobs): only without a shared volume, which holds the traces and the HF cache otherwise."""
    if cfg.shared_volume:
        return None
    return {"path": NODE_SCRATCH_DIR, "mount": POD_SCRATCH}


@dataclass(frozen=True)
class StopTiming:
    """How long a graceful stop takes: the step in flight plus the stop checkpoint (`expected_s`,
    estimated), torchrun's TORCH_ELASTIC_SHUTDOWN_TIMEOUT (`shutdown_s`) and the pod's
    terminationGracePeriodSeconds (`grace_s`), each longer than the one before. `basis`: where
    `shutdown_s` comes from, in the settings' words (`stop_basis`); `assumed`: it rests on a write
    rate nobody gave (volume.Rate.assumed), which `basis` says."""

    expected_s: float
    shutdown_s: int
    grace_s: int
    basis: str = ""
    assumed: bool = False


def checkpoint_bytes_per_node(cfg: Config) -> int:
    """What one node writes per checkpoint for the named MODEL. DCP writes each replicated shard
    once (torch/distributed/checkpoint/_dedup_save_plans.py), so whatever the strategy a save is 12
    bytes per parameter for the whole job, spread over its nodes."""
    params = MODEL_CONFIGS[cfg.training.model].num_params()
    return math.ceil(CHECKPOINT_BYTES_PER_PARAM * params / cfg.job_nodes)


def step_seconds(cfg: Config) -> float:
    """The planner's step time on GPUs; 0 for CPU processes, where a CPU step is not the
    question."""
    if not cfg.target.gpus:
        return 0.0
    return steptime.speed(plan.job_from(cfg, mfu=0.0, price=None)).step_s


def stop_timing(cfg: Config) -> StopTiming:
    """STOP_GRACE_SECONDS, else twice the expected step + save time on top of torch's 30 s; the
    pod's grace outlasts it by AGENT_EXIT_S so torchrun, not the kubelet, ends the workers. The save
    is the whole checkpoint over the volume's aggregate throughput (volume.save_seconds): every node
    writes at once through the same file servers, so more nodes do not make it faster."""
    step_s, save_s, rate = step_seconds(cfg), volume.save_seconds(cfg), volume.rate(cfg)
    expected = step_s + save_s
    shutdown = cfg.stop_grace_seconds or TORCH_SHUTDOWN_DEFAULT_S + math.ceil(2 * expected)
    assumed = rate.assumed and not cfg.stop_grace_seconds
    basis = stop_basis(cfg, step_s, save_s, rate)
    return StopTiming(expected, shutdown, shutdown + AGENT_EXIT_S, basis, assumed)


def stop_basis(cfg: Config, step_s: float, save_s: float, rate: volume.Rate) -> str:
    """Where the stop grace comes from, one line: 'STOP_GRACE_SECONDS=600', or 'twice the step (0.88
    s) and a save of 75.3 GiB (552 s at 146 MB/s, assumed: ...) on top of torch's 30 s', for a
    Slurm script's comment and `plan`."""
    if cfg.stop_grace_seconds:
        return f"STOP_GRACE_SECONDS={cfg.stop_grace_seconds}"
    ckpt = volume.gib(volume.checkpoint_bytes(cfg))
    # a step of 0: CPU processes, whose step is not estimated
    step = f"the step ({seconds_text(step_s)}) and " if step_s else ""
    return (
        f"twice {step}a save of {ckpt} ({seconds_text(save_s)} at {rate.mb_per_s:.0f} MB/s, "
        f"{rate.basis}) on top of torch's {TORCH_SHUTDOWN_DEFAULT_S} s"
    )


def rdzv_conf(cfg: Config) -> list[tuple[str, str]]:
    """torchrun's --rdzv-conf. c10d and etcd-v2 (dynamic rendezvous) read `join_timeout`; the legacy
    `etcd` handler reads `timeout` instead (torch/distributed/elastic/rendezvous/etcd_rendezvous.py,
    create_rdzv_handler), which torchrun otherwise sets to 900 (launcher/api.py), so it gets both.

    c10d also gets `read_timeout`, as long as the join timeout. A node's agent that does not host
    the store connects to it as a TCPStore client that retries only for `read_timeout` (default 60
    s: torch c10d_rendezvous_backend.py, _create_tcp_store), and `join_timeout` does not cover that
    wait: a node that starts more than a minute before the one hosting the store (worker 0, or node
    0 of a TrainJob) exited 1, which the operator takes as permanent. Nodes start minutes apart on a
    real cluster: pulling a ~20 GB CUDA image onto a fresh p5, a node still joining the node group,
    the FSx mount. With both at RDZV_JOIN_TIMEOUT (600 s unless set) one number bounds the start
    skew a job tolerates, whichever node is late. It also bounds a store operation against a store
    host that hangs without closing its socket (one that dies closes it, and the client fails at
    once), which is no worse: the join would time out then too."""
    conf = [("join_timeout", str(cfg.rdzv_join_timeout))]
    if cfg.rdzv_backend == "c10d":
        conf.append(("read_timeout", str(cfg.rdzv_join_timeout)))
    if cfg.rdzv_backend == "etcd":
        conf.append(("timeout", str(cfg.rdzv_join_timeout)))
    return conf


def backoff_limit(cfg: Config) -> int:
    """runPolicy.backoffLimit: MAX_RESTARTS restarts of every node, as the operator sums restarts
    over the job's pods; 0 fails the job at its first failed pod.
    Training Operator v1.9.4 pkg/core/job.go PastBackoffLimit, common/job.go exceedsBackoffLimit."""
    return cfg.max_restarts * cfg.job_nodes


def conf_arg(cfg: Config) -> str:
    return "--rdzv-conf=" + ",".join(f"{k}={v}" for k, v in rdzv_conf(cfg))


def nnodes(cfg: Config) -> str:
    """torchrun's --nnodes: JOB_NODES, or MIN:MAX with an elastic range. The command states it as
    the PyTorchJob's elasticPolicy does (minReplicas:maxReplicas, which Training Operator v1.9.4
    puts in PET_NNODES: pkg/controller.v1/pytorch/elastic.go), since torchrun takes a flag over
    the environment (torch/distributed/run.py, env defaults of its arguments)."""
    low = cfg.fewest_nodes
    return str(cfg.job_nodes) if low == cfg.job_nodes else f"{low}:{cfg.job_nodes}"


def launch_command(cfg: Config, run_id: str) -> list[str]:
    """The PyTorchJob's container command: the pre-launch check, then torchrun with an elastic
    rendezvous in which every node's agent restarts the whole worker group after a failure
    (MAX_RESTARTS times)."""
    backend, host, port = rendezvous(cfg)
    return [
        *LAUNCH,
        f"--nnodes={nnodes(cfg)}",
        f"--nproc-per-node={cfg.procs_per_node}",
        f"--rdzv-backend={backend}",
        f"--rdzv-endpoint={host}:{port}",
        f"--rdzv-id={run_id}",
        conf_arg(cfg),
        f"--max-restarts={cfg.max_restarts}",
        "-m",
        "fsdptrain",
    ]


def metrics_port(cfg: Config) -> int:
    """On a cluster the trainer always serves /metrics for Prometheus (METRICS_PORT, else 9101);
    locally only when asked."""
    return cfg.training.metrics_port or (DEFAULT_METRICS_PORT if cfg.target.kubernetes else 0)


def hf_home(cfg: Config) -> str:
    """The Hugging Face cache: with a shared volume one download of models and tokenizers per job;
    else one per node, kept on its /local scratch for the next job."""
    return prestep.hf_home(cfg) if cfg.shared_volume else f"{POD_SCRATCH}/hf-cache"


def pod_env(cfg: Config) -> dict[str, str]:
    env = dict(cfg.train_env())
    env["CHECKPOINT_DIR"] = checkpoint_dir(cfg, cfg.job_name)
    if tb := tensorboard_dir(cfg, cfg.job_name):
        env["TENSORBOARD_DIR"] = tb
    if wdir := wandb_dir(cfg, cfg.job_name):
        env["WANDB_DIR"] = wdir
    env["HF_HOME"] = hf_home(cfg)
    env.update(prestep.hub_endpoint())  # trainers that download for themselves (no pre-step)
    if metrics_port(cfg):
        env["METRICS_PORT"] = str(metrics_port(cfg))
    env.update(COMMON_ENV)
    env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] = str(stop_timing(cfg).shutdown_s)
    env.update(GPU_ENV)
    env["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] = nccl_trace_file(cfg, cfg.job_name)
    if cfg.uses_efa:
        env.update(EFA_ENV)
    env[disruption.STOP_FILE_ENV] = f"{PODINFO_DIR}/annotations"
    if cfg.target.kubernetes:  # the leader's pod ends first, with its log (fsdptrain.disruption)
        env[disruption.LEADER_FIRST_ENV] = str(LEADER_FIRST_S)
    return env


def starts_env(cfg: Config, run_id: str) -> dict[str, str]:
    """The run's torchrun start budget (fsdptrain.disruption.record_start): the ledger beside the
    job's checkpoints (a claim every pod mounts, when there is one) and JOB_NODES first starts plus
    MAX_RESTARTS restarts of every node, the same count as runPolicy.backoffLimit, which under
    ExitCode never trips."""
    return {
        disruption.STARTS_DIR_ENV: f"{checkpoint_dir(cfg, cfg.job_name)}/.fsdpctl/starts/{run_id}",
        disruption.STARTS_MAX_ENV: str(cfg.job_nodes + backoff_limit(cfg)),
    }

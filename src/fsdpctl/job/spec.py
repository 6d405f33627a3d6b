"""A job, whatever runs it (pure): settings -> `JobSpec` once, then each backend renders it into its
own objects. The Kubernetes manifests (`fsdpctl.job.render.render_job`, which both the EKS and the
local backend start from) are one rendering; a scheduler without Kubernetes renders the same spec
into its own script.

The model is torchx's split (torchx/specs/api.py `AppDef`/`Role`/`Resource`, and a scheduler's
`_submit_dryrun` turning an AppDef into its request): the spec says what runs, with what and how
often it may restart; where and how is the backend's. Each part is decided in `fsdpctl.job.policy`
(paths, command, environment, budgets), gathered here once.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from fsdpctl.job import policy as jobpolicy
from fsdpctl.job import prestep
from fsdpctl.job.policy import StopTiming
from fsdpctl.job.validate import label_value
from fsdpctl.settings import Config
from fsdpctl.targets import Target
from fsdptrain.events import RECORD_ENV


@dataclass(frozen=True)
class Storage:
    """What the job's processes share and where they see it, resolved once from SHARED_VOLUME,
    SHARED_VOLUME_PATH, CHECKPOINT_PVC and the directories settings put on them (paths as the
    trainer sees them, inside its container or pod)."""

    shared: str  # the shared volume's claim (SHARED_VOLUME); "" without one
    shared_path: str  # where the processes see it (SHARED_VOLUME_PATH)
    checkpoint_claim: str  # CHECKPOINT_PVC, a volume for checkpoints only; "" without one
    checkpoint_root: str  # where checkpoints of every job go
    checkpoints: str  # this job's (CHECKPOINT_DIR)
    # the Hugging Face cache: on the shared volume (one download per job) or each node's scratch
    hf_home: str
    nccl_traces: str  # the flight recorder's file prefix (TORCH_NCCL_DEBUG_INFO_TEMP_FILE)
    tensorboard: str | None  # TENSORBOARD_DIR with the job's name; None when off
    wandb: str | None  # WANDB_DIR on the shared volume; None without W&B or a shared volume
    scratch: (
        tuple[str, str] | None
    )  # (node's directory, where processes see it) without a shared volume
    mounts: Mapping[str, str]  # each mount path -> the claim mounted there

    def on_a_claim(self, path: str) -> bool:
        """Whether `path` is on a volume every node sees (else it is each node's own)."""
        return any(path.startswith(m.rstrip("/") + "/") for m in self.mounts)


@dataclass(frozen=True)
class Resources:
    """What one node's processes get (requests; `cpu_limit`: the CPUs are a limit too)."""

    gpus: int
    cpus: int
    memory_gib: int
    efa: int  # EFA interfaces (0: NCCL over sockets)
    hugepages_2mi: str  # "" when nodes pre-allocate none
    shm_gib: int  # /dev/shm: NCCL's and the data loaders' shared memory
    cpu_limit: bool  # False on GPU nodes: CFS throttling of data-loading threads stalls the GPUs


@dataclass(frozen=True)
class Rendezvous:
    """torchrun's rendezvous: backend, host, port and --rdzv-conf (`jobpolicy.rdzv_conf`)."""

    backend: str
    host: str
    port: int
    conf: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class RestartPolicy:
    """How often the job restarts: torchrun's agent restarts its node's workers `max_restarts`
    times; the job fails after `backoff_limit` restarts summed over its nodes; `starts_max` bounds
    every start of every node of a run (fsdptrain.disruption.record_start)."""

    max_restarts: int
    backoff_limit: int
    starts_max: int


@dataclass(frozen=True)
class JobSpec:
    """One run of a job: what every backend renders. `env` is the job's (the same for each run);
    `run_env` is this run's (the pre-step's marker, the start budget's ledger, the run record's id).
    Secrets are not in it: `secret_env` names what the backend supplies at start
    (fsdpctl.job.hf_token.secret_env)."""

    name: str
    run_id: str
    target: Target
    nodes: int
    procs_per_node: int
    image: str  # what the trainer runs from where the place runs an image (`Target.image`)
    command: tuple[
        str, ...
    ]  # each node's: the pre-launch check, then torchrun (`jobpolicy.launch_command`)
    env: Mapping[str, str]
    run_env: Mapping[str, str]
    secret_env: tuple[str, ...]
    storage: Storage
    resources: Resources
    rendezvous: Rendezvous
    restart: RestartPolicy
    # a stop's step + checkpoint, torchrun's shutdown timeout, the grace before SIGKILL
    stop: StopTiming
    labels: Mapping[str, str]
    metrics_port: int  # 0: no /metrics
    prestep: (
        bool  # a pre-step prepares the claims (and downloads hub repos) before the trainers start
    )

    @property
    def world_size(self) -> int:
        return self.nodes * self.procs_per_node

    def command_at(self, endpoint: str) -> tuple[str, ...]:
        """`command` with torchrun's rendezvous at `endpoint` (host:port): for a place that knows
        its first node's address only when the job runs (a Slurm allocation's first host), where the
        Kubernetes rendering names worker 0's Service."""
        flag = "--rdzv-endpoint="
        return tuple(f"{flag}{endpoint}" if arg.startswith(flag) else arg for arg in self.command)


def labels(cfg: Config, run_id: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "fsdpctl-job",
        "app.kubernetes.io/managed-by": "fsdpctl",
        "fsdpctl.io/job": cfg.job_name,
        "fsdpctl.io/run-id": label_value(run_id),
    }


def storage(cfg: Config) -> Storage:
    """Where the job's files go (`render` decides each path; this is the one place they are
    gathered)."""
    mounts = {
        cfg.shared_volume_path: cfg.shared_volume,
        jobpolicy.POD_CHECKPOINT_ROOT: cfg.checkpoint_pvc,
    }
    scratch = jobpolicy.scratch(cfg)
    return Storage(
        shared=cfg.shared_volume,
        shared_path=cfg.shared_volume_path,
        checkpoint_claim=cfg.checkpoint_pvc,
        checkpoint_root=jobpolicy.checkpoint_root(cfg),
        checkpoints=jobpolicy.checkpoint_dir(cfg, cfg.job_name),
        hf_home=jobpolicy.hf_home(cfg),
        nccl_traces=jobpolicy.nccl_trace_file(cfg, cfg.job_name),
        tensorboard=jobpolicy.tensorboard_dir(cfg, cfg.job_name),
        wandb=jobpolicy.wandb_dir(cfg, cfg.job_name),
        scratch=(scratch["path"], scratch["mount"]) if scratch else None,
        mounts=MappingProxyType({path: claim for path, claim in mounts.items() if claim}),
    )


def resources(cfg: Config) -> Resources:
    """A GPU node's: its GPUs, most of its CPUs and memory, its EFA interfaces; a CPU process's: one
    CPU."""
    if not cfg.target.gpus:
        procs = cfg.procs_per_node
        return Resources(0, procs, 4, 0, "", 2, cpu_limit=True)
    inst = cfg.instance
    cpus = int(inst.vcpus * 0.9 * cfg.gpus / inst.gpus)
    efa = cfg.efa_per_node if cfg.uses_efa else 0
    return Resources(
        cfg.gpus,
        cpus,
        int(inst.memory_gib * 0.8),
        efa,
        cfg.hugepages_2mi,
        max(8, cfg.gpus * 8),
        False,
    )


def build(cfg: Config, run_id: str, record_id: str = "") -> JobSpec:
    """The job `cfg` describes, for run `run_id` (`record_id`: its run record's,
    fsdpctl.job.record)."""
    backend, host, port = jobpolicy.rendezvous(cfg)
    restart = RestartPolicy(
        cfg.max_restarts, jobpolicy.backoff_limit(cfg), cfg.job_nodes + jobpolicy.backoff_limit(cfg)
    )
    run_env = prestep.trainer_env(cfg, run_id) | jobpolicy.starts_env(cfg, run_id)
    if record_id:
        run_env[RECORD_ENV] = record_id
    return JobSpec(
        name=cfg.job_name,
        run_id=run_id,
        target=cfg.target,
        nodes=cfg.job_nodes,
        procs_per_node=cfg.procs_per_node,
        image=cfg.image_uri,
        command=tuple(jobpolicy.launch_command(cfg, run_id)),
        env=MappingProxyType(jobpolicy.pod_env(cfg)),
        run_env=MappingProxyType(run_env),
        secret_env=("HF_TOKEN",),
        storage=storage(cfg),
        resources=resources(cfg),
        rendezvous=Rendezvous(backend, host, port, tuple(jobpolicy.rdzv_conf(cfg))),
        restart=restart,
        stop=jobpolicy.stop_timing(cfg),
        labels=MappingProxyType(labels(cfg, run_id)),
        metrics_port=jobpolicy.metrics_port(cfg),
        prestep=prestep.needed(cfg),
    )

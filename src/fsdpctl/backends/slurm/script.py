"""The job as a Slurm batch script (pure): what `sbatch` runs and `fsdpctl manifest` prints.

The shape is awsome-distributed-training's FSDP sbatch (3.test_cases/pytorch/FSDP/slurm/
llama2_7b-training.sbatch): one batch script on the first node of the allocation, one `srun` task
per node running torchrun with a c10d rendezvous hosted on that first node, the rendezvous id from
the job id, the pyxis container options when there is an image, and `--auto-resume=1` on a SageMaker
HyperPod cluster. What the trainer gets is what the EKS pods get (`jobpolicy.pod_env`: EFA/NCCL,
checkpoint directory, stop timing), with the paths a pod would see on the claim read on the shared
file system at SHARED_VOLUME_PATH instead.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from fsdpctl import jobpolicy, jobspec, prestep
from fsdpctl.errors import BadInput
from fsdpctl.jobspec import JobSpec
from fsdpctl.settings import Config, Settings
from fsdptrain import disruption

# awsome's test for a SageMaker HyperPod cluster: `[ -d "/opt/sagemaker_cluster" ]`
HYPERPOD_MARK = "/opt/sagemaker_cluster"
C10D_PORT = jobpolicy.C10D_PORT  # torchrun's c10d default (awsome's endpoint names no port)


@dataclass(frozen=True)
class Paths:
    """Where a run's files are on the shared file system (the same path on every node and, for the
    CLI, on the machine that submits: a login node mounts it too)."""

    root: str  # SHARED_VOLUME_PATH/fsdpctl/slurm/<job>/<run id>

    @property
    def script(self) -> str:
        return f"{self.root}/job.sbatch"

    @property
    def batch_log(self) -> str:
        return f"{self.root}/batch.log"

    def node_log(self, node: int | str) -> str:
        return f"{self.root}/node-{node}.log"

    @property
    def stop_file(self) -> str:
        """What `job stop` writes before it signals the job: the trainer reads a stop request there
        (fsdptrain.disruption.stop_requested), as it reads the pod's annotations on Kubernetes."""
        return f"{self.root}/stop"


# Settings that mean something only to Kubernetes or to the local backend: set to anything but their
# default, they are refused rather than silently ignored (key -> why, in words).
MEANINGLESS = {
    "JOB_KIND": "Slurm runs the batch script, not a Kubernetes job API",
    "CHECKPOINT_PVC": "checkpoints live on the shared file system at SHARED_VOLUME_PATH",
    "NODE_SELECTOR": "Slurm chooses nodes by partition: set SLURM_PARTITION",
    "TOLERATIONS": "Slurm nodes have no taints",
    "SCHEDULER_NAME": "slurmctld schedules the job",
    "GANG_SCHEDULING": "Slurm allocates every node of a job at once anyway",
    "HUGEPAGES_2MI": "a batch job gets the node's memory as configured there",
    "LOCAL_PROCS_PER_NODE": "the instance type (or GPUS_PER_NODE) sets the processes per node",
    "RDZV_BACKEND": "the script's torchrun uses a c10d rendezvous on the first node",
    "KUBE_CONTEXT": "Slurm's client commands find the cluster by SLURM_CONF",
}


def refusals(cfg: Config) -> list[str]:
    """One line per setting Slurm cannot honour, naming the key, its value and the fix."""
    lines = []
    for key, why in MEANINGLESS.items():
        field = key.lower()
        value, default = getattr(cfg, field), Settings.model_fields[field].default
        if value != default:
            shown = repr(value) if isinstance(value, str) else str(value).lower()
            where = cfg.sources.get(key, "set")
            lines.append(f"{key}={shown} ({where}) means nothing on Slurm: {why}; unset it")
    if not cfg.shared_volume:
        lines.append(
            "SHARED_VOLUME='' on Slurm: the job's logs and checkpoints live on the shared file system at "
            "SHARED_VOLUME_PATH; keep SHARED_VOLUME set (its name is not used on Slurm)"
        )
    return lines


def paths(cfg: Config, run_id: str) -> Paths:
    return Paths(f"{cfg.shared_volume_path.rstrip('/')}/fsdpctl/slurm/{cfg.job_name}/{run_id}")


def trainer_env(spec: JobSpec, cfg: Config) -> dict[str, str]:
    """The job spec's environment (what the EKS pods get: EFA/NCCL, stop timing, checkpoint
    directory, the start budget) with the pod-only parts replaced: the stop request is a file on the
    shared file system, and the pre-step's marker is waited for only when the batch script downloads
    (a Slurm cluster's file system needs no preparation)."""
    run_env = dict(spec.run_env)
    if not prestep.downloads(cfg):
        run_env = {
            k: v for k, v in run_env.items() if k not in prestep.trainer_env(cfg, spec.run_id)
        }
    env = dict(spec.env) | run_env
    env[disruption.STOP_FILE_ENV] = paths(cfg, spec.run_id).stop_file
    if cfg.hf_token_file:  # read on the node; the token itself never enters the script
        env["HF_TOKEN_PATH"] = cfg.hf_token_file
    return env


def sbatch_options(spec: JobSpec, cfg: Config) -> list[str]:
    """The #SBATCH lines' options (sbatch(1)). One task per node: torchrun starts the node's processes.
    --open-mode=append: a requeued job's output would otherwise be truncated (sbatch(1) --open-mode).
    """
    opts = [
        f"--job-name={spec.name}",
        f"--nodes={spec.nodes}",
        "--ntasks-per-node=1",
        "--exclusive",
        f"--output={paths(cfg, spec.run_id).batch_log}",
        "--open-mode=append",
        # one word: sbatch splits a directive line at spaces
        f"--comment=fsdpctl-run:{spec.run_id}",
        # requeue after a node failure (sbatch(1) --requeue), as often as MAX_RESTARTS lets the
        # script run
        "--requeue" if spec.restart.max_restarts > 0 else "--no-requeue",
    ]
    if cfg.slurm_partition:
        opts.append(f"--partition={cfg.slurm_partition}")
    return opts


def torchrun_args(spec: JobSpec) -> list[str]:
    """fsdptrain.launch's (torchrun's) arguments; `$head` and `$rdzv_id` are the script's variables."""
    return [
        f"--nnodes={spec.nodes}",
        f"--nproc-per-node={spec.procs_per_node}",
        "--rdzv-backend=c10d",
        f'--rdzv-endpoint="$head":{C10D_PORT}',
        '--rdzv-id="$rdzv_id"',
        "--rdzv-conf=" + ",".join(f"{k}={v}" for k, v in spec.rendezvous.conf),
        f"--max-restarts={spec.restart.max_restarts}",
        "-m",
        "fsdptrain",
    ]


def srun_options(spec: JobSpec, cfg: Config) -> list[str]:
    """srun(1): a task per node, each node's output in its own file (%n: the node's index in the
    job), appended across requeues; the step ends when one task fails (--kill-on-bad-exit) rather
    than leaving the others waiting on collectives; pyxis's --container-image/--container-mounts
    with an image."""
    opts = [
        f"--nodes={spec.nodes}",
        "--ntasks-per-node=1",
        "--kill-on-bad-exit=1",
        f"--output={paths(cfg, spec.run_id).node_log('%n')}",
        "--open-mode=append",
    ]
    if cfg.slurm_container_image:
        shared = spec.storage.shared_path.rstrip("/")
        opts += [
            f"--container-image={cfg.slurm_container_image}",
            f"--container-mounts={shared}:{shared}",
        ]
    return opts


def _q(word: str) -> str:
    """A word for the script: quoted, except the script's own "$variables" the caller placed."""
    return word if '"$' in word else shlex.quote(word)


def render_script(cfg: Config, run_id: str, record_id: str = "") -> str:
    """The job spec (`jobspec.build`, as every backend starts from) as the whole batch script;
    BadInput naming the first setting Slurm cannot honour (`refusals`). Values are shell-quoted; the
    HF token never appears (HF_TOKEN_FILE's path does, or sbatch passes HF_TOKEN from the submitting
    environment)."""
    if problems := refusals(cfg):
        more = (
            f"{len(problems) - 1} more such setting(s) after this one"
            if len(problems) > 1
            else None
        )
        raise BadInput(problems[0], hint=more)
    spec = jobspec.build(cfg, run_id, record_id)
    root = paths(cfg, run_id).root
    python = shlex.quote(cfg.slurm_python)
    most = spec.restart.max_restarts
    lines = [
        "#!/bin/bash",
        f"# fsdpctl job {spec.name}, run {run_id}: `fsdpctl manifest` prints it, `job run` submits it",
        *(f"#SBATCH {opt}" for opt in sbatch_options(spec, cfg)),
        "set -euo pipefail",
        "",
        *(f"export {k}={shlex.quote(v)}" for k, v in trainer_env(spec, cfg).items()),
        "",
        "# a requeue runs this script again from its start (sbatch(1) --requeue); SLURM_RESTART_COUNT is",
        "# unset on the first run. MAX_RESTARTS bounds the requeues as it bounds torchrun's restarts.",
        'restarts="${SLURM_RESTART_COUNT:-0}"',
        f'if [ "$restarts" -gt {most} ]; then',
        f'    echo "fsdpctl: restart $restarts exceeds MAX_RESTARTS={most}" >&2',
        "    exit 1",
        "fi",
        f"mkdir -p {shlex.quote(root)}",
        f'echo "fsdpctl: run {run_id} start $restarts on $(hostname) nodes $SLURM_JOB_NODELIST"',
        "# the batch script runs on the first node, which hosts the c10d store",
        "# (awsome-distributed-training: --rdzv_endpoint=$(hostname))",
        'head="$(hostname)"',
        'rdzv_id="${SLURM_JOB_ID}-${restarts}"  # a fresh rendezvous per (re)start of the job',
        "auto_resume=()",
        f"if [ -d {HYPERPOD_MARK} ]; then auto_resume=(--auto-resume=1); fi  # SageMaker HyperPod",
    ]
    if prestep.downloads(cfg):  # once per run, on the first node, before any trainer starts
        fetch = " ".join(f"{k}={shlex.quote(v)}" for k, v in prestep.fetch_env(cfg).items())
        marker = shlex.quote(prestep.marker(cfg, run_id))
        lines.append(f"env {fetch} {python} -m fsdptrain.fetch --marker {marker}")
    launch = [
        *srun_options(spec, cfg),
        cfg.slurm_python,
        "-m",
        "fsdptrain.launch",
        *torchrun_args(spec),
    ]
    lines.append('srun "${auto_resume[@]}" ' + " ".join(_q(w) for w in launch))
    return "\n".join(lines) + "\n"


def manifest(cfg: Config, run_id: str) -> str:
    """What `fsdpctl manifest` prints on Slurm (targets.Target.manifest): the script `job run`
    submits."""
    return render_script(cfg, run_id)

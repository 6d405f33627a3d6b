"""The job as a Slurm batch script (pure): what `sbatch` runs and `fsdpctl manifest` prints.

The shape is awsome-distributed-training's FSDP sbatch (3.test_cases/pytorch/FSDP/slurm/
llama2_7b-training.sbatch): one batch script on the first node of the allocation, one `srun` task
per node running torchrun with a c10d rendezvous hosted on that first node, the rendezvous id from
the job id, the pyxis container options when there is an image, and `--auto-resume=1` on a SageMaker
HyperPod cluster. What the trainer gets is what the EKS pods get (`jobpolicy.pod_env`: EFA/NCCL,
checkpoint directory, stop timing), with the paths a pod would see on the claim read on the shared
file system at SHARED_VOLUME_PATH instead.

Before the trainers, a job with Hub repos downloads them once: a one-task `srun` step on the first
node, online (HF_HUB_OFFLINE is the trainers' alone: huggingface_hub reads it once, at import,
constants.py, and refuses every request under it), in the trainers' container when there is one
(pyxis applies its --container-* options to `srun`, NVIDIA/pyxis README; `#SBATCH
--container-image` would put the whole script, `srun` included, into an image that has no Slurm).
In a container the job's own variables are named in `--container-env`: otherwise an image's ENV of
the same name wins over the exported value (pyxis v0.24.0 pyxis_slurmstepd.c,
spank_import_container_env: `overwrite = 1` except for --container-env names; args.c's --help:
"their existing values in the image take precedence").

The trainers' step is started again (at most STEP_TRIES times per run of the script) when Slurm,
not the trainers, ended it: a task killed by a signal or a launch it refused. That happens to a
requeued job on a node that still held a step of the job's earlier run when its slurmd registered
again: slurmctld then sends it an abort for the job id (job_mgr.c validate_jobs_on_node: "Registered
PENDING ... on node", abort_job_on_node), which revokes the job's credentials issued up to that
second and kills every step of the job on the node (slurmd/req.c _rpc_abort_job,
slurm_cred.c _credential_revoked), the requeued run's new step included when it started first. The
retry's step, launched later, is not affected.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from fsdpctl.backends.slurm.elastic import (
    C10D_PORT,
    elastic_options,
    orphan_guard,
    ranged,
    step_nodes,
    store_lines,
)
from fsdpctl.errors import BadInput
from fsdpctl.job import owner, prestep
from fsdpctl.job import spec as jobspec
from fsdpctl.job.spec import JobSpec
from fsdpctl.settings import Config, Settings
from fsdptrain import disruption

# awsome's test for a SageMaker HyperPod cluster: `[ -d "/opt/sagemaker_cluster" ]`
HYPERPOD_MARK = "/opt/sagemaker_cluster"
# Who ended the trainers' step is read from the launchers themselves, not from srun's code: srun
# returns the highest exit code, or 128 + the highest signal when a task was killed (Slurm 22.05
# src/plugins/launch/slurm/launch_slurm.c _task_finish, srun_job.c fini_srun), so a launcher
# killed by srun's own SIGTERM before its handler was in place (143) reads as one that exited 143
# on the scheduler's. Each launcher writes its exit code in the try's ends folder
# (fsdptrain.disruption.record_end); the trainers ended the step when one of them failed on its
# own (a code other than 0 and 143, `PASSED_ON`) or every one of them ended on its own; else Slurm
# ended it (a task killed, a launch refused) and the step is started again
PASSED_ON = (0, disruption.RETRYABLE_EXIT)  # done or stopped; ended by a SIGTERM it was sent
STEP_TRIES = 3  # the trainers' step per run of the script: the first and two more
RETRY_PAUSE_S = 5  # before another try: the aborted step's processes are gone in ~1 s here


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
    if ranged(cfg) and cfg.slurm_container_image:
        lines.append(
            f"MIN_NODES={cfg.min_nodes} with SLURM_CONTAINER_IMAGE={cfg.slurm_container_image!r}: "
            "the elastic range's rendezvous store runs in the batch shell with SLURM_PYTHON, "
            "outside any container; set MIN_NODES=0 or unset SLURM_CONTAINER_IMAGE"
        )
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
    directory) with the pod-only parts replaced: the stop request is a file on the shared file
    system, and the pre-step's marker is waited for only when the batch script downloads (a Slurm
    cluster's file system needs no preparation). No torchrun start budget
    (fsdptrain.disruption.record_start): it bounds pods that an ExitCode restart policy recreates
    without end; here the script bounds every start itself (MAX_RESTARTS requeues, STEP_TRIES
    tries of the step, torchrun's --max-restarts), and the budget would only refuse a retry it
    allows."""
    pod_only = {disruption.STARTS_DIR_ENV, disruption.STARTS_MAX_ENV}
    if not prestep.downloads(cfg):
        pod_only |= set(prestep.trainer_env(cfg, spec.run_id))
    run_env = {k: v for k, v in spec.run_env.items() if k not in pod_only}
    env = dict(spec.env) | run_env
    env[disruption.STOP_FILE_ENV] = paths(cfg, spec.run_id).stop_file
    # Slurm signals every process of a step: the launcher must not forward a second SIGTERM
    env[disruption.SIGNALS_ENV] = "step"
    if cfg.hf_token_file:  # read on the node; the token itself never enters the script
        # huggingface_hub's own name for the file, and the setting's, which the download checks
        # on the node (fsdptrain.hub.token_from: a missing file fails naming it)
        env["HF_TOKEN_PATH"] = cfg.hf_token_file
        env["HF_TOKEN_FILE"] = cfg.hf_token_file
    return env


def container_options(spec: JobSpec, cfg: Config, names: list[str]) -> list[str]:
    """pyxis's options for a step with the image (none without one): the image, the shared file
    system at its own path, and `names`, the job's variables that must win over the image's ENV."""
    if not cfg.slurm_container_image:
        return []
    shared = spec.storage.shared_path.rstrip("/")
    return [
        f"--container-image={cfg.slurm_container_image}",
        f"--container-mounts={shared}:{shared}",
        "--container-env=" + ",".join(dict.fromkeys(names)),
    ]


def sbatch_options(spec: JobSpec, cfg: Config, comment: str) -> list[str]:
    """The #SBATCH lines' options (sbatch(1)). One task per node: torchrun starts the node's
    processes. --open-mode=append: a requeued job's output would otherwise be truncated (sbatch(1)
    --open-mode). --comment is the run's owner (fsdpctl.job.owner.Owner.comment: home id, job,
    token): `scontrol show job` shows it as Comment= and `squeue -o %k` lists it, so a verb proves
    a Slurm job is this run's before it signals it, and finds an interrupted submit by it.
    """
    opts = [
        f"--job-name={spec.name}",
        *elastic_options(cfg),
        "--exclusive",
        f"--output={paths(cfg, spec.run_id).batch_log}",
        "--open-mode=append",
        # one word: sbatch splits a directive line at spaces (the owner's comment has none)
        f"--comment={comment}",
        # requeue after a node failure (sbatch(1) --requeue), as often as MAX_RESTARTS lets the
        # script run
        "--requeue" if spec.restart.max_restarts > 0 else "--no-requeue",
    ]
    if cfg.slurm_partition:
        opts.append(f"--partition={cfg.slurm_partition}")
    return opts


def torchrun_args(spec: JobSpec, cfg: Config) -> list[str]:
    """fsdptrain.launch's (torchrun's) arguments; `$head` and `$rdzv_id` are the script's
    variables. With a range, `--nnodes=MIN:MAX` and `is_host=false` for every agent: the store is
    the batch script's (`store_lines`), on no node of the trainers' step."""
    conf = [f"{k}={v}" for k, v in spec.rendezvous.conf]
    nnodes = f"{cfg.fewest_nodes}:{spec.nodes}" if ranged(cfg) else str(spec.nodes)
    return [
        f"--nnodes={nnodes}",
        f"--nproc-per-node={spec.procs_per_node}",
        "--rdzv-backend=c10d",
        f'--rdzv-endpoint="$head":{C10D_PORT}',
        '--rdzv-id="$rdzv_id"',
        "--rdzv-conf=" + ",".join([*conf, *(["is_host=false"] if ranged(cfg) else [])]),
        f"--max-restarts={spec.restart.max_restarts}",
        "-m",
        "fsdptrain",
    ]


def srun_options(spec: JobSpec, cfg: Config) -> list[str]:
    """srun(1): a task per node, each node's output in its own file (%n: the node's index in the
    job), appended across requeues; the step ends when one task fails (--kill-on-bad-exit) rather
    than leaving the others waiting on collectives; pyxis's options with an image. With a range,
    on every node the job holds now (`$step_nodes`) and `--no-kill`: a failed node's tasks are
    marked ended and the step goes on (srun(1) --no-kill; api/step_launch.c _node_fail_handler),
    where -K would have no effect (srun(1)): torchrun's agents on the others re-rendezvous."""
    ends = (
        ['--nodes="$step_nodes"', "--no-kill"]
        if ranged(cfg)
        else [f"--nodes={spec.nodes}", "--kill-on-bad-exit=1"]
    )
    opts = [
        ends[0],
        "--ntasks-per-node=1",
        ends[1],
        f"--output={paths(cfg, spec.run_id).node_log('%n')}",
        "--open-mode=append",
    ]
    names = [*trainer_env(spec, cfg), disruption.ENDS_DIR_ENV]
    return opts + container_options(spec, cfg, names)


def fetch_step(spec: JobSpec, cfg: Config, run_id: str) -> str:
    """The download's line: one task on the first node (its output in the batch log), online
    (`env -u HF_HUB_OFFLINE`, also when the submitting shell had it: sbatch exports it), with the
    pre-step's variables, in the trainers' container when there is one."""
    fetch = prestep.fetch_env(cfg)
    step = ["--nodes=1", "--ntasks=1", "--kill-on-bad-exit=1"]
    own = [k for k in trainer_env(spec, cfg) if k != "HF_HUB_OFFLINE"]
    step += container_options(spec, cfg, [*own, *fetch])
    marker = prestep.marker(cfg, run_id)
    argv = [
        "env",
        "-u",
        "HF_HUB_OFFLINE",
        *(f"{k}={v}" for k, v in fetch.items()),
        "srun",
        *step,
        cfg.slurm_python,
        "-m",
        "fsdptrain.fetch",
        "--marker",
        marker,
    ]
    return " ".join(shlex.quote(w) for w in argv)


def _q(word: str) -> str:
    """A word for the script: quoted, except the script's own "$variables" the caller placed."""
    return word if '"$' in word else shlex.quote(word)


def render_script(cfg: Config, run_id: str, record_id: str = "") -> str:
    """The job spec (`jobspec.build`, as every backend starts from) as the whole batch script;
    BadInput naming the first setting Slurm cannot honour (`refusals`). Values are shell-quoted; the
    HF token never appears (HF_TOKEN_FILE's path does, or sbatch passes HF_TOKEN from the submitting
    environment). Its --comment carries this home's owner identity for the run (the home id is
    made once, on the first render: `manifest` shows the very script `job run` submits)."""
    _refuse(cfg)
    spec = jobspec.build(cfg, run_id, record_id)
    root = paths(cfg, run_id).root
    lines = [*_head(spec, cfg, run_id), *_start(spec, run_id, root)]
    if ranged(cfg):
        lines += store_lines(cfg, root)
    if prestep.downloads(cfg):  # once per run, on the first node, before any trainer starts
        lines += ["# the download: online, before any trainer", fetch_step(spec, cfg, run_id)]
    lines += _step_loop(spec, cfg, root)
    return "\n".join(lines) + "\n"


def _refuse(cfg: Config) -> None:
    """BadInput naming the first setting Slurm cannot honour, and how many more there are."""
    if problems := refusals(cfg):
        more = (
            f"{len(problems) - 1} more such setting(s) after this one"
            if len(problems) > 1
            else None
        )
        raise BadInput(problems[0], hint=more)


def _head(spec: JobSpec, cfg: Config, run_id: str) -> list[str]:
    """The script's first lines: its #SBATCH options (the owner's comment among them) and the
    trainers' environment, exported."""
    comment = owner.Owner(owner.home_id(), cfg.job_name, run_id).comment()
    return [
        "#!/bin/bash",
        f"# fsdpctl job {spec.name}, run {run_id}: `fsdpctl manifest` prints it, `job run` submits it",
        *(f"#SBATCH {opt}" for opt in sbatch_options(spec, cfg, comment)),
        "set -euo pipefail",
        "",
        *(f"export {k}={shlex.quote(v)}" for k, v in trainer_env(spec, cfg).items()),
        "",
    ]


def _start(spec: JobSpec, run_id: str, root: str) -> list[str]:
    """Each (re)start of the script: the requeue bound, the run's directory, the rendezvous host
    and HyperPod's auto-resume."""
    most = spec.restart.max_restarts
    return [
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
        "auto_resume=()",
        f"if [ -d {HYPERPOD_MARK} ]; then auto_resume=(--auto-resume=1); fi  # SageMaker HyperPod",
    ]


def _step_loop(spec: JobSpec, cfg: Config, root: str) -> list[str]:
    """The trainers' srun step, started again (up to STEP_TRIES) when Slurm, not they, ended it."""
    launch = [
        *srun_options(spec, cfg),
        *orphan_guard(cfg, spec.restart.max_restarts),
        cfg.slurm_python,
        "-m",
        "fsdptrain.launch",
        *torchrun_args(spec, cfg),
    ]
    return [
        "# the trainers; started again when Slurm, not they, ended the step (see STEP_TRIES in",
        "# fsdpctl's backends/slurm/script.py); a fresh rendezvous per (re)start and try",
        "try=1",
        "while :; do",
        '    rdzv_id="${SLURM_JOB_ID}-${restarts}-${try}"',
        *(step_nodes() if ranged(cfg) else []),
        # where each launcher says how it ended (fsdptrain.disruption.record_end), per try
        f'    export {disruption.ENDS_DIR_ENV}={shlex.quote(root)}/ends/"$rdzv_id"',
        f'    mkdir -p "${disruption.ENDS_DIR_ENV}"',
        "    rc=0",
        # bash before 4.4 calls an empty array unbound under `set -u` (bash CHANGES, bash-4.4-rc2,
        # "3. New Features in Bash" a.): ${a[@]+"${a[@]}"} expands to nothing there
        # (ParallelCluster's Amazon Linux 2: 4.2)
        '    srun ${auto_resume[@]+"${auto_resume[@]}"} '
        + " ".join(_q(w) for w in launch)
        + " || rc=$?",
        *_judge_step(spec, cfg),
        "done",
    ]


def _judge_step(spec: JobSpec, cfg: Config) -> list[str]:
    """Inside the loop, after the step: whether the trainers ended it (each launcher's end file,
    fsdptrain.disruption) or Slurm did, and then whether to start it again. With a range, a
    launcher that ended 0 means the survivors trained to the end: srun's code may still count the
    lost node's tasks, and the job succeeded."""
    passed_on = "|".join(map(str, PASSED_ON))
    nodes = '"$step_nodes"' if ranged(cfg) else str(spec.nodes)
    ends = disruption.ENDS_DIR_ENV
    done = (
        [
            f'    if [ "$failed" -eq 0 ] && grep -qx 0 "${ends}"/* 2>/dev/null; then',
            "        exit 0  # the survivors finished",
            "    fi",
        ]
        if ranged(cfg)
        else []
    )
    return [
        "    ended=0 failed=0",
        f'    for f in "${disruption.ENDS_DIR_ENV}"/*; do',
        '        [ -f "$f" ] || continue',
        "        ended=$((ended + 1))",
        f'        case "$(cat "$f")" in {passed_on}) ;; *) failed=1 ;; esac',
        "    done",
        *done,
        f'    if [ "$rc" -eq 0 ] || [ "$failed" -eq 1 ] || [ "$ended" -ge {nodes} ]; then',
        '        exit "$rc"  # the trainers ended it',
        "    fi",
        f'    if [ "$try" -ge {STEP_TRIES} ] || [ -e "${{{disruption.STOP_FILE_ENV}}}" ]; then',
        '        exit "$rc"',
        "    fi",
        f"    echo \"fsdpctl: the trainers' step ended with $rc, $ended of {spec.nodes} launchers"
        f' by themselves: Slurm ended it (try $try of {STEP_TRIES}); starting it again" >&2',
        f"    sleep {RETRY_PAUSE_S}",
        "    try=$((try + 1))",
    ]


def manifest(cfg: Config, run_id: str) -> str:
    """What `fsdpctl manifest` prints on Slurm (targets.Target.manifest): the script `job run`
    submits."""
    return render_script(cfg, run_id)

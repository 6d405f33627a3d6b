"""`python -m fsdptrain.launch [torchrun options] -m fsdptrain`: the pod's command. Checks the
trainer's settings on this node, exits 2 with one line when one is bad, waits for the job's pre-step
(with a deadline), and otherwise runs torchrun as its child, forwarding the kubelet's SIGTERM to it,
and turns the way torchrun ended into the pod's exit code (fsdptrain.disruption.pod_exit): an
evicted pod exits 143 so that the operator recreates it, the other nodes start torchrun again to
rejoin, a stop request exits 0.

Why before torchrun: its elastic agent restarts the worker group after any worker failure, exit code
2 included (torch/distributed/elastic/agent/server/api.py, `_invoke_run`), so a setting that can
never work would cost MAX_RESTARTS tries; a launcher that exits 2 instead fails the PyTorchJob at
once under `restartPolicy: ExitCode` (1-127 are permanent in the Training Operator). Pure Python
until the exec.

    python -m fsdptrain.launch --nnodes=2 --nproc-per-node=8 --rdzv-backend=c10d \\
        --rdzv-endpoint=fsdp-worker-0:29400 --rdzv-id=RUN --max-restarts=3 -m fsdptrain
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from fsdptrain import disruption, elastic, events, fetch, resume
from fsdptrain.config import (
    ConfigError,
    TrainConfig,
    from_sources,
    missing_packages,
    print_error,
)
from fsdptrain.levers import float8_refusal
from fsdptrain.resume import first_problem
from fsdptrain.shapes import job_mesh_shape


def check(cfg: TrainConfig, *, world: int, procs_per_node: int) -> None:
    """The mesh check every rank repeats at start (fsdptrain.__main__): a group size that does not
    divide."""
    job_mesh_shape(
        cfg.sharding_strategy,
        world,
        hsdp_shard_size=cfg.hsdp_shard_size,
        procs_per_node=procs_per_node,
    )


def check_device(cfg: TrainConfig) -> None:
    """What only the rank's own device can judge, before any process group: FLOAT8 needs float8
    tensor cores (the GPU first: installing torchao would not help a machine without them), then
    torchao."""
    if not cfg.float8:
        return
    gpu = float8_refusal(*local_gpu())
    missing = [line for line in missing_packages(cfg) if line.startswith("FLOAT8=")]
    if gpu or missing:
        raise ConfigError(gpu or missing[0])


def local_gpu() -> tuple[str, tuple[int, int] | None]:
    """This process's device for `float8_refusal`: torchrun's LOCAL_RANK GPU, or the CPU. Asks the
    CUDA driver only (no process group exists yet)."""
    import torch

    if not torch.cuda.is_available():
        return "no CUDA GPU (cpu)", None
    index = int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count()
    major, minor = torch.cuda.get_device_capability(index)
    return torch.cuda.get_device_name(index), (major, minor)


def option(argv: Sequence[str], name: str, environ: Mapping[str, str]) -> str | None:
    """A torchrun option's value: `--name=V` or `--name V` (either spelling, - or _), else the PET_
    variable torchrun falls back to (what the Kubeflow Trainer sets)."""
    spellings = {f"--{name}", f"--{name.replace('-', '_')}"}
    for i, arg in enumerate(argv):
        key, eq, value = arg.partition("=")
        if key in spellings:
            return value if eq else (argv[i + 1] if i + 1 < len(argv) else None)
    return environ.get("PET_" + name.upper().replace("-", "_"))


def sizes(argv: Sequence[str], environ: Mapping[str, str]) -> tuple[int, int] | None:
    """(world size, processes per node) when torchrun's options fix them; None for `gpu`/`auto`
    process counts, which only torchrun resolves (the ranks check then)."""
    nnodes, nproc = (
        option(argv, "nnodes", environ) or "1",
        option(argv, "nproc-per-node", environ) or "1",
    )
    most_nodes = nnodes.rpartition(":")[2]
    if not (most_nodes.isdigit() and nproc.isdigit()):
        return None
    return int(most_nodes) * int(nproc), int(nproc)


def nodes(argv: Sequence[str], environ: Mapping[str, str]) -> int:
    """The job's node count from torchrun's --nnodes (`N` or `MIN:MAX`: the most); 1 when unset."""
    value = option(argv, "nnodes", environ) or "1"
    most = value.rpartition(":")[2]
    return int(most) if most.isdigit() else 1


def trainer_args(argv: Sequence[str]) -> list[str] | None:
    """The trainer's own flags (after `-m fsdptrain`); None when the command runs something else."""
    if "-m" in argv:
        i = list(argv).index("-m")
        if argv[i + 1 : i + 2] == ["fsdptrain"]:
            return list(argv[i + 2 :])
    return None


def preflight(argv: Sequence[str], environ: Mapping[str, str]) -> None:
    """Raise ConfigError for what the trainer would refuse: every setting, local paths (DATASET,
    TOKENIZER, PRETRAINED on the pod's volumes), the mesh and the checkpoint it would resume
    (fsdptrain.resume); then make the flight recorder's directory."""
    args = trainer_args(argv)
    if args is None:
        return
    cfg = from_sources(args, environ)
    world = sizes(argv, environ)
    if world is not None:
        check(cfg, world=world[0], procs_per_node=world[1])
        # the checkpoint it would resume, as this node sees it: refused here, a refusal is not
        # retried
        root = Path(cfg.checkpoint_dir) if cfg.checkpoint_dir else None
        if refusal := first_problem(root, cfg, world[0]):
            raise ConfigError(refusal)
    trace = environ.get("TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
    if trace:  # NCCL writes its dumps there but makes no directory
        Path(trace).parent.mkdir(parents=True, exist_ok=True)


def with_store_host(argv: Sequence[str], environ: Mapping[str, str]) -> list[str]:
    """`is_host` in the c10d --rdzv-conf from the node's rank when the Kubeflow Trainer gives one
    (PET_NODE_RANK, the pod's Job completion index: Trainer v2.3.0
    pkg/runtime/framework/plugins/torch/ torch.go): node 0 hosts the rendezvous store, the others
    connect. Without it torchrun guesses by matching the endpoint against this machine's names and
    addresses (c10d_rendezvous_backend._create_tcp_store, utils._matches_machine_hostname), and the
    endpoint `<job>-node-0-0.<job>` is not node 0's hostname: the guess hangs on DNS answering for
    the headless Service when the agent starts. A PyTorchJob's elastic pods get no PET_NODE_RANK,
    and worker 0's hostname is its endpoint's host: torchrun's guess holds there."""
    rank = environ.get("PET_NODE_RANK", "")
    if option(argv, "rdzv-backend", environ) != "c10d" or not rank.isdigit():
        return list(argv)
    out, host = [], f"is_host={'true' if int(rank) == 0 else 'false'}"
    for arg in argv:
        key, eq, value = arg.partition("=")
        if key in ("--rdzv-conf", "--rdzv_conf") and eq and "is_host=" not in value:
            arg = f"{key}={value},{host}" if value else f"{key}={host}"
        out.append(arg)
    if (
        option(argv, "rdzv-conf", {}) is None
    ):  # none given: add one before the trainer's own arguments
        at = out.index("-m") if "-m" in out else len(out)
        out.insert(at, f"--rdzv-conf={host}")
    return out


def already_finished(argv: Sequence[str], environ: Mapping[str, str]) -> events.Finished | None:
    """The run's end, when the checkpoint it would resume is its own last one (meta.json's step at
    MAX_STEPS and record_id this run's, FSDPTRAIN_RECORD_ID); else None. A Slurm job requeued after
    its node stopped answering runs its script again from the start (sbatch(1) --requeue), also
    when its trainers had finished meanwhile: slurmctld sets a node DOWN only SlurmdTimeout after
    its last answer (slurmctld/ping_nodes.c) while its tasks keep training. A pod recreated after
    its node died past the last step is the same. That copy has nothing to do and must not fail the
    job, where a checkpoint at MAX_STEPS of another run (a finished job started again) stays refused
    (fsdptrain.resume)."""
    args = trainer_args(argv)
    if args is None or not environ.get(events.RECORD_ENV, ""):
        return None
    try:
        cfg = from_sources(args, environ)
    except ConfigError:
        return None  # preflight says what is wrong
    return finished_run(cfg, environ)


def finished_run(cfg: TrainConfig, environ: Mapping[str, str]) -> events.Finished | None:
    """already_finished's verdict for settings already read: the run's end when the checkpoint it
    would resume is its own at MAX_STEPS or past, else None."""
    record = environ.get(events.RECORD_ENV, "")
    if not record:
        return None
    wanted = resume.candidates(Path(cfg.checkpoint_dir) if cfg.checkpoint_dir else None, cfg.resume)
    meta = resume.read_meta(wanted[0]) if wanted else None
    if meta is None or meta.get("record_id") != record:
        return None
    step, loss = meta.get("step"), meta.get("loss")
    if not isinstance(step, int) or step < cfg.max_steps:
        return None
    if not isinstance(loss, int | float) or isinstance(loss, bool):
        loss = None  # a checkpoint written without one (older trainers)
    return events.Finished(
        step=step,
        max_steps=cfg.max_steps,
        loss=None if loss is None else float(loss),
        checkpoint=str(wanted[0]),
        record_id=record,
        world_changes=elastic.changes(meta) or None,
    )


def say_finished(done: events.Finished) -> None:
    """Its event line (what `fsdpctl job status` reads when no trainer's log is left) and its words."""
    print(events.to_line(done), flush=True)
    print(
        f"fsdptrain: this run already trained to MAX_STEPS={done.max_steps}: its checkpoint "
        f"{done.checkpoint} (step {done.step}) is its last; nothing left to do",
        flush=True,
    )


def wait_for_prestep(environ: Mapping[str, str]) -> None:
    """The job's pre-step marker (fsdpctl.job.prestep), once per pod and before torchrun: a failed
    download, or none within FSDPTRAIN_FETCH_WAIT_S, is a ConfigError, so the pod exits 2 and the
    job fails with that line, instead of every GPU waiting for a marker that will never come (a
    pre-step that could not write it)."""
    if environ.get(fetch.MARKER_ENV):
        say = lambda msg: print(msg, flush=True)  # noqa: E731 - one line
        fetch.wait_for_marker(
            Path(environ[fetch.MARKER_ENV]), say=say, timeout_s=fetch.wait_timeout(environ)
        )


def main(argv: Sequence[str] | None = None) -> int:
    """The launcher's exit code, also written where a Slurm batch script looks for it
    (disruption.record_end): a launcher that ends without it was ended by Slurm or the kernel."""
    code = run_launcher(list(sys.argv[1:] if argv is None else argv))
    disruption.record_end(os.environ, socket.gethostname(), code)
    return code


def run_launcher(argv: list[str]) -> int:
    if done := already_finished(argv, os.environ):
        say_finished(done)
        return 0
    try:
        preflight(argv, os.environ)
        wait_for_prestep(os.environ)
    except ConfigError as e:
        print_error(str(e), " (checked before torchrun: not retried)")
        return 2
    except OSError as e:  # the trace directory: worth a line, not a failed job
        print(
            f"fsdptrain: warning: no NCCL trace directory ({e.strerror}: {e.filename})",
            file=sys.stderr,
        )
    sys.stdout.flush()
    return run_torchrun(
        with_store_host(argv, os.environ),
        os.environ,
        finished=lambda: already_finished(argv, os.environ),
    )


def run_torchrun(
    argv: list[str],
    environ: Mapping[str, str],
    *,
    finished: Callable[[], events.Finished | None] = lambda: None,
) -> int:
    """torchrun as this process's child, started again after another node's disruption or the loss
    of the node hosting the rendezvous store (within the run's start budget); returns the pod's exit
    code (disruption.pod_exit). A SIGTERM or SIGINT is forwarded to torchrun, unless the scheduler
    signals every process of the step (Slurm: torchrun has it already, and a second one would cut
    its shutdown short: fsdptrain.disruption). `finished`: the line saying the run already trained
    to its end (checked before starting again: a store host whose run ended takes its store away
    too, and a rejoin would wait for nodes that are done)."""
    signalled: list[int] = []
    along = disruption.signals_reach_every_process(environ)

    def forward(signum: int, _frame: object) -> None:
        signalled.append(signum)
        if child and not along:
            _signal(child[0], signum)

    child: list[int] = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, forward)
    folder = tempfile.mkdtemp(prefix="fsdptrain-launch-")
    note, agent_error = os.path.join(folder, "note.json"), os.path.join(folder, "agent-error.json")
    env = {**environ, disruption.NOTE_ENV: note, disruption.AGENT_ERROR_ENV: agent_error}
    while True:
        stopping = disruption.stop_requested(environ)
        if signalled:  # before (another) torchrun: none would get the signal that came already
            return disruption.pod_exit(-signalled[0], signalled=True, note=None, stopping=stopping)
        if _start_refused(argv, environ):
            return 1
        child[:] = [_spawn(argv, env)]
        rc = _wait(child[0], note, signalled)
        verdict = _pod_exit(rc, environ, signalled, note, agent_error)
        if verdict == disruption.RESTART and along:
            # Slurm ends and restarts the whole step (or requeues the job): no node rejoins alone,
            # and a launcher left behind on a node whose slurmd died must not start torchrun
            # again for a job that moved on
            return disruption.RETRYABLE_EXIT
        if verdict == 0:
            _follow_the_leader(env, signalled)
        if verdict != disruption.RESTART:
            return verdict
        if done := finished():
            say_finished(done)
            return 0
        _again(note, agent_error)


def _start_refused(argv: list[str], environ: Mapping[str, str]) -> bool:
    """This start counted in the run's ledger: refused (said on stderr) once its start budget is
    spent; a restart says which it is."""
    ledger = disruption.record_start(environ, socket.gethostname())
    if ledger.refusal:
        print(f"fsdptrain: error: {ledger.refusal}", file=sys.stderr, flush=True)
        return True
    if line := disruption.restart_line(ledger, environ, nodes(argv, environ)):
        print(line, flush=True)
    return False


def _pod_exit(
    rc: int, environ: Mapping[str, str], signalled: list[int], note: str, agent_error: str
) -> int:
    """torchrun's return code judged with what the disruption note and the agent's error say."""
    return disruption.pod_exit(
        rc,
        signalled=bool(signalled),
        note=disruption.read_note(note),
        stopping=disruption.stop_requested(environ),
        store_lost=disruption.lost_store(agent_error),
    )


def _again(note: str, agent_error: str) -> None:
    """Said before torchrun starts again; the last run's note and agent error cleared for the
    next."""
    print(f"fsdptrain: {_why_again(note)}: starting torchrun again to rejoin", flush=True)
    for left in (note, agent_error):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(left)


def _why_again(note: str) -> str:
    if disruption.read_note(note):
        return "another node was disrupted"
    return "the rendezvous store went away with the node hosting it"


def _follow_the_leader(environ: Mapping[str, str], signalled: list[int]) -> None:
    """A follower node's pod outlives the leader's by LEADER_FIRST_S (disruption.LEADER_FIRST_ENV),
    so the job's success comes from the leader's pod and cleanPodPolicy Running deletes this one,
    not the leader's with its log; a signal (that deletion) ends the wait."""
    deadline = time.monotonic() + disruption.leader_first_s(environ)
    while not signalled and time.monotonic() < deadline:
        time.sleep(0.2)


def _spawn(argv: list[str], env: Mapping[str, str]) -> int:
    """torchrun in a child process (fork + exec: the trainer's launcher keeps no subprocess
    machinery)."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        try:
            # what the trainer writes on the shared volume stays writable by the group
            # (fsdptrain.volumes makes the job's directories setgid for the trainer's group): a
            # root-run pod's checkpoints (EFA pods run as root) can be pruned by a later non-root
            # run and removed by `cleanup --checkpoints`
            os.umask(0o002)
            os.execve(
                sys.executable, [sys.executable, "-m", "torch.distributed.run", *argv], dict(env)
            )
        finally:
            os._exit(127)
    return pid


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass


def _wait(pid: int, note: str, signalled: list[int]) -> int:
    """torchrun's return code (negative: the signal that killed it), reaping any orphan meanwhile
    (this is PID 1 in the pod). When the trainer leaves a disruption note while this pod was not
    signalled, torchrun is asked to end at once: left alone, its agent would restart the worker
    group on its own, against a rendezvous whose store may be gone with an evicted node."""
    asked = False
    while True:
        try:
            done, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return 1
        except InterruptedError:
            continue
        if done == pid:
            return os.waitstatus_to_exitcode(status)
        if done == 0:
            if not asked and not signalled and (disruption.read_note(note) or {}).get("kind"):
                _signal(pid, signal.SIGTERM)
                asked = True
            time.sleep(0.2)


if __name__ == "__main__":
    sys.exit(main())

"""`python -m fsdptrain.launch [torchrun options] -m fsdptrain`: the pod's command. Checks the trainer's
settings on this node, exits 2 with one line when one is bad, and otherwise becomes torchrun (exec: the same
process, so the kubelet's SIGTERM reaches torchrun, which forwards it to the workers).

Why before torchrun: its elastic agent restarts the worker group after any worker failure, exit code 2
included (torch/distributed/elastic/agent/server/api.py, `_invoke_run`), so a setting that can never work
would cost MAX_RESTARTS tries; a launcher that exits 2 instead fails the PyTorchJob at once under
`restartPolicy: ExitCode` (1-127 are permanent in the Training Operator). Pure Python until the exec.

    python -m fsdptrain.launch --nnodes=2 --nproc-per-node=8 --rdzv-backend=c10d \\
        --rdzv-endpoint=fsdp-worker-0:29400 --rdzv-id=RUN --max-restarts=3 -m fsdptrain
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from fsdptrain.config import (
    ConfigError,
    TrainConfig,
    float8_refusal,
    from_sources,
    missing_packages,
    print_error,
)
from fsdptrain.resume import first_problem
from fsdptrain.shapes import job_mesh_shape


def check(cfg: TrainConfig, *, world: int, procs_per_node: int) -> None:
    """The mesh check every rank repeats at start (fsdptrain.__main__): a group size that does not divide."""
    job_mesh_shape(
        cfg.sharding_strategy, world, hsdp_shard_size=cfg.hsdp_shard_size, procs_per_node=procs_per_node
    )


def check_device(cfg: TrainConfig) -> None:
    """What only the rank's own device can judge, before any process group: FLOAT8 needs float8 tensor cores
    (the GPU first: installing torchao would not help a machine without them), then torchao."""
    if not cfg.float8:
        return
    gpu = float8_refusal(*local_gpu())
    missing = [line for line in missing_packages(cfg) if line.startswith("FLOAT8=")]
    if gpu or missing:
        raise ConfigError(gpu or missing[0])


def local_gpu() -> tuple[str, tuple[int, int] | None]:
    """This process's device for `float8_refusal`: torchrun's LOCAL_RANK GPU, or the CPU. Asks the CUDA
    driver only (no process group exists yet)."""
    import torch

    if not torch.cuda.is_available():
        return "no CUDA GPU (cpu)", None
    index = int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count()
    major, minor = torch.cuda.get_device_capability(index)
    return torch.cuda.get_device_name(index), (major, minor)


def option(argv: Sequence[str], name: str, environ: Mapping[str, str]) -> str | None:
    """A torchrun option's value: `--name=V` or `--name V` (either spelling, - or _), else the PET_ variable
    torchrun falls back to (what the Kubeflow Trainer sets)."""
    spellings = {f"--{name}", f"--{name.replace('-', '_')}"}
    for i, arg in enumerate(argv):
        key, eq, value = arg.partition("=")
        if key in spellings:
            return value if eq else (argv[i + 1] if i + 1 < len(argv) else None)
    return environ.get("PET_" + name.upper().replace("-", "_"))


def sizes(argv: Sequence[str], environ: Mapping[str, str]) -> tuple[int, int] | None:
    """(world size, processes per node) when torchrun's options fix them; None for `gpu`/`auto` process
    counts, which only torchrun resolves (the ranks check then)."""
    nnodes, nproc = option(argv, "nnodes", environ) or "1", option(argv, "nproc-per-node", environ) or "1"
    most_nodes = nnodes.rpartition(":")[2]
    if not (most_nodes.isdigit() and nproc.isdigit()):
        return None
    return int(most_nodes) * int(nproc), int(nproc)


def trainer_args(argv: Sequence[str]) -> list[str] | None:
    """The trainer's own flags (after `-m fsdptrain`); None when the command runs something else."""
    if "-m" in argv:
        i = list(argv).index("-m")
        if argv[i + 1 : i + 2] == ["fsdptrain"]:
            return list(argv[i + 2 :])
    return None


def preflight(argv: Sequence[str], environ: Mapping[str, str]) -> None:
    """Raise ConfigError for what the trainer would refuse: every setting, local paths (DATASET, TOKENIZER,
    PRETRAINED on the pod's volumes), the mesh and the checkpoint it would resume (fsdptrain.resume); then
    make the flight recorder's directory."""
    args = trainer_args(argv)
    if args is None:
        return
    cfg = from_sources(args, environ)
    world = sizes(argv, environ)
    if world is not None:
        check(cfg, world=world[0], procs_per_node=world[1])
        # the checkpoint it would resume, as this node sees it: refused here, a refusal is not retried
        root = Path(cfg.checkpoint_dir) if cfg.checkpoint_dir else None
        if refusal := first_problem(root, cfg, world[0]):
            raise ConfigError(refusal)
    trace = environ.get("TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
    if trace:  # NCCL writes its dumps there but makes no directory
        Path(trace).parent.mkdir(parents=True, exist_ok=True)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        preflight(argv, os.environ)
    except ConfigError as e:
        print_error(str(e), " (checked before torchrun: not retried)")
        return 2
    except OSError as e:  # the trace directory: worth a line, not a failed job
        print(f"fsdptrain: warning: no NCCL trace directory ({e.strerror}: {e.filename})", file=sys.stderr)
    sys.stdout.flush()
    os.execv(sys.executable, [sys.executable, "-m", "torch.distributed.run", *argv])


if __name__ == "__main__":
    sys.exit(main())

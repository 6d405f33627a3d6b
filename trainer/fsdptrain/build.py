"""Everything the loop runs on, built once per run: the data (fsdptrain.data), the sharded model
(fsdptrain.model_build), the optimizer (fsdptrain.optim), the checkpoint it resumes
(fsdptrain.checkpoint), each lever as resolved on this device (fsdptrain.levers) and the numbers
each step's event needs."""

from __future__ import annotations

import os
import time
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn

from fsdptrain import checkpoint as ckpt
from fsdptrain import elastic, events
from fsdptrain.config import BUILTIN, TrainConfig
from fsdptrain.data import Loader, load_blocks, load_tokenizer
from fsdptrain.hostmem import keep_host_memory
from fsdptrain.levers import (
    Checkpointing,
    Choice,
    float8_warning,
    resolve_activation_checkpointing,
    resolve_compile,
    resolve_deterministic,
    triton_compiler,
)
from fsdptrain.metrics import GpuTelemetry, peak_tflops
from fsdptrain.model_build import build_model, param_counts
from fsdptrain.models import attention_kernel
from fsdptrain.optim import build_optimizer
from fsdptrain.parallel import DTYPES, float8_after_step, shard_degree
from fsdptrain.resume import problem as resume_problem
from fsdptrain.runtime import Runtime
from fsdptrain.shapes import flops_per_token

if TYPE_CHECKING:
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler


@dataclass
class Training:
    """What `build` makes and the loop uses."""

    cfg: TrainConfig
    model: nn.Module  # sharded in place: fully_shard made it an FSDPModule too
    hf_config: Any  # the transformers config it was built from
    tokenizer: Any
    optimizer: torch.optim.Optimizer
    scaler: ShardedGradScaler | None  # fp16 only
    loader: Loader
    checkpoint_root: Path | None
    start_step: int  # the step the run resumed after; 0 for a fresh run
    resumed_from: Path | None
    mesh_shape: tuple[int, ...]
    ac_layers: int  # decoder layers that recompute activations
    compiled: Choice  # COMPILE as resolved on this device (fsdptrain.levers)
    checkpointing: Checkpointing  # ACTIVATION_CHECKPOINTING as applied
    # each resolved lever with its reason: the banner's lines and the start event's
    levers: dict[str, str]
    after_step: Any  # float8's scale precompute after each optimizer step (a callable), or None
    n_params: int
    flops_per_token: int
    peak_tflops: float | None  # per device; None: unknown, no MFU
    tokens_per_step: int  # the whole job's
    gpu: GpuTelemetry
    kill_at_save: int | None  # FSDPTRAIN_FAILPOINT (the fault tests); None in every real run
    slow_save_s: float = 0.0  # FSDPTRAIN_FAILPOINT=slow-save (the stop tests); 0 in every real run
    # FSDPTRAIN_FAILPOINT=hold-until-stop|hold-until-file (the walk-through and conformance tests):
    # the step to wait after, and the file whose existence also ends the wait ("": none)
    hold: tuple[int, str] | None = None
    # the TensorBoard/W&B run it writes: that of the run whose checkpoint it continues
    # (RESUME=auto), else its own id; kept in each checkpoint it saves, so a job's curve is one
    # across stops and resumes
    tracker_run: str = ""
    # where ranks agree to stop: a gloo group on GPUs, None (the default) on CPU
    control_group: Any = None
    # the global batch on this world, and the rule that made it (fsdptrain.elastic); None only in
    # a Training built by hand (tests): then GRAD_ACCUM_STEPS as set
    batch: elastic.Batch | None = None
    # every world change of the job up to this run's, oldest first: kept in each checkpoint
    world_changes: list[dict[str, Any]] = field(default_factory=list)

    @property
    def grad_accum(self) -> int:
        """Micro-batches per rank per step as trained: GRAD_ACCUM_STEPS unless the world changed."""
        return self.batch.grad_accum if self.batch is not None else self.cfg.grad_accum_steps


def set_up_torch(cfg: TrainConfig, device: torch.device) -> bool:
    """Seeds, warnings, deterministic mode; on the CPU also malloc's thresholds (fsdptrain.hostmem).
    Returns whether those were set."""
    # init is seeded per shard coordinate (build_model), so DTensor's CPU RNG caveat does not apply
    warnings.filterwarnings(
        "ignore", message="DTensor random operators may not have complete support"
    )
    torch.manual_seed(cfg.seed)
    torch.use_deterministic_algorithms(
        resolve_deterministic(cfg.deterministic, device.type), warn_only=True
    )
    return device.type == "cpu" and keep_host_memory()


def build(cfg: TrainConfig, rt: Runtime) -> Training:
    """Data, the sharded model (fresh or pretrained), optimizer, and a checkpoint's state to resume
    from."""
    cfg = _with_builtin_assets(cfg, rt)
    rt.emit(events.Stage(stage="loading data", time=time.time()))
    tokenizer = load_tokenizer(cfg.tokenizer_path)
    blocks = load_blocks(cfg, tokenizer)
    compiled, checkpointing = _compile_and_checkpointing(cfg, rt.device)
    rt.emit(events.Stage(stage="building the model", time=time.time()))
    model, hf_config, mesh, ac_layers = build_model(cfg, rt, tokenizer, compiled.on, checkpointing)
    optimizer, scaler = build_optimizer(cfg, model, rt.device)
    root = Path(cfg.checkpoint_dir) if cfg.checkpoint_dir else None
    resumed_from, meta = _resume(cfg, rt, root, model, optimizer)
    start_step, consumed = _start_at(rt, resumed_from, meta)
    batch, world_changes = _elastic(cfg, rt, meta, resumed_from)
    n_params, embed_params = param_counts(model)
    return Training(
        cfg=cfg,
        model=model,
        hf_config=hf_config,
        tokenizer=tokenizer,
        optimizer=optimizer,
        scaler=scaler,
        loader=_loader(cfg, rt, blocks, consumed),
        checkpoint_root=root,
        start_step=start_step,
        resumed_from=resumed_from,
        mesh_shape=tuple(mesh.shape),
        ac_layers=ac_layers,
        compiled=compiled,
        checkpointing=checkpointing,
        levers=_levers_resolved(cfg, rt, hf_config, compiled, checkpointing, ac_layers),
        after_step=float8_after_step(cfg.float8_recipe, shard_degree(mesh)) if cfg.float8 else None,
        n_params=n_params,
        flops_per_token=flops_per_token(
            n_params, embed_params, hf_config.num_hidden_layers, hf_config.hidden_size, cfg.seq_len
        ),
        peak_tflops=peak_tflops(rt.device, cfg.precision, cfg.peak_tflops),
        tokens_per_step=batch.global_batch * cfg.seq_len,
        gpu=GpuTelemetry(rt.device),
        kill_at_save=ckpt.failpoint_step(os.environ),
        slow_save_s=ckpt.failpoint_slow_save(os.environ),
        hold=ckpt.failpoint_hold(os.environ),
        tracker_run=_tracker_run(cfg, meta),
        # collective: every rank makes it here, in the same order
        control_group=dist.new_group(backend="gloo") if rt.device.type == "cuda" else None,
        batch=batch,
        world_changes=world_changes,
    )


def _elastic(
    cfg: TrainConfig, rt: Runtime, meta: dict[str, Any] | None, resumed_from: Path | None
) -> tuple[elastic.Batch, list[dict[str, Any]]]:
    """The global batch rule on this world (fsdptrain.elastic), and the job's world changes with
    this run's own when it resumed a checkpoint saved on another world: then a log line says which
    rule applied and a `world` event records it."""
    batch = elastic.batch_for(
        micro_batch=cfg.micro_batch_size,
        grad_accum=cfg.grad_accum_steps,
        world=rt.world,
        target=elastic.job_target(
            meta, micro_batch=cfg.micro_batch_size, grad_accum=cfg.grad_accum_steps
        ),
    )
    changes = elastic.changes(meta)
    was = meta.get("world_size") if meta is not None else None
    if meta is None or not isinstance(was, int) or was == rt.world:
        return batch, changes
    step = int(meta["step"])
    event = events.World(
        step=step,
        from_world=was,
        to_world=rt.world,
        from_nodes=meta.get("nodes") if isinstance(meta.get("nodes"), int) else None,
        to_nodes=nodes(rt),
        rule=batch.rule,
        grad_accum=batch.grad_accum,
        global_batch=batch.global_batch,
        target_global_batch=batch.target,
        checkpoint=str(resumed_from),
        time=time.time(),
    )
    rt.log(
        elastic.describe(
            batch,
            was=was,
            micro_batch=cfg.micro_batch_size,
            grad_accum=cfg.grad_accum_steps,
            step=step,
        )
    )
    rt.emit(event)
    return batch, [*changes, events.as_record(event)]


def nodes(rt: Runtime) -> int:
    """The job's nodes: its ranks over the processes each node runs (torchrun's LOCAL_WORLD_SIZE,
    the same on every node here)."""
    return max(1, rt.world // max(1, rt.local_world))


def _compile_and_checkpointing(
    cfg: TrainConfig, device: torch.device
) -> tuple[Choice, Checkpointing]:
    """COMPILE as resolved on this device, and ACTIVATION_CHECKPOINTING as it can apply with it
    (fsdptrain.levers)."""
    compiled = resolve_compile(
        cfg.compile, device.type, triton_compiler() if device.type == "cuda" else ""
    )
    checkpointing = resolve_activation_checkpointing(
        cfg.activation_checkpointing, cfg.ac_every, compiled.on
    )
    return compiled, checkpointing


def _resume(
    cfg: TrainConfig,
    rt: Runtime,
    root: Path | None,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
) -> tuple[Path | None, dict[str, Any] | None]:
    """The checkpoint RESUME names, loaded into the model and the optimizer: (its path, its
    meta.json), or (None, None) for a fresh start (fsdptrain.checkpoint.resume)."""
    rt.emit(events.Stage(stage="choosing a checkpoint to resume", time=time.time()))
    path, meta = ckpt.resume(  # one decision for every rank
        root,
        cfg.resume,
        model=model,
        optimizer=optimizer,
        check=lambda meta, where: resume_problem(meta, cfg, rt.world, where=where),
        log=rt.log,
    )
    if meta is not None:
        ckpt.trace_loaded(model, int(meta["step"]))
    return path, meta


def _start_at(
    rt: Runtime, resumed_from: Path | None, meta: dict[str, Any] | None
) -> tuple[int, int]:
    """The step to start from and the samples already consumed: the resumed checkpoint's (said in
    the log), else (0, 0)."""
    start_step, consumed = (meta["step"], meta["consumed"]) if meta is not None else (0, 0)
    if resumed_from is not None:
        rt.log(f"resumed from {resumed_from} at step {start_step}")
    return start_step, consumed


def _loader(cfg: TrainConfig, rt: Runtime, blocks: Any, consumed: int) -> Loader:
    """This rank's micro-batches, from the first block the resumed run had not trained on."""
    trace = os.environ.get(ckpt.TRACE_ENV)
    return Loader(
        blocks,
        rank=rt.rank,
        world=rt.world,
        micro_batch=cfg.micro_batch_size,
        consumed=consumed,
        prefetch=2,  # batches built on a background thread while the step runs
        pin_memory=rt.device.type == "cuda",
        trace=Path(trace) / f"data-rank{rt.rank:05d}-pid{os.getpid()}.txt" if trace else None,
    )


def _tracker_run(cfg: TrainConfig, meta: dict[str, Any] | None) -> str:
    """The checkpoint's tracker run when this run continues the job's own line (RESUME=auto); an
    explicit RESUME (a rerun, a run started from a chosen checkpoint) is a curve of its own."""
    from fsdptrain.trackers import run_id

    kept = meta.get("tracker_run") if meta is not None and cfg.resume == "auto" else None
    return kept if isinstance(kept, str) and kept else run_id()


def _with_builtin_assets(cfg: TrainConfig, rt: Runtime) -> TrainConfig:
    """DATASET/TOKENIZER=builtin: the offline sample assets, made once per node (local rank 0) and
    shared."""
    if BUILTIN not in (cfg.dataset, cfg.tokenizer_path):
        return cfg
    from fsdptrain.assets import default_cache, ensure_assets

    if rt.local_rank == 0:
        ensure_assets(default_cache())
    dist.barrier()
    corpus, tok = ensure_assets(default_cache())
    return replace(
        cfg,
        dataset=str(corpus) if cfg.dataset == BUILTIN else cfg.dataset,
        tokenizer=str(tok) if cfg.tokenizer_path == BUILTIN else cfg.tokenizer,
    )


def _levers_resolved(
    cfg: TrainConfig,
    rt: Runtime,
    hf_config: Any,
    compiled: Choice,
    checkpointing: Checkpointing,
    ac_layers: int,
) -> dict[str, str]:
    """Each lever's decision and its reason, for the human log and the start event
    (fsdptrain.levers)."""
    ac = f"{checkpointing.mode}, {ac_layers} layers" if ac_layers else "off"
    if checkpointing.note:  # the warning line says why
        ac += (
            f" (ACTIVATION_CHECKPOINTING={cfg.activation_checkpointing} without compile: "
            "layer-level)"
        )
    found = {
        "compile": f"{'on' if compiled.on else 'off'} ({compiled.why})",
        "activation_checkpointing": ac,
        "attention": attention_kernel(
            hf_config, rt.device, DTYPES[cfg.precision], cfg.micro_batch_size, cfg.seq_len
        )
        + f" (SDPA_BACKENDS={cfg.sdpa_backends})",
        "gc": f"every {cfg.gc_interval} steps" if cfg.gc_interval else "automatic",
    }
    if cfg.float8:
        found["float8"] = f"{cfg.float8_recipe}" + (
            f" (warning: {float8_warning(cfg.float8, compiled.on)})" if not compiled.on else ""
        )
    return found

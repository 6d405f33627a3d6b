"""The FSDP2 training program that runs in every pod (and on a laptop): build, then one loop.

    # CPU smoke run, 2 processes (gloo); assets made offline by `python -m fsdptrain.assets assets`
    torchrun --nproc-per-node 2 -m fsdptrain --model tiny \\
        --dataset assets/corpus.txt --tokenizer assets/tokenizer
    # one node, 8 GPUs (NCCL is picked automatically)
    torchrun --nproc-per-node 8 -m fsdptrain --model 7b --dataset /fsx/data --tokenizer /fsx/llama2-tokenizer
    # N nodes: what the PyTorchJob runs, settings from the environment (MODEL, SHARDING_STRATEGY, ...)
    torchrun --nnodes N --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29400 -m fsdptrain

Every setting: `python -m fsdptrain --help`. Exit codes: 0 done (also after `fsdpctl job stop`, with
a checkpoint), 1 failure, 2 bad setting, 75 disrupted (SIGTERM: checkpointed, to be resumed; see
fsdptrain.disruption). Rank 0 prints human lines and event lines (fsdptrain.events) for fsdpctl.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
import warnings
from dataclasses import dataclass, field, replace
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

from fsdptrain import checkpoint as ckpt
from fsdptrain import disruption, events, hf_io
from fsdptrain.config import (
    BUILTIN,
    ConfigError,
    TrainConfig,
    print_error,
    resolve_deterministic,
    resolve_fused_optimizer,
)
from fsdptrain.data import Loader, load_blocks, load_tokenizer
from fsdptrain.hostmem import keep_host_memory
from fsdptrain.levers import (
    Checkpointing,
    Choice,
    GarbageCollection,
    float8_warning,
    resolve_activation_checkpointing,
    resolve_compile,
    triton_compiler,
)
from fsdptrain.metrics import (
    GpuTelemetry,
    SavedActivations,
    local_state_bytes,
    memory_stats,
    peak_tflops,
)
from fsdptrain.models import (
    MODEL_CONFIGS,
    attention_kernel,
    build_meta_model,
    init_weights,
    llama_config,
    sdpa_priority,
    use_causal_sdpa,
)
from fsdptrain.parallel import DTYPES, build_mesh, float8_after_step, parallelize, shard_degree
from fsdptrain.resume import math_settings
from fsdptrain.resume import problem as resume_problem
from fsdptrain.runtime import (
    Runtime,
    close_outputs,
    init_distributed,
    leader_event,
    open_outputs,
    start_trackers,
)
from fsdptrain.shapes import flops_per_token

if TYPE_CHECKING:
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler


def run(cfg: TrainConfig) -> int:
    """Run a validated config in this process (one rank of the job); returns the exit code."""
    rt = init_distributed(cfg.collective_timeout)
    open_outputs(cfg, rt)
    rt.emit(leader_event(rt))
    try:
        summary = train(cfg, rt)
        return _ended(rt, summary)
    except ConfigError as e:
        print_error(str(e))
        return 2
    except ckpt.CheckpointError as e:
        print_error(str(e))
        # a full or unwritable volume: the same save would fail on every retry
        # (fsdptrain.disruption)
        disruption.write_note(os.environ, "failed", error=str(e))
        return 1
    finally:
        close_outputs(rt)
        if dist.is_initialized():
            dist.destroy_process_group()


DISRUPTED_EXIT = (
    75  # EX_TEMPFAIL: checkpointed, not done; the pod's launcher decides what comes next
)


def _ended(rt: Runtime, summary: events.Summary) -> int:
    """0, unless the run was disrupted: then the launcher gets a note and the worker exits non-zero,
    since a 0 from any worker pod would mark the whole elastic PyTorchJob Succeeded
    (fsdptrain.disruption)."""
    if summary.stop_reason != "disrupted":
        return 0
    if rt.local_rank == 0:
        disruption.write_note(os.environ, "disrupted", step=summary.start_step + summary.steps)
    return DISRUPTED_EXIT


def train(cfg: TrainConfig, rt: Runtime) -> events.Summary:
    """Build, train to MAX_STEPS (or until a stop request or a disruption), export; returns the
    summary rank 0 printed."""
    kept = _set_up_torch(cfg, rt.device)
    with sdpa_priority(
        cfg.sdpa_backends
    ):  # for the whole run: compiled layers read it when they trace
        t = build(cfg, rt)
        rt.log(_banner(t, rt, host_malloc_kept=kept))
        for line in _lever_lines(t):
            rt.log(line)
        if rt.rank == 0:  # what this run is made of, for fsdpctl's run record
            from fsdptrain.provenance import start_event

            rt.emit(
                start_event(
                    t.cfg, rt.device, t.start_step, levers=t.levers, resumed_from=t.resumed_from
                )
            )
        start_trackers(t.cfg, rt, t.start_step, t.tracker_run)
        gc_control = GarbageCollection(cfg.gc_interval, rt.log)
        try:
            outcome = loop(t, rt, gc_control)
        finally:  # the data thread goes with the loop, also on an error or SIGTERM's stop
            t.loader.close()
            gc_control.close()
        return finish(t, rt, outcome)


def _set_up_torch(cfg: TrainConfig, device: torch.device) -> bool:
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


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warmup to LR, then cosine down to LR * MIN_LR_RATIO at MAX_STEPS (step counts from 1)."""
    if cfg.warmup_steps and step <= cfg.warmup_steps:
        return cfg.lr * step / cfg.warmup_steps
    span = max(1, cfg.max_steps - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / span)
    floor = cfg.lr * cfg.min_lr_ratio
    return floor + 0.5 * (cfg.lr - floor) * (1 + math.cos(math.pi * progress))


# ---- build -----------------------------------------------------------------------------------------------


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
    levers: dict[
        str, str
    ]  # each resolved lever with its reason: the banner's lines and the start event's
    after_step: Any  # float8's scale precompute after each optimizer step (a callable), or None
    n_params: int
    flops_per_token: int
    peak_tflops: float | None  # per device; None: unknown, no MFU
    tokens_per_step: int  # the whole job's
    gpu: GpuTelemetry
    kill_at_save: int | None  # FSDPTRAIN_FAILPOINT (the fault tests); None in every real run
    slow_save_s: float = 0.0  # FSDPTRAIN_FAILPOINT=slow-save (the stop tests); 0 in every real run
    hold_at: int | None = (
        None  # FSDPTRAIN_FAILPOINT=hold-until-stop (the walk-through test); else None
    )
    # the TensorBoard/W&B run it writes: that of the run whose checkpoint it continues
    # (RESUME=auto), else its own id; kept in each checkpoint it saves, so a job's curve is one
    # across stops and resumes
    tracker_run: str = ""
    control_group: Any = (
        None  # where ranks agree to stop: a gloo group on GPUs, None (the default) on CPU
    )


def build(cfg: TrainConfig, rt: Runtime) -> Training:
    """Data, the sharded model (fresh or pretrained), optimizer, and a checkpoint's state to resume
    from."""
    cfg = _with_builtin_assets(cfg, rt)
    rt.emit(events.Stage(stage="loading data", time=time.time()))
    tokenizer = load_tokenizer(cfg.tokenizer_path)
    blocks = load_blocks(cfg, tokenizer)
    compiled = resolve_compile(
        cfg.compile, rt.device.type, triton_compiler() if rt.device.type == "cuda" else ""
    )
    checkpointing = resolve_activation_checkpointing(
        cfg.activation_checkpointing, cfg.ac_every, compiled.on
    )
    rt.emit(events.Stage(stage="building the model", time=time.time()))
    model, hf_config, mesh, ac_layers = build_model(cfg, rt, tokenizer, compiled.on, checkpointing)
    optimizer, scaler = build_optimizer(cfg, model, rt.device)
    root = Path(cfg.checkpoint_dir) if cfg.checkpoint_dir else None
    rt.emit(events.Stage(stage="choosing a checkpoint to resume", time=time.time()))
    resumed_from, meta = ckpt.resume(  # one decision for every rank
        root,
        cfg.resume,
        model=model,
        optimizer=optimizer,
        check=lambda meta, where: resume_problem(meta, cfg, rt.world, where=where),
        log=rt.log,
    )
    start_step, consumed = (meta["step"], meta["consumed"]) if meta is not None else (0, 0)
    if resumed_from is not None:
        rt.log(f"resumed from {resumed_from} at step {start_step}")
    n_params, embed_params = _param_counts(model)
    return Training(
        cfg=cfg,
        model=model,
        hf_config=hf_config,
        tokenizer=tokenizer,
        optimizer=optimizer,
        scaler=scaler,
        loader=Loader(
            blocks,
            rank=rt.rank,
            world=rt.world,
            micro_batch=cfg.micro_batch_size,
            consumed=consumed,
            prefetch=2,  # batches built on a background thread while the step runs
            pin_memory=rt.device.type == "cuda",
        ),
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
        tokens_per_step=cfg.micro_batch_size * cfg.seq_len * cfg.grad_accum_steps * rt.world,
        gpu=GpuTelemetry(rt.device),
        kill_at_save=ckpt.failpoint_step(os.environ),
        slow_save_s=ckpt.failpoint_slow_save(os.environ),
        hold_at=ckpt.failpoint_hold(os.environ),
        tracker_run=_tracker_run(cfg, meta),
        # collective: every rank makes it here, in the same order
        control_group=dist.new_group(backend="gloo") if rt.device.type == "cuda" else None,
    )


def _tracker_run(cfg: TrainConfig, meta: dict[str, Any] | None) -> str:
    """The checkpoint's tracker run when this run continues the job's own line (RESUME=auto); an
    explicit RESUME (a rerun, a run started from a chosen checkpoint) is a curve of its own."""
    from fsdptrain.trackers import run_id

    kept = meta.get("tracker_run") if meta is not None and cfg.resume == "auto" else None
    return kept if isinstance(kept, str) and kept else run_id()


def build_model(
    cfg: TrainConfig, rt: Runtime, tokenizer: Any, compiled: bool, checkpointing: Checkpointing
) -> tuple[nn.Module, Any, Any, int]:
    """Meta-device model -> sharded -> materialised shard by shard -> weights (fresh or pretrained).
    Returns (model, its transformers config, the device mesh, layers with activation checkpointing).
    """
    from transformers import AutoConfig

    if cfg.pretrained:
        path = hf_io.resolve_pretrained(cfg.pretrained, local_rank=rt.local_rank)
        config = AutoConfig.from_pretrained(str(path))
    else:
        config = llama_config(
            cfg.model, vocab_size=max(len(tokenizer), MODEL_CONFIGS[cfg.model].vocab)
        )
    # no KV cache in training: it is never read, and selective checkpointing's recompute would find
    # the keys of the forward already in it (a different op sequence, which torch.utils.checkpoint
    # refuses)
    config.use_cache = False
    use_causal_sdpa(
        config
    )  # SDPA without transformers' per-forward packed-sequence check (a host sync)
    model = build_meta_model(config)
    mesh = build_mesh(
        rt.device.type,
        cfg.sharding_strategy,
        rt.world,
        hsdp_shard_size=cfg.hsdp_shard_size,
        procs_per_node=rt.local_world,
    )
    ac_layers = parallelize(
        model,
        mesh=mesh,
        strategy=cfg.sharding_strategy,
        precision=cfg.precision,
        ac_mode=checkpointing.mode,
        ac_every=checkpointing.every,
        compile=compiled,
        float8=cfg.float8,
        float8_recipe=cfg.float8_recipe,
        prefetch=cfg.fsdp_prefetch,
    )
    # replicas (HSDP/NO_SHARD) must start identical, shards must differ: seed by position in the
    # shard dim
    shard_coord = mesh.get_local_rank("shard") if mesh.ndim == 2 else mesh.get_local_rank()
    torch.manual_seed(cfg.seed + 7919 * shard_coord)
    init_weights(model, config, rt.device)
    if cfg.pretrained:
        hf_io.load_pretrained(path, model=model)
    return model, config, mesh, ac_layers


def build_optimizer(
    cfg: TrainConfig, model: nn.Module, device: torch.device
) -> tuple[torch.optim.Optimizer, ShardedGradScaler | None]:
    """AdamW over the sharded parameters (fused or foreach: FUSED_OPTIMIZER); a loss scaler for fp16
    (bf16 and fp32 need none)."""
    fused = resolve_fused_optimizer(cfg.fused_optimizer, device.type)
    optimizer = torch.optim.AdamW(
        model.parameters(),
        lr=cfg.lr,
        betas=(0.9, 0.95),
        weight_decay=cfg.weight_decay,
        fused=fused,
        foreach=not fused,  # torch refuses both at once
    )
    if cfg.precision != "fp16":
        return optimizer, None
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

    return optimizer, ShardedGradScaler(device=device.type)


def _param_counts(model: nn.Module) -> tuple[int, int]:
    """(all parameters, input-embedding parameters), for FLOPs per token."""
    embeddings = cast(Any, model).get_input_embeddings()  # a transformers model
    return sum(p.numel() for p in model.parameters()), embeddings.weight.numel()


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


def _hf_token_given() -> bool:
    """HF_TOKEN (local runs) or the Secret mounted as a file at HF_TOKEN_PATH (pods);
    huggingface_hub reads both."""
    return bool(os.environ.get("HF_TOKEN")) or os.path.isfile(os.environ.get("HF_TOKEN_PATH", ""))


def _banner(t: Training, rt: Runtime, *, host_malloc_kept: bool) -> str:
    cfg = t.cfg
    ac = "off" if t.ac_layers == 0 else f"{t.checkpointing.mode} ({t.ac_layers} layers)"
    return (
        f"fsdptrain: model {cfg.pretrained or cfg.model} ({t.n_params / 1e6:.2f}M params), "
        f"{cfg.sharding_strategy} mesh {t.mesh_shape}, {cfg.precision}, "
        f"activation checkpointing {ac}, world {rt.world} on {rt.device.type}, "
        f"{t.tokens_per_step} tokens/step, steps {t.start_step + 1}..{cfg.max_steps}"
        + "".join(f", {lever}" for lever in _levers(t, rt.device, host_malloc_kept))
        + (", HF token set" if _hf_token_given() else "")
    )


def _levers(t: Training, device: torch.device, host_malloc_kept: bool) -> list[str]:
    """The speed settings this run took, for the banner (whether malloc's thresholds were set is
    known only once fsdptrain.hostmem tried)."""
    cfg = t.cfg
    on = {
        "compiled layers": t.compiled.on,
        "float8 linears": cfg.float8,
        "fused AdamW": resolve_fused_optimizer(cfg.fused_optimizer, device.type),
        "deterministic": resolve_deterministic(cfg.deterministic, device.type),
    }
    taken = [name for name, took in on.items() if took] + [f"FSDP prefetch {cfg.fsdp_prefetch}"]
    return taken + (["host malloc kept between steps"] if host_malloc_kept else [])


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
        ac += f" (ACTIVATION_CHECKPOINTING={cfg.activation_checkpointing} without compile: layer-level)"
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


def _lever_lines(t: Training) -> list[str]:
    """The human lines of the resolved levers; a choice the user should act on as a warning line."""
    lines = [f"levers: compile {t.levers['compile']}; attention {t.levers['attention']}"]
    lines.append(
        f"levers: activation checkpointing {t.levers['activation_checkpointing']}; gc {t.levers['gc']}"
    )
    if t.checkpointing.note:
        lines.append(f"warning: {t.checkpointing.note}")
    if warning := float8_warning(t.cfg.float8, t.compiled.on):
        lines.append(f"warning: {warning}")
    if (
        not t.compiled.on
        and t.cfg.compile == "auto"
        and t.compiled.why.startswith("COMPILE=auto: off, ")
    ):
        lines.append(f"warning: {t.compiled.why}")
    return lines


# ---- the loop --------------------------------------------------------------------------------------------


@dataclass
class Outcome:
    history: list[events.Step]
    checkpoint: str | None  # the newest one this run wrote, or the one it resumed from
    stopped: bool = False  # before MAX_STEPS: asked to, or disrupted
    reason: int = disruption.NONE  # why (fsdptrain.disruption: STOP or DISRUPTED)
    # measured on the run's first step: this rank's sharded state, and the activations saved for
    # backward
    state_bytes: dict[str, int] = field(
        default_factory=lambda: {"param_bytes": 0, "grad_bytes": 0, "optim_bytes": 0}
    )
    activation_bytes: int = 0


def loop(t: Training, rt: Runtime, gc_control: GarbageCollection | None = None) -> Outcome:
    """Steps start_step+1..MAX_STEPS; logs every LOG_INTERVAL, checkpoints every
    CHECKPOINT_INTERVAL, at the end and when a stop request or a disruption arrives (then stops).

    A step leaves its loss and gradient norm on the device; they are read (one all-reduce, one host
    sync) only when something needs them: a logged step, a checkpoint, the run's first step (timed
    on its own: it pays the warm-up) and the last. Every step still gets its full event in the
    history."""
    cfg = t.cfg
    out = Outcome(history=[], checkpoint=str(t.resumed_from) if t.resumed_from else None)
    pending: list[StepResult] = []
    since = time.perf_counter()  # the start of the steps not read yet
    trained_since = since  # the end of the last save
    for step in range(t.start_step + 1, cfg.max_steps + 1):
        first = step == t.start_step + 1
        measure = SavedActivations(rt.device) if first else None
        result = _train_step(
            step=step,
            cfg=cfg,
            rt=rt,
            model=t.model,
            optimizer=t.optimizer,
            scaler=t.scaler,
            loader=t.loader,
            measure=measure,
            after_step=t.after_step,
        )
        if gc_control is not None:
            gc_control.step(step)
        if measure is not None and result.state_bytes is not None:
            out.state_bytes, out.activation_bytes = result.state_bytes, measure.bytes
        pending.append(result)
        out.reason = _agree_end(rt, t.control_group)
        out.stopped = out.reason != disruption.NONE
        log_due = step % cfg.log_interval == 0 or step == cfg.max_steps or out.stopped
        save_due = t.checkpoint_root is not None and _checkpoint_due(cfg, step, out.stopped)
        if not (first or log_due or save_due):
            continue
        out.history += _read_steps(t, rt, pending, since)
        pending = []
        event = out.history[-1]
        if log_due:
            rt.emit(event)
            rt.log(_human(event))
        if t.checkpoint_root is not None and save_due:
            began = time.perf_counter()
            out.checkpoint = _save_checkpoint(t, t.checkpoint_root, step=step, loss=event.loss)
            rt.emit(events.Checkpoint(step=step, path=out.checkpoint))
            _warn_if_slower_than_training(
                rt, cfg, step, time.perf_counter() - began, began - trained_since
            )
            trained_since = time.perf_counter()
        if out.stopped:
            rt.log(
                f"{disruption.describe(out.reason)}: stopped at step {step}, checkpoint {out.checkpoint}"
            )
            break
        if step == t.hold_at:
            _hold_until_stop(rt)
        since = time.perf_counter()  # logging and checkpointing are not step time
    return out


@dataclass(frozen=True)
class StepResult:
    """One step as the device left it: nothing here has been read back to the host."""

    step: int
    loss_sum: (
        torch.Tensor
    )  # this rank's loss (summed over micro-batches, each divided by their count)
    grad_norm: torch.Tensor  # the global norm before clipping, the same on every rank
    data_wait_s: float
    state_bytes: dict[str, int] | None  # when measured: the run's first step


def _train_step(
    *,
    step: int,
    cfg: TrainConfig,
    rt: Runtime,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scaler: ShardedGradScaler | None,
    loader: Loader,
    measure: SavedActivations | None = None,
    after_step: Any = None,
) -> StepResult:
    """One optimizer step over GRAD_ACCUM_STEPS micro-batches, without a host sync. With `measure`
    (the run's first step) it also counts the activations saved for backward and this rank's sharded
    state."""
    for group in optimizer.param_groups:
        group["lr"] = lr_at(step, cfg)
    loss_sum, data_wait = _forward_backward(
        cfg=cfg, rt=rt, model=model, scaler=scaler, loader=loader, measure=measure
    )
    grad_norm = _clip_and_step(cfg, model, optimizer, scaler)
    if (
        after_step is not None
    ):  # float8: the next forward's weight scales, while the weights are fresh
        after_step(model)
    # grads and optimizer state both exist only here, between the step and zero_grad
    state_bytes = local_state_bytes(model, optimizer) if measure is not None else None
    optimizer.zero_grad(set_to_none=True)
    return StepResult(
        step=step,
        loss_sum=loss_sum,
        grad_norm=grad_norm.detach().reshape(()).float(),
        data_wait_s=data_wait,
        state_bytes=state_bytes,
    )


def _forward_backward(
    *,
    cfg: TrainConfig,
    rt: Runtime,
    model: nn.Module,
    scaler: ShardedGradScaler | None,
    loader: Loader,
    measure: SavedActivations | None,
) -> tuple[torch.Tensor, float]:
    """Gradients of GRAD_ACCUM_STEPS micro-batches; (their summed loss, seconds spent waiting for
    data)."""
    data_wait, loss_sum = 0.0, torch.zeros((), device=rt.device)
    for micro in range(cfg.grad_accum_steps):
        td = time.perf_counter()
        inputs, labels = loader.next_batch()
        inputs, labels = (
            inputs.to(rt.device, non_blocking=True),
            labels.to(rt.device, non_blocking=True),
        )
        data_wait += time.perf_counter() - td
        # reduce-scatter the gradients once per step, on the last micro-batch
        cast(FSDPModule, model).set_requires_gradient_sync(micro == cfg.grad_accum_steps - 1)
        counting = measure if micro == 0 else None
        with counting if counting is not None else contextlib.nullcontext():
            logits = model(input_ids=inputs).logits
            loss = (
                F.cross_entropy(logits.float().flatten(0, 1), labels.flatten())
                / cfg.grad_accum_steps
            )
        if counting is not None:
            counting.measure()
        (scaler.scale(loss) if scaler else loss).backward()
        loss_sum += loss.detach()
    return loss_sum, data_wait


def _clip_and_step(
    cfg: TrainConfig,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scaler: ShardedGradScaler | None,
) -> torch.Tensor:
    """Clip to GRAD_CLIP (0: off) and step; returns the gradient norm before clipping."""
    if scaler:
        scaler.unscale_(optimizer)
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip or float("inf"))
    if scaler:
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()
    return norm.full_tensor() if isinstance(norm, DTensor) else norm


def _read_steps(
    t: Training, rt: Runtime, pending: list[StepResult], since: float
) -> list[events.Step]:
    """The pending steps' events: the losses averaged over ranks in one all-reduce, then losses and
    norms read back in one host sync. Their time is the wall time since `since` shared evenly: a
    step's own time is not known without a sync per step (on a GPU the host runs ahead), their sum
    is."""
    losses = torch.stack([r.loss_sum for r in pending])
    on_gpu = rt.device.type == "cuda"
    dist.all_reduce(
        losses, op=dist.ReduceOp.AVG if on_gpu else dist.ReduceOp.SUM
    )  # gloo has no AVG
    values = torch.cat(
        [losses, torch.stack([r.grad_norm for r in pending])]
    ).tolist()  # the one sync
    elapsed = time.perf_counter() - since
    finished_at = time.time()
    n = len(pending)
    step_time = elapsed / n
    data_wait_frac = sum(r.data_wait_s for r in pending) / elapsed
    measured = {
        **memory_stats(rt.device),
        **t.gpu.read(),
    }  # at the read: peaks so far, telemetry now
    return [
        _step_event(
            t,
            rt,
            r.step,
            loss=values[i] / (1 if on_gpu else rt.world),
            grad_norm=values[n + i],
            step_time_s=step_time,
            data_wait_frac=data_wait_frac,
            finished_at=finished_at - (n - 1 - i) * step_time,
            measured=measured,
        )
        for i, r in enumerate(pending)
    ]


def _hold_until_stop(rt: Runtime, most_s: float = 600) -> None:
    """The hold-until-stop failpoint: wait (bounded) for this rank's SIGTERM before the next step."""
    deadline = time.monotonic() + most_s
    while not rt.stop_requested and time.monotonic() < deadline:
        time.sleep(0.05)


def _agree_end(rt: Runtime, group: dist.ProcessGroup | None) -> int:
    """A stop request and SIGTERM reach ranks at different moments: end together at the first step
    any rank saw one, for the strongest reason seen (fsdptrain.disruption: a stop request beats a
    disruption). On a GPU the flag goes over a CPU (gloo) group, so agreeing waits for no kernel:
    not a host sync."""
    flag = torch.tensor([disruption.local_reason(rt.stop_requested, os.environ)])
    if group is None:  # CPU: the default group is gloo already
        flag = flag.to(rt.device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group)
    return int(flag.item())


def _warn_if_slower_than_training(
    rt: Runtime, cfg: TrainConfig, step: int, save_s: float, train_s: float
) -> None:
    """A periodic save that takes longer than the training it protects: the job spends more time
    saving than training (the volume's aggregate throughput is too low for the checkpoint; `fsdpctl
    plan`). Not for a save under a second (events.MATERIAL_SAVE_S), which costs next to nothing
    whatever it is compared with."""
    if (
        cfg.checkpoint_interval
        and step != cfg.max_steps
        and save_s > train_s > 0
        and save_s >= events.MATERIAL_SAVE_S
    ):
        rt.log(
            f"warning: checkpoint at step {step} took {events.seconds_text(save_s)}, longer than the "
            f"{events.seconds_text(train_s)} of training since the last one: raise CHECKPOINT_INTERVAL "
            "or use a faster volume"
        )


def _checkpoint_due(cfg: TrainConfig, step: int, stopped: bool) -> bool:
    interval = cfg.checkpoint_interval
    return step == cfg.max_steps or stopped or bool(interval and step % interval == 0)


def _save_checkpoint(t: Training, root: Path, *, step: int, loss: float) -> str:
    """Collective: every rank stages its shards, rank 0 publishes them and prunes the oldest."""
    ckpt.stage(root, step=step, model=t.model, optimizer=t.optimizer)
    if step == t.kill_at_save:
        ckpt.die_on_rank0()  # a crash between the shards and their publication
    time.sleep(t.slow_save_s)  # a slow volume (failpoint; 0 otherwise)
    state = {"consumed": t.loader.consumed, "loss": loss, "model": t.cfg.pretrained or t.cfg.model}
    state["record_id"] = os.environ.get(events.RECORD_ENV) or None  # which run made this checkpoint
    # what the steps computed: a run resumes this only with the same (fsdptrain.resume)
    state["settings"] = math_settings(t.cfg, dist.get_world_size())
    state["tracker_run"] = t.tracker_run
    final = ckpt.publish(root, step=step, trainer_state=state)
    ckpt.prune(root, keep=t.cfg.checkpoint_keep, spare=t.resumed_from)
    return str(final)


def _step_event(
    t: Training,
    rt: Runtime,
    step: int,
    *,
    loss: float,
    grad_norm: float,
    step_time_s: float,
    data_wait_frac: float,
    finished_at: float,
    measured: dict[str, float],
) -> events.Step:
    tokens_per_s = t.tokens_per_step / step_time_s
    per_device = tokens_per_s / rt.world
    tflops = per_device * t.flops_per_token / 1e12
    return events.Step(
        step=step,
        max_steps=t.cfg.max_steps,
        loss=loss,
        lr=lr_at(step, t.cfg),
        grad_norm=grad_norm,
        step_time_s=step_time_s,
        data_wait_frac=data_wait_frac,
        time=finished_at,
        tokens_per_s=tokens_per_s,
        tokens_per_s_per_device=per_device,
        tflops_per_device=tflops,
        mfu=tflops / t.peak_tflops if t.peak_tflops else None,
        **measured,
    )


def _human(e: events.Step) -> str:
    mfu = f" | MFU {100 * e.mfu:.1f}%" if e.mfu is not None else ""
    mem = (
        f" | mem {e.mem_allocated_gib:.1f}/{e.mem_reserved_gib:.1f} GiB"
        if e.mem_allocated_gib is not None
        else f" | rss {e.mem_peak_rss_gib:.2f} GiB"
    )
    return (
        f"step {e.step:>5}/{e.max_steps} | loss {e.loss:.4f} | lr {e.lr:.2e} | "
        f"{e.tokens_per_s:.0f} tok/s ({e.tokens_per_s_per_device:.0f}/dev) | "
        f"{e.tflops_per_device:.3f} TFLOP/s/dev{mfu}{mem} | data wait {100 * (e.data_wait_frac or 0):.1f}%"
    )


# ---- the end ---------------------------------------------------------------------------------------------


def finish(t: Training, rt: Runtime, out: Outcome) -> events.Summary:
    """EXPORT_DIR (unless stopped early), then the summary."""
    export = None
    if t.cfg.export_dir and not out.stopped:
        t.hf_config.use_cache = (
            True  # the exported model is for inference; training ran without one
        )
        t.hf_config._attn_implementation = (
            "sdpa"  # transformers' own, not the training-only registration
        )
        export = hf_io.export_hf(
            Path(t.cfg.export_dir), model=t.model, config=t.hf_config, tokenizer=t.tokenizer
        )
        _hold_until_published(rt)
    summary = _summary(t, rt, out, export)
    rt.emit(summary)
    rt.log(
        f"summary: steps {summary.steps} | loss {summary.final_loss:.4f} | "
        f"{summary.tokens_per_s:.0f} tokens/s | checkpoint {out.checkpoint or 'none'}"
    )
    return summary


EXPORT_WAIT = timedelta(hours=4)  # rank 0 writing a 70B export (280 GB) to a slow volume
EXPORT_KEY = "fsdptrain/export-published"


def _hold_until_published(rt: Runtime) -> None:
    """Every rank stays until rank 0 has published the export. Rank 0 writes it alone after the
    gather; a rank that exits meanwhile ends its pod with 0, and the Training Operator marks an
    elastic PyTorchJob Succeeded once any worker pod succeeded (v1.9.4
    pkg/controller.v1/pytorch/pytorchjob_controller.go, UpdateJobStatus) and then deletes the pods
    still running under cleanPodPolicy Running (pkg/controller.v1/common/job.go,
    DeletePodsAndServices): rank 0's, mid-export. The wait is on the process group's store, with its
    own deadline, not a collective under the collective timeout; the barrier after it keeps rank 0
    (the store's host) until every rank has seen the key."""
    if rt.world == 1:
        return
    store = dist.distributed_c10d._get_default_store()
    if rt.rank == 0:
        store.set(EXPORT_KEY, "1")
    else:
        store.wait([EXPORT_KEY], EXPORT_WAIT)
    dist.barrier()


def _summary(t: Training, rt: Runtime, out: Outcome, export: Path | None) -> events.Summary:
    history = out.history
    timed = (
        history[1:] if len(history) > 1 else history
    )  # the first step pays one-off warm-up costs
    total_time = sum(r.step_time_s for r in timed)
    tokens = sum(r.tokens_per_s * r.step_time_s for r in timed)
    first, last = (history[0], history[-1]) if history else (None, None)
    return events.Summary(
        steps=len(history),
        start_step=t.start_step,
        final_loss=last.loss if last else float("nan"),
        first_loss=first.loss if first else float("nan"),
        losses=[r.loss for r in history],
        tokens_per_s=tokens / total_time if total_time else 0.0,
        tokens_per_s_per_device=(tokens / total_time / rt.world) if total_time else 0.0,
        mfu=last.mfu if last else None,
        param_bytes=out.state_bytes["param_bytes"],
        grad_bytes=out.state_bytes["grad_bytes"],
        optim_bytes=out.state_bytes["optim_bytes"],
        activation_bytes=out.activation_bytes,
        mem_allocated_gib=last.mem_allocated_gib if last else None,
        mem_reserved_gib=last.mem_reserved_gib if last else None,
        mem_peak_rss_gib=last.mem_peak_rss_gib if last else None,
        checkpoint=out.checkpoint,
        export=str(export) if export else None,
        stopped=out.stopped,
        stop_reason={disruption.STOP: "stop", disruption.DISRUPTED: "disrupted"}.get(out.reason),
        record_id=os.environ.get(events.RECORD_ENV) or None,
    )

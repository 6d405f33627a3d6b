"""The FSDP2 training program that runs in every pod (and on a laptop).

    # CPU smoke run, 2 processes (gloo); assets made offline by `python -m fsdptrain.assets assets`
    torchrun --nproc-per-node 2 -m fsdptrain --model tiny --dataset assets/corpus.txt --tokenizer assets/tokenizer
    # one node, 8 GPUs (NCCL is picked automatically)
    torchrun --nproc-per-node 8 -m fsdptrain --model 7b --dataset /fsx/data --tokenizer /fsx/llama2-tokenizer
    # N nodes: what the PyTorchJob runs, settings from the environment (MODEL, SHARDING_STRATEGY, ...)
    torchrun --nnodes N --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29400 -m fsdptrain

Every setting: `python -m fsdptrain --help`. Exit codes: 0 done (also after SIGTERM, with a checkpoint),
1 failure, 2 bad setting.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import sys
import time
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

from fsdptrain import checkpoint as ckpt
from fsdptrain.config import BUILTIN, ConfigError, TrainConfig
from fsdptrain.data import Loader, load_blocks, load_tokenizer
from fsdptrain.metrics import (
    GpuTelemetry,
    PrometheusExporter,
    SavedActivations,
    local_state_bytes,
    memory_stats,
    peak_tflops,
)
from fsdptrain.models import MODEL_CONFIGS, build_meta_model, init_weights, llama_config
from fsdptrain.parallel import build_mesh, parallelize
from fsdptrain.shapes import flops_per_token


@dataclass
class Runtime:
    rank: int
    local_rank: int
    world: int
    local_world: int
    device: torch.device
    metrics_file: object = None
    exporter: object = None  # PrometheusExporter on rank 0 when METRICS_PORT is set
    stop_requested: bool = field(default=False)
    # measured on the first step of a run: sharded state (params, grads, optimizer) and saved activations
    state_bytes: dict = field(default_factory=lambda: {"param_bytes": 0, "grad_bytes": 0, "optim_bytes": 0})
    activation_bytes: int = 0

    def log(self, msg: str) -> None:
        if self.rank == 0:
            print(msg, flush=True)

    def emit(self, record: dict) -> None:
        """One JSON line (machine-read by `fsdpctl job status`), rank 0 only."""
        if self.rank != 0:
            return
        if self.exporter is not None and record.get("event") == "step":
            self.exporter.update(record)
        line = json.dumps(record, separators=(",", ":"))
        print(line, flush=True)
        if self.metrics_file:
            self.metrics_file.write(line + "\n")
            self.metrics_file.flush()


def init_distributed() -> Runtime:
    os.environ.setdefault("RANK", "0")  # a plain `python -m fsdptrain` is a world of one
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("LOCAL_RANK", "0")
    os.environ.setdefault("LOCAL_WORLD_SIZE", "1")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(_free_port()))
    local_rank = int(os.environ["LOCAL_RANK"])
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
        if "OMP_NUM_THREADS" not in os.environ:
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ["LOCAL_WORLD_SIZE"])))
    dist.init_process_group(backend=backend, device_id=device if backend == "nccl" else None)
    return Runtime(
        dist.get_rank(), local_rank, dist.get_world_size(), int(os.environ["LOCAL_WORLD_SIZE"]), device
    )


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warmup to LR, then cosine down to LR * MIN_LR_RATIO at MAX_STEPS (step counts from 1)."""
    if cfg.warmup_steps and step <= cfg.warmup_steps:
        return cfg.lr * step / cfg.warmup_steps
    span = max(1, cfg.max_steps - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / span)
    floor = cfg.lr * cfg.min_lr_ratio
    return floor + 0.5 * (cfg.lr - floor) * (1 + math.cos(math.pi * progress))


def build_model(cfg: TrainConfig, rt: Runtime, tokenizer):
    """Meta-device model -> sharded -> materialised shard by shard -> weights (fresh or pretrained)."""
    from transformers import AutoConfig

    if cfg.pretrained:
        path = ckpt.resolve_pretrained(cfg.pretrained, local_rank=rt.local_rank)
        config = AutoConfig.from_pretrained(str(path))
    else:
        config = llama_config(cfg.model, vocab_size=max(len(tokenizer), MODEL_CONFIGS[cfg.model].vocab))
    model = build_meta_model(config)
    mesh = build_mesh(
        rt.device.type,
        cfg.sharding_strategy,
        rt.world,
        hsdp_shard_size=cfg.hsdp_shard_size,
        procs_per_node=rt.local_world,
    )
    wrapped = parallelize(
        model,
        mesh=mesh,
        strategy=cfg.sharding_strategy,
        precision=cfg.precision,
        ac_mode=cfg.activation_checkpointing,
        ac_every=cfg.ac_every,
    )
    # replicas (HSDP/NO_SHARD) must start identical, shards must differ: seed by position in the shard dim
    shard_coord = mesh.get_local_rank("shard") if mesh.ndim == 2 else mesh.get_local_rank()
    torch.manual_seed(cfg.seed + 7919 * shard_coord)
    init_weights(model, config, rt.device)
    if cfg.pretrained:
        ckpt.load_pretrained(path, model=model)
    return model, config, mesh, wrapped


def _hf_token_given() -> bool:
    """HF_TOKEN (local runs) or the Secret mounted as a file at HF_TOKEN_PATH (pods); huggingface_hub reads both."""
    return bool(os.environ.get("HF_TOKEN")) or os.path.isfile(os.environ.get("HF_TOKEN_PATH", ""))


def _ac_note(cfg: TrainConfig, wrapped: int) -> str:
    return "off" if wrapped == 0 else f"{cfg.activation_checkpointing} ({wrapped} layers)"


def train(cfg: TrainConfig, rt: Runtime) -> dict:
    import datasets

    datasets.disable_progress_bars()
    # init is seeded per shard coordinate below, so DTensor's CPU RNG caveat does not apply
    warnings.filterwarnings("ignore", message="DTensor random operators may not have complete support")
    torch.manual_seed(cfg.seed)
    torch.use_deterministic_algorithms(cfg.deterministic, warn_only=True)
    cfg = _with_builtin_assets(cfg, rt)
    tokenizer = load_tokenizer(cfg.tokenizer_path)
    blocks = load_blocks(cfg, tokenizer)
    model, config, mesh, wrapped = build_model(cfg, rt, tokenizer)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay, foreach=True
    )
    scaler = None
    if cfg.precision == "fp16":
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

        scaler = ShardedGradScaler(device=rt.device.type)

    start_step, consumed = 0, 0
    root = Path(cfg.checkpoint_dir) if cfg.checkpoint_dir else None
    resume_from = _resume_path(cfg, root)
    if resume_from is not None:
        meta = ckpt.load(resume_from, model=model, optimizer=optimizer)
        start_step, consumed = meta["step"], meta["consumed"]
        rt.log(f"resumed from {resume_from} at step {start_step}")
    loader = Loader(blocks, rank=rt.rank, world=rt.world, micro_batch=cfg.micro_batch_size, consumed=consumed)

    n_params = sum(p.numel() for p in model.parameters())
    embed = model.get_input_embeddings().weight.numel()
    fpt = flops_per_token(n_params, embed, config.num_hidden_layers, config.hidden_size, cfg.seq_len)
    peak = peak_tflops(rt.device, cfg.precision, cfg.peak_tflops)
    gpu = GpuTelemetry(rt.device)
    tokens_per_step = cfg.micro_batch_size * cfg.seq_len * cfg.grad_accum_steps * rt.world
    rt.log(
        f"fsdptrain: model {cfg.pretrained or cfg.model} ({n_params / 1e6:.2f}M params), "
        f"{cfg.sharding_strategy} mesh {tuple(mesh.shape)}, {cfg.precision}, "
        f"activation checkpointing {_ac_note(cfg, wrapped)}, world {rt.world} on {rt.device.type}, "
        f"{tokens_per_step} tokens/step, steps {start_step + 1}..{cfg.max_steps}"
        + (", HF token set" if _hf_token_given() else "")
    )

    history, last_ckpt, stopped = [], (str(resume_from) if resume_from else None), False
    for step in range(start_step + 1, cfg.max_steps + 1):
        measure = SavedActivations() if step == start_step + 1 else None
        rec = _train_step(step, cfg, rt, model, optimizer, scaler, loader, measure)
        if measure is not None:
            rt.activation_bytes = measure.bytes
        rec.update(
            tokens_per_s=tokens_per_step / rec["step_time_s"],
            tokens_per_s_per_device=tokens_per_step / rec["step_time_s"] / rt.world,
        )
        rec["tflops_per_device"] = rec["tokens_per_s_per_device"] * fpt / 1e12
        rec["mfu"] = rec["tflops_per_device"] / peak if peak else None
        rec.update(memory_stats(rt.device), **gpu.read())
        history.append(rec)
        stopped = _agree_stop(rt)
        if step % cfg.log_interval == 0 or step == cfg.max_steps or stopped:
            rt.emit({"event": "step", **rec})
            rt.log(_human(rec))
        due = root and (
            step == cfg.max_steps
            or stopped
            or (cfg.checkpoint_interval and step % cfg.checkpoint_interval == 0)
        )
        if due:
            state = {"consumed": loader.consumed, "loss": rec["loss"], "model": cfg.pretrained or cfg.model}
            last_ckpt = str(
                ckpt.save(
                    root,
                    step=step,
                    model=model,
                    optimizer=optimizer,
                    trainer_state=state,
                    keep=cfg.checkpoint_keep,
                )
            )
            rt.emit({"event": "checkpoint", "step": step, "path": last_ckpt})
        if stopped:
            rt.log(f"SIGTERM: stopped at step {step}, checkpoint {last_ckpt}")
            break

    export = None
    if cfg.export_dir and not stopped:
        export = ckpt.export_hf(Path(cfg.export_dir), model=model, config=config, tokenizer=tokenizer)
    state_bytes = {**rt.state_bytes, "activation_bytes": rt.activation_bytes}
    summary = _summary(
        history,
        state_bytes=state_bytes,
        checkpoint=last_ckpt,
        export=export,
        stopped=stopped,
        start_step=start_step,
    )
    rt.emit({"event": "summary", **summary})
    rt.log(
        f"summary: steps {summary['steps']} | loss {summary['final_loss']:.4f} | "
        f"{summary['tokens_per_s']:.0f} tokens/s | checkpoint {last_ckpt or 'none'}"
    )
    return summary


def _with_builtin_assets(cfg: TrainConfig, rt: Runtime) -> TrainConfig:
    """DATASET/TOKENIZER=builtin: the offline sample assets, made once per node (local rank 0) and shared."""
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


def _resume_path(cfg: TrainConfig, root: Path | None) -> Path | None:
    if cfg.resume == "never":
        return None
    if cfg.resume == "auto":
        return ckpt.latest_checkpoint(root) if root else None
    return Path(cfg.resume)


def _train_step(step, cfg, rt, model, optimizer, scaler, loader, measure=None) -> dict:
    for group in optimizer.param_groups:
        group["lr"] = lr_at(step, cfg)
    t0 = time.perf_counter()
    data_wait, loss_sum = 0.0, torch.zeros((), device=rt.device)
    for micro in range(cfg.grad_accum_steps):
        td = time.perf_counter()
        inputs, labels = loader.next_batch()
        inputs, labels = inputs.to(rt.device, non_blocking=True), labels.to(rt.device, non_blocking=True)
        data_wait += time.perf_counter() - td
        model.set_requires_gradient_sync(micro == cfg.grad_accum_steps - 1)  # reduce once per step
        counting = measure is not None and micro == 0
        with measure if counting else contextlib.nullcontext():
            logits = model(input_ids=inputs).logits
            loss = F.cross_entropy(logits.float().flatten(0, 1), labels.flatten()) / cfg.grad_accum_steps
        if counting:
            measure.measure()
        (scaler.scale(loss) if scaler else loss).backward()
        loss_sum += loss.detach()
    if scaler:
        scaler.unscale_(optimizer)
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip or float("inf"))
    grad_norm = grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm
    if scaler:
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()
    if measure is not None:  # grads and optimizer state both exist only here
        rt.state_bytes = local_state_bytes(model, optimizer)
    optimizer.zero_grad(set_to_none=True)
    dist.all_reduce(loss_sum, op=dist.ReduceOp.AVG if rt.device.type == "cuda" else dist.ReduceOp.SUM)
    loss_value = loss_sum.item() / (1 if rt.device.type == "cuda" else rt.world)  # gloo has no AVG
    step_time = time.perf_counter() - t0
    return {
        "step": step,
        "max_steps": cfg.max_steps,
        "loss": loss_value,
        "lr": lr_at(step, cfg),
        "grad_norm": float(grad_norm),
        "step_time_s": step_time,
        "data_wait_frac": data_wait / step_time,
        "time": time.time(),
    }


def _agree_stop(rt: Runtime) -> bool:
    """SIGTERM reaches ranks at different moments: stop together at the first step any rank saw it."""
    flag = torch.tensor([1 if rt.stop_requested else 0], device=rt.device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def _human(r: dict) -> str:
    mfu = f" | MFU {100 * r['mfu']:.1f}%" if r.get("mfu") is not None else ""
    mem = (
        f" | mem {r['mem_allocated_gib']:.1f}/{r['mem_reserved_gib']:.1f} GiB"
        if "mem_allocated_gib" in r
        else f" | rss {r['mem_peak_rss_gib']:.2f} GiB"
    )
    return (
        f"step {r['step']:>5}/{r['max_steps']} | loss {r['loss']:.4f} | lr {r['lr']:.2e} | "
        f"{r['tokens_per_s']:.0f} tok/s ({r['tokens_per_s_per_device']:.0f}/dev) | "
        f"{r['tflops_per_device']:.3f} TFLOP/s/dev{mfu}{mem} | data wait {100 * r['data_wait_frac']:.1f}%"
    )


def _summary(history, *, state_bytes, checkpoint, export, stopped, start_step) -> dict:
    timed = history[1:] if len(history) > 1 else history  # the first step pays one-off warm-up costs
    total_time = sum(r["step_time_s"] for r in timed)
    tokens = sum(r["tokens_per_s"] * r["step_time_s"] for r in timed)
    return {
        "steps": len(history),
        "start_step": start_step,
        "final_loss": history[-1]["loss"] if history else float("nan"),
        "first_loss": history[0]["loss"] if history else float("nan"),
        "losses": [r["loss"] for r in history],
        "tokens_per_s": tokens / total_time if total_time else 0.0,
        "tokens_per_s_per_device": (tokens / total_time / dist.get_world_size()) if total_time else 0.0,
        "mfu": history[-1]["mfu"] if history else None,
        **state_bytes,
        **{k: v for k, v in (history[-1] if history else {}).items() if k.startswith("mem_")},
        "checkpoint": checkpoint,
        "export": str(export) if export else None,
        "stopped": stopped,
    }


def run(cfg: TrainConfig) -> int:
    """Run a validated config in this process (one rank of the job); returns the exit code."""
    rt = init_distributed()
    signal.signal(signal.SIGTERM, lambda *_: setattr(rt, "stop_requested", True))
    if cfg.metrics_file and rt.rank == 0:
        Path(cfg.metrics_file).parent.mkdir(parents=True, exist_ok=True)
        rt.metrics_file = open(cfg.metrics_file, "a")
    if cfg.metrics_port and rt.rank == 0:
        try:
            rt.exporter = PrometheusExporter(cfg.metrics_port)
            rt.log(f"metrics: http://0.0.0.0:{rt.exporter.port}/metrics")
        except OSError as e:
            rt.log(
                f"metrics: port {cfg.metrics_port} unavailable ({e.strerror}); training goes on without it"
            )
    try:
        train(cfg, rt)
        return 0
    except ConfigError as e:
        print(f"fsdptrain: error: {e}", file=sys.stderr)
        return 2
    except ckpt.CheckpointError as e:
        print(f"fsdptrain: error: {e}", file=sys.stderr)
        return 1
    finally:
        if rt.exporter is not None:
            rt.exporter.close()
        if dist.is_initialized():
            dist.destroy_process_group()

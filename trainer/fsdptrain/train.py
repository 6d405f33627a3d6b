"""The FSDP2 training program that runs in every pod (and on a laptop): build, then one loop.

    # CPU smoke run, 2 processes (gloo); assets made offline by `python -m fsdptrain.assets assets`
    torchrun --nproc-per-node 2 -m fsdptrain --model tiny \\
        --dataset assets/corpus.txt --tokenizer assets/tokenizer
    # one node, 8 GPUs (NCCL is picked automatically)
    torchrun --nproc-per-node 8 -m fsdptrain --model 7b \\
        --dataset /fsx/data --tokenizer /fsx/llama2-tokenizer
    # N nodes: what the PyTorchJob runs, settings from the environment (MODEL, SHARDING_STRATEGY...)
    torchrun --nnodes N --nproc-per-node 8 \\
        --rdzv-backend c10d --rdzv-endpoint HOST:29400 -m fsdptrain

Every setting: `python -m fsdptrain --help`. Exit codes: 0 done (also after `fsdpctl job stop`, with
a checkpoint), 1 failure, 2 bad setting, 75 disrupted (SIGTERM: checkpointed, to be resumed; see
fsdptrain.disruption). Rank 0 prints human lines and event lines (fsdptrain.events) for fsdpctl.

What the loop runs on is built by fsdptrain.build (the model: fsdptrain.model_build, the optimizer
and its schedule: fsdptrain.optim); what rank 0 says about it is fsdptrain.report's.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, cast

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.fsdp import FSDPModule

from fsdptrain import checkpoint as ckpt
from fsdptrain import disruption, events, hf_io, report
from fsdptrain.build import Training, build, nodes, set_up_torch
from fsdptrain.config import ConfigError, TrainConfig, print_error
from fsdptrain.data import Loader
from fsdptrain.levers import GarbageCollection
from fsdptrain.metrics import SavedActivations, local_state_bytes, memory_stats
from fsdptrain.models import sdpa_priority
from fsdptrain.optim import clip_and_step, lr_at
from fsdptrain.report import Outcome
from fsdptrain.resume import math_settings
from fsdptrain.runtime import (
    Runtime,
    close_outputs,
    init_distributed,
    leader_event,
    open_outputs,
    start_trackers,
)

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


# EX_TEMPFAIL: checkpointed, not done; the pod's launcher decides what comes next
DISRUPTED_EXIT = 75


def _ended(rt: Runtime, summary: events.Summary) -> int:
    """0, unless the run was disrupted: then the launcher gets a note and the worker exits non-zero,
    since a 0 from any worker pod would mark the whole elastic PyTorchJob Succeeded
    (fsdptrain.disruption)."""
    if summary.stop_reason != "disrupted":
        if not summary.stopped and rt.local_rank == 0:  # a stop deletes the pods itself
            disruption.mark_follower(os.environ, os.environ.get("GROUP_RANK"))
        return 0
    if rt.local_rank == 0:
        disruption.write_note(os.environ, "disrupted", step=summary.start_step + summary.steps)
    return DISRUPTED_EXIT


def train(cfg: TrainConfig, rt: Runtime) -> events.Summary:
    """Build, train to MAX_STEPS (or until a stop request or a disruption), export; returns the
    summary rank 0 printed."""
    kept = set_up_torch(cfg, rt.device)
    # for the whole run: compiled layers read it when they trace
    with sdpa_priority(cfg.sdpa_backends):
        t = build(cfg, rt)
        rt.log(report.banner(t, rt, host_malloc_kept=kept))
        for line in report.lever_lines(t):
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
        result = _train_step(t, rt, step, measure)
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
            rt.log(report.step_line(event))
        if t.checkpoint_root is not None and save_due:
            out.checkpoint = _checkpoint(t, rt, t.checkpoint_root, event, trained_since)
            trained_since = time.perf_counter()
        if out.stopped:
            rt.log(
                f"{disruption.describe(out.reason)}: stopped at step {step}, "
                f"checkpoint {out.checkpoint}"
            )
            break
        if t.hold and step == t.hold[0]:
            _hold_until_stop(rt, release=t.hold[1])
        since = time.perf_counter()  # logging and checkpointing are not step time
    return out


@dataclass(frozen=True)
class StepResult:
    """One step as the device left it: nothing here has been read back to the host."""

    step: int
    # this rank's loss (summed over micro-batches, each divided by their count)
    loss_sum: torch.Tensor
    grad_norm: torch.Tensor  # the global norm before clipping, the same on every rank
    data_wait_s: float
    state_bytes: dict[str, int] | None  # when measured: the run's first step


def _train_step(
    t: Training, rt: Runtime, step: int, measure: SavedActivations | None = None
) -> StepResult:
    """One optimizer step over GRAD_ACCUM_STEPS micro-batches, without a host sync. With `measure`
    (the run's first step) it also counts the activations saved for backward and this rank's sharded
    state."""
    cfg, model, optimizer = t.cfg, t.model, t.optimizer
    for group in optimizer.param_groups:
        group["lr"] = lr_at(step, cfg)
    loss_sum, data_wait = _forward_backward(
        accum=t.grad_accum,
        rt=rt,
        model=model,
        scaler=t.scaler,
        loader=t.loader,
        measure=measure,
    )
    grad_norm = clip_and_step(cfg, model, optimizer, t.scaler)
    # float8: the next forward's weight scales, while the weights are fresh
    if t.after_step is not None:
        t.after_step(model)
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
    accum: int,
    rt: Runtime,
    model: nn.Module,
    scaler: ShardedGradScaler | None,
    loader: Loader,
    measure: SavedActivations | None,
) -> tuple[torch.Tensor, float]:
    """Gradients of `accum` micro-batches (GRAD_ACCUM_STEPS, or what the world-size rule made of it:
    fsdptrain.elastic); (their summed loss, seconds spent waiting for data)."""
    data_wait, loss_sum = 0.0, torch.zeros((), device=rt.device)
    for micro in range(accum):
        td = time.perf_counter()
        inputs, labels = loader.next_batch()
        inputs = inputs.to(rt.device, non_blocking=True)
        labels = labels.to(rt.device, non_blocking=True)
        data_wait += time.perf_counter() - td
        # reduce-scatter the gradients once per step, on the last micro-batch
        cast(FSDPModule, model).set_requires_gradient_sync(micro == accum - 1)
        counting = measure if micro == 0 else None
        with counting if counting is not None else contextlib.nullcontext():
            logits = model(input_ids=inputs).logits
            loss = F.cross_entropy(logits.float().flatten(0, 1), labels.flatten())
            loss = loss / accum
        if counting is not None:
            counting.measure()
        # torch's Tensor.backward carries no annotations
        (scaler.scale(loss) if scaler else loss).backward()  # type: ignore[no-untyped-call]
        loss_sum += loss.detach()
    return loss_sum, data_wait


def _read_steps(
    t: Training, rt: Runtime, pending: list[StepResult], since: float
) -> list[events.Step]:
    """The pending steps' events: the losses averaged over ranks in one all-reduce, then losses and
    norms read back in one host sync. Their time is the wall time since `since` shared evenly: a
    step's own time is not known without a sync per step (on a GPU the host runs ahead), their sum
    is."""
    losses = torch.stack([r.loss_sum for r in pending])
    on_gpu = rt.device.type == "cuda"
    dist.all_reduce(losses, op=dist.ReduceOp.AVG if on_gpu else dist.ReduceOp.SUM)  # gloo: no AVG
    # the one sync
    values = torch.cat([losses, torch.stack([r.grad_norm for r in pending])]).tolist()
    elapsed = time.perf_counter() - since
    finished_at = time.time()
    n = len(pending)
    step_time = elapsed / n
    data_wait_frac = sum(r.data_wait_s for r in pending) / elapsed
    # at the read: peaks so far, telemetry now
    measured = {**memory_stats(rt.device), **t.gpu.read()}
    return [
        report.step_event(
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


def _hold_until_stop(rt: Runtime, release: str = "", most_s: float = 600) -> None:
    """The hold failpoints: wait (bounded) for this rank's SIGTERM, or for `release` to exist,
    before the next step."""
    deadline = time.monotonic() + most_s
    while not rt.stop_requested and time.monotonic() < deadline:
        if release and os.path.exists(release):
            return
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


def _checkpoint_due(cfg: TrainConfig, step: int, stopped: bool) -> bool:
    interval = cfg.checkpoint_interval
    return step == cfg.max_steps or stopped or bool(interval and step % interval == 0)


def _checkpoint(
    t: Training, rt: Runtime, root: Path, event: events.Step, trained_since: float
) -> str:
    """A checkpoint of the step `event` reports: saved, announced, and warned about when it took
    longer than the training since the end of the last one (`trained_since`)."""
    began = time.perf_counter()
    path = _save_checkpoint(t, root, step=event.step, loss=event.loss, node_count=nodes(rt))
    rt.emit(events.Checkpoint(step=event.step, path=path))
    _warn_if_slower_than_training(
        rt, t.cfg, event.step, time.perf_counter() - began, began - trained_since
    )
    return path


def _save_checkpoint(t: Training, root: Path, *, step: int, loss: float, node_count: int) -> str:
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
    # the world it trained on and its global batch rule, and every world change of the job
    # (fsdptrain.elastic): a resume on another world keeps the job's global batch from these
    state["nodes"] = node_count
    state["batch"] = t.batch.as_meta() if t.batch is not None else None
    state["world_changes"] = t.world_changes
    final = ckpt.publish(root, step=step, trainer_state=state)
    ckpt.prune(root, keep=t.cfg.checkpoint_keep, spare=t.resumed_from)
    return str(final)


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
            f"warning: checkpoint at step {step} took {events.seconds_text(save_s)}, longer than "
            f"the {events.seconds_text(train_s)} of training since the last one: raise "
            "CHECKPOINT_INTERVAL or use a faster volume"
        )


def finish(t: Training, rt: Runtime, out: Outcome) -> events.Summary:
    """EXPORT_DIR (unless stopped early), then the summary."""
    export = None
    if t.cfg.export_dir and not out.stopped:
        # the exported model is for inference; training ran without one
        t.hf_config.use_cache = True
        # transformers' own SDPA, not the training-only registration
        t.hf_config._attn_implementation = "sdpa"
        export = hf_io.export_hf(
            Path(t.cfg.export_dir), model=t.model, config=t.hf_config, tokenizer=t.tokenizer
        )
        hf_io.hold_until_published(rt)
    summary = report.summary(t, rt, out, export)
    rt.emit(summary)
    rt.log(
        f"summary: steps {summary.steps} | loss {summary.final_loss:.4f} | "
        f"{summary.tokens_per_s:.0f} tokens/s | checkpoint {out.checkpoint or 'none'}"
    )
    return summary

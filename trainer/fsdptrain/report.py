"""What rank 0 says about a run, in human lines and event lines (fsdptrain.events, which fsdpctl
reads): the banner and the levers it took at the start, each logged step's event with its line
(throughput, MFU, memory), and the summary of what the loop ended with (its Outcome)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import torch

from fsdptrain import disruption, events
from fsdptrain.build import Training
from fsdptrain.levers import float8_warning, resolve_deterministic, resolve_fused_optimizer
from fsdptrain.optim import lr_at
from fsdptrain.runtime import Runtime


def hf_token_given() -> bool:
    """HF_TOKEN (local runs) or the Secret mounted as a file at HF_TOKEN_PATH (pods);
    huggingface_hub reads both."""
    return bool(os.environ.get("HF_TOKEN")) or os.path.isfile(os.environ.get("HF_TOKEN_PATH", ""))


def banner(t: Training, rt: Runtime, *, host_malloc_kept: bool) -> str:
    """The run's first human line: the model, the mesh, the precision, the world, the steps and
    every speed setting it took."""
    cfg = t.cfg
    ac = "off" if t.ac_layers == 0 else f"{t.checkpointing.mode} ({t.ac_layers} layers)"
    return (
        f"fsdptrain: model {cfg.pretrained or cfg.model} ({t.n_params / 1e6:.2f}M params), "
        f"{cfg.sharding_strategy} mesh {t.mesh_shape}, {cfg.precision}, "
        f"activation checkpointing {ac}, world {rt.world} on {rt.device.type}, "
        f"{t.tokens_per_step} tokens/step, steps {t.start_step + 1}..{cfg.max_steps}"
        + "".join(f", {lever}" for lever in _levers(t, rt.device, host_malloc_kept))
        + (", HF token set" if hf_token_given() else "")
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


def lever_lines(t: Training) -> list[str]:
    """The human lines of the resolved levers; a choice the user should act on as a warning line."""
    lines = [f"levers: compile {t.levers['compile']}; attention {t.levers['attention']}"]
    lines.append(
        f"levers: activation checkpointing {t.levers['activation_checkpointing']}; "
        f"gc {t.levers['gc']}"
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


def step_event(
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
    """One step's event: throughput per job and per device, TFLOP/s and MFU from its time."""
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


def step_line(e: events.Step) -> str:
    """A logged step's human line, printed after its event (`fsdpctl job logs` shows this line in
    the event's place)."""
    mfu = f" | MFU {100 * e.mfu:.1f}%" if e.mfu is not None else ""
    mem = (
        f" | mem {e.mem_allocated_gib:.1f}/{e.mem_reserved_gib:.1f} GiB"
        if e.mem_allocated_gib is not None
        else f" | rss {e.mem_peak_rss_gib:.2f} GiB"
    )
    return (
        f"step {e.step:>5}/{e.max_steps} | loss {e.loss:.4f} | lr {e.lr:.2e} | "
        f"{e.tokens_per_s:.0f} tok/s ({e.tokens_per_s_per_device:.0f}/dev) | "
        f"{e.tflops_per_device:.3f} TFLOP/s/dev{mfu}{mem} | "
        f"data wait {100 * (e.data_wait_frac or 0):.1f}%"
    )


@dataclass
class Outcome:
    """What the loop ends with (fsdptrain.train.loop), the summary's source."""

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


def summary(t: Training, rt: Runtime, out: Outcome, export: Path | None) -> events.Summary:
    """The run's last event: its steps, losses, throughput, memory, checkpoint and export."""
    history = out.history
    # the first step pays one-off warm-up costs
    timed = history[1:] if len(history) > 1 else history
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
        world_changes=list(t.world_changes) or None,
    )

"""The planner over a grid (pure): models x instance types x node counts (`fsdpctl plan --table`),
each row the planner's step time, memory and cost."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, TypedDict

from fsdpctl.plan.planner import GIB, Job, cost, memory
from fsdpctl.plan.steptime import speed
from fsdpctl.settings import MODEL_DEFAULT
from fsdptrain.config import model_defaults

if TYPE_CHECKING:
    from fsdpctl.settings import Config

SWEEP_MODELS = ("7b", "13b", "70b")


SWEEP_INSTANCES = ("p4de.24xlarge", "p5.48xlarge")


SWEEP_NODES = (1, 2, 4, 8, 16)


class SweepRow(TypedDict):
    """A row of `plan --table` (`matrix`)."""

    model: str
    instance_type: str
    nodes: int
    memory_gib: float  # per GPU
    fits: bool
    tokens_per_s_per_gpu: float
    mfu: float
    scaling: float  # per-GPU throughput relative to one node
    hours: float
    usd: float | None  # None: no list price


def matrix(
    base: Job,
    tokens: float,
    per_model: Mapping[str, Job] | None = None,
    *,
    models: Sequence[str] = SWEEP_MODELS,
    nodes: Sequence[int] = SWEEP_NODES,
) -> list[SweepRow]:
    """`plan --table`: each of `models` on each instance type at each of `nodes`, the rest of `base`
    (or of the model's own in `per_model`, see `sweep_bases`) unchanged; scaling is the per-GPU
    throughput relative to one node (computed even when 1 is not among `nodes`, so a row reads the
    same in any selection)."""
    rows = []
    for model in models:
        start = (per_model or {}).get(model, replace(base, model=model))
        for inst in SWEEP_INSTANCES:
            one_node = speed(replace(start, instance_type=inst, nodes=1)).tokens_per_s_per_gpu
            jobs = [replace(start, instance_type=inst, nodes=n) for n in nodes]
            rows += [_sweep_row(job, tokens, one_node) for job in jobs]
    return rows


def sweep_bases(base: Job, cfg: Config) -> dict[str, Job]:
    """The sweep's job for each model: `base` with the model's own sequence length, micro-batch and
    checkpointing (fsdptrain.config.MODEL_DEFAULTS) where the user left them to the model, as a job
    of that MODEL would have them."""
    left = {key for key, source in cfg.sources.items() if source in ("default", MODEL_DEFAULT)}
    out = {}
    for model in SWEEP_MODELS:
        d = model_defaults(model)
        job = replace(base, model=model)
        if "SEQ_LEN" in left:
            job = replace(job, seq_len=d["seq_len"])
        if "MICRO_BATCH_SIZE" in left:
            job = replace(job, micro_batch=d["micro_batch_size"])
        if "ACTIVATION_CHECKPOINTING" in left:
            job = replace(job, ac=d["activation_checkpointing"])
        out[model] = job
    return out


def _sweep_row(job: Job, tokens: float, one_node: float) -> SweepRow:
    mem, spd = memory(job), speed(job)
    hours, usd = cost(job, tokens)
    return {
        "model": job.model,
        "instance_type": job.instance_type,
        "nodes": job.nodes,
        "memory_gib": mem.total / GIB,
        "fits": mem.fits,
        "tokens_per_s_per_gpu": spd.tokens_per_s_per_gpu,
        "mfu": spd.mfu,
        "scaling": spd.tokens_per_s_per_gpu / one_node,
        "hours": hours,
        "usd": usd,
    }

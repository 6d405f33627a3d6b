"""Whether the job fits where it would run (pure): per GPU on the cluster (the planner's memory
model), all processes together in this machine's RAM for CPU processes; one line with the cheapest
fix when it does not."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from fsdpctl.plan.planner import CUDA_OVERHEAD, GIB, cheapest_fix, job_from, memory

if TYPE_CHECKING:
    from fsdpctl.settings import Config

# --- refusing what cannot fit, before anything is created (config validate, manifest, job run) ----

# What one local trainer process holds besides the model's numbers: the interpreter, torch and gloo
# (the whole tiny-model trainer peaks at 0.49 GiB resident on CPU: its summary's mem_peak_rss_gib).
PROCESS_BASE = GIB // 2


def fit_problem(cfg: Config, *, ram_bytes: int, tokens: float = 1e9) -> str | None:
    """One line naming the settings and the cheapest fix when the job cannot fit where it would run:
    per GPU on the cluster (`memory`), all processes together in this machine's RAM locally; None
    when it fits."""
    if not cfg.target.gpus:
        return _host_fit_problem(cfg, ram_bytes)
    job = job_from(cfg, mfu=0.0, price=None)
    mem = memory(job)
    if mem.fits:
        return None
    fix = cheapest_fix(job, tokens)
    group = f", shard group {job.shard_size}" if job.strategy == "HYBRID_SHARD" else ""
    what = (
        f"MODEL={job.model} needs {mem.total / GIB:.1f} GiB per GPU, {mem.capacity / GIB:.1f} GiB usable on "
        f"JOB_NODES={job.nodes} x INSTANCE_TYPE={job.instance_type} "
        f"(SHARDING_STRATEGY={job.strategy}{group}, MICRO_BATCH_SIZE={job.micro_batch}, "
        f"SEQ_LEN={job.seq_len}, ACTIVATION_CHECKPOINTING={job.ac})"
    )
    if fix is None:
        return f"{what}: no single change fits: use more nodes or a bigger instance type (see `fsdpctl plan`)"
    more = (
        f" and NODE_COUNT={fix[1].nodes} (a bigger node group)"
        if fix[1].nodes > cfg.node_count
        else ""
    )
    return f"{what}: set {fix[0]}{more}, the cheapest change that fits (`fsdpctl plan` shows the numbers)"


def minimum_fit_problem(cfg: Config, *, ram_bytes: int, tokens: float = 1e9) -> str | None:
    """The job must also fit on the fewest nodes of its elastic range (MIN_NODES): there each rank
    holds a larger shard of the same state. One line naming the fewest nodes that hold it, None
    when the minimum fits (or there is no range)."""
    low = cfg.fewest_nodes
    if low == cfg.job_nodes or fit_problem(cfg, ram_bytes=ram_bytes, tokens=tokens) is not None:
        return None  # no range, or the full job's own line says what is wrong
    if fit_problem(_on(cfg, low), ram_bytes=ram_bytes, tokens=tokens) is None:
        return None
    holds = next(
        n
        for n in range(low + 1, cfg.job_nodes + 1)
        if fit_problem(_on(cfg, n), ram_bytes=ram_bytes, tokens=tokens) is None
    )
    where = "per GPU" if cfg.target.gpus else "in this machine's RAM"
    return (
        f"MIN_NODES={cfg.min_nodes} cannot hold MODEL={cfg.training.model}: on {low} of the "
        f"JOB_NODES={cfg.job_nodes} nodes each rank's shard does not fit {where}; set MIN_NODES={holds} "
        "(the fewest nodes that hold it), or 0 to wait for a lost node"
    )


def _on(cfg: Config, nodes: int) -> Config:
    """The same job on `nodes` nodes (its elastic range's bottom: MIN_NODES=0 there)."""
    return cfg.model_copy(update={"job_nodes": nodes, "min_nodes": 0})


def host_memory(cfg: Config, **change: Any) -> int:
    """Bytes all the processes of a local job hold together: each its shard of the state, its
    activations and transients as on a GPU (no CUDA context), and the process itself. `change`: Job
    fields to try."""
    job = replace(job_from(cfg, mfu=0.0, price=None), gpus_per_node=cfg.procs_per_node, **change)
    mem = memory(job)
    return cfg.world_size * (mem.total - CUDA_OVERHEAD + PROCESS_BASE)


def _host_fit_problem(cfg: Config, ram_bytes: int) -> str | None:
    need = host_memory(cfg)
    if need <= ram_bytes:
        return None
    t = cfg.training
    return (
        f"MODEL={t.model} at SEQ_LEN={t.seq_len} x MICRO_BATCH_SIZE={t.micro_batch_size} needs about "
        f"{need / GIB:.1f} GiB for {cfg.world_size} local processes (JOB_NODES={cfg.job_nodes} x "
        f"LOCAL_PROCS_PER_NODE={cfg.local_procs_per_node}), this machine has {ram_bytes / GIB:.1f} GiB: "
        f"{_host_fix(cfg, ram_bytes)}"
    )


def _host_fix(cfg: Config, ram_bytes: int) -> str:
    """The first single change that fits here, in the order a user would try them: the tiny model
    (when another one is set), then a shorter sequence, then one sequence per micro-batch; else the
    cluster."""
    t = cfg.training
    if t.model != "tiny" and host_memory(cfg, model="tiny") <= ram_bytes:
        return "use MODEL=tiny here, or BACKEND=eks"
    seq = t.seq_len
    while seq > 8:
        seq = max(8, seq // 2)
        if host_memory(cfg, seq_len=seq) <= ram_bytes:
            return f"lower SEQ_LEN to {seq} here, or BACKEND=eks"
    if t.micro_batch_size > 1 and host_memory(cfg, micro_batch=1) <= ram_bytes:
        return "set MICRO_BATCH_SIZE=1 here, or BACKEND=eks"
    return "no single change fits this machine: use BACKEND=eks (or fewer, smaller local processes)"

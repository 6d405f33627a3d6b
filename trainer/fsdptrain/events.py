"""The trainer's event lines: the typed contract between fsdptrain, which prints them, and fsdpctl,
which reads them for `job status`, `job run`'s progress bar and the local backend's leader. Pure: no
torch.

Rank 0 prints one compact JSON object per line, `{"event":KIND,...}`, between the human-readable
lines:

    {"event":"leader","node_rank":0,"hostname":"job-worker-0","world":16,"time":1718000000.0}
    {"event":"step","step":10,"max_steps":100,"loss":3.21,...}
    {"event":"checkpoint","step":20,"path":"/checkpoints/job/step-00000020"}
    {"event":"summary","steps":100,"start_step":0,"final_loss":2.9,...}
    {"event":"start","record_id":"3f9c...","torch":"2.6.0",...,"dataset":{...},"tokenizer":{...}}
    {"event":"stage","stage":"loading data","time":1718000001.0}
    {"event":"world","step":120,"from_world":3,"to_world":2,"rule":"constant","grad_accum":3,...}

`to_line` writes one; `parse` reads a log back, skipping every other line, a line cut by a crash
mid-write, an event kind it does not know (a newer trainer's) and fields it does not know.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any, ClassVar

from fsdptrain import fingerprint

PREFIX = '{"event"'
# The id of the run record fsdpctl wrote for this run (fsdpctl.job.record): set in the pods'
# environment, echoed by the trainer's start and summary lines and kept in every checkpoint's
# meta.json.
RECORD_ENV = "FSDPTRAIN_RECORD_ID"
# "not measured here" (a CPU has no allocator counters, no NVML): such a field is left out of the
# line
_OPTIONAL = {"omit_if_none": True}


@dataclass(frozen=True, kw_only=True)
class Leader:
    """Printed once at start by global rank 0, so a reader knows which node's log carries the
    progress."""

    kind: ClassVar[str] = "leader"
    node_rank: (
        int  # torchrun's GROUP_RANK: this node's place in the rendezvous (not its launch order)
    )
    hostname: str  # the pod's name on Kubernetes
    world: int
    time: float


@dataclass(frozen=True, kw_only=True)
class Step:
    kind: ClassVar[str] = "step"
    step: int
    max_steps: int
    loss: float
    # None only in lines of trainers that did not write them; readers need just step, loss, timing
    lr: float | None = None
    grad_norm: float | None = None
    step_time_s: float
    data_wait_frac: float | None = None
    time: float
    tokens_per_s: float
    tokens_per_s_per_device: float | None = None
    tflops_per_device: float | None = None
    mfu: float | None = None  # None (written as null) when the device's peak is unknown
    mem_allocated_gib: float | None = field(default=None, metadata=_OPTIONAL)
    mem_reserved_gib: float | None = field(default=None, metadata=_OPTIONAL)
    mem_peak_rss_gib: float | None = field(default=None, metadata=_OPTIONAL)
    gpu_util_pct: float | None = field(default=None, metadata=_OPTIONAL)
    gpu_temp_c: float | None = field(default=None, metadata=_OPTIONAL)
    gpu_power_w: float | None = field(default=None, metadata=_OPTIONAL)


@dataclass(frozen=True, kw_only=True)
class Checkpoint:
    kind: ClassVar[str] = "checkpoint"
    step: int
    path: str


@dataclass(frozen=True, kw_only=True)
class Summary:
    kind: ClassVar[str] = "summary"
    steps: int  # steps done by this run (after start_step)
    start_step: int
    final_loss: float
    first_loss: float
    losses: list[float]
    tokens_per_s: float
    tokens_per_s_per_device: float
    mfu: float | None
    # bytes per rank: sharded parameters, gradients, optimizer state; activations saved for backward
    param_bytes: int
    grad_bytes: int
    optim_bytes: int
    activation_bytes: int
    mem_allocated_gib: float | None = field(default=None, metadata=_OPTIONAL)
    mem_reserved_gib: float | None = field(default=None, metadata=_OPTIONAL)
    mem_peak_rss_gib: float | None = field(default=None, metadata=_OPTIONAL)
    checkpoint: str | None
    export: str | None
    stopped: bool  # ended before MAX_STEPS: a stop request or a disruption
    # why it stopped (fsdptrain.disruption): "stop" (fsdpctl job stop) or "disrupted" (SIGTERM: pod
    # evicted)
    stop_reason: str | None = field(default=None, metadata=_OPTIONAL)
    record_id: str | None = field(
        default=None, metadata=_OPTIONAL
    )  # RECORD_ENV; none outside fsdpctl
    # the job's world changes, oldest first, as their `world` lines' objects (the checkpoint's
    # history and this run's own): the leader's summary carries them all, since the pods whose
    # rank 0 printed the earlier ones may be gone with their logs (an elastic PyTorchJob's
    # cleanPodPolicy deletes the pods still running when it succeeds)
    world_changes: list[dict[str, Any]] | None = field(default=None, metadata=_OPTIONAL)


@dataclass(frozen=True, kw_only=True)
class Start:
    """Printed once by rank 0 after the build: what the run is made of as the trainer sees it
    (library versions, the data and tokenizer it reads). fsdpctl merges it into the run's record."""

    kind: ClassVar[str] = "start"
    record_id: str  # RECORD_ENV; '' when not started by fsdpctl
    python: str
    torch: str
    transformers: str
    cuda: str | None  # torch.version.cuda: None on a CPU build
    nccl: str | None  # torch.cuda.nccl.version(): None without CUDA
    device: str
    start_step: int  # 0 for a fresh run; the checkpoint's step when resumed
    dataset: dict[str, Any]  # fsdptrain.fingerprint
    tokenizer: dict[str, Any]
    time: float
    # how the speed settings resolved here, each with its reason (fsdptrain.levers): compile,
    # activation checkpointing, float8, the attention kernel, the garbage collector
    levers: dict[str, str] = field(default_factory=dict)
    # the checkpoint it resumed, as this trainer's CHECKPOINT_DIR names it; None: a fresh start
    resumed_from: str | None = field(default=None, metadata=_OPTIONAL)


@dataclass(frozen=True, kw_only=True)
class Stage:
    """Printed by rank 0 as it starts each part of the build (between the leader and start lines),
    so a reader can say what a run does before its first step instead of nothing for a minute."""

    kind: ClassVar[str] = "stage"
    stage: str  # "loading data", "building the model", "loading checkpoint step-00000020"
    time: float


@dataclass(frozen=True, kw_only=True)
class Finished:
    """Printed by a pod's launcher instead of training when the run already trained to MAX_STEPS
    (fsdptrain.launch.already_finished: a pod recreated after its node died past the last step, a
    Slurm job requeued after its trainers ended). Such a pod may be the one whose exit ends the job
    while the leader's log is gone with its pod: this line, from the run's last checkpoint, is then
    what a reader has of where the run got to."""

    kind: ClassVar[str] = "finished"
    step: int  # the last checkpoint's step, at MAX_STEPS
    max_steps: int
    loss: float | None  # the loss its meta.json kept (None in a checkpoint without one)
    checkpoint: str
    record_id: str
    # the job's world changes its meta.json kept (as Summary's: the leader's log may be gone)
    world_changes: list[dict[str, Any]] | None = field(default=None, metadata=_OPTIONAL)


@dataclass(frozen=True, kw_only=True)
class World:
    """Printed by rank 0 when a run resumes a checkpoint saved on another world size (a node lost,
    or back): which rule the global batch follows now (fsdptrain.elastic). Worlds are ranks; the
    nodes are those ranks over the processes per node, for a reader that speaks of nodes."""

    kind: ClassVar[str] = "world"
    step: int  # the checkpoint's step: the first step on the new world is the next one
    from_world: int
    to_world: int
    from_nodes: int | None = field(default=None, metadata=_OPTIONAL)  # None: not known
    to_nodes: int
    rule: str  # "constant" (by gradient accumulation) or "per-rank"
    grad_accum: int  # micro-batches per rank per step on the new world
    global_batch: int  # sequences per step on the new world
    target_global_batch: int  # the job's, kept whatever the rule
    checkpoint: str
    time: float


Event = Leader | Step | Checkpoint | Summary | Start | Stage | Finished | World
KINDS: dict[str, type[Event]] = {
    cls.kind: cls for cls in (Leader, Step, Checkpoint, Summary, Start, Stage, Finished, World)
}


def as_record(event: Event) -> dict[str, Any]:
    """The event as the JSON object of its line: `{"event": kind, field: value, ...}` in field
    order."""
    values = asdict(event)
    omit = {
        f.name for f in fields(event) if f.metadata.get("omit_if_none") and values[f.name] is None
    }
    return {"event": event.kind, **{k: v for k, v in values.items() if k not in omit}}


# Below this a save is within what any estimate of it leaves out (the planner's step time has no
# kernel-launch or collective latency, a save's rate no metadata or fsync latency) and costs next to
# nothing: neither the trainer's slow-save warning nor fsdpctl's (fsdpctl.plan.volume) speaks of a
# shorter one, whatever it is compared with.
MATERIAL_SAVE_S = 1.0


def seconds_text(seconds: float) -> str:
    """A duration as the trainer's lines and fsdpctl's warnings print it: never "0 s" for one that
    is not zero. Whole seconds from 10 s, one decimal from 1 s, two significant digits below
    (0.038 s, 0.00056 s)."""
    if seconds >= 10:
        return f"{seconds:,.0f} s"
    if seconds >= 1:
        return f"{seconds:.1f} s"
    return f"{seconds:.2g} s"


def to_line(event: Event) -> str:
    return json.dumps(as_record(event), separators=(",", ":"))


# A line is read back from a log anyone may have written into: each field must have its declared
# type before a reader does arithmetic with it. Times, rates and counts are finite; a loss may be
# NaN or inf (a diverged run prints what it computed).
MAY_DIVERGE = frozenset({"loss", "grad_norm", "final_loss", "first_loss", "losses", "mfu"})
POSITIVE = frozenset(  # divided by, or a count of something that exists
    {
        "max_steps",
        "world",
        "from_world",
        "to_world",
        "from_nodes",
        "to_nodes",
        "grad_accum",
        "global_batch",
        "target_global_batch",
    }
)


def _typed(name: str, declared: str, value: Any) -> bool:
    """Whether `value` fits the field's declared type (the annotation's text: these dataclasses are
    declared under `from __future__ import annotations`)."""
    if value is None:
        return declared.endswith("| None")
    base = declared.removesuffix(" | None")
    finite = name in MAY_DIVERGE or _finite(value)
    if base == "int":
        return (
            isinstance(value, int)
            and not isinstance(value, bool)
            and (value >= 1 or name not in POSITIVE)
        )
    if base == "float":
        return isinstance(value, int | float) and not isinstance(value, bool) and finite
    if base == "str":
        return isinstance(value, str)
    if base == "bool":
        return isinstance(value, bool)
    if base == "list[float]":
        return isinstance(value, list) and all(_typed(name, "float", v) for v in value)
    if base == "list[dict[str, Any]]":
        return isinstance(value, list) and all(isinstance(v, dict) for v in value)
    return isinstance(value, dict)  # dict[str, Any]


def _finite(value: Any) -> bool:
    return not isinstance(value, float) or math.isfinite(value)


def from_record(record: Mapping[str, Any]) -> Event | None:
    """The typed event of one decoded line; None for an unknown kind, a line missing a required
    field, or one whose fields are not of their types (a damaged or foreign line: skipped like a cut
    one)."""
    kind = record.get("event")
    cls = KINDS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        return None
    declared = {f.name: str(f.type) for f in fields(cls)}
    values = {k: v for k, v in record.items() if k in declared}
    if not all(_typed(k, declared[k], v) for k, v in values.items()):
        return None
    if cls is Start and not all(
        fingerprint.well_formed(values.get(k)) for k in ("dataset", "tokenizer")
    ):
        return None
    try:
        return cls(**values)
    except TypeError:  # a required field is missing
        return None


def parse(lines: Iterable[str]) -> Iterator[Event]:
    """The events among a log's lines, in order."""
    for raw in lines:
        line = raw.strip()
        if not line.startswith(PREFIX):
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:  # a line cut by a crash mid-write
            continue
        event = from_record(record)
        if event is not None:
            yield event

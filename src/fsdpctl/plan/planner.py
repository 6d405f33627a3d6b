"""Before launch: memory per GPU, step time, throughput, MFU and cost, from a small documented model
(pure).

Memory per GPU (bytes), for N parameters, shard group size S (FULL_SHARD/SHARD_GRAD_OP: world;
HYBRID_SHARD: HSDP_SHARD_SIZE; NO_SHARD: 1), p = bytes of the compute dtype (2 for bf16/fp16, 4 for
fp32):
- sharded state: FSDP2 keeps fp32 sharded parameters and fp32 gradients, AdamW two fp32 moments: 16
  N / S.
- activations saved for backward per micro-batch of T = batch x seq tokens, measured on HF Llama
  (sdpa): per layer and token p/2 x (12 h + 4 h_kv + 8 i + 24) + 8 h (RMSNorm keeps an fp32 copy); a
  checkpointed layer keeps only its input, p x h; after the layers 4 V (fp32 log-softmax for the
  loss) + p/2 x 4 h + 4 h + 16.
- parameters left unsharded at the end of forward under SHARD_GRAD_OP: those of the layers that are
  not checkpointed and the output head, at p bytes.
- GPU only: the layers FSDP gathers ahead (2 layers' parameters at p, their gradients at 4 bytes),
  one layer's recomputed activations under checkpointing, the logits' temporaries (6 V per token),
  and 2 GiB for the CUDA context and NCCL buffers.
Step time, throughput and MFU: the speed model, fsdpctl.plan.steptime (its docstring).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any, NotRequired, TypedDict

from fsdpctl.plan.instances import INSTANCE_TYPES, InstanceType
from fsdpctl.plan.steptime import SPEED_MODEL, speed
from fsdptrain.shapes import (
    MODEL_CONFIGS,
    ModelShape,
    hsdp_group_size,
)

if TYPE_CHECKING:
    from fsdpctl.plan.volume import VolumeReport
    from fsdpctl.settings import Config


GIB = 1024**3


CUDA_OVERHEAD = 2 * GIB


USABLE = 0.95  # of the card's memory, the rest is the driver's and the allocator's fragmentation


# On-demand Linux prices in us-east-1, USD per instance-hour, as AWS listed them after its June 2025
# GPU price cut; check the EC2 pricing page before relying on them. None: unknown, pass --price.
PRICES_AS_OF = "2025-06 (us-east-1, on-demand)"


PRICE_PER_HOUR = {"p4de.24xlarge": 27.45, "p5.48xlarge": 55.04, "p5e.48xlarge": None}


@dataclass(frozen=True)
class Job:
    model: str
    instance_type: str
    nodes: int
    gpus_per_node: int
    strategy: str
    precision: str
    ac: str  # none | full | every-k | selective
    ac_every: int
    micro_batch: int
    seq_len: int
    grad_accum: int = 1
    hsdp_shard_size: int = 0
    mfu: float = 0.0  # 0: the speed model's compute efficiency for the GPU and model
    compiled: bool = (
        False  # COMPILE on: the compute efficiency times COMPILE_GAIN on the GPUs measured
    )
    price_per_hour: float | None = None  # None: PRICE_PER_HOUR
    # gradients are reduced in this dtype: fsdptrain's
    # MixedPrecisionPolicy(reduce_dtype=torch.float32)
    reduce_dtype: str = "fp32"

    @property
    def shape(self) -> ModelShape:
        return MODEL_CONFIGS[self.model]

    @property
    def instance(self) -> InstanceType:
        return INSTANCE_TYPES[self.instance_type]

    @property
    def world(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def shard_size(self) -> int:
        if self.strategy == "NO_SHARD":
            return 1
        if self.strategy == "HYBRID_SHARD":
            return hsdp_group_size(self.hsdp_shard_size, self.gpus_per_node)
        return self.world

    @property
    def p(self) -> int:
        return 4 if self.precision == "fp32" else 2

    @property
    def reduce_bytes(self) -> int:
        return 4 if self.reduce_dtype == "fp32" else 2

    def checkpointed_layers(self) -> int:
        if self.ac == "none":
            return 0
        if self.ac == "selective":  # for memory: about half a layer's activations are recomputed
            return round(self.shape.layers * SPEED_MODEL.selective_share)
        return (
            self.shape.layers if self.ac == "full" else math.ceil(self.shape.layers / self.ac_every)
        )


@dataclass(frozen=True)
class Memory:
    params: int
    grads: int
    optimizer: int
    activations: int  # saved for backward at the end of forward (incl. parameters kept unsharded)
    transient: int  # GPU-only terms: prefetch, recompute, logits temporaries, CUDA context
    capacity: int

    @property
    def state(self) -> int:
        return self.params + self.grads + self.optimizer

    @property
    def measured_equivalent(self) -> int:
        """What fsdptrain measures on CPU: sharded state + bytes held for backward."""
        return self.state + self.activations

    @property
    def total(self) -> int:
        return self.state + self.activations + self.transient

    @property
    def fits(self) -> bool:
        return self.total <= self.capacity


def _layer_bytes_per_token(s: ModelShape, p: int) -> float:
    head_dim = s.hidden // s.heads
    h_kv = s.kv_heads * head_dim
    return p / 2 * (12 * s.hidden + 4 * h_kv + 8 * s.intermediate + 24) + 8 * s.hidden


def activation_bytes(job: Job, vocab: int | None = None) -> int:
    """Bytes held for backward at the end of forward, per GPU, for one micro-batch."""
    s, p = job.shape, job.p
    tokens = job.micro_batch * job.seq_len
    ckpt = job.checkpointed_layers()
    layers = (s.layers - ckpt) * _layer_bytes_per_token(s, p) + ckpt * p * s.hidden
    tail = 4 * (vocab or s.vocab) + p / 2 * 4 * s.hidden + 4 * s.hidden + 16
    held = 0
    if (
        job.strategy == "SHARD_GRAD_OP"
    ):  # gathered parameters stay until backward where autograd saved them:
        held = p * (
            (s.layers - ckpt) * s.layer_params() + s.vocab * s.hidden
        )  # (+ the output head)
    return int(tokens * (layers + tail) + held)


def memory(job: Job, vocab: int | None = None) -> Memory:
    s, p = job.shape, job.p
    n = s.num_params()
    shard = job.shard_size
    tokens = job.micro_batch * job.seq_len
    transient = (
        2
        * s.layer_params()
        * (p + 4)  # two layers gathered (params) and their unsharded fp32 grads
        + (tokens * _layer_bytes_per_token(s, p) if job.ac != "none" else 0)
        + tokens * 6 * (vocab or s.vocab)
        + CUDA_OVERHEAD
    )
    return Memory(
        params=4 * n // shard,
        grads=4 * n // shard,
        optimizer=8 * n // shard,
        activations=activation_bytes(job, vocab),
        transient=int(transient),
        capacity=int(job.instance.gpu_memory_gib * GIB * USABLE),
    )


def price(job: Job) -> float | None:
    return (
        job.price_per_hour
        if job.price_per_hour is not None
        else PRICE_PER_HOUR.get(job.instance_type)
    )


def cost(job: Job, tokens: float) -> tuple[float, float | None]:
    """(hours, USD) to train on `tokens` tokens; USD is None when the price is unknown."""
    hours = tokens / speed(job).tokens_per_s / 3600
    per_hour = price(job)
    return hours, (hours * job.nodes * per_hour if per_hour is not None else None)


def candidate_fixes(job: Job) -> list[tuple[str, Job]]:
    """Single changes a user can make, from the settings they touch."""
    out = []
    if job.ac != "full":
        out.append(("ACTIVATION_CHECKPOINTING=full", replace(job, ac="full")))
    if job.micro_batch > 1:
        out.append(
            (
                f"MICRO_BATCH_SIZE=1 and GRAD_ACCUM_STEPS={job.grad_accum * job.micro_batch}",
                replace(job, micro_batch=1, grad_accum=job.grad_accum * job.micro_batch),
            )
        )
    if job.strategy != "FULL_SHARD":
        out.append(("SHARDING_STRATEGY=FULL_SHARD", replace(job, strategy="FULL_SHARD")))
    if job.strategy == "HYBRID_SHARD":  # a bigger shard group keeps HSDP's cross-node all-reduce
        for size in (job.gpus_per_node * k for k in (2, 4, 8, 16)):
            if job.shard_size < size < job.world and job.world % size == 0:
                out.append((f"HSDP_SHARD_SIZE={size}", replace(job, hsdp_shard_size=size)))
    for nodes in (2, 4, 8, 16, 32):
        if nodes > job.nodes:
            out.append((f"JOB_NODES={nodes}", replace(job, nodes=nodes)))
    for name, inst in INSTANCE_TYPES.items():
        if inst.gpu_memory_gib > job.instance.gpu_memory_gib:
            out.append((f"INSTANCE_TYPE={name}", replace(job, instance_type=name)))
    return out


def cheapest_fix(job: Job, tokens: float) -> tuple[str, Job] | None:
    """Of the single changes that make the job fit, the one with the lowest cost (then time) for
    `tokens`."""
    fitting = [(name, j) for name, j in candidate_fixes(job) if memory(j).fits]
    if not fitting:
        # two changes: full checkpointing plus the fewest nodes that fit
        for nodes in (2, 4, 8, 16, 32, 64):
            j = replace(job, ac="full", nodes=max(nodes, job.nodes), strategy="FULL_SHARD")
            if memory(j).fits:
                return (
                    f"ACTIVATION_CHECKPOINTING=full, SHARDING_STRATEGY=FULL_SHARD and JOB_NODES={j.nodes}",
                    j,
                )
        return None

    def key(item: tuple[str, Job]) -> tuple[float, float]:
        hours, usd = cost(item[1], tokens)
        return (usd if usd is not None else math.inf, hours)

    return min(fitting, key=key)


# Job field <- TrainConfig field: the training half of a planned job is the trainer's own settings
FROM_TRAINING = {
    "model": "model",
    "strategy": "sharding_strategy",
    "precision": "precision",
    "ac": "activation_checkpointing",
    "ac_every": "ac_every",
    "micro_batch": "micro_batch_size",
    "seq_len": "seq_len",
    "grad_accum": "grad_accum_steps",
    "hsdp_shard_size": "hsdp_shard_size",
}


def job_from(cfg: Config, *, mfu: float, price: float | None) -> Job:
    """The job the settings describe, as the planner sees it (`mfu` 0: the GPU's assumed MFU)."""
    training: dict[str, Any] = {
        field: getattr(cfg.training, key) for field, key in FROM_TRAINING.items()
    }
    return Job(
        instance_type=cfg.instance_type,
        nodes=cfg.job_nodes,
        gpus_per_node=cfg.gpus,
        **training,
        mfu=mfu,
        price_per_hour=price,
        # COMPILE=auto compiles on the GPU nodes: the image has the C compiler and headers Triton
        # needs
        compiled=cfg.training.compile != "false",
    )


class PlanReport(TypedDict):
    """`fsdpctl plan` of one job (`report`; what -o json prints): GiB, seconds, hours, USD."""

    job: dict[str, Any]  # the Job's fields (dataclasses.asdict)
    memory_gib: dict[str, float]  # per GPU: each of Memory's parts, the total, the state
    fits: bool
    fix: str | None  # the cheapest single change that fits, when it does not
    fix_memory_gib: float | None
    speed: dict[str, float]  # Speed's fields
    tokens: float
    hours: float
    usd: float | None  # None: no list price
    price_per_hour: float | None
    prices_as_of: str
    volume: NotRequired[VolumeReport]  # `plan` adds the shared volume's (plan.volume.report)
    minimum: NotRequired[MinimumReport]  # `plan` adds it where MIN_NODES sets an elastic range


class MinimumReport(TypedDict):
    """The job on the fewest nodes of its elastic range (MIN_NODES), under the trainer's batch rule
    (fsdptrain.elastic): what a stretch on lost nodes costs."""

    nodes: int
    fits: bool
    memory_gib: float  # per GPU
    rule: str  # constant (the global batch kept by gradient accumulation) or per-rank
    grad_accum: int
    tokens_per_s: float
    hours: float  # for all the tokens, were the whole run at the minimum
    usd: float | None


def at_minimum(job: Job, nodes: int, tokens: float) -> MinimumReport:
    """`job` on `nodes` nodes, its gradient accumulation as the trainer's one rule sets it on the
    smaller world (elastic.batch_for: the job's global batch kept where the world divides it)."""
    from fsdptrain import elastic

    world = job.gpus_per_node
    rule = elastic.batch_for(
        micro_batch=job.micro_batch,
        grad_accum=job.grad_accum,
        world=nodes * world,
        target=job.micro_batch * job.grad_accum * job.nodes * world,
    )
    low = replace(job, nodes=nodes, grad_accum=rule.grad_accum)
    mem, hours_usd = memory(low), cost(low, tokens)
    return {
        "nodes": nodes,
        "fits": mem.fits,
        "memory_gib": mem.total / GIB,
        "rule": rule.rule,
        "grad_accum": rule.grad_accum,
        "tokens_per_s": speed(low).tokens_per_s,
        "hours": hours_usd[0],
        "usd": hours_usd[1],
    }


def report(job: Job, tokens: float) -> PlanReport:
    """Everything `fsdpctl plan` says about one job, in GiB, seconds, hours and USD (what -o json
    prints)."""
    mem, spd = memory(job), speed(job)
    hours, usd = cost(job, tokens)
    fix = None if mem.fits else cheapest_fix(job, tokens)
    return {
        "job": asdict(job),
        "memory_gib": {k: v / GIB for k, v in asdict(mem).items()}
        | {"total": mem.total / GIB, "state": mem.state / GIB},
        "fits": mem.fits,
        "fix": fix[0] if fix else None,
        "fix_memory_gib": memory(fix[1]).total / GIB if fix else None,
        "speed": asdict(spd),
        "tokens": tokens,
        "hours": hours,
        "usd": usd,
        "price_per_hour": price(job),
        "prices_as_of": PRICES_AS_OF,
    }

"""Published FSDP throughput and scaling, as data with their sources, and the planner's prediction
(pure).

Every row names where its number was printed and the configuration it was measured in; `predict`
runs the planner's one speed model (`fsdpctl.plan.steptime.SPEED_MODEL`, the same parameters for
every row) on that configuration. BENCHMARKS.md's "Planner against published numbers" is
`benchmarks/published.py`'s output.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from fsdpctl.plan.instances import INSTANCE_TYPES, InstanceType
from fsdpctl.plan.planner import Job
from fsdpctl.plan.steptime import SPEED_MODEL, SpeedModel, speed

IBM_BLOG = "https://pytorch.org/blog/maximizing-training/ (IBM/Meta, 2024-03-13, Table 1)"
FMS_FSDP = "github.com/foundation-model-stack/fms-fsdp README.md (sharding per model)"
TITAN = "github.com/pytorch/torchtitan docs/performance.md (Llama 2 on 64 A100, FSDP2)"
AWS_BLOG = "https://aws.amazon.com/blogs/machine-learning/scale-llms-with-pytorch-2-0-fsdp-on-amazon-eks-part-2/"

# The clusters as the sources describe them; what a source leaves out is an assumption, in
# `Cluster.note`. The IBM/Meta blog: "an A100 cluster with 128 GPUs and 400Gbps inter-node
# interconnect, and an H100 cluster with 96 GPUs and 800Gbps inter-node interconnect"; NVLink as on
# p4de/p5 (8 GPUs a node).
A100_400G = InstanceType("a100-400g", "A100", 8, 80, 0, 400, 0, 0, 300)
H100_800G = InstanceType("h100-800g", "H100", 8, 80, 0, 800, 0, 0, 450)


@dataclass(frozen=True)
class Cluster:
    inst: InstanceType
    note: str = ""


CLUSTERS = {
    "ibm-a100": Cluster(A100_400G),
    "ibm-h100": Cluster(H100_800G),
    # torchtitan's page gives no interconnect. Its multi-node launcher of the same days
    # (multinode_trainer.slurm at 395a526) is "optimized for AWS with EFA", sets FI_PROVIDER=efa
    # "for A100" and 96 CPUs a task (a p4d/p4de node's vCPUs): AWS's A100 nodes, 400 Gbps EFA.
    "titan-a100": Cluster(
        A100_400G, "interconnect not stated; 400 Gbps EFA inferred from its AWS launcher"
    ),
    "p5": Cluster(INSTANCE_TYPES["p5.48xlarge"]),
}


@dataclass(frozen=True)
class Point:
    """One published number: `metric` is tokens_per_s_per_gpu, or scaling (per-GPU throughput at
    `nodes` over one node's)."""

    key: str
    source: str
    model: str
    cluster: str
    nodes: int
    seq_len: int
    micro_batch: int
    ac: str  # none | full | selective (IBM/Meta: every other block; torchtitan: layer or op)
    strategy: str
    metric: str
    published: float
    note: str = ""
    known_miss: str = (
        ""  # why the model cannot reach this row honestly (empty: it must be within 10%)
    )
    reduce_dtype: str = "fp32"  # the dtype the source's mixed-precision policy reduces gradients in

    def job(self) -> Job:
        inst = CLUSTERS[self.cluster].inst
        return Job(
            model=self.model,
            instance_type="p5.48xlarge",  # unused: predict passes the cluster's own InstanceType
            nodes=self.nodes,
            gpus_per_node=inst.gpus,
            strategy=self.strategy,
            precision="bf16",
            ac=self.ac,
            ac_every=2,
            micro_batch=self.micro_batch,
            seq_len=self.seq_len,
            hsdp_shard_size=inst.gpus,
            reduce_dtype=self.reduce_dtype,
        )


def _ibm(model: str, gpu: str, ac: str, tps: float, strategy: str) -> Point:
    nodes = 16 if gpu == "A100" else 12  # 128 A100 / 96 H100, 8 a node
    return Point(
        f"ibm-{model}-{gpu.lower()}",
        f"{IBM_BLOG}; {FMS_FSDP}",
        model,
        f"ibm-{gpu.lower()}",
        nodes,
        4096,
        2,
        ac,
        strategy,
        "tokens_per_s_per_gpu",
        tps,
        "bf16, no torch.compile, SDPA flash attention; gradients reduced in bf16 (fms-fsdp's default "
        "mixed_precision=True picks its bfSixteen policy, reduce_dtype=torch.bfloat16)",
        reduce_dtype="bf16",
    )


def _titan(key: str, model: str, mb: int, ac: str, wps: float, known_miss: str = "") -> Point:
    return Point(
        key,
        TITAN,
        model,
        "titan-a100",
        8,
        4096,
        mb,
        ac,
        "FULL_SHARD",
        "tokens_per_s_per_gpu",
        wps,
        "bf16 FSDP2, no compile, no float8; 'selective' = layer (every 2nd) or op SAC",
        known_miss,
    )


POINTS: tuple[Point, ...] = (
    # IBM/Meta Table 1 (batch 2 per GPU, seq 4k); fms-fsdp's README of the blog's day (5e522b4,
    # 2024-03-13), the same numbers per model: HSDP for 7B, FSDP for 13B and 70B (its 13B HSDP row
    # was batch 1, 1700 tok/s)
    _ibm("7b", "A100", "none", 3700, "HYBRID_SHARD"),
    _ibm("13b", "A100", "selective", 1800, "FULL_SHARD"),
    _ibm("70b", "A100", "full", 370, "FULL_SHARD"),
    _ibm("7b", "H100", "none", 7500, "HYBRID_SHARD"),
    _ibm("13b", "H100", "selective", 3800, "FULL_SHARD"),
    _ibm("70b", "H100", "full", 800, "FULL_SHARD"),
    _titan("titan-13b-none", "13b", 2, "none", 2162),
    _titan("titan-13b-sel-layer", "13b", 2, "selective", 1914),
    _titan("titan-13b-sel-op", "13b", 2, "selective", 1904),
    _titan(
        "titan-70b-sel-op-mb1",
        "70b",
        1,
        "selective",
        355,
        "batch 1 because batch 2 OOMs (its footnote); at one 4k sequence per GPU the step is "
        "communication-bound in both phases: two bf16 "
        "all-gathers of 138 GB and torchtitan's fp32 reduce-scatter (MixedPrecisionPolicy(reduce_dtype="
        "torch.float32) at 395a526) of 276 GB take 13.6 s at 40 GB/s (400 Gbps x 0.8), against 8.9 s of "
        "compute (10.0 s with the straggler term); the published 355 tok/s is an 11.5 s step, which needs "
        "47 GB/s, 0.94 of EFA's line rate (0.85 to come within 10%), above the 0.8 nccl-tests show on p4d, "
        "or a bf16 reduce-scatter (+9% if it were, but the source's was fp32). The same page's Llama 3 70B "
        "at batch 1 with full checkpointing (331 tok/s, a 12.4 s step) points the same way; the page "
        "states no network",
    ),
    _titan("titan-70b-full", "70b", 2, "full", 353),
    Point(
        "aws-p5-16-scaling",
        AWS_BLOG,
        "7b",
        "p5",
        16,
        4096,
        1,
        "full",
        "FULL_SHARD",
        "scaling",
        0.87,
        "'87% scaling efficiency with FSDP Llama2 fine-tuning in a 16-node cluster' of p5.48xlarge; the "
        "model is not named beside the figure: aws-do-eks's default Llama-2-7b-hf, seq 4096, batch 1 assumed "
        "(with communication hidden the predicted scaling is the same for 7B and 13B)",
    ),
)


@dataclass(frozen=True)
class Prediction:
    point: Point
    predicted: float

    @property
    def error(self) -> float:
        return self.predicted / self.point.published - 1


def predict(point: Point, model: SpeedModel = SPEED_MODEL) -> Prediction:
    """The planner's number for `point`, from `model`'s parameters and the row's configuration
    alone."""
    inst = CLUSTERS[point.cluster].inst
    job = point.job()
    per_gpu = speed(job, model, inst).tokens_per_s_per_gpu
    if point.metric == "scaling":
        per_gpu /= speed(replace(job, nodes=1), model, inst).tokens_per_s_per_gpu
    return Prediction(point, per_gpu)


def predictions(model: SpeedModel = SPEED_MODEL) -> list[Prediction]:
    return [predict(p, model) for p in POINTS]

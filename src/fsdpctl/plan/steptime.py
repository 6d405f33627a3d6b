"""The speed model (pure): a job's step time, throughput and MFU on an instance type, from one set
of global parameters (`SpeedModel`).

Step time (one set of global parameters, checked against published
runs in `fsdpctl.plan.published` and BENCHMARKS.md "Planner against published numbers"):
- compute = tokens x (6 N' + attention + 2 N' per recomputed share of the layers) / (peak x
  efficiency); efficiency = matmul efficiency of the GPU generation / (1 + k x (peak FLOP/s / HBM
  bytes/s) / hidden): the memory-bound work (norms, rotary, SwiGLU, softmax) grows as hidden per
  token while matmuls grow as hidden^2, and costs more where a GPU has fewer bytes of HBM bandwidth
  per FLOP (H100 vs A100, as IBM/Meta note).
- checkpointing recomputes the forward of the checkpointed layers: all under full, one in k under
  every-k, SELECTIVE_SHARE of the layer under selective (per-op SAC recomputes about every other
  matmul).
- communication = all-gathers of p N per forward and backward of every micro-batch (one under
  SHARD_GRAD_OP), one reduce-scatter per step in the job's reduce dtype (`Job.reduce_dtype`: fp32 as
  fsdptrain's MixedPrecisionPolicy and torchtitan's; bf16 as fms-fsdp's bfSixteen), and under
  HYBRID/NO_SHARD an all-reduce across replicas in the same dtype; a ring moves (n-1)/n of the data
  over the slowest link it crosses: NVLink inside a node, the node's EFA bandwidth across nodes, at
  the collective efficiency of line rate (see `_bandwidth`).
- overlap, per phase (IBM/Meta's blog, appendix "Communication computation overlap": the gathers
  overlap the forward; the next unit's gather and the gradient scatter overlap the backward; HSDP's
  all-reduce only the backward): forward of a micro-batch = g / L + max(forward, g (1 - 1/L)) (the
  first layer's gather cannot be hidden); backward = max(backward, g), and on the last micro-batch
  max(backward, g + r (1 - 1/L)) + r / L (nor the last layer's reduction), with g one gather, r the
  reduction, forward a third of the 6 N' + attention FLOPs and backward the rest plus the recompute.
  A step is never faster than its compute or its communication alone, nor slower than the two one
  after the other.
- stragglers: every collective waits for the slowest node, so compute over n nodes whose per-node
  times vary with relative deviation sigma takes about (1 + sigma x sqrt(2 ln n)) of one node's (the
  leading term of the expected maximum of n Gaussians); on one node the GPUs share a clock domain
  and NVLink. The factor scales the compute inside each phase, not the communication: a slow node's
  extra compute is absorbed while the network is the bottleneck, and the collectives' own speed at
  scale is the link efficiency.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fsdptrain.shapes import PEAK_TFLOPS, flops_per_token

if TYPE_CHECKING:
    from fsdpctl.plan.instances import InstanceType
    from fsdpctl.plan.planner import Job


# HBM bandwidth per GPU, bytes/s (NVIDIA datasheets: A100 80GB SXM 2.0 TB/s, H100 SXM 3.35, H200
# 4.8).
HBM_BYTES_PER_S = {"A100": 2.0e12, "H100": 3.35e12, "H200": 4.8e12}


@dataclass(frozen=True)
class SpeedModel:
    """The speed model's global parameters: one set for every job and every published row (no
    per-row fits).

    Where each value comes from (BENCHMARKS.md shows every row against it):
    - matmul_efficiency: share of the dense bf16 peak a large GEMM reaches, per GPU generation. A100
      ~0.9 and H100 ~0.7 are what cuBLAS bf16 GEMMs reach (H200 measured here: 788 of 989 TFLOP/s,
      0.80); the values are set so that the 70B rows (the largest matmuls) of IBM/Meta's table come
      out right.
    - membound_k: the memory-bound term's weight, set by the trend of IBM/Meta's HFU from 7B to 70B.
    - link_efficiency: collective bus bandwidth / line rate (nccl-tests: ~40 GB/s bus on 400 Gbps
      p4d).
    - straggler_sigma: relative per-node compute-time deviation, set by the one published scaling
      figure (AWS, 87% at 16 p5 nodes); it is the only number that moves scaling when communication
      is hidden.
    - selective_share: recomputed share of a layer's forward under selective checkpointing
      (torchtitan's per-op SAC recomputes every other matmul; IBM/Meta's "selective" checkpoints
      every other block).
    """

    matmul_efficiency: Mapping[str, float]
    membound_k: float
    link_efficiency: float
    straggler_sigma: float
    selective_share: float


SPEED_MODEL = SpeedModel(
    matmul_efficiency={"A100": 0.90, "H100": 0.69, "H200": 0.69},
    membound_k=9.6,
    link_efficiency=0.8,
    straggler_sigma=0.064,
    selective_share=0.5,
)


# Compiled decoder layers (COMPILE, auto in the image) against eager, as a factor on the compute
# efficiency: the trainer on one H200, Llama-2-7B's layer x 8, seq 4096, bf16, micro-batch 1,
# medians of steps 5-12: 136.9 ms eager, 118.6 ms compiled (shared/gpu/2026-12-04/ANALYSIS.md
# section 0; BENCHMARKS.md "GPU"). The same factor for the H100 (same Hopper SMs, less HBM bandwidth
# for the memory-bound work compile fuses: if anything it gains more); none for the A100, where no
# compiled step was measured. The published rows the speed model is checked against ran eager
# (fsdpctl.plan.published), so they keep a factor of 1.
COMPILE_GAIN = {"H100": 136.9 / 118.6, "H200": 136.9 / 118.6}


@dataclass(frozen=True)
class Speed:
    compute_s: float
    comm_s: float
    step_s: float
    tokens_per_step: int
    tokens_per_s: float
    tokens_per_s_per_gpu: float
    mfu: float
    tflops_per_gpu: float


def _bandwidth(job: Job, group: int, inst: InstanceType, model: SpeedModel) -> float:
    """Bus bandwidth (bytes/s) of a ring over `group` GPUs: NVLink inside a node; across nodes each
    ring crosses a node's NICs once per direction, so the node's whole EFA bandwidth bounds it
    (nccl-tests show ~40 GB/s bus bandwidth on 400 Gbps p4d)."""
    nvlink = inst.nvlink_gbps * 1e9
    if group <= job.gpus_per_node:
        return nvlink * model.link_efficiency
    return min(nvlink, inst.network_gbps / 8 * 1e9) * model.link_efficiency


def _ring(size_bytes: float, group: int, bw: float, all_reduce: bool = False) -> float:
    if group <= 1:
        return 0.0
    return (2 if all_reduce else 1) * (group - 1) / group * size_bytes / bw


def compute_efficiency(
    gpu: str, precision: str, hidden: int, model: SpeedModel = SPEED_MODEL
) -> float:
    """Achieved share of the peak on a Llama layer of width `hidden` (see the module docstring)."""
    peak = PEAK_TFLOPS[gpu][precision] * 1e12
    return model.matmul_efficiency[gpu] / (
        1 + model.membound_k * peak / HBM_BYTES_PER_S[gpu] / hidden
    )


def recomputed_share(job: Job, model: SpeedModel = SPEED_MODEL) -> float:
    """Share of the layers' forward computed twice under the job's activation checkpointing."""
    if job.ac == "selective":
        return model.selective_share
    return job.checkpointed_layers() / job.shape.layers


def straggler_factor(nodes: int, model: SpeedModel = SPEED_MODEL) -> float:
    """Expected slowest-of-`nodes` step time over one node's: 1 + sigma sqrt(2 ln n)."""
    return 1 + model.straggler_sigma * math.sqrt(2 * math.log(nodes)) if nodes > 1 else 1.0


@dataclass(frozen=True)
class _Comm:
    """One micro-batch's gather (forward), its gather again for backward, and a step's reduction,
    in seconds."""

    gather: float
    back_gather: float
    reduce: float


def _comm(job: Job, inst: InstanceType, model: SpeedModel) -> _Comm:
    n, shard = job.shape.num_params(), job.shard_size
    bw_shard = _bandwidth(job, shard, inst, model)
    gather = _ring(job.p * n, shard, bw_shard)
    # SHARD_GRAD_OP keeps them gathered
    back_gather = 0.0 if job.strategy == "SHARD_GRAD_OP" else gather
    reduce = _ring(job.reduce_bytes * n, shard, bw_shard)
    replicas = job.world // shard
    if replicas > 1:
        world_bw = _bandwidth(job, job.world, inst, model)
        reduce += _ring(job.reduce_bytes * n / shard, replicas, world_bw, all_reduce=True)
    return _Comm(gather, back_gather, reduce)


def _step(job: Job, forward: float, backward: float, c: _Comm, lag: float) -> float:
    """A step's seconds, the phases overlapped as the module docstring says; `lag` (stragglers)
    scales the compute only."""
    layers = job.shape.layers
    hidden = (
        1 - 1 / layers
    )  # the first layer's gather and the last layer's reduction cannot overlap
    fwd_phase = c.gather / layers + max(forward * lag, c.gather * hidden)
    return (
        job.grad_accum * fwd_phase
        + (job.grad_accum - 1) * max(backward * lag, c.back_gather)
        + max(backward * lag, c.back_gather + c.reduce * hidden)
        + c.reduce / layers
    )


def speed(job: Job, model: SpeedModel = SPEED_MODEL, inst: InstanceType | None = None) -> Speed:
    """The step of `job` on `inst` (default: its instance type's), under the speed model's
    parameters."""
    s, inst = job.shape, inst or job.instance
    n = s.num_params()
    fpt = flops_per_token(n, s.vocab * s.hidden, s.layers, s.hidden, job.seq_len)
    recompute = recomputed_share(job, model) * 2 * (n - s.vocab * s.hidden)
    tokens_mb = job.micro_batch * job.seq_len
    tokens_gpu = tokens_mb * job.grad_accum
    peak = PEAK_TFLOPS[inst.gpu][job.precision] * 1e12
    eff = job.mfu or compute_efficiency(inst.gpu, job.precision, s.hidden, model) * (
        COMPILE_GAIN.get(inst.gpu, 1.0) if job.compiled else 1.0
    )
    # one micro-batch: the forward is a third of the training FLOPs, the backward the rest plus the
    # recompute
    forward = tokens_mb * fpt / 3 / (peak * eff)
    backward = tokens_mb * (2 * fpt / 3 + recompute) / (peak * eff)
    c = _comm(job, inst, model)
    comm = job.grad_accum * (c.gather + c.back_gather) + c.reduce
    # on the compute only: see the module docstring
    step = _step(job, forward, backward, c, straggler_factor(job.nodes, model))
    tokens_step = tokens_gpu * job.world
    achieved = tokens_gpu * fpt / step
    return Speed(
        job.grad_accum * (forward + backward),
        comm,
        step,
        tokens_step,
        tokens_step / step,
        tokens_gpu / step,
        achieved / peak,
        achieved / 1e12,
    )

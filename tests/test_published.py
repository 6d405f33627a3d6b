"""The planner against published FSDP numbers (issue 17 item 3).

Sources, read 2026-12-03: the IBM/Meta PyTorch blog "Maximizing training throughput using PyTorch FSDP"
(pytorch/pytorch.github.io `_posts/2024-03-13-maximizing-training.md`, Table 1), fms-fsdp's README (sharding
per model), torchtitan `docs/performance.md` (Llama 2 on 64 A100), and the AWS blog "Scale LLMs with PyTorch
2.0 FSDP on Amazon EKS – Part 2" (87% scaling at 16 p5 nodes).
"""

from __future__ import annotations

import ast
import inspect
import itertools
import math
from dataclasses import replace

import pytest

from fsdpctl.plan import planner as P
from fsdpctl.plan import published as PUB
from fsdpctl.plan import steptime

TOLERANCE = 0.10


@pytest.mark.parametrize("point", PUB.POINTS, ids=lambda p: p.key)
def test_every_published_row_is_predicted_within_ten_percent(point):
    pred = PUB.predict(point)
    assert math.isfinite(pred.predicted) and pred.predicted > 0
    if point.known_miss:  # listed, with its reason, in BENCHMARKS.md and here
        assert abs(pred.error) > TOLERANCE, f"{point.key} is no longer a miss: drop known_miss"
        return
    assert abs(pred.error) <= TOLERANCE, (
        f"{point.key}: {pred.predicted:.3g} vs {point.published:.3g}"
    )


def test_the_known_misses_are_few_and_explained():
    misses = [p for p in PUB.POINTS if p.known_miss]
    assert len(misses) <= 1 and all(len(p.known_miss) > 40 for p in misses)


def test_every_row_names_its_source_and_configuration():
    assert len({p.key for p in PUB.POINTS}) == len(PUB.POINTS)
    for p in PUB.POINTS:
        assert "github.com" in p.source or p.source.startswith("https://")
        assert p.model in P.MODEL_CONFIGS and p.cluster in PUB.CLUSTERS and p.nodes >= 1
        assert p.metric in ("tokens_per_s_per_gpu", "scaling") and p.published > 0
    assert any(p.metric == "scaling" and p.nodes == 16 and p.published == 0.87 for p in PUB.POINTS)


def test_one_global_parameter_set_and_no_row_specific_branches():
    """`predict` reads only the row's configuration and the one SpeedModel; nothing in it or in the
    speed model branches on a row's key or source."""
    assert inspect.signature(PUB.predict).parameters["model"].default is steptime.SPEED_MODEL
    for fn in (
        PUB.predict,
        steptime.speed,
        steptime.compute_efficiency,
        steptime.recomputed_share,
        steptime.straggler_factor,
    ):
        names = {
            n.attr
            for n in ast.walk(ast.parse(inspect.getsource(fn)))
            if isinstance(n, ast.Attribute)
        }
        assert not names & {"key", "source", "note", "published", "known_miss"}, fn.__name__
    # relabelling a row changes nothing
    for p in PUB.POINTS:
        same = replace(p, key="x", source="y", note="", published=1.0)
        assert PUB.predict(same).predicted == PUB.predict(p).predicted


def test_every_parameter_matters_to_some_row():
    """No dead parameter: nudging each global moves at least one prediction."""
    base = [x.predicted for x in PUB.predictions()]
    m = steptime.SPEED_MODEL
    nudged = [
        replace(m, matmul_efficiency={k: v * 1.1 for k, v in m.matmul_efficiency.items()}),
        replace(m, membound_k=m.membound_k * 1.1),
        replace(m, link_efficiency=m.link_efficiency * 0.5),
        replace(m, straggler_sigma=m.straggler_sigma * 1.1),
        replace(m, selective_share=m.selective_share * 1.1),
    ]
    for model in nudged:
        assert [x.predicted for x in PUB.predictions(model)] != base


@pytest.mark.parametrize("nodes", [1, 2, 4, 8, 16, 64])
def test_scaling_falls_with_nodes_and_is_one_on_one_node(nodes):
    """The straggler term: 1 on one node, growing like sqrt(2 ln n) (slowest of n)."""
    assert steptime.straggler_factor(1) == 1.0
    assert steptime.straggler_factor(nodes) <= steptime.straggler_factor(nodes * 2)
    assert steptime.straggler_factor(nodes) == pytest.approx(
        1 + steptime.SPEED_MODEL.straggler_sigma * math.sqrt(2 * math.log(nodes))
    )


@pytest.mark.parametrize("model", ["7b", "13b", "70b"])
@pytest.mark.parametrize("gpu", ["A100", "H100", "H200"])
def test_compute_efficiency_is_below_the_matmul_ceiling_and_grows_with_width(model, gpu):
    s = P.MODEL_CONFIGS[model]
    eff = steptime.compute_efficiency(gpu, "bf16", s.hidden)
    assert 0.2 < eff < steptime.SPEED_MODEL.matmul_efficiency[gpu]
    assert steptime.compute_efficiency(gpu, "bf16", s.hidden * 2) > eff


@pytest.mark.parametrize("model", ["7b", "13b", "70b"])
def test_recompute_orders_the_checkpointing_modes(model):
    job = P.Job(model, "p5.48xlarge", 2, 8, "FULL_SHARD", "bf16", "none", 2, 1, 4096)
    tps = {
        ac: steptime.speed(replace(job, ac=ac)).tokens_per_s_per_gpu
        for ac in ("none", "selective", "full")
    }
    assert tps["none"] > tps["selective"] > tps["full"]
    mem = {ac: P.memory(replace(job, ac=ac)).activations for ac in ("none", "selective", "full")}
    assert mem["none"] > mem["selective"] > mem["full"]


def test_benchmarks_md_shows_the_current_predictions():
    """BENCHMARKS.md's section is benchmarks/published.py's output for the model as it is now."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "benchmarks" / "published.py"
    spec = importlib.util.spec_from_file_location("published_bench", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    text = mod.BENCHMARKS.read_text()
    assert mod.render(text) == text, "run: python benchmarks/published.py"
    for p in PUB.POINTS:
        assert f"| {p.key} |" in text


# --- the speed model's form: per-phase overlap, straggler on compute, the job's reduce dtype --------------

STRATEGIES = ("FULL_SHARD", "SHARD_GRAD_OP", "HYBRID_SHARD", "NO_SHARD")


def _jobs(acs=("none", "selective", "full"), strategies=STRATEGIES):
    """A grid of jobs across the planner's axes (models, instance types, nodes, sharding,
    checkpointing, micro-batch, accumulation, reduce dtype)."""
    axes = (
        ("7b", "13b", "70b"),
        ("p4de.24xlarge", "p5.48xlarge"),
        (1, 2, 8),
        strategies,
        acs,
        (1, 2),
    )
    for model, inst, nodes, strategy, ac, mb in itertools.product(*axes):
        for accum, reduce_dtype in itertools.product((1, 3), ("fp32", "bf16")):
            job = P.Job(model, inst, nodes, 8, strategy, "bf16", ac, 2, mb, 4096, grad_accum=accum)
            yield replace(job, reduce_dtype=reduce_dtype)


def _comm_split(job: P.Job) -> tuple[float, float]:
    """(one micro-batch's gathers, the step's reduction) from the model's own totals: the gathers
    repeat per micro-batch, the reduction happens once a step."""
    one = steptime.speed(replace(job, grad_accum=1)).comm_s
    gathers = steptime.speed(replace(job, grad_accum=2)).comm_s - one
    return gathers, one - gathers


def test_a_step_is_between_its_longer_half_and_both_halves_in_a_row():
    """Overlap cannot make a step faster than its compute (slowed by stragglers) or its
    communication alone, nor slower than the two one after the other."""
    for job in _jobs():
        spd = steptime.speed(job)
        lag = steptime.straggler_factor(job.nodes)
        slack = 1e-9 * spd.step_s
        assert spd.step_s >= max(lag * spd.compute_s, spd.comm_s) - slack, job
        assert spd.step_s <= lag * spd.compute_s + spd.comm_s + slack, job


def test_forward_gathers_are_hidden_only_by_the_forward_and_the_reduction_only_by_the_backward():
    """IBM/Meta, "Maximizing training throughput using PyTorch FSDP"
    (pytorch.org/blog/maximizing-training, appendix "Communication computation overlap"): the
    all-gathers of the forward overlap the forward's compute, the backward's all-gathers and the
    gradient reduce-scatter overlap the backward's; the backward's slack cannot hide a forward's
    gathers, nor the forward's slack the reduction. Without checkpointing the forward is a third of
    the compute. One global max(compute, comm) fails these bounds."""
    for job in _jobs(acs=("none",), strategies=("FULL_SHARD", "SHARD_GRAD_OP")):
        spd = steptime.speed(job)
        lag = steptime.straggler_factor(job.nodes)
        gathers, reduce = _comm_split(job)
        per_gather = gathers / (2 if job.strategy == "FULL_SHARD" else 1)
        back_gathers = gathers - per_gather
        forward, backward = spd.compute_s / 3, spd.compute_s * 2 / 3
        slack = 1e-9 * spd.step_s
        assert spd.step_s >= job.grad_accum * per_gather + lag * backward - slack, job
        assert spd.step_s >= lag * forward + job.grad_accum * back_gathers + reduce - slack, job


def test_a_step_bound_by_the_network_in_both_phases_is_not_slowed_by_stragglers():
    """The straggler factor models per-node compute jitter (AWS's 87% at 16 p5 nodes, with
    communication hidden): while the network is the bottleneck a slow node's extra compute is
    absorbed, so raising sigma adds at most the factor's growth times the compute, and nothing when
    every phase is network-bound (torchtitan's 70B at batch 1 on 400 Gbps, docs/performance.md at
    395a526)."""
    sigmas = (
        steptime.SPEED_MODEL,
        replace(steptime.SPEED_MODEL, straggler_sigma=2 * steptime.SPEED_MODEL.straggler_sigma),
    )
    for job in _jobs(acs=("none", "full")):
        lo, hi = (steptime.speed(job, m) for m in sigmas)
        grow = steptime.straggler_factor(job.nodes, sigmas[1]) - steptime.straggler_factor(
            job.nodes, sigmas[0]
        )
        assert -1e-12 <= hi.step_s - lo.step_s <= grow * lo.compute_s * (1 + 1e-9), job
    point = next(p for p in PUB.POINTS if p.key == "titan-70b-sel-op-mb1")
    inst = PUB.CLUSTERS[point.cluster].inst
    lo, hi = (steptime.speed(point.job(), m, inst) for m in sigmas)
    assert lo.step_s == pytest.approx(lo.comm_s) and hi.step_s == pytest.approx(lo.step_s)


def test_a_bf16_reduction_takes_half_the_time_of_an_fp32_one_and_leaves_the_gathers_alone():
    """FSDP2 reduce-scatters (and HSDP all-reduces) gradients in MixedPrecisionPolicy.reduce_dtype
    (torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py, foreach_reduce: the reduce-scatter
    input is allocated in reduce_dtype); FSDP1's MixedPrecision.reduce_dtype likewise (fms-fsdp's
    bfSixteen: bf16)."""
    for job in _jobs(acs=("full",)):
        if job.reduce_dtype != "fp32":
            continue
        g32, r32 = _comm_split(job)
        g16, r16 = _comm_split(replace(job, reduce_dtype="bf16"))
        assert g16 == pytest.approx(g32, abs=1e-12)
        assert r16 == pytest.approx(r32 / 2, abs=1e-12)
        assert (r32 > 0) == (job.world > 1), job


def test_the_planners_reduce_dtype_is_fsdptrains_and_each_row_takes_its_sources():
    """`fsdpctl plan` plans fsdptrain's jobs: its default reduce dtype is the trainer's
    MixedPrecisionPolicy's (trainer/fsdptrain/parallel.py). The rows: fms-fsdp's default
    mixed_precision=True picks bfSixteen (reduce_dtype=torch.bfloat16,
    fms_fsdp/policies/mixed_precision.py at 5e522b4, the blog's day); torchtitan's
    parallelize_llama.py at 395a526 (the commit that added docs/performance.md) builds
    MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)."""
    import re
    from pathlib import Path

    src = (
        Path(__file__).resolve().parent.parent / "trainer" / "fsdptrain" / "parallel.py"
    ).read_text()
    (trainer_dtype,) = set(re.findall(r"reduce_dtype=torch\.(\w+)", src))
    assert {"float32": "fp32", "bfloat16": "bf16"}[trainer_dtype] == P.Job.reduce_dtype
    assert {p.reduce_dtype for p in PUB.POINTS if p.source.startswith(PUB.IBM_BLOG)} == {"bf16"}
    assert {p.reduce_dtype for p in PUB.POINTS if p.source == PUB.TITAN} == {"fp32"}
    assert {p.job().reduce_dtype for p in PUB.POINTS} == {p.reduce_dtype for p in PUB.POINTS}

"""The planner against published FSDP numbers (issue 17 item 3).

Sources, read 2026-12-03: the IBM/Meta PyTorch blog "Maximizing training throughput using PyTorch FSDP"
(pytorch/pytorch.github.io `_posts/2024-03-13-maximizing-training.md`, Table 1), fms-fsdp's README (sharding
per model), torchtitan `docs/performance.md` (Llama 2 on 64 A100), and the AWS blog "Scale LLMs with PyTorch
2.0 FSDP on Amazon EKS – Part 2" (87% scaling at 16 p5 nodes).
"""

from __future__ import annotations

import ast
import inspect
import math
from dataclasses import replace

import pytest

from fsdpctl import plan as P
from fsdpctl import published as PUB

TOLERANCE = 0.10


@pytest.mark.parametrize("point", PUB.POINTS, ids=lambda p: p.key)
def test_every_published_row_is_predicted_within_ten_percent(point):
    pred = PUB.predict(point)
    assert math.isfinite(pred.predicted) and pred.predicted > 0
    if point.known_miss:  # listed, with its reason, in BENCHMARKS.md and here
        assert abs(pred.error) > TOLERANCE, f"{point.key} is no longer a miss: drop known_miss"
        return
    assert abs(pred.error) <= TOLERANCE, f"{point.key}: {pred.predicted:.3g} vs {point.published:.3g}"


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
    """`predict` reads only the row's configuration and the one SpeedModel; nothing in it or in the speed
    model branches on a row's key or source."""
    assert inspect.signature(PUB.predict).parameters["model"].default is P.SPEED_MODEL
    for fn in (PUB.predict, P.speed, P.compute_efficiency, P.recomputed_share, P.straggler_factor):
        names = {n.attr for n in ast.walk(ast.parse(inspect.getsource(fn))) if isinstance(n, ast.Attribute)}
        assert not names & {"key", "source", "note", "published", "known_miss"}, fn.__name__
    # relabelling a row changes nothing
    for p in PUB.POINTS:
        same = replace(p, key="x", source="y", note="", published=1.0)
        assert PUB.predict(same).predicted == PUB.predict(p).predicted


def test_every_parameter_matters_to_some_row():
    """No dead parameter: nudging each global moves at least one prediction."""
    base = [x.predicted for x in PUB.predictions()]
    m = P.SPEED_MODEL
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
    assert P.straggler_factor(1) == 1.0
    assert P.straggler_factor(nodes) <= P.straggler_factor(nodes * 2)
    assert P.straggler_factor(nodes) == pytest.approx(
        1 + P.SPEED_MODEL.straggler_sigma * math.sqrt(2 * math.log(nodes))
    )


@pytest.mark.parametrize("model", ["7b", "13b", "70b"])
@pytest.mark.parametrize("gpu", ["A100", "H100", "H200"])
def test_compute_efficiency_is_below_the_matmul_ceiling_and_grows_with_width(model, gpu):
    s = P.MODEL_CONFIGS[model]
    eff = P.compute_efficiency(gpu, "bf16", s.hidden)
    assert 0.2 < eff < P.SPEED_MODEL.matmul_efficiency[gpu]
    assert P.compute_efficiency(gpu, "bf16", s.hidden * 2) > eff


@pytest.mark.parametrize("model", ["7b", "13b", "70b"])
def test_recompute_orders_the_checkpointing_modes(model):
    job = P.Job(model, "p5.48xlarge", 2, 8, "FULL_SHARD", "bf16", "none", 2, 1, 4096)
    tps = {ac: P.speed(replace(job, ac=ac)).tokens_per_s_per_gpu for ac in ("none", "selective", "full")}
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

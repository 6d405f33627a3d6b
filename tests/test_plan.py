"""plan: the published facts it must reproduce, and the command (pure model; the CPU calibration
against measured allocations is in test_trainer.py)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from fsdpctl.plan import planner as P
from fsdpctl.plan import steptime, sweep


def job(**kw) -> P.Job:
    base = dict(
        model="7b",
        instance_type="p5.48xlarge",
        nodes=1,
        gpus_per_node=8,
        strategy="FULL_SHARD",
        precision="bf16",
        ac="full",
        ac_every=2,
        micro_batch=1,
        seq_len=4096,
    )
    return P.Job(**{**base, **kw})


def test_70b_does_not_fit_one_node_7b_and_13b_do():
    """REFERENCE: 70B with fp32 master weights + AdamW is ~138 GB per GPU on 8 GPUs."""
    big = P.memory(job(model="70b"))
    assert not big.fits and big.state / 1e9 == pytest.approx(138, rel=0.02)
    assert P.memory(job(model="7b")).fits and P.memory(job(model="13b")).fits
    assert P.memory(job(model="70b", nodes=4)).fits


def test_state_is_divided_by_the_shard_group():
    n = P.MODEL_CONFIGS["7b"].num_params()
    assert P.memory(job(nodes=2)).state == 16 * n // 16
    assert P.memory(job(nodes=2, strategy="HYBRID_SHARD")).state == 16 * n // 8
    assert P.memory(job(nodes=2, strategy="NO_SHARD")).state == 16 * n


def test_the_cheapest_fix_fits():
    name, fixed = P.cheapest_fix(job(model="70b", ac="none", micro_batch=2), tokens=1e9)
    assert P.memory(fixed).fits and name
    tight = job(model="13b", ac="none", micro_batch=8)
    name, fixed = P.cheapest_fix(tight, 1e9)
    fitting = [j for _, j in P.candidate_fixes(tight) if P.memory(j).fits]
    assert len(fitting) > 1 and all(P.cost(fixed, 1e9)[1] <= P.cost(j, 1e9)[1] for j in fitting)


def test_throughput_is_in_the_published_range():
    """PyTorch/IBM FSDP: 7B ~3,700 tok/s/GPU on A100, ~7,500 on H100 (bf16, no compile)."""
    a100 = steptime.speed(
        job(instance_type="p4de.24xlarge", ac="none", micro_batch=2)
    ).tokens_per_s_per_gpu
    h100 = steptime.speed(job(ac="none", micro_batch=2)).tokens_per_s_per_gpu
    assert 2_500 < a100 < 4_500 and 5_000 < h100 < 9_000


def test_plan_command_json_and_table(cli):
    result = cli("plan", "--model", "70b", "--nodes", "1", "--seq-len", "4096", "-o", "json")
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["fits"] is False and data["fix"] and data["usd"] > 0 and data["prices_as_of"]
    text = cli("plan", "--model", "70b", "--nodes", "1").stdout
    assert "DOES NOT FIT" in text and "cheapest change that fits" in text
    rows = json.loads(cli("plan", "--table", "-o", "json").stdout)
    assert len(rows) == 30 and {r["nodes"] for r in rows} == {1, 2, 4, 8, 16}
    assert cli("plan", "--model", "65b").exit_code == 2


def test_job_from_takes_every_number_from_the_settings():
    from fsdpctl.settings import load

    cfg = load(
        dotenv={
            "BACKEND": "eks",
            "MODEL": "13b",
            "INSTANCE_TYPE": "p4de.24xlarge",
            "JOB_NODES": "2",
            "SHARDING_STRATEGY": "HYBRID_SHARD",
            "PRECISION": "fp16",
            "ACTIVATION_CHECKPOINTING": "every-k",
            "AC_EVERY": "3",
            "MICRO_BATCH_SIZE": "2",
            "SEQ_LEN": "2048",
            "GRAD_ACCUM_STEPS": "4",
        }
    )
    assert P.job_from(cfg, mfu=0.3, price=12.5) == P.Job(
        model="13b",
        instance_type="p4de.24xlarge",
        nodes=2,
        gpus_per_node=8,
        strategy="HYBRID_SHARD",
        precision="fp16",
        ac="every-k",
        ac_every=3,
        micro_batch=2,
        seq_len=2048,
        grad_accum=4,
        hsdp_shard_size=cfg.training.hsdp_shard_size,
        mfu=0.3,
        price_per_hour=12.5,
        compiled=True,  # COMPILE=auto compiles on the GPU nodes
    )


@pytest.mark.parametrize("setting", ["auto", "true", "false"])
@pytest.mark.parametrize("instance", ["p4de.24xlarge", "p5.48xlarge", "p5e.48xlarge"])
def test_compiled_layers_speed_up_the_planned_compute_by_the_h200_measurement(setting, instance):
    """COMPILE=auto (and true) plans compiled layers: on H100/H200 the compute efficiency is the
    eager one times the H200's measured step-time ratio (136.9 ms eager / 118.6 ms compiled,
    medians, Llama-2-7B's layer x 8: shared/gpu/2026-12-04/ANALYSIS.md section 0); A100 has no
    compiled measurement and keeps 1.0; COMPILE=false plans eager. The published rows (all eager)
    are untouched: Job.compiled defaults off."""
    from fsdpctl.settings import load

    cfg = load(
        dotenv={"BACKEND": "eks", "MODEL": "7b", "INSTANCE_TYPE": instance, "COMPILE": setting}
    )
    planned = P.job_from(cfg, mfu=0.0, price=None)
    assert planned.compiled is (setting != "false")
    eager = steptime.speed(dataclasses.replace(planned, compiled=False))
    compiled = steptime.speed(dataclasses.replace(planned, compiled=True))
    gain = steptime.COMPILE_GAIN.get(P.INSTANCE_TYPES[instance].gpu, 1.0)
    assert compiled.compute_s == pytest.approx(eager.compute_s / gain)
    assert gain == (1.0 if instance.startswith("p4de") else pytest.approx(1.154, abs=1e-3))
    assert P.Job.__dataclass_fields__["compiled"].default is False


def test_report_is_the_models_numbers_in_gib_hours_and_usd():
    big = job(model="70b", ac="none")
    r = P.report(big, tokens=2e9)
    mem, hours_usd = P.memory(big), P.cost(big, 2e9)
    assert (
        r["memory_gib"]["total"] == mem.total / P.GIB
        and r["memory_gib"]["state"] == mem.state / P.GIB
    )
    assert (
        r["fits"] is False and (r["hours"], r["usd"]) == hours_usd and r["price_per_hour"] == 55.04
    )
    name, fixed = P.cheapest_fix(big, 2e9)
    assert r["fix"] == name and r["fix_memory_gib"] == P.memory(fixed).total / P.GIB
    assert r["fix_memory_gib"] < r["memory_gib"]["capacity"] < r["memory_gib"]["total"]
    small = P.report(job(price_per_hour=None, instance_type="p5e.48xlarge"), tokens=1e9)
    assert (
        small["fits"]
        and small["fix"] is None
        and small["fix_memory_gib"] is None
        and small["usd"] is None
    )


def test_the_sweep_varies_model_instance_and_nodes_only():
    base = job(micro_batch=2, seq_len=2048, precision="fp32")
    rows = sweep.matrix(base, tokens=1e9)
    assert [(r["model"], r["instance_type"], r["nodes"]) for r in rows[:6]] == [
        ("7b", "p4de.24xlarge", n) for n in (1, 2, 4, 8, 16)
    ] + [("7b", "p5.48xlarge", 1)]
    one = dataclasses.replace(base, model="70b", instance_type="p5.48xlarge", nodes=4)
    row = next(
        r for r in rows if (r["model"], r["instance_type"], r["nodes"]) == ("70b", "p5.48xlarge", 4)
    )
    assert row["memory_gib"] == P.memory(one).total / P.GIB and row["usd"] == P.cost(one, 1e9)[1]
    assert all(r["scaling"] == 1.0 for r in rows if r["nodes"] == 1)
    assert all(0 < r["scaling"] <= 1.0 for r in rows)


@pytest.mark.parametrize(
    ("where", "expect"),
    [
        ("env-file", "PRECISION=fp32 (.env line 2)"),
        ("environment", "PRECISION=fp32 (environment FSDPCTL_PRECISION)"),
        ("option", None),
        ("none", None),
    ],
)
def test_plan_names_the_settings_it_did_not_get_from_its_options(cli, monkeypatch, where, expect):
    """The walkthrough's .env sets PRECISION=fp32, and the quickstart's hint `plan --model 7b` then
    says DOES NOT FIT with nothing saying why (issue 44): a plan key set by a .env, the environment
    or --set is named with its source; one this command's option set, or a default, is not."""
    if where == "env-file":
        (cli.cwd / ".env").write_text("JOB_NAME=x\nPRECISION=fp32\n")
    if where == "environment":
        monkeypatch.setenv("FSDPCTL_PRECISION", "fp32")
    extra = ["--precision", "fp32"] if where == "option" else []
    said = cli("plan", "--model", "7b", *extra).stdout
    lines = [x for x in said.splitlines() if x.startswith("from your settings")]
    if expect is None:
        assert lines == []
    else:
        assert lines == [f"from your settings, not this command: {expect}"]

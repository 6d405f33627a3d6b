"""The trainer under real `torchrun` on CPU with gloo (the peer for distributed training here)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess

import pytest

from conftest import ROOT, Run, torchrun, torchrun_argv, train_env

# Each strategy also exercises a different precision / activation-checkpointing combination.
STRATEGY_RUNS = {
    "FULL_SHARD": dict(PRECISION="bf16", ACTIVATION_CHECKPOINTING="full"),
    "SHARD_GRAD_OP": dict(PRECISION="fp32", ACTIVATION_CHECKPOINTING="every-k", AC_EVERY="2"),
    "HYBRID_SHARD": dict(PRECISION="bf16", HSDP_SHARD_SIZE="2", GRAD_ACCUM_STEPS="2"),
    "NO_SHARD": dict(PRECISION="fp16"),
}


@pytest.fixture(scope="module")
def strategy_runs(assets):
    cache: dict[str, Run] = {}

    def get(strategy: str) -> Run:
        if strategy not in cache:
            cache[strategy] = torchrun(
                assets,
                SHARDING_STRATEGY=strategy,
                MAX_STEPS=30,
                PEAK_TFLOPS="0.5",
                **STRATEGY_RUNS[strategy],
            )
        return cache[strategy]

    return get


def _decreased(losses: list[float]) -> bool:
    return sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 - 0.3


@pytest.mark.slow
@pytest.mark.parametrize("strategy", list(STRATEGY_RUNS))
def test_each_strategy_trains_and_loss_decreases(strategy_runs, strategy):
    run = strategy_runs(strategy)
    assert run.rc == 0, run.stderr[-3000:]
    losses = run.losses
    assert len(losses) == 30
    assert _decreased(losses), losses
    s = run.summary
    assert s["tokens_per_s"] > 0 and s["steps"] == 30
    step = run.events("step")[-1]
    assert 0 <= step["data_wait_frac"] < 1
    assert step["mfu"] == pytest.approx(step["tflops_per_device"] / 0.5)  # PEAK_TFLOPS=0.5 given
    assert f"{strategy} mesh" in run.stdout


@pytest.mark.slow
def test_full_shard_holds_half_the_state_of_no_shard(strategy_runs):
    """FSDP2 keeps fp32 sharded params + AdamW moments: with 2 ranks, FULL_SHARD holds ~1/2 of
    NO_SHARD."""
    full, none = strategy_runs("FULL_SHARD").summary, strategy_runs("NO_SHARD").summary
    state = lambda s: s["param_bytes"] + s["optim_bytes"]  # noqa: E731
    assert state(full) / state(none) == pytest.approx(0.5, rel=0.10)


@pytest.mark.slow
def test_hybrid_shard_2x2_on_four_processes(assets):
    run = torchrun(
        assets,
        nproc=4,
        SHARDING_STRATEGY="HYBRID_SHARD",
        HSDP_SHARD_SIZE=2,
        MAX_STEPS=20,
        MICRO_BATCH_SIZE=1,
        timeout=400,
    )
    assert run.rc == 0, run.stderr[-3000:]
    assert "HYBRID_SHARD mesh (2, 2)" in run.stdout
    assert _decreased(run.losses), run.losses


@pytest.mark.slow
def test_resume_reproduces_the_uninterrupted_losses(assets, tmp_path):
    full = torchrun(assets, MAX_STEPS=8, CHECKPOINT_DIR=tmp_path / "a", CHECKPOINT_INTERVAL=4)
    assert full.rc == 0, full.stderr[-3000:]
    # resume in a fresh directory from the step-4 checkpoint of the first run
    (tmp_path / "b").mkdir()
    shutil.copytree(tmp_path / "a" / "step-00000004", tmp_path / "b" / "step-00000004")
    resumed = torchrun(
        assets,
        MAX_STEPS=8,
        CHECKPOINT_DIR=tmp_path / "b",
        CHECKPOINT_INTERVAL=4,
        RESUME=tmp_path / "b" / "step-00000004",
    )
    assert resumed.rc == 0, resumed.stderr[-3000:]
    assert "resumed from" in resumed.stdout
    assert [r["step"] for r in resumed.events("step")] == [5, 6, 7, 8]
    assert resumed.losses == full.losses[4:]  # bit for bit on CPU


@pytest.mark.slow
def test_keep_last_k_and_latest_pointer(assets, tmp_path):
    run = torchrun(
        assets, MAX_STEPS=6, CHECKPOINT_DIR=tmp_path, CHECKPOINT_INTERVAL=2, CHECKPOINT_KEEP=2
    )
    assert run.rc == 0, run.stderr[-3000:]
    assert sorted(p.name for p in tmp_path.glob("step-*")) == ["step-00000004", "step-00000006"]
    assert (tmp_path / "latest").read_text() == "step-00000006"
    assert not list(tmp_path.glob(".tmp-*"))
    # RESUME=auto on a finished run: the latest checkpoint is picked up, and refused: nothing is
    # left to train (fsdptrain.resume), one line, before any step
    again = torchrun(assets, MAX_STEPS=6, CHECKPOINT_DIR=tmp_path)
    assert again.rc != 0 and not again.events("step"), again.stderr[-3000:]
    assert "it is at or past MAX_STEPS=6 (nothing is left to train)" in again.stderr


@pytest.mark.slow
def test_sigterm_saves_a_checkpoint_and_exits_zero(assets, tmp_path):
    """What Kubernetes does on `fsdpctl job stop`: the stop annotation in the pods' downward API
    file (fsdptrain.disruption), then SIGTERM to the workers; they finish the step, checkpoint, exit
    0. (Without the annotation a SIGTERM is an eviction: test_lifecycle.py.) On the way,
    Prometheus's view: rank 0's /metrics (METRICS_PORT) serves the last logged step."""
    from fsdpctl.adapters.etcd import free_port
    from fsdpctl.backends.local.kubelet import write_annotations
    from fsdptrain import disruption

    port = free_port()
    env = train_env(
        assets, MAX_STEPS=10_000, CHECKPOINT_DIR=tmp_path, LOG_INTERVAL=1, METRICS_PORT=port
    )
    (tmp_path / "podinfo").mkdir()
    env[disruption.STOP_FILE_ENV] = str(tmp_path / "podinfo" / "annotations")
    proc = subprocess.Popen(
        torchrun_argv(2),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        seen = 0
        for line in proc.stdout:
            if line.startswith('{"event":"step"'):
                seen += 1
                if seen == 3:
                    break
        scraped = _scrape(f"http://127.0.0.1:{port}/metrics")
        assert scraped["fsdptrain_step"] >= 3 and scraped["fsdptrain_max_steps"] == 10_000
        assert scraped["fsdptrain_loss"] > 0 and scraped["fsdptrain_tokens_per_second"] > 0
        assert (
            "fsdptrain_mfu" not in scraped
        )  # a CPU has no known peak: no MFU rather than a made-up one
        workers = subprocess.run(
            ["pgrep", "-P", str(proc.pid)], capture_output=True, text=True
        ).stdout.split()
        assert len(workers) == 2
        write_annotations(str(tmp_path / "podinfo"), {disruption.STOP_ANNOTATION: "now"})
        for pid in workers:
            os.kill(int(pid), signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0, err[-3000:]
    assert "stop requested (fsdpctl job stop): stopped at step" in out
    run = Run(0, out, err)
    stopped_at = run.summary
    assert stopped_at["stopped"] is True and stopped_at["stop_reason"] == "stop"
    latest = (tmp_path / "latest").read_text()
    assert (tmp_path / latest / "meta.json").is_file()
    assert int(latest.split("-")[1]) >= 3


def _scrape(url: str) -> dict[str, float]:
    """{metric: value} of the trainer's gauges (no labels), parsed by prometheus_client's own parser
    (text_string_to_metric_families), as Prometheus would read the text format 0.0.4."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=10) as r:
        assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = r.read().decode()
    return {
        f.name: f.samples[0].value
        for f in text_string_to_metric_families(text)
        if f.type == "gauge"
    }


@pytest.mark.slow
def test_export_then_fine_tune_from_it(assets, tmp_path):
    export = tmp_path / "hf"
    base = torchrun(assets, MAX_STEPS=15, EXPORT_DIR=export)
    assert base.rc == 0, base.stderr[-3000:]
    assert base.summary["export"] == str(export)
    assert (export / "model.safetensors").is_file() and (export / "config.json").is_file()
    # trained without a KV cache, exported for inference with one (transformers' LlamaConfig
    # default)
    assert json.loads((export / "config.json").read_text())["use_cache"] is True

    import torch
    from transformers import AutoTokenizer, LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(export)  # the real HF loader reads what we wrote
    ids = AutoTokenizer.from_pretrained(export)("Return a new list.", return_tensors="pt")[
        "input_ids"
    ]
    assert torch.isfinite(model(input_ids=ids).logits).all()

    tuned = torchrun(
        assets, PRETRAINED=export, TOKENIZER="", MAX_STEPS=3, WARMUP_STEPS=1, LR="1e-4"
    )
    assert tuned.rc == 0, tuned.stderr[-3000:]
    # the first fine-tune step starts where pre-training ended, far below a fresh model's loss
    assert tuned.losses[0] < base.losses[-1] + 0.3 < base.losses[0] - 0.3


@pytest.mark.parametrize(
    "settings, message",
    [
        (
            {"SHARDING_STRATEGY": "FULLSHARD"},
            "SHARDING_STRATEGY='FULLSHARD' is not allowed: use one of FULL_SHARD",
        ),
        ({"PRECISION": "int8"}, "PRECISION='int8' is not allowed"),
        ({"MICRO_BATCH_SIZE": "two"}, "MICRO_BATCH_SIZE='two' is not valid: give a whole number"),
        ({"SEQ_LEN": "4"}, "SEQ_LEN=4 is too small: use at least 8"),
        ({"MODEL": "65b"}, "MODEL='65b' is unknown"),
        ({"WARMUP_STEPS": "50", "MAX_STEPS": "10"}, "WARMUP_STEPS=50 exceeds MAX_STEPS=10"),
        ({"DATASET": ""}, "DATASET='' is empty"),
        ({"DATASET": "/nonexistent/data.txt"}, "DATASET='/nonexistent/data.txt' does not exist"),
        (
            {"DETERMINISTIC": "maybe"},
            "DETERMINISTIC='maybe' is not allowed: use one of auto, true, false",
        ),
    ],
)
def test_bad_settings_exit_2_with_one_line_naming_the_field(assets, settings, message):
    import subprocess
    import sys

    p = subprocess.run(
        [sys.executable, "-m", "fsdptrain"],
        env=train_env(assets, **settings),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], p.stderr


@pytest.mark.slow
def test_hsdp_group_must_divide_the_world(assets):
    run = torchrun(assets, SHARDING_STRATEGY="HYBRID_SHARD", HSDP_SHARD_SIZE=3, MAX_STEPS=4)
    assert run.rc != 0
    assert "HSDP_SHARD_SIZE=3 does not divide the world size 2" in run.stderr


def test_flags_override_environment(assets):
    from fsdptrain.config import from_sources

    cfg = from_sources(
        ["--max-steps", "7", "--precision", "fp32"],
        train_env(assets, MAX_STEPS=3, PRECISION="bf16"),
    )
    assert (cfg.max_steps, cfg.precision, cfg.model) == (7, "fp32", "tiny")


@pytest.mark.slow
@pytest.mark.parametrize("strategy", list(STRATEGY_RUNS))
def test_plan_memory_estimate_matches_the_measured_allocation(strategy_runs, strategy):
    """`fsdpctl plan`'s per-rank estimate vs what the trainer measured: sharded state + bytes held
    for backward."""
    from fsdpctl.plan.planner import Job, memory

    settings = STRATEGY_RUNS[strategy]
    s = strategy_runs(strategy).summary
    measured = s["param_bytes"] + s["grad_bytes"] + s["optim_bytes"] + s["activation_bytes"]
    job = Job(
        model="tiny",
        instance_type="p5.48xlarge",
        nodes=1,
        gpus_per_node=2,
        strategy=strategy,
        precision=settings["PRECISION"],
        ac=settings.get("ACTIVATION_CHECKPOINTING", "none"),
        ac_every=int(settings.get("AC_EVERY", 2)),
        micro_batch=2,
        seq_len=64,
        grad_accum=int(settings.get("GRAD_ACCUM_STEPS", 1)),
        hsdp_shard_size=int(settings.get("HSDP_SHARD_SIZE", 0)),
    )
    assert memory(job).measured_equivalent == pytest.approx(measured, rel=0.10)

"""Resuming on another world size (issue 43, the trainer's part): the checkpoint loads resharded, every
sequence is trained exactly once across world changes, and the global batch follows one rule
(fsdptrain.elastic: kept by gradient accumulation where the new world divides it, else the per-rank
batch, said).

Upstream: torch 2.13's DCP loads a sharded checkpoint on any world size: `dcp.load` has each rank read
only the chunks its own shards need (torch/distributed/checkpoint/state_dict_loader.py, `load`), and
the load planner "handles resharding by issuing multiple read requests" for chunks saved with another
layout (default_planner.py, `create_default_local_load_plan`; planner_helpers.py,
`create_read_items_for_chunk_list`: "applies the resharding algorithm"); the optimizer state is
flattened to fully qualified names so it reshards the same way (state_dict.py,
`get_optimizer_state_dict`). The fast tests drive the rule and the real Loader in process (pure, no
process group); the slow one is real torchrun on CPU (gloo), the peer for distributed training here:
3 ranks, then 2, then 3 again, on one checkpoint directory, against an uninterrupted run.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import ROOT, Run, torchrun_argv, train_env
from fsdpctl.job import progress
from fsdptrain import elastic, events
from fsdptrain.config import TrainConfig
from fsdptrain.data import Loader
from fsdptrain.resume import math_settings, problem

SETTLE = settings(
    max_examples=60, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck)
)
sizes = st.integers(1, 8)


@given(mb=sizes, ga=sizes, first=st.integers(1, 16), world=st.integers(1, 16))
@SETTLE
def test_the_rule_keeps_the_global_batch_where_it_can_and_the_per_rank_batch_else(
    mb, ga, first, world
):
    """Any batch settings and any two worlds: constant exactly when MICRO_BATCH_SIZE x the new world
    divides the job's global batch, and then every step trains that many sequences; else each rank's
    batch is the one it was set to. The job's global batch is kept either way."""
    target = mb * ga * first
    b = elastic.batch_for(micro_batch=mb, grad_accum=ga, world=world, target=target)
    assert b.target == target and b.world == world
    assert b.global_batch == mb * b.grad_accum * world  # what the loop trains per step
    if target % (mb * world) == 0:
        assert (b.rule, b.global_batch) == (elastic.CONSTANT, target)
    else:
        assert (b.rule, b.grad_accum) == (elastic.PER_RANK, ga)
    if world == first:
        assert b.grad_accum == ga  # the world that set the batch trains as it was set
    fresh = elastic.batch_for(micro_batch=mb, grad_accum=ga, world=world, target=None)
    assert (fresh.rule, fresh.grad_accum, fresh.target) == (elastic.FRESH, ga, mb * ga * world)


class Numbered:
    """Blocks whose every token is the block's own index: a batch says which blocks it holds."""

    def take(self, start: int, count: int) -> np.ndarray:
        return np.repeat(np.arange(start, start + count)[:, None], 3, axis=1)


@given(
    mb=st.integers(1, 3),
    ga=st.integers(1, 3),
    legs=st.lists(st.tuples(st.integers(1, 5), st.integers(1, 4)), min_size=1, max_size=5),
)
@SETTLE
def test_every_block_is_trained_exactly_once_across_any_sequence_of_worlds(mb, ga, legs):
    """Legs of (world, steps), each resuming the one before from its checkpoint's position (the
    loader's `consumed`) under the rule: the blocks the ranks took over all legs are 0..N-1, each
    once, with no gap; each step took exactly its global batch."""
    taken: list[int] = []
    consumed, target = 0, None
    for world, steps in legs:
        b = elastic.batch_for(micro_batch=mb, grad_accum=ga, world=world, target=target)
        target = b.target
        loaders = [Loader(Numbered(), rank=r, world=world, micro_batch=mb, consumed=consumed)
                   for r in range(world)]  # fmt: skip
        for _ in range(steps):
            before = len(taken)
            for _ in range(b.grad_accum):
                for loader in loaders:
                    taken += loader.next_batch()[0][:, 0].tolist()
            assert len(taken) - before == b.global_batch
        assert len({ld.consumed for ld in loaders}) == 1  # one global position, as checkpointed
        consumed = loaders[0].consumed
    assert sorted(taken) == list(range(consumed)) == list(range(len(taken)))


def test_a_checkpoint_keeps_the_jobs_global_batch_and_an_older_one_says_it_through_its_settings():
    saved = {"MICRO_BATCH_SIZE": 2, "GRAD_ACCUM_STEPS": 3}
    assert elastic.saved_target({"batch": {"target": 12}, "settings": saved}) == 12
    assert elastic.saved_target({"world_size": 4, "settings": saved}) == 24  # before this change
    assert elastic.saved_target({"world_size": 4}) is None
    assert elastic.saved_target({"world_size": True, "settings": saved}) is None
    meta = {"batch": {"target": 12}, "settings": saved}
    assert elastic.job_target(meta, micro_batch=2, grad_accum=3) == 12
    # a batch changed on purpose (ALLOW_SETTING_CHANGES) is the job's batch from then on
    assert elastic.job_target(meta, micro_batch=2, grad_accum=4) is None
    assert elastic.job_target(None, micro_batch=2, grad_accum=3) is None


@given(first=st.integers(1, 16), world=st.integers(1, 16))
@SETTLE
def test_the_resume_check_lets_any_world_through_and_still_refuses_other_settings(first, world):
    cfg = TrainConfig(max_steps=100, warmup_steps=5)
    meta = {"step": 20, "settings": math_settings(cfg, first)}
    assert problem(meta, cfg, world, where="ck") is None
    changed = dataclasses.replace(cfg, grad_accum_steps=cfg.grad_accum_steps + 1)
    assert "GRAD_ACCUM_STEPS 1 -> 2" in (problem(meta, changed, world, where="ck") or "")


def test_the_log_line_names_the_rule_and_the_accumulation():
    kept = elastic.batch_for(micro_batch=2, grad_accum=2, world=2, target=12)
    assert elastic.describe(kept, was=3, micro_batch=2, grad_accum=2, step=40) == (
        "world 3 -> 2 ranks at step 40: global batch kept at 12 sequences by gradient "
        "accumulation 3 (GRAD_ACCUM_STEPS=2); the LR schedule is unchanged"
    )
    per_rank = elastic.batch_for(micro_batch=2, grad_accum=1, world=2, target=6)
    assert elastic.describe(per_rank, was=3, micro_batch=2, grad_accum=1, step=40) == (
        "world 3 -> 2 ranks at step 40: per-rank batch kept (MICRO_BATCH_SIZE 2 x "
        "GRAD_ACCUM_STEPS 1): global batch 4 sequences, not the job's 6 (2 x 2 ranks does not "
        "divide it); the LR schedule is unchanged"
    )


WORLD = events.World(
    step=120,
    from_world=24,
    to_world=16,
    from_nodes=3,
    to_nodes=2,
    rule="per-rank",
    grad_accum=1,
    global_batch=32,
    target_global_batch=48,
    checkpoint="/fsx/ckpt/step-00000120",
    time=1_700_000_000.0,
)


def test_the_world_event_round_trips_and_a_damaged_one_is_skipped():
    line = events.to_line(WORLD)
    assert line.startswith('{"event":"world","step":120,"from_world":24,"to_world":16,')
    assert list(events.parse([line])) == [WORLD]
    unknown_from = dataclasses.replace(WORLD, from_nodes=None)
    assert '"from_nodes"' not in events.to_line(unknown_from)
    assert list(events.parse([events.to_line(unknown_from)])) == [unknown_from]
    for field, bad in (("to_world", 0), ("grad_accum", -1), ("global_batch", "32")):
        record = {**json.loads(line), field: bad}
        assert list(events.parse([json.dumps(record)])) == [], field
    # what `job logs` prints for the line
    assert progress.describe(WORLD) == (
        "world: 24 -> 16 processes (3 -> 2 nodes) from the checkpoint at step 120, per-rank batch "
        "kept: global batch 32, not the job's 48"
    )
    kept = dataclasses.replace(WORLD, rule="constant", grad_accum=3, global_batch=48)
    assert progress.describe(kept).endswith("global batch kept at 48 by gradient accumulation 3")


# ---- real torchrun: 3 ranks, then 2, then 3 -----------------------------------------------------------

MAX_STEPS = 6
GLOBAL_BATCH = 12  # MICRO_BATCH_SIZE 2 x GRAD_ACCUM_STEPS 2 x 3 ranks: divisible by 2 x 2 ranks
# the same sequences per step in the same order from the same start (the initial weights are
# seeded per shard, so the reference runs on 3 ranks too); only the float sums' grouping differs
# (ranks, micro-batches): measured here 6.4e-7 at most over these steps
LOSS_TOLERANCE = 1e-4


def _leg(assets, tmp: Path, name: str, world: int, hold: int | None = None, **more) -> Run:
    """One run on `world` ranks writing its data trace to tmp/name; with `hold`, it waits after that
    step until the test has seen the step's event and written the stop request (the pods' downward
    API file, as `job stop` does), so it ends with a checkpoint after step hold+1 whatever the
    machine's speed."""
    from fsdpctl.backends.local.kubelet import write_annotations
    from fsdptrain import disruption

    info = tmp / f"podinfo-{name}"
    info.mkdir()
    (tmp / name).mkdir()
    settings = dict(
        MAX_STEPS=MAX_STEPS,
        GRAD_ACCUM_STEPS=2,
        WARMUP_STEPS=1,
        LOG_INTERVAL=1,
        CHECKPOINT_KEEP=10,
        FSDPTRAIN_TRACE=tmp / name,
        **more,
    )
    if hold is not None:
        settings["FSDPTRAIN_FAILPOINT"] = f"hold-until-file:{hold}:{info / 'annotations'}"
        settings[disruption.STOP_FILE_ENV] = info / "annotations"
    proc = subprocess.Popen(
        torchrun_argv(world),
        env=train_env(assets, **settings),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    lines = []
    try:
        for line in proc.stdout:
            lines.append(line)
            if hold is not None and line.startswith(f'{{"event":"step","step":{hold},'):
                write_annotations(str(info), {disruption.STOP_ANNOTATION: "now"})
                break
        out, err = proc.communicate(timeout=240)
    finally:
        proc.kill()
    run = Run(proc.returncode, "".join(lines) + out, err)
    assert run.rc == 0, err[-3000:]
    return run


def _dcp_model(path: Path, out: Path) -> dict:
    """A checkpoint's model as full tensors, read without a process group (DCP's own converter)."""
    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    dcp_to_torch_save(str(path), str(out))
    return torch.load(out, weights_only=False)["model"]


def _taken(trace: Path) -> list[int]:
    """Every block index a run's ranks trained on (fsdptrain.data.Loader's trace)."""
    found = []
    for f in trace.glob("data-rank*.txt"):
        for line in f.read_text().splitlines():
            first, count = map(int, line.split())
            found += range(first, first + count)
    return found


def _loaded_equals_saved(tmp: Path, leg: str, checkpoint: Path, world: int) -> None:
    import torch

    step = json.loads((checkpoint / "meta.json").read_text())["step"]
    saved = _dcp_model(checkpoint, tmp / f"{leg}-saved.pt")
    loaded = torch.load(tmp / leg / f"loaded-step{step:08d}-world{world}.pt")
    assert saved.keys() == loaded.keys()
    assert all(torch.equal(saved[k], loaded[k]) for k in saved), leg


@pytest.mark.slow
def test_a_job_goes_3_2_3_ranks_losing_no_sample_and_no_step(assets, tmp_path):
    """Real torchrun on CPU. An uninterrupted run on 3 ranks saves at steps 2, 4 and 6 (the
    reference); 2 ranks resume its step-2 checkpoint (resharded: the node lost after step 2) and stop
    after step 4; 3 ranks resume that and finish step 6. The parameters each resume loaded equal the
    checkpoint's; the blocks before step 2's position (from the 3-rank run) and those the 2- and
    3-rank legs trained are 0..6x12-1, each once; both world changes are recorded with the constant
    rule and their accumulation (3, then 2 again); each step's loss is within LOSS_TOLERANCE of the
    uninterrupted run's."""
    reference = _leg(
        assets, tmp_path, "ref", 3, CHECKPOINT_DIR=tmp_path / "a", CHECKPOINT_INTERVAL=2
    )
    start = tmp_path / "a" / "step-00000002"
    two = _leg(assets, tmp_path, "two", 2, hold=3, CHECKPOINT_DIR=tmp_path / "b", RESUME=start)
    three = _leg(assets, tmp_path, "three", 3, CHECKPOINT_DIR=tmp_path / "b")
    legs = (two, three)
    assert [(r.summary["start_step"], r.summary["steps"]) for r in legs] == [(2, 2), (4, 2)]
    assert reference.events("world") == []
    assert [(c["from_world"], c["to_world"], c["step"], c["rule"], c["grad_accum"],
             c["global_batch"]) for r in legs for c in r.events("world")] == [
        (3, 2, 2, "constant", 3, GLOBAL_BATCH), (2, 3, 4, "constant", 2, GLOBAL_BATCH)
    ]  # fmt: skip
    assert "global batch kept at 12 sequences by gradient accumulation 3" in two.stdout
    meta = json.loads((tmp_path / "b" / "step-00000006" / "meta.json").read_text())
    assert [(c["from_world"], c["to_world"]) for c in meta["world_changes"]] == [(3, 2), (2, 3)]
    assert meta["batch"] == {"world": 3, "grad_accum": 2, "global_batch": 12, "target": 12,
                             "rule": "constant"}  # fmt: skip

    _loaded_equals_saved(tmp_path, "two", start, 2)
    _loaded_equals_saved(tmp_path, "three", tmp_path / "b" / "step-00000004", 3)

    total = MAX_STEPS * GLOBAL_BATCH
    assert sorted(_taken(tmp_path / "ref")) == list(range(total))
    position = json.loads((start / "meta.json").read_text())["consumed"]
    assert position == 2 * GLOBAL_BATCH
    before = [b for b in _taken(tmp_path / "ref") if b < position]
    after = _taken(tmp_path / "two") + _taken(tmp_path / "three")
    assert sorted(before + after) == list(range(total))  # no gap, no repeat

    expected = {e["step"]: e["loss"] for e in reference.events("step")}
    got = {e["step"]: e["loss"] for r in legs for e in r.events("step")}
    assert sorted(got) == list(range(3, MAX_STEPS + 1))
    worst = max(abs(got[s] - expected[s]) for s in got)
    assert worst <= LOSS_TOLERANCE, (worst, got, expected)
    print(f"worst loss difference after the world changes: {worst:.2e}")

"""The trainer's per-step work: batches built on a background thread (the same ones, in the same
order, errors raised in the trainer), and at most one host sync per logged step without losing a
metric.

A "host sync" is a read of a tensor's value on the host: `Tensor.item`, `.tolist`, `.cpu`,
`float(t)`, `int(t)`, `bool(t)`; on a GPU each waits for every kernel queued before it (PyTorch's
CUDA semantics, "Asynchronous execution", docs.pytorch.org/docs/stable/notes/cuda.html). CPU tensors
have no queue, so the runs here count the calls themselves.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import threading

import numpy as np
import pytest

from conftest import ROOT, torchrun, train_env
from lazy import lazy

data = lazy("fsdptrain.data")  # imports torch
pytestmark = pytest.mark.xdist_group("torch")


def _loader_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "fsdptrain-loader"]


def _cases(n: int):
    """Generated shapes: blocks, world, rank, micro-batch, resume position, depth; some wrap epochs."""
    rng = random.Random(17)
    for _ in range(n):
        n_blocks, world = rng.randint(3, 30), rng.randint(1, 4)
        yield dict(
            n_blocks=n_blocks,
            seed=rng.randint(0, 99),
            world=world,
            rank=rng.randrange(world),
            micro_batch=rng.randint(1, 4),
            consumed=rng.randrange(0, 3 * n_blocks),
            prefetch=rng.randint(1, 3),
        )


@pytest.mark.parametrize("case", list(_cases(12)), ids=lambda c: "-".join(map(str, c.values())))
def test_background_loader_gives_the_synchronous_batches_and_position(case):
    blocks = data.PackedBlocks(
        np.arange(case["n_blocks"] * 5).reshape(case["n_blocks"], 5), seed=case["seed"]
    )
    common = dict(rank=case["rank"], world=case["world"], micro_batch=case["micro_batch"])
    sync = data.Loader(blocks, consumed=case["consumed"], **common)
    bg = data.Loader(blocks, consumed=case["consumed"], prefetch=case["prefetch"], **common)
    try:
        for _ in range(7):  # more than the queue holds, and across epochs for the small sets
            (a_in, a_lab), (b_in, b_lab) = sync.next_batch(), bg.next_batch()
            assert a_in.tolist() == b_in.tolist() and a_lab.tolist() == b_lab.tolist()
            assert bg.consumed == sync.consumed  # what a checkpoint saves: taken, not prefetched
        # a loader resumed at the background loader's position continues its sequence
        resumed = data.Loader(blocks, consumed=bg.consumed, **common)
        assert resumed.next_batch()[0].tolist() == bg.next_batch()[0].tolist()
    finally:
        bg.close()
    assert not _loader_threads()


class _Failing:
    """Blocks whose read fails at one position, as a broken file or stream would."""

    def __init__(self, blocks, bad_start: int):
        self.blocks, self.bad_start = blocks, bad_start

    def take(self, start: int, count: int):
        if start == self.bad_start:
            raise OSError(f"unreadable block {start}")
        return self.blocks.take(start, count)


@pytest.mark.parametrize("bad_batch", [0, 1, 4])
def test_an_error_in_the_loader_thread_is_raised_by_next_batch_in_order(bad_batch):
    packed = data.PackedBlocks(np.arange(60).reshape(20, 3), seed=1)
    loader = data.Loader(
        _Failing(packed, bad_start=2 * bad_batch), rank=0, world=1, micro_batch=2, prefetch=2
    )
    for i in range(
        bad_batch
    ):  # the batches before the bad one arrive, the same as without a thread
        assert loader.next_batch()[0].tolist() == packed.take(2 * i, 2)[:, :-1].tolist()
    with pytest.raises(OSError, match=f"unreadable block {2 * bad_batch}"):
        loader.next_batch()
    assert loader.consumed == 2 * bad_batch
    assert not _loader_threads()  # the error closed it


def test_close_stops_a_thread_blocked_on_a_full_queue_and_a_new_batch_restarts_it():
    packed = data.PackedBlocks(np.arange(60).reshape(20, 3), seed=2)
    loader = data.Loader(packed, rank=0, world=1, micro_batch=1, prefetch=1)
    first = loader.next_batch()[0].tolist()
    assert len(_loader_threads()) == 1  # and it is waiting to put the next batches
    loader.close()
    assert not _loader_threads()
    assert loader.next_batch()[0].tolist() == packed.take(1, 1)[:, :-1].tolist() != first
    loader.close()
    assert not _loader_threads()


# ---- real runs -------------------------------------------------------------------------------------------

STEP_FIELDS = {
    "step",
    "max_steps",
    "loss",
    "lr",
    "grad_norm",
    "step_time_s",
    "data_wait_frac",
    "time",
    "tokens_per_s",
    "tokens_per_s_per_device",
    "tflops_per_device",
    "mfu",
    "mem_peak_rss_gib",
}


@pytest.mark.slow
def test_log_interval_reads_later_but_logs_the_same_numbers(assets):
    """Two ranks, LOG_INTERVAL 1 and 3: the same losses (summary, every step), the same logged
    steps' loss/lr/grad norm, every field of the step event present and finite, and the loop's
    thread gone."""
    every = torchrun(assets, MAX_STEPS=7, LOG_INTERVAL=1)
    sparse = torchrun(assets, MAX_STEPS=7, LOG_INTERVAL=3)
    assert every.rc == 0 and sparse.rc == 0, sparse.stderr[-2000:]
    assert sparse.summary["losses"] == every.summary["losses"]  # bit for bit, every step
    by_step = {e["step"]: e for e in every.events("step")}
    logged = sparse.events("step")
    assert [e["step"] for e in logged] == [3, 6, 7]  # every LOG_INTERVAL and the last
    for e in logged:
        assert set(e) - {"event"} == STEP_FIELDS
        ref = by_step[e["step"]]
        assert (e["loss"], e["lr"], e["grad_norm"]) == (ref["loss"], ref["lr"], ref["grad_norm"])
        assert e["step_time_s"] > 0 and 0 <= e["data_wait_frac"] < 1 and e["tokens_per_s"] > 0
    assert sparse.summary["tokens_per_s"] > 0


_COUNT_SYNCS = r"""
import collections, json, sys, torch
import fsdptrain.train as T
counts = collections.Counter()
in_loop = [False]
AGREE = T._agree_end.__code__  # renamed? this fails loudly instead of counting the flag as a sync
def counting(name):
    original = getattr(torch.Tensor, name)
    def wrapper(self, *a, **k):
        code = sys._getframe(1).f_code
        if in_loop[0] and code is not AGREE:  # the stop flag: a CPU tensor over a gloo group on GPUs too
            where = code.co_filename.split("site-packages/")[-1].split("fsdptrain/")[-1]
            counts[f"{name} {where}:{code.co_name}"] += 1
        return original(self, *a, **k)
    setattr(torch.Tensor, name, wrapper)
for name in ("item", "tolist", "cpu", "__float__", "__int__", "__bool__", "numpy"):
    counting(name)
loop = T.loop
def counted_loop(t, rt, *rest):
    in_loop[0] = True
    try:
        return loop(t, rt, *rest)
    finally:
        in_loop[0] = False
        print("SYNCS " + json.dumps(dict(counts)), flush=True)
T.loop = counted_loop
from fsdptrain.__main__ import main
sys.exit(main())
"""


@pytest.mark.slow
def test_at_most_one_host_sync_per_logged_step(assets, tmp_path):
    """One process, 9 steps, LOG_INTERVAL 4: the loop reads values back at steps 1 (the first, timed
    on its own), 4, 8 and 9 (the last) only: 4 syncs in all, not one or more per step. Every Tensor
    call that reads a value to the host is counted, whoever makes it (the trainer, FSDP, clipping),
    but AdamW's `_get_value(step)`: its step counters are CPU tensors unless capturable or fused
    (torch/optim/adam.py `_init_group`, optimizer.py `_get_value`), so on a GPU they wait for
    nothing."""
    script = tmp_path / "count_syncs.py"
    script.write_text(_COUNT_SYNCS)
    argv = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=1",
        str(script),
    ]
    env = train_env(assets, MAX_STEPS=9, LOG_INTERVAL=4)
    p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-2000:]
    counts = json.loads(next(li for li in p.stdout.splitlines() if li.startswith("SYNCS "))[6:])
    adam_counters = counts.pop("item torch/optim/optimizer.py:_get_value", 0)
    assert adam_counters > 0  # the counting sees torch's own calls too
    assert counts == {"tolist train.py:_read_steps": 4}
    assert [
        json.loads(li)["step"] for li in p.stdout.splitlines() if li.startswith('{"event":"step"')
    ] == [
        4,
        8,
        9,
    ]

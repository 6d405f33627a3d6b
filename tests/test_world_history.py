"""A job's world changes read back whichever pods' logs are left (issue 43): on EKS an elastic
PyTorchJob is Succeeded as soon as one worker pod is, and `cleanPodPolicy: Running` then deletes the
pods still running with their logs (Training Operator v1.9.4, `UpdateJobStatus` then
`DeletePodsAndServices`), among them the pods whose rank 0 printed the earlier `world` events. The
leader's summary carries the whole history from the checkpoints (fsdptrain.report.summary,
`world_changes`), so `fsdpctl.job.world.changes` finds every change once, in order, from the
leader's log alone or from every log; restarts as users count them are at least the shrinks. Pure:
generated histories, logs split over pods, some pods gone, in any order."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from fsdpctl.job import world
from fsdptrain import events


def _history(worlds: list[int]) -> list[events.World]:
    """A job's world changes: from each world to the next that differs, every few steps, in time."""
    out, step, t = [], 0, 1_000.0
    for was, now in zip(worlds, worlds[1:], strict=False):
        if was == now:
            continue
        step, t = step + 4, t + 60
        out.append(
            events.World(
                step=step, from_world=was, to_world=now, from_nodes=was, to_nodes=now,
                rule="constant", grad_accum=1, global_batch=12, target_global_batch=12,
                checkpoint=f"/ckpt/step-{step:08d}", time=t,
            )
        )  # fmt: skip
    return out


def _summary(carried: list[events.World] | None) -> events.Summary:
    return events.Summary(
        steps=3, start_step=9, final_loss=2.0, first_loss=2.5, losses=[2.5, 2.2, 2.0],
        tokens_per_s=1.0, tokens_per_s_per_device=1.0, mfu=None, param_bytes=1, grad_bytes=1,
        optim_bytes=1, activation_bytes=1, checkpoint=None, export=None, stopped=False,
        world_changes=[events.as_record(w) for w in carried] if carried is not None else None,
    )  # fmt: skip


def _key(c: world.WorldChange) -> tuple:
    return (c["step"], c["from_world"], c["to_world"])


@settings(max_examples=60, deadline=None)
@given(
    worlds=st.lists(st.integers(1, 6), min_size=2, max_size=8),
    printed_by=st.lists(st.integers(0, 3), min_size=8, max_size=8),
    gone=st.sets(st.integers(1, 3)),
    order=st.permutations(range(4)),
)
def test_every_change_once_in_order_from_whatever_logs_are_left(worlds, printed_by, gone, order):
    """Each change printed by one of four pods' rank 0; the leader (pod 0) ends with the summary;
    the pods in `gone` deleted with their logs; the logs read in any order."""
    history = _history(worlds)
    logs: dict[int, list[str]] = {i: [f"pod {i} starts"] for i in range(4)}
    for w, pod in zip(history, printed_by, strict=False):
        logs[pod].append(events.to_line(w))
    logs[0].append(events.to_line(_summary(history)))
    left = [line for i in order if i not in gone for line in logs[i]]
    found = world.changes(left)
    assert [_key(c) for c in found] == [(w.step, w.from_world, w.to_world) for w in history]
    shrinks = sum(w.to_world < w.from_world for w in history)
    assert world.shrank(found) == shrinks and world.grew(found) == len(history) - shrinks


@settings(max_examples=40, deadline=None)
@given(
    worlds=st.lists(st.integers(1, 6), min_size=2, max_size=8),
    printed_by=st.lists(st.sets(st.integers(0, 3), min_size=1), min_size=8, max_size=8),
    gone=st.sets(st.integers(0, 3)),
)
def test_without_the_summary_the_logs_left_say_what_they_hold_once(worlds, printed_by, gone):
    """An older trainer's summary carries no history, or the run has not ended: the changes are
    those the logs left print (one pod's or several pods'), each once, in order."""
    history = _history(worlds)
    lines = [
        events.to_line(w)
        for pod in range(4)
        if pod not in gone
        for w, by in zip(history, printed_by, strict=False)
        if pod in by
    ]
    lines.append(events.to_line(_summary(None)))
    kept = [w for w, by in zip(history, printed_by, strict=False) if by - gone]
    assert [_key(c) for c in world.changes(lines)] == [
        (w.step, w.from_world, w.to_world) for w in kept
    ]


def test_a_damaged_carried_change_is_skipped_and_the_summary_still_read():
    """A summary line anyone may have written into: a carried entry that is not a `world` object of
    its types is skipped (fsdptrain.events.from_record), the rest are read; one that is not a list of
    objects makes the line not a summary, as any field of the wrong type does."""
    [good] = _history([3, 2])
    record = events.as_record(_summary([good]))
    record["world_changes"] = [{"event": "world", "step": "x"}, {}, events.as_record(good)]
    line = json.dumps(record)
    assert [_key(c) for c in world.changes([line])] == [(good.step, 3, 2)]
    assert [e for e in events.parse([line]) if isinstance(e, events.Summary)]
    record["world_changes"] = [1, 2]
    assert list(events.parse([json.dumps(record)])) == []


@settings(max_examples=30, deadline=None)
@given(worlds=st.lists(st.integers(1, 6), min_size=2, max_size=8))
def test_a_finished_line_carries_the_history_when_the_leaders_log_is_gone(worlds):
    """The leader's node died past the last checkpoint: its pod and log are gone, and the recreated
    pod's launcher prints a `finished` line from the checkpoint instead of training
    (fsdptrain.launch.already_finished), with the world changes its meta.json kept."""
    history = _history(worlds)
    done = events.Finished(
        step=40, max_steps=40, loss=2.0, checkpoint="/ckpt/step-00000040", record_id="r",
        world_changes=[events.as_record(w) for w in history] or None,
    )  # fmt: skip
    found = world.changes(["a recreated pod", events.to_line(done)])
    assert [_key(c) for c in found] == [(w.step, w.from_world, w.to_world) for w in history]


def test_eks_reads_a_carried_history_from_every_pods_log_not_only_the_leaders():
    """On EKS a ranged job's status reads the leader's log and, from the other pods, only the lines
    that tell of world changes (backends.eks.observe): a recreated pod's `finished` line carrying the
    history is one of them, the leader's log being gone with its node."""
    from fsdpctl.backends.eks import observe

    history = _history([3, 2, 3])
    done = events.Finished(
        step=40, max_steps=40, loss=2.0, checkpoint="/ckpt/step-00000040", record_id="r",
        world_changes=[events.as_record(w) for w in history],
    )  # fmt: skip
    assert observe._is_world(events.to_line(done))
    assert observe._is_world(events.to_line(history[0]))
    assert not observe._is_world(events.to_line(_summary(None)))

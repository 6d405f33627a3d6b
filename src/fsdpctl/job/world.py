"""A run's world changes (pure): each resume on another node count, from the trainer's `world`
events (fsdptrain.events.World, printed by rank 0 once it resumed on the new world) and the lines
the local supervisor writes when a node is lost or back; as `job status`, `job history`, the run
record and `job diff` name them ("3 → 2 nodes at step 120: node-1 lost")."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TypedDict

from fsdptrain import events

# fsdpctl.backends.local.supervisor._losses writes these into the node's log
NODE_NOTE = re.compile(r"fsdpctl: node (\d+) (lost|is back)")
# Slurm's nodes, named as Slurm names them: srun's own line in the batch log when slurmctld removed
# a failed node from a --no-kill step (Slurm 22.05 src/api/step_launch.c _node_fail_handler:
# error("Node failure on %s")), and the line each surviving trainer task writes when the batch
# host was lost (fsdpctl.backends.slurm.elastic.orphan_guard: one per survivor, said once)
SLURM_NODE_FAIL = re.compile(
    r"srun: error: Node failure on (\S+)|fsdpctl: the batch host (\S+) is lost"
)


class WorldChange(TypedDict):
    """One resume on another world: at the checkpoint of `step` (the first step on the new world is
    the next), from_nodes -> to_nodes (ranks: from_world -> to_world), the batch rule there, and
    what changed it where the backend said (`why`: "node-1 lost", "node-1 back"; "" unknown)."""

    step: int
    from_nodes: int | None
    to_nodes: int
    from_world: int
    to_world: int
    rule: str
    why: str


def changes(lines: Sequence[str]) -> list[WorldChange]:
    """Every world change the run's lines hold, in order, each named by the node notes in the order
    they came: a shrink by the nodes lost, a growth by the nodes back (pairing by order: a note's
    node is the change's, as one node is lost or back at a time)."""
    lost: list[str] = []
    back: list[str] = []
    for line in lines:
        if m := NODE_NOTE.search(line):
            (lost if m.group(2) == "lost" else back).append(f"node-{m.group(1)}")
        elif m := SLURM_NODE_FAIL.search(line):
            lost += [n for n in (m.group(1) or m.group(2)).split(",") if lost[-1:] != [n]]
    out: list[WorldChange] = []
    for e in _world_events(lines):
        shrank = e.to_world < e.from_world
        names = lost if shrank else back
        why = f"{names.pop(0)} {'lost' if shrank else 'back'}" if names else ""
        out.append(
            {
                "step": e.step,
                "from_nodes": e.from_nodes,
                "to_nodes": e.to_nodes,
                "from_world": e.from_world,
                "to_world": e.to_world,
                "rule": e.rule,
                "why": why,
            }
        )
    return out


def text(change: WorldChange) -> str:
    """ "3 → 2 nodes at step 120: node-1 lost" (in processes where the node count is not known)."""
    if change["from_nodes"] is not None:
        what = f"{change['from_nodes']} → {change['to_nodes']} nodes"
    else:
        what = f"{change['from_world']} → {change['to_world']} processes"
    why = f": {change['why']}" if change["why"] else ""
    return f"{what} at step {change['step']}{why}"


def shrank(found: Sequence[WorldChange]) -> int:
    """World changes that were shrinks: each a node lost, a failure the group's restart handled, so
    at least that many restarts in the count users keep, whichever pods' logs still tell of them."""
    return sum(c["to_world"] < c["from_world"] for c in found)


def grew(found: Sequence[WorldChange]) -> int:
    """World changes that were growths: a node back is a new rendezvous round, not a failure, so
    no restart in the count users keep."""
    return sum(c["to_world"] > c["from_world"] for c in found)


def _world_events(lines: Sequence[str]) -> list[events.World]:
    """The run's `world` events, each once, in the order they happened: those its logs print and
    those a `summary` or `finished` line carries (the whole history, from the checkpoints: the pods
    that printed the earlier ones can be gone). A change is the same change wherever it is read: its
    step, worlds and time. A run's logs come node by node: the events' own times order them."""
    found: dict[tuple[int, int, int, float], events.World] = {}
    for e in events.parse(lines):
        carried = e.world_changes or [] if isinstance(e, events.Summary | events.Finished) else []
        for w in [e] if isinstance(e, events.World) else map(events.from_record, carried):
            if isinstance(w, events.World):
                found.setdefault((w.step, w.from_world, w.to_world, w.time), w)
    return sorted(found.values(), key=lambda w: w.time)

"""Issue 43 on the local backend: an elastic range (MIN_NODES..JOB_NODES) that trains on through a
lost node, node 0 included, and grows back.

Upstream, torch 2.13 (in the venv): torchrun's `--nnodes=MIN:MAX` closes a rendezvous round once
MIN nodes joined and `last_call_timeout` passed (torch/distributed/elastic/rendezvous/
dynamic_rendezvous.py, _RendezvousJoinOp); a lost node's heartbeat expires after keep_alive_interval
x keep_alive_max_attempt (_should_keep_alive, the sanitizer in _BackendRendezvousStateHolder.sync),
and a worker group failure on the survivors spends one restart (agent/server/api.py, _invoke_run);
a node that joins a running group is waiting (`num_nodes_waiting`), which restarts the group without
spending one ("membership changes do not count as retries"). The c10d backend hosts its store where
`is_host` says (c10d_rendezvous_backend.py, _create_tcp_store): the supervisor hosts it here
(fsdptrain.rdzv_store), so no node's loss takes the rendezvous with it.

Peers: the settings, the planner and the command rewrite are pure (generated inputs, invariants);
the cells run real torchrun on CPU (gloo) under the local backend's supervisor, one network
namespace per node when root (else loopback), with `engine.lose`/`bring_back` playing the node.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from fsdpctl.backends.local import engine as local
from fsdpctl.backends.local.backend import LocalBackend
from fsdpctl.backends.local.pods import elastic, elastic_command
from fsdpctl.backends.local.report import job_report
from fsdpctl.errors import SettingsError
from fsdpctl.job import policy as jobpolicy
from fsdpctl.job import record, record_view, world
from fsdpctl.plan import fit
from fsdpctl.plan import planner as P
from fsdpctl.settings import load
from fsdpctl.settings.checks import elastic_refusal
from fsdptrain import events

CLUSTER = {"BACKEND": "eks", "AWS_ACCOUNT_ID": "123456789012", "NODE_COUNT": "16"}


# ---- the setting ----------------------------------------------------------------------------------


@settings(max_examples=40, derandomize=True, deadline=None)
@given(nodes=st.integers(1, 16), low=st.integers(0, 20))
def test_min_nodes_is_a_range_below_job_nodes_or_refused(nodes, low):
    """MIN_NODES 0 means JOB_NODES (no range, today's behaviour); 1..JOB_NODES is the range's bottom;
    above JOB_NODES one line names both keys and the largest value allowed."""
    given_ = {"JOB_NODES": str(nodes), "MIN_NODES": str(low), "SHARED_VOLUME": "x"}
    if low > nodes:
        with pytest.raises(SettingsError) as e:
            load(dotenv=given_)
        assert any(
            f"MIN_NODES={low}" in line and f"at most {nodes}" in line for line in e.value.lines
        )
        return
    cfg = load(dotenv=given_)
    assert cfg.fewest_nodes == (low or nodes)
    assert elastic_refusal(cfg) is None  # local carries it out


def test_min_nodes_off_the_local_backend_is_refused_not_ignored():
    cfg = load(dotenv={**CLUSTER, "JOB_NODES": "4", "MIN_NODES": "3"})
    assert "MIN_NODES=3 with RDZV_BACKEND=c10d on eks" in (elastic_refusal(cfg) or "")
    assert elastic_refusal(load(dotenv={**CLUSTER, "JOB_NODES": "4"})) is None


def test_the_mesh_must_divide_the_world_at_the_minimum_too():
    """HYBRID_SHARD with a shard group of 8 ranks on 8-GPU nodes holds any node count; one of 16
    ranks holds 2 and 4 nodes but not 3: MIN_NODES=3 is refused at the minimum."""
    base = {**CLUSTER, "SHARDING_STRATEGY": "HYBRID_SHARD", "HSDP_SHARD_SIZE": "16"}
    load(dotenv={**base, "JOB_NODES": "4", "MIN_NODES": "2"})
    with pytest.raises(SettingsError) as e:
        load(dotenv={**base, "JOB_NODES": "4", "MIN_NODES": "3"})
    assert any(
        line.startswith("MIN_NODES=3") and "at the minimum" in line for line in e.value.lines
    )


@settings(max_examples=12, derandomize=True, deadline=None)
@example(model="70b", nodes=8, low=1)  # 70B on one p5: the line, naming 3
@given(
    model=st.sampled_from(["7b", "13b", "70b"]),
    nodes=st.integers(2, 16),
    low=st.integers(1, 16),
)
def test_a_minimum_that_cannot_hold_the_model_names_the_fewest_nodes_that_can(model, nodes, low):
    """Where the full job fits, the minimum either fits (no line) or the line names the fewest node
    count that does, which fits, one fewer not (the planner's memory per GPU, plan/planner.py)."""
    low = min(low, nodes)
    cfg = load(dotenv={**CLUSTER, "MODEL": model, "JOB_NODES": str(nodes), "MIN_NODES": str(low)})
    if fit.fit_problem(cfg, ram_bytes=0) is not None:
        return
    line = fit.minimum_fit_problem(cfg, ram_bytes=0)
    fits = {
        n: fit.fit_problem(cfg.model_copy(update={"job_nodes": n}), ram_bytes=0) is None
        for n in range(1, nodes + 1)
    }
    if fits[low]:
        assert line is None
        return
    assert line is not None and line.startswith(f"MIN_NODES={low} cannot hold MODEL={model}")
    named = int(line.split("set MIN_NODES=")[1].split()[0])
    assert fits[named] and not fits[named - 1] and low < named <= nodes


def test_plan_at_the_minimum_keeps_the_global_batch_where_the_world_divides_it():
    """The planner applies the trainer's one rule (fsdptrain.elastic): 4 -> 2 nodes of 8 GPUs doubles
    the accumulation (same global batch, same tokens, fewer GPUs: slower, about the same cost); 4 ->
    3 cannot divide it and keeps the per-rank batch."""
    cfg = load(dotenv={**CLUSTER, "MODEL": "7b", "JOB_NODES": "4", "GRAD_ACCUM_STEPS": "2"})
    job = P.job_from(cfg, mfu=0.0, price=None)
    full = P.report(job, 1e9)
    half = P.at_minimum(job, 2, 1e9)
    assert (half["rule"], half["grad_accum"]) == ("constant", 4)
    assert half["tokens_per_s"] < full["speed"]["tokens_per_s"] and half["hours"] > full["hours"]
    assert half["memory_gib"] >= full["memory_gib"]["total"]
    assert P.at_minimum(job, 3, 1e9)["rule"] == "per-rank"


# ---- the command the supervisor runs ----------------------------------------------------------------


@settings(max_examples=30, derandomize=True, deadline=None)
@given(
    nodes=st.integers(1, 12), low=st.integers(0, 12), backend=st.sampled_from(["c10d", "etcd-v2"])
)
def test_the_range_becomes_torchruns_nnodes_and_no_node_hosts_the_store(nodes, low, backend):
    """From the rendered PyTorchJob (elasticPolicy.minReplicas, as the local backend sets it): with
    a range, --nnodes=MIN:MAX, and with c10d is_host=false added to the rdzv-conf (the supervisor
    hosts the store); without one the command is the manifest's own."""
    low = min(low, nodes)
    cfg = load(
        dotenv={
            "JOB_NODES": str(nodes),
            "MIN_NODES": str(low),
            "SHARED_VOLUME": "x",
            "RDZV_BACKEND": backend,
        }
    )
    _, job = LocalBackend(cfg)._rendered("run-1", "rec")
    from fsdpctl.backends.local.pods import spec_from_job

    spec = spec_from_job(job, Path("/nonexistent"))
    argv = elastic_command(spec)
    ranged = (low or nodes) < nodes
    assert elastic(spec) == ranged
    if not ranged:
        assert argv == spec["command"]
        return
    assert f"--nnodes={low}:{nodes}" in argv and f"--nnodes={nodes}" not in argv
    conf = next(a for a in argv if a.startswith("--rdzv-conf="))
    assert conf.endswith(",is_host=false") == (backend == "c10d")
    assert len(argv) == len(spec["command"])


# ---- what the views say ----------------------------------------------------------------------------


def _world(step: int, a: int, b: int, at: float) -> str:
    return events.to_line(
        events.World(
            step=step,
            from_world=a,
            to_world=b,
            from_nodes=a,
            to_nodes=b,
            rule="constant",
            grad_accum=1,
            global_batch=6,
            target_global_batch=6,
            checkpoint="/c",
            time=at,
        )
    )


def test_world_changes_are_named_ordered_and_a_growth_is_no_restart():
    """Lines from node logs read node by node: the events' times order them; each shrink takes a
    lost node's name, each growth a returned one's."""
    lines = [
        _world(38, 2, 3, 20.0),
        "fsdpctl: node 1 is back; its pod starts again",
        "fsdpctl: node 1 lost (every process killed; not recreated)",
        _world(10, 3, 2, 10.0),
    ]
    found = world.changes(lines)
    assert [world.text(c) for c in found] == [
        "3 → 2 nodes at step 10: node-1 lost",
        "2 → 3 nodes at step 38: node-1 back",
    ]
    assert world.grew(found) == 1
    assert world.changes(lines[:1])[0]["why"] == ""  # no note: said as unknown, not guessed


def test_the_record_keeps_world_changes_and_diff_knows_two_runs_differ_in_world():
    """`learnt` keeps the world changes with the losses once the run ended (its summary): the
    record still checks (`problem`), history shows them, and diff names the difference."""
    code = {"fsdpctl": "0.1.0", "fsdptrain": "0.1.0", "commit": "a" * 40, "dirty": False}
    base = record.build(
        load(dotenv={"SHARED_VOLUME": "x"}),
        run_id="fsdp-1-a",
        code={**code, "diff_sha256": None},
        image=None,
        created=1.0,
        secret_name="s",
    )
    fp = {"source": "builtin", "local": False}
    start = events.to_line(
        events.Start(
            record_id=base["id"], python="3.11", torch="2.13.0", transformers="4", cuda=None,
            nccl=None, device="cpu", start_step=0, dataset=fp, tokenizer=fp, time=1.0,
        )
    )  # fmt: skip
    summary = json.dumps(
        {"event": "summary", "steps": 2, "start_step": 0, "final_loss": 1.0, "first_loss": 2.0,
         "losses": [2.0, 1.0], "tokens_per_s": 1, "tokens_per_s_per_device": 1, "mfu": None,
         "param_bytes": 0, "grad_bytes": 0, "optim_bytes": 0, "activation_bytes": 0,
         "checkpoint": None, "export": None, "stopped": False}
    )  # fmt: skip
    lost = ["fsdpctl: node 2 lost", _world(1, 3, 2, 10.0)]
    a = record.learnt(base, [start, *lost, summary])
    b = record.learnt(base, [start, summary])
    assert a.get("worlds") and b.get("worlds") == []
    assert record.problem(a) is None and record.problem(b) is None
    assert record_view.history_rows([a], {})[0]["world"] == "3 → 2 nodes at step 1: node-2 lost"
    assert record_view.history_rows([base], {})[0]["world"] == "unknown"
    assert record_view.diff(a, b)["world"] == {
        "changes": ["3 → 2 nodes at step 1: node-2 lost", "-"]
    }
    assert record_view.diff(a, a)["world"] == {}
    assert record_view.diff(base, a)["world"] == {}  # one end unknown: no difference claimed


# ---- real torchrun under the supervisor ------------------------------------------------------------

INTERVAL = 5  # CHECKPOINT_INTERVAL: the most steps a lost node may cost
STEPS = 30
LOSE_AT = 12
GLOBAL_BATCH = 12  # sequences (blocks) per step: MICRO_BATCH_SIZE 2 x GRAD_ACCUM_STEPS 2 x 3 ranks


def _start(tmp: Path, monkeypatch, home: Path | None = None) -> None:
    monkeypatch.setenv("FSDPCTL_HOME", str(home or tmp / "home"))
    monkeypatch.setenv("FSDPTRAIN_TRACE", str(tmp / "trace"))
    (tmp / "trace").mkdir(parents=True)
    cfg = load(
        dotenv={
            "SEQ_LEN": "64",
            "PRECISION": "fp32",
            "WARMUP_STEPS": "2",
            "JOB_NAME": "t",
            "JOB_NODES": "3",
            "MIN_NODES": "2",
            "MAX_STEPS": str(STEPS),
            "CHECKPOINT_INTERVAL": str(INTERVAL),
            "CHECKPOINT_KEEP": "20",
            "MAX_RESTARTS": "2",
            "MICRO_BATCH_SIZE": "2",
            "GRAD_ACCUM_STEPS": "2",  # 2 x 2 x 3 ranks: 2 nodes keep it with accumulation 3
            "LOG_INTERVAL": "1",
        }
    )
    infra, job = LocalBackend(cfg)._rendered(jobpolicy.new_run_id("t"), "rec")
    local.start(job, secret_env={}, prestep=next((o for o in infra if o["kind"] == "Job"), None))


def _wait_step(step: int, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while job_report(local.read_state(local.job_dir("t")), float("inf"))["step"] < step:
        assert time.monotonic() < deadline, local.read_state(local.job_dir("t"))
        time.sleep(0.5)


def _steps_lost(lines: list[str], change: world.WorldChange) -> int:
    """Steps trained before the change that the new world trains again: the highest step logged
    before the resume's world event, past the checkpoint it resumed."""
    evs = list(events.parse(lines))
    at = next(e.time for e in evs if isinstance(e, events.World) and e.step == change["step"])
    before = [e.step for e in evs if isinstance(e, events.Step) and e.time < at]
    return max(before, default=change["step"]) - change["step"]


def _taken(trace: Path) -> list[int]:
    found: list[int] = []
    for f in trace.glob("data-rank*.txt"):
        for line in f.read_text().splitlines():
            first, count = map(int, line.split())
            found += range(first, first + count)
    return found


@pytest.mark.slow
@pytest.mark.extended
@pytest.mark.parametrize(
    "victim, back", [(1, False), (0, False), (1, True)], ids=["other node", "node 0", "returning"]
)
def test_a_lost_node_costs_at_most_a_checkpoint_interval(tmp_path, monkeypatch, victim, back):
    """3 nodes, MIN_NODES=2, a checkpoint every 5 steps; a node lost at step 12 (every process
    SIGKILLed, no pod made again): the other two train on from the last checkpoint, node 0's loss
    the same as any other's (the store is the supervisor's). Returning: the node is back once 2
    nodes trained 5 steps and the job grows back to 3 (the agents see a node waiting and restart
    their group; the trainers save on that SIGTERM). Each: Succeeded at the last step; each
    shrink costs at most CHECKPOINT_INTERVAL steps; every block of the data trained at least once,
    and again only for the steps lost; one restart (the loss), the growth none; `job status` and
    the record name each world change."""
    _start(tmp_path, monkeypatch)
    _wait_step(LOSE_AT)
    local.lose("t", victim)
    if back:
        _wait_step(LOSE_AT + INTERVAL + 2)
        local.bring_back("t", victim)
    state = local.wait("t", timeout=600)
    report = job_report(state, float("inf"))
    assert report["phase"] == "Succeeded" and report["step"] == STEPS, report
    lines = LocalBackend(load(dotenv={"JOB_NAME": "t"})).run_lines("t", state["run_id"]) or []
    changes = world.changes(lines)
    expected = [f"3 → 2 nodes at step {changes[0]['step']}: node-{victim} lost"]
    if back:
        expected.append(f"2 → 3 nodes at step {changes[1]['step']}: node-{victim} back")
    assert report["world_changes"] == expected, report
    assert report["restarts"] == 1, report
    shrink = changes[0]
    assert 0 <= _steps_lost(lines, shrink) <= INTERVAL
    assert (shrink["rule"], shrink["to_world"]) == ("constant", 2)
    taken, total = _taken(tmp_path / "trace"), STEPS * GLOBAL_BATCH
    assert set(taken) == set(range(total))  # no sample skipped
    lost = sum(_steps_lost(lines, c) for c in changes)
    # taken again: the lost steps' blocks, and at most the step in flight when the node went
    assert lost * GLOBAL_BATCH <= len(taken) - total <= (lost + len(changes)) * GLOBAL_BATCH


def _wait_restart(timeout: float = 300) -> dict:
    """The survivors' agents saw the loss (their group failed and restarts: the report's count),
    before any step on the new world."""
    deadline = time.monotonic() + timeout
    while (report := job_report(local.read_state(local.job_dir("t")), float("inf")))[
        "restarts"
    ] < 1:
        assert time.monotonic() < deadline, report
        time.sleep(0.2)
    return report


@pytest.mark.slow
@pytest.mark.extended
def test_a_stop_during_the_re_rendezvous_ends_stopped_and_the_resume_loses_no_sample(
    tmp_path, monkeypatch
):
    """A node lost at step 12, and `stop` while the survivors' agents are between worlds (their
    group failed, no trainer runs: nothing can save a stop checkpoint). Stopped, not Failed; the
    last periodic checkpoint is where a resume starts (at most CHECKPOINT_INTERVAL steps lost);
    nothing of the job runs after it. The resume (a new run of the job, all 3 nodes) trains to the
    last step, and across both runs every block of the data is trained, again only for the lost
    steps and the one in flight."""
    _start(tmp_path, monkeypatch)
    _wait_step(LOSE_AT)
    local.lose("t", 1)
    report = _wait_restart()
    assert report["phase"] == "Running" and report["world_changes"] == [], report
    local.stop("t")
    state = local.wait("t", timeout=600)
    stopped = job_report(state, float("inf"))
    assert stopped["phase"] == "Stopped", stopped
    saved = int(Path(stopped["checkpoint"]).name.rpartition("-")[2])
    assert LOSE_AT - INTERVAL <= saved <= LOSE_AT, stopped
    _start(tmp_path / "again", monkeypatch, home=tmp_path / "home")
    state = local.wait("t", timeout=600)
    done = job_report(state, float("inf"))
    assert done["phase"] == "Succeeded" and done["step"] == STEPS, done
    taken, total = (
        _taken(tmp_path / "trace") + _taken(tmp_path / "again" / "trace"),
        STEPS * GLOBAL_BATCH,
    )
    assert set(taken) == set(range(total))
    again = stopped["step"] - saved  # trained before the stop and again by the resume
    assert again * GLOBAL_BATCH <= len(taken) - total <= (again + 1) * GLOBAL_BATCH


@pytest.mark.slow
@pytest.mark.extended
def test_a_drained_node_costs_no_more_than_a_checkpoint_interval(tmp_path, monkeypatch):
    """A drain of node 1 at step 12 (the eviction API's path on the local backend: SIGTERM, the
    pod's grace, SIGKILL; its pod made again, as the Training Operator makes an evicted worker's):
    with the range the job never waits for JOB_NODES: it trains on, on 2 or on the 3 again, to the
    last step, Succeeded. Every world change names node-1; the steps trained again are at most
    CHECKPOINT_INTERVAL per change; every block is trained, again only for the lost steps."""
    _start(tmp_path, monkeypatch)
    _wait_step(LOSE_AT)
    local.evict("t", 1)
    state = local.wait("t", timeout=600)
    report = job_report(state, float("inf"))
    assert report["phase"] == "Succeeded" and report["step"] == STEPS, report
    assert all("node-1" in c for c in report["world_changes"]), report
    assert report["restarts"] <= 1, report
    lines = LocalBackend(load(dotenv={"JOB_NAME": "t"})).run_lines("t", state["run_id"]) or []
    changes = world.changes(lines)
    assert all(0 <= _steps_lost(lines, c) <= INTERVAL for c in changes if c["to_nodes"] < 3)
    taken, total = _taken(tmp_path / "trace"), STEPS * GLOBAL_BATCH
    assert set(taken) == set(range(total))
    assert len(taken) - total <= (INTERVAL + 1) * GLOBAL_BATCH


def test_a_run_stopped_between_worlds_keeps_its_end_and_its_worlds_in_history():
    """A run stopped while its survivors were between worlds (test_a_stop_during_the_re_rendezvous
    ...) logged no summary: its logs alone read "ended without a summary". What its place said
    when the next run replaced it (runner._learn_before_it_goes: "Stopped at step 12") is what
    history shows, and its world changes are taken from its whole log."""
    base = {"id": "r1", "run_id": "t-1-a", "created": 1.0, "settings": {}}
    lost = ["fsdpctl: node 1 lost", _world(1, 3, 2, 10.0)]
    ended = record.at_its_end(base, "Stopped at step 12", lost)
    assert ended["worlds"] == world.changes(lost) and ended["worlds"]
    logs_say = {"t-1-a": "ended without a summary at step 12 (failed or killed)"}
    [row] = record_view.history_rows([ended], logs_say)
    assert row["outcome"] == "Stopped at step 12"
    assert row["world"] == "3 → 2 nodes at step 1: node-1 lost"
    assert record_view.history_rows([base], logs_say)[0]["outcome"] == logs_say["t-1-a"]
    kept = record.at_its_end({**base, "worlds": []}, "Failed at step 3", lost)
    assert kept["worlds"] == []  # learnt from its summary already: kept
    assert record.at_its_end(base, "Stopped at step 12", None).get("worlds") is None

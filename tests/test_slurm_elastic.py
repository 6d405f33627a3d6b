"""Issue 43 on Slurm: the elastic range (MIN_NODES..JOB_NODES) on the real Slurm peer
(tests/slurm_peer.py: Debian's slurm-wlm 22.05.8, one slurmd per simulated node in its own network
and UTS namespace, munge), the real trainer on CPU with gloo, driven through the fsdpctl CLI.

What Slurm 22.05 does, from its own source (SchedMD/slurm tag slurm-22-05-8-1) and man pages:
- sbatch/srun `--no-kill`: a failed node of a running job is removed from it instead of ending it
  (src/slurmctld/job_mgr.c kill_running_job_by_node_name: `kill_on_node_fail == 0` ->
  "Removing failed node .. from JobId", excise_node_from_job); srun's step marks the node's tasks
  ended and goes on (src/api/step_launch.c _node_fail_handler, "Node failure on NODE").
- `--nodes=MIN-MAX`: "as many nodes as possible within the range specified and without delaying
  the initiation of the job" (sbatch(1)): a requeued run starts on the nodes that are up.
- A running job gets no nodes added in 22.05 (see docs/slurm.md "Elastic range"): growing back is
  the next run or requeue.
The script's rendezvous store (fsdptrain.rdzv_store) runs in the batch shell on the batch host,
outside the trainers' step (script.store_lines).
"""

from __future__ import annotations

import os
import shlex
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import slurm_peer
import test_slurm_paths as paths
import test_slurm_script as script_tests
from conftest import fsdpctl_process as fsdpctl
from conftest import scaled
from fsdpctl.job import world
from fsdptrain import events
from test_elastic_local import _steps_lost, _taken  # one way to count, on every backend

STEPS = 24
INTERVAL = 4  # CHECKPOINT_INTERVAL: the most steps a lost node may cost
GLOBAL_BATCH = 12  # blocks per step: MICRO_BATCH_SIZE 2 x GRAD_ACCUM_STEPS 2 x 3 ranks (2 ranks: 3)


# ---- the script, the guard and the views (fast: real bash with recording srun/scontrol) ----------

SCONTROL = f"""#!{sys.executable}
# a recording scontrol: `show job` says NumNodes=2 and, from JOB_RECORDS (one record per call,
# the last one kept), BatchHost and NodeList; `show hostnames` expands p[a-b]
import os, re, sys
args = sys.argv[1:]
calls = os.environ["SCONTROL_CALLS"]
with open(calls, "a") as f:
    f.write(" ".join(args) + "\\n")
if args[:2] == ["show", "job"]:
    records = open(os.environ["JOB_RECORDS"]).read().splitlines()
    n = sum(1 for c in open(calls) if c.startswith("show job"))
    print("JobId=77 JobName=fsdp")
    print("   NumNodes=2 NumCPUs=4 " + records[min(n, len(records)) - 1])
elif args[:2] == ["show", "config"]:
    print("SlurmdTimeout           = 1 sec")
elif args[:2] == ["show", "hostnames"]:
    m = re.fullmatch(r"(.*)\\[(\\d+)-(\\d+)\\]", args[2])
    names = [m[1] + str(i) for i in range(int(m[2]), int(m[3]) + 1)] if m else [args[2]]
    print("\\n".join(names))
"""


def _ranged(tmp_path: Path, nodes: int, low: int, restarts: int) -> tuple[str, object]:
    return script_tests.render(
        tmp_path, JOB_NODES=str(nodes), MIN_NODES=str(low), MAX_RESTARTS=str(restarts),
        SLURM_PYTHON="fake-python",
    )  # fmt: skip


def _with_scontrol(tmp_path: Path, records: list[str]) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "scontrol").write_text(SCONTROL)
    (bin_dir / "scontrol").chmod(0o755)
    (tmp_path / "records").write_text("".join(r + "\n" for r in records))
    (tmp_path / "scontrol.calls").write_text("")
    return {
        "JOB_RECORDS": str(tmp_path / "records"),
        "SCONTROL_CALLS": str(tmp_path / "scontrol.calls"),
    }


def _sbatch(text: str) -> list[str]:
    return [line.split(" ", 1)[1] for line in text.splitlines() if line.startswith("#SBATCH ")]


@settings(
    max_examples=10,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(nodes=st.integers(1, 8), low=st.integers(0, 8), restarts=st.integers(0, 2))
def test_a_range_becomes_no_kill_a_node_range_and_a_store_off_the_step(
    tmp_path, nodes, low, restarts
):
    """Run under real bash with a recording srun and scontrol (tests/test_slurm_script.py): with a
    range, `#SBATCH --nodes=MIN-MAX --no-kill` and no --ntasks-per-node (sbatch would count MIN
    tasks and Slurm allocate MIN nodes: measured on the peer), the store started by the batch shell
    on its host at torchrun's port before the step, and the step on the job's nodes now (scontrol's
    NumNodes) with `--no-kill` (srun(1): -K has no effect then), torchrun `--nnodes=MIN:MAX`,
    `is_host=false`, the launcher wrapped in the guard that requeues (or, without requeues,
    cancels) a job left without its batch host. Without one the script is what it was."""
    low = min(low, nodes)
    shutil.rmtree(tmp_path / "fsx", ignore_errors=True)
    text, _ = _ranged(tmp_path, nodes, low, restarts)
    env = _with_scontrol(tmp_path, ["BatchHost=node0 NodeList=node[0-1]"])
    got, calls, direct = script_tests.run(tmp_path, text, "0:0,0", **env)
    assert got.returncode == 0, got.stderr
    argv = calls[-1]["argv"]
    ranged = 0 < low < nodes
    head = _sbatch(text)
    assert ("--no-kill" in head) == ranged and ("--no-kill" in argv) == ranged
    if not ranged:
        assert f"--nodes={nodes}" in head and "--ntasks-per-node=1" in head
        assert "--kill-on-bad-exit=1" in argv and f"--nnodes={nodes}" in argv
        assert direct == [] and "bash" not in argv
        return
    assert f"--nodes={low}-{nodes}" in head and not any("ntasks" in o for o in head)
    assert "--nodes=2" in argv and "--kill-on-bad-exit=1" not in argv
    assert f"--nnodes={low}:{nodes}" in argv
    assert script_tests.option(argv, "--rdzv-conf").endswith(",is_host=false")
    host = socket.gethostname()
    assert script_tests.option(argv, "--rdzv-endpoint") == f"{host}:29400"
    # the store, started in the background before the step (its recording may lose the race with
    # the EXIT trap's kill: read from the script, and nothing else ran in the batch shell)
    lines = text.splitlines()
    store = next(i for i, x in enumerate(lines) if x.startswith("fake-python -m fsdptrain.rdzv_"))
    assert lines[store].split()[3:5] == ['"$head"', "29400"] and store < lines.index("while :; do")
    assert direct in ([], [["-m", "fsdptrain.rdzv_store", host, "29400"]])
    assert argv[argv.index("bash") + 3] == "fsdpctl-task"
    guard = argv[argv.index("bash") + 2]
    assert ("scontrol requeue" in guard) == (restarts > 0) and ("scancel" in guard) == (
        not restarts
    )


@settings(
    max_examples=8,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@example(rc=1, store_answers=False, polls_before_excised=2, restarts=1)
@example(rc=1, store_answers=False, polls_before_excised=0, restarts=0)
@example(rc=1, store_answers=True, polls_before_excised=0, restarts=1)
@given(
    rc=st.sampled_from([0, 1]),
    store_answers=st.booleans(),
    polls_before_excised=st.integers(0, 3),
    restarts=st.integers(0, 1),
)
def test_the_guard_ends_a_job_left_without_its_batch_host_and_nothing_else(
    tmp_path, rc, store_answers, polls_before_excised, restarts
):
    """The guard's own shell under bash, around a launcher that ends `rc`: a launcher that failed
    where the store does not answer polls slurmctld until the batch host is no longer among the
    job's nodes (job_mgr.c excise_node_from_job, after SlurmdTimeout), then requeues the job
    (cancels it with MAX_RESTARTS=0) and says which host was lost; a launcher that ended 0, or a
    store that answers (the batch script is alive and judges the step), asks nothing. The task
    exits with the launcher's code."""
    from fsdpctl.backends.slurm import elastic

    cfg = _ranged(tmp_path, 3, 2, restarts)[1]
    words = elastic.orphan_guard(cfg, restarts)
    body = shlex.split(words[2])[0]
    kept = ["BatchHost=node0 NodeList=node[0-2]"] * polls_before_excised
    env = _with_scontrol(tmp_path, [*kept, "BatchHost=node0 NodeList=node[1-2]"])
    bin_dir = tmp_path / "bin"
    for name in ("sleep", "scancel"):
        (bin_dir / name).write_text(f'#!/bin/sh\necho "{name} $*" >> "$SCONTROL_CALLS"\n')
        (bin_dir / name).chmod(0o755)
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1] if store_answers else _closed_port()
        body = body.replace(f"/{elastic.C10D_PORT}", f"/{port}")
        env |= {"PATH": f"{bin_dir}:{os.environ['PATH']}", "FSDPCTL_RDZV_HOST": "127.0.0.1"}
        env["SLURM_JOB_ID"] = "77"
        got = subprocess.run(
            ["bash", "-c", body, "fsdpctl-task", "sh", "-c", f"exit {rc}"],
            env=env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    said = (tmp_path / "scontrol.calls").read_text().splitlines()
    assert got.returncode == rc
    if rc == 0 or store_answers:
        assert said == [] and got.stderr == ""
        return
    ended = "requeue 77" if restarts else "scancel 77"
    assert said[-1] == ended and sum(ended in c for c in said) == 1, said
    assert said.count("show job 77") == polls_before_excised + 1
    assert "the batch host node0 is lost" in got.stderr


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("srun_rc", [0, 137])
def test_the_survivors_finishing_ends_the_job_0_though_srun_counts_the_lost_node(tmp_path, srun_rc):
    """srun's exit code may count the failed node's tasks; the survivors' launchers ended 0: the
    trainers finished, and the script exits 0 (the job COMPLETES) after one step, neither FAILED
    nor started again; one survivor that failed on its own still fails it."""
    text, _ = _ranged(tmp_path, 3, 2, 1)
    env = _with_scontrol(tmp_path, ["BatchHost=node0 NodeList=node[0-1]"])
    got, calls, _ = script_tests.run(tmp_path, text, f"{srun_rc}:0,0", **env)
    assert (got.returncode, len(calls)) == (0, 1), got.stderr
    shutil.rmtree(tmp_path / "fsx")
    got, calls, _ = script_tests.run(tmp_path, text, f"{srun_rc or 1}:0,1", **env)
    assert (got.returncode, len(calls)) == (srun_rc or 1, 1), got.stderr


def _lines(env: dict[str, str]) -> list[str]:
    from fsdpctl.backends.slurm import logs, script

    return logs.run_texts(script.Paths(str(paths.run_dir(env))))


def _held(cluster, job: int) -> list[str]:
    """The hostnames of a RUNNING job's NodeList; [] before it runs."""
    record = cluster.job(job)
    if record.get("JobState") != "RUNNING" or record.get("NodeList") in (None, "", "(null)"):
        return []
    return cluster.hostnames(record["NodeList"])


def _elastic_env(cluster, tmp_path: Path, name: str, **more: str) -> dict[str, str]:
    trace = tmp_path / f"trace-{name}"
    trace.mkdir()
    env = paths.env_for(
        cluster, tmp_path, name, JOB_NODES="3", MIN_NODES="2", MAX_STEPS=str(STEPS),
        CHECKPOINT_INTERVAL=str(INTERVAL), MICRO_BATCH_SIZE="2", GRAD_ACCUM_STEPS="2",
        LOG_INTERVAL="1", **more,
    )  # fmt: skip
    env["FSDPTRAIN_TRACE"] = str(trace)
    return env


def _assert_every_sample_once_but_the_lost_steps(env, lines, changes) -> None:
    """Every block of the data trained, again only for the steps lost (and at most the step in
    flight when the node went), as tests/test_elastic_local.py counts."""
    taken, total = _taken(Path(env["FSDPTRAIN_TRACE"])), STEPS * GLOBAL_BATCH
    assert set(taken) == set(range(total))  # no sample skipped
    lost = sum(_steps_lost(lines, c) for c in changes)
    assert lost * GLOBAL_BATCH <= len(taken) - total <= (lost + len(changes)) * GLOBAL_BATCH


def _history_world(env: dict[str, str]) -> str:
    import json

    got = fsdpctl("job", "history", "-o", "json", env=env)
    assert got.returncode == 0, got.stderr
    rows = json.loads(got.stdout)
    rows = rows.get("runs", rows) if isinstance(rows, dict) else rows
    return rows[-1]["world"]


@pytest.mark.slow
def test_a_lost_non_batch_node_costs_at_most_a_checkpoint_interval(tmp_path):
    """3 nodes, MIN_NODES=2, a checkpoint every 4 steps: node 2 powered off at step 6 (every
    process in its network namespace SIGKILLed, slurmd included). slurmctld sets it DOWN after
    SlurmdTimeout and, the job being --no-kill, removes it from the job ("Removing failed node");
    srun's --no-kill step goes on ("Node failure on node2"); the agents on node0 and node1 see
    their workers fail, node2's heartbeat expire, and close a new round of 2 on the batch script's
    store. The job ends Succeeded at MAX_STEPS without a requeue (Restarts=0); the shrink cost at
    most CHECKPOINT_INTERVAL steps, kept the global batch (accumulation 2 -> 3); every block of the
    data trained, again only for the lost steps; status and history name the change with Slurm's
    node name. ~2 min here."""
    with slurm_peer.running(tmp_path / "cluster", nodes=3) as cluster:
        env = _elastic_env(cluster, tmp_path, "elastic")
        assert fsdpctl("job", "run", "--detach", env=env).returncode == 0
        job = paths.until("the job running", lambda: paths.status(env)["scheduler_job"]["id"])
        # the nodes it holds (NumNodes reads "3", or "3-3" while slurmctld still shows the range it
        # resolved, as CI once saw: the node list is the answer)
        held = paths.until("the job's nodes", lambda: _held(cluster, job))
        assert len(held) == 3, held
        paths.until("step 6", lambda: paths.leader_step(env) >= 6)
        cluster.kill_node(2)
        waited = fsdpctl("job", "wait", "--timeout", "400", env=env, timeout=scaled(430))
        final = paths.status(env)
        assert waited.returncode == 0 and final["phase"] == "Succeeded", paths.said(cluster, env)
        assert final["step"] == STEPS and cluster.job(job)["Restarts"] == "0", final
        lines = _lines(env)
        changes = world.changes(lines)
        assert final["world_changes"] == [f"3 → 2 nodes at step {changes[0]['step']}: node2 lost"]
        assert 0 <= _steps_lost(lines, changes[0]) <= INTERVAL
        assert (changes[0]["rule"], changes[0]["to_world"]) == ("constant", 2)
        _assert_every_sample_once_but_the_lost_steps(env, lines, changes)
        assert _history_world(env) == final["world_changes"][0]


def _all_lines(env: dict[str, str]) -> list[str]:
    """Every run's logs of the job, oldest run first (a resume is a run of its own)."""
    from fsdpctl.backends.slurm import logs, script

    base = Path(env["FSDPCTL_SHARED_VOLUME_PATH"]) / "fsdpctl/slurm" / env["FSDPCTL_JOB_NAME"]
    runs = sorted(base.iterdir(), key=lambda d: (d / "job.sbatch").stat().st_mtime)
    return [line for d in runs for line in logs.run_texts(script.Paths(str(d)))]


def _left_running(cluster) -> list[str]:
    """What the job left in the nodes' namespaces: anything but the daemons (slurmd, munged)."""
    out = []
    for node in range(len(cluster.names)):
        for pid in cluster.pids_in(node):
            try:
                name = Path(f"/proc/{pid}/comm").read_text().strip()
            except OSError:
                continue  # gone meanwhile
            if name not in ("slurmd", "munged"):
                out.append(f"{cluster.names[node]}:{pid}:{name}")
    return out


@pytest.mark.slow
def test_the_batch_host_lost_requeues_onto_the_nodes_that_are_up_resharded(tmp_path):
    """Node 0, the batch host (and the rendezvous store's), powered off at step 6. --no-kill
    removes it from the job like any node, and the job would stay RUNNING on the others without its
    batch script until its time limit (slurmctld looks for a missing batch script only on the
    job's own nodes: job_mgr.c _purge_missing_jobs; measured here before the guard). The
    survivors' tasks (backends/slurm/elastic.orphan_guard) see BatchHost outside NodeList once
    their launchers ended and requeue the job; `--nodes=2-3` starts the requeued run on the two
    nodes that are up (sbatch(1) -N: "without delaying the initiation"), which loads the last
    checkpoint resharded (3 -> 2, the global batch kept by accumulation 2 -> 3) and trains to
    MAX_STEPS: Succeeded, Restarts=1, at most CHECKPOINT_INTERVAL steps lost, every sample once
    but the lost steps', status and history naming "node0 lost"; nothing left running. ~3 min
    here."""
    with slurm_peer.running(tmp_path / "cluster", nodes=3) as cluster:
        env = _elastic_env(cluster, tmp_path, "batchlost")
        assert fsdpctl("job", "run", "--detach", env=env).returncode == 0
        job = paths.until("the job running", lambda: paths.status(env)["scheduler_job"]["id"])
        paths.until("step 6", lambda: paths.leader_step(env) >= 6)
        cluster.kill_node(0)
        waited = fsdpctl("job", "wait", "--timeout", "360", env=env, timeout=scaled(390))
        final = paths.status(env)
        assert waited.returncode == 0 and final["phase"] == "Succeeded", paths.said(cluster, env)
        record = cluster.job(job)
        assert record["Restarts"] == "1" and record["NodeList"] == "node[1-2]", record
        assert final["step"] == STEPS and final["restarts"] == 1, final
        lines = _lines(env)
        changes = world.changes(lines)
        assert final["world_changes"] == [f"3 → 2 nodes at step {changes[0]['step']}: node0 lost"]
        assert 0 <= _steps_lost(lines, changes[0]) <= INTERVAL
        assert (changes[0]["rule"], changes[0]["to_world"]) == ("constant", 2)
        _assert_every_sample_once_but_the_lost_steps(env, lines, changes)
        assert _history_world(env) == final["world_changes"][0]
        assert _left_running(cluster) == []


@pytest.mark.slow
def test_a_stop_during_the_re_rendezvous_and_the_node_back_for_the_next_run(tmp_path):
    """Node 2 powered off at step 6 and `job stop` as soon as the survivors' agents restart their
    worker group (torch's "Worker group FAILED ... will restart worker group", agent/server/api.py
    _invoke_run): no trainer is running to write a stop checkpoint, the agents in the rendezvous
    take their SIGTERM from the step (scancel --signal), the script ends at the stop file, no
    requeue. Stopped, with the last periodic checkpoint at most CHECKPOINT_INTERVAL steps behind
    the last step; the batch script, its store and every task gone. Then node 2 is back (its slurmd
    registers: ReturnToService=1) and `job resume` runs on all 3 nodes again from that checkpoint:
    Succeeded at MAX_STEPS, every sample trained, again only for the steps the stop lost. ~3 min
    here."""
    with slurm_peer.running(tmp_path / "cluster", nodes=3) as cluster:
        env = _elastic_env(cluster, tmp_path, "stopped")
        assert fsdpctl("job", "run", "--detach", env=env).returncode == 0
        job = paths.until("the job running", lambda: paths.status(env)["scheduler_job"]["id"])
        paths.until("step 6", lambda: paths.leader_step(env) >= 6)
        last = paths.leader_step(env)
        cluster.kill_node(2)
        restarting = "will restart worker group"
        paths.until("the re-rendezvous", lambda: restarting in "\n".join(_lines(env)), 120)
        stopped = fsdpctl("job", "stop", env=env, timeout=scaled(300))
        assert stopped.returncode == 0, stopped.stderr
        final = paths.status(env)
        assert final["phase"] == "Stopped", (final, paths.said(cluster, env))
        assert cluster.job(job)["Restarts"] == "0"
        ckpt = Path(env["FSDPCTL_SHARED_VOLUME_PATH"]) / "checkpoints" / "stopped" / "latest"
        kept = int(ckpt.read_text().strip().removeprefix("step-"))
        stopped_at = paths.leader_step(env)  # the last step the first run trained
        assert 0 <= stopped_at - kept <= INTERVAL and kept >= last - INTERVAL
        paths.until("nothing left running", lambda: _left_running(cluster) == [], 60)

        cluster.start_node(2)
        cluster.wait_for(lambda: cluster.idle() == cluster.names, "every node idle", 120)
        resumed = fsdpctl("job", "resume", "stopped", env=env, timeout=scaled(600))
        assert resumed.returncode == 0, (resumed.stdout[-2000:], resumed.stderr[-2000:])
        final = paths.status(env)
        assert final["phase"] == "Succeeded" and final["step"] == STEPS, final
        assert cluster.job(final["scheduler_job"]["id"])["NumNodes"].partition("-")[0] == "3"
        taken, total = _taken(Path(env["FSDPTRAIN_TRACE"])), STEPS * GLOBAL_BATCH
        assert set(taken) == set(range(total))
        # trained again: the steps past the checkpoint the stop lost, and at most the one in flight
        again = (stopped_at - kept) * GLOBAL_BATCH
        assert again <= len(taken) - total <= again + GLOBAL_BATCH
        assert _left_running(cluster) == []


@settings(max_examples=20, derandomize=True, deadline=None)
@given(
    hosts=st.lists(st.sampled_from(["node1", "node2", "ip-10-0-0-7"]), min_size=1, max_size=3),
    survivors=st.integers(1, 3),
)
def test_slurm_names_each_lost_node_once_in_the_order_lost(hosts, survivors):
    """World changes on Slurm take Slurm's node names: srun's "Node failure on NODE" (Slurm 22.05
    api/step_launch.c _node_fail_handler) in the batch log, or the guard's batch-host line, which
    every survivor writes (said once); each shrink is named by the next node lost, in order."""
    lines: list[str] = []
    for n, host in enumerate(hosts):
        if n % 2:
            lines += ["fsdpctl: the batch host " + host + " is lost and ..."] * survivors
        else:
            lines.append(f"srun: error: Node failure on {host}")
    distinct = [h for i, h in enumerate(hosts) if i == 0 or hosts[i - 1] != h]
    for n, _ in enumerate(distinct):
        lines.append(
            events.to_line(
                events.World(
                    step=4 * (n + 1), from_world=3 - n, to_world=2 - n, from_nodes=3 - n,
                    to_nodes=2 - n, rule="per-rank", grad_accum=1, global_batch=6,
                    target_global_batch=6, checkpoint="/c", time=float(n),
                )
            )
        )  # fmt: skip
    found = world.changes(lines)
    assert [c["why"] for c in found] == [f"{h} lost" for h in distinct]


def test_a_range_with_a_container_image_is_refused_in_one_line():
    """The store runs in the batch shell with SLURM_PYTHON: with SLURM_CONTAINER_IMAGE the range is
    refused (one line naming both keys and the fix), never rendered half-right."""
    from fsdpctl.backends.slurm import script
    from fsdpctl.settings import load

    base = {**script_tests.BASE, "JOB_NODES": "3", "MIN_NODES": "2", "SHARED_VOLUME_PATH": "/fsx"}
    cfg = load(environ={}, flags={**base, "SLURM_CONTAINER_IMAGE": "/fsx/img.sqsh"})
    (line,) = [x for x in script.refusals(cfg) if x.startswith("MIN_NODES=2")]
    assert "SLURM_CONTAINER_IMAGE='/fsx/img.sqsh'" in line and "set MIN_NODES=0" in line
    assert not [x for x in script.refusals(load(environ={}, flags=base)) if "MIN_NODES" in x]


@pytest.mark.slow
def test_the_node_back_grows_the_next_run_to_every_node_resharded(tmp_path):
    """Node 2 powered off at step 6; the two survivors train on and save on 2 nodes; `job stop`
    writes the stop checkpoint there. Node 2 comes back (its slurmd registers: ReturnToService=1),
    and `job resume` starts on all 3 nodes (`--nodes=2-3`: as many as are up; a running Slurm
    job cannot grow, docs/slurm.md): it loads the 2-node checkpoint resharded onto 3 and trains to
    MAX_STEPS, Succeeded; its status and history name "2 → 3 nodes at step K", the first run's
    history "3 → 2 ... node2 lost"; every sample trained, again only for the steps the loss cost.
    ~4 min here."""
    with slurm_peer.running(tmp_path / "cluster", nodes=3) as cluster:
        env = _elastic_env(cluster, tmp_path, "grown")
        assert fsdpctl("job", "run", "--detach", env=env).returncode == 0
        paths.until("step 6", lambda: paths.leader_step(env) >= 6)
        cluster.kill_node(2)

        def trained_on_two() -> bool:
            found = world.changes(_lines(env))
            return bool(found) and paths.leader_step(env) > found[0]["step"] + INTERVAL

        paths.until("a checkpoint on 2 nodes", trained_on_two, 300)
        stopped = fsdpctl("job", "stop", env=env, timeout=scaled(300))
        assert stopped.returncode == 0, stopped.stderr
        assert paths.status(env)["phase"] == "Stopped"
        shrink = world.changes(_lines(env))
        cluster.start_node(2)
        cluster.wait_for(lambda: cluster.idle() == cluster.names, "every node idle", 120)
        resumed = fsdpctl("job", "resume", "grown", env=env, timeout=scaled(600))
        assert resumed.returncode == 0, (resumed.stdout[-2000:], resumed.stderr[-2000:])
        final = paths.status(env)
        assert final["phase"] == "Succeeded" and final["step"] == STEPS, final
        assert cluster.job(final["scheduler_job"]["id"])["NumNodes"].partition("-")[0] == "3"
        lines = _all_lines(env)
        changes = world.changes(lines)
        assert [world.text(c) for c in changes] == [
            f"3 → 2 nodes at step {shrink[0]['step']}: node2 lost",
            f"2 → 3 nodes at step {changes[1]['step']}",
        ]
        assert final["world_changes"] == [world.text(changes[1])]
        _assert_every_sample_once_but_the_lost_steps(env, lines, changes)
        import json

        got = fsdpctl("job", "history", "-o", "json", env=env)
        rows = json.loads(got.stdout)
        rows = rows.get("runs", rows) if isinstance(rows, dict) else rows
        assert [r["world"] for r in rows[-2:]] == [world.text(c) for c in changes]
        assert _left_running(cluster) == []

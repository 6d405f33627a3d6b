"""Failures that say why, restarts counted per job attempt, and one-line errors that stay one line
(issue 15).

What torchrun writes on a worker failure is produced here by torch's own code, not retyped: the
root-cause block is `ChildFailedError.format_msg()` over `ProcessFailure`s
(torch/distributed/elastic/multiprocessing/ errors/__init__.py), the error file is written by
`ErrorHandler.record_exception` into the TORCHELASTIC_ERROR_FILE the agent sets per worker
(multiprocessing/api.py; errors/error_handler.py), and a rank's traceback carries the "[rank<N>]: "
prefix of torch's `_distributed_excepthook` (torch/distributed/distributed_c10d.py). The agent's
rendezvous lines are its `_rendezvous` log format (torch/distributed/elastic/agent/server/api.py).
The real runs (marked slow) start torchrun through fsdpctl."""

from __future__ import annotations

import json
import os
import random
import traceback
from pathlib import Path

import pytest

from conftest import prefixed
from fsdpctl.job import failures, kstatus

LOG_PREFIX = "I1203 16:28:44.072000 5339 torch/distributed/elastic/agent/server/api.py:553] "


# --- generated logs, in torch's own formats -----------------------------------------------------------------


def rank_traceback(rank: int | None, cause: str, effect: str) -> list[str]:
    """A chained traceback (`effect` raised from `cause`) as Python prints it, prefixed as torch's
    excepthook prefixes a rank's (None: before init_process_group, unprefixed)."""

    def fail() -> None:
        try:
            raise ValueError(cause)
        except ValueError as e:
            raise RuntimeError(effect) from e

    try:
        fail()
    except RuntimeError as e:
        text = "".join(traceback.format_exception(e))
    return [f"[rank{rank}]: {s}" if rank is not None and s else s for s in text.split("\n")]


def torchrun_root_cause(tmp_path: Path, rank: int, exitcode: int, message: str | None) -> list[str]:
    """What torchrun prints when it gives up: its own traceback ending in a ChildFailedError over
    this rank's failure (and another rank's, SIGTERMed later), with the error file `record` wrote
    for this rank when `message` is given."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure
    from torch.distributed.elastic.multiprocessing.errors.error_handler import ErrorHandler

    error_file = tmp_path / f"attempt_0/{rank}/error.json"
    if message is not None:
        error_file.parent.mkdir(parents=True, exist_ok=True)
        os.environ["TORCHELASTIC_ERROR_FILE"] = str(error_file)
        try:
            try:
                raise RuntimeError(message)
            except RuntimeError as e:
                ErrorHandler().record_exception(e)
        finally:
            del os.environ["TORCHELASTIC_ERROR_FILE"]
    by_rank = {rank: ProcessFailure(rank % 8, 1000 + rank, exitcode, str(error_file))}
    other = rank + 1
    by_rank[other] = ProcessFailure(other % 8, 2000, -15, str(tmp_path / "none.json"))
    by_rank[other].timestamp = by_rank[rank].timestamp + 5
    text = f"{failures.CHILD_FAILED}: {ChildFailedError('fsdptrain', by_rank)}"
    return [
        "Traceback (most recent call last):",
        '  File "run.py", line 1, in <module>',
        *text.split("\n"),
    ]


def agent_round(addr: str, port: int, restart_count: int) -> list[str]:
    return [
        LOG_PREFIX + "[default] Rendezvous complete for workers. Result:",
        LOG_PREFIX + f"  restart_count={restart_count}",
        LOG_PREFIX + f"  master_addr={addr}",
        LOG_PREFIX + f"  master_port={port}",
        LOG_PREFIX + "  group_rank=0",
    ]


NOISE = [
    LOG_PREFIX + "[default] Starting worker group",
    '{"event":"leader","node_rank":0,"hostname":"vm","world":2,"time":1796315329.19}',
    "Failed to load JSON from file 'x' with error <class 'ValueError'>",  # a library's own log line
    "E1203 16:28:56.889000 5339 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: 1)",
    "",
]


@pytest.mark.parametrize("seed", range(40))
def test_the_failing_ranks_first_error_line_is_found_wherever_it_is(tmp_path, seed):
    """Generated node logs: noise, other ranks' tracebacks before and after, the failing rank's
    chained traceback anywhere, torchrun's root cause naming that rank at the end (with or without
    an error file). The error is the failing rank's first exception line (the cause of the chain),
    its line number is right, and `raised` is what its error file says, or nothing without one."""
    rnd = random.Random(seed)
    rank = rnd.randrange(0, 16)
    others = [r for r in range(16) if r != rank]
    cause, effect = f"cause {seed} of rank {rank}", f"effect {seed}"
    chunks = [rnd.choice(NOISE) for _ in range(rnd.randrange(0, 30))]
    at = rnd.randrange(0, len(chunks) + 1)
    before = [
        rank_traceback(rnd.choice(others), f"other {i}", "x") for i in range(rnd.randrange(0, 3))
    ]
    lines = chunks[:at]
    for tb in before:
        lines += tb
    first = len(lines)
    lines += rank_traceback(rank, cause, effect)
    lines += chunks[at:] + rank_traceback(rnd.choice(others), "later", "y")
    with_file = rnd.random() < 0.5
    lines += torchrun_root_cause(tmp_path, rank, 1, f"rank {rank} ended" if with_file else None)

    found = failures.failure(lines, lambda p: Path(p).read_text() if Path(p).is_file() else None)
    assert found["rank"] == rank and found["exitcode"] == 1
    assert found["error"] == f"ValueError: {cause}"
    assert (
        lines[found["line"] - 1] == f"[rank{rank}]: ValueError: {cause}" and found["line"] > first
    )
    assert found["raised"] == (f"RuntimeError: rank {rank} ended" if with_file else None)
    assert (found["error_file"] is not None) == with_file


def test_the_trainers_own_one_line_error_and_a_signal():
    """The pre-launch check's error (exit 2 before torchrun: no traceback, no root cause) is the
    error line; a rank killed by a signal has no traceback, and torchrun's "Signal 9 (SIGKILL)
    received by PID" is."""
    own = (
        "fsdptrain: error: DATASET='/fsx/data/x.jsonl' does not exist "
        "(checked before torchrun: not retried)"
    )
    lines = [*NOISE, *["x"] * 40, own, *NOISE]
    found = failures.failure(lines, lambda p: None)
    assert (found["error"], found["line"], found["rank"]) == (own, len(NOISE) + 41, None)

    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    block = str(
        ChildFailedError("fsdptrain", {3: ProcessFailure(3, 77, -9, "/nonexistent")})
    ).split("\n")
    found = failures.failure([*NOISE, *block], lambda p: None)
    assert found["rank"] == 3 and found["exitcode"] == -9
    assert found["error"] == found["raised"] == "Signal 9 (SIGKILL) received by PID 77"


# --- restarts per job attempt -------------------------------------------------------------------------------


@pytest.mark.parametrize("nodes", [1, 2, 3, 8])
@pytest.mark.parametrize("restarts", [0, 1, 2, 5])
def test_restarts_are_rounds_of_the_job_not_of_its_nodes(nodes, restarts):
    """Every node of an N-node job joins each round (one master_addr:master_port per round): the job
    restarted `restarts` times whatever N. A node recreated in the last round (its new agent's log
    starts there) adds nothing; an agent store reused across rounds (same port every round) falls
    back to the busiest node's own count."""
    ports = [29500 + 7 * i for i in range(restarts + 1)]
    logs = [
        [ln for p in ports for ln in (*NOISE, *agent_round("10.0.0.1", p, 0))] for _ in range(nodes)
    ]
    assert kstatus.job_restarts(logs) == restarts
    recreated = [*logs, agent_round("10.0.0.1", ports[-1], 0)]
    assert kstatus.job_restarts(recreated) == restarts
    same_port = [
        [ln for _ in ports for ln in agent_round("10.0.0.1", 29400, 0)] for _ in range(nodes)
    ]
    assert kstatus.job_restarts(same_port) == restarts
    assert (
        kstatus.job_restarts([[*NOISE]] * nodes) == 0
    )  # never reached a rendezvous (exit 2 before it)


# --- real runs ----------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_rank_that_raises_is_named_with_its_error_and_a_2_node_restart_counts_once(cli, tmp_path):
    """A real 2-node local job whose ranks raise while loading a DATASET that is not JSON lines
    (after init_process_group, so torch prefixes their tracebacks), MAX_RESTARTS=1: both nodes'
    agents restart the group once, one restart of the job. The foreground `job run` exits 3 and, in
    one line, names the failing rank, its first error line and where it is, and what its error file
    (written by the trainer's `record`) says ended it."""
    data = cli.home / "volumes/fsx-claim/data"
    data.mkdir(parents=True)
    (data / "bad.jsonl").write_text('not json at all\n{"text": 1}\n')
    env = prefixed({"SEQ_LEN": "64", "PRECISION": "fp32", "JOB_NAME": "bad", "MAX_RESTARTS": "1"})
    r = cli.run("--set", "DATASET=/fsx/data/bad.jsonl", "job", "run", env=env, timeout=240)
    assert r.exit_code == 3, r.output
    [line] = [ln for ln in r.stderr.splitlines() if ln.startswith("  rank ")]
    assert "ValueError: Unexpected character found when decoding" in line, line
    assert "node-" in line and ".log:" in line
    assert (
        "it ended with " in line
        and "DatasetGenerationError: An error occurred while generating the dataset" in line
    )
    s = json.loads(cli.run("job", "status", "bad", "-o", "json").stdout)
    assert s["phase"] == "Failed" and s["restarts"] == 1, s
    f = s["failure"]
    log = Path(f["log"]).read_text().splitlines()
    assert log[f["line"] - 1].endswith(f["error"]) and f["error_file"] is not None
    agents = [x.read_text() for x in Path(f["log"]).parent.glob("node-*.log")]
    assert (
        sum("will restart worker group" in text for text in agents) == 2
    )  # each node's agent: not 2 restarts


@pytest.mark.slow
def test_a_failed_run_says_why_in_one_line_under_a_300_character_path(tmp_path, monkeypatch):
    """DATASET that does not exist, forced past fsdpctl's own check: each node's pre-launch check
    exits 2 with the trainer's one-line error. FSDPCTL_HOME is a 300-character path and stderr a
    pipe (COLUMNS=200 as in every test): the error line, the paths and the `job list` row each stay
    on one line, whole."""
    from conftest import isolate

    deep = tmp_path / ("d" * 120) / ("e" * 120)
    deep.mkdir(parents=True)
    c = isolate(monkeypatch, deep)
    home = str(c.home)
    assert len(home) >= 300
    env = prefixed({"SEQ_LEN": "64", "PRECISION": "fp32", "JOB_NAME": "nodata"})
    r = c.run(
        "--set", "DATASET=/fsx/data/none.jsonl", "job", "run", "--force", env=env, timeout=120
    )
    assert r.exit_code == 3, r.output
    [line] = [ln for ln in r.stderr.splitlines() if ln.startswith("  node ")]
    # the launcher checks the path as the pod sees it: the claim's directory on this machine, under
    # the home
    assert f"fsdptrain: error: DATASET='{home}/volumes/fsx-claim/data/none.jsonl'" in line, line
    assert "not retried" in line
    assert f"{home}/jobs/nodata/logs/" in line and ".log:" in line
    assert any(ln.startswith("last lines of " + home) for ln in r.stderr.splitlines())
    listed = c.run("job", "list", env=env).stdout.splitlines()
    [row] = [ln for ln in listed if "nodata" in ln]
    run_id = json.loads(c.run("job", "status", "nodata", "-o", "json", env=env).stdout)["run_id"]
    assert run_id in row and "Failed" in row
    status = c.run("job", "status", "nodata", env=env).stdout
    assert any(ln.startswith("leader log") and home in ln for ln in status.splitlines())


def test_an_error_naming_a_300_character_path_is_one_line(cli):
    """A bad setting naming a 300-character path, stderr a pipe: one line, the path whole (rich
    wrapped it at 80 columns, or COLUMNS, before)."""
    path = "/data/" + "p" * 300 + ".jsonl"
    r = cli.run("--set", f"DATASET={path}", "job", "run", "--dry-run")
    assert r.exit_code == 2, r.output
    [line] = [ln for ln in r.stderr.splitlines() if "DATASET" in ln]
    assert path in line and line.startswith("error: ")

"""One resume point for the whole job (issue 13, defect 1, trainer side).

DCP (torch `checkpoint/filesystem.py`) writes every rank's shards on the filesystem that rank sees,
and only rank 0 publishes `latest`; on per-node disks the ranks would each pick their own resume
point. The trainer decides on rank 0, broadcasts the choice, and every rank checks it sees that same
checkpoint whole before anything is loaded. The unit tests drive the per-rank check on real DCP
checkpoints; the torchrun tests give each simulated node (one launcher each, torchrun's static
rendezvous so node 0 holds rank 0) its own CHECKPOINT_DIR, as pods with their own disks have."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from conftest import ROOT, train_env
from fsdpctl.adapters.etcd import free_port
from lazy import lazy

torch = lazy("torch")
dcp = lazy("torch.distributed.checkpoint")
ckpt = lazy("fsdptrain.checkpoint")
pytestmark = pytest.mark.xdist_group("torch")


def _saved(root: Path, step: int, meta: str = '{"step": 1}') -> Path:
    """A real DCP checkpoint (one process, no process group: DCP saves alone) with its meta.json."""
    path = root / ckpt.step_name(step)
    with (
        warnings.catch_warnings()
    ):  # DCP warns that it saves without a process group: that is the point
        warnings.simplefilter("ignore", UserWarning)
        dcp.save({"w": torch.arange(8.0), "b": torch.ones(3)}, checkpoint_id=str(path))
    (path / ckpt.META).write_text(meta)
    return path


def test_rank_0_chooses_from_resume_and_its_own_view(tmp_path):
    assert ckpt.choose_resume(tmp_path, "never") is None
    assert ckpt.choose_resume(None, "auto") is None
    assert ckpt.choose_resume(tmp_path, "auto") is None  # nothing saved: a fresh start
    _saved(tmp_path, 2)
    newest = _saved(tmp_path, 4)
    (tmp_path / ckpt.LATEST).write_text(newest.name)
    assert ckpt.choose_resume(tmp_path, "auto") == newest
    assert ckpt.choose_resume(tmp_path, "/else/where") == Path("/else/where")


def test_a_rank_seeing_the_whole_checkpoint_has_nothing_to_say(tmp_path):
    path = _saved(tmp_path, 4)
    assert ckpt.unreadable(path, expected_meta='{"step": 1}') is None


@pytest.mark.parametrize(
    "damage, why",
    [
        (lambda p: shutil.rmtree(p), "no meta.json"),
        (
            lambda p: (p / ckpt.META).write_text('{"step": 1, "saved_at": 2}'),
            "differs from rank 0's",
        ),
        (lambda p: (p / ".metadata").unlink(), "cannot read"),
        (lambda p: (p / ".metadata").write_bytes(b"\x80\x04"), "cannot read its index"),
        (
            lambda p: next(p.glob("*.distcp")).unlink(),
            "1 of 1 shard files missing, e.g. __0_0.distcp",
        ),
    ],
    ids=["no step dir", "another save", "no index", "truncated index", "a shard missing"],
)
def test_a_rank_missing_any_part_of_rank_0s_checkpoint_says_what(tmp_path, damage, why):
    path = _saved(tmp_path, 4)
    damage(path)
    assert why in (ckpt.unreadable(path, expected_meta='{"step": 1}') or "")


def test_rank_0_without_a_meta_file_gives_every_rank_nothing_to_match(tmp_path):
    path = _saved(tmp_path, 4)
    assert ckpt.unreadable(path, expected_meta="") == "no meta.json"


# ---- real torchrun, one launcher per simulated node -------------------------------------------------------


def _nodes(
    assets, dirs: list[Path], timeout: int = 240, **settings
) -> list[subprocess.CompletedProcess]:
    """Two launchers of one job (--nnodes 2, one process each), node N with CHECKPOINT_DIR=dirs[N];
    torchrun's static rendezvous (--node-rank) puts rank N on node N. Returns each launcher's
    outcome."""
    port = free_port()
    procs = []
    for node, directory in enumerate(dirs):
        argv = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            f"--nnodes={len(dirs)}",
            "--nproc-per-node=1",
            f"--node-rank={node}",
            "--master-addr=127.0.0.1",
            f"--master-port={port}",
            "-m",
            "fsdptrain",
        ]
        env = train_env(assets, CHECKPOINT_DIR=directory, WARMUP_STEPS=1, **settings)
        procs.append(
            subprocess.Popen(
                argv, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
        )
    try:
        outs = [p.communicate(timeout=timeout) for p in procs]  # a hang fails here, not forever
    finally:
        for p in procs:
            p.kill()
    return [
        subprocess.CompletedProcess(p.args, p.returncode, o, e)
        for p, (o, e) in zip(procs, outs, strict=True)
    ]


@pytest.fixture(scope="module")
def saved_job(assets, tmp_path_factory) -> Path:
    """A 2-node job's checkpoints at steps 2 and 4 on one shared directory."""
    shared = tmp_path_factory.mktemp("shared")
    runs = _nodes(assets, [shared, shared], MAX_STEPS=4, CHECKPOINT_INTERVAL=2)
    assert [r.returncode for r in runs] == [0, 0], runs[0].stderr[-3000:] + runs[1].stderr[-3000:]
    assert (shared / ckpt.LATEST).read_text() == "step-00000004"
    return shared


@pytest.mark.slow
def test_a_node_that_lacks_rank_0s_checkpoint_fails_the_job_with_one_line_naming_it(
    assets, saved_job, tmp_path
):
    """Node 1's disk holds only the step-2 save (its `latest` says so), node 0's has step 4: before
    the agreement rank 0 loaded step 4 and rank 1 step 2, mismatched state. Now both stop before
    loading, with exit 1 (not 2, a bad setting) and the same line naming rank 1, its node and host,
    and the path."""
    node1 = tmp_path / "node-1"
    shutil.copytree(saved_job, node1)
    shutil.rmtree(node1 / "step-00000004")
    (node1 / ckpt.LATEST).write_text("step-00000002")
    runs = _nodes(
        assets, [saved_job, node1], MAX_STEPS=6, CHECKPOINT_INTERVAL=2, ALLOW_SETTING_CHANGES="true"
    )
    assert [r.returncode for r in runs] == [1, 1], runs[1].stderr[-3000:]
    line = (
        f"fsdptrain: error: rank 1 (node 1, host {socket.gethostname()}) cannot read checkpoint "
        f"'{node1 / 'step-00000004'}' that rank 0 resumes from (no meta.json): every node must see "
        "CHECKPOINT_DIR on one shared volume (SHARED_VOLUME or CHECKPOINT_PVC)"
    )
    for r in runs:  # torchrun relays its worker's stderr: each node's log says it
        assert line in r.stderr.splitlines(), r.stderr[-3000:]
    assert "resumed from" not in runs[0].stdout
    assert (saved_job / ckpt.LATEST).read_text() == "step-00000004"  # nothing saved over it
    assert (node1 / ckpt.LATEST).read_text() == "step-00000002"


@pytest.mark.slow
def test_a_checkpoint_only_a_later_node_sees_is_not_resumed_by_anyone(assets, saved_job, tmp_path):
    """Rank 0 sees no checkpoint, so the whole job starts fresh: node 1's own step-4 save is never
    loaded (before, rank 1 alone entered DCP's load collectives and the job hung or failed)."""
    node0, node1 = tmp_path / "node-0", tmp_path / "node-1"
    node0.mkdir()
    shutil.copytree(saved_job, node1)
    runs = _nodes(assets, [node0, node1], MAX_STEPS=2)
    assert [r.returncode for r in runs] == [0, 0], runs[0].stderr[-3000:] + runs[1].stderr[-3000:]
    assert "resumed from" not in runs[0].stdout and "steps 1..2" in runs[0].stdout
    assert (node0 / ckpt.LATEST).read_text() == "step-00000002"


@pytest.mark.parametrize("done", [True, False])
def test_a_refused_checkpoint_offers_first_a_way_out_that_works(done):
    """A finished job's checkpoint is refused by `job resume` too (it resumes the same checkpoint),
    so its refusal does not offer it, and puts the way out (a new JOB_NAME, RESUME=never) first
    (issue 44); a checkpoint of other settings still offers `job resume`, which keeps its own."""
    from fsdptrain import resume
    from fsdptrain.config import TrainConfig

    cfg = TrainConfig(max_steps=6)
    saved = resume.math_settings(cfg, 2)
    if not done:
        saved = {**saved, "PRECISION": "fp32" if cfg.precision != "fp32" else "bf16"}
    line = resume.problem({"step": 6 if done else 3, "settings": saved}, cfg, 2, where="ckpt")
    assert line is not None
    ways = line.split("): ", 1)[1] if done else line
    if done:
        assert ways.startswith("to start again, use a new JOB_NAME or RESUME=never")
        assert "job resume" not in line
    else:
        assert "`fsdpctl job resume` continues a stopped job" in line

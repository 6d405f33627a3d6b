"""The volume check counts what is really on disk at the worst moment (issue 36: a resumed run keeps
the checkpoint it resumed from too, and met ENOSPC on a save the check had said fits).

The count is checked against the trainer's own checkpoint code, run here: `fsdptrain.checkpoint`
`stage` (every rank writes the new checkpoint into its temp dir, beside those kept), `publish` (rank
0 renames it into place, a re-saved step's old copy aside) and `prune` (rank 0 cuts back to the
newest CHECKPOINT_KEEP, never the `spare` the run resumed from), in the order train.py's
`_save_checkpoint` calls them, with real DCP shards on a one-rank gloo process group (torch
`torch.distributed.checkpoint.save`, the trainer's `dcp.save`). Hypothesis generates the keep counts
before and after the resume, the saves of each run and where the second run starts (fresh, RESUME=auto,
an older checkpoint by path, a rerun's directory of its own resuming the job's), and the model
sizes; every moment between the calls is measured and the most checkpoint directories on the volume
at once must be what `volume.checkpoints_at_once` says, exactly once enough saves have been made."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fsdpctl.plan import volume
from fsdpctl.settings import load
from lazy import lazy
from test_lifecycle import interpreter_reachable  # noqa: F401 (a fixture)

torch = lazy("torch")
dist = lazy("torch.distributed")
ckpt = lazy("fsdptrain.checkpoint")
pytestmark = pytest.mark.xdist_group("torch")

CHECKPOINT_DIRS = ("step-*", ".tmp-step-*", ".old-step-*")  # published, being written, replaced


@pytest.fixture(scope="module")
def one_rank(tmp_path_factory):
    """A one-rank gloo process group: the trainer's collectives (broadcast, all_gather, barrier)
    over a world of one, as torchrun's single-process run has."""
    store = dist.FileStore(str(tmp_path_factory.mktemp("store") / "f"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _model(width: int):
    model = torch.nn.Linear(width, width)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.ones(1, width)).sum().backward()
    optimizer.step()  # AdamW's moments exist: a checkpoint holds them, as the trainer's does
    return model, optimizer


def _on_volume(roots: list[Path], others: list[Path]) -> tuple[int, int]:
    """(checkpoint directories, their bytes) under `roots`, but `others`: checkpoints that were on
    the volume before the run and are not the run's to count (a rerun's job's own)."""
    dirs = [d for r in roots if r.is_dir() for p in CHECKPOINT_DIRS for d in r.glob(p)]
    dirs = [d for d in dirs if d not in others]
    return len(dirs), sum(f.stat().st_size for d in dirs for f in d.rglob("*") if f.is_file())


def _run(root: Path, steps: list[int], keep: int, spare: Path | None, width: int,
         seen: list[tuple[int, int]], elsewhere: list[Path], others: list[Path]) -> None:  # fmt: skip
    """One run's saves as train.py's `_save_checkpoint` makes them, measuring the checkpoint
    directories on the volume (`root`, and `elsewhere`: the job's own directory beside a rerun's)
    after each call."""
    model, optimizer = _model(width)
    for step in steps:
        ckpt.stage(root, step=step, model=model, optimizer=optimizer)
        seen.append(_on_volume([root, *elsewhere], others))
        ckpt.publish(root, step=step, trainer_state={"consumed": step})
        seen.append(_on_volume([root, *elsewhere], others))
        ckpt.prune(root, keep=keep, spare=spare)
        seen.append(_on_volume([root, *elsewhere], others))


starts = st.sampled_from(["fresh", "auto", "older", "rerun"])


@pytest.mark.slow  # real DCP saves: ~50 ms each, some hundred of them
@settings(
    max_examples=30,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    keep_before=st.integers(1, 4),
    keep=st.integers(1, 4),
    saves_before=st.integers(1, 5),
    saves_after=st.integers(1, 6),
    start=starts,
    width=st.sampled_from([4, 16, 64]),
)
def test_the_count_is_the_most_checkpoints_the_trainer_keeps_at_once(
    one_rank, tmp_path, keep_before, keep, saves_before, saves_after, start, width
):
    """A first run saves `saves_before` times keeping `keep_before`; the second keeps `keep` and
    starts as `start` says: afresh (RESUME=never, in an empty directory), from `latest`
    (RESUME=auto), from the oldest checkpoint kept (a RESUME path: the steps it saves again replace
    the ones there), or as `job rerun` does (a directory of its own, resuming a checkpoint of the
    job's). The most directories on the volume at once never exceed the count, and reach it once
    the run has saved enough; and the bytes the job keeps on the volume are that count of
    checkpoints."""
    root = Path(tempfile.mkdtemp(dir=tmp_path)) / "job"  # tmp_path is one for all examples
    interval = 10
    first = [interval * (i + 1) for i in range(saves_before)]
    seen_first: list[tuple[int, int]] = []
    _run(root, first, keep_before, None, width, seen_first, [], [])
    kept = ckpt.complete_checkpoints(root)
    # one checkpoint's bytes
    one = max(_on_volume([root], [p for p in kept if p != k])[1] for k in kept)
    spare: Path | None = None
    where, elsewhere, others = root, [], []
    if start == "fresh":
        shutil.rmtree(root)
    elif start == "auto":
        spare = ckpt.choose_resume(root, "auto")
    elif start == "older":
        spare = kept[0]
    else:  # rerun: CHECKPOINT_SUBDIR reruns/<id>, RESUME the job's checkpoint the run started from
        spare, where, elsewhere = kept[0], root / "reruns" / "r1", [root]
        # on the volume before, and staying there: not in the need
        others = [p for p in kept if p != spare]
    present = len(ckpt.complete_checkpoints(where))
    at = int(spare.name.split("-")[1]) if spare else 0
    second = [at + interval * (i + 1) for i in range(saves_after)]
    seen: list[tuple[int, int]] = []
    _run(where, second, keep, spare, width, seen, elsewhere, others)

    count, why = volume.checkpoints_at_once(keep, resumes=spare is not None, present=present)
    most = max(n for n, _ in seen)
    assert most <= count, (seen, count, why)
    if saves_after >= keep + 1:  # enough saves for the worst moment to come
        assert most == count, (seen, count, why)
    # what the count stands for, in bytes: that many checkpoints (meta.json's step and time differ
    # by a few characters from one to the next)
    assert max(b for _, b in seen) <= count * (one + 64)
    assert max(n for n, _ in seen_first) == min(keep_before + 1, saves_before)  # a fresh run's
    assert ("resumed" in why) == (spare is not None and present + 1 <= keep + 2)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(
    model=st.sampled_from(["tiny", "7b", "13b", "70b"]),
    keep=st.integers(1, 6),
    resume=st.sampled_from(["auto", "never", "/fsx/checkpoints/fsdp/step-00000010", "/else/x"]),
    pvc=st.booleans(),
)
def test_the_need_follows_the_resume_setting_where_nothing_can_be_looked_at(
    model, keep, resume, pvc
):
    """On a cluster fsdpctl cannot look at the claim: RESUME=auto may resume (the job ran before:
    `job resume`, a second `job run`), so the need counts the checkpoint it would start from;
    RESUME=never does not; a RESUME path does when it is on the volume that holds the checkpoints
    (with CHECKPOINT_PVC, which then holds them instead of the shared volume, any path off the
    shared volume is taken to be on the claim). The bytes are that count of 12-byte-per-parameter
    checkpoints, the line that refuses a volume says why it counts so many, and the derived
    FSX_STORAGE_GIB holds them."""
    cfg = load(
        dotenv={
            "BACKEND": "eks",
            "AWS_ACCOUNT_ID": "123456789012",
            "INSTANCE_TYPE": "p5.48xlarge",
            "JOB_NODES": "16",
            "NODE_COUNT": "16",
            "MODEL": model,
            "CHECKPOINT_KEEP": str(keep),
            "RESUME": resume,
            "CHECKPOINT_PVC": "ckpt" if pvc else "",
        }
    )
    assert volume.could_resume(cfg) == (
        resume == "auto" or (resume.startswith("/") and (pvc or resume.startswith("/fsx/")))
    )
    n = volume.need(cfg)
    assert volume.default_fsx_gib(cfg) * volume.GIB * volume.FILL_AT_MOST >= n.total
    if pvc:
        assert n.checkpoints == 0 and n.total == n.cache + n.export
        return
    resumes = volume.could_resume(cfg)
    assert n.checkpoints == keep + 1 + resumes
    assert n.total == n.checkpoints * 12 * volume.params(cfg) + n.cache + n.export
    assert f"CHECKPOINT_KEEP={keep} + the one being saved" in n.parts()
    assert ("the one a resumed run started from" in n.parts()) == resumes


@pytest.mark.slow
def test_a_resumed_run_is_refused_a_volume_its_saves_would_fill(interpreter_reachable):  # noqa: F811
    """The case of issue 36, for real on the local backend (one torchrun launcher per simulated
    node, the claim a tmpfs of a few MB as in tests/test_lifecycle.py's full volume). A first run of
    the tiny model (CHECKPOINT_KEEP=1) saves at steps 4 and 8. A second `job run` with more steps
    resumes from step 8, which prune spares: from its second save on, three checkpoints are on the
    volume at once. On a claim that holds two, the old count (CHECKPOINT_KEEP + 1) let it start and
    its save at step 16 met ENOSPC; now admission refuses it with one line naming the three, and
    with --force the run meets exactly that full disk. The claim grown to hold three (tmpfs
    remount), the same resume is admitted and trains to its end."""
    if os.geteuid() != 0:
        pytest.skip("needs root: a tmpfs claim, network namespaces")
    from test_lifecycle import _env, _finish, _fsdpctl, _mount, _reachable_home, _umount

    home = _reachable_home()
    claim = home / "volumes" / "small-claim"
    ckpts = claim / "checkpoints" / "resumed"
    keys = ["--set", "JOB_NAME=resumed", "--set", "SHARED_VOLUME=small-claim"]
    more = [
        "--set",
        "CHECKPOINT_KEEP=1",
        "--set",
        "MAX_STEPS=24",
        "--set",
        "ALLOW_SETTING_CHANGES=true",
    ]
    try:
        _mount("tmpfs", claim, "size=30m", "mode=0755", "uid=0", "gid=0")
        env = _env(home)
        first = _fsdpctl(env, "job", "run", "-d", *keys, "--set", "CHECKPOINT_KEEP=1",
                         "--set", "MAX_STEPS=8")  # fmt: skip
        assert first.returncode == 0, first.stdout + first.stderr
        done = _finish(env, "resumed", claim, interpreter_reachable)
        assert done.report["phase"] == "Succeeded", done.report
        assert [p.name for p in ckpt.complete_checkpoints(ckpts)] == ["step-00000008"]

        refused = _fsdpctl(env, "job", "run", "-d", *keys, *more)
        assert refused.returncode == 2, refused.stdout + refused.stderr
        [line] = [x for x in refused.stderr.splitlines() if "small-claim" in x]
        assert "3 checkpoints of 10.6 MiB" in line and "the one a resumed run started from" in line

        forced = _fsdpctl(env, "job", "run", "-d", "--force", *keys, *more)
        assert forced.returncode == 0, forced.stdout + forced.stderr
        full = _finish(env, "resumed", claim, interpreter_reachable)
        assert full.report["phase"] == "Failed", full.report
        text = json.dumps(full.report["failure"])
        assert "checkpoint at step 16 failed" in text and "space" in text, text

        subprocess.run(["mount", "-o", "remount,size=40m", str(claim)], check=True)
        again = _fsdpctl(env, "job", "run", "-d", *keys, *more)
        assert again.returncode == 0, again.stdout + again.stderr
        ended = _finish(env, "resumed", claim, interpreter_reachable)
        assert ended.report["phase"] == "Succeeded", ended.report
        assert ended.report["step"] == 24
    finally:
        _fsdpctl(_env(home), "job", "stop", "resumed", timeout=300)
        _umount(claim)
        shutil.rmtree(home, ignore_errors=True)

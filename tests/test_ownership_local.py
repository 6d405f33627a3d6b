"""The local backend acts only on what fsdpctl can prove it owns (issue 42; docs/ownership.md).

Generated over verbs x owners: `cleanup`, `cleanup --checkpoints` (and `--force`, `--dry-run`),
`job run`, `job run --replace` and `job stop`, each against a job checkpoint directory on a
claim that is this home's job's, another home's (a second FSDPCTL_HOME on the same shared volume:
two laptops, one FSx), another job's of this home, or nobody's (no owner file: made before owner
files, or by hand). Invariant: only what this home's owner file names changes; everything else,
and the other home entirely, stays byte for byte; what is kept is one line naming its owner.

The peers: the real supervisor (tests/state_home.py builds ended jobs with it), the real `fsdpctl`
executable for `job run`/`job stop` (pods held back by FSDPCTL_LOCAL_START_DELAYS, so no torchrun
trains: the supervisor, the pre-step and the state are the real ones), and, as root, a bind mount
of one home's claim into the other's (`mount --bind`, as two machines mount one FSx; without root
the other home's files are written into this home's claim by the other home's own writer, and the
test says so). The owner model is SkyPilot's (`sky down` refuses a cluster whose user hash is not
the caller's: sky/backends/backend_utils.py check_owner_identity) and the kubelet's (it acts on a
pod's UID, not its name).

The submit-exactly-once cells (slow: two `job run`s and a stop each) interrupt `job run` with
SIGINT, SIGTERM or SIGKILL at each point of its submit (FSDPCTL_TEST_FAILPOINT: the intent written;
the supervisor started; the state recorded) and run it again: exactly one supervisor of the job
runs, and the job's state records it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests import state_home
from tests.invariants import snapshot, written

# out of the fast lane (it keeps under 2 minutes): beside the serial slow lane (conftest)
pytestmark = pytest.mark.slow

OWNERS = ("own", "another home's", "another job's", "no owner")
CLAIM = Path("volumes/fsx-claim")
JOB = "alpha"


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Iterator[Path]:
    """Two ended jobs (alpha, beta) started by the real supervisor in one home (~1 s)."""
    home = tmp_path_factory.mktemp("own-template") / "home"
    saved = {k: os.environ.get(k) for k in ("FSDPCTL_HOME", "FSDPCTL_LOCAL_NETNS")}
    os.environ.update(FSDPCTL_HOME=str(home), FSDPCTL_LOCAL_NETNS="0")
    try:
        state_home.build(home)
    finally:
        for k, v in saved.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    yield home


def _as_home(home: Path):
    """FSDPCTL_HOME=home for in-process calls to fsdpctl's own writers."""

    @contextlib.contextmanager
    def inside() -> Iterator[None]:
        before = os.environ.get("FSDPCTL_HOME")
        os.environ["FSDPCTL_HOME"] = str(home)
        try:
            yield
        finally:
            os.environ.pop("FSDPCTL_HOME") if before is None else os.environ.update(
                FSDPCTL_HOME=before
            )

    return inside()


@contextlib.contextmanager
def shared_claim(this: Path, other: Path) -> Iterator[bool]:
    """`other` home's claim mounted at `this` home's (as root: two machines, one FSx); yields whether
    it is a real mount. Unmounted on the way out."""
    (other / CLAIM).mkdir(parents=True, exist_ok=True)
    mounted = False
    if os.geteuid() == 0:
        for entry in (this / CLAIM).iterdir():  # the other home's volume holds this home's data too
            os.replace(entry, other / CLAIM / entry.name)
        done = subprocess.run(["mount", "--bind", str(other / CLAIM), str(this / CLAIM)])
        mounted = done.returncode == 0
    try:
        yield mounted
    finally:
        if mounted:
            subprocess.run(["umount", str(this / CLAIM)], check=True)


def _owned_by(home: Path, directory: Path, who: str) -> None:
    """Make `directory`'s owner file say `who`, written by the writer of the home that would write
    it (fsdpctl.backends.local.owned.claim / fsdpctl.job.owner.write_file)."""
    from fsdpctl.job import owner

    if who == "no owner":
        (directory / owner.OWNER_FILE).unlink(missing_ok=True)
        return
    job = "beta" if who == "another job's" else JOB
    with _as_home(home):
        owner.write_file(directory, owner.Owner(owner.home_id(), job, f"{job}-run-9"))


@contextlib.contextmanager
def two_homes(template: Path, root: Path, who: str) -> Iterator[tuple[Path, Path, Path]]:
    """Home B (the template's jobs, ended) and home A, sharing B's claim; alpha's checkpoint
    directory owned by `who`. Yields (B, A, the checkpoint directory as B sees it)."""
    b, a = root / "b" / "home", root / "a" / "home"
    state_home.copy(template, b)
    a.mkdir(parents=True)
    with shared_claim(b, a):
        ckpt = b / CLAIM / "checkpoints" / JOB
        assert (ckpt / ".fsdpctl-owner.json").is_file(), "the supervisor's start wrote none"
        _owned_by(a if who == "another home's" else b, ckpt, who)
        yield b, a, ckpt


def _other(a: Path) -> dict:
    """The other home's own files (its claim is the shared one: what of it is whose is the cells'
    checkpoint directory, asserted by itself)."""
    return {p: e for p, e in snapshot(a).items() if not p.is_relative_to(a / CLAIM)}


def _cleanup(cli, home: Path, *args: str):
    with _as_home(home):
        return cli(*args)


CLEANUPS = (
    ("cleanup", JOB, "--yes"),
    ("cleanup", JOB, "--checkpoints", "--yes"),
    ("cleanup", JOB, "--checkpoints", "--yes", "--force"),
    ("cleanup", JOB, "--checkpoints", "--dry-run"),
)


@pytest.mark.parametrize("who", OWNERS)
def test_cleanup_changes_only_what_this_home_owns(template, tmp_path, cli, monkeypatch, who):
    """Each cleanup form x each owner of the job's checkpoint directory: the job's own files in this
    home go (not with --dry-run); its checkpoints go only with --checkpoints and when its owner file
    names this home and the job (with --force also when it has none); another home's and another
    job's never; the other home is unchanged; each line names the owner."""
    monkeypatch.setenv("FSDPCTL_LOCAL_NETNS", "0")
    for n, args in enumerate(CLEANUPS):
        with two_homes(template, tmp_path / f"c{n}", who) as (b, a, ckpt):
            other_before, before = _other(a), snapshot(b)
            r = _cleanup(cli, b, *args)
            assert r.exit_code == 0, (args, r.output)
            after = snapshot(b)
            changed = {p for p in before if p not in after} | set(written(before, after))
            dry = "--dry-run" in args
            may_go = (
                not dry
                and "--checkpoints" in args
                and (who == "own" or (who == "no owner" and "--force" in args))
            )
            for p in changed:
                rel = p.relative_to(b).parts
                mine = rel[:2] == ("jobs", JOB) and not dry
                assert mine or (may_go and p.is_relative_to(ckpt)), (args, who, p)
            assert ckpt.is_dir() != may_go, (args, who, r.output)
            assert _other(a) == other_before, (args, who, "the other home changed")
            _lines_name_owners(r.stdout, ckpt, args, who, may_go)


def _lines_name_owners(out: str, ckpt: Path, args: tuple[str, ...], who: str, gone: bool) -> None:
    """Every line about a thing names its owner; the checkpoint directory's line says what became
    of it: removed / would remove when it may go, kept with why otherwise."""
    lines = [x for x in out.splitlines() if x.startswith(("removed ", "would remove ", "kept "))]
    assert lines and all("(owner: " in x for x in lines), (args, out)
    about = [x for x in lines if x.split(" (owner")[0].split(":")[0].endswith(str(ckpt))]
    if "--checkpoints" not in args:
        assert not about, (args, out)
        return
    assert len(about) == 1, (args, who, out)
    dry_ok = "--dry-run" in args and who == "own"
    if gone or dry_ok:
        assert about[0].startswith(("removed ", "would remove ")), (args, who, out)
    else:
        assert about[0].startswith("kept "), (args, who, out)
        assert ("rm -r" in about[0]) and ("--force" in about[0]) == (who == "no owner"), about


# ---- job run / --replace / stop: real `fsdpctl`, the pods held back -------------------------------


def _fsdpctl(home: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 90):
    from tests.conftest import FSDPCTL_EXE

    exe = [str(FSDPCTL_EXE)] if FSDPCTL_EXE.exists() else [sys.executable, "-m", "fsdpctl.cli"]
    full = {
        **os.environ,
        "FSDPCTL_HOME": str(home),
        "FSDPCTL_LOCAL_NETNS": "0",
        "FSDPCTL_LOCAL_START_DELAYS": "0=600,1=600",  # no torchrun: the supervisor waits
        **(env or {}),
    }
    return subprocess.run(
        [*exe, *args],
        env=full,
        cwd=home.parent,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def supervisors(home: Path, job: str) -> list[int]:
    """The live supervisors of `job` in `home`: processes whose argv is the supervisor's
    (`python -m fsdpctl.backends.local <job dir>`)."""
    want = ["-m", "fsdpctl.backends.local", str(home / "jobs" / job)]
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")
            zombie = (proc / "stat").read_text().split(") ")[1].startswith("Z")
        except OSError:
            continue
        if argv[1:4] == want and not zombie:
            found.append(int(proc.name))
    return found


def _ended(home: Path, job: str) -> None:
    """Stop whatever of the job runs and wait for its supervisors to go (a test leaves nothing)."""
    if supervisors(home, job):
        _fsdpctl(home, "job", "stop", job, timeout=120)
    deadline = time.monotonic() + 60
    while supervisors(home, job):
        assert time.monotonic() < deadline, "the job's supervisor did not end"
        time.sleep(0.1)


def _emptied(ckpt: Path) -> None:
    """The checkpoint directory with its owner file only (the template's step 4 is not one this
    job could resume: the owner decision is what is under test)."""
    for entry in ckpt.iterdir():
        if entry.name != ".fsdpctl-owner.json":
            state_home.shutil.rmtree(entry) if entry.is_dir() else entry.unlink()


@pytest.mark.slow  # ~4 s per owner: real `job run` and `job stop` processes
@pytest.mark.parametrize("who", OWNERS)
@pytest.mark.parametrize("replace", [False, True])
def test_job_run_writes_only_into_its_own_checkpoints(template, tmp_path, who, replace):
    """`job run` (and `--replace`) of alpha in home B whose checkpoint directory is `who`'s: another
    home's or job's is refused (exit 2, one line naming the owner and the owner file to remove,
    nothing written anywhere); its own starts; one with no owner file is adopted (the owner file
    names this home, job and the new run) and resumes as before. `job stop` then stops only B's own
    run."""
    from fsdpctl.job import owner

    with two_homes(template, tmp_path, who) as (b, a, ckpt):
        _emptied(ckpt)
        other_before, before = _other(a), snapshot(b)
        r = _fsdpctl(b, "job", "run", "-d", "-s", f"JOB_NAME={JOB}", *(["--replace"] * replace))
        try:
            if who in ("another home's", "another job's"):
                assert r.returncode == 2, r.stdout + r.stderr
                err = [x for x in r.stderr.splitlines() if x.startswith("error:")]
                assert len(err) == 1 and str(ckpt) in err[0] and "owner:" in err[0], r.stderr
                assert snapshot(b) == before and not supervisors(b, JOB)
            else:
                assert r.returncode == 0, r.stdout + r.stderr
                st = json.loads((b / "jobs" / JOB / "state.json").read_text())
                with _as_home(b):
                    mark = owner.read_file(ckpt)
                    assert (mark.home, mark.job, mark.run_id) == (
                        owner.home_id(),
                        JOB,
                        st["run_id"],
                    )
                assert supervisors(b, JOB)
            assert _other(a) == other_before
        finally:
            _ended(b, JOB)


def test_stop_stops_only_this_homes_job(template, tmp_path, cli, monkeypatch):
    """`job stop alpha` in home A, where alpha is B's (ended) and A has none: one line, nothing of
    B's changes; `job stop beta` in B (another job's name) leaves alpha's files alone."""
    monkeypatch.setenv("FSDPCTL_LOCAL_NETNS", "0")
    with two_homes(template, tmp_path, "own") as (b, a, _ckpt):
        before = snapshot(b)
        r = _cleanup(cli, a, "job", "stop", JOB)
        assert r.exit_code != 0 and "no " in r.stderr and "Traceback" not in r.output, r.output
        r = _cleanup(cli, b, "job", "stop", "beta")
        assert "Traceback" not in r.output, r.output
        assert snapshot(b) == before


# ---- submit exactly once: `job run` interrupted at each point of its submit -----------------------


@pytest.mark.slow  # ~8 s a cell: two `job run`s, a stop
@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM", "SIGKILL"])
@pytest.mark.parametrize("point", ["intent", "submitted", "recorded"])
def test_an_interrupted_job_run_then_another_runs_exactly_one(tmp_path, point, sig):
    """`job run` sent `sig` at `point` of its submit (FSDPCTL_TEST_FAILPOINT), then `job run` again:
    exactly one supervisor of the job runs, the state names its run and its pid, and no intent is
    left. The second run is either started (the first left nothing running: cancelled or never
    submitted) or refused as already running (the first's run was found by its token and recorded,
    fsdpctl.job.submit.settle)."""
    home = tmp_path / "home"
    home.mkdir()
    job = "once"
    try:
        first = _fsdpctl(
            home,
            "job",
            "run",
            "-d",
            "-s",
            f"JOB_NAME={job}",
            env={"FSDPCTL_TEST_FAILPOINT": f"{point}:{sig}"},
        )
        assert first.returncode != 0, first.stdout + first.stderr
        assert "Traceback" not in first.stderr, first.stderr
        second = _fsdpctl(home, "job", "run", "-d", "-s", f"JOB_NAME={job}")
        assert second.returncode in (0, 2), second.stdout + second.stderr
        if second.returncode == 2:  # the first's run, found by its token, recorded, and so running
            assert "found by its token and recorded" in second.stderr, second.stderr
            assert f"job {job} is running" in second.stderr, second.stderr
        sups = supervisors(home, job)
        assert len(sups) == 1, (point, sig, sups, first.stderr, second.stderr)
        st = json.loads((home / "jobs" / job / "state.json").read_text())
        assert st["supervisor_pid"] == sups[0], (st, sups)
        assert (home / "records" / job / f"{st['run_id']}.json").is_file()
        assert not (home / "jobs" / job / "submitting.json").exists()
    finally:
        _ended(home, job)


def test_the_failpoint_is_inert_unless_named(monkeypatch):
    """The test-only failpoint does nothing for another point, a signal it does not know, or unset
    (never a kill by a stray value)."""
    from fsdpctl.job import submit

    sent: list[int] = []
    monkeypatch.setattr(os, "kill", lambda pid, s: sent.append(s))
    for value in ("", "intent", "intent:SIGHUP", "submitted:SIGKILL", "x:SIGINT"):
        monkeypatch.setenv(submit.FAILPOINT_ENV, value)
        submit.failpoint("intent")
    assert sent == []
    monkeypatch.setenv(submit.FAILPOINT_ENV, "intent:SIGTERM")
    submit.failpoint("intent")
    assert sent == [signal.SIGTERM]


# ---- where the owner file goes ---------------------------------------------------------------------


@pytest.mark.parametrize("pvc", ["", "ck"])
@pytest.mark.parametrize("shared", ["fsx-claim", ""])
@pytest.mark.parametrize("subdir", ["", "r2", "a/b"])
def test_the_owner_file_goes_where_cleanup_looks(cli, pvc, shared, subdir):
    """For every placement of checkpoints (the shared volume, CHECKPOINT_PVC, pod-local) and any
    CHECKPOINT_SUBDIR: the owner file's directory is the job's own one on the claim, the directory
    `cleanup --checkpoints` derives and removes (state.checkpoint_dir), above the run's subdirectory;
    none without a claim (pod-local checkpoints are in this home's job directory, shared with nobody).
    A claim linked elsewhere gets none written through the link."""
    from fsdpctl import files
    from fsdpctl.backends.local import engine, owned
    from fsdpctl.job import owner, render
    from fsdpctl.settings import load

    flags = {"JOB_NAME": "jj", "CHECKPOINT_PVC": pvc, "SHARED_VOLUME": shared}
    flags |= {"CHECKPOINT_SUBDIR": subdir} | ({} if shared or pvc else {"JOB_NODES": "1"})
    *_, job = render.render_job(load(flags=flags), "r1", "x")
    spec = engine.spec_from_job(job, files.home() / "jobs" / "jj")
    found = owned.checkpoint_dir(spec, "jj")
    claim = pvc or shared
    if not claim:
        assert found is None
        return
    want = files.home() / "volumes" / claim / ("jj" if pvc else "checkpoints/jj")
    assert found == want
    assert engine.mapped_env(spec, 0)["CHECKPOINT_DIR"] == str(want / subdir if subdir else want)
    elsewhere = cli.home.parent / "elsewhere"
    elsewhere.mkdir()
    (files.home() / "volumes").mkdir(parents=True)
    (files.home() / "volumes" / claim).symlink_to(elsewhere)
    owned.claim(found, owner.Owner(owner.home_id(), "jj", "r1"))
    assert list(elsewhere.iterdir()) == []

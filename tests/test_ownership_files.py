"""Issue 42, the backend-neutral part: fsdpctl's own files, ids and the verbs that take a job.

Classes of bad input, generated (hypothesis, fixed seed, bounded), each with the invariant that must
hold for every case:

1. Writers (state, record, intent, owner file, the local kubelet's annotations, a download, a plot):
   a hard link, symbolic link, FIFO or directory planted at a temp name a writer could be guessed to
   use is never written through, truncated or waited on; the target ends a regular file with the
   text written. A job or run directory replaced by a symbolic link is refused (files.NotOurs), and
   through the CLI one line, exit 2.
2. JSON read back: nested past the limit (up to 200,000 deep) or too big: a damaged file, one line,
   exit 2; never RecursionError.
3. Bytes that are not UTF-8: from an outside program (the shell adapter's `capture` and `run`), in
   FSDPCTL_HOME (surrogate escapes, PEP 383), written to stdout and stderr: shown escaped, never an
   internal error.
4. Lock and file-system errors: read-only, full, no inodes, permission: said as that, never "remove
   the lock".
5. Ids and backends over every verb that takes a job or run id: a reused --run-id is refused on
   every backend; a run id two jobs share is answered naming both (JOB/RUN); a --backend that is not
   the job's own is refused for the verbs that act on the job, and nothing of the job changes.

Peers: the real file system (links, FIFOs, hard links made with os.link/os.mkfifo, behaving as
link(2), mkfifo(3) and rename(2) say: rename replaces a link, it does not follow it), real child
processes for the shell adapter (the adapter meets sbatch/scontrol/kubectl/git the same way: a pipe
of bytes), the in-process CLI (`cli` fixture) and, where the environment must carry raw bytes, the
real `fsdpctl` process. The EKS and Slurm cells never reach a cluster: every refusal here comes
before any backend is asked (that is the invariant).
"""

from __future__ import annotations

import errno
import json
import os
import signal
import stat
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import invoke

# out of the fast lane (it keeps under 2 minutes): beside the serial slow lane (conftest)
pytestmark = pytest.mark.slow

SETTINGS = settings(
    max_examples=12,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
BACKENDS = ("local", "slurm", "eks")


@contextmanager
def no_hang(seconds: float = 10.0) -> Iterator[None]:
    """A blocking call (open(2) of a FIFO with no reader) ends the test, not the run: SIGALRM
    raises in the main thread, which interrupts the call (PEP 475: a handler that raises is not
    retried)."""

    def ring(signum: int, frame: object) -> None:
        raise TimeoutError(f"blocked for {seconds} s")

    old = signal.signal(signal.SIGALRM, ring)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


@contextmanager
def fresh_home(tmp_path: Path) -> Iterator[Path]:
    """A new FSDPCTL_HOME for one generated case (the `cli` fixture's is one per test)."""
    import tempfile

    home = Path(tempfile.mkdtemp(dir=tmp_path)) / "home"
    old = os.environ["FSDPCTL_HOME"]
    os.environ["FSDPCTL_HOME"] = str(home)
    try:
        yield home
    finally:
        os.environ["FSDPCTL_HOME"] = old


# ---- 1. temp names and links --------------------------------------------------------------------


def _writers(home: Path) -> dict[str, tuple[Path, Callable[[], None]]]:
    """Each writer of fsdpctl's with the file it writes (under `home`)."""
    from fsdpctl import files
    from fsdpctl.backends.local import kubelet
    from fsdpctl.job import intent, owner, state

    jdir = home / "jobs" / "tj"
    run_dir = home / "volume" / "runs" / "r-1"
    mine = owner.Owner("0123456789abcdef", "tj", "r-1")
    return {
        "state": (jdir / state.NAME, lambda: state.write(jdir, _slurm_state("tj", "r-1"))),
        "atomic": (home / "x" / "f.json", lambda: files.write_atomic(home / "x" / "f.json", "{}")),
        "intent": (jdir / intent.NAME, lambda: intent.write(jdir, "slurm", mine)),
        "owner": (run_dir / owner.OWNER_FILE, lambda: owner.write_file(run_dir, mine)),
        "annotations": (
            home / "pod" / "annotations",
            lambda: kubelet.write_annotations(str(home / "pod"), {"a": "b"}),
        ),
    }


PLANTS = st.sampled_from(["hardlink", "symlink", "fifo", "directory"])
# the names writers used before (pid-based or fixed) and names a guesser would try
GUESSES = st.sampled_from(
    [".{name}.{pid}.tmp", ".{name}.tmp", "{name}.{pid}.tmp", ".{name}.{pid1}.tmp"]
)


def _plant_at(at: Path, kind: str, victim: Path) -> None:
    if kind == "hardlink":
        os.link(victim, at)
    elif kind == "symlink":
        at.symlink_to(victim)
    elif kind == "fifo":
        os.mkfifo(at)
    else:
        at.mkdir()


@SETTINGS
@given(
    writer=st.sampled_from(["state", "atomic", "intent", "owner", "annotations"]),
    kind=PLANTS,
    guess=GUESSES,
)
def test_a_thing_planted_at_a_temp_name_is_never_written_through_or_waited_on(
    cli, tmp_path, writer, kind, guess
):
    """mkstemp(3): the name is random and the file is made with O_EXCL (Python's tempfile adds
    O_NOFOLLOW), so nothing made beforehand at any name is opened. The victim a hard link or
    symbolic link leads to keeps its bytes; a FIFO is never opened (the old writer's open(2) for
    writing blocked with no reader: fifo(7))."""
    with fresh_home(tmp_path) as home:
        victim = home.parent / "victim"
        victim.write_text("precious")
        target, write = _writers(home)[writer]
        target.parent.mkdir(parents=True, exist_ok=True)
        at = target.parent / guess.format(name=target.name, pid=os.getpid(), pid1=os.getpid() + 1)
        _plant_at(at, kind, victim)
        planted = os.lstat(at)
        with no_hang():
            write()
    assert victim.read_text() == "precious"
    assert stat.S_ISREG(os.lstat(target).st_mode) and os.lstat(target).st_nlink == 1
    now = os.lstat(at)  # still there, the same thing, untouched
    assert (now.st_ino, now.st_mode, now.st_size) == (
        planted.st_ino,
        planted.st_mode,
        planted.st_size,
    )
    left = [p.name for p in target.parent.iterdir() if p.name.endswith(".tmp") and p != at]
    assert left == [], left  # no temp file of the writer's left behind


@SETTINGS
@given(
    kind=st.sampled_from(["symlink", "fifo", "directory"]), via=st.sampled_from(["run", "spawn"])
)
def test_a_link_or_fifo_at_a_log_path_is_refused_not_followed_or_waited_on(
    cli, tmp_path, kind, via
):
    """Logs are appended to (O_APPEND), not replaced: a symbolic link there was followed (a file
    elsewhere appended to), a FIFO with no reader blocked open(2) for writing (fifo(7)). Now
    O_NOFOLLOW|O_NONBLOCK and a check on the descriptor: NotOurs at once, the victim untouched,
    nothing started."""
    from fsdpctl import files
    from fsdpctl.adapters import shell

    with fresh_home(tmp_path) as home:
        victim = home.parent / "victim"
        victim.write_text("precious")
        log = home / "jobs" / "lg" / "logs" / "r-1" / "node-0.log"
        log.parent.mkdir(parents=True)
        _plant_at(log, kind, victim)
        with no_hang(), pytest.raises(files.NotOurs):
            if via == "run":
                shell.run(shell.Command(["true"], {}), log_file=log)
            else:
                shell.spawn(["true"], env=dict(os.environ), log=log).wait()
        assert victim.read_text() == "precious"


@SETTINGS
@given(writer=st.sampled_from(["state", "intent", "owner"]))
def test_a_job_or_run_directory_replaced_by_a_link_is_refused_not_written_through(
    cli, tmp_path, writer
):
    """A job directory (under FSDPCTL_HOME) or a run directory (on a shared volume) that is a
    symbolic link now: fsdpctl made no link, so nothing is written where it leads."""
    from fsdpctl import files

    with fresh_home(tmp_path) as home:
        elsewhere = home.parent / "elsewhere"
        elsewhere.mkdir()
        target, write = _writers(home)[writer]
        target.parent.parent.mkdir(parents=True)
        target.parent.symlink_to(elsewhere)
        with pytest.raises(files.NotOurs, match="symbolic link"):
            write()
    assert list(elsewhere.iterdir()) == []


def test_a_job_directory_that_is_a_link_is_one_line_exit_2_through_the_cli(cli, tmp_path):
    """`job stop`, `job status` and `job run` of a job whose directory is a link: its state is not
    read, nor its lock, intent or state made, through it: one line naming the link, exit 2, nothing
    made where it leads."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "state.json").write_text(json.dumps(_slurm_state("ln", "r-1")))
    (cli.home / "jobs").mkdir(parents=True)
    (cli.home / "jobs" / "ln").symlink_to(elsewhere)
    run = ["--set", "JOB_NAME=ln", "--set", "MODEL=tiny", "job", "run", "-d"]
    for verb in (["job", "stop", "ln"], ["job", "status", "ln"], run):
        r = invoke(*verb)
        assert r.exit_code == 2, r.output
        assert "symbolic link" in r.said and "internal error" not in r.output
    assert sorted(p.name for p in elsewhere.iterdir()) == ["state.json"]


# ---- 2. JSON with size and depth limits ----------------------------------------------------------

DEPTHS = st.one_of(st.integers(65, 3000), st.sampled_from([200_000]))


@SETTINGS
@given(
    depth=DEPTHS,
    opener=st.sampled_from(["[", '{"a":']),
    verb=st.sampled_from(
        [("job", "status"), ("job", "stop"), ("job", "history"), ("job", "describe")]
    ),
)
def test_json_nested_past_the_limit_is_a_damaged_file_one_line_exit_2(cli, depth, opener, verb):
    """CPython's json recurses once per level (Modules/_json.c, Py_EnterRecursiveCall): 200,000
    levels ended in RecursionError, an internal error. fsdpctl measures the depth first: a file
    nested past JSON_MAX_DEPTH is damaged, named in one line, exit 2."""
    from fsdpctl.job import store

    close = "]" if opener == "[" else "}"
    deep = (opener * depth + "1" + close * depth).encode()
    jdir = cli.home / "jobs" / "deep"
    jdir.mkdir(parents=True, exist_ok=True)
    (jdir / "state.json").write_bytes(deep)
    rec = store.path("deep", "r-1")
    rec.parent.mkdir(parents=True, exist_ok=True)
    rec.write_bytes(deep)
    r = invoke(*verb, "deep")
    assert r.exit_code == 2, r.output
    assert "nests deeper than" in r.said and "internal error" not in r.output
    assert "Recursion" not in r.output


@SETTINGS
@given(depth=st.integers(0, 64), width=st.integers(0, 3))
def test_json_within_the_limit_reads_as_json_does(depth, width):
    """The depth scanner never refuses what fsdpctl writes: any document up to the limit, strings
    holding brackets and escaped quotes included, parses as json.loads parses it."""
    from fsdpctl import files

    doc: object = ['[{\\"]', "x" * width]
    for i in range(depth - 1):
        doc = {'k"[': doc} if i % 2 else [doc, "}"]
    data = json.dumps(doc).encode()
    assert files.json_depth(data) == max(depth, 1)
    assert files.loads(data) == json.loads(data)


def test_a_state_over_the_size_limit_is_named_not_read(cli):
    """A state, record or placement is kilobytes: one over files.STATE_MAX_BYTES (a sparse file
    here: its size is what is checked, on the descriptor, before any read) is damaged, one line
    with its size, exit 2."""
    from fsdpctl import files

    jdir = cli.home / "jobs" / "big"
    jdir.mkdir(parents=True)
    with open(jdir / "state.json", "wb") as f:
        f.truncate(files.STATE_MAX_BYTES + 1)
    r = invoke("job", "status", "big")
    assert r.exit_code == 2 and "over the" in r.said and "state.json" in r.said, r.output


# ---- 3. bytes that are not UTF-8 ---------------------------------------------------------------

BYTES = st.binary(min_size=1, max_size=64).filter(lambda b: _not_utf8(b))


def _not_utf8(b: bytes) -> bool:
    try:
        b.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


@SETTINGS
@given(raw=BYTES)
def test_an_outside_program_printing_bytes_that_are_not_utf8_is_read_escaped(tmp_path, raw):
    """What sbatch, scontrol, kubectl or git print reaches fsdpctl as a pipe of bytes
    (subprocess(3)); one that is not UTF-8 was a UnicodeDecodeError in the middle of a verb. The
    shell adapter reads it as UTF-8 with each bad byte shown escaped (`\\xff`), whatever the
    locale."""
    from fsdpctl.adapters import shell

    out = tmp_path / "out.bin"
    out.write_bytes(raw + b"\n")
    got = shell.capture(["cat", str(out)], timeout=30)
    assert got.rc == 0 and got.stdout == raw.decode("utf-8", "backslashreplace") + "\n"
    lines: list[str] = []
    rc = shell.run(
        shell.Command(["cat", str(out)], {}), log_file=tmp_path / "log", on_line=lines.append
    )
    assert rc == 0 and lines == [raw.decode("utf-8", "backslashreplace")]


@SETTINGS
@given(raw=BYTES, stream=st.sampled_from(["stdout", "stderr"]))
def test_text_with_surrogate_escapes_is_written_escaped_to_any_stream(raw, stream, monkeypatch):
    """A path or value Python decoded with surrogateescape (PEP 383: FSDPCTL_HOME with a byte that
    is not UTF-8) cannot be encoded by any stream: sys.stdout raised UnicodeEncodeError. Written
    through fsdpctl's streams it is shown as the byte it was."""
    import io

    from fsdpctl.cli import streams

    text = "path " + raw.decode("utf-8", "surrogateescape")
    sink = io.TextIOWrapper(io.BytesIO(), encoding="utf-8")
    monkeypatch.setattr(sys, stream, sink)
    streams.reset()
    streams.write(stream, text)  # type: ignore[arg-type]
    shown = sink.buffer.getvalue().decode("utf-8")  # type: ignore[attr-defined]
    assert shown == streams.escape_surrogates(text)
    assert not streams.SURROGATES.search(shown)
    streams.reset()


@SETTINGS
@given(raw=BYTES)
def test_a_path_byte_that_is_not_utf8_is_written_back_as_that_byte(cli, raw):
    """A file fsdpctl writes that names a path (a Slurm batch script, a spec) under a home whose
    path has a byte that is not UTF-8: the byte is written as it was (surrogateescape, PEP 383),
    so the file names the very path; never an internal error."""
    from fsdpctl import files

    name = os.fsdecode(raw.replace(b"/", b"_").replace(b"\0", b"_"))
    target = cli.home / "w" / "script.sh"
    files.write_atomic(target, f"cd /x/{name}\n")
    assert target.read_bytes() == b"cd /x/" + os.fsencode(name) + b"\n"


HOME_VERBS = [
    ("job", "list"),
    ("job", "list", "-o", "json"),
    ("job", "status", "nu"),
    ("job", "status", "nu", "-o", "json"),
    ("job", "stop", "nu"),
    ("job", "history", "nu"),
    ("job", "describe", "nu"),
    ("cleanup", "--dry-run"),
    ("cleanup", "nu", "--dry-run"),
]
SHOW_THE_PATH = {
    ("job", "status", "nu"),
    ("job", "stop", "nu"),
    ("job", "status", "nu", "-o", "json"),
}


def _home_not_utf8(root: Path, damaged: bool) -> bytes:
    home = os.fsencode(root) + b"/h\xff\xfeome"
    if damaged:
        os.makedirs(home + b"/jobs/nu")
        with open(home + b"/jobs/nu/state.json", "wb") as f:
            f.write(b"[" * 100 + b"]" * 100)
    return home


@pytest.mark.parametrize("damaged", [False, True])
def test_a_home_whose_path_is_not_utf8_is_shown_escaped_by_every_verb(cli, tmp_path, damaged):
    """FSDPCTL_HOME with bytes that are not UTF-8 (Python gives them as surrogate escapes, PEP
    383; os.environ takes them back as the same bytes): every verb exits with its own code and
    says the path escaped, never an internal error. `damaged`: a state.json there, so the path is
    printed."""
    home = _home_not_utf8(tmp_path, damaged)
    os.environ["FSDPCTL_HOME"] = os.fsdecode(home)  # the cli fixture restores it
    for verb in HOME_VERBS:
        r = invoke(*verb)
        assert r.exit_code in (0, 2, 4), (verb, r.output)
        assert "internal error" not in r.output and not streams_surrogates(r.output), verb
        if damaged and verb in SHOW_THE_PATH:
            assert "h\\xff\\xfeome" in r.output, (verb, r.output)


def streams_surrogates(text: str) -> bool:
    from fsdpctl.cli import streams

    return streams.SURROGATES.search(text) is not None


@pytest.mark.slow
def test_a_home_whose_path_is_not_utf8_in_a_real_process(cli, tmp_path):
    """The same in the real `fsdpctl` process (the environment carries the raw bytes; stdout and
    stderr are the process's own, strict UTF-8 for stdout): all it writes is UTF-8, the byte
    escaped."""
    import subprocess

    env = {os.fsencode(k): os.fsencode(v) for k, v in cli.env().items()}
    env[b"FSDPCTL_HOME"] = _home_not_utf8(tmp_path, True)
    for verb in (("job", "status", "nu"), ("job", "list")):
        p = subprocess.run(
            cli.argv(*verb), env=env, capture_output=True, timeout=120, stdin=subprocess.DEVNULL
        )
        said = (p.stdout + p.stderr).decode("utf-8")  # all of it UTF-8: escaped, not raw bytes
        assert p.returncode in (0, 2), (verb, said)
        assert "internal error" not in said and "h\\xff\\xfeome" in said, (verb, said)


# ---- 4. lock and file-system errors -------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "words"),
    [
        (errno.EROFS, "read-only"),
        (errno.ENOSPC, "no space"),
        (errno.EDQUOT, "quota"),
        (errno.EACCES, "permission denied"),
    ],
)
def test_a_lock_the_file_system_refuses_says_what_is_wrong_not_remove_the_lock(
    cli, monkeypatch, code, words
):
    """open(2) of the lock failing with EROFS, ENOSPC, EDQUOT or EACCES (the errors a read-only,
    full or foreign file system gives) is the file system's fault: the line says which and the
    hint never says to remove the lock (there is nothing wrong with it)."""
    from fsdpctl.job import lock

    jdir = cli.home / "jobs" / "fs"
    jdir.mkdir(parents=True)
    real_open = os.open

    def refusing(path, flags, mode=0o777, **kw):
        if str(path).endswith("/lock"):
            raise OSError(code, os.strerror(code), str(path))
        return real_open(path, flags, mode, **kw)

    monkeypatch.setattr(os, "open", refusing)
    with pytest.raises(lock.Unwritable) as got:
        with lock.held(jdir):
            pass
    assert words in str(got.value) and "remove" not in (got.value.hint or "")
    assert isinstance(got.value, lock.CorruptLock)  # cleanup passes over it as over a bad lock


@pytest.mark.parametrize("code", [errno.EACCES, errno.EPERM])
def test_a_state_the_user_may_not_read_is_not_called_damaged_or_to_be_removed(
    cli, monkeypatch, code
):
    """open(2) of a job's state.json failing with EACCES or EPERM (another user's job, a mount's
    permissions; faked here: the tests run as root, whom permission bits do not stop): the file
    may be whole, so the line says access, and the hint never says to remove the job's directory
    (which would lose its logs)."""
    from fsdpctl.job import state

    jdir = cli.home / "jobs" / "perm"
    state.write(jdir, _slurm_state("perm", "r-1"))
    real_open = os.open

    def refusing(path, flags, mode=0o777, **kw):
        if str(path).endswith("/state.json"):
            raise OSError(code, os.strerror(code), str(path))
        return real_open(path, flags, mode, **kw)

    monkeypatch.setattr(os, "open", refusing)
    r = invoke("job", "status", "perm")
    assert r.exit_code == 2 and "cannot be read" in r.said, r.output
    assert "remove" not in r.said and "internal error" not in r.output, r.output


def test_no_inodes_is_told_apart_from_no_space(monkeypatch, tmp_path):
    """ENOSPC is both (open(2)); statvfs(3)'s f_favail says there are no inodes left."""
    from fsdpctl import files

    class Full:
        f_files, f_favail = 1000, 0

    monkeypatch.setattr(os, "statvfs", lambda p: Full())
    said = files.fs_error(OSError(errno.ENOSPC, "No space left on device"), tmp_path)
    assert said is not None and "no inodes" in said


def test_a_lock_that_really_is_not_a_file_still_says_remove_it(cli):
    """The one case the hint names the lock: something else is at its path (a FIFO)."""
    from fsdpctl.job import lock

    jdir = cli.home / "jobs" / "ff"
    jdir.mkdir(parents=True)
    os.mkfifo(jdir / "lock")
    with no_hang(), pytest.raises(lock.CorruptLock) as got:
        with lock.held(jdir):
            pass
    assert not isinstance(got.value, lock.Unwritable) and "remove" in (got.value.hint or "")


# ---- 5. ids and backends ------------------------------------------------------------------------


def _slurm_state(job: str, run_id: str) -> dict:
    return {
        "job": job,
        "backend": "slurm",
        "run_id": run_id,
        "created": time.time(),
        "slurm_job": 4242,
        "nodes": 1,
        "max_restarts": 0,
    }


def _state(backend: str, job: str, run_id: str, home: Path) -> dict:
    base = {"job": job, "backend": backend, "run_id": run_id, "created": time.time()}
    if backend == "slurm":
        return _slurm_state(job, run_id)
    if backend == "local":
        return {
            **base,
            "phase": "Stopped",
            "replicas": 1,
            "log_dir": str(home / "jobs" / job / "logs" / run_id),
            "checkpoint_dir": None,
            "launchers": [],
        }
    return base


def _plant(job: str, run_id: str, backend: str, home: Path) -> dict:
    """A job recorded here as `job run` leaves it: its state and its run's record."""
    from fsdpctl.job import record, state
    from fsdpctl.job import store as record_store
    from fsdpctl.settings import load

    state.write(home / "jobs" / job, _state(backend, job, run_id, home))
    cfg = load(dotenv={"JOB_NAME": job, "BACKEND": backend})
    rec = record.build(
        cfg, run_id=run_id, code={}, image=None, created=time.time(), secret_name="s"
    )
    record_store.save(rec)
    return rec


def _snapshot(home: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(home)): p.read_bytes()
        for p in sorted(home.rglob("*"))
        if p.is_file() and not p.is_symlink() and p.name != "lock"
    }


# every verb that acts on an existing job, with --backend FLAG
ACTING = [
    lambda j, f: ("job", "stop", j, "--backend", f),
    lambda j, f: ("cleanup", j, "--yes", "--backend", f),
    lambda j, f: ("job", "resume", j, "--backend", f, "-d"),
    lambda j, f: ("job", "rerun", j, "--backend", f, "-d"),
]


@pytest.mark.parametrize("verb", range(len(ACTING)))
@pytest.mark.parametrize(("own", "flag"), [(a, b) for a in BACKENDS for b in BACKENDS if a != b])
def test_a_backend_flag_that_is_not_the_jobs_own_is_refused_and_nothing_changes(
    cli, own, flag, verb
):
    """`job stop sx --backend eks` on a Slurm job said "nothing to stop", exit 0, and marked the
    Slurm state stop-requested; `job resume sr --backend eks` resumed a Slurm job on EKS. For every
    verb that acts on a job and every pair of backends that differ: one line naming the job, its
    backend and the flag, exit 2, and no byte of the home changes. (With the job's own backend the
    verb goes on to the backend: not asserted here.)"""
    job = f"bj-{own}"
    if not (cli.home / "jobs" / job).exists():
        _plant(job, f"{job}-r1", own, cli.home)
    before = _snapshot(cli.home)
    args = ACTING[verb](job, flag)
    if args[0] == "cleanup" and "--yes" in args:
        args = tuple(a for a in args if a != "--yes") + ("--dry-run",)
    r = invoke(*args)
    assert r.exit_code == 2, (args, r.output)
    assert job in r.said and own in r.said and flag in r.said, (args, r.output)
    assert "internal error" not in r.output
    assert _snapshot(cli.home) == before, args


@pytest.mark.parametrize("verb", ["status", "logs"])
def test_a_reading_verb_with_another_backend_says_which_backend_holds_the_job(cli, verb):
    """`job status`/`job logs` with a --backend that is not the job's look where the flag says (a
    job of that name another home started there may be meant), and say in a warning where this
    home's job of that name runs; nothing changes."""
    _plant("rs", "rs-r1", "slurm", cli.home)
    before = _snapshot(cli.home)
    r = invoke("job", verb, "rs", "--backend", "local")
    assert "was started here on slurm" in r.said and "--backend local" in r.said, r.output
    assert "internal error" not in r.output
    assert _snapshot(cli.home) == before


def test_the_core_refuses_a_stop_on_another_backend_than_the_state_names(cli):
    """Not only the CLI: runner.stop given a backend that is not the one the job's state names
    (a caller that resolved it wrong) refuses, and the state is not marked stop-requested."""
    from fsdpctl import backends
    from fsdpctl.errors import FsdpctlError
    from fsdpctl.job import runner, state
    from fsdpctl.settings import load

    _plant("sx", "sx-r1", "slurm", cli.home)
    eks = backends.create(load(dotenv={"BACKEND": "eks", "JOB_NAME": "sx"}))
    with pytest.raises(FsdpctlError, match="runs on slurm"):
        runner.stop(eks, "sx", wait=False, dry_run=False)
    st = state.read(cli.home / "jobs" / "sx")
    assert st is not None and "stop_requested" not in st


@pytest.mark.parametrize("dry", [False, True])
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_reused_run_id_is_refused_on_every_backend(cli, backend, dry):
    """A run id names one run of a job (its record, history line, logs): `--run-id` of one the job
    has is refused before anything is written, dry run or not, whatever the backend (the core's
    submit.unique_run_id, on the path every start takes: run, rerun, resume, quickstart)."""
    job = f"ri-{backend}"
    if not (cli.home / "jobs" / job).exists():
        _plant(job, "r-1", backend, cli.home)
    before = _snapshot(cli.home)
    shared = cli.home.parent / "fsx"  # Slurm's shared file system: must exist where fsdpctl runs
    shared.mkdir(exist_ok=True)
    args = ["--set", f"JOB_NAME={job}", "--set", f"SHARED_VOLUME_PATH={shared}"]
    args += ["--set", "IMAGE_REGISTRY=registry.example.com"]  # EKS: pods pull from one
    args += ["job", "run", "--backend", backend, "--run-id", "r-1", "-d"]
    r = invoke(*args, *(["--dry-run"] if dry else []))
    assert r.exit_code == 2, r.output
    assert "already has a run with this id" in r.said, r.output
    assert _snapshot(cli.home) == before


@SETTINGS
@given(
    jobs=st.lists(st.sampled_from(["ja", "jb", "jc"]), min_size=2, max_size=3, unique=True),
    verb=st.sampled_from(["describe", "diff", "rerun", "resume"]),
)
def test_a_run_id_two_jobs_share_is_answered_with_both_never_one(cli, jobs, verb):
    """`job describe`/`diff` of an id two jobs share silently picked one. Now: refused, naming
    every job's run as JOB/RUN (exit 2); JOB/RUN names one, and describe answers with that one."""
    for job in jobs:
        if not (cli.home / "records" / job / "shared-1.json").exists():
            _plant(job, "shared-1", "local", cli.home)
    args = {
        "describe": ("job", "describe", "shared-1"),
        "diff": ("job", "diff", "shared-1", f"{jobs[0]}/shared-1"),
        "rerun": ("job", "rerun", "shared-1", "--dry-run"),
        "resume": ("job", "resume", "shared-1", "--dry-run"),
    }[verb]
    r = invoke(*args)
    assert r.exit_code == 2, r.output
    for job in jobs:
        if (cli.home / "records" / job / "shared-1.json").exists():
            assert f"{job}/shared-1" in r.said, r.output
    one = invoke("job", "describe", f"{jobs[-1]}/shared-1", "-o", "json")
    assert one.exit_code == 0, one.output
    assert json.loads(one.stdout)["job"] == jobs[-1]

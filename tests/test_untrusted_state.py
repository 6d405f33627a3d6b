"""What fsdpctl reads back is untrusted input (issue 29): every file under a job's state directory,
its run record and its logs, damaged, swapped or replaced, under every verb that reads them.

The state directory is made by fsdpctl's own writers (tests/state_home.py: two local jobs run by the
real supervisor, `alpha` succeeded and `beta` failed, their records and placements as `job run`
writes them). Then one of `alpha`'s files is harmed and every reading verb runs in process (click's
runner) under a deadline. The harms are what a file system can hand a reader: a FIFO (fifo(7):
open(2) for reading blocks until a writer opens it, so a reader that opens one without O_NONBLOCK
hangs), a symbolic link (to the other job's file, to /dev/zero, which never ends, to a directory
outside the home, or to nothing), a file cut short (a crash mid-write on a file system that does not
order the rename after the data), emptied, a directory in its place, bytes that are not UTF-8, a 300
MiB sparse file, the file of a newer version, and the other job's file in its place. A generated
part writes hostile JSON values into each key of each JSON file (wrong types, NaN, huge numbers,
paths outside the home, FIFOs, the identity of a live process that is not the job's) and generated
event lines into the logs.

Invariants for each verb: it returns before its deadline; its exit code is a documented one and no
`internal error`; a failure is one line that names the harmed file; it writes nothing when it fails;
the other job is listed and reported as before and none of its files changes; nothing is deleted but
what `cleanup` may delete (docs/local.md "What `cleanup` may delete"); and no process that is not the job's
receives a signal (a decoy `sleep` whose exact identity the hostile states name stays alive).

`FSDPCTL_TEST_STATE_COLLECT=1` runs every case and prints the count of each broken invariant instead
of stopping at the first (the issue's before/after numbers come from it)."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import state_home
from conftest import CliResult, invoke
from invariants import DOCUMENTED, JOB_WAIT, TRACEBACK, error_lines, snapshot, written

DEADLINE_S = int(
    os.environ.get("FSDPCTL_TEST_STATE_DEADLINE", "20")
)  # per command: a reader blocked on a FIFO never returns
HUGE = (
    300 * 1024 * 1024
)  # sparse: costs no disk, only the time and memory of whoever reads it whole
COLLECT = os.environ.get("FSDPCTL_TEST_STATE_COLLECT") == "1"


# ---- the verbs that read a job's files ---------------------------------------------------------------------


PNG = "alpha.png"  # `job plot --out`, in the working directory (the same words in every case)


def verbs() -> list[tuple[str, ...]]:
    """Every verb that reads what a local job left: its state, logs, record, placement. `cleanup`
    last (it deletes); `job stop` of an ended job signals nothing, of a hostile state must signal
    nothing foreign."""
    return [
        ("job", "list"),
        ("job", "list", "-o", "json"),
        ("job", "status", "alpha"),
        ("job", "status", "beta"),
        ("job", "logs", "alpha", "--all"),
        ("job", "logs", "alpha", "-o", "json", "--tail", "2", "--since", "1h"),
        ("job", "describe", "alpha", "-o", "json"),
        ("job", "describe", "alpha-run-1", "-o", "env"),
        ("job", "diff", "alpha", "beta"),
        ("job", "history", "alpha", "-o", "json"),
        ("job", "resume", "alpha", "--dry-run"),
        ("job", "rerun", "alpha", "--dry-run", "--allow-drift"),
        ("job", "plot", "alpha", "--out", PNG),
        ("job", "tensorboard", "alpha", "--print-only"),
        ("job", "wait", "alpha", "--timeout", "1"),
        ("job", "stop", "alpha"),
        ("cleanup", "--dry-run"),
        ("cleanup", "--checkpoints", *_yes()),
    ]


@functools.cache
def _yes() -> tuple[str, ...]:
    """`--yes` where `cleanup` asks before it deletes (it has the option), so that it deletes here."""
    import typer.main

    from fsdpctl.cli import app

    cleanup = typer.main.get_command(app).commands["cleanup"]
    return ("--yes",) if any("--yes" in p.opts for p in cleanup.params) else ()


# ---- the harms ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class World:
    home: Path
    outside: Path  # a directory beside the home, holding a canary: nothing may delete or change it
    decoy: dict  # identity of a live process that is no job's


def _replace(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()


def _counterpart(path: Path, home: Path) -> Path:
    """The other job's file in the same place (alpha -> beta in every part of the path under the
    home)."""
    return home / str(path.relative_to(home)).replace("alpha", "beta")


def fifo(path: Path, w: World) -> None:
    _replace(path)
    os.mkfifo(path)


def link_other_job(path: Path, w: World) -> None:
    target = _counterpart(path, w.home)
    _replace(path)
    path.symlink_to(target)


def link_dev_zero(path: Path, w: World) -> None:
    _replace(path)
    path.symlink_to("/dev/zero")


def link_outside(path: Path, w: World) -> None:
    """Moved outside the home and linked back: reading through it works; deleting through it must
    not."""
    dest = w.outside / "moved" / path.name
    dest.parent.mkdir(exist_ok=True)
    shutil.move(str(path), dest)
    path.symlink_to(dest)


def dangling(path: Path, w: World) -> None:
    _replace(path)
    path.symlink_to(w.outside / "nothing-here")


def truncated(path: Path, w: World) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def emptied(path: Path, w: World) -> None:
    if path.is_dir():
        _replace(path)
    path.write_bytes(b"")


def directory(path: Path, w: World) -> None:
    _replace(path)
    path.mkdir()


def not_utf8(path: Path, w: World) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2] + b"\xff\xfe\xc3(" + data[len(data) // 2 :])


def huge(path: Path, w: World) -> None:
    if path.is_dir():
        _replace(path)
    with open(path, "wb") as fh:
        fh.truncate(HUGE)


def newer_version(path: Path, w: World) -> None:
    """A JSON file as a later fsdpctl might write it (version 99, a key this one does not know); a
    log whose event lines come from a newer trainer (an unknown kind, fields renamed)."""
    if path.suffix == ".json":
        data = json.loads(path.read_text())
        data.update(version=99, written_by="fsdpctl 99")
        path.write_text(json.dumps(data))
    elif path.suffix == ".log":
        text = path.read_text().replace('{"event":"step",', '{"event":"step2","v":2,')
        path.write_text(text.replace('"loss":', '"loss_v2":'))


def other_job(path: Path, w: World) -> None:
    """The other job's file copied in its place (a record of beta where alpha's is, beta's
    state...)."""
    src = _counterpart(path, w.home)
    _replace(path)
    if src.is_dir():
        shutil.copytree(src, path, symlinks=True)
    else:
        shutil.copy(src, path)


HARMS: dict[str, Callable[[Path, World], None]] = {
    f.__name__: f
    for f in (
        fifo,
        link_other_job,
        link_dev_zero,
        link_outside,
        dangling,
        truncated,
        emptied,
        directory,
        not_utf8,
        huge,
        newer_version,
        other_job,
    )
}


# what only makes sense for a file's contents
CONTENT_HARMS = ("truncated", "not_utf8", "newer_version")


def harmable(home: Path) -> list[Path]:
    """Every file and directory of job alpha: under its job directory (its state, which holds its
    placement, and its lock among them) and its records."""
    roots = [home / "jobs" / "alpha", home / "records" / "alpha"]
    found = [p for r in roots for p in sorted(r.rglob("*"))] + roots
    return sorted(found, key=lambda p: (len(p.parts), str(p)), reverse=True)


# ---- running one verb, and what must hold ------------------------------------------------------------------


class Hang(BaseException):
    """Not an Exception: the CLI's last-resort handler must not turn it into an exit code."""


def _alarm(signum, frame):
    raise Hang(f"no answer within {DEADLINE_S} s")


MEMORY_ROOM = (
    3 * 1024**3
)  # what one verb may add to the address space: a reader of /dev/zero stops there


def run(*args: str):
    """One verb in process under the deadline, its address space capped (setrlimit(2) RLIMIT_AS: an
    allocation past it fails with ENOMEM, a MemoryError) so that a reader of an endless file fails
    alone instead of taking the machine's memory; both put back after."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    used = int(Path("/proc/self/statm").read_text().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    cap = used + MEMORY_ROOM if hard == resource.RLIM_INFINITY else min(hard, used + MEMORY_ROOM)
    previous = signal.signal(signal.SIGALRM, _alarm)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    signal.alarm(DEADLINE_S)
    try:
        return invoke(*args, catch_exceptions=True)
    except Hang as e:
        return CliResult(-1, "", "", "", e)
    finally:
        signal.alarm(0)
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
        signal.signal(signal.SIGALRM, previous)


def may_delete(path: Path, home: Path, args: tuple[str, ...]) -> bool:
    """What `cleanup` may delete (docs/local.md "What `cleanup` may delete"): an ended job's files under
    FSDPCTL_HOME/jobs/<job>/ but its lock, and with --checkpoints its directory under the claim's
    checkpoints/. Nothing else, by any verb; nothing outside the home."""
    if args[0] != "cleanup" or "--dry-run" in args:
        return False
    rel = path.relative_to(home).parts if path.is_relative_to(home) else ()
    if len(rel) >= 3 and rel[0] == "jobs" and rel[2] != "lock":
        return True
    return (
        "--checkpoints" in args
        and rel[:3] == ("volumes", "fsx-claim", "checkpoints")
        and len(rel) >= 4
    )


def broken(
    args: tuple[str, ...], result, before: dict, after: dict, harmed: Path, baseline: dict, w: World
) -> list[tuple[str, str]]:
    """The invariants one finished verb broke: (class, what was seen) each."""
    said = f"rc={result.exit_code} stderr={result.stderr[-600:]!r}"
    if isinstance(result.exception, Hang):
        return [("hang", said)]
    found = []
    allowed = JOB_WAIT if args[:2] == ("job", "wait") else DOCUMENTED
    if "internal error" in result.stderr or (
        result.exception is not None and not isinstance(result.exception, SystemExit)
    ):
        found.append(("internal error", f"{said} {result.exception!r}"))
    elif result.exit_code not in allowed:
        found.append(("undocumented exit code", said))
    if TRACEBACK in result.stderr:  # (a log's own text on stdout may hold one: beta's does)
        found.append(("traceback", said))
    errors = error_lines(result.stderr)
    if len(errors) > 1:
        found.append(("more than one error line", said))
    same_as_before = result.exit_code == baseline[args]
    if (
        result.exit_code not in (0, *([3] if args[:2] == ("job", "wait") else []))
        and not same_as_before
    ):
        said_lines = errors + [x for x in result.stderr.splitlines() if x.startswith("warning:")]
        # a directory of alpha's emptied or filled with the other job's: what was asked for is not
        # there
        gone = (
            result.exit_code == 4
            and harmed.is_dir()
            and not any("alpha" in p.name for p in harmed.iterdir())
        )
        if not gone and not any(str(harmed) in line for line in said_lines):
            found.append(("a failure that does not name the harmed file", f"{harmed}: {said}"))
    changed = written(before, after)
    if result.exit_code != 0 and changed:
        found.append(("a failed verb wrote", f"{[str(p) for p in changed[:3]]}: {said}"))
    gone = [p for p in before if p not in after and not may_delete(p, w.home, args)]
    gone = [
        p for p in gone if not (p == harmed or harmed in p.parents)
    ]  # the harm's own debris, moved
    if gone:
        found.append(("deleted what it does not own", str([str(p) for p in gone[:3]])))
    beta = [p for p in changed if "beta" in p.parts or p.name == "beta.json"]
    if beta and args[0] != "cleanup" and "beta" not in args:
        found.append(("changed the other job's files", str([str(p) for p in beta[:3]])))
    if args[:2] == ("job", "list") and (result.exit_code != 0 or "beta" not in result.stdout):
        found.append(("the other job is not listed", said))
    if args == ("job", "status", "beta") and result.exit_code != baseline[args]:
        found.append(("the other job's status changed", said))
    if not _alive(w.decoy):
        found.append(("signalled a process that is not the job's", " ".join(args)))
    return found


def _alive(ident: dict) -> bool:
    from fsdpctl.backends.local import engine as local

    return local.same_process(ident)


# ---- the world each case runs in ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Iterator[Path]:
    """The two jobs' state directory, built once (real supervisor, ~1 s)."""
    root = tmp_path_factory.mktemp("state-template")
    home = root / "home"
    saved = {k: os.environ.get(k) for k in ("FSDPCTL_HOME", "FSDPCTL_LOCAL_NETNS")}
    os.environ.update(FSDPCTL_HOME=str(home), FSDPCTL_LOCAL_NETNS="0")
    try:
        state_home.build(home)
    finally:
        for k, v in saved.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    yield home


@pytest.fixture
def decoy() -> Iterator[dict]:
    """A live process that is no job's: hostile states name its exact identity; it must outlive them
    all."""
    from fsdpctl.backends.local import engine as local

    proc = subprocess.Popen(["sleep", "600"])
    deadline = time.monotonic() + 10
    while (ident := local.identity(proc.pid)) is None:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    yield ident
    proc.kill()
    proc.wait()


@pytest.fixture
def room(tmp_path, monkeypatch, cli):
    """The isolated CLI of tests/conftest.py, loopback, with a closed port for every network
    endpoint."""
    monkeypatch.setenv("FSDPCTL_LOCAL_NETNS", "0")
    return tmp_path


@contextlib.contextmanager
def world(template: Path, root: Path, decoy: dict, n: int) -> Iterator[World]:
    case = root / f"case-{n}"
    home, outside = case / "home", case / "outside"
    outside.mkdir(parents=True)
    (outside / "canary.txt").write_text("nothing may delete or change me\n")
    state_home.copy(template, home)
    os.environ["FSDPCTL_HOME"] = str(home)
    try:
        yield World(home, outside, decoy)
    finally:
        shutil.rmtree(case, ignore_errors=True)  # unlinks FIFOs and links, never follows them


_BASELINE: dict[Path, dict] = {}


def baseline_codes(template: Path, root: Path, decoy: dict) -> dict:
    """Each verb's exit code on the undamaged state (once per template): a harm that does not touch
    what a verb reads may leave it failing as before (tensorboard of a job without TENSORBOARD_DIR),
    and need not name the harm then."""
    if template not in _BASELINE:
        codes = {}
        for args in verbs():
            with world(template, root, decoy, 0):
                codes[args] = run(*args).exit_code
        _BASELINE[template] = codes
    return _BASELINE[template]


def run_all(w: World, harmed: Path, baseline: dict) -> dict[str, list[tuple[str, str]]]:
    """Every verb on the harmed world, in order (cleanup last); the broken invariants by verb."""
    watched = (w.home, w.outside, Path(PNG).resolve())
    out: dict[str, list[tuple[str, str]]] = {}
    for args in verbs():
        before = snapshot(*watched)
        result = run(*args)
        after = snapshot(*watched)
        TALLY[_outcome(result)] += 1
        if problems := broken(args, result, before, after, harmed, baseline, w):
            out[" ".join(args)] = problems
    return out


TALLY: Counter = (
    Counter()
)  # how each verb run ended, over a test: what the counts come from


def _outcome(result) -> str:
    if isinstance(result.exception, Hang):
        return "hung"
    if "internal error" in result.stderr:
        return "internal error (exit 1)"
    return f"exit {result.exit_code}"


def tally_line(cases: int) -> str:
    return f"{cases} harmed states, {sum(TALLY.values())} verb runs: " + ", ".join(
        f"{k} {v}" for k, v in sorted(TALLY.items())
    )


def report(failures: dict[str, list[tuple[str, str]]]) -> str:
    """One line per class of broken invariant with its count, then the first few cases."""
    classes = Counter(c for ps in failures.values() for c, _ in ps)
    head = "\n".join(f"  {n:5d}  {c}" for c, n in classes.most_common())
    shown = list(failures.items())[: 400 if COLLECT else 15]
    first = "\n".join(f"{case}: {ps[0][0]}: {ps[0][1][:300]}" for case, ps in shown)
    return f"{sum(classes.values())} broken invariants:\n{head}\n{first}"


# ---- the tests ---------------------------------------------------------------------------------------------


def test_the_template_is_what_fsdpctl_writes(template, room, decoy):
    """The undamaged state reads back whole: every verb exits as expected (0, tensorboard 2 as the
    job had no TENSORBOARD_DIR), so any later failure is the harm's."""
    codes = baseline_codes(template, room, decoy)
    assert {a: c for a, c in codes.items() if c != 0} == {
        ("job", "tensorboard", "alpha", "--print-only"): 2
    }
    names = {p.name for p in harmable(template)}
    assert {
        "state.json",
        "spec.json",
        "lock",
        "node-0.log",
        "alpha-run-1.json",
    } <= names


def _cases(template: Path) -> list[tuple[str, str]]:
    return [
        (str(p.relative_to(template)), h)
        for p in harmable(template)
        for h in HARMS
        if not (p.is_dir() and h in CONTENT_HARMS)
    ]


FAST_CASES = [
    ("jobs/alpha/state.json", "fifo"),
    ("jobs/alpha/logs/alpha-run-1/node-0.log", "fifo"),
    ("records/alpha/alpha-run-1.json", "fifo"),
    ("jobs/alpha/lock", "fifo"),
    ("jobs/alpha/state.json", "other_job"),
    ("records/alpha/alpha-run-1.json", "truncated"),
    ("jobs/alpha/logs/alpha-run-1/node-0.log", "link_dev_zero"),
    ("jobs/alpha", "link_outside"),
]


def _run_cases(template, root, decoy, cases) -> dict[str, list[tuple[str, str]]]:
    baseline = baseline_codes(template, root, decoy)
    TALLY.clear()
    failures: dict[str, list[tuple[str, str]]] = {}
    for n, (rel, harm) in enumerate(cases, start=1):
        with world(template, root, decoy, n) as w:
            HARMS[harm](w.home / rel, w)
            for verb, problems in run_all(w, w.home / rel, baseline).items():
                failures[f"{harm} {rel} | {verb}"] = problems
                if not COLLECT:
                    raise AssertionError(report(failures))
    print(f"\nstate: {tally_line(len(cases))}", file=sys.stderr)
    return failures


@pytest.mark.slow
def test_a_few_harms_under_every_verb(template, room, decoy):
    """The issue's own cases, on their own: a FIFO in place of the state, a log, the record and the
    placement record; the other job's state; a cut record; a log that is /dev/zero; the whole job
    directory moved outside (the fast lane has the FIFO state:
    `test_a_fifo_state_under_every_verb`)."""
    failures = _run_cases(template, room, decoy, FAST_CASES)
    assert not failures, report(failures)


@pytest.mark.slow
def test_every_file_harmed_every_way_under_every_verb(template, room, decoy):
    """Every file and directory of the job x every harm x every verb (about 2,100 commands, in
    process)."""
    failures = _run_cases(template, room, decoy, _cases(template))
    assert not failures, report(failures)


# ---- generated hostile contents ----------------------------------------------------------------------------


def _json_paths(value, prefix=()) -> list[tuple]:
    """Every key path in a JSON document (into objects and lists)."""
    found = [prefix] if prefix else []
    if isinstance(value, dict):
        for k, v in value.items():
            found += _json_paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            found += _json_paths(v, (*prefix, i))
    return found


def hostile(w: World) -> st.SearchStrategy:
    """Values a damaged or hostile file may hold where fsdpctl expects something else. Every path
    among them is inside the case's own directory: run against an fsdpctl that deletes what a state
    names (as `cleanup --checkpoints` once did), a value such as "/" would have it delete the
    machine."""
    fifo_path = w.outside / "a-fifo"
    return st.one_of(
        st.none(),
        st.booleans(),
        st.integers(min_value=-(2**70), max_value=2**70),
        st.floats(allow_nan=True, allow_infinity=True),
        st.text(max_size=30).filter(
            lambda s: "[/" not in s
        ),  # rich markup in log lines: issue 28's
        st.lists(st.integers(), max_size=3),
        st.dictionaries(st.text(max_size=5), st.integers(), max_size=3),
        st.sampled_from(
            [
                str(w.outside),
                str(w.outside / "canary.txt"),
                str(fifo_path),
                str(
                    w.outside / "zero"
                ),  # a link to /dev/zero: no value names anything outside the case
                str(w.home.parent),
                "../../..",
                str(w.home),
                str(w.home / "volumes" / "fsx-claim"),
                str(w.home / "jobs" / "beta"),
                "beta",
                "beta-run-1",
                dict(w.decoy),
                w.decoy["pid"],
                [dict(w.decoy, node=0, rc=None)],
                "Running",
                "Orphaned",
            ]
        ),
    )


def _set(doc, path: tuple, value):
    target = doc
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value


EVENT_FIELDS = st.dictionaries(
    st.sampled_from(
        [
            "step",
            "max_steps",
            "loss",
            "time",
            "tokens_per_s",
            "step_time_s",
            "node_rank",
            "hostname",
            "world",
        ]
        + [
            "steps",
            "start_step",
            "losses",
            "final_loss",
            "record_id",
            "path",
            "dataset",
            "tokenizer",
        ]
    ),
    st.one_of(
        st.none(),
        st.integers(-(2**70), 2**70),
        st.floats(allow_nan=True),
        st.text(max_size=8).filter(lambda s: "[/" not in s),
        st.lists(st.floats(allow_nan=True), max_size=3),
    ),
    max_size=8,
)


@st.composite
def event_line(draw) -> str:
    from fsdptrain import events

    kind = draw(st.sampled_from([*events.KINDS, "other"]))
    fields = draw(EVENT_FIELDS)
    text = json.dumps({"event": kind, **fields}, allow_nan=True)
    return text[: draw(st.integers(len(text) // 2, len(text)))] if draw(st.booleans()) else text


def _hostile_case(data, template: Path, root: Path, decoy: dict, n: int, baseline: dict) -> dict:
    with world(template, root, decoy, n) as w:
        os.mkfifo(w.outside / "a-fifo")
        (w.outside / "zero").symlink_to("/dev/zero")
        target = data.draw(
            st.sampled_from(
                ["jobs/alpha/state.json", "jobs/alpha/spec.json", "records/alpha/alpha-run-1.json"]
                + ["jobs/alpha/lock", "jobs/alpha/logs/alpha-run-1/node-0.log"]
                + ["jobs/alpha/logs/alpha-run-1/node-1.log"]
            ),
            label="file",
        )
        path = w.home / target
        if path.suffix == ".json":
            doc = json.loads(path.read_text())
            for _ in range(data.draw(st.integers(1, 3), label="changes")):
                key = data.draw(st.sampled_from(_json_paths(doc)), label="key")
                _set(doc, key, data.draw(hostile(w), label=f"value of {key}"))
                if not isinstance(doc, dict):
                    break
            path.write_text(json.dumps(doc, allow_nan=True))
        else:
            lines = path.read_text().splitlines()
            for _ in range(data.draw(st.integers(1, 4), label="lines")):
                at = data.draw(st.integers(0, len(lines)))
                lines.insert(at, data.draw(event_line(), label="event line"))
            path.write_text("\n".join(lines) + "\n")
        return run_all(w, path, baseline)


HOSTILE_EXAMPLES = int(os.environ.get("FSDPCTL_TEST_STATE_EXAMPLES", "20"))


def _hostile(template, root, decoy, examples: int) -> dict[str, list[tuple[str, str]]]:
    baseline = baseline_codes(template, root, decoy)
    TALLY.clear()
    failures: dict[str, list[tuple[str, str]]] = {}
    counter = iter(range(1, 10**6))

    @settings(
        max_examples=examples,
        derandomize=True,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
        phases=[__import__("hypothesis").Phase.generate],
    )
    @given(st.data())
    def one(data):
        found = _hostile_case(data, template, root, decoy, next(counter), baseline)
        for verb, problems in found.items():
            failures[f"hostile #{len(failures)} | {verb}"] = problems
        if found and not COLLECT:
            raise AssertionError(report(failures))

    one()
    print(f"\nhostile: {tally_line(examples)}", file=sys.stderr)
    return failures


def test_a_fifo_state_under_every_verb(template, room, decoy):
    """The issue's first case in the fast lane: state.json a FIFO hung describe, list, status and
    logs."""
    failures = _run_cases(template, room, decoy, [("jobs/alpha/state.json", "fifo")])
    assert not failures, report(failures)


def test_generated_hostile_values_in_every_json_file_and_log(template, room, decoy):
    """Two generated cases in the fast lane (the slow lane runs more)."""
    failures = _hostile(template, room, decoy, 2)
    assert not failures, report(failures)


@pytest.mark.slow
def test_generated_hostile_values_many(template, room, decoy):
    failures = _hostile(template, room, decoy, HOSTILE_EXAMPLES)
    assert not failures, report(failures)


# ---- what may be deleted and signalled: trust, not what a file says ----------------------------------------


def _run_ok(*args: str):
    result = run(*args)
    assert not isinstance(result.exception, Hang), args
    assert "internal error" not in result.stderr and TRACEBACK not in result.stderr, result.stderr
    return result


def test_a_copied_home_reads_its_own_files_and_cleans_only_itself(template, room, decoy):
    """`cp -a` of a home keeps the absolute paths its states recorded (the old home's). In the copy
    every verb reads the copy's own logs and records, and `cleanup --checkpoints` deletes the copy's
    jobs and checkpoints, never a file of the original home (statefile.in_home moves each recorded
    path into the home it is read in)."""
    original = room / "original" / "home"
    state_home.copy(template, original)  # the home the jobs ran in
    copied = room / "copied" / "home"
    shutil.copytree(original, copied, symlinks=True)  # cp -a: the states still name `original`
    before = snapshot(original)
    os.environ["FSDPCTL_HOME"] = str(copied)
    status = _run_ok("job", "status", "alpha", "-o", "json")
    assert status.exit_code == 0 and json.loads(status.stdout)["leader_log"].startswith(str(copied))
    assert json.loads(status.stdout)["checkpoint_dir"] == str(
        copied / "volumes/fsx-claim/checkpoints/alpha"
    )
    assert _run_ok("job", "logs", "alpha", "--all").exit_code == 0
    assert _run_ok("job", "describe", "alpha").exit_code == 0
    cleaned = _run_ok("cleanup", "--checkpoints", *_yes())
    assert cleaned.exit_code == 0, cleaned.stderr
    assert not (copied / "volumes/fsx-claim/checkpoints/alpha").exists()
    assert not (copied / "jobs/alpha/state.json").exists()
    assert snapshot(original) == before, "cleanup in the copy changed the original home"


HOSTILE_CHECKPOINTS = {
    "outside the home": lambda w: str(w.outside),
    "the claim's root": lambda w: str(w.home / "volumes" / "fsx-claim"),
    "the claim's checkpoints": lambda w: str(w.home / "volumes" / "fsx-claim" / "checkpoints"),
    "the other job's": lambda w: str(w.home / "volumes" / "fsx-claim" / "checkpoints" / "beta"),
    "the home": lambda w: str(w.home),
    "a walk out with ..": lambda w: str(
        w.home / "volumes/fsx-claim/checkpoints/alpha/../../../../../outside"
    ),
    "the records": lambda w: str(w.home / "records" / "alpha"),
    "the directory holding the home": lambda w: str(w.home.parent),
}


@pytest.mark.parametrize("where", list(HOSTILE_CHECKPOINTS))
def test_cleanup_deletes_only_the_checkpoints_it_derives(template, room, decoy, where):
    """A state naming any other directory as the job's checkpoints (`cleanup --checkpoints` deleted
    what state.json named): the job's own files go, the named directory stays, one warning names the
    state file. The other job is held (its lock taken, as by a `job run` starting it), so only alpha
    is cleaned."""
    import fcntl

    with world(template, room, decoy, 1) as w:
        state_file = w.home / "jobs" / "alpha" / "state.json"
        state = json.loads(state_file.read_text())
        named = HOSTILE_CHECKPOINTS[where](w)
        state["checkpoint_dir"] = named
        state_file.write_text(json.dumps(state))
        fd = os.open(w.home / "jobs" / "beta" / "lock", os.O_RDWR)
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            keep = {
                p: e
                for p, e in snapshot(w.home, w.outside).items()
                if not may_delete(p, w.home, ("x",))
            }
            keep = {p: e for p, e in keep.items() if "alpha" not in p.relative_to(room).parts[2:4]}
            result = _run_ok("cleanup", "--checkpoints", *_yes())
        finally:
            os.close(fd)
        after = snapshot(w.home, w.outside)
        assert result.exit_code == 0, result.stderr
        assert not state_file.exists() and (w.home / "volumes/fsx-claim/checkpoints/alpha").is_dir()
        lost = [str(p) for p in keep if p not in after]
        assert not lost, f"cleanup deleted {lost[:5]}"
        warned = [x for x in result.stderr.splitlines() if x.startswith("warning:")]
        assert any(str(state_file) in x and "kept" in x for x in warned), result.stderr


def _sleeper(env: dict[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], env=env)


def _identity_of(proc: subprocess.Popen) -> dict:
    from fsdpctl.backends.local import engine as local

    deadline = time.monotonic() + 10
    while (ident := local.identity(proc.pid)) is None or not local.environ_of(proc.pid):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    return ident


def test_job_stop_signals_only_processes_that_prove_they_are_the_jobs(template, room, decoy):
    """`job stop` of a job whose supervisor is gone stops its orphans: only processes proven the
    run's (`local.is_ours`: this boot, started no earlier than the recorded supervisor, the job's
    mark and the run's own token), as runc tells a container's init by its start time and the
    kubelet's runtime finds a container's processes by a membership only its descendants inherit.
    Planted, each must survive: a process whose only tie is an inherited FSDPCTL_JOB; one with both
    marks but started before the run's supervisor; the decoy, named by its exact identity as
    supervisor and launcher. A process that proves itself (both marks, started after the supervisor)
    is stopped, and the job ends Stopped."""
    from fsdpctl.backends.local import engine as local

    with world(template, room, decoy, 1) as w:
        jdir = w.home / "jobs" / "alpha"
        token = "a" * 32
        pod = {local.POD_MARK: f"{jdir}/alpha-run-1/node-0"}  # what a launcher of node 0 carries
        marks = {local.JOB_MARK: str(jdir), local.RUN_MARK: token, **pod}
        early = _sleeper({**os.environ, **marks})  # before the run's supervisor: not the run's
        _identity_of(early)
        time.sleep(0.05)
        supervisor = _sleeper()
        sup_ident = _identity_of(supervisor)
        supervisor.kill()
        supervisor.wait()
        time.sleep(0.05)
        inherited = _sleeper(
            {**os.environ, local.JOB_MARK: str(jdir), **pod}
        )  # the variables, not the token
        orphan = _sleeper(
            {**os.environ, **marks}
        )  # descended from the run (as far as can be proven)
        try:
            for p in (inherited, orphan):
                _identity_of(p)
            state = json.loads((jdir / "state.json").read_text())
            state |= {"phase": "Running", "mark": token, "supervisor": sup_ident, "finished": None}
            state["launchers"] = [{"node": 0, **decoy, "rc": None, "relaunches": 0}]
            state.pop("finished")
            (jdir / "state.json").write_text(json.dumps(state))
            listed = _run_ok("job", "status", "alpha", "-o", "json")
            assert json.loads(listed.stdout)["phase"] == "Orphaned", listed.stdout
            stopped = _run_ok("job", "stop", "alpha")
            assert stopped.exit_code == 0 and "Stopped" in stopped.stderr, stopped.stderr
            assert orphan.wait(30) is not None
            for p, what in ((early, "started before the run"), (inherited, "the variable alone")):
                assert p.poll() is None, f"job stop signalled a process with {what}"
            assert _alive(decoy)
        finally:
            for p in (early, inherited, orphan):
                p.kill()
                p.wait()


# ---- exit codes and words as documented --------------------------------------------------------------------


def test_a_job_whose_only_record_is_cut_is_that_file_named_not_no_record(template, room, decoy):
    """`job describe`/`diff`/`rerun` of a job whose one record was cut short said "no run record"
    (exit 4, the code for a job with none): the record is there, damaged. One line naming it, exit
    2; a job with no record at all stays exit 4."""
    with world(template, room, decoy, 1) as w:
        rec = w.home / "records" / "alpha" / "alpha-run-1.json"
        rec.write_bytes(rec.read_bytes()[:100])
        for args in (
            ("job", "describe", "alpha"),
            ("job", "diff", "alpha", "beta"),
            ("job", "rerun", "alpha"),
        ):
            result = _run_ok(*args)
            errors = error_lines(result.stderr)
            assert result.exit_code == 2 and len(errors) == 1 and str(rec) in errors[0], (
                args,
                result.stderr,
            )
        none = _run_ok("job", "describe", "gamma")
        assert none.exit_code == 4 and "no run record for 'gamma'" in none.stderr


def test_describe_takes_yaml_and_rerun_takes_dry_run_as_the_readme_promises(template, room, decoy):
    """README: every command that reports takes -o table|json|yaml, every command that changes state takes
    --dry-run. `job describe -o yaml` is the same document as -o json; `job rerun --dry-run` prints what it
    would start (the launchers) and writes nothing: no record, no job directory, no process."""
    import yaml

    from fsdpctl.backends.local import engine as local

    with world(template, room, decoy, 1) as w:
        as_json = _run_ok("job", "describe", "alpha", "-o", "json")
        as_yaml = _run_ok("job", "describe", "alpha", "-o", "yaml")
        assert as_yaml.exit_code == 0 and yaml.safe_load(as_yaml.stdout) == json.loads(
            as_json.stdout
        )
        before = snapshot(w.home)
        dry = _run_ok("job", "rerun", "alpha", "--dry-run", "--allow-drift")
        assert dry.exit_code == 0, dry.stderr
        assert "node 0:" in dry.stdout and "nothing was created" in dry.stderr
        assert not written(before, snapshot(w.home)) and not local.job_processes("alpha")


@pytest.mark.parametrize("command", [["job", "run"], ["deploy", "etcd"]], ids=" ".join)
def test_dry_run_and_server_dry_run_together_are_refused_not_one_picked(cli, command):
    """kubectl takes one --dry-run value; fsdpctl silently ran one of the two. Now one line, exit 2,
    and nothing contacted or written."""
    for both in (["--dry-run", "--dry-run=server"], ["--dry-run=server", "--dry-run=client"]):
        result = cli(*command, *both)
        assert result.exit_code == 2 and len(error_lines(result.stderr)) == 1, result.output
        assert "--dry-run and --dry-run=server" in result.stderr and not cli.home.exists()

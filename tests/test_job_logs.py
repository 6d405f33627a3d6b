"""`job logs` as `kubectl logs` behaves: --tail, --since, --timestamps, the source prefix with
--all, human lines for the trainer's events and -o json; the CRI log format the local pods' output
is written in; `job list` filters; -o json on job run/stop/wait; dynamic shell completion.

Sources: kubectl's logs command (kubernetes/kubectl pkg/cmd/logs/logs.go: --tail default -1 meaning
all and refused below -1; --since a Go duration; --prefix `[pod/NAME/CONTAINER] `), the kubelet's
reading of the runtime's files (kubernetes pkg/kubelet/kuberuntime/logs/logs.go: NewLogOptions turns
tailLines/sinceSeconds/ sinceTime into a tail of the file then a time filter; timestamps as
types.RFC3339NanoFixed), containerd's CRI log writer (pkg/cri/io/logger.go: `<RFC3339Nano> <stream>
<F|P> <line>`, P for pieces of a line longer than max_container_log_line_size, 16 KiB by default),
and apimachinery's label selectors (pkg/labels/selector.go: =, ==, != joined by commas, all must
hold; a missing label satisfies !=).
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import sys
import time

import pytest

from fsdpctl.adapters import shell
from fsdpctl.job import crilog
from test_golden import GOLDEN, check

# 2026-01-02T03:04:05.123456789Z: fixed log times make whole outputs comparable
T0 = 1767323045.123456789
RFC = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{9}Z")
STEP = (
    '{"event":"step","step":%d,"max_steps":4,"loss":%.4f,"step_time_s":0.5,"time":%f,'
    '"tokens_per_s":1000.0}'
)
LEADER = '{"event":"leader","node_rank":0,"hostname":"node-0","world":2,"time":%f}'


# --- the CRI log format (pure) ---------------------------------------------------------------------------


def test_rfc3339_has_nine_fraction_digits_and_reads_back_any_precision():
    """The kubelet prints RFC3339NanoFixed; containerd writes RFC3339Nano (trailing zeros dropped):
    both read back to the same instant, within a nanosecond (float seconds), for times across
    decades."""
    rng = random.Random(7)
    for _ in range(300):
        t = rng.uniform(0, 4e9)
        fixed = crilog.rfc3339(t)
        assert RFC.fullmatch(fixed), fixed
        assert abs(crilog.parse_time(fixed) - t) < 1e-6
        trimmed = fixed[:-1].rstrip("0").rstrip(".") + "Z"  # Go's RFC3339Nano of the same time
        assert abs(crilog.parse_time(trimmed) - crilog.parse_time(fixed)) < 1e-9
    assert crilog.rfc3339(T0).startswith("2026-01-02T03:04:05.1234")
    assert crilog.rfc3339(0.5) == "1970-01-01T00:00:00.500000000Z"
    assert crilog.parse_time("2026-01-02T04:04:05+01:00") == crilog.parse_time(
        "2026-01-02T03:04:05Z"
    )


def test_cri_lines_round_trip_and_partial_pieces_join():
    """Any text (spaces, tabs, JSON, unicode, a line that looks like a CRI line itself) survives
    format then parse; P pieces join to the line they start, with the first piece's time; a log cut
    after a P piece still yields what there is."""
    rng = random.Random(3)
    alphabet = 'ab c\t{}":,é✓' + "2026-01-02T03:04:05Z stdout F "
    for _ in range(200):
        texts = [
            "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 40))) for _ in range(5)
        ]
        raw = "".join(
            crilog.format_line(T0 + i, rng.choice(crilog.STREAMS), x) for i, x in enumerate(texts)
        )
        assert [line.text for line in crilog.lines(raw.splitlines())] == texts
    pieces = [
        crilog.format_line(T0, "stdout", "ab", "P"),
        crilog.format_line(T0 + 1, "stdout", "cd", "P"),
    ]
    end = crilog.format_line(T0 + 2, "stdout", "ef")
    [joined] = crilog.lines("".join([*pieces, end]).splitlines())
    assert (joined.text, joined.time) == ("abcdef", pytest.approx(T0))
    done, held = crilog.complete("".join(pieces).splitlines())
    assert done == [] and len(held) == 2  # a follower waits for the line's last piece
    assert [x.text for x in crilog.lines("".join(pieces).splitlines())] == ["abcd"]
    plain = crilog.lines(["not a cri line", "2026-13-45T99:99:99Z stdout F bad time"])
    assert [(x.text, x.time) for x in plain] == [
        ("not a cri line", None),
        ("2026-13-45T99:99:99Z stdout F bad time", None),
    ]


def test_pieces_join_within_their_stream_when_the_other_stream_comes_between():
    """containerd runs one redirectLogs per stream into the same file, so while stdout's long line
    is in pieces stderr's lines can land between them; the kubelet (ReadLogs) hands each entry to
    its own stream's writer, so each stream reads back as written. Generated interleavings, read
    whole and as a follower reading every prefix: each stream's lines in their order, joined right,
    none lost or doubled."""
    rng = random.Random(5)
    for _ in range(150):
        streams: dict[str, list[str]] = {}
        raws_by: dict[str, list[str]] = {}
        for stream in crilog.STREAMS:
            texts = [
                "".join(rng.choice("ab✓é ") for _ in range(rng.randrange(0, 9))) for _ in range(4)
            ]
            streams[stream], raws_by[stream] = texts, []
            for text in texts:
                cuts = sorted(
                    rng.sample(range(len(text) + 1), k=min(len(text) + 1, rng.randrange(0, 3)))
                )
                parts = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
                for i, part in enumerate(parts):
                    tag = crilog.FULL if i == len(parts) - 1 else crilog.PARTIAL
                    raws_by[stream].append(crilog.format_line(T0, stream, part, tag).rstrip("\n"))
        merged, queues = [], {k: list(v) for k, v in raws_by.items()}
        while any(queues.values()):
            merged.append(queues[rng.choice([k for k, q in queues.items() if q])].pop(0))
        got = list(crilog.lines(merged))
        for stream, texts in streams.items():
            assert [x.text for x in got if x.stream == stream] == texts
        cut = rng.randrange(len(merged) + 1)
        done, held = crilog.complete(merged[:cut])
        rest, _ = crilog.complete(held + merged[cut:])
        assert [(x.text, x.stream) for x in done + rest] == [(x.text, x.stream) for x in got]


@pytest.mark.parametrize(
    "value, seconds",
    [("10s", 10), ("5m", 300), ("2h", 7200), ("1h30m", 5400), ("500ms", 0.5), ("1.5h", 5400)],
)
def test_since_takes_go_durations(value, seconds):
    assert crilog.since_seconds(value) == pytest.approx(seconds)


@pytest.mark.parametrize("value", ["", "10", "5x", "-5m", "0s", "m", "1d", "5 m", "1h-30m", "s10"])
def test_since_refuses_what_is_not_a_positive_duration(cli, value):
    """kubectl takes --since as a Go duration; a bare number or a day unit is not one: one line,
    exit 2."""
    with pytest.raises(ValueError):
        crilog.since_seconds(value)
    r = cli("job", "logs", "--since", value)
    assert r.exit_code == 2 and r.stderr.startswith(
        f"error: --since {value!r} is not a duration"
    ), r.output


def test_tail_below_minus_one_is_refused(cli):
    r = cli("job", "logs", "--tail", "-2")
    assert r.exit_code == 2 and r.stderr.startswith("error: --tail -2 is below -1"), r.output


def test_select_is_a_tail_then_a_time_filter():
    """For any tail and since over lines in time order: the result is a suffix of the log, no longer
    than the tail, every line at or after since, and the longest such suffix (the kubelet's
    ReadLogs)."""
    rng = random.Random(11)
    for _ in range(300):
        found = [
            crilog.Line(str(i), T0 + i + rng.random() / 2) for i in range(rng.randrange(0, 12))
        ]
        tail = rng.choice([None, 0, 1, 3, 20])
        since = rng.choice([None, T0 - 1, T0 + rng.uniform(0, 12)])
        got = crilog.select(found, tail=tail, since=since)
        assert got == found[len(found) - len(got) :]
        assert tail is None or len(got) <= tail
        assert all(since is None or x.time >= since for x in got)
        longer = found[len(found) - len(got) - 1 :] if len(got) < len(found) else None
        if longer is not None:
            assert (tail is not None and len(longer) > tail) or (
                since is not None and longer[0].time < since
            )


# --- the relay that writes a local pod's log -------------------------------------------------------------

WRITER = """
import os, sys, time
print("out one", flush=True)
print("err one", file=sys.stderr, flush=True)
time.sleep(0.05)
print("x" * LONG, flush=True)
print("json {\\"event\\":\\"x\\"}", flush=True)
sys.stdout.write("cut mid-line")
sys.stdout.flush()
if os.environ.get("DIE"):
    os.kill(os.getpid(), 9)
"""


@pytest.mark.parametrize("die", [False, True], ids=["exits", "killed mid-line"])
def test_relay_stamps_each_line_as_a_container_runtime_does(tmp_path, die):
    """A real process's stdout and stderr through the relay: each line in the CRI format with its
    stream and a time in order; a line longer than 16 KiB in P pieces that join back; the unfinished
    last line of a process killed mid-write kept whole; the relay ends when the pipes close (the
    process, its children)."""
    log = tmp_path / "node-0.log"
    code = WRITER.replace("LONG", str(crilog.MAX_LINE * 2 + 5))
    env = {"PATH": "/usr/bin:/bin", **({"DIE": "1"} if die else {})}
    proc = shell.spawn([sys.executable, "-c", code], env=env, log=log, stamped=True)
    proc.wait(timeout=30)
    proc.relay.wait(timeout=30)
    assert proc.returncode == (-signal.SIGKILL if die else 0)
    raws = log.read_text().splitlines()
    assert all(re.match(rf"{RFC.pattern[:-1]}\d*Z? (stdout|stderr) [FP] ", r) for r in raws), raws[
        :3
    ]
    # 2 x 16 KiB + 5: two pieces then the rest; the unfinished last line a piece, as containerd
    # writes at EOF
    assert sum(" P " in r[:45] for r in raws) == 3
    got = crilog.read(log)
    # each stream in its order (across the two pipes the order is the reads', as with containerd's
    # two)
    assert [x.text for x in got if x.stream == "stdout"] == [
        "out one",
        "x" * (crilog.MAX_LINE * 2 + 5),
        'json {"event":"x"}',
        "cut mid-line",
    ]
    assert [x.text for x in got if x.stream == "stderr"] == ["err one"]
    # in order within each stream; across the two, a line in pieces takes its first piece's time
    # and comes where its last piece is, so a line of the other stream between them is not out of
    # order (crilog.lines; seen in CI when stderr's line fell between stdout's pieces)
    for stream in ("stdout", "stderr"):
        times = [x.time for x in got if x.stream == stream]
        assert times == sorted(times), (stream, times)
    assert abs(got[0].time - time.time()) < 30


def _straddling_lines(rng: random.Random) -> list[bytes]:
    """Output lines whose multi-byte characters (2, 3 and 4 bytes) fall across the 16 KiB cuts at
    every offset, with a carriage return (a progress bar), a byte that is not UTF-8 and short lines
    between."""
    found = []
    for char in ("é", "✓", "😀"):
        raw = char.encode()
        for cut in range(1, len(raw)):  # the cut falls after `cut` bytes of the character
            for pieces in (1, 2):
                head = "a" * (crilog.MAX_LINE * pieces - cut)
                found.append(head.encode() + raw + rng.choice([b"", b"tail \r 50%", b"\xff end"]))
    found += [b"short \xc3", b"progress 10%\rprogress 20%", "日本語".encode() * 3000]
    rng.shuffle(found)
    return found


def test_relayed_long_lines_keep_every_character_cut_by_a_piece(tmp_path):
    """containerd (pkg/cri/io/logger.go) cuts a long line at max_container_log_line_size BYTES and
    writes the pieces raw, and the kubelet's reader (kuberuntime/logs/logs.go) joins the pieces'
    bytes, so a character cut in two is whole again; lines end only at a newline (a \\r stays in its
    line). Real process, real relay; read back whole (`crilog.read`) and as `job logs -f` follows
    it, a few bytes at a time: each line is its bytes decoded once (not UTF-8 replaced by U+FFFD),
    none split, none lost."""
    from fsdpctl.backends.local.backend import _Follower

    rng = random.Random(11)
    out = _straddling_lines(rng)
    data = tmp_path / "out.bin"
    data.write_bytes(b"".join(line + b"\n" for line in out))
    code = f"import sys; sys.stdout.buffer.write(open({str(data)!r}, 'rb').read())"
    log = tmp_path / "node-0.log"
    proc = shell.spawn(
        [sys.executable, "-c", code], env={"PATH": "/usr/bin:/bin"}, log=log, stamped=True
    )
    proc.wait(timeout=30)
    proc.relay.wait(timeout=30)
    want = [line.decode("utf-8", "replace") for line in out]
    assert [x.text for x in crilog.read(log)] == want
    assert (
        sum(
            " P " in r[:45]
            for r in log.read_bytes().split(b"\n")[:-1]
            for r in [r.decode("latin-1")]
        )
        > 6
    )
    # a follower that sees the file grow in arbitrary byte steps, cuts inside characters included
    whole, grown = log.read_bytes(), tmp_path / "grown.log"
    grown.write_bytes(b"")
    follower, seen, at = _Follower(grown), [], 0
    while at < len(whole):
        step = rng.randrange(1, 40000)
        with open(grown, "ab") as fh:
            fh.write(whole[at : at + step])
        at += step
        seen += follower.read(final=False)
    seen += follower.read(final=True)
    assert [x.text for x in seen] == want


# --- job logs on a local job with a fixed log --------------------------------------------------------------


def cri(t: float, text: str, stream: str = "stdout") -> str:
    return crilog.format_line(t, stream, text)


@pytest.fixture
def ended_job(cli):
    """A finished two-node local job whose logs are fixed CRI lines (times from T0): a leader event,
    step events each followed by the trainer's own human line, a checkpoint, stderr lines, a line in
    pieces."""
    jdir = cli.home / "jobs" / "fixed"
    logs = jdir / "logs" / "fixed-run-1"
    logs.mkdir(parents=True)
    node0 = [
        cri(T0, "starting torchrun", "stderr"),
        cri(T0 + 1, LEADER % T0),
        *(
            line
            for s in range(1, 5)
            for line in (
                cri(T0 + 1 + s, STEP % (s, 4 - s / 10, T0 + s)),
                cri(T0 + 1 + s, f"step     {s}/4 | loss {4 - s / 10:.4f} | 1000 tok/s"),
            )
        ),
        cri(T0 + 6, '{"event":"checkpoint","step":4,"path":"/ckpt/step-00000004"}'),
        crilog.format_line(T0 + 7, "stdout", "a long ", "P") + cri(T0 + 7.5, "line, joined"),
        cri(T0 + 8, "worker group successfully finished", "stderr"),
    ]
    (logs / "node-0.log").write_text("".join(node0))
    (logs / "node-1.log").write_text(
        cri(T0 + 0.5, "node 1 starting", "stderr") + cri(T0 + 8.5, "node 1 done")
    )
    state = {
        "job": "fixed",
        "run_id": "fixed-run-1",
        "phase": "Succeeded",
        "created": T0,
        "replicas": 2,
        "log_dir": str(logs),
        "checkpoint_dir": str(jdir / "checkpoints"),
        "supervisor_pid": None,
        "launchers": [],
        "stop_requested": False,
        "labels": {"fsdpctl.io/job": "fixed"},
    }
    (jdir / "state.json").write_text(json.dumps(state))
    return "fixed"


def test_job_logs_whole_outputs(cli, ended_job):
    """Plain, --all --timestamps and -o json of the fixed log, frozen: human lines instead of event
    JSON, kubectl's order of prefix then time, one JSON object per line."""
    runs = {
        "plain": cli("job", "logs", ended_job),
        "--all --timestamps --tail 4": cli(
            "job", "logs", ended_job, "--all", "--timestamps", "--tail", "4"
        ),
        "-o json --tail 6": cli("job", "logs", ended_job, "-o", "json", "--tail", "6"),
    }
    text = ""
    for what, r in runs.items():
        assert (r.exit_code, r.stderr) == (0, ""), r.output
        text += f"$ fsdpctl job logs fixed {what}\n{r.stdout}"
    check(GOLDEN / "cli" / "job-logs-local.txt", text)


def test_job_logs_options_on_a_fixed_log(cli, ended_job):
    plain = cli("job", "logs", ended_job).stdout.splitlines()
    assert not any(
        line.startswith('{"event"') for line in plain
    )  # no raw event JSON among human lines
    assert "leader: node rank 0 on node-0, 2 processes" in plain
    assert "checkpoint at step 4: /ckpt/step-00000004" in plain and "a long line, joined" in plain
    assert (
        sum(line.startswith("step ") for line in plain) == 4
    )  # the trainer's own line, not a second one
    every = cli("job", "logs", ended_job, "--all", "--tail", "1").stdout.splitlines()
    assert every == ["[node-0] worker group successfully finished", "[node-1] node 1 done"]
    stamped = cli("job", "logs", ended_job, "--timestamps", "--tail", "1").stdout
    assert stamped == f"{crilog.rfc3339(T0 + 8)} worker group successfully finished\n"
    assert cli("job", "logs", ended_job, "--tail", "0").stdout == ""
    assert cli("job", "logs", ended_job, "--tail", "-1").stdout.splitlines() == plain
    assert cli("job", "logs", ended_job, "--since", "1h").stdout == ""  # every line is months old
    records = [
        json.loads(x) for x in cli("job", "logs", ended_job, "-o", "json").stdout.splitlines()
    ]
    steps = [r["event"] for r in records if r.get("event", {}).get("event") == "step"]
    assert [s["step"] for s in steps] == [1, 2, 3, 4]
    assert all(
        set(r) == {"node", "time", "event"} or set(r) == {"node", "time", "text"} for r in records
    )
    assert all(r["node"] == "node-0" and RFC.fullmatch(r["time"]) for r in records)


def test_since_keeps_the_recent_lines_of_each_node(cli):
    """--since against the clock: on every node, exactly the lines stamped in the window, for windows drawn
    over lines spread across the last hour."""
    rng = random.Random(5)
    now = time.time()
    jdir = cli.home / "jobs" / "recent"
    logs = jdir / "logs" / "r"
    logs.mkdir(parents=True)
    ages = {n: sorted((rng.uniform(0, 3600) for _ in range(30)), reverse=True) for n in (0, 1)}
    for n, node_ages in ages.items():
        (logs / f"node-{n}.log").write_text(
            "".join(cri(now - a, f"n{n} age {a:.3f}") for a in node_ages)
        )
    state = {
        "job": "recent",
        "run_id": "r",
        "phase": "Failed",
        "created": now - 4000,
        "replicas": 2,
    }
    state |= {"log_dir": str(logs), "checkpoint_dir": None, "launchers": []}
    (jdir / "state.json").write_text(json.dumps(state))
    for window in (60, 600, 1800):
        lines = cli("job", "logs", "recent", "--all", "--since", f"{window}s").stdout.splitlines()
        for n, node_ages in ages.items():
            shown = [line for line in lines if line.startswith(f"[node-{n}]")]
            # a line within a second of the edge may fall either way (the command reads the clock
            # later)
            assert len([a for a in node_ages if a < window - 1]) <= len(shown)
            assert len(shown) <= len([a for a in node_ages if a < window + 1])


# --- job list filters ------------------------------------------------------------------------------------

PHASES = ["Succeeded", "Failed", "Stopped", "Succeeded", "Failed"]


@pytest.fixture
def some_jobs(cli):
    """Ended local jobs in several phases, with labels as their PyTorchJobs carried them."""
    for i, phase in enumerate(PHASES):
        jdir = cli.home / "jobs" / f"job-{i}"
        (jdir / "logs" / "r").mkdir(parents=True)
        state = {"job": f"job-{i}", "run_id": f"r{i}", "phase": phase, "created": time.time() - 30}
        state["replicas"] = 1
        state |= {"log_dir": str(jdir / "logs" / "r"), "checkpoint_dir": None, "launchers": []}
        state["labels"] = {"fsdpctl.io/job": f"job-{i}", "team": "a" if i % 2 else "b"}
        (jdir / "state.json").write_text(json.dumps(state))
    return [f"job-{i}" for i in range(len(PHASES))]


def listed(cli, *args: str) -> list[str]:
    r = cli("job", "list", "-o", "json", *args)
    assert r.exit_code == 0, r.output
    return [x["job"] for x in json.loads(r.stdout)]


def test_list_filters_are_the_predicate_they_name(cli, some_jobs):
    """Every combination of phases (any case, repeated or comma lists) and selectors: the listed
    jobs are exactly those whose phase and labels pass, in table and JSON alike."""
    assert listed(cli) == some_jobs
    for phases in (["succeeded"], ["FAILED", "stopped"], ["Succeeded,Stopped"]):
        wanted = {p.lower() for ps in phases for p in ps.split(",")}
        flags = [a for p in phases for a in ("--phase", p)]
        assert listed(cli, *flags) == [
            j for j, p in zip(some_jobs, PHASES, strict=True) if p.lower() in wanted
        ]
    for selector, keep in [
        ("team=a", lambda i: i % 2),
        ("team==b", lambda i: not i % 2),
        ("team!=a", lambda i: not i % 2),
        ("team=a,fsdpctl.io/job=job-1", lambda i: i == 1),
        ("fsdpctl.io/backend=local", lambda i: True),
        ("fsdpctl.io/backend=eks", lambda i: False),
        ("missing!=x", lambda i: True),
        ("missing=x", lambda i: False),
    ]:
        assert listed(cli, "-l", selector) == [j for i, j in enumerate(some_jobs) if keep(i)], (
            selector
        )
    both = listed(cli, "--phase", "failed", "--selector", "team=a")
    assert both == [
        j for i, (j, p) in enumerate(zip(some_jobs, PHASES, strict=True)) if p == "Failed" and i % 2
    ]
    table = cli("job", "list", "--phase", "stopped").stdout
    assert "job-2" in table and "job-0" not in table


def test_list_filters_refuse_unknown_phases_and_bad_selectors(cli, some_jobs):
    r = cli("job", "list", "--phase", "Running,Dancing")
    assert r.exit_code == 2 and r.stderr.startswith(
        "error: --phase 'Dancing' is not a job phase"
    ), r.output
    assert "Pending, Created, Running" in r.stderr and r.stdout == ""
    for bad in ("team", "=a", "a b=c", "team=a,"):
        r = cli("job", "list", "-l", bad)
        assert r.exit_code == 2 and "is not key=value" in r.stderr and r.stdout == "", (
            bad,
            r.output,
        )
    # values the selector parser refuses (pkg/labels/selector.go parse -> validateLabelValue):
    # kubectl fails on them, a local list used to show an empty table
    for bad in ("a=b=c", "team=a b", "team=-a", "team=a.", "team=" + "x" * 64, "team!=ä"):
        r = cli("job", "list", "-l", bad)
        assert r.exit_code == 2 and "is not a label value" in r.stderr and r.stdout == "", (
            bad,
            r.output,
        )


def test_list_with_a_filter_whole_output(cli, some_jobs):
    r = cli("job", "list", "--phase", "failed", "-l", "team=b")
    assert (r.exit_code, r.stderr) == (0, ""), r.output
    text = re.sub(r"\b\d\ds\b", "<A>", r.stdout)  # 30 s old, give or take a second: the same width
    check(
        GOLDEN / "cli" / "job-list-filtered.txt",
        "".join(x.rstrip() + "\n" for x in text.splitlines()),
    )


# --- -o json on job run / stop / wait ----------------------------------------------------------------------


def test_stop_and_wait_say_json_on_stdout_and_keep_their_exit_codes(cli, ended_job):
    stop = cli("job", "stop", ended_job, "-o", "json")
    assert stop.exit_code == 0 and "nothing to stop" in stop.stderr
    assert json.loads(stop.stdout) == {
        "job": "fixed",
        "result": "job fixed is not running (Succeeded); nothing to stop",
        "dry_run": "none",  # kubectl's --dry-run values, as every document says it
    }
    wait = cli("job", "wait", ended_job, "-o", "json")
    assert wait.exit_code == 0 and json.loads(wait.stdout) == {
        "job": "fixed",
        "phase": "Succeeded",
        "exit_code": 0,
    }
    assert "job fixed: Succeeded" in wait.stderr
    plain = cli("job", "wait", ended_job)
    assert plain.stdout == "" and plain.exit_code == 0


def test_run_dry_run_json_is_the_started_object(cli):
    r = cli("--set", "JOB_NODES=2", "job", "run", "--dry-run", "-o", "json")
    assert r.exit_code == 0, r.output
    said = json.loads(r.stdout)
    assert said["job"] == "fsdp" and said["backend"] == "local" and said["dry_run"] == "client"
    assert len([o for o in said["lines"] if o.startswith("node ")]) == 2
    # the objects themselves, as kubectl's --dry-run -o json prints them: what the supervisor runs
    assert [o["kind"] for o in said["objects"]][-1] == "PyTorchJob"
    assert said["objects"][-1]["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 2
    assert "nothing was created" in r.stderr


# --- completion through the real executable ---------------------------------------------------------------


def protocol(words: str, shell_: str) -> dict[str, str]:
    """The environment a shell's completion script gives fsdpctl: typer's protocol
    (typer/_completion_shared.py, _completion_classes.py) is `_FSDPCTL_COMPLETE=complete_bash` with
    COMP_WORDS/COMP_CWORD as the bash script sets them (the word being completed last),
    `complete_zsh` with _TYPER_COMPLETE_ARGS."""
    if shell_ == "bash":
        cword = str(len(words.split(" ")) - 1)
        return {"COMP_WORDS": words, "COMP_CWORD": cword, "_FSDPCTL_COMPLETE": "complete_bash"}
    return {"_TYPER_COMPLETE_ARGS": words, "_FSDPCTL_COMPLETE": f"complete_{shell_}"}


def complete(cli, monkeypatch, words: str, shell_: str = "bash") -> list[str]:
    """The candidates, from the app in this process (the click entry point the executable runs;
    cheap)."""
    with monkeypatch.context() as m:
        for k, v in protocol(words, shell_).items():
            m.setenv(k, v)
        r = cli()
    assert r.exit_code == 0 and r.stderr == "", r.output
    return [x for x in r.stdout.splitlines() if x]  # bash reads an empty line as no candidate


def test_completion_through_the_real_executable(cli, some_jobs):
    """The protocol end to end, as the installed script runs it: a separate fsdpctl process per TAB."""
    r = cli.run(env=protocol("fsdpctl job logs --set MODEL = t", "bash"))
    assert (r.exit_code, r.stdout.split(), r.stderr) == (0, ["tiny", "tiny-gqa"], ""), r.output
    r = cli.run(env=protocol("fsdpctl job status job-", "zsh"))
    assert r.stdout.strip() == "_arguments '*: :((" + "\n".join(f'"{j}"' for j in some_jobs) + "))'"


def test_completion_of_job_names_setting_keys_values_and_models(cli, monkeypatch, some_jobs):
    (cli.home / "started").mkdir()
    (cli.home / "started" / "on-eks.json").write_text('{"backend": "eks"}')
    (cli.home / "jobs" / "Not_A_Job").mkdir()  # not a job name: never offered

    def got(words: str) -> list[str]:
        return complete(cli, monkeypatch, words)

    import typer.main

    from fsdpctl.cli import app

    job = typer.main.get_command(app).commands["job"]
    verbs = [
        v for v, c in job.commands.items() if any(p.param_type_name == "argument" for p in c.params)
    ]
    assert {"status", "logs", "stop", "wait", "plot", "describe", "diff"} <= set(verbs)
    for verb in verbs:  # every job verb that takes a job: its first argument offers the jobs
        assert got(f"fsdpctl job {verb} ") == [*some_jobs, "on-eks"], verb
    assert got("fsdpctl job logs -f job-") == some_jobs
    assert got("fsdpctl job logs on") == ["on-eks"]
    assert got("fsdpctl --set BACK") == ["BACKEND="]
    assert got("fsdpctl job list --set RDZV_B") == ["RDZV_BACKEND="]  # --set after the subcommand
    assert got("fsdpctl plan -s RDZV_BACKEND=e") == ["RDZV_BACKEND=etcd", "RDZV_BACKEND=etcd-v2"]
    assert got("fsdpctl job run --set MODEL = tiny") == [
        "tiny",
        "tiny-gqa",
    ]  # bash splits KEY=VALUE at =
    assert got("fsdpctl job run --set=PRECISION=f") == [
        "--set=PRECISION=fp16",
        "--set=PRECISION=fp32",
    ]
    assert got("fsdpctl plan --model 7") == ["7b", "70b"]
    assert "MODEL=13b" in got("fsdpctl --set MODEL=")
    assert got("fsdpctl --set JOB_NAME=") == []  # free text: nothing to offer
    assert got("fsdpctl job st") == ["status", "stop"]  # click's own completion is untouched


@pytest.mark.parametrize("damage", ["jobs is a file", "no state dir", "state dir unreadable"])
def test_completion_of_a_broken_state_dir_offers_nothing(cli, monkeypatch, tmp_path, damage):
    if damage == "jobs is a file":
        cli.home.mkdir(parents=True, exist_ok=True)
        (cli.home / "jobs").write_text("x")
        (cli.home / "started").write_text("x")
        home = cli.home
    elif damage == "no state dir":
        home = tmp_path / "nowhere" / "home"
    else:
        home = tmp_path / "locked"
        (home / "jobs" / "a").mkdir(parents=True)
        home.chmod(0)
    monkeypatch.setenv("FSDPCTL_HOME", str(home))
    try:
        readable = damage == "state dir unreadable" and os.access(
            home, os.R_OK | os.X_OK
        )  # root reads it
        assert complete(cli, monkeypatch, "fsdpctl job status ") == (["a"] if readable else [])
    finally:
        if damage == "state dir unreadable":
            home.chmod(0o755)


def test_the_root_help_says_how_to_install_completion(cli):
    assert "--install-completion" in cli("--help").stdout

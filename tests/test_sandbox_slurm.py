"""`fsdpctl sandbox slurm up|down|status` (issue 44 item 9): a one-machine Slurm for users, the very
cluster tests/slurm_peer.py runs (fsdpctl.sandbox.slurm_layout), started detached and torn down
without a trace.

Peers: the real daemons of Debian's slurm-wlm 22.05 and munge (the slow test, as root), real
`ip netns` (iproute2), and the real trainer on CPU through `fsdpctl job run` on BACKEND=slurm. What
Slurm does is read in its own documentation and source (SchedMD/slurm, tag slurm-22-05-8-1):
slurm.conf(5) for the configuration, scancel(1) ("signal or cancel jobs ... By default, the signal
is SIGKILL after KillWait") for `down`'s cancel, and proc(5) (starttime, field 22 of
/proc/<pid>/stat) for the identity `down` proves before it signals a daemon."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import slurm_peer
from conftest import fsdpctl_process, prefixed
from fsdpctl.adapters import netns
from fsdpctl.backends.local.processes import same_process
from fsdpctl.sandbox import slurm, slurm_layout

# the job: the tiny shapes tests/test_slurm_backend.py trains, for a single step
TINY = {
    "INSTANCE_TYPE": "p5.48xlarge",
    "EFA_ENABLED": "false",  # gloo on CPU: no EFA
    "GPUS_PER_NODE": "1",
    "SEQ_LEN": "64",
    "PRECISION": "fp32",
    "MAX_STEPS": "1",
    "WARMUP_STEPS": "1",
    "CHECKPOINT_INTERVAL": "1",
    "JOB_NAME": "try",
}


def _exports(stdout: str) -> dict[str, str]:
    """`up`'s stdout: `export KEY=value` lines a shell evaluates, and nothing else."""
    pairs = [shlex.split(line.removeprefix("export "))[0] for line in stdout.splitlines()]
    assert all(line.startswith("export ") for line in stdout.splitlines()), stdout
    return dict(p.split("=", 1) for p in pairs)


def _processes_naming(*paths: Path) -> list[str]:
    """Every process whose command line or environment names one of `paths` (a daemon, a step, a
    task of the sandbox's), found by scanning /proc, not through the sandbox's own records."""
    marks = [str(p).encode() for p in paths]
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            text = (entry / "cmdline").read_bytes() + (entry / "environ").read_bytes()
            state = (entry / "stat").read_text().rsplit(") ", 1)[1][0]
        except (OSError, IndexError):
            continue
        if state != "Z" and any(m in text for m in marks):
            found.append(f"{entry.name}: {(entry / 'cmdline').read_bytes()[:120]!r}")
    return found


def _links_and_namespaces(net: netns.Network) -> list[str]:
    names = [net.bridge, *(net.veth(n) for n in range(net.nodes))]
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    spaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    gone = [n for n in names if f" {n}:" in links or f" {n}@" in links]
    return gone + [net.namespace(n) for n in range(net.nodes) if net.namespace(n) in spaces]


@pytest.mark.slow
def test_up_trains_a_job_is_one_sandbox_twice_and_down_leaves_nothing(tmp_path):
    """Real slurmctld, slurmd x2 and munged (root): `up` prints exports and returns with every node
    idle and its daemons still running (detached: they outlive the command); `up` again is the same
    sandbox (the same recorded processes), `up --nodes 3` is refused with exit 2; `fsdpctl job run`
    with those exports trains one step on both nodes (sbatch, srun, torchrun on CPU) and succeeds;
    with a job still running, `down` cancels it, stops every daemon, and afterwards no process names
    the sandbox's files, no namespace or link of its network exists, and its state and munge
    directories are gone; `down` again has nothing to do. Where this machine has pyxis and enroot,
    a step runs in a container on both nodes; where not, `up` said so in one line."""
    usable, why = slurm_peer.available()
    if not usable:
        pytest.skip(why)
    (tmp_path / "home").mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FSDPCTL_", "SLURM"))}
    env |= {"FSDPCTL_HOME": str(tmp_path / "home"), "NO_COLOR": "1"}
    where = tmp_path / "home" / "sandbox" / "slurm"
    try:
        got = fsdpctl_process("sandbox", "slurm", "up", env=env)
        assert got.returncode == 0, got.stderr
        exports = _exports(got.stdout)
        sb = slurm.load(where)
        assert sb is not None and sb.complete() and exports["SLURM_CONF"] == str(sb.layout.conf)
        again = fsdpctl_process("sandbox", "slurm", "up", env=env)
        assert again.returncode == 0 and "already up" in again.stderr, again.stderr
        assert _exports(again.stdout) == exports and slurm.load(where) == sb
        other = fsdpctl_process("sandbox", "slurm", "up", "--nodes", "3", env=env)
        assert other.returncode == 2 and len(other.stderr.strip().splitlines()) <= 2, other.stderr
        _containers_run_or_are_said_absent(sb, got.stderr)
        used = env | exports | prefixed(TINY)
        ran = fsdpctl_process("job", "run", env=used, timeout=400)
        assert ran.returncode == 0, ran.stderr[-3000:]
        sleeper = subprocess.run(
            ["sbatch", "--parsable", "-N2", "--wrap", "srun sleep 600"],
            env=slurm.client_env(sb.layout),
            cwd=tmp_path,  # its slurm-<id>.out, not in the checkout
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        status = json.loads(
            fsdpctl_process("sandbox", "slurm", "status", "-o", "json", env=env).stdout
        )
        assert status["nodes"].keys() == {"node0", "node1"} and sleeper in status["jobs"]
        down = fsdpctl_process("sandbox", "slurm", "down", env=env)
        assert down.returncode == 0 and f"cancelled job {sleeper}" in down.stderr, down.stderr
    finally:
        left = slurm.load(where) if where.exists() else None
        if left is not None:  # a failed assertion above: take it down all the same
            slurm.down(where)
    assert not [n for n, i in sb.daemons.items() if same_process(i)]
    assert _processes_naming(sb.layout.root, sb.layout.munge_dir) == []
    assert _links_and_namespaces(sb.layout.net) == []
    assert not where.exists() and not sb.layout.munge_dir.exists()
    twice = fsdpctl_process("sandbox", "slurm", "down", env=env)
    assert twice.returncode == 0 and "nothing to do" in twice.stderr


@settings(
    max_examples=20,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(lacking=st.sets(st.sampled_from(slurm_layout.PROGRAMS), min_size=1))
def test_up_without_a_package_names_what_is_missing_and_the_apt_line(cli, monkeypatch, lacking):
    """Whatever programs are missing: exit 2, one line naming each and a hint with the apt-get
    line, nothing written under FSDPCTL_HOME (no daemon could have started)."""
    import shutil

    real = shutil.which
    monkeypatch.setattr(slurm.netns, "available", lambda: (True, ""))
    monkeypatch.setattr(slurm.shutil, "which", lambda p: None if p in lacking else real(p) or p)
    got = cli("sandbox", "slurm", "up")
    assert got.exit_code == 2, got.output
    first = got.stderr.splitlines()[0]
    assert all(p in first for p in lacking) and slurm.APT in got.stderr
    assert not (cli.home / "sandbox").exists()


@settings(
    max_examples=25,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    text=st.one_of(
        st.text(max_size=40),
        st.builds(json.dumps, st.dictionaries(st.text(max_size=5), st.integers())),
    )
)
def test_a_state_that_is_not_a_sandbox_is_one_line_and_exit_2(cli, monkeypatch, text):
    """Any sandbox.json that is not one `up` wrote (truncated, edited, another file): `down` and
    `status` refuse it in one line naming the file, exit 2, no traceback, and signal nothing."""
    monkeypatch.setattr(slurm, "require", lambda: None)
    state = cli.home / "sandbox" / "slurm" / "sandbox.json"
    state.parent.mkdir(parents=True, exist_ok=True)
    state.write_text(text)
    for verb in ("down", "status"):
        got = cli("sandbox", "slurm", verb)
        assert got.exit_code == 2, got.output
        assert str(state) in got.stderr.splitlines()[0] and "Traceback" not in got.output
    assert state.read_text() == text


def test_dry_run_down_and_status_without_a_sandbox_change_nothing(cli):
    """`up --dry-run` shows the daemons, addresses and namespaces it would make and makes none;
    `down` and `status` without a sandbox say so, exit 0."""
    got = cli("sandbox", "slurm", "up", "--dry-run", "--nodes", "3")
    assert got.exit_code == 0, got.output
    assert [line.split()[1] for line in got.stdout.splitlines() if "slurmd" in line] == [
        "node0",
        "node1",
        "node2",
    ]
    assert not (cli.home / "sandbox").exists()
    for verb in ("down", "status"):
        got = cli("sandbox", "slurm", verb)
        assert got.exit_code == 0 and "no Slurm sandbox" in got.stderr, got.output


@given(nodes=st.integers(1, 16), index=st.integers(1, 250))
@settings(max_examples=30, derandomize=True, deadline=None)
def test_every_node_is_named_once_at_its_own_address_and_the_spool_fits_a_socket(nodes, index):
    """slurm.conf(5): a NodeName line per node with its NodeAddr, all in the one default partition,
    SlurmctldHost the controller's name at the bridge address; slurmstepd's socket in the spool
    (<spool>/<node>/<host>_<job>.<step>, sun_path at most 108 bytes) fits for a short directory."""
    net = netns.Network(index, slurm.NETWORK, nodes)
    layout = slurm_layout.Layout(
        Path("/x/home/sandbox/slurm"), net, Path("/run/fsdpctl-slurm-abcdefgh"), 6817
    )
    conf = slurm_layout.slurm_conf(layout, 2)
    lines = [slurm_layout.parse_record(x) for x in conf.splitlines() if x.startswith("NodeName=")]
    assert [r["NodeName"] for r in lines] == layout.names
    assert len({r["NodeAddr"] for r in lines}) == nodes
    assert f"SlurmctldHost={slurm_layout.CONTROLLER}({net.host_address})" in conf
    socket_path = f"{layout.spool}/node{nodes - 1}/{slurm_layout.CONTROLLER}_4294967294.4294967294"
    assert len(socket_path) < 108


@settings(
    max_examples=6,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(off=st.sampled_from(["start", "boot", "pid", None]))
def test_down_signals_a_recorded_daemon_only_while_it_is_the_process_recorded(
    tmp_path, monkeypatch, off
):
    """proc(5) starttime with the boot id names one process for good, where a pid is reused: a
    recorded daemon whose pid now belongs to a process started at another time (or another boot)
    is left alone by `down`; the process recorded (off=None) is stopped. The network calls are
    stubbed here: the slow test above plays them for real."""
    from fsdpctl.backends.local.processes import identity

    monkeypatch.setattr(slurm.netns, "destroy", lambda net: None)
    monkeypatch.setattr(slurm, "_pids_in", lambda net, node: [])
    proc = subprocess.Popen(["sleep", "60"])
    try:
        ident = identity(proc.pid)
        assert ident is not None
        if off == "start":
            ident["start"] = (ident["start"] or 0) + 1
        elif off == "boot":
            ident["boot"] = "another-boot"
        elif off == "pid":
            ident["pid"] = proc.pid + 1_000_000  # no such process
        where = tmp_path / f"sandbox-{off}"
        munge = tmp_path / f"{slurm.MUNGE_PREFIX}x"
        munge.mkdir(exist_ok=True)
        layout = slurm_layout.Layout(where, netns.Network(9, slurm.NETWORK, 1), munge, 1)
        slurm.save(slurm.Sandbox(layout, {"slurmctld-not": ident, "munged": ident}))
        slurm.down(where)
        assert (proc.poll() is None) == (off is not None), off
        assert not where.exists()
    finally:
        proc.kill()
        proc.wait()


@settings(
    max_examples=15,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(odd=st.sampled_from([" ", "=", ",", "$", "'", "é", "#", ":"]))
def test_a_home_whose_path_slurm_conf_cannot_hold_is_refused_before_anything_starts(
    cli, monkeypatch, tmp_path, odd
):
    """slurm.conf(5) lines are space-separated Key=value pairs, and SHARED_VOLUME_PATH's pattern takes
    letters, digits and . _ - /: an FSDPCTL_HOME with anything else is one line naming it, exit 2,
    and no sandbox directory is made."""
    monkeypatch.setattr(slurm, "require", lambda: None)
    home = tmp_path / f"home{odd}x"
    home.mkdir(exist_ok=True)
    monkeypatch.setenv("FSDPCTL_HOME", str(home))
    got = cli("sandbox", "slurm", "up")
    assert got.exit_code == 2 and "FSDPCTL_HOME=" in got.stderr.splitlines()[0], got.output
    assert not (home / "sandbox").exists()


def test_a_second_up_or_down_waits_for_the_first_and_is_refused_past_its_wait(cli, monkeypatch):
    """flock(2) on sandbox/slurm.lock: while another `up` or `down` holds it, this one is refused
    with one line naming the lock (exit 2) once its wait is over, and touches nothing."""
    import fcntl

    monkeypatch.setattr(slurm, "require", lambda: None)
    monkeypatch.setattr(slurm, "LOCK_WAIT", 0.2)
    lock = cli.home / "sandbox" / "slurm.lock"
    lock.parent.mkdir(parents=True)
    with open(lock, "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        state = cli.home / "sandbox" / "slurm" / "sandbox.json"
        for verb in ("up", "down"):
            if verb == "down":  # a sandbox to take down: its state as `up` records it first
                layout = slurm_layout.Layout(
                    state.parent, netns.Network(9, "sandbox", 1), Path("/run/fsdpctl-slurm-x"), 1
                )
                slurm.save(slurm.Sandbox(layout))
            got = cli("sandbox", "slurm", verb)
            assert got.exit_code == 2 and str(lock) in got.stderr.splitlines()[0], got.output
        assert state.exists()


def _containers_run_or_are_said_absent(sb: slurm.Sandbox, said: str) -> None:
    """With pyxis + enroot: `srun --container-image` of the tests' trainer image runs on both nodes
    inside it (its interpreter, IMAGE_PYTHON, is a path the image has and this machine has not),
    as pyxis's README shows (`srun --container-image=... grep PRETTY /etc/os-release`). Without:
    `up` said so in one line, the reason with it."""
    lines = [line for line in said.splitlines() if line.startswith("containers:")]
    assert len(lines) == 1, said
    if sb.containers is None:
        assert "none" in lines[0] and sb.no_containers in lines[0], lines[0]
        return
    import pyxis_peer

    assert (sb.layout.root / "plugstack.conf").read_text() == sb.containers.plugstack()
    assert not Path(pyxis_peer.IMAGE_PYTHON).exists()  # only the container has it
    ran = subprocess.run(
        ["srun", "-N2", f"--container-image={pyxis_peer.trainer_image()}"]
        + ["sh", "-c", f"test -x {pyxis_peer.IMAGE_PYTHON} && echo inside"],
        env=slurm.client_env(sb.layout),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert ran.returncode == 0 and ran.stdout.split() == ["inside", "inside"], ran.stderr[-2000:]

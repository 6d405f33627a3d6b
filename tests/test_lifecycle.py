"""A job's life between components and over time (issue 27), as the real controllers end it: (a late
node, an evicted node, a volume that fills up, a volume the job's user cannot write) x (PyTorchJob,
TrainJob).

Peers. The processes are real: the local backend runs the rendered PyTorchJob with one torchrun
launcher per simulated node (network namespaces as root), the pods' user from their securityContext
(uid 1000, through setpriv, where the interpreter is reachable), claims that start as a new FSx for
Lustre file system's root (root, 0755: lustre-release lustre/mdd/mdd_device.c, mdd_prepare), the
kubelet's SIGTERM-then-SIGKILL for an eviction, a tmpfs of a few MB for a volume that fills and a
read-only mount for one nobody can write. Its supervisor applies the Training Operator v1.9.4's
rules to each pod's exit (backends/local/engine.py, `_judge`). The TrainJob column is judged from
the same runs' container exits by the rules of the Kubernetes Job controller and JobSet v0.12.0 the
Trainer v2.3.0 runs on (tests/kube_peer_kubelet.py, each rule with its source), where torchrun adds
nothing: the outcome is a controller's rule. Every (case, kind) is then served by the Kubernetes API
peer (kmock) as the controllers would leave it, and `fsdpctl job status` must name the reason in one
line.

The three real runs are shared by the eight cases (module fixture), about 100 s on 2 cores."""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kube_peer_kubelet as rules
from conftest import FSDPCTL_EXE, prefixed
from fsdpctl.backends.local import engine as local
from fsdpctl.job import crilog
from fsdpctl.job import policy as jobpolicy
from fsdptrain import disruption, events
from test_kube import peer  # noqa: F401  (a fixture)

ROOT = os.geteuid() == 0
CASES = ("skew", "eviction", "full volume", "unwritable volume")
KINDS = ("pytorchjob", "trainjob")
NODES = 2


# ---- the pods' own rule, generated: what a pod's launcher exits with (fsdptrain.disruption.pod_exit) ------


@settings(max_examples=200, deadline=None, derandomize=True)
@given(
    nodes=st.integers(2, 16),
    evicted=st.data(),
    kind=st.sampled_from(KINDS),
    steps_left=st.integers(1, 100),
)
def test_an_eviction_never_ends_a_job_and_costs_one_pod(nodes, evicted, kind, steps_left):
    """Any node of any size of job evicted mid-run: its launcher exits 143, the others' launchers
    start torchrun again (no pod of theirs ends), then every node finishes. The PyTorchJob recreates
    one pod and succeeds only after the last step; the TrainJob's child Job counts one failed pod,
    far inside its backoffLimit of 6. Before issue 27 the trainer exited 0 on SIGTERM on every rank
    and torchrun's agent 1 on the evicted node: the elastic PyTorchJob was Succeeded by the first
    other node's 0, mid-training (Training Operator v1.9.4 pytorchjob_controller.go,
    UpdateJobStatus), or Failed by the 1."""
    victim = evicted.draw(st.integers(0, nodes - 1))
    note = {"kind": "disrupted"}
    ends = [
        rules.End(
            victim, disruption.pod_exit(1, signalled=True, note=note, stopping=False), evicted=True
        )
    ]
    for node in range(nodes):
        if (
            node != victim
        ):  # torchrun ends after the disruption checkpoint; the launcher restarts it
            assert (
                disruption.pod_exit(1, signalled=False, note=note, stopping=False)
                == disruption.RESTART
            )
    mid = (rules.pytorchjob if kind == "pytorchjob" else rules.trainjob)(ends, nodes)
    assert mid.phase == "Running" and mid.recreated == 1
    done = ends + [
        rules.End(n, disruption.pod_exit(0, signalled=False, note=None, stopping=False))
        for n in range(nodes)
    ]
    assert (rules.pytorchjob if kind == "pytorchjob" else rules.trainjob)(
        done, nodes
    ).phase == "Succeeded"
    # the old trainer: every rank 0, the evicted agent 1 (torch elastic/agent/server/api.py, `run`)
    old = [rules.End((victim + 1) % nodes, 0), rules.End(victim, 1)]
    assert rules.pytorchjob(old, nodes).phase == "Succeeded"  # after steps_left steps never trained


def test_a_stop_request_ends_the_job_stopped_not_evicted():
    """`fsdpctl job stop` annotates the pods: a SIGTERM that comes with the annotation is a stop
    (exit 0, nothing recreated), one without it an eviction (143, recreated)."""
    assert disruption.pod_exit(1, signalled=True, note=None, stopping=True) == 0
    assert disruption.pod_exit(0, signalled=False, note=None, stopping=True) == 0
    assert (
        disruption.pod_exit(1, signalled=True, note=None, stopping=False)
        == disruption.RETRYABLE_EXIT
    )
    assert disruption.pod_exit(1, signalled=False, note={"kind": "failed"}, stopping=False) == 1
    assert disruption.pod_exit(-9, signalled=False, note=None, stopping=False) == 137


def test_the_start_ledger_bounds_the_pods_starts(tmp_path):
    """Issue 27, defect 9: under restartPolicy ExitCode a pod that dies by a signal is recreated
    without bound (Training Operator v1.9.4 pkg/core/job.go, PastBackoffLimit: only restarts of
    running containers count, and ExitCode pods never restart in place). Each torchrun start of a
    run leaves a file in its ledger on the shared volume; the start over JOB_NODES x (1 +
    MAX_RESTARTS) is refused with one line, and the launcher exits 1, which fails the job."""
    env = {disruption.STARTS_DIR_ENV: str(tmp_path / "starts"), disruption.STARTS_MAX_ENV: "4"}
    ledgers = [disruption.record_start(env, f"pod-{i % 2}") for i in range(4)]
    assert ledgers == [(i, None) for i in range(1, 5)]
    assert [disruption.restart_line(g, env, 2) for g in ledgers][:2] == [None, None]
    assert "torchrun start 4 of this run, at most 4" in disruption.restart_line(ledgers[3], env, 2)
    refused = disruption.record_start(env, "pod-0").refusal
    assert (
        refused
        and "started torchrun 5 times, over its budget of 4" in refused
        and "\n" not in refused
    )
    assert disruption.record_start({}, "pod-0") == (None, None)  # a plain torchrun: no ledger
    from fsdpctl.settings import load  # the budget a job is rendered with

    job_env = jobpolicy.starts_env(load(dotenv={"JOB_NODES": "4", "MAX_RESTARTS": "2"}), "run-1")
    assert job_env[disruption.STARTS_MAX_ENV] == "12"
    assert job_env[disruption.STARTS_DIR_ENV] == "/fsx/checkpoints/fsdp/.fsdpctl/starts/run-1"


# ---- the real runs -----------------------------------------------------------------------------------------


@dataclass
class Run:
    """One local job that ran to its end: its state, its `job status` report, and each node's log
    text."""

    name: str
    state: dict
    report: dict
    logs: dict[int, str]
    volume: Path
    uid: int | None
    extra: dict = field(default_factory=dict)


def _reachable_home() -> Path:
    """A FSDPCTL_HOME the pods' uid can search (pytest's tmp_path is under a 0700 directory)."""
    home = Path(tempfile.mkdtemp(prefix="fsdpctl-lifecycle-", dir="/tmp"))
    os.chmod(home, 0o755)
    return home


@pytest.fixture(scope="module")
def interpreter_reachable() -> Iterator[int | None]:
    """The uid the pods run as here: 1000 (their securityContext) when root can let it reach the
    interpreter. pyenv keeps Python under /root (0700 here): for these runs only, `others` may
    search /root (not list it), as a container image makes its interpreter every user's; put back
    after."""
    if not ROOT or not shutil.which("setpriv"):
        yield None
        return
    from fsdpctl.backends.local import kubelet

    blocked = kubelet.unreachable(Path(sys.executable), 1000, 1000)
    changed = None
    if blocked is not None and blocked == Path("/root"):
        changed = blocked, blocked.stat().st_mode
        os.chmod(blocked, stat.S_IMODE(changed[1]) | stat.S_IXOTH)
    try:
        yield 1000 if kubelet.unreachable(Path(sys.executable), 1000, 1000) is None else None
    finally:
        if changed:
            os.chmod(changed[0], stat.S_IMODE(changed[1]))


def _env(home: Path, **more: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("FSDPCTL_") and k.upper() not in SETTING_KEYS
    }
    settings_ = {
        "JOB_NODES": str(NODES),
        "MAX_STEPS": "36",
        "CHECKPOINT_INTERVAL": "4",
        "LOG_INTERVAL": "1",
        "SEQ_LEN": "64",
        "PRECISION": "fp32",
        "WARMUP_STEPS": "1",
        "MAX_RESTARTS": "2",
        "PRESTEP_TIMEOUT": "12",
    }
    return {
        **env,
        "FSDPCTL_HOME": str(home),
        "NO_COLOR": "1",
        "COLUMNS": "200",
        **prefixed(settings_),
        **more,
    }


SETTING_KEYS: frozenset[str] = (
    frozenset()
)  # filled at import below (the settings' keys, never from the shell)


def _fsdpctl(
    env: dict[str, str], *args: str, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(FSDPCTL_EXE), *args],
        env=env,
        cwd=env["FSDPCTL_HOME"],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _wait_step(env: dict[str, str], job: str, step: int, timeout: float = 180) -> int:
    """The leader's newest step once it reaches `step` (read from its log, as `job status` reads
    it)."""
    deadline = time.monotonic() + timeout
    os.environ["FSDPCTL_HOME"] = env["FSDPCTL_HOME"]
    try:
        while time.monotonic() < deadline:
            state = local.read_state(local.job_dir(job))
            leader = local.leader_log(state) if state else None
            found = events.parse(crilog.texts(leader)) if leader else iter(())
            steps = [e.step for e in found if isinstance(e, events.Step)]
            if steps and max(steps) >= step:
                return max(steps)
            if state and local.effective_phase(state) not in local.ACTIVE:
                raise AssertionError(f"job {job} ended before step {step}: {state}")
            time.sleep(0.3)
    finally:
        os.environ.pop("FSDPCTL_HOME", None)
    raise AssertionError(f"job {job} did not reach step {step} in {timeout} s")


def _finish(
    env: dict[str, str], job: str, volume: Path, uid: int | None, timeout: float = 300
) -> Run:
    waited = _fsdpctl(env, "job", "wait", job, "--timeout", str(timeout), timeout=timeout + 30)
    assert waited.returncode in (0, 3), waited.stdout + waited.stderr
    status = _fsdpctl(env, "job", "status", job, "-o", "json")
    report = json.loads(status.stdout)
    os.environ["FSDPCTL_HOME"] = env["FSDPCTL_HOME"]
    try:
        state = local.read_state(local.job_dir(job))
        logs = {int(f.stem.rpartition("-")[2]): f.read_text() for f in local.log_files(state)}
    finally:
        os.environ.pop("FSDPCTL_HOME", None)
    return Run(job, state, report, logs, volume, uid)


def _mount(what: str, at: Path, *options: str) -> None:
    at.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", ",".join(options), what, str(at)], check=True)


def _umount(at: Path) -> None:
    subprocess.run(["umount", "-l", str(at)], check=False)


def _fill(path: Path, leave: int = 1024 * 1024) -> None:
    """All but `leave` bytes of the file system, allocated for real, so the next save (~10 MB) cannot
    fit. The job trains on meanwhile and its own saves take space between the look at what is free
    and the allocation (ENOSPC, seen in CI): look again, up to the space it left."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        for _ in range(20):
            st = os.statvfs(path.parent)
            free = st.f_bavail * st.f_frsize
            if free <= leave:
                return
            try:
                os.posix_fallocate(fd, os.fstat(fd).st_size, free - leave)
                return
            except OSError as e:
                if e.errno != errno.ENOSPC:
                    raise
        raise AssertionError(f"could not fill {path.parent}: the job kept writing")
    finally:
        os.close(fd)


@pytest.fixture(scope="module")
def runs(interpreter_reachable) -> Iterator[dict[str, Run]]:
    """The three real runs:
    - `good`: node 1's pod starts 8 s late (FSDPCTL_LOCAL_START_DELAYS), the claim starts as Lustre's root
      (root, 0755) and the pods run as uid 1000 where they can; at step 8 node 0's pod (the c10d store's
      host) is evicted. This is the skew, the eviction and the root-owned (unwritable to the job's user)
      volume at once: they must not keep it from finishing every step.
    - `full`: the claim is a 64 MB tmpfs; once the first checkpoints are written, the test fills it (another
      job's data, say) so that the next save meets ENOSPC.
    - `readonly`: the claim is mounted read-only: the pre-step's volume-prep cannot make the job's
      directories, and the trainers' wait for it ends at PRESTEP_TIMEOUT."""
    if not ROOT:
        pytest.skip("needs root: network namespaces, tmpfs mounts and the pods' own uid")
    home = _reachable_home()
    mounts: list[Path] = []
    out: dict[str, Run] = {}
    try:
        env = _env(home, FSDPCTL_LOCAL_START_DELAYS="1=8")
        volume = home / "volumes" / "fsx-claim"
        started = _fsdpctl(env, "job", "run", "-d", "--set", "JOB_NAME=good")
        assert started.returncode == 0, started.stdout + started.stderr
        before = _wait_step(env, "good", 8)
        os.environ["FSDPCTL_HOME"] = str(home)
        local.evict("good", 0)
        os.environ.pop("FSDPCTL_HOME", None)
        out["good"] = _finish(env, "good", volume, interpreter_reachable)
        out["good"].extra["evicted_after"] = before

        env = _env(home)
        full = home / "volumes" / "full-claim"
        _mount("tmpfs", full, "size=64m", "mode=0755", "uid=0", "gid=0")
        mounts.append(full)
        started = _fsdpctl(
            env, "job", "run", "-d", "--set", "JOB_NAME=full", "--set", "SHARED_VOLUME=full-claim"
        )
        assert started.returncode == 0, started.stdout + started.stderr
        _wait_step(env, "full", 5)
        _fill(full / "filler")
        out["full"] = _finish(env, "full", full, interpreter_reachable)

        readonly = home / "volumes" / "ro-claim"
        _mount("tmpfs", readonly, "size=8m", "mode=0755", "ro")
        mounts.append(readonly)
        # --force: fsdpctl's own preflight sees a local volume with no room (a cluster's it cannot): the case
        # is what the job does when it meets one
        started = _fsdpctl(
            env,
            "job",
            "run",
            "-d",
            "--force",
            "--set",
            "JOB_NAME=readonly",
            "--set",
            "SHARED_VOLUME=ro-claim",
        )
        assert started.returncode == 0, started.stdout + started.stderr
        out["readonly"] = _finish(env, "readonly", readonly, interpreter_reachable, timeout=120)
        yield out
    finally:
        for name in ("good", "full", "readonly"):  # whatever a failed assertion left running
            _fsdpctl(_env(home), "job", "stop", name, timeout=300)
        for m in mounts:
            _umount(m)
        shutil.rmtree(home, ignore_errors=True)


# what each case's real run is, and what the controllers make of its container ends
RUN_OF = {"skew": "good", "eviction": "good", "full volume": "full", "unwritable volume": "good"}
EXPECTED = {
    ("skew", "pytorchjob"): "Succeeded",
    ("skew", "trainjob"): "Succeeded",
    ("eviction", "pytorchjob"): "Succeeded",
    ("eviction", "trainjob"): "Succeeded",
    ("full volume", "pytorchjob"): "Failed",
    ("full volume", "trainjob"): "Failed",
    ("unwritable volume", "pytorchjob"): "Succeeded",
    ("unwritable volume", "trainjob"): "Succeeded",
}
END = re.compile(r"fsdpctl: node (\d+) (evicted, )?exited with code (\d+); recreated")
FINISHED = "worker group successfully finished"


def container_ends(run: Run) -> list[rules.End]:
    """Every container end of the run, in order: the supervisor's notes for the pods it recreated,
    then each pod's last end (0 when its torchrun finished its workers, even if the operator's
    cleanup of a finished job then signalled it; else its exit code)."""
    ends = [
        rules.End(int(m[1]), int(m[3]), bool(m[2]))
        for text in run.logs.values()
        for m in END.finditer(text)
    ]
    for lz in run.state["launchers"]:
        text = run.logs[lz["node"]].rpartition("recreated, as the operator")[2]
        code = 0 if FINISHED in text else local.exit_code(lz["rc"])
        ends.append(rules.End(lz["node"], code))
    return ends


def judged(run: Run, kind: str) -> rules.Outcome:
    """The controllers' verdict on the run's container ends. A TrainJob restarts a failed container
    in place (OnFailure) and it fails the same way again while its cause stays (a full volume): the
    attempt repeats until the Job's backoffLimit decides."""
    ends = container_ends(run)
    if kind == "pytorchjob":
        return rules.pytorchjob(ends, NODES)
    attempts = ends
    while (outcome := rules.trainjob(attempts, NODES)).phase == "Running":
        attempts = attempts + [e for e in ends if e.code != 0]
        assert len(attempts) < 100, "no decision"
    return outcome


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("case", CASES)
def test_the_job_ends_as_the_controllers_end_it(runs, peer, case, kind):  # noqa: F811
    """Issue 27: each case ends as the real controllers end it (the local supervisor applies the
    Training Operator's rules to the real pods' exits; kube_peer_kubelet applies the Job/JobSet
    rules), with no step of training lost beyond the last checkpoint, and its reason in one line of
    `job status`, locally and as the Kubernetes API peer serves the job the controllers left."""
    run = runs[RUN_OF[case]]
    outcome = judged(run, kind)
    served = _served(peer, kind, outcome, container_ends(run))
    assert served["phase"] == outcome.phase, served
    assert outcome.phase != "Failed" or (served["reason"] and "\n" not in served["reason"]), served
    assert outcome.phase == EXPECTED[case, kind], (outcome, container_ends(run))
    if kind == "pytorchjob":  # the supervisor, not the test, applied the operator's rules
        assert run.report["phase"] == outcome.phase, run.report
    report = run.report
    for line in (report.get("reason"), (report.get("failure") or {}).get("line"), report.get("prestep") and
                 report["prestep"].get("error")):  # fmt: skip
        assert line is None or "\n" not in str(line), line
    _check_case(case, kind, run, outcome)


def _served(peer, kind: str, outcome: rules.Outcome, ends: list[rules.End]) -> dict:  # noqa: F811
    """The job as the controllers leave it in the Kubernetes API peer (its condition, its pods' last
    container states), and `fsdpctl job status -o json` of it."""
    from test_kube import add_claim, add_pod, cli, install_operator, kube, set_condition

    if kind == "pytorchjob":
        install_operator(peer)
    else:
        assert cli("deploy", "operator", "--timeout", "1", JOB_KIND=kind).exit_code == 0
        add_claim(peer, "fsdp", "fsx-claim")
    assert cli("job", "run", "-d", JOB_KIND=kind).exit_code == 0
    [job] = peer.objects("pytorchjobs" if kind == "pytorchjob" else "trainjobs")
    k = kube(peer)
    if outcome.phase != "Running":
        done = "Succeeded" if kind == "pytorchjob" else "Complete"
        set_condition(k, job, done if outcome.phase == "Succeeded" else "Failed", outcome.reason)
    last = {e.node: e for e in ends}
    for node, end in sorted(last.items()):
        state = {
            "terminated": {
                "exitCode": end.code,
                "reason": "Completed" if end.code == 0 else "Error",
            }
        }
        add_pod(k, peer, "fsdp", node, phase="Succeeded" if end.code == 0 else "Failed",
                containerStatuses=[{"name": "pytorch", "restartCount": 0, "state": state}])  # fmt: skip
    r = cli("job", "status", "-o", "json", JOB_KIND=kind)
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def _resumed(run: Run) -> list[int]:
    return [
        int(m)
        for text in run.logs.values()
        for m in re.findall(r"resumed from \S+ at step (\d+)", text)
    ]


def _stopped(run: Run) -> list[int]:
    return [
        int(m)
        for text in run.logs.values()
        for m in re.findall(r"disrupted \(SIGTERM: pod evicted\): stopped at step (\d+)", text)
    ]


def _check_case(case: str, kind: str, run: Run, outcome: rules.Outcome) -> None:
    report = run.report
    if case in ("skew", "eviction", "unwritable volume"):
        assert report["step"] == report["max_steps"] == 36, report
    if case == "skew":
        # node 1 started 8 s after node 0 (read_timeout = join_timeout: test_first_run.py), both
        # trained
        assert "started" in json.dumps(run.state) and all(FINISHED in t for t in run.logs.values())
    if case == "eviction":
        # the disruption checkpoint is where the job resumed: nothing trained before it is lost
        [stop] = sorted(set(_stopped(run)))
        assert stop >= run.extra["evicted_after"] and _resumed(run) == [stop], (
            _stopped(run),
            _resumed(run),
        )
        assert report["restarts"] == 1 and "evicted, exited with code 143; recreated" in run.logs[0]
        assert "another node was disrupted: starting torchrun again" in run.logs[1]
        assert outcome.recreated == 1
    if case == "unwritable volume":
        # the claim started as Lustre's root (root, 0755); the pre-step's root volume-prep gave the
        # job's directories to its user, and the pods ran as that user where this machine allows
        root = run.volume.stat()
        assert root.st_uid == 0 and stat.S_IMODE(root.st_mode) == 0o2775 and root.st_gid == 1000
        ckpts = run.volume / "checkpoints" / run.name
        assert ckpts.stat().st_uid == 1000 and stat.S_IMODE(ckpts.stat().st_mode) == 0o2775
        if run.uid is not None:
            assert report["identity"].startswith("uid 1000:1000"), report["identity"]
            newest = ckpts / (ckpts / "latest").read_text().strip()
            assert newest.stat().st_uid == 1000  # written by the pods' user, not by root
        assert report["prestep"]["phase"] == "Succeeded", report["prestep"]
    if case == "full volume":
        ckpts = run.volume / "checkpoints" / run.name
        latest = (ckpts / "latest").read_text().strip()
        assert (ckpts / latest / "meta.json").is_file()  # the last good save is whole and `latest`
        failure = report["failure"] or {}
        text = " ".join(str(v) for v in failure.values())
        assert "checkpoint at step" in text and ("full" in text or "space" in text), failure
        # and `job run`'s last lines say the disk is full in so many words (job_view.outcome,
        # issue 37), from the failure and the logs' tails it reads
        from types import SimpleNamespace

        from fsdpctl.cli import job_view

        tail = [line for t in run.logs.values() for line in t.splitlines()[-15:]]
        said = job_view.full_disk(SimpleNamespace(name="local"), report, tail)
        assert said and said.startswith("the disk is full"), (said, failure)
        saved = int(latest.rpartition("-")[2])
        assert (
            report["step"] - saved <= 4
        )  # lost: at most the steps since that save (CHECKPOINT_INTERVAL)
        if kind == "pytorchjob":
            assert "exited with code 1 (1-127 are permanent" in report["reason"], report["reason"]
        else:
            assert outcome.reason.startswith("BackoffLimitExceeded")


@pytest.mark.slow
def test_a_volume_nobody_can_write_fails_the_job_with_its_reason(runs):
    """The read-only claim: the pre-step's volume-prep fails with one line (EROFS), the pre-step is
    Failed in `job status`, and each trainer's wait for it ends at PRESTEP_TIMEOUT with one line and
    exit 2, which fails a PyTorchJob at once (no GPU waits for ever); a TrainJob restarts the
    container in place until its Job's backoffLimit."""
    run = runs["readonly"]
    assert run.report["phase"] == "Failed", run.report
    assert run.report["prestep"]["phase"] == "Failed"
    assert "Read-only file system" in run.report["prestep"]["error"], run.report["prestep"]
    assert "gave no result in 12 s (PRESTEP_TIMEOUT)" in json.dumps(run.report["failure"]), (
        run.report["failure"]
    )
    assert judged(run, "pytorchjob").phase == "Failed" and judged(run, "trainjob").phase == "Failed"


def _setting_keys() -> frozenset[str]:
    from fsdpctl.settings import setting_keys

    return frozenset(setting_keys())


SETTING_KEYS = _setting_keys()

"""The supervisor (`python -m fsdpctl.backends.local JOB_DIR`): starts the pods, applies the
Training Operator's restart policy to their exits, stops them as the kubelet would, and records how
the job ended."""

from __future__ import annotations

import os
import shutil
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fsdpctl import files
from fsdpctl.adapters import netns, shell
from fsdpctl.backends.local import kubelet, prestep_pod
from fsdpctl.backends.local.pods import (
    START_DELAYS_ENV,
    Launch,
    launches,
    mapped_env,
    pod_home,
    rendezvous,
    start_delays,
    volume_dirs,
)
from fsdpctl.backends.local.processes import POD_MARK, identity, kill_pod
from fsdpctl.backends.local.state import (
    STOP_GRACE_S,
    Identity,
    LocalJobError,
    log_dir,
    read_state,
    remove_temp_dirs,
    update,
)
from fsdpctl.backends.local.status import wants_network
from fsdpctl.job import crilog, failures
from fsdpctl.job.reports import Phase

if TYPE_CHECKING:
    from fsdpctl.job.render import Obj


def supervise(jdir: Path) -> int:
    spec = files.read_json(jdir / "spec.json")
    state = read_state(jdir)
    if state is None:
        raise LocalJobError(f"{jdir}: no state.json to supervise")
    # no lock of its own: the `job run` that started it held the job's lock (fsdpctl.job.lock) until
    # the state named this process, and a second run of the job is refused while it lives
    update(jdir, supervisor=identity(os.getpid()))
    logs = log_dir(state)
    stopping = {"flag": False}
    signal.signal(signal.SIGTERM, lambda *_: stopping.update(flag=True))
    server, pods, net = None, [], None
    _make_claims(spec)
    user, why = kubelet.as_user(spec.get("run_as"), _needs(spec, jdir))
    update(jdir, identity=_identity_note(spec.get("run_as"), user, why))
    pre = prestep_pod.start_prestep(spec, jdir, logs, user)
    try:
        if wants_network():
            net = netns.claim(spec["job"], spec["replicas"], {f"{spec['job']}-worker-0": 0})
        server, endpoint = rendezvous(spec, jdir, logs, net)
        pods = _pods(spec, endpoint, net, user)
        _start_due(pods, spec, logs)
        update(
            jdir,
            phase=Phase.RUNNING,
            started=time.time(),
            rdzv_endpoint=endpoint,
            **_placement(net, pods),
        )
        end = _run(pods, stopping, jdir, spec, net, pre)
    except Exception as e:  # recorded for `job status`; the traceback is in supervisor.log
        _signal(pods, signal.SIGKILL)
        update(jdir, phase=Phase.FAILED, finished=time.time(), reason=str(e))
        raise
    finally:
        _tear_down(jdir, spec, pods, server, net, pre)
    _drain(pods)
    update(
        jdir,
        phase=end.phase,
        finished=time.time(),
        reason=end.reason,
        failed_node=end.failed_node,
        **_placement(net, pods),
    )
    return 0


def _pods(spec: Obj, endpoint: str, net: netns.Network | None, user: list[str]) -> list[Pod]:
    """One pod per node, none started yet: a late node's (START_DELAYS_ENV) starts at its time."""
    # a session of its own per launcher: its process group is the pod's processes
    delays, now = start_delays(os.environ.get(START_DELAYS_ENV, "")), time.monotonic()
    return [
        Pod(launch, None, start_at=now + delays.get(launch.node, 0.0))
        for launch in launches(spec, endpoint, dict(os.environ), net, user)
    ]


def _tear_down(
    jdir: Path, spec: Obj, pods: list[Pod], server: Any, net: netns.Network | None, pre: Any
) -> None:
    """However the job ended: its processes, rendezvous server, network, pre-step and temp dirs
    gone."""
    # a pod's end leaves none of its processes behind (no orphans)
    _signal(pods, signal.SIGKILL)
    if server:
        server.stop()
    if net is not None:
        netns.destroy(net)
    prestep_pod.end_prestep(pre)
    remove_temp_dirs(jdir, spec["replicas"])


@dataclass
class Pod:
    """One replica's launcher, as the operator's pod for it: recreated (`relaunches`) when its exit
    code says so; started at `start_at` (monotonic), evicted when `kill_at` is set (SIGKILL then).
    """

    launch: Launch
    proc: Any  # subprocess.Popen, through shell.spawn; None until the pod starts
    relaunches: int = 0
    judged: bool = False  # its exit has been acted on
    start_at: float = 0.0
    kill_at: float | None = None  # an eviction's end of grace
    evicted: bool = False
    lost: bool = False  # its node is gone (engine.lose): no new pod until it is back

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


def _make_claims(spec: Obj) -> None:
    """Each claim the pods mount, as a new FSx file system's root (kubelet.make_claim)."""
    for mount, kind in spec.get("volume_kinds", {}).items():
        if kind == "persistentVolumeClaim" and mount in spec["volumes"]:
            kubelet.make_claim(Path(spec["volumes"][mount]))


def _needs(spec: Obj, jdir: Path) -> list[str]:
    """What a pod's user must reach: the interpreter and the packages the trainer imports, the job's
    directory (its pods' volumes), the claims, and every existing absolute path its environment
    names."""
    import importlib.util

    import fsdptrain

    torch = importlib.util.find_spec("torch")
    found = [sys.executable, sys.prefix, str(Path(fsdptrain.__file__).parent), str(jdir)]
    if torch is not None and torch.origin:
        found.append(str(Path(torch.origin).parent))
    found += list(spec.get("volumes", {}).values())
    found += [v for v in mapped_env(spec, 0).values() if v.startswith("/") and Path(v).exists()]
    return [f for f in dict.fromkeys(found) if "{node}" not in f]


def _identity_note(run_as: list[int] | None, user: list[str], why: str | None) -> str:
    """What `job status` says about the user the pods run as."""
    if not run_as:
        return "this machine's user (the pods name no other)"
    uid, gid = run_as
    if user:
        return f"uid {uid}:{gid}, as the pods' securityContext says"
    return f"this machine's user, not uid {uid} ({why})"


def _prepare_pod(spec: Obj, node: int, stop_at: str | None = None) -> None:
    """What the kubelet makes before a pod's containers start: its volumes' directories, the
    downward API file of its annotations (with the stop request, once `job stop` asked), its user's
    home."""
    dirs = volume_dirs(spec, node)
    kubelet.make_pod_dirs(dirs, spec.get("volume_kinds", {}))
    annotations = {**spec.get("annotations", {}), **({STOP_ANNOTATION: stop_at} if stop_at else {})}
    for mount, kind in spec.get("volume_kinds", {}).items():
        if kind == "downwardAPI" and mount in dirs:
            kubelet.write_annotations(dirs[mount], annotations)
    home = Path(pod_home(spec, node))
    home.mkdir(parents=True, exist_ok=True)
    if spec.get("run_as") and os.geteuid() == 0:
        os.chown(home, *spec["run_as"])


STOP_ANNOTATION = "fsdpctl.io/stop"  # fsdptrain.disruption.STOP_ANNOTATION


def _spawn(launch: Launch, log_dir: Path) -> Any:
    if launch.env.get("TMPDIR"):  # the pod's /tmp: any user of the pod writes there, as in /tmp
        Path(launch.env["TMPDIR"]).mkdir(parents=True, exist_ok=True)
        os.chmod(launch.env["TMPDIR"], 0o1777)
    cwd = Path(launch.cwd) if launch.cwd else None
    return shell.spawn(
        launch.argv, env=launch.env, log=log_dir / f"node-{launch.node}.log", stamped=True, cwd=cwd
    )


def _start_due(pods: list[Pod], spec: Obj, logs: Path, stop_at: str | None = None) -> None:
    """Start the pods whose time has come (a late node's pod waits for its start_at)."""
    for pod in pods:
        if pod.proc is None and time.monotonic() >= pod.start_at:
            _prepare_pod(spec, pod.launch.node, stop_at)
            pod.proc = _spawn(pod.launch, logs)


RELAY_DRAIN_S = 10


def _drain(pods: list[Pod]) -> None:
    """Wait for each pod's log relay to write what its pipes still hold (its processes are gone, so
    it ends), so that the job's end is recorded after its last line: readers of an ended job see it
    all."""
    deadline = time.monotonic() + RELAY_DRAIN_S
    for pod in pods:
        relay = getattr(pod.proc, "relay", None) if pod.proc is not None else None
        if relay is not None:
            try:
                relay.wait(max(0.0, deadline - time.monotonic()))
            except Exception:  # noqa: BLE001 - a relay held open by a stray process: the job ends anyway
                pass


def exit_code(returncode: int) -> int:
    """A launcher's return code as a container reports it: a death by signal N is 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


def verdict(code: int, policy: str) -> str:
    """'done', 'recreate' or 'fail': what the Training Operator does with a replica's container exit
    code under its restartPolicy (v1.9.4 pkg/controller.v1/common/pod.go): ExitCode recreates the
    pod for 128-255 (killed by a signal) and fails the job for 1-127 (pkg/util/train/train_util.go,
    IsRetryableExitCode); OnFailure and Always retry any; Never none."""
    if code == 0:
        return "done"
    if policy == "ExitCode":
        return "recreate" if code >= 128 else "fail"
    return "recreate" if policy in ("OnFailure", "Always") else "fail"


# Not the operator's: it recreates a pod that dies by a signal without bound (backoffLimit counts
# restarts in place, none under ExitCode: v1.9.4 pkg/core/job.go, PastBackoffLimit); the pods bound
# themselves through their start ledger (fsdptrain.disruption.record_start). This only keeps a
# broken local run from looping.
RECREATE_CAP = 100


def _run(
    pods: list[Pod],
    stopping: dict,
    jdir: Path,
    spec: Obj,
    net: netns.Network | None,
    pre: Any = None,
) -> failures.Ended:
    """Until every launcher has ended: start late pods, evict the ones asked for, recreate the ones
    the operator's policy retries; once the job is decided (a stop, a permanent failure, or success:
    a finished job's running pods are deleted, cleanPodPolicy Running), SIGTERM each launcher (the
    kubelet signals the container's first process, the launcher, which forwards it to torchrun) and
    SIGKILL every process after the pod's grace period. A stop first puts the stop annotation in
    every pod's downward API file (the trainers then read the SIGTERM as a stop, not an eviction).
    Returns how the job ended."""
    outcome: failures.Ended | None = None
    sent_at, stop_at = None, None
    while True:
        if outcome is None:
            _start_due(pods, spec, jdir / "logs" / spec["run_id"], stop_at)
            _evictions(pods, jdir, spec)
            _losses(pods, jdir, spec)
            prestep_pod.prestep_ended(pre, jdir)
            if stopping["flag"]:
                stop_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
                _request_stop(pods, spec, stop_at)
                update(jdir, phase=Phase.STOPPING)
                outcome = failures.Ended(Phase.STOPPED, None)
            else:
                outcome = _judge(pods, spec, jdir, net)
            if outcome is not None:
                _signal(pods, signal.SIGTERM)
                sent_at = time.monotonic()
        elif time.monotonic() - (sent_at or 0) > spec.get("grace_s", STOP_GRACE_S):
            _signal(pods, signal.SIGKILL)
        if outcome is not None and not any(p.running() for p in pods):
            return outcome
        time.sleep(0.2)


def _request_stop(pods: list[Pod], spec: Obj, stop_at: str) -> None:
    """`job stop` through the pods' annotations, as on a cluster: the kubelet rewrites each running
    pod's downward API file with fsdpctl.io/stop (here at once, where a kubelet takes up to its sync
    period)."""
    annotations = {**spec.get("annotations", {}), STOP_ANNOTATION: stop_at}
    for pod in pods:
        if pod.proc is None:
            continue
        for mount, kind in spec.get("volume_kinds", {}).items():
            if kind == "downwardAPI":
                kubelet.write_annotations(volume_dirs(spec, pod.launch.node)[mount], annotations)


def _evictions(pods: list[Pod], jdir: Path, spec: Obj) -> None:
    """The kubelet's part of an eviction (`evict`): SIGTERM to the pod's first process at once,
    SIGKILL to every process of the pod when terminationGracePeriodSeconds has passed."""
    requests = jdir / "evict"
    for request in sorted(requests.glob("node-*")) if requests.is_dir() else []:
        request.unlink(missing_ok=True)
        node = int(request.name.rpartition("-")[2])
        pod = next((p for p in pods if p.launch.node == node), None)
        if pod is not None and pod.running() and pod.kill_at is None:
            pod.evicted, pod.kill_at = True, time.monotonic() + spec.get("grace_s", STOP_GRACE_S)
            _log_note(
                jdir, node, f"fsdpctl: node {node} evicted (SIGTERM; SIGKILL after the pod's grace)"
            )
            os.kill(pod.proc.pid, signal.SIGTERM)
    for pod in pods:
        if pod.kill_at is not None and time.monotonic() > pod.kill_at and pod.running():
            kill_pod(pod.launch.env[POD_MARK])


def _losses(pods: list[Pod], jdir: Path, spec: Obj) -> None:
    """A node lost (engine.lose): every process of its pod SIGKILLed at once, as a node that powers
    off, and no new pod while the loss stands; the other nodes' agents see their workers fail and
    meet again at MIN..MAX nodes. Once it is back (engine.bring_back) its pod starts again and
    joins at the next rendezvous."""
    requests = jdir / "lost"
    gone = (
        {int(r.name.rpartition("-")[2]) for r in requests.glob("node-*")}
        if requests.is_dir()
        else set()
    )
    for pod in pods:
        node = pod.launch.node
        if node in gone and not pod.lost and pod.proc is not None:
            pod.lost, pod.judged = True, True  # not the operator's to judge: there is no pod
            kill_pod(pod.launch.env[POD_MARK])
            _log_note(
                jdir, node, f"fsdpctl: node {node} lost (every process killed; not recreated)"
            )
        elif pod.lost and node not in gone:
            if pod.proc is not None:
                pod.proc.wait()
            _log_note(jdir, node, f"fsdpctl: node {node} is back; its pod starts again")
            shutil.rmtree(jdir / "nodes" / f"node-{node}", ignore_errors=True)
            _prepare_pod(spec, node)
            state = read_state(jdir)
            pod.proc = _spawn(pod.launch, log_dir(state) if state else jdir / "logs")
            pod.lost, pod.judged = False, False


def _judge(
    pods: list[Pod], spec: Obj, jdir: Path, net: netns.Network | None
) -> failures.Ended | None:
    """Act on launchers that ended since the last look, as the Training Operator v1.9.4 does with a
    worker pod's exit code under its restartPolicy: how the job ended, once it is decided. Any
    worker that succeeded makes an elastic PyTorchJob Succeeded
    (pkg/controller.v1/pytorch/pytorchjob_controller.go, UpdateJobStatus); a non-retryable code
    fails it; a retryable one recreates the pod, and backoffLimit 0 fails the job at the first
    failed pod (pkg/controller.v1/common/job.go, exceedsBackoffLimit)."""
    done = 0
    for pod in pods:
        rc = pod.proc.poll() if pod.proc is not None else None
        if rc is None or pod.judged:
            done += pod.judged and pod.proc is not None and pod.proc.returncode == 0
            continue
        code, limit = exit_code(rc), spec.get("backoff_limit", 0)
        what = verdict(code, spec.get("restart_policy", "Never"))
        pod.judged = True
        kill_pod(pod.launch.env[POD_MARK])  # a container that ended takes its processes with it
        if what == "done":
            done += 1
            if spec.get("elastic") or done == len(pods):
                return failures.Ended(Phase.SUCCEEDED, None)
        elif what == "recreate" and limit > 0 and sum(p.relaunches for p in pods) < RECREATE_CAP:
            _recreate(pod, jdir, code)
            update(jdir, **_placement(net, pods))
        else:
            why = (
                "1-127 are permanent under restartPolicy ExitCode"
                if what == "fail"
                else f"backoffLimit {limit}"
            )
            reason = f"node {pod.launch.node} exited with code {code} ({why})"
            return failures.Ended(Phase.FAILED, reason, pod.launch.node)
    return None


def _log_note(jdir: Path, node: int, note: str) -> None:
    state = read_state(jdir)
    logs = log_dir(state) if state else jdir / "logs"
    with open(
        logs / f"node-{node}.log", "a"
    ) as log:  # one write: the old relay may still be appending
        log.write(crilog.format_line(time.time(), "stdout", note))


def _recreate(pod: Pod, jdir: Path, code: int) -> None:
    """A new pod for the replica: fresh emptyDirs, the same log file (marked), the same launch. An
    evicted pod's replacement lands on another node (its own was drained), whose disk has none of
    the old one's hostPath files (the /local scratch): only the claims carry over."""
    node = pod.launch.node
    shutil.rmtree(jdir / "nodes" / f"node-{node}", ignore_errors=True)
    if pod.evicted:
        shutil.rmtree(jdir / "hosts" / f"node-{node}", ignore_errors=True)
    why = "evicted, " if pod.evicted else ""
    _log_note(
        jdir,
        node,
        f"fsdpctl: node {node} {why}exited with code {code}; recreated, as the operator recreates the pod",
    )
    _prepare_pod(files.read_json(jdir / "spec.json"), node)
    state = read_state(jdir)
    logs = log_dir(state) if state else jdir / "logs"
    pod.proc, pod.relaunches, pod.judged = _spawn(pod.launch, logs), pod.relaunches + 1, False
    pod.kill_at, pod.evicted = None, False


def _placement(net: netns.Network | None, pods: list[Pod]) -> dict:
    why = netns.available()[1] or "FSDPCTL_LOCAL_NETNS=0"
    note = (
        f"a network namespace per node ({netns.SUBNET_PREFIX}.{net.index}.0/24)"
        if net
        else f"loopback ({why})"
    )
    launchers = [
        {
            "node": p.launch.node,
            **_launcher_identity(p),
            "rc": p.proc.returncode if p.proc is not None else None,
            "address": net.address(p.launch.node) if net else "127.0.0.1",
            "relaunches": p.relaunches,
        }
        for p in pods
    ]
    return {"network": note, "net_index": net.index if net else None, "launchers": launchers}


def _launcher_identity(p: Pod) -> Identity:
    """The launcher's identity for the state; a pod not started yet (a late node) has none."""
    if p.proc is None:
        return {"pid": None, "start": None, "boot": None}
    return identity(p.proc.pid) or {"pid": p.proc.pid, "start": None, "boot": None}


def _signal(pods: list[Pod], sig: int) -> None:
    """SIGTERM to each running launcher, as the kubelet sends it to a container's first process;
    SIGKILL to every process of the pod (its mark), as the runtime ends a container after the grace
    period: workers in sessions of their own and orphans of a launcher that already died included.
    """
    for p in pods:
        if sig == signal.SIGKILL:
            kill_pod(p.launch.env[POD_MARK])
        elif p.running():
            try:
                os.kill(p.proc.pid, sig)
            except ProcessLookupError:
                pass

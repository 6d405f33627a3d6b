"""What a job on the cluster is doing (BACKEND=eks): its pods, its leader's log, its status report
and its pre-step's, the job list, the logs of its pods, and its run record (a ConfigMap). Read
through the Kubernetes adapter; what the objects mean is the pure `kstatus`'s."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

from fsdpctl.backends.eks import configmap
from fsdpctl.backends.eks.api import calls, get_job, owned_by, require_job
from fsdpctl.errors import FsdpctlError
from fsdpctl.job import crilog, failures, kstatus, owner, prestep, render, world
from fsdpctl.job import policy as jobpolicy
from fsdpctl.job import record as run_record
from fsdpctl.job.crilog import LogLine
from fsdpctl.job.kube_shapes import BatchJob
from fsdpctl.job.progress import parse_events, progress, stage, stalled
from fsdpctl.job.reports import PrestepReport, Report
from fsdpctl.settings import Config
from fsdptrain import fetch
from fsdptrain.events import Step, World

LOG_TAIL = (
    3000  # lines of the leader's log read for progress (the trainer writes one JSON line per step)
)


def prestep_report(kube, cfg: Config, name: str) -> PrestepReport | None:
    """The pre-step Job of job `name`: its phase, and its progress from its pod's log; None without
    one."""
    from fsdpctl.adapters.kube import KubeError

    with calls(cfg, f"reading the pre-step of {name}"):
        # the API server's batch/v1 Job, parsed JSON: what job_phase reads of it is BatchJob's
        fetch_job: BatchJob | None = kube.get(
            "batch/v1", "Job", prestep.job_name(name), cfg.job_namespace
        )
        if fetch_job is None:
            return None
        pods = kube.list("v1", "Pod", cfg.job_namespace, {prestep.OF_LABEL: name})
    lines: list[str] = []
    if pods:  # the newest: a pod lost and retried by the Job starts over, and says so
        newest = max(pods, key=lambda p: p["metadata"].get("creationTimestamp", ""))
        try:
            lines = list(
                kube.logs(
                    cfg.job_namespace, newest["metadata"]["name"], prestep.CONTAINER, tail=200
                )
            )
        except KubeError:  # not started yet
            lines = []
    phase, reason = prestep.job_phase(fetch_job)
    return prestep.report(fetch.parse(lines), phase, reason)


def pods_of(kube, cfg: Config, name: str) -> list[dict]:
    with calls(cfg, f"listing pods of {name}"):
        return kube.list("v1", "Pod", cfg.job_namespace, {"fsdpctl.io/job": name})


def log_lines(kube, cfg: Config, pod: str, tail: int | None = LOG_TAIL) -> list[str]:
    from fsdpctl.adapters.kube import KubeError

    try:
        return list(kube.logs(cfg.job_namespace, pod, _container(cfg), tail=tail))
    except KubeError:  # not started yet, or gone: no log is a state, not an error
        return []


def _container(cfg: Config) -> str:
    return "node" if render.job_api(cfg)[1] == "TrainJob" else "pytorch"


def find_leader(kube, cfg: Config, pods: list[dict]) -> tuple[dict | None, list[str]]:
    """(leader pod, its log lines): replica 0 first, then whichever pod its agent names as
    master_addr."""
    first = kstatus.leader(pods)
    if first is None:
        return None, []
    lines = log_lines(kube, cfg, first["metadata"]["name"])
    named = kstatus.leader(pods, lines)
    if named is not None and named is not first:
        return named, log_lines(kube, cfg, named["metadata"]["name"])
    return first, lines


def _ranged(job: render.Obj) -> bool:
    """Whether the job has an elastic range (a PyTorchJob's elasticPolicy below its maximum)."""
    policy = (job.get("spec") or {}).get("elasticPolicy") or {}
    return int(policy.get("minReplicas") or 0) < int(policy.get("maxReplicas") or 0)


def _is_world(line: str) -> bool:
    """A line that tells of world changes: a `world` event, or a `summary` or `finished` line
    carrying the job's history (world.changes reads both)."""
    return '"world' in line and any(
        isinstance(e, World) or getattr(e, "world_changes", None) for e in parse_events([line])
    )


class Seen(NamedTuple):
    """What a job's logs say, for `report` and `record_of`: the leader pod and its lines, the
    `world` event lines of the others, and the job's restarts as users count them."""

    lead: render.Obj | None
    lines: list[str]
    worlds: list[str]
    restarts: int


def seen(kube, cfg: Config, job: render.Obj, pods: list[render.Obj]) -> Seen:
    """Without a range: the leader as `find_leader` finds it. With one, rank 0 moves: after node 0
    was lost it is on another pod, and replica 0's new pod has no step yet. So every pod's log is
    read (LOG_TAIL lines each) and the leader is the pod whose log has the newest step (only rank 0
    prints steps: fsdptrain.train), else replica 0; each new world's rank 0 printed its `world`
    event (fsdptrain.elastic) wherever it was; and each agent logs every restart of the group it
    saw (kstatus.GROUP_RESTART), so the most any pod's log shows is the job's. A growth is a new
    rendezvous round, not a failure: not a restart, taken off each log's count only where that log
    holds it (kstatus.growths_logged)."""
    nodes = _replicas(job)
    if not _ranged(job):
        lead, lines = find_leader(kube, cfg, pods)
        grew = world.grew(world.changes(lines))
        return Seen(lead, lines, [], max(0, kstatus.restarts(pods, lines, nodes) - grew))
    logs = {p["metadata"]["name"]: log_lines(kube, cfg, p["metadata"]["name"]) for p in pods}
    lead = max(
        pods,
        key=lambda p: (_last_step(logs[p["metadata"]["name"]]), -kstatus.rank0_index(p)),
        default=None,
    )
    if lead is not None and _last_step(logs[lead["metadata"]["name"]]) < 0:
        lead = kstatus.leader(pods)
    name = lead["metadata"]["name"] if lead else None
    lines = logs.get(name, []) if name else []
    others = [line for n, got in logs.items() if n != name for line in got if _is_world(line)]
    worlds = world.changes([*lines, *others])
    # the agents in the group at a growth log their restart for the joining node, and their
    # launchers may start torchrun again (a ledger start): a log that holds neither (the joining
    # pod's) has nothing to take off
    most = max(
        (
            max(0, kstatus.restarts(pods, got, nodes) - kstatus.growths_logged(got))
            for got in logs.values()
        ),
        default=0,
    )
    # a shrink's restart was logged by the survivors' agents, whose pods may be gone (the leader's
    # summary still carries the change itself)
    return Seen(lead, lines, others, max(most, world.shrank(worlds)))


def _last_step(lines: list[str]) -> float:
    return max((e.time for e in parse_events(lines) if isinstance(e, Step)), default=-1.0)


def container_env(job: dict) -> dict[str, str]:
    """The plain `value` env entries of the job's pod template (PyTorchJob or TrainJob: wherever in
    the object a container's env list is)."""
    found: dict[str, str] = {}

    def walk(node: object) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "env" and isinstance(value, list):
                    plain = [e for e in value if isinstance(e, dict) and "value" in e]
                    found.update({e["name"]: e["value"] for e in plain})
                else:
                    walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(job)
    return found


def leader_events(kube, cfg: Config, name: str) -> list:
    """The events of the leader pod's whole log (not only the LOG_TAIL lines `report` reads)."""
    require_job(kube, cfg, name)
    lead, _ = find_leader(kube, cfg, pods_of(kube, cfg, name))
    return parse_events(log_lines(kube, cfg, lead["metadata"]["name"], tail=None)) if lead else []


def report(
    kube, cfg: Config, name: str, stall_after: float = float("inf"), job: dict | None = None
) -> Report:
    job = job or require_job(kube, cfg, name)
    pods = pods_of(kube, cfg, name)
    lead, lines, other_worlds, restarts = seen(kube, cfg, job, pods)
    now = time.time()
    prog = progress(parse_events(lines), now)
    pending = [
        p["metadata"]["name"]
        for p in pods
        if p.get("status", {}).get("phase", "Pending") == "Pending"
    ]
    events = {p: kube.events(cfg.job_namespace, p) for p in pending}
    network, net_warning = kstatus.network_path(lines, cfg.uses_efa)
    phase = kstatus.phase(job)
    labels = job.get("metadata", {}).get("labels", {})
    by_state = kstatus.pods_by_state(pods)
    worlds = world.changes([*lines, *other_worlds])
    r: Report = {
        "job": name,
        "backend": "eks",
        "kind": job["kind"],
        "phase": phase,
        "run_id": labels.get("fsdpctl.io/run-id", "-"),
        "nodes": _replicas(job),
        "nodes_running": by_state.get("Running", 0),
        "pods": by_state,
        "restarts": restarts,
        "world_changes": [world.text(c) for c in worlds],
        "age_s": kstatus.age(job, now),
        "leader": lead["metadata"]["name"] if lead else None,
        "leader_log": f"pod/{lead['metadata']['name']}" if lead else None,
        "checkpoint_dir": jobpolicy.checkpoint_dir(cfg, name),
        **prog,
        "reason": kstatus.failure_reason(job),
        "problems": kstatus.scheduling_problems(pods, events),
        "network": network,
        "network_warning": net_warning,
        "labels": dict(labels),
        "prestep": prestep_report(kube, cfg, name),
        "stalled": False,
    }
    return _judged(r, cfg, job, lines, prog, stall_after)


def _judged(
    r: Report, cfg: Config, job: render.Obj, lines: list[str], prog: Any, stall_after: float
) -> Report:
    """`r` with what its facts mean: how far a start got, a stall, the restart budget."""
    phase, name = r["phase"], r["job"]
    if not prog["max_steps"]:  # before the first step: how far the start got (the leader's lines)
        r["stage"] = stage(parse_events(lines), None, r["nodes"])
    r["stalled"] = stalled(phase, prog, r["age_s"], stall_after)
    if r["prestep"] and r["prestep"]["phase"] in ("Pending", "Running") and not r["step"]:
        r["stalled"] = False  # no step yet because the trainers wait for the pre-step, not a hang
    if r["stalled"]:  # the dumps are on the pods' volume: say where
        r["problems"].append(
            kstatus.flight_recorder_note(jobpolicy.nccl_trace_file(cfg, name), None)
        )
    if r["restarts"] or phase == "Restarting":
        r["problems"].append(kstatus.on_failure(job["kind"], cfg.max_restarts))
    gave_up = failures.root_cause(lines) is not None
    if spent := failures.budget_spent(phase, r["restarts"], cfg.max_restarts, gave_up):
        r["reason"] = f"{spent}: {r['reason']}" if r["reason"] else spent
    return r


def _replicas(job: dict) -> int:
    spec = job.get("spec", {})
    if "pytorchReplicaSpecs" in spec:
        return sum(r.get("replicas", 1) for r in spec["pytorchReplicaSpecs"].values())
    return spec.get("trainer", {}).get("numNodes", 1)


def list_jobs(kube, cfg: Config) -> list[Report]:
    api, kind = render.job_api(cfg)
    with calls(cfg, "listing jobs"):
        jobs = kube.list(api, kind, cfg.job_namespace, {"app.kubernetes.io/managed-by": "fsdpctl"})
    return [report(kube, cfg, j["metadata"]["name"], job=j) for j in jobs]


def logs(
    kube,
    cfg: Config,
    name: str,
    *,
    follow: bool,
    pod: str | None,
    all_pods: bool,
    tail: int | None = None,
    since_s: float | None = None,
    keep: Callable[[LogLine], bool] | None = None,
) -> Iterator[LogLine]:
    """The chosen pods' lines with their times: tail and since are the API's tailLines and
    sinceSeconds (whole seconds, rounded up as kubectl does), times from ?timestamps=true. With
    `keep`, the tail counts kept lines (`_kept_tail`)."""
    require_job(kube, cfg, name)
    pods = pods_of(kube, cfg, name)
    if pod:
        chosen = [p for p in pods if p["metadata"]["name"] == pod]
        if not chosen:
            raise FsdpctlError(
                f"job {name} has no pod {pod!r}",
                hint="pods: " + (", ".join(p["metadata"]["name"] for p in pods) or "none yet"),
            )
    elif all_pods:
        chosen = sorted(pods, key=lambda p: (kstatus.rank0_index(p), p["metadata"]["name"]))
    else:
        lead, _ = find_leader(kube, cfg, pods)
        chosen = [lead] if lead else []
    if not chosen:
        raise FsdpctlError(
            f"job {name} has no pods yet", hint="`fsdpctl job status` shows why (Pending reasons)"
        )
    since_whole = math.ceil(since_s) if since_s is not None else None
    where = [{"pod": p["metadata"]["name"], "container": _container(cfg)} for p in chosen]
    if keep is not None:
        streams = [(w, _kept(kube, cfg, w, follow, tail, since_whole, keep)) for w in where]
    else:
        streams = [(w, _stream(kube, cfg, w, follow, tail, since_whole)) for w in where]
    if len(streams) == 1 or not follow:  # kubectl prints pod after pod unless it follows them
        for _, stream in streams:
            yield from stream
        return
    yield from _interleave(streams)


def _stream(
    kube, cfg: Config, where: dict[str, str], follow: bool, tail: int | None, since_s: int | None
) -> Iterator[LogLine]:
    for raw in kube.logs(
        cfg.job_namespace,
        where["pod"],
        where["container"],
        follow=follow,
        tail=tail,
        since_seconds=since_s,
        timestamps=True,
    ):
        stamp, _, text = raw.partition(" ")
        try:
            yield LogLine(where, text, crilog.parse_time(stamp))
        except (
            ValueError
        ):  # no time in front (not a kubelet's answer to timestamps=true): the line whole
            yield LogLine(where, raw)


def _kept(
    kube,
    cfg: Config,
    where: dict[str, str],
    follow: bool,
    tail: int | None,
    since_s: int | None,
    keep: Callable[[LogLine], bool],
) -> Iterator[LogLine]:
    """A pod's kept lines, the last `tail` of them: the API's tailLines counts every line, so the
    log there is read whole (the kubelet keeps a bounded file), the kept ones taken from its end;
    following then asks for what came since the last of them (sinceSeconds, whole seconds: a line
    already shown is not shown again)."""
    backlog = [x for x in _stream(kube, cfg, where, False, None, since_s) if keep(x)]
    shown = backlog[-tail:] if tail is not None else backlog
    shown = shown if tail != 0 else []
    yield from shown
    if not follow:
        return
    last = backlog[-1].time if backlog else None
    seen = {(x.time, x.text) for x in backlog if x.time is not None and x.time == last}
    ago = None if last is None else max(1, math.ceil(time.time() - last) + 1)
    for x in _stream(kube, cfg, where, True, None, ago if ago is not None else since_s):
        if last is not None and x.time is not None and (x.time < last or (x.time, x.text) in seen):
            continue
        if keep(x):
            yield x


def _interleave(streams: list[tuple[dict[str, str], Iterator[LogLine]]]) -> Iterator[LogLine]:
    """Every pod's lines as they arrive (a thread per stream)."""
    import queue
    import threading

    q: queue.Queue = queue.Queue()

    def pump(where: dict[str, str], stream: Iterator[LogLine]) -> None:
        try:
            for line in stream:
                q.put(line)
        except Exception as e:  # noqa: BLE001 - one pod's stream ending badly must not stop the others
            q.put(LogLine(where, f"(log stream ended: {e})"))
        finally:
            q.put(None)

    for where, stream in streams:
        threading.Thread(target=pump, args=(where, stream), daemon=True).start()
    open_streams = len(streams)
    while open_streams:
        item = q.get()
        if item is None:
            open_streams -= 1
        else:
            yield item


def _a_record_of(cm: render.Obj, name: str) -> bool:
    """A ConfigMap fsdpctl made for job `name` (from any home: a teammate's run is read, not
    changed); one of that name that someone else made is not the job's record."""
    labels = cm["metadata"].get("labels") or {}
    mark = owner.of_labels(labels)
    return (mark.home is not None and mark.job == name) or labels.get(
        "fsdpctl.io/record-of"
    ) == name


def _ours(obj: render.Obj, name: str) -> bool:
    """Whether `obj` is this home's job `name`'s: only then is it written to."""
    mark = owner.of_labels(obj["metadata"].get("labels"))
    return owner.why_not_ours(mark, owner.home_id(), name) is None


def record_of(
    kube, cfg: Config, name: str
) -> tuple[run_record.RunRecord | None, list[str], list[str]]:
    """(the run record of job `name` from its ConfigMap, the leader's log lines, problems). What the
    cluster learnt since the start (the image digest its pods report, the trainer's `start` event)
    is merged and written back into the ConfigMap, so it stays once the pods are gone. (None, [],
    []) without a ConfigMap."""
    from fsdpctl.adapters.kube import KubeError

    with calls(cfg, f"reading the run record of {name}"):
        cm = kube.get("v1", "ConfigMap", configmap.config_map_name(name), cfg.job_namespace)
    if cm is None or not _a_record_of(cm, name):
        return None, [], []
    try:
        rec = configmap.from_config_map(cm)
    except ValueError as e:
        raise FsdpctlError(
            f"ConfigMap {configmap.config_map_name(name)} holds no run record ({e})"
        ) from e
    job = get_job(kube, cfg, name)
    cm_name = configmap.config_map_name(name)
    damaged = run_record.problem(rec)
    problems = [f"ConfigMap {cm_name}: the record {damaged}"] if damaged else []
    if job is None:
        return rec, [], [*problems, f"job {name} is gone: the record is as it was last read"]
    if (job["metadata"].get("annotations") or {}).get(configmap.ANNOTATION) != rec.get("hash"):
        problems.append(
            f"job {name}'s {configmap.ANNOTATION} annotation does not match ConfigMap {cm_name}"
        )
    pods = pods_of(kube, cfg, name)
    _, lines, other_worlds, _ = seen(kube, cfg, job, pods)
    digest = configmap.image_digest(pods, _container(cfg))
    now = run_record.learnt(configmap.with_digest(rec, digest), [*lines, *other_worlds])
    if now != rec and not problems and _ours(cm, name) and _ours(job, name):
        kept = configmap.config_map(now, cfg.job_namespace)
        labels = {**(cm["metadata"].get("labels") or {}), **kept["metadata"]["labels"]}
        kept = {**kept, "metadata": {**kept["metadata"], "labels": labels}}
        try:  # worth keeping, not worth failing for: a user who may read but not write ConfigMaps
            kube.apply(owned_by(kept, job))
        except KubeError as e:
            problems.append(f"the learnt facts were not saved in the ConfigMap: {e}")
    return now, lines, problems

"""Jobs on a Kubernetes cluster (BACKEND=eks): run, report, stop, wait, logs, cleanup. Orchestration
over the Kubernetes adapter; what the objects mean is read by the pure `kstatus` and `progress`
modules."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from contextlib import contextmanager

from fsdpctl import crilog, failures, jobpolicy, kstatus, prestep, render, volume
from fsdpctl import record as run_record
from fsdpctl.crilog import LogLine
from fsdpctl.errors import ExitCode, FsdpctlError
from fsdpctl.progress import parse_events, progress, stage, stalled
from fsdpctl.reports import FINAL, TIMEOUT, Phase, PrestepReport, Report, Waited
from fsdpctl.settings import Config
from fsdptrain import fetch

LOG_TAIL = (
    3000  # lines of the leader's log read for progress (the trainer writes one JSON line per step)
)


def connect(cfg: Config):
    """The cluster from the kubeconfig (KUBE_CONTEXT), or one line naming the command that fixes it."""
    try:
        from fsdpctl.adapters.kube import Kube, NoCluster
    except ImportError as e:
        raise FsdpctlError(
            "the kubernetes client is not installed", hint="pip install 'fsdpctl[k8s]'"
        ) from e
    try:
        return Kube.connect(cfg.kube_context, timeout=cfg.request_timeout)
    except NoCluster as e:
        raise FsdpctlError(f"no Kubernetes cluster to talk to: {e}", hint=_cluster_hint(cfg)) from e


def _cluster_hint(cfg: Config) -> str:
    return f"aws eks update-kubeconfig --name {cfg.cluster_name} --region {cfg.aws_region}" + (
        " (or fix KUBE_CONTEXT)" if cfg.kube_context else ""
    )


def explain(e, cfg: Config, what: str) -> FsdpctlError:
    """A KubeError as one line with its fix."""
    api, kind = render.job_api(cfg)
    if e.status == 404 and (
        "resource" in e.message.lower() or "the server could not find" in e.message.lower()
    ):
        return FsdpctlError(
            f"{what}: the {kind} CRD ({api}) is not installed on this cluster",
            hint="fsdpctl deploy operator",
        )
    if e.status == 403:
        return FsdpctlError(
            f"{what}: forbidden: {e.message}",
            hint="your kubeconfig user needs RBAC rights in namespace "
            f"{cfg.job_namespace} (kubectl auth can-i --list -n {cfg.job_namespace})",
        )
    if e.status == 404 and "namespace" in e.message.lower():
        return FsdpctlError(
            f"{what}: namespace {cfg.job_namespace} does not exist",
            hint="`fsdpctl job run` creates it; or fix JOB_NAMESPACE",
        )
    return FsdpctlError(f"{what}: {e}")


@contextmanager
def calls(cfg: Config, what: str) -> Iterator[None]:
    """Turns the adapter's errors inside the block into one line with the fix."""
    from fsdpctl.adapters.kube import KubeError, NoCluster

    try:
        yield
    except KubeError as e:
        raise explain(e, cfg, what) from e
    except NoCluster as e:
        raise FsdpctlError(
            f"{what}: {e}",
            hint=f"check the cluster is up and the kubeconfig points at it: {_cluster_hint(cfg)}",
        ) from e


def get_job(kube, cfg: Config, name: str) -> dict | None:
    api, kind = render.job_api(cfg)
    with calls(cfg, f"reading job {name}"):
        kube.list(
            api, kind, cfg.job_namespace, {"fsdpctl.io/job": name}
        )  # 404 here: the CRD is missing
        return kube.get(api, kind, name, cfg.job_namespace)


def require_job(kube, cfg: Config, name: str) -> dict:
    job = get_job(kube, cfg, name)
    if job is None:
        raise FsdpctlError(
            f"no job named {name!r} in namespace {cfg.job_namespace}",
            hint="`fsdpctl job list` shows the jobs; `fsdpctl job run` starts one",
            code=ExitCode.JOB_NOT_FOUND,
        )
    return job


def run(
    kube,
    cfg: Config,
    *,
    run_id: str | None,
    replace: bool,
    token: str,
    server_dry_run: bool = False,
    record: dict | None = None,
) -> dict:
    """Namespace (+ etcd) applied, the Secret applied, the job created. A job of the same name is
    refused unless `replace`, which deletes it first (its pods get SIGTERM and checkpoint). With a
    run `record` (fsdpctl.record) the job carries its hash and the ConfigMap <job>-record, owned by
    the job, holds it."""
    run_id = run_id or jobpolicy.new_run_id(cfg.job_name)
    objs = render.render_job(cfg, run_id, record["id"] if record else "")
    *infra, job = objs
    if record is not None:
        job = run_record.annotated(job, record)
        record = {**record, "manifests": render.to_yaml([*infra, job])}
    # the pre-step and the disruption budget: created owned by the job, so they go with it
    fetch_jobs = [o for o in infra if o["kind"] in DEPENDENTS]
    infra = [o for o in infra if o["kind"] not in DEPENDENTS]
    existing = get_job(kube, cfg, cfg.job_name)  # first: a missing CRD is the first thing to fix
    require_claims(kube, cfg)
    if existing is not None and not server_dry_run:
        if not replace:
            raise FsdpctlError(
                f"job {cfg.job_name} already exists ({kstatus.phase(existing)})",
                hint="`fsdpctl job run --replace` replaces it; `fsdpctl job stop` removes it",
                # refused before anything changed, as a local job already running
                code=ExitCode.BAD_INPUT,
            )
        stop(kube, cfg, cfg.job_name, wait=True)
    with calls(cfg, f"starting job {cfg.job_name}"):
        for obj in infra:
            kube.apply(obj, dry_run=server_dry_run)
        kube.apply(render.render_secret(cfg, token, run_id), dry_run=server_dry_run)
        if server_dry_run:
            for obj in [*fetch_jobs, job]:
                kube.apply(obj, dry_run=True)
        else:
            for obj in fetch_jobs:
                _clear_prestep(kube, cfg, obj)
            created = kube.create(job)
            for obj in fetch_jobs:
                kube.create(_owned_by(obj, created))
            if record is not None:
                kube.apply(_owned_by(run_record.config_map(record, cfg.job_namespace), created))
    return {
        "job": cfg.job_name,
        "run_id": run_id,
        "record": record,
        "objects": [f"{o['kind']}/{o['metadata']['name']}" for o in [*infra, *fetch_jobs, job]],
    }


DEPENDENTS = ("Job", "PodDisruptionBudget")


def _clear_prestep(kube, cfg: Config, obj: dict) -> None:
    """A pre-step Job or budget an older run left (one applied from `fsdpctl manifest`, owned by
    nothing): a Job's pod template cannot be changed, so it goes before the new one is created."""
    api, kind, name = obj["apiVersion"], obj["kind"], obj["metadata"]["name"]
    if kube.delete(api, kind, name, cfg.job_namespace, propagation="Background"):
        _wait_gone(kube, api, kind, name, cfg.job_namespace, 120)


def _owned_by(obj: dict, owner: dict) -> dict:
    """`obj` as a dependent of `owner`: deleting the training job (stop, cleanup, --replace) deletes
    its pre-step Job and that Job's pod with it (the garbage collector's ownerReferences)."""
    meta = owner["metadata"]
    ref = {
        "apiVersion": owner["apiVersion"],
        "kind": owner["kind"],
        "name": meta["name"],
        "uid": meta["uid"],
    }
    return {**obj, "metadata": {**obj["metadata"], "ownerReferences": [ref]}}


def prestep_report(kube, cfg: Config, name: str) -> PrestepReport | None:
    """The pre-step Job of job `name`: its phase, and its progress from its pod's log; None without
    one."""
    from fsdpctl.adapters.kube import KubeError

    with calls(cfg, f"reading the pre-step of {name}"):
        fetch_job = kube.get("batch/v1", "Job", prestep.job_name(name), cfg.job_namespace)
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


def require_claims(kube, cfg: Config) -> None:
    """Refuse before creating anything when a claim the pods mount is missing: the scheduler would
    leave every pod Pending ('persistentvolumeclaim "..." not found', kube-scheduler's VolumeBinding
    plugin)."""
    for key, claim in (
        ("SHARED_VOLUME", cfg.shared_volume),
        ("CHECKPOINT_PVC", cfg.checkpoint_pvc),
    ):
        if not claim:
            continue
        with calls(cfg, f"checking {key}"):
            found = kube.get("v1", "PersistentVolumeClaim", claim, cfg.job_namespace)
        if found is None:
            raise FsdpctlError(
                f"{key}={claim!r}: no PersistentVolumeClaim {claim} in namespace {cfg.job_namespace}; "
                "the pods would stay Pending",
                hint=f"create it (FSx for Lustre: `fsdpctl deploy storage`), set {key} to an existing "
                f"claim, or {key}='' for pod-local disks (single node only)",
                code=ExitCode.BAD_INPUT,
            )
        if key == "SHARED_VOLUME" and (problem := claim_capacity_problem(cfg, found)):
            raise FsdpctlError(problem, code=ExitCode.BAD_INPUT)


def claim_capacity_problem(cfg: Config, claim: dict) -> str | None:
    """The bound claim's capacity as the cluster reports it (status.capacity.storage: the PV's, the
    FSx file system's size) against what the job keeps there; a claim not bound yet says nothing."""
    given = ((claim.get("status") or {}).get("capacity") or {}).get("storage")
    capacity = volume.quantity_bytes(str(given)) if given else None
    if capacity is None:
        return None
    name = claim["metadata"]["name"]
    return volume.capacity_problem(cfg, capacity, f"PersistentVolumeClaim {name} ({given})")


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
    lead, lines = find_leader(kube, cfg, pods)
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
    r: Report = {
        "job": name,
        "backend": "eks",
        "kind": job["kind"],
        "phase": phase,
        "run_id": labels.get("fsdpctl.io/run-id", "-"),
        "nodes": _replicas(job),
        "nodes_running": by_state.get("Running", 0),
        "pods": by_state,
        "restarts": kstatus.restarts(pods, lines),
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
    if not prog[
        "max_steps"
    ]:  # before the first step: how far the start got (the leader pod's lines)
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


# The kubelet rewrites a pod's downward API files on its next sync of the pod (syncFrequency: 1
# minute by default, plus its pod cache), so a stop annotation reaches the trainers within about a
# minute.
STOP_NOTICE_S = 90


def stop(kube, cfg: Config, name: str, wait: bool = True, timeout: float = 300) -> bool:
    """Ask the trainers to stop, then delete the job with foreground propagation. The stop request
    is the annotation fsdpctl.io/stop on each running pod, which the trainers read through their
    downward API file (fsdptrain.disruption): they checkpoint and exit 0, where a SIGTERM alone
    reads as an eviction (checkpoint, come back). The pods get their grace plus the kubelet's
    refresh before the job is deleted and whatever still runs gets SIGTERM. False when there was
    nothing to stop."""
    api, kind = render.job_api(cfg)
    with calls(cfg, f"stopping job {name}"):
        if kube.get(api, kind, name, cfg.job_namespace) is None:
            return False
        if request_stop(kube, cfg, name) and wait:
            _wait_pods_ended(kube, cfg, name, jobpolicy.stop_timing(cfg).grace_s + STOP_NOTICE_S)
        gone = not kube.delete(api, kind, name, cfg.job_namespace, propagation="Foreground")
        if gone:
            return False
        if wait:
            _wait_gone(kube, api, kind, name, cfg.job_namespace, timeout)
    return True


def request_stop(kube, cfg: Config, name: str) -> list[str]:
    """The stop annotation on the job (`status` and `wait` then say Stopped, not Succeeded) and on
    every running pod of it (its trainers read it); the pods annotated."""
    from fsdpctl.adapters.kube import KubeError

    stamp = {
        "metadata": {
            "annotations": {
                render.STOP_ANNOTATION: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            }
        }
    }
    api, kind = render.job_api(cfg)
    kube.merge_patch(api, kind, name, cfg.job_namespace, stamp)
    running = [p["metadata"]["name"] for p in pods_of(kube, cfg, name) if _running(p)]
    done = []
    for pod in running:
        try:
            kube.merge_patch("v1", "Pod", pod, cfg.job_namespace, stamp)
            done.append(pod)
        except KubeError as e:
            if e.status != 404:  # one that ended meanwhile needs no request
                raise
    return done


def _running(pod: dict) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Running", "Pending")


def _wait_pods_ended(kube, cfg: Config, name: str, timeout: float) -> None:
    """Until none of the job's pods runs (their trainers saved and exited), at most `timeout`
    seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(_running(p) for p in pods_of(kube, cfg, name)):
        time.sleep(2)


def _wait_gone(kube, api: str, kind: str, name: str, namespace: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while kube.get(api, kind, name, namespace) is not None:
        if time.monotonic() > deadline:
            raise FsdpctlError(
                f"{kind} {name} still exists after {timeout:.0f} s",
                hint="its pods may be stuck terminating: `kubectl get pods -n " + namespace + "`",
            )
        for event, obj in kube.watch(
            api, kind, namespace, timeout=max(1, int(min(10, deadline - time.monotonic())))
        ):
            if event == "DELETED" and obj["metadata"]["name"] == name:
                return


def wait(kube, cfg: Config, name: str, timeout: float | None) -> Waited:
    """The job's final phase, following it through watch events; 'Timeout' when `timeout` passes
    first and 'Stopped' when it is deleted while waited for."""
    api, kind = render.job_api(cfg)
    job = require_job(kube, cfg, name)
    deadline = time.monotonic() + timeout if timeout else float("inf")
    with calls(cfg, f"waiting for job {name}"):
        while True:
            phase = kstatus.phase(job)
            if phase in FINAL:
                return phase
            left = deadline - time.monotonic()
            if left <= 0:
                return TIMEOUT
            for event, obj in kube.watch(
                api,
                kind,
                cfg.job_namespace,
                {"fsdpctl.io/job": name},
                timeout=max(1, int(min(60, left))),
            ):
                if obj["metadata"]["name"] != name:
                    continue
                if event == "DELETED":
                    return Phase.STOPPED
                job = obj
                if kstatus.phase(job) in FINAL:
                    return kstatus.phase(job)
            job = kube.get(api, kind, name, cfg.job_namespace)
            if job is None:
                return Phase.STOPPED


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
) -> Iterator[LogLine]:
    """The chosen pods' lines with their times: tail and since are the API's tailLines and
    sinceSeconds (whole seconds, rounded up as kubectl does), times from ?timestamps=true."""
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


def cleanup(kube, cfg: Config, *, checkpoints: bool, dry_run: bool) -> list[str]:
    """Finished jobs, their pods (cleanPodPolicy Running keeps the finished ones for their logs),
    their Secret and their rendezvous keys in etcd; checkpoints only with `checkpoints` (a short pod
    removes the job's directory on the PVC). Returns what was (or, dry, would be) removed."""
    api, kind = render.job_api(cfg)
    done: list[str] = []
    with calls(cfg, "cleaning up"):
        jobs = kube.list(api, kind, cfg.job_namespace, {"app.kubernetes.io/managed-by": "fsdpctl"})
        for job in jobs:
            if kstatus.phase(job) not in FINAL:
                continue
            name = job["metadata"]["name"]
            run_id = job["metadata"].get("labels", {}).get("fsdpctl.io/run-id", "")
            done.append(f"{kind}/{name}")
            pods = pods_of(kube, cfg, name)
            done += [f"Pod/{p['metadata']['name']}" for p in pods]
            done.append(f"Secret/{render.secret_name(cfg)}")
            backend = job.get("spec", {}).get("elasticPolicy", {}).get("rdzvBackend", "c10d")
            keys = jobpolicy.rendezvous_keys(backend, run_id)
            done += [f"etcd key {k}" for k in keys]
            if checkpoints and cfg.checkpoint_claim:
                done.append(
                    f"checkpoints {jobpolicy.checkpoint_dir(cfg, name)} on PVC {cfg.checkpoint_claim}"
                )
            if dry_run:
                continue
            kube.delete(api, kind, name, cfg.job_namespace, propagation="Foreground")
            for p in pods:
                kube.delete(
                    "v1", "Pod", p["metadata"]["name"], cfg.job_namespace, propagation="Background"
                )
            kube.delete("v1", "Secret", render.secret_name(cfg), cfg.job_namespace)
            for key in keys:
                _delete_etcd_key(kube, cfg, key)
            if checkpoints and cfg.checkpoint_claim:
                kube.create(render.render_checkpoint_cleaner(cfg, name))
    return done


def _delete_etcd_key(kube, cfg: Config, key: str) -> None:
    """Through the API server's service proxy to etcd's v2 keys API; a missing key is already clean."""
    from fsdpctl.adapters.kube import KubeError

    try:
        kube.proxy(
            "DELETE",
            cfg.job_namespace,
            "etcd",
            jobpolicy.ETCD_PORT,
            f"/v2/keys{key}",
            query={"recursive": "true"},
        )
    except KubeError as e:
        if e.status not in (404, 503):  # 503: no etcd running, nothing kept
            raise


def record_of(kube, cfg: Config, name: str) -> tuple[dict | None, list[str], list[str]]:
    """(the run record of job `name` from its ConfigMap, the leader's log lines, problems). What the
    cluster learnt since the start (the image digest its pods report, the trainer's `start` event)
    is merged and written back into the ConfigMap, so it stays once the pods are gone. (None, [],
    []) without a ConfigMap."""
    from fsdpctl.adapters.kube import KubeError

    with calls(cfg, f"reading the run record of {name}"):
        cm = kube.get("v1", "ConfigMap", run_record.config_map_name(name), cfg.job_namespace)
    if cm is None:
        return None, [], []
    try:
        rec = run_record.from_config_map(cm)
    except ValueError as e:
        raise FsdpctlError(
            f"ConfigMap {run_record.config_map_name(name)} holds no run record ({e})"
        ) from e
    job = get_job(kube, cfg, name)
    cm_name = run_record.config_map_name(name)
    damaged = run_record.problem(rec)
    problems = [f"ConfigMap {cm_name}: the record {damaged}"] if damaged else []
    if job is None:
        return rec, [], [*problems, f"job {name} is gone: the record is as it was last read"]
    if (job["metadata"].get("annotations") or {}).get(run_record.ANNOTATION) != rec.get("hash"):
        problems.append(
            f"job {name}'s {run_record.ANNOTATION} annotation does not match ConfigMap {cm_name}"
        )
    pods = pods_of(kube, cfg, name)
    _, lines = find_leader(kube, cfg, pods)
    digest = run_record.image_digest(pods, _container(cfg))
    now = run_record.learnt(run_record.with_digest(rec, digest), lines)
    if now != rec and not problems:
        try:  # worth keeping, not worth failing for: a user who may read but not write ConfigMaps
            kube.apply(_owned_by(run_record.config_map(now, cfg.job_namespace), job))
        except KubeError as e:
            problems.append(f"the learnt facts were not saved in the ConfigMap: {e}")
    return now, lines, problems

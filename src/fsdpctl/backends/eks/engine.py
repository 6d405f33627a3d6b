"""Jobs on a Kubernetes cluster (BACKEND=eks): run, report, stop, wait, logs, cleanup. Orchestration
over the Kubernetes adapter; what the objects mean is read by the pure `kstatus` and `progress`
modules."""

from __future__ import annotations

import time
from collections.abc import Callable

from fsdpctl.backends.eks import configmap, owned
from fsdpctl.backends.eks.api import calls, get_job, owned_by, require_job
from fsdpctl.backends.eks.observe import pods_of
from fsdpctl.errors import ExitCode, FsdpctlError
from fsdpctl.job import kstatus, owner, render
from fsdpctl.job import policy as jobpolicy
from fsdpctl.job.record import RunRecord
from fsdpctl.job.reports import FINAL, TIMEOUT, Phase, Waited
from fsdpctl.plan import volume
from fsdpctl.settings import Config


def run(
    kube,
    cfg: Config,
    *,
    run_id: str | None,
    replace: bool,
    token: str,
    server_dry_run: bool = False,
    record: RunRecord | None = None,
) -> dict:
    """Namespace (+ etcd) applied, then the job created, then what it owns (its Secret, pre-step,
    budget and the ConfigMap <job>-record of its `record`), each carrying the run's owner labels
    and an ownerReference to the job: the garbage collector deletes them with it. The job first,
    so a job the API refused leaves no Secret (its pods mount the Secret as an optional volume the
    kubelet fills once it exists). A job of the same name is refused unless it is this home's
    job's; a running one unless `replace`, which stops it first (SIGTERM, checkpoint)."""
    run_id = run_id or jobpolicy.new_run_id(cfg.job_name)
    who = owned.mine(cfg, run_id)
    *infra, job = render.render_job(cfg, run_id, record["id"] if record else "")
    # the job's own objects carry its owner; the namespace and etcd are shared by every job
    job = owned.stamped(job, who)
    infra = [owned.stamped(o, who) if o["kind"] in DEPENDENTS else o for o in infra]
    if record is not None:
        job = configmap.annotated(job, record)
        record = {**record, "manifests": render.to_yaml([*infra, job])}
    # the pre-step and the disruption budget: created owned by the job, so they go with it
    fetch_jobs = [o for o in infra if o["kind"] in DEPENDENTS]
    infra = [o for o in infra if o["kind"] not in DEPENDENTS]
    secret = owned.stamped(render.render_secret(cfg, token, run_id), who)
    existing = get_job(kube, cfg, cfg.job_name)  # first: a missing CRD is the first thing to fix
    require_claims(kube, cfg)
    if server_dry_run:
        with calls(cfg, f"checking job {cfg.job_name}"):
            for obj in [*infra, secret, *fetch_jobs, job]:
                kube.apply(obj, dry_run=True)
    else:
        _make_room(kube, cfg, existing, replace)
        _start(kube, cfg, infra, job, secret, fetch_jobs, record, who)
    return {
        "job": cfg.job_name,
        "run_id": run_id,
        "record": record,
        "objects": [f"{o['kind']}/{o['metadata']['name']}" for o in [*infra, *fetch_jobs, job]],
    }


DEPENDENTS = ("Job", "PodDisruptionBudget")


def _start(
    kube,
    cfg: Config,
    infra: list[render.Obj],
    job: render.Obj,
    secret: render.Obj,
    fetch_jobs: list[render.Obj],
    record: RunRecord | None,
    who: owner.Owner,
) -> None:
    """The shared objects applied, the job created, then what it owns (its Secret first, the
    pre-step and budget, the record's ConfigMap) made owned by the job that was created."""
    with calls(cfg, f"starting job {cfg.job_name}"):
        for obj in infra:
            _apply_infra(kube, obj)
        created = kube.create(job)
        kube.apply(owned_by(secret, created))
        for obj in fetch_jobs:
            kube.create(owned_by(obj, created))
        if record is not None:
            kube.apply(
                owned_by(
                    owned.stamped(configmap.config_map(record, cfg.job_namespace), who), created
                )
            )


def _apply_infra(kube, obj: render.Obj) -> None:
    """The namespace is made when missing and otherwise left as it is (an admin's, or another
    team's, is not fsdpctl's to relabel); the rendezvous etcd is fsdpctl's shared one, applied."""
    if obj["kind"] == "Namespace":
        if kube.get("v1", "Namespace", obj["metadata"]["name"]) is None:
            kube.apply(obj)
        return
    kube.apply(obj)


def _make_room(kube, cfg: Config, existing: render.Obj | None, replace: bool) -> None:
    """The job object and the per-job objects an earlier run of this home's job left, deleted (by
    UID) before the new run's are made; anything of that name that is not this home's job's is
    refused first, with or without `replace`, and nothing changed."""
    with calls(cfg, f"checking what job {cfg.job_name} would replace"):
        if existing is not None:
            owned.check(existing, cfg)
        left = owned.in_the_way(kube, cfg)
    if existing is not None:
        # an ended job is the last run's: a new run takes its place (the job core's rule on every
        # backend, fsdpctl.job.runner._make_way); its record stays in the home's history
        if not replace and kstatus.phase(existing) not in FINAL:
            raise FsdpctlError(
                f"job {cfg.job_name} already exists ({kstatus.phase(existing)})",
                hint="`fsdpctl job run --replace` replaces it; `fsdpctl job stop` removes it",
                # refused before anything changed, as a local job already running
                code=ExitCode.BAD_INPUT,
            )
        stop(kube, cfg, cfg.job_name, wait=True, uid=existing["metadata"]["uid"])
    with calls(cfg, f"removing what an earlier run of {cfg.job_name} left"):
        for obj in left:
            _delete_left(kube, cfg, obj)


def _delete_left(kube, cfg: Config, obj: render.Obj) -> None:
    """One object an earlier run left (its owner gone, the collector not there yet; or one applied
    from `fsdpctl manifest`): a Job's pod template cannot be changed and a Secret must hold this
    run's token, so it goes, by UID, before the new one is made."""
    api, kind, name = obj["apiVersion"], obj["kind"], obj["metadata"]["name"]
    if kube.delete(
        api, kind, name, cfg.job_namespace, propagation="Background", uid=obj["metadata"]["uid"]
    ):
        _wait_gone(kube, api, kind, name, cfg.job_namespace, 120)


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


# The kubelet rewrites a pod's downward API files on its next sync of the pod (syncFrequency: 1
# minute by default, plus its pod cache), so a stop annotation reaches the trainers within about a
# minute.
STOP_NOTICE_S = 90


def stop(
    kube,
    cfg: Config,
    name: str,
    wait: bool = True,
    timeout: float = 300,
    uid: str | None = None,
    before_delete: Callable[[], None] | None = None,
) -> bool:
    """Ask the trainers to stop, then delete the job with foreground propagation. The stop request
    is the annotation fsdpctl.io/stop on each running pod, which the trainers read through their
    downward API file (fsdptrain.disruption): they checkpoint and exit 0, where a SIGTERM alone
    reads as an eviction (checkpoint, come back). The pods get their grace plus the kubelet's
    refresh before the job is deleted and whatever still runs gets SIGTERM. False when there was
    nothing to stop. With `uid`, only the job object of that UID is deleted (the one its caller
    checked is this home's). `before_delete`: called once the pods ended (or, without `wait`,
    were asked to), while their logs are still there: the delete takes them."""
    api, kind = render.job_api(cfg)
    with calls(cfg, f"stopping job {name}"):
        if kube.get(api, kind, name, cfg.job_namespace) is None:
            return False
        if request_stop(kube, cfg, name) and wait:
            _wait_pods_ended(kube, cfg, name, jobpolicy.stop_timing(cfg).grace_s + STOP_NOTICE_S)
        if before_delete is not None:
            before_delete()
        gone = not kube.delete(
            api, kind, name, cfg.job_namespace, propagation="Foreground", uid=uid
        )
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


def cancel(kube, cfg: Config, name: str, token: str | None = None) -> None:
    """A job just created and not recorded: deleted with its pods first (foreground propagation),
    owned objects (pre-step, budget, Secret, record) with it. Only a job of this home's job (of
    the submit `token`, when given) is deleted, by its UID."""
    api, kind = render.job_api(cfg)
    with calls(cfg, f"cancelling job {name}"):
        job = kube.get(api, kind, name, cfg.job_namespace)
        if job is None:
            return
        owned.check(job, cfg, name)
        if token is not None and owned.mark(job).token != token:
            raise owned.refusal(job, "it belongs to another run of the job", cfg.job_namespace)
        uid = job["metadata"]["uid"]
        kube.delete(api, kind, name, cfg.job_namespace, propagation="Foreground", uid=uid)


def cleanup(
    kube, cfg: Config, *, checkpoints: bool, dry_run: bool, only: str | None = None
) -> list[str]:
    """This home's ended jobs (only job `only` when given), selected by the home's label and each
    checked for it; their pods (cleanPodPolicy Running keeps the finished ones for their logs),
    their Secret, ConfigMap, budget and pre-step (owned by the job: the garbage collector deletes
    them with it) and their rendezvous keys in etcd; checkpoints only with `checkpoints` (a short
    pod removes the job's directory on the PVC). Returns what was (or, dry, would be) removed,
    each with its owner."""
    api, kind = render.job_api(cfg)
    done: list[str] = []
    home = owner.home_id()
    with calls(cfg, "cleaning up"):
        for job in kube.list(api, kind, cfg.job_namespace, {owner.HOME_LABEL: home}):
            name = job["metadata"]["name"]
            if kstatus.phase(job) not in FINAL or only not in (None, name):
                continue
            if owner.why_not_ours(owned.mark(job), home, name) is not None:
                continue  # a label copied onto another object is no proof
            done += _clean_job(kube, cfg, {**job, "kind": kind}, checkpoints, dry_run)
    return done


def _clean_job(kube, cfg: Config, job: render.Obj, checkpoints: bool, dry_run: bool) -> list[str]:
    api, kind = render.job_api(cfg)
    name, uid = job["metadata"]["name"], job["metadata"]["uid"]
    whose = f"(owner: {owned.mark(job).describe()})"
    run_id = job["metadata"].get("labels", {}).get("fsdpctl.io/run-id", "")
    pods = [p for p in pods_of(kube, cfg, name) if owned.owned_by_uid(p, uid)]
    held = _held_by(kube, cfg, name, uid)
    done = [f"{kind}/{name} {whose}"]
    done += [f"Pod/{p['metadata']['name']} {whose}" for p in pods]
    done += [f"{o['kind']}/{o['metadata']['name']} {whose}" for o in held]
    backend = job.get("spec", {}).get("elasticPolicy", {}).get("rdzvBackend", "c10d")
    keys = jobpolicy.rendezvous_keys(backend, run_id)
    done += [f"etcd key {k}" for k in keys]
    if checkpoints and cfg.checkpoint_claim:
        done.append(
            f"checkpoints {jobpolicy.checkpoint_dir(cfg, name)} on PVC {cfg.checkpoint_claim}"
        )
    if dry_run:
        return done
    kube.delete(api, kind, name, cfg.job_namespace, propagation="Foreground", uid=uid)
    for p in pods:  # the collector deletes them too; at once, so the next run starts clean
        kube.delete("v1", "Pod", p["metadata"]["name"], cfg.job_namespace, propagation="Background")
    for key in keys:
        _delete_etcd_key(kube, cfg, key)
    if checkpoints and cfg.checkpoint_claim:
        kube.create(render.render_checkpoint_cleaner(cfg, name))
    return done


def _held_by(kube, cfg: Config, job_name: str, uid: str) -> list[dict]:
    """The per-job objects the job object owns (deleted with it by the garbage collector)."""
    found = []
    for api, kind, name in owned.dependents(cfg, job_name):
        obj = kube.get(api, kind, name, cfg.job_namespace)
        if obj is not None and owned.owned_by_uid(obj, uid):
            found.append({**obj, "kind": kind})
    return found


def _delete_etcd_key(kube, cfg: Config, key: str) -> None:
    """Through the API server's service proxy to etcd's v2 keys API; a missing key is already
    clean."""
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

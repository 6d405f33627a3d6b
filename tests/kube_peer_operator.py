"""The cluster behind the Kubernetes API peer (kube_peer.py): the controllers and the kubelets it
lacks, so that a PyTorchJob created through the API really trains on this machine (CPU, gloo) and
everything fsdpctl then reads through the API is what a cluster shows. `Cluster(peer, root)` runs
them in one thread of the test process: each pass reads the API's objects (as an informer cache
would) and writes through the API with the `kubernetes` client, as the real controllers do.

What runs, after its source:

- the Training Operator v1.9.4's PyTorchJob controller (kubeflow/trainer tag v1.9.4,
  pkg/controller.v1/pytorch/pytorchjob_controller.go Reconcile and UpdateJobStatus,
  pkg/controller.v1/common/job.go ReconcileJobs and DeletePodsAndServices, common/pod.go
  ReconcilePods and createNewPod, common/service.go CreateNewService, pytorch/envvar.go and
  elastic.go for the pods' PET_* environment, pkg/apis/kubeflow.org/v1 pytorch_defaults.go and
  defaulting_utils.go for the defaults, pkg/util/status.go for the conditions, pkg/core/job.go
  PastBackoffLimit, pkg/util/train/train_util.go IsRetryableExitCode). It runs while the
  operator's Deployment (kubeflow/training-operator, `fsdpctl deploy operator`) exists, and this
  cluster reports that Deployment available (its pod is this thread);
- the batch/v1 Job controller of Kubernetes v1.33 for the pre-step Job (pkg/controller/job/
  job_controller.go syncJob: pods from the template named `<job>-<random>` with the
  batch.kubernetes.io/job-tracking finalizer, podFailurePolicy, backoffLimit with the 10 s doubling
  pod backoff, activeDeadlineSeconds, SuccessCriteriaMet/Complete and FailureTarget/Failed);
- the scheduler (pkg/scheduler/framework/plugins: NodeName, NodeUnschedulable, NodeAffinity for
  nodeSelector, TaintToleration, NodeResourcesFit with LeastAllocated scoring, VolumeBinding's
  missing claim), binding through pods/binding; an unschedulable pod gets PodScheduled False in
  the scheduler's words (framework.FitError);
- a kubelet per Node (pkg/kubelet: volumes, the container's environment, init containers then the
  containers, restartPolicy, status, graceful termination, the downward API refresh): each
  container runs as a real process here, translated by the local backend's
  `fsdpctl.backends.local.pods.launches` (the image's `python`/`torchrun` become this
  interpreter, the container's environment with every path under a volume mount mapped to that
  volume's directory); its output goes through the local backend's log relay into a CRI log file
  (containerd's format), which the API serves as `kubectl logs` does (`peer.api.logs`, the peer
  applying tailLines, sinceSeconds and timestamps).

The volumes a pod mounts (under `root`): a claim is `volumes/<namespace>/<claim>`, shared by every
node and every run (a new FSx file system's root: root's, 0755, kubelet.make_claim); emptyDirs and
downward API files are the pod's own (`pods/<uid>/volumes/...`), hostPaths the node's
(`nodes/<node>/hostpath/...`), a Secret's or ConfigMap's keys are files written from the API's
object. Pods share this machine's network: each has an address of its own on the loopback
(127.1.x.y, its status.podIP) and, as root, its own hostname (its name) and /etc/hosts in UTS and
mount namespaces of its own, the kubelet's managed hosts file plus what cluster DNS would answer in
its namespace (every pod's hostname, each Service's names to the pods it selects); so torchrun on
`<job>-worker-1` finds `<job>-worker-0` by name and ranks the nodes by their names as on a
cluster. Every pod listens on this machine's ports, so the rendezvous port a job names is given a
free one per Service (the container's output shows the name it was given). Where this machine
does not allow the namespaces, pods share its hostname and reach each other at 127.0.0.1.

Not done, and declared: Master replicas (their env and init container), suspend, TTL after
finished, gang scheduling; TrainJob (Trainer v2 renders a JobSet, whose CRD and controller are not
in ../shared/vendor: the Trainer's install pulls JobSet from a release this machine cannot reach);
Events; the container's user (every container runs as this machine's user, as the local backend's
does when it cannot switch: its kubelet tests cover runAsUser); probes; resource limits; a pod's
own network namespace and /dev/shm (the host's); a pod's containers run one after the other,
never side by side (every pod fsdpctl makes has one, after its init container); paths written
inside a program's code (only its command, arguments and environment are mapped); image pulls
(any image runs this checkout's trainer: imageID is a digest of the image's reference, not of
content). The downward API file is rewritten within a pass of the kubelet (a real kubelet takes up
to its sync period, about a minute: fsdpctl's STOP_NOTICE_S allows for that).
"""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fsdpctl.adapters import shell
from fsdpctl.adapters.kube import Kube, KubeError
from fsdpctl.backends.local import kubelet as local_kubelet
from fsdpctl.backends.local.pods import Launch, launches, mapped_env
from fsdpctl.backends.local.processes import POD_MARK, kill_pod, pod_processes
from fsdpctl.plan.instances import INSTANCE_TYPES

Key = tuple[str, str, str, str]  # group, plural, namespace, name (kube_peer.Key)
Obj = dict[str, Any]

# what the controllers and kubelets read (their informers' kinds)
WATCHED = {
    ("", "pods"),
    ("", "services"),
    ("", "secrets"),
    ("", "configmaps"),
    ("", "persistentvolumeclaims"),
    ("", "nodes"),
    ("kubeflow.org", "pytorchjobs"),
    ("batch", "jobs"),
    ("apps", "deployments"),
}
OPERATOR_DEPLOYMENT = ("kubeflow", "training-operator")
JSON, MERGE = "application/json", "application/merge-patch+json"


def now(at: float | None = None) -> str:
    """metav1.Time as the API writes it: RFC 3339, whole seconds, UTC."""
    return datetime.fromtimestamp(time.time() if at is None else at, UTC).strftime(
        "%Y-%m-%dT%H:%M:%SZ"
    )


def parse_time(text: str | None) -> float | None:
    if not text:
        return None
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def controller_uid(obj: Obj) -> str | None:
    """The uid of the object's controller (metav1.GetControllerOf)."""
    for ref in obj.get("metadata", {}).get("ownerReferences") or []:
        if ref.get("controller"):
            return ref.get("uid")
    return None


def owner_ref(owner: Obj, api_version: str, kind: str) -> Obj:
    """A controller reference (GenOwnerReference; the Job controller's metav1.NewControllerRef)."""
    meta = owner["metadata"]
    return {
        "apiVersion": api_version,
        "kind": kind,
        "name": meta["name"],
        "uid": meta["uid"],
        "blockOwnerDeletion": True,
        "controller": True,
    }


def all_statuses(pod: Obj) -> list[Obj]:
    """The pod's init containers' statuses, then its containers'."""
    status = pod.get("status") or {}
    return [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]


def phase_of(pod: Obj) -> str:
    return (pod.get("status") or {}).get("phase") or "Pending"


def deleting(obj: Obj) -> bool:
    return bool(obj.get("metadata", {}).get("deletionTimestamp"))


def terminal(pod: Obj) -> bool:
    return phase_of(pod) in ("Succeeded", "Failed")


@dataclass
class Plan:
    """What a controller's pass decided: objects to create, (api, kind, namespace, name) to delete,
    patches of objects (api, kind, namespace, name, merge patch), the new status (None: unchanged)."""

    creates: list[Obj] = field(default_factory=list)
    deletes: list[tuple[str, str, str, str]] = field(default_factory=list)
    patches: list[tuple[str, str, str, str, Obj]] = field(default_factory=list)
    status: Obj | None = None


# ---- the Training Operator v1.9.4: PyTorchJob ----------------------------------------------------

PYTORCH = ("kubeflow.org/v1", "PyTorchJob")
CONTROLLER_NAME = "pytorchjob-controller"
OPERATOR_NAME_LABEL = "training.kubeflow.org/operator-name"
JOB_NAME_LABEL = "training.kubeflow.org/job-name"
REPLICA_TYPE_LABEL = "training.kubeflow.org/replica-type"
REPLICA_INDEX_LABEL = "training.kubeflow.org/replica-index"
JOB_ROLE_LABEL = "training.kubeflow.org/job-role"
DEFAULT_CONTAINER = "pytorch"  # PyTorchJobDefaultContainerName
DEFAULT_PORT_NAME, DEFAULT_PORT = "pytorchjob-port", 23456
NOT_TERMINATED = 0xBEEF  # ReconcilePods' magic exit code of a container not terminated


class Unsupported(Exception):
    """A job this operator does not run (declared in the module's docstring)."""


def pytorch_defaults(job: Obj) -> Obj:
    """SetDefaults_PyTorchJob (pytorch_defaults.go), as the reconciler applies them in memory:
    cleanPodPolicy None, replicas 1, restartPolicy OnFailure, the default port on the `pytorch`
    container, elastic min/max replicas from the workers, nprocPerNode `auto`."""
    job = copy.deepcopy(job)
    spec = job.setdefault("spec", {})
    spec.setdefault("runPolicy", {}).setdefault("cleanPodPolicy", "None")
    replicas = spec.setdefault("pytorchReplicaSpecs", {})
    for rtype in list(replicas):  # setPyTorchTypeNamesToCamelCase
        for canonical in ("Master", "Worker"):
            if rtype.lower() == canonical.lower() and rtype != canonical:
                replicas[canonical] = replicas.pop(rtype)
    for rs in replicas.values():
        rs.setdefault("replicas", 1)
        rs.setdefault("restartPolicy", "OnFailure")
        containers = rs.setdefault("template", {}).setdefault("spec", {}).get("containers") or []
        if containers:
            index = next(
                (i for i, c in enumerate(containers) if c.get("name") == DEFAULT_CONTAINER), 0
            )
            ports = containers[index].setdefault("ports", [])
            if not any(p.get("name") == DEFAULT_PORT_NAME for p in ports):
                ports.append({"name": DEFAULT_PORT_NAME, "containerPort": DEFAULT_PORT})
    elastic = spec.get("elasticPolicy")
    if elastic is not None:
        workers = (replicas.get("Worker") or {}).get("replicas")
        lo, hi = elastic.get("minReplicas"), elastic.get("maxReplicas")
        elastic["minReplicas"] = lo if lo is not None else (hi if hi is not None else workers)
        elastic["maxReplicas"] = hi if hi is not None else elastic["minReplicas"]
    if (elastic is None or elastic.get("nProcPerNode") is None) and spec.get(
        "nprocPerNode"
    ) is None:
        spec["nprocPerNode"] = "auto"
    return job


def set_condition(status: Obj, ctype: str, cstatus: str, reason: str, message: str) -> None:
    """UpdateJobConditions (pkg/util/status.go): nothing after Failed; an unchanged condition
    (status and reason) is left as it is; Running and Restarting replace each other; Succeeded or
    Failed turn Running False."""
    conditions = status.get("conditions") or []
    if any(c["type"] == "Failed" and c["status"] == "True" for c in conditions):
        return
    current = next((c for c in conditions if c["type"] == ctype), None)
    if current and current["status"] == cstatus and current.get("reason") == reason:
        return
    stamp = now()
    new = {
        "type": ctype,
        "status": cstatus,
        "reason": reason,
        "message": message,
        "lastUpdateTime": stamp,
        "lastTransitionTime": stamp,
    }
    if current and current["status"] == cstatus:
        new["lastTransitionTime"] = current.get("lastTransitionTime", stamp)
    kept = []
    for c in conditions:
        if c["type"] == ctype or {c["type"], ctype} == {"Running", "Restarting"}:
            continue
        if ctype in ("Failed", "Succeeded") and c["type"] == "Running":
            c = {**c, "status": "False"}
        kept.append(c)
    status["conditions"] = [*kept, new]


def has_condition(status: Obj, ctype: str) -> bool:
    return any(
        c.get("type") == ctype and c.get("status") == "True" for c in status.get("conditions") or []
    )


def finished(status: Obj) -> bool:
    return has_condition(status, "Succeeded") or has_condition(status, "Failed")


def gen_labels(name: str) -> dict[str, str]:
    """GenLabels: the operator's and the job's name."""
    return {OPERATOR_NAME_LABEL: CONTROLLER_NAME, JOB_NAME_LABEL: name.replace("/", "-")}


def pytorch_env(job: Obj) -> list[Obj]:
    """What setPodEnv appends to each container (envvar.go, elastic.go): PYTHONUNBUFFERED, then
    PET_NPROC_PER_NODE, then with an elasticPolicy the rendezvous (PET_RDZV_ENDPOINT,
    PET_RDZV_BACKEND, PET_NNODES as min:max, PET_MAX_RESTARTS, PET_RDZV_ID, PET_RDZV_CONF), else
    PET_NNODES."""
    spec = job["spec"]
    env = [{"name": "PYTHONUNBUFFERED", "value": "1"}]
    if spec.get("nprocPerNode") is not None:
        env.append({"name": "PET_NPROC_PER_NODE", "value": str(spec["nprocPerNode"])})
    elastic = spec.get("elasticPolicy")
    total = sum(rs.get("replicas", 1) for rs in spec["pytorchReplicaSpecs"].values())
    if elastic is None:
        return [*env, {"name": "PET_NNODES", "value": str(total)}]
    host = elastic.get("rdzvHost") or f"{job['metadata']['name']}-worker-0"
    port = elastic.get("rdzvPort", DEFAULT_PORT)
    env.append({"name": "PET_RDZV_ENDPOINT", "value": f"{host}:{port}"})
    env.append({"name": "PET_RDZV_BACKEND", "value": elastic.get("rdzvBackend") or "c10d"})
    nnodes = f"{elastic['minReplicas']}:{elastic['maxReplicas']}"
    env.append({"name": "PET_NNODES", "value": nnodes})
    if elastic.get("maxRestarts") is not None:
        env.append({"name": "PET_MAX_RESTARTS", "value": str(elastic["maxRestarts"])})
    if elastic.get("nProcPerNode") is not None:
        env.append({"name": "PET_NPROC_PER_NODE", "value": str(elastic["nProcPerNode"])})
    if elastic.get("rdzvId") is not None:
        env.append({"name": "PET_RDZV_ID", "value": elastic["rdzvId"]})
    if elastic.get("rdzvConf"):
        conf = ",".join(f"{c['key']}={c['value']}" for c in elastic["rdzvConf"])
        env.append({"name": "PET_RDZV_CONF", "value": conf})
    if elastic.get("standalone"):
        env.append({"name": "PET_STANDALONE", "value": ""})
    return env


def new_pod(job: Obj, rtype: str, index: int, rspec: Obj) -> Obj:
    """createNewPod: the replica's template named `<job>-<type>-<index>`, the operator's labels (and
    job-role master for worker 0 of a job without a Master), the PET_* environment, restartPolicy
    ExitCode as Never, controlled by the job."""
    name, rt = job["metadata"]["name"], rtype.lower()
    template = copy.deepcopy(rspec["template"])
    meta = template.get("metadata") or {}
    labels = {
        **(meta.get("labels") or {}),
        **gen_labels(name),
        REPLICA_TYPE_LABEL: rt,
        REPLICA_INDEX_LABEL: str(index),
    }
    if rtype == "Worker" and index == 0:  # IsMasterRole without a Master replica
        labels[JOB_ROLE_LABEL] = "master"
    spec = template.get("spec") or {}
    for container in spec.get("containers") or []:
        container["env"] = [*(container.get("env") or []), *pytorch_env(job)]
    policy = rspec.get("restartPolicy")
    spec["restartPolicy"] = "Never" if policy == "ExitCode" else policy  # core.SetRestartPolicy
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            **{k: v for k, v in meta.items() if k not in ("labels", "name", "namespace")},
            "name": f"{name}-{rt}-{index}".replace("/", "-"),
            "namespace": job["metadata"]["namespace"],
            "labels": labels,
            "ownerReferences": [owner_ref(job, *PYTORCH)],
        },
        "spec": spec,
    }


def new_service(job: Obj, rtype: str, index: int, rspec: Obj) -> Obj:
    """CreateNewService: headless, selecting the replica's pod, the default container's ports."""
    name, rt = job["metadata"]["name"], rtype.lower()
    labels = {**gen_labels(name), REPLICA_TYPE_LABEL: rt, REPLICA_INDEX_LABEL: str(index)}
    containers = rspec["template"]["spec"].get("containers") or []
    ports = [
        {"name": p["name"], "port": p["containerPort"]}
        for c in containers
        if c.get("name") == DEFAULT_CONTAINER
        for p in c.get("ports") or []
        if p.get("name")
    ]
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": f"{name}-{rt}-{index}".replace("/", "-"),
            "namespace": job["metadata"]["namespace"],
            "labels": labels,
            "ownerReferences": [owner_ref(job, *PYTORCH)],
        },
        "spec": {"clusterIP": "None", "selector": labels, "ports": ports},
    }


def replica_index(obj: Obj) -> int | None:
    try:
        return int(obj["metadata"].get("labels", {})[REPLICA_INDEX_LABEL])
    except (KeyError, ValueError):
        return None


def slices(objs: list[Obj], replicas: int) -> list[list[Obj]]:
    """GetPodSlices: the objects by replica index, as many slices as replicas or the highest index
    plus one."""
    indices = [i for i in map(replica_index, objs) if i is not None]
    out: list[list[Obj]] = [[] for _ in range(max([replicas, *(i + 1 for i in indices)]))]
    for obj in objs:
        index = replica_index(obj)
        if index is not None and index >= 0:
            out[index].append(obj)
    return out


def container_exit(pod: Obj, container: str) -> int:
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        terminated = (cs.get("state") or {}).get("terminated")
        if cs.get("name") == container and terminated:
            return int(terminated.get("exitCode", 0))
    return NOT_TERMINATED


def delete_pods_and_services(run_policy: Obj, status: Obj, pods: list[Obj]) -> list[tuple]:
    """DeletePodsAndServices: with the job finished, cleanPodPolicy None keeps everything and
    Running only the pods that are neither Running nor Pending; each pod's Service goes with it. A
    pod already being deleted needs no second delete (the API would keep its deadline)."""
    policy = run_policy.get("cleanPodPolicy", "None")
    done = finished(status)
    if done and policy == "None":
        return []
    out = []
    for pod in pods:
        if done and policy == "Running" and phase_of(pod) not in ("Running", "Pending"):
            continue
        ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        if not deleting(pod):
            out.append(("v1", "Pod", ns, name))
        out.append(("v1", "Service", ns, name))
    return out


def past_backoff_limit(run_policy: Obj, replicas: Obj, pods: list[Obj]) -> bool:
    """PastBackoffLimit (pkg/core/job.go): the restarts of the containers of running pods, against
    backoffLimit (0: any)."""
    limit = run_policy.get("backoffLimit")
    if limit is None:
        return False
    total = 0
    for rtype, rs in replicas.items():
        if rs.get("restartPolicy") not in ("OnFailure", "Always", "ExitCode"):
            continue
        for pod in pods:
            labels = pod["metadata"].get("labels", {})
            if labels.get(REPLICA_TYPE_LABEL) != rtype.lower() or phase_of(pod) != "Running":
                continue
            for cs in all_statuses(pod):
                total += int(cs.get("restartCount", 0))
    return total > 0 if limit == 0 else total >= limit


def pytorchjob_plan(job: Obj, pods: list[Obj], services: list[Obj], at: float) -> Plan:
    """One reconcile of a PyTorchJob (Reconcile, ReconcileJobs, ReconcilePods, ReconcileServices,
    UpdateJobStatus) over the pods and services it controls. A job being deleted is not reconciled.
    The work queue's requeue count (previousRetry) is 0 here: no pass fails."""
    if deleting(job):
        return Plan()
    job = pytorch_defaults(job)
    spec, name = job["spec"], job["metadata"]["name"]
    replicas = spec["pytorchReplicaSpecs"]
    if "Master" in replicas:
        raise Unsupported(f"PyTorchJob {name}: a Master replica (its env and init container)")
    status = copy.deepcopy(job.get("status") or {})
    if not status.get("conditions"):  # onOwnerCreateFunc
        set_condition(
            status, "Created", "True", "PyTorchJobCreated", f"PyTorchJob {name} is created."
        )
    old = copy.deepcopy(job.get("status") or {})
    run_policy = spec.get("runPolicy") or {}
    plan = Plan()
    if finished(status):
        plan.deletes += delete_pods_and_services(run_policy, status, pods)
        if has_condition(status, "Succeeded"):
            for rs in (status.get("replicaStatuses") or {}).values():
                rs["succeeded"] = rs.get("succeeded", 0) + rs.get("active", 0)
                rs["active"] = 0
        status = omitempty(status)
        plan.status = status if status != old else None
        return plan
    if run_policy.get("suspend"):
        raise Unsupported(f"PyTorchJob {name}: runPolicy.suspend")
    active = [p for p in pods if not terminal(p) and not deleting(p)]
    failed = sum(phase_of(p) == "Failed" for p in pods)
    total = sum(rs["replicas"] for rs in replicas.values())
    before = sum(rs.get("failed", 0) for rs in (status.get("replicaStatuses") or {}).values())
    why = ""
    limit = run_policy.get("backoffLimit")
    if limit is not None and (
        (failed > before and len(active) != total and 0 + 1 > limit)
        or past_backoff_limit(run_policy, replicas, pods)
    ):
        why = f"Job {name} has failed because it has reached the specified backoff limit"
    elif run_policy.get("activeDeadlineSeconds") is not None and status.get("startTime"):
        if at - (parse_time(status["startTime"]) or at) >= run_policy["activeDeadlineSeconds"]:
            why = f"Job {name} has failed because it was active longer than specified deadline"
    if why:
        status.setdefault("completionTime", now(at))
        set_condition(status, "Failed", "True", "PyTorchJobFailed", why)
        plan.deletes += delete_pods_and_services(run_policy, status, pods)
        plan.status = omitempty(status)
        return plan
    for rtype, rs in replicas.items():
        _reconcile_pods(job, status, pods, rtype, rs, plan)
        _reconcile_services(job, services, rtype, rs, plan)
    _update_job_status(job, replicas, status, at)
    status = omitempty(status)
    plan.status = status if status != old else None
    return plan


def _reconcile_pods(
    job: Obj, status: Obj, pods: list[Obj], rtype: str, rs: Obj, plan: Plan
) -> None:
    name, rt, n = job["metadata"]["name"], rtype.lower(), rs["replicas"]
    mine = [p for p in pods if p["metadata"].get("labels", {}).get(REPLICA_TYPE_LABEL) == rt]
    counts = status.setdefault("replicaStatuses", {})
    counts[rtype] = {}
    for index, found in enumerate(slices(mine, n)):
        if len(found) > 1:
            continue  # "We have too many pods": left for a later pass
        if not found:
            plan.creates.append(new_pod(job, rtype, index, rs))
            continue
        pod = found[0]
        ns, pod_name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        if index >= n and not deleting(pod):
            plan.deletes.append(("v1", "Pod", ns, pod_name))
        code = container_exit(pod, DEFAULT_CONTAINER)
        policy = rs.get("restartPolicy")
        if phase_of(pod) == "Failed":
            if (policy == "ExitCode" and code >= 128) or policy in ("OnFailure", "Always"):
                if not deleting(pod):
                    plan.deletes.append(("v1", "Pod", ns, pod_name))
                why = f"job {name} is restarting because {rtype} replica(s) failed."
                set_condition(status, "Restarting", "True", "PyTorchJobRestarting", why)
            elif policy == "ExitCode":
                why = f'job "{name}" is failing because "{rtype}" replica(s) failed.'
                set_condition(status, "Failed", "True", "PyTorchJobFailed", why)
        _count(counts[rtype], pod)


def omitempty(status: Obj) -> Obj:
    """The status as the operator's JSON has it: ReplicaStatus counts are `omitempty` (0 is not
    written; pkg/apis/kubeflow.org/v1 common_types.go)."""
    for counts in (status.get("replicaStatuses") or {}).values():
        for key in ("active", "succeeded", "failed"):
            if counts.get(key) == 0:
                counts.pop(key)
    return status


def _count(counts: Obj, pod: Obj) -> None:
    """UpdateJobReplicaStatuses: a Running pod being deleted counts as failed."""
    phase = phase_of(pod)
    if phase == "Running":
        key = "failed" if deleting(pod) else "active"
    elif phase == "Succeeded":
        key = "succeeded"
    elif phase == "Failed":
        key = "failed"
    else:
        return
    counts[key] = counts.get(key, 0) + 1


def _reconcile_services(job: Obj, services: list[Obj], rtype: str, rs: Obj, plan: Plan) -> None:
    rt, n = rtype.lower(), rs["replicas"]
    mine = [s for s in services if s["metadata"].get("labels", {}).get(REPLICA_TYPE_LABEL) == rt]
    for index, found in enumerate(slices(mine, n)):
        if not found:
            plan.creates.append(new_service(job, rtype, index, rs))
        elif index >= n:
            meta = found[0]["metadata"]
            plan.deletes.append(("v1", "Service", meta["namespace"], meta["name"]))


def _update_job_status(job: Obj, replicas: Obj, status: Obj, at: float) -> None:
    """UpdateJobStatus (pytorchjob_controller.go), for a job of Workers only."""
    name, ns = job["metadata"]["name"], job["metadata"]["namespace"]
    status.setdefault("startTime", now(at))
    for rtype, rs in replicas.items():
        counts = status["replicaStatuses"][rtype]
        selector = {**gen_labels(name), REPLICA_TYPE_LABEL: rtype.lower()}
        counts["selector"] = ",".join(f"{k}={v}" for k, v in sorted(selector.items()))
        succeeded, running = counts.get("succeeded", 0), counts.get("active", 0)
        failed = counts.get("failed", 0)
        expected = rs["replicas"] - succeeded
        if rtype == "Worker":
            if expected == 0 or (job["spec"].get("elasticPolicy") is not None and succeeded > 0):
                status.setdefault("completionTime", now(at))
                why = f"PyTorchJob {ns}/{name} successfully completed."
                set_condition(status, "Succeeded", "True", "PyTorchJobSucceeded", why)
            elif running > 0:
                why = f"PyTorchJob {ns}/{name} is running."
                set_condition(status, "Running", "True", "PyTorchJobRunning", why)
        if failed > 0 and rs["replicas"] > succeeded + running:
            if rs.get("restartPolicy") != "Never":
                why = f"PyTorchJob {name} is restarting because {failed} {rtype} replica(s) failed."
                set_condition(status, "Restarting", "True", "PyTorchJobRestarting", why)
            else:
                status.setdefault("completionTime", now(at))
                why = f"PyTorchJob {name} is failed because {failed} {rtype} replica(s) failed."
                set_condition(status, "Failed", "True", "PyTorchJobFailed", why)


# ---- batch/v1 Job (Kubernetes v1.33 pkg/controller/job) ------------------------------------------

TRACKING_FINALIZER = "batch.kubernetes.io/job-tracking"
POD_BACKOFF_S, MAX_POD_BACKOFF_S = (
    10.0,
    600.0,
)  # DefaultJobPodFailureBackOff, MaxJobPodFailureBackOff


def job_defaults(job: Obj) -> Obj:
    """pkg/apis/batch/v1/defaults.go: completions and parallelism 1 when neither is set,
    backoffLimit 6, NonIndexed."""
    job = copy.deepcopy(job)
    spec = job.setdefault("spec", {})
    if spec.get("completions") is None and spec.get("parallelism") is None:
        spec["completions"] = spec["parallelism"] = 1
    spec.setdefault("parallelism", 1)
    spec.setdefault("backoffLimit", 6)
    spec.setdefault("completionMode", "NonIndexed")
    return job


def failure_rule(job: Obj, pod: Obj) -> tuple[int, Obj, str] | None:
    """The first podFailurePolicy rule a failed pod matches (pkg/controller/job/pod_failure_policy.go,
    matchPodFailurePolicy): (index, rule, the container it matched by exit code or '')."""
    rules = ((job["spec"].get("podFailurePolicy") or {}).get("rules")) or []
    status = pod.get("status") or {}
    statuses = [
        *(status.get("initContainerStatuses") or []),
        *(status.get("containerStatuses") or []),
    ]
    for i, rule in enumerate(rules):
        if "onExitCodes" in rule:
            req = rule["onExitCodes"]
            for cs in statuses:
                code = ((cs.get("state") or {}).get("terminated") or {}).get("exitCode")
                if code in (None, 0) or req.get("containerName") not in (None, cs.get("name")):
                    continue
                if (code in req.get("values", [])) == (req.get("operator") == "In"):
                    return i, rule, cs["name"]
        for want in rule.get("onPodConditions") or []:
            for c in status.get("conditions") or []:
                if c.get("type") == want.get("type") and c.get("status") == want.get(
                    "status", "True"
                ):
                    return i, rule, ""
    return None


def _exit_of(pod: Obj, container: str) -> int:
    status = pod.get("status") or {}
    for cs in [
        *(status.get("initContainerStatuses") or []),
        *(status.get("containerStatuses") or []),
    ]:
        if cs.get("name") == container:
            return int(((cs.get("state") or {}).get("terminated") or {}).get("exitCode", 0))
    return 0


def job_plan(job: Obj, pods: list[Obj], at: float, last_failure: float | None) -> Plan:
    """One syncJob (trackJobStatusAndRemoveFinalizers, then the job's verdict): a pod that ended is
    first recorded in status.uncountedTerminatedPods, its tracking finalizer removed once that
    record is stored, then counted; the job fails by a FailJob rule, backoffLimit or
    activeDeadlineSeconds (FailureTarget, its pods deleted, then Failed), completes when its
    completions succeeded (SuccessCriteriaMet, then Complete), and otherwise gets pods up to
    parallelism, a failure holding the next one back (10 s, doubling)."""
    job = job_defaults(job)
    spec = job["spec"]
    status = copy.deepcopy(job.get("status") or {})
    old = copy.deepcopy(job.get("status") or {})
    plan = Plan()
    recorded = old.get("uncountedTerminatedPods") or {}
    uncounted = {k: list(recorded.get(k) or []) for k in ("succeeded", "failed")}
    by_uid = {p["metadata"]["uid"]: p for p in pods}
    for key, uids in uncounted.items():  # released: counted now
        still = [u for u in uids if u in by_uid and _tracked(by_uid[u])]
        status[key] = status.get(key, 0) + len(uids) - len(still)
        uncounted[key] = still
    done = has_condition(status, "Complete") or has_condition(status, "Failed")
    for pod in pods:
        uid = pod["metadata"]["uid"]
        if not _tracked(pod):
            continue
        if not terminal(pod):
            if done or deleting(job):  # being deleted with its job: nothing to count
                plan.patches.append(_release(pod))
            continue
        key = "succeeded" if phase_of(pod) == "Succeeded" else "failed"
        rule = failure_rule(job, pod) if key == "failed" else None
        if rule is not None and rule[1].get("action") == "Ignore":
            plan.patches.append(_release(pod))  # not counted at all
        elif uid in (recorded.get(key) or []):
            plan.patches.append(_release(pod))  # its record is stored: let it go
        elif uid not in uncounted[key]:
            uncounted[key].append(uid)
    status["uncountedTerminatedPods"] = {k: v for k, v in uncounted.items() if v}
    if done or deleting(job) or spec.get("suspend"):
        plan.status = status if status != old else None
        return plan
    status.setdefault("startTime", now(at))
    active = [p for p in pods if not terminal(p) and not deleting(p)]
    terminating = [p for p in pods if deleting(p) and not terminal(p)]
    status["active"], status["terminating"] = len(active), len(terminating)
    status["ready"] = sum(_ready(p) for p in active)
    succeeded = status.get("succeeded", 0) + len(uncounted["succeeded"])
    failed = status.get("failed", 0) + len(uncounted["failed"])
    failure = _failure(job, pods, failed, status, at)
    completions = spec["completions"]
    if failure is not None:
        _job_condition(status, "FailureTarget", *failure, at)
        plan.deletes += [_pod_key(p) for p in active]
        if not active and not terminating:
            _job_condition(status, "Failed", *failure, at)
    elif completions is not None and succeeded >= completions:
        why = ("CompletionsReached", "Reached expected number of succeeded pods")
        _job_condition(status, "SuccessCriteriaMet", *why, at)
        plan.deletes += [_pod_key(p) for p in active]
        if not active and not terminating:
            _job_condition(status, "Complete", *why, at)
            status["completionTime"] = now(at)
    else:
        left = completions - succeeded if completions is not None else spec["parallelism"]
        want = min(spec["parallelism"], left) - len(active) - len(terminating)
        held = last_failure is not None and at < last_failure + pod_backoff(failed)
        if want > 0 and not held:
            plan.creates += [job_pod(job) for _ in range(want)]
    plan.status = status if status != old else None
    return plan


def _failure(
    job: Obj, pods: list[Obj], failed: int, status: Obj, at: float
) -> tuple[str, str] | None:
    """Why the Job fails now: a FailJob rule a failed pod matches, its failed pods past
    backoffLimit, or activeDeadlineSeconds passed; None."""
    spec = job["spec"]
    for pod in pods:
        if phase_of(pod) != "Failed" or (rule := failure_rule(job, pod)) is None:
            continue
        index, r, container = rule
        if r.get("action") != "FailJob":
            continue
        ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        if container:
            code = _exit_of(pod, container)
            return "PodFailurePolicy", (
                f"Container {container} for pod {ns}/{name} failed with exit code {code} matching "
                f"FailJob rule at index {index}"
            )
        return (
            "PodFailurePolicy",
            f"Pod {ns}/{name} has condition matching FailJob rule at index {index}",
        )
    if failed > spec["backoffLimit"]:
        return "BackoffLimitExceeded", "Job has reached the specified backoff limit"
    deadline = spec.get("activeDeadlineSeconds")
    if deadline is not None and at - (parse_time(status.get("startTime")) or at) >= deadline:
        return "DeadlineExceeded", "Job was active longer than specified deadline"
    return None


def _tracked(pod: Obj) -> bool:
    return TRACKING_FINALIZER in (pod["metadata"].get("finalizers") or [])


def _release(pod: Obj) -> tuple[str, str, str, str, Obj]:
    """The merge patch that removes the tracking finalizer."""
    kept = [f for f in pod["metadata"].get("finalizers") or [] if f != TRACKING_FINALIZER]
    ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
    return "v1", "Pod", ns, name, {"metadata": {"finalizers": kept or None}}


def _pod_key(pod: Obj) -> tuple[str, str, str, str]:
    return "v1", "Pod", pod["metadata"]["namespace"], pod["metadata"]["name"]


def pod_backoff(failures: int) -> float:
    """The delay before a Job replaces a failed pod: 10 s, doubling, at most 10 minutes
    (job_controller.go getFinishedTime / backoff: DefaultJobPodFailureBackOff)."""
    if failures <= 0:
        return 0.0
    return min(MAX_POD_BACKOFF_S, POD_BACKOFF_S * 2 ** (failures - 1))


def _ready(pod: Obj) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (pod.get("status") or {}).get("conditions") or []
    )


def _job_condition(status: Obj, ctype: str, reason: str, message: str, at: float) -> None:
    conditions = status.setdefault("conditions", [])
    if any(c["type"] == ctype for c in conditions):
        return
    stamp = now(at)
    conditions.append(
        {
            "type": ctype,
            "status": "True",
            "reason": reason,
            "message": message,
            "lastProbeTime": stamp,
            "lastTransitionTime": stamp,
        }
    )


def job_pod(job: Obj) -> Obj:
    """A pod of a NonIndexed Job: its template, generateName `<job>-`, controlled by the Job, with
    the tracking finalizer."""
    template = copy.deepcopy(job["spec"]["template"])
    meta = template.get("metadata") or {}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            **{k: v for k, v in meta.items() if k not in ("name", "namespace")},
            "generateName": f"{job['metadata']['name']}-",
            "namespace": job["metadata"]["namespace"],
            "finalizers": [TRACKING_FINALIZER],
            "ownerReferences": [owner_ref(job, "batch/v1", "Job")],
        },
        "spec": template.get("spec") or {},
    }


# ---- the scheduler -------------------------------------------------------------------------------


def quantity(value: Any) -> float:
    """A resource.Quantity as a number (cpu in cores, memory in bytes)."""
    text = str(value)
    suffixes = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50,
                "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "m": 1e-3}  # fmt: skip
    for suffix, factor in suffixes.items():
        if text.endswith(suffix):
            return float(text[: -len(suffix)]) * factor
    return float(text)


def pod_requests(pod: Obj) -> dict[str, float]:
    """The pod's requests as the scheduler counts them: the sum of its containers', or an init
    container's when that is more (computePodResourceRequest)."""
    spec = pod.get("spec") or {}
    total: dict[str, float] = {}
    for c in spec.get("containers") or []:
        for r, v in ((c.get("resources") or {}).get("requests") or {}).items():
            total[r] = total.get(r, 0.0) + quantity(v)
    for c in spec.get("initContainers") or []:
        for r, v in ((c.get("resources") or {}).get("requests") or {}).items():
            total[r] = max(total.get(r, 0.0), quantity(v))
    return total


def tolerated(taint: Obj, tolerations: list[Obj]) -> bool:
    """TaintToleration (v1helper.TolerationsTolerateTaint)."""
    for t in tolerations:
        if t.get("effect") not in (None, "", taint.get("effect")):
            continue
        if t.get("operator") == "Exists":
            if t.get("key") in (None, "", taint.get("key")):
                return True
        elif t.get("key") == taint.get("key") and t.get("value", "") == taint.get("value", ""):
            return True
    return False


def schedule(
    pod: Obj, nodes: list[Obj], pods: list[Obj], claims: set[tuple[str, str]]
) -> tuple[str | None, str]:
    """(the node for `pod`, '') or (None, why not in the scheduler's words)."""
    ns = pod["metadata"]["namespace"]
    for v in (pod.get("spec") or {}).get("volumes") or []:
        claim = (v.get("persistentVolumeClaim") or {}).get("claimName")
        if claim and (ns, claim) not in claims:
            return (
                None,
                f'0/{len(nodes)} nodes are available: persistentvolumeclaim "{claim}" not found.',
            )
    spec = pod.get("spec") or {}
    wants = pod_requests(pod)
    reasons: dict[str, int] = {}
    fits: list[tuple[float, str]] = []
    for node in nodes:
        why = _unfit(node, spec, wants, pods)
        if why:
            for w in why:
                reasons[w] = reasons.get(w, 0) + 1
            continue
        fits.append((_allocated(node, pods, wants), node["metadata"]["name"]))
    if fits:
        return min(fits)[1], ""
    said = ", ".join(f"{n} {w}" for w, n in sorted(reasons.items()))
    n = len(nodes)
    return None, (
        f"0/{n} nodes are available: {said}. preemption: 0/{n} nodes are available: "
        f"{n} Preemption is not helpful for scheduling."
    )


def _on(node: Obj, pods: list[Obj]) -> list[Obj]:
    name = node["metadata"]["name"]
    return [p for p in pods if (p.get("spec") or {}).get("nodeName") == name and not terminal(p)]


def _unfit(node: Obj, spec: Obj, wants: dict[str, float], pods: list[Obj]) -> list[str]:
    labels = node["metadata"].get("labels", {})
    if (node.get("spec") or {}).get("unschedulable"):
        return ["node(s) were unschedulable"]
    if any(labels.get(k) != v for k, v in (spec.get("nodeSelector") or {}).items()):
        return ["node(s) didn't match Pod's node affinity/selector"]
    for taint in (node.get("spec") or {}).get("taints") or []:
        if taint.get("effect") in ("NoSchedule", "NoExecute") and not tolerated(
            taint, spec.get("tolerations") or []
        ):
            return [f"node(s) had untolerated taint {{{taint['key']}: {taint.get('value', '')}}}"]
    allocatable = {
        r: quantity(v) for r, v in (node.get("status") or {}).get("allocatable", {}).items()
    }
    used: dict[str, float] = {}
    for p in _on(node, pods):
        for r, v in pod_requests(p).items():
            used[r] = used.get(r, 0.0) + v
    return [
        f"Insufficient {r}"
        for r, v in sorted(wants.items())
        if v > 0 and used.get(r, 0.0) + v > allocatable.get(r, 0.0) + 1e-9
    ]


def _allocated(node: Obj, pods: list[Obj], wants: dict[str, float]) -> float:
    """NodeResourcesFit's LeastAllocated score, inverted: the share of cpu and memory in use with
    this pod (less is better)."""
    allocatable = {
        r: quantity(v) for r, v in (node.get("status") or {}).get("allocatable", {}).items()
    }
    share = 0.0
    for r in ("cpu", "memory"):
        used = sum(pod_requests(p).get(r, 0.0) for p in _on(node, pods)) + wants.get(r, 0.0)
        share += used / allocatable[r] if allocatable.get(r) else 0.0
    return share


def node_object(name: str, instance_type: str, zone: str = "us-west-2a") -> Obj:
    """A GPU node as an eksctl node group of `instance_type` makes it (eksctl/clusterconfig.yaml.j2:
    the fsdpctl.io/role label and the nvidia.com/gpu taint; the instance type and zone labels the
    cloud provider sets; the GPUs and EFA interfaces the device plugins advertise). Allocatable is
    its capacity (no kube-reserved)."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "node.kubernetes.io/instance-type": instance_type,
                "topology.kubernetes.io/zone": zone,
                "fsdpctl.io/role": "gpu",
            },
        },
        "spec": {"taints": [{"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}]},
    }


def node_status(node: Obj, address: str) -> Obj:
    capacity = node_capacity(node)
    return {
        "capacity": capacity,
        "allocatable": capacity,
        "addresses": [
            {"type": "InternalIP", "address": address},
            {"type": "Hostname", "address": node["metadata"]["name"]},
        ],
        "conditions": [
            {
                "type": "Ready",
                "status": "True",
                "reason": "KubeletReady",
                "message": "kubelet is posting ready status",
                "lastHeartbeatTime": now(),
                "lastTransitionTime": now(),
            }
        ],
        "nodeInfo": {
            "architecture": "amd64",
            "operatingSystem": "linux",
            "kubeletVersion": "v1.33.0",
            "containerRuntimeVersion": "containerd://1.7.27",
            "osImage": "Amazon Linux 2023",
            "kernelVersion": os.uname().release,
            "kubeProxyVersion": "",
            "machineID": "",
            "systemUUID": "",
            "bootID": "",
        },
    }


def node_capacity(node: Obj) -> dict[str, str]:
    inst = INSTANCE_TYPES[node["metadata"]["labels"]["node.kubernetes.io/instance-type"]]
    return {
        "cpu": str(inst.vcpus),
        "memory": f"{inst.memory_gib}Gi",
        "pods": "100",
        "nvidia.com/gpu": str(inst.gpus),
        "vpc.amazonaws.com/efa": str(inst.efa_interfaces),
    }


# ---- the kubelet ---------------------------------------------------------------------------------

# the trainer image's own environment (docker/Dockerfile ENV), under the pod's
IMAGE_ENV = {"PYTHONUNBUFFERED": "1", "PIP_NO_CACHE_DIR": "1"}
# the tests' fault injection and tracing into every container, as a mutating admission webhook adds a
# variable to the pods it admits (the trainer's failpoints, and FSDPTRAIN_TRACE: the data positions each
# rank takes, which the elastic cells count; a test sets them in its own environment)
INJECTED = ("FSDPTRAIN_FAILPOINT", "FSDPTRAIN_TRACE")
IMAGE_HOME = "/home/trainer"  # its WORKDIR, the trainer user's home
MIN_GRACE_S = 2  # the kubelet's minimumGracePeriodInSeconds
CONTAINER_BACKOFF_S, MAX_CONTAINER_BACKOFF_S = 10.0, 300.0  # CrashLoopBackOff
_VAR = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)|\$\$")


def expand(text: str, env: dict[str, str]) -> str:
    """$(VAR) from the container's environment, $$ an escaped $; an unknown reference stays as it
    is (third_party/forked/golang/expansion, MappingFuncFor)."""
    return _VAR.sub(lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)), text)


class ConfigError(Exception):
    """CreateContainerConfigError: what the container's environment names is not there."""


def field_value(pod: Obj, path: str) -> str:
    """A downward API fieldRef (pkg/fieldpath ExtractFieldPathAsString, and the kubelet's
    podFieldSelectorRuntimeValue for spec.nodeName and status.podIP)."""
    meta, spec, status = pod["metadata"], pod.get("spec") or {}, pod.get("status") or {}
    if path in ("metadata.annotations", "metadata.labels"):
        return format_map(meta.get(path.split(".")[1]) or {})
    if m := re.fullmatch(r"metadata\.(annotations|labels)\['(.+)'\]", path):
        return (meta.get(m.group(1)) or {}).get(m.group(2), "")
    simple = {
        "metadata.name": meta.get("name"),
        "metadata.namespace": meta.get("namespace"),
        "metadata.uid": meta.get("uid"),
        "spec.nodeName": spec.get("nodeName"),
        "spec.serviceAccountName": spec.get("serviceAccountName", "default"),
        "status.podIP": status.get("podIP"),
        "status.hostIP": status.get("hostIP"),
    }
    if path not in simple:
        raise ConfigError(f"unsupported fieldPath: {path}")
    return simple[path] or ""


def format_map(values: dict[str, str]) -> str:
    """pkg/fieldpath FormatMap: sorted `key="value"` lines, the value Go-quoted."""
    return "".join(f"{k}={json.dumps(v)}\n" for k, v in sorted(values.items()))


def container_env(
    pod: Obj, container: Obj, lookup: Callable[[str, str], Obj | None]
) -> dict[str, str]:
    """The container's environment as the kubelet makes it (kubelet_pods.go makeEnvironmentVariables):
    envFrom first, then env in order, each value with $(VAR) expanded from what came before;
    valueFrom fieldRef, secretKeyRef and configMapKeyRef read now. A missing Secret, ConfigMap or
    key that is not optional is a ConfigError."""
    ns = pod["metadata"]["namespace"]
    env: dict[str, str] = {}
    for source in container.get("envFrom") or []:
        kind = "secrets" if "secretRef" in source else "configmaps"
        ref = source.get("secretRef") or source.get("configMapRef") or {}
        obj = lookup(kind, ref.get("name", ""))
        if obj is None:
            if ref.get("optional"):
                continue
            what = "secret" if kind == "secrets" else "configmap"
            raise ConfigError(f'{what} "{ref.get("name")}" not found')
        for k, v in _data(obj).items():
            env[source.get("prefix", "") + k] = v
    for var in container.get("env") or []:
        if "valueFrom" not in var:
            env[var["name"]] = expand(var.get("value", ""), env)
            continue
        source = var["valueFrom"]
        if "fieldRef" in source:
            env[var["name"]] = field_value(pod, source["fieldRef"]["fieldPath"])
        elif "secretKeyRef" in source or "configMapKeyRef" in source:
            kind = "secrets" if "secretKeyRef" in source else "configmaps"
            ref = source.get("secretKeyRef") or source.get("configMapKeyRef")
            obj = lookup(kind, ref["name"])
            value = _data(obj).get(ref["key"]) if obj is not None else None
            if value is None:
                if ref.get("optional"):
                    continue
                what = "secret" if kind == "secrets" else "configmap"
                raise ConfigError(
                    f'{what} "{ref["name"]}" not found'
                    if obj is None
                    else f"couldn't find key {ref['key']} in {what.capitalize()} {ns}/{ref['name']}"
                )
            env[var["name"]] = value
        elif "resourceFieldRef" in source:
            ref = source["resourceFieldRef"]
            resource = ref["resource"]
            kind, _, name = resource.partition(".")
            given = ((container.get("resources") or {}).get(kind) or {}).get(name)
            env[var["name"]] = str(int(quantity(given))) if given is not None else "0"
    return env


def _data(obj: Obj | None) -> dict[str, str]:
    """A ConfigMap's data, or a Secret's decoded."""
    if obj is None:
        return {}
    if obj.get("kind") == "Secret" or "type" in obj:
        return {
            k: base64.b64decode(v).decode(errors="replace")
            for k, v in (obj.get("data") or {}).items()
        }
    return dict(obj.get("data") or {})


def qos_class(pod: Obj) -> str:
    """pkg/apis/core/v1/helper/qos GetPodQOS, for cpu and memory."""
    containers = [
        *(pod["spec"].get("containers") or []),
        *(pod["spec"].get("initContainers") or []),
    ]
    requests, limits, guaranteed = set(), set(), True
    for c in containers:
        res = c.get("resources") or {}
        req = {r: v for r, v in (res.get("requests") or {}).items() if r in ("cpu", "memory")}
        lim = {r: v for r, v in (res.get("limits") or {}).items() if r in ("cpu", "memory")}
        requests |= set(req)
        limits |= set(lim)
        req = {**lim, **req}
        if set(lim) != {"cpu", "memory"} or any(quantity(req[r]) != quantity(lim[r]) for r in lim):
            guaranteed = False
    if not requests and not limits:
        return "BestEffort"
    return "Guaranteed" if guaranteed else "Burstable"


@dataclass
class Running:
    """One container the kubelet started: its first process, its log, its mark (every process of
    the container carries it: the local stand-in for the container's cgroup)."""

    name: str
    proc: Any
    mark: str
    log: Path
    started: str
    restarts: int


@dataclass
class PodRun:
    """The kubelet's record of a pod it runs."""

    uid: str
    namespace: str
    name: str
    node: str
    dir: Path
    ip: str
    started: str
    mounts: dict[str, str] = field(default_factory=dict)  # mount path -> directory
    init_done: int = 0  # init containers that succeeded
    current: Running | None = None
    statuses: dict[str, Obj] = field(default_factory=dict)  # container name -> ContainerStatus
    annotations: dict[str, str] | None = None
    waiting: tuple[str, str] | None = None  # (reason, message) the container waits on
    phase: str = "Pending"
    term_at: float | None = None  # monotonic: SIGTERM sent (deletion)
    grace: float = 30.0
    restart_at: float = 0.0  # monotonic: a container waiting out its back-off
    written: Obj | None = None  # the status last written
    deleted: bool = False  # the final delete was sent
    log_sizes: dict[str, int] = field(default_factory=dict)
    seen_as: dict[str, str] = field(default_factory=dict)  # this machine's name -> the pod's
    hostname: str = ""
    hosts: str = ""  # the pod's /etc/hosts as last written


class Cluster:
    """The controllers and a kubelet per node, for `peer`, with its files under `root`."""

    def __init__(
        self, peer: Any, root: Path, *, nodes: int = 2, instance_type: str = "p5.48xlarge"
    ):
        self.peer, self.root = peer, Path(root)
        self.node_names = [f"ip-10-1-0-{10 + i}.ec2.internal" for i in range(nodes)]
        self.instance_type = instance_type
        self.token = secrets.token_hex(6)  # every process this cluster starts carries it
        self.runs: dict[str, PodRun] = {}
        self.errors: list[str] = []  # what a pass could not do (for a test's assertion message)
        self.ports: dict[
            tuple[str, str, int], int
        ] = {}  # (namespace, service, port) -> loopback port
        self.failed_at: dict[str, float] = {}  # Job uid -> when its last pod failed
        self.started: list[tuple[PodRun, Running]] = []  # every container started, in order
        self._ips = 0
        self.isolated, self.why_not_isolated = pod_namespaces()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.passes = 0

    # --- life -------------------------------------------------------------------------------------

    def start(self) -> Cluster:
        self.kube = Kube.connect(kubeconfig=str(self.peer.kubeconfig))
        self.peer.api.plays_kubelet = False
        self.peer.call(lambda: self.peer.api.store.listeners.append(self._heard))
        for i, name in enumerate(self.node_names):
            self._register_node(name, f"10.1.0.{10 + i}")
        self._thread = threading.Thread(target=self._loop, name="kube-peer-cluster", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop the controllers and end every container's processes (SIGKILL)."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(30)
        for run in list(self.runs.values()):
            if run.current is not None:
                kill_pod(run.current.mark)
        try:
            self.peer.call(lambda: self.peer.api.store.listeners.remove(self._heard))
        except Exception:  # noqa: BLE001 - the peer may be closed already
            pass

    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _heard(self, key: Key) -> None:
        if key[:2] in WATCHED:
            self._wake.set()

    def _register_node(self, name: str, address: str) -> None:
        node = node_object(name, self.instance_type)
        try:
            self.kube.create(node)
        except KubeError as e:
            if e.status != 409:
                raise
        status = {"status": node_status(node, address)}
        self.kube.request(
            "PATCH",
            self.kube.path("v1", "Node", None, name, "status"),
            body=status,
            content_type=MERGE,
        )

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(0.2)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self.sync()
            except Exception:  # noqa: BLE001 - a pass that failed is retried; the test sees `errors`
                self.errors.append(traceback.format_exc(limit=8))
            self.passes += 1

    # --- one pass ---------------------------------------------------------------------------------

    def view(self) -> dict[Key, Obj]:
        """The objects the controllers watch, copied on the server's loop (an informer's cache)."""
        store = self.peer.api.store

        def grab() -> dict[Key, Obj]:
            return {
                k: json.loads(json.dumps(o)) for k, o in store.objects.items() if k[:2] in WATCHED
            }

        return self.peer.call(grab)

    def sync(self) -> None:
        at = time.time()
        objs = self.view()
        self._operator_deployment(objs)
        if self._operator_running(objs):
            for key in [k for k in objs if k[:2] == ("kubeflow.org", "pytorchjobs")]:
                self._pytorchjob(objs, objs[key], at)
        objs = self.view()
        for key in [k for k in objs if k[:2] == ("batch", "jobs")]:
            self._job(objs, objs[key], at)
        self._orphans(objs)
        objs = self.view()
        self._schedule(objs)
        objs = self.view()
        self._kubelet(objs)

    def _of(
        self, objs: dict[Key, Obj], plural: str, namespace: str | None = None, group: str = ""
    ) -> list[Obj]:
        return [
            o for k, o in sorted(objs.items())
            if k[:2] == (group, plural) and (namespace is None or k[2] == namespace)
        ]  # fmt: skip

    # --- the operator's Deployment ----------------------------------------------------------------

    def _operator_deployment(self, objs: dict[Key, Obj]) -> None:
        """`deploy operator`'s Deployment, available: its one pod is this cluster's operator."""
        ns, name = OPERATOR_DEPLOYMENT
        dep = objs.get(("apps", "deployments", ns, name))
        if dep is None or deleting(dep):
            return
        replicas = (dep.get("spec") or {}).get("replicas", 1)
        status = dep.get("status") or {}
        if status.get("availableReplicas") == replicas and status.get("observedGeneration") == dep[
            "metadata"
        ].get("generation"):
            return
        stamp = now()
        available = {
            "type": "Available",
            "status": "True",
            "reason": "MinimumReplicasAvailable",
            "message": "Deployment has minimum availability.",
            "lastUpdateTime": stamp,
            "lastTransitionTime": stamp,
        }
        status = {
            "observedGeneration": dep["metadata"].get("generation", 1),
            "replicas": replicas,
            "updatedReplicas": replicas,
            "readyReplicas": replicas,
            "availableReplicas": replicas,
            "conditions": [available],
        }
        self._call(
            "PATCH", ("apps/v1", "Deployment", ns, name, "status"), {"status": status}, MERGE
        )

    def _operator_running(self, objs: dict[Key, Obj]) -> bool:
        ns, name = OPERATOR_DEPLOYMENT
        dep = objs.get(("apps", "deployments", ns, name))
        return dep is not None and not deleting(dep)

    # --- controllers ------------------------------------------------------------------------------

    def _pytorchjob(self, objs: dict[Key, Obj], job: Obj, at: float) -> None:
        uid, ns = job["metadata"]["uid"], job["metadata"]["namespace"]
        pods = [p for p in self._of(objs, "pods", ns) if controller_uid(p) == uid]
        services = [s for s in self._of(objs, "services", ns) if controller_uid(s) == uid]
        try:
            plan = pytorchjob_plan(job, pods, services, at)
        except Unsupported as e:
            self._note(f"not run: {e}")
            return
        self._carry_out(plan, job, *PYTORCH)

    def _job(self, objs: dict[Key, Obj], job: Obj, at: float) -> None:
        uid, ns = job["metadata"]["uid"], job["metadata"]["namespace"]
        pods = [p for p in self._of(objs, "pods", ns) if controller_uid(p) == uid]
        for pod in pods:
            if phase_of(pod) == "Failed":
                ends = [
                    parse_time(((cs.get("state") or {}).get("terminated") or {}).get("finishedAt"))
                    for cs in all_statuses(pod)
                ]
                finished_at = max([e for e in ends if e] or [at])
                self.failed_at[uid] = max(self.failed_at.get(uid, 0.0), finished_at)
        plan = job_plan(job, pods, at, self.failed_at.get(uid))
        self._carry_out(plan, job, "batch/v1", "Job")

    def _orphans(self, objs: dict[Key, Obj]) -> None:
        """A pod whose Job is gone lets go of its tracking finalizer (the Job controller's orphan
        pods: job_controller.go, handling a pod with the finalizer and no Job)."""
        jobs = {o["metadata"]["uid"] for k, o in objs.items() if k[:2] == ("batch", "jobs")}
        for pod in self._of(objs, "pods"):
            refs = pod["metadata"].get("ownerReferences") or []
            mine = [r for r in refs if r.get("controller") and r.get("kind") == "Job"]
            if _tracked(pod) and (not mine or mine[0]["uid"] not in jobs):
                self._call("PATCH", _release(pod)[:4], _release(pod)[4], MERGE)

    def _carry_out(self, plan: Plan, owner: Obj, api: str, kind: str) -> None:
        for obj in plan.creates:
            self._call("POST", (obj["apiVersion"], obj["kind"], obj["metadata"]["namespace"]), obj)
        for where in plan.deletes:
            body = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"}
            self._call("DELETE", where, body)
        if plan.status is not None:
            meta = owner["metadata"]
            body = {**owner, "apiVersion": api, "kind": kind, "status": plan.status}
            self._call("PUT", (api, kind, meta["namespace"], meta["name"], "status"), body)
        for *where, patch in plan.patches:
            self._call("PATCH", tuple(where), patch, MERGE)

    def _call(self, method: str, where: tuple, body: Obj, content_type: str = JSON) -> Any:
        """One write to (api version, kind, namespace[, name[, subresource]]); a conflict or a
        vanished object is left for a later pass (the object changed under this one, as under a
        controller's stale cache)."""
        try:
            path = self.kube.path(*where)
            return self.kube.request(method, path, body=body, content_type=content_type)
        except KubeError as e:
            if e.status not in (404, 409):
                self._note(f"{method} {where}: {e.status}: {e}")
            return None

    def _note(self, text: str) -> None:
        if text not in self.errors[-20:]:
            self.errors.append(text)

    # --- the scheduler ----------------------------------------------------------------------------

    def _schedule(self, objs: dict[Key, Obj]) -> None:
        nodes = [n for n in self._of(objs, "nodes") if n["metadata"]["name"] in self.node_names]
        pods = self._of(objs, "pods")
        claims = {(k[2], k[3]) for k in objs if k[:2] == ("", "persistentvolumeclaims")}
        for pod in pods:
            spec = pod.get("spec") or {}
            if (
                spec.get("nodeName")
                or deleting(pod)
                or spec.get("schedulerName", "default-scheduler") != "default-scheduler"
            ):
                continue
            node, why = schedule(pod, nodes, pods, claims)
            meta = pod["metadata"]
            if node is not None:
                binding = {
                    "apiVersion": "v1",
                    "kind": "Binding",
                    "metadata": {"name": meta["name"], "namespace": meta["namespace"]},
                    "target": {"apiVersion": "v1", "kind": "Node", "name": node},
                }
                self._call(
                    "POST", ("v1", "Pod", meta["namespace"], meta["name"], "binding"), binding
                )
                pod.setdefault("spec", {})["nodeName"] = node  # the next pod counts it
                continue
            conditions = (pod.get("status") or {}).get("conditions") or []
            current = next((c for c in conditions if c.get("type") == "PodScheduled"), {})
            if current.get("message") == why:
                continue
            cond = {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": why,
                "lastProbeTime": None,
                "lastTransitionTime": now(),
            }
            kept = [c for c in conditions if c.get("type") != "PodScheduled"]
            self._patch_pod_status(meta["namespace"], meta["name"], {"conditions": [*kept, cond]})

    def _patch_pod_status(self, ns: str, name: str, status: Obj) -> None:
        self._call("PATCH", ("v1", "Pod", ns, name, "status"), {"status": status}, MERGE)

    # --- the kubelets -----------------------------------------------------------------------------

    def _kubelet(self, objs: dict[Key, Obj]) -> None:
        pods = {p["metadata"]["uid"]: p for p in self._of(objs, "pods")
                if (p.get("spec") or {}).get("nodeName") in self.node_names}  # fmt: skip
        for uid in [u for u in self.runs if u not in pods]:  # gone from the API: force-deleted
            self._forget(self.runs.pop(uid))
        for uid, pod in pods.items():
            if uid not in self.runs and not terminal(pod):  # a terminal one it never ran: left
                self._accept(pod)
        self._dns(objs)
        for uid, pod in pods.items():
            run = self.runs.get(uid)
            if run is None:
                continue
            try:
                self._sync_pod(objs, pod, run)
            except Exception:  # noqa: BLE001 - one pod's trouble must not stop the others
                self._note(f"pod {run.namespace}/{run.name}: {traceback.format_exc(limit=6)}")
            self._feed_logs(run, pod)

    def _accept(self, pod: Obj) -> PodRun:
        meta = pod["metadata"]
        self._ips += 1
        run = PodRun(
            uid=meta["uid"],
            namespace=meta["namespace"],
            name=meta["name"],
            node=pod["spec"]["nodeName"],
            dir=self.root / "pods" / meta["uid"],
            ip=f"127.1.{self._ips // 250}.{self._ips % 250 + 2}",
            started=now(),
            hostname=meta["name"][:63].rstrip("-."),
        )
        self.runs[run.uid] = run
        return run

    def _forget(self, run: PodRun) -> None:
        if run.current is not None:
            kill_pod(run.current.mark)
        for key in [k for k in list(self.peer.api.logs) if k[:2] == (run.namespace, run.name)]:
            self.peer.api.logs.pop(key, None)

    def _sync_pod(self, objs: dict[Key, Obj], pod: Obj, run: PodRun) -> None:
        spec = pod["spec"]
        if deleting(pod):
            self._terminate(pod, run)
        elif run.phase in ("Succeeded", "Failed"):
            pass
        elif not run.mounts:
            self._mount(objs, pod, run)
        if run.mounts and not deleting(pod) and run.phase not in ("Succeeded", "Failed"):
            self._refresh_downward(pod, run)
            self._step(objs, pod, run, spec)
        self._report(pod, run)
        if deleting(pod) and (run.current is None or run.current.proc.poll() is not None):
            if run.current is not None:
                kill_pod(run.current.mark)
            self._final_delete(pod, run)

    # volumes

    def _mount(self, objs: dict[Key, Obj], pod: Obj, run: PodRun) -> None:
        """The pod's volumes (the kubelet's volume manager), before any container: a missing
        non-optional Secret or ConfigMap keeps the pod in ContainerCreating (FailedMount)."""
        ns = run.namespace
        volumes = {v["name"]: v for v in pod["spec"].get("volumes") or []}
        dirs: dict[str, Path] = {}
        for name, v in volumes.items():
            where = run.dir / "volumes" / name
            if "persistentVolumeClaim" in v:
                claim = v["persistentVolumeClaim"]["claimName"]
                where = self.root / "volumes" / ns / claim
                local_kubelet.make_claim(where)
            elif "hostPath" in v:
                where = (
                    self.root / "nodes" / run.node / "hostpath" / v["hostPath"]["path"].lstrip("/")
                )
                where.mkdir(parents=True, exist_ok=True)
            elif "emptyDir" in v:
                if (v["emptyDir"] or {}).get("medium") == "Memory":
                    continue  # the host's /dev/shm serves (declared)
                where.mkdir(parents=True, exist_ok=True)
                os.chmod(where, local_kubelet.EMPTY_DIR_MODE)
            elif "secret" in v or "configMap" in v:
                kind = "secrets" if "secret" in v else "configmaps"
                src = v.get("secret") or v.get("configMap") or {}
                ref = src.get("secretName") or src.get("name")
                obj = objs.get(("", kind, ns, ref))
                if obj is None and not src.get("optional"):
                    what = "secret" if kind == "secrets" else "configmap"
                    run.waiting = (
                        "ContainerCreating",
                        f'MountVolume.SetUp failed for volume "{name}" : {what} "{ref}" not found',
                    )
                    return
                self._write_keys(where, _data(obj), src)
            elif "downwardAPI" in v:
                where.mkdir(parents=True, exist_ok=True)
            else:
                continue
            dirs[name] = where
        run.mounts = {"/": str(run.dir / "rootfs")}  # marks the pod mounted
        for c in [
            *(pod["spec"].get("initContainers") or []),
            *(pod["spec"].get("containers") or []),
        ]:
            for m in c.get("volumeMounts") or []:
                if m["name"] in dirs:
                    base = dirs[m["name"]]
                    run.mounts[m["mountPath"]] = (
                        str(base / m["subPath"]) if m.get("subPath") else str(base)
                    )
        run.waiting = None
        for d in ("home", "tmp", "rootfs"):
            (run.dir / d).mkdir(parents=True, exist_ok=True)
        os.chmod(run.dir / "tmp", 0o1777)

    def _write_keys(self, where: Path, data: dict[str, str], src: Obj) -> None:
        """A Secret's or ConfigMap's keys as files (atomic_writer: replaced whole), mode
        defaultMode (0644 unless said)."""
        where.mkdir(parents=True, exist_ok=True)
        items = src.get("items")
        files = {i["path"]: data[i["key"]] for i in items if i["key"] in data} if items else data
        mode = src.get("defaultMode", 0o644)
        for path, value in files.items():
            target = where / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(value)
            os.chmod(target, mode)

    def _refresh_downward(self, pod: Obj, run: PodRun) -> None:
        """The downward API volumes' files from the pod as the API has it now: the kubelet rewrites
        them when the pod's metadata changed (a stop request's annotation)."""
        annotations = pod["metadata"].get("annotations") or {}
        if annotations == run.annotations:
            return
        for v in pod["spec"].get("volumes") or []:
            if "downwardAPI" not in v:
                continue
            where = run.dir / "volumes" / v["name"]
            for item in v["downwardAPI"].get("items") or []:
                if "fieldRef" not in item:
                    continue
                value = field_value(pod, item["fieldRef"]["fieldPath"])
                target = where / item["path"]
                tmp = target.with_name(f".{target.name}.tmp")
                tmp.write_text(value)
                os.chmod(tmp, v["downwardAPI"].get("defaultMode", 0o644))
                os.replace(tmp, target)
        run.annotations = dict(annotations)

    # containers

    def _step(self, objs: dict[Key, Obj], pod: Obj, run: PodRun, spec: Obj) -> None:
        """Start the next container, or judge the one that ended (restartPolicy)."""
        inits = spec.get("initContainers") or []
        policy = spec.get("restartPolicy", "Always")
        if run.current is not None:
            rc = run.current.proc.poll()
            if rc is None:
                return
            ended = run.current
            kill_pod(ended.mark)  # the container's first process ended: its others with it
            code = 128 - rc if rc < 0 else rc
            self._terminated(run, ended, code)
            run.current = None
            is_init = run.init_done < len(inits) and ended.name == inits[run.init_done]["name"]
            if code == 0 and is_init:
                run.init_done += 1
            elif code == 0 and policy != "Always":
                run.phase = "Succeeded" if self._all_succeeded(pod, run) else run.phase
            elif policy == "Never":
                run.phase = "Failed"
            else:  # OnFailure, Always: restarted in place after its back-off
                n = run.statuses[ended.name].get("restartCount", 0)
                run.restart_at = time.monotonic() + min(
                    MAX_CONTAINER_BACKOFF_S, CONTAINER_BACKOFF_S * 2**n
                )
                run.statuses[ended.name]["restartCount"] = n + 1
            if run.phase != "Pending" and run.phase != "Running":
                return
        if time.monotonic() < run.restart_at:
            return
        if run.init_done < len(inits):
            self._start(objs, pod, run, inits[run.init_done])
            return
        for container in spec.get("containers") or []:
            state = run.statuses.get(container["name"], {}).get("state", {})
            if "running" in state or (
                "terminated" in state
                and (state["terminated"]["exitCode"] == 0 or policy == "Never")
            ):
                continue
            self._start(objs, pod, run, container)
            return

    def _all_succeeded(self, pod: Obj, run: PodRun) -> bool:
        names = [c["name"] for c in pod["spec"].get("containers") or []]
        return all(
            (run.statuses.get(n, {}).get("state", {}).get("terminated") or {}).get("exitCode") == 0
            for n in names
        )

    def _start(self, objs: dict[Key, Obj], pod: Obj, run: PodRun, container: Obj) -> None:
        ns, name = run.namespace, container["name"]
        previous = run.statuses.get(name, {})
        restarts = previous.get("restartCount", 0)
        try:
            env = container_env(pod, container, lambda kind, n: objs.get(("", kind, ns, n)))
            argv, cwd = self._argv(pod, run, container, env)
        except ConfigError as e:
            run.waiting = ("CreateContainerConfigError", str(e))
            run.statuses[name] = {
                **previous,
                "state": {"waiting": {"reason": "CreateContainerConfigError", "message": str(e)}},
            }
            return
        except StartRefused as e:
            ended = {
                "exitCode": 128,
                "reason": "StartError",
                "message": str(e),
                "startedAt": "1970-01-01T00:00:00Z",
                "finishedAt": now(),
            }
            run.statuses[name] = self._status(pod, container, restarts, {"terminated": ended})
            if pod["spec"].get("restartPolicy", "Always") == "Never":
                run.phase = "Failed"
            else:  # tried again after its back-off, as any container that failed
                backoff = CONTAINER_BACKOFF_S * 2**restarts
                run.restart_at = time.monotonic() + min(MAX_CONTAINER_BACKOFF_S, backoff)
                run.statuses[name]["restartCount"] = restarts + 1
            return
        run.waiting = None
        log = run.dir / "logs" / name / f"{restarts}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        mark = f"{self.token}/{run.uid}/{name}/{restarts}"
        launch = self._launch(pod, run, container, env, argv, mark)
        proc = shell.spawn(launch.argv, env=launch.env, log=log, stamped=True, cwd=cwd)
        run.current = Running(name, proc, mark, log, now(), restarts)
        self.started.append((run, run.current))
        state = {"running": {"startedAt": run.current.started}}
        run.statuses[name] = self._status(pod, container, restarts, state, previous)
        if run.phase == "Pending" and run.init_done >= len(pod["spec"].get("initContainers") or []):
            run.phase = "Running"

    def _launch(
        self, pod: Obj, run: PodRun, container: Obj, env: dict[str, str], argv: list[str], mark: str
    ) -> Any:
        """The container's process through the local backend's translation (`launches`): this
        interpreter for the image's `python`/`torchrun`, the environment with its paths under the
        pod's mounts mapped, the rendezvous endpoint the Service's address here, the pod's /tmp, its
        mark. The machine's CPUs are divided among the job's nodes as the local backend divides
        them (OMP_NUM_THREADS), so both backends compute alike."""
        mounts = {m: d for m, d in run.mounts.items() if m != "/"}
        nodes = env.get("PET_NNODES", "1").rpartition(":")[2]
        nproc = _option(argv, "nproc-per-node") or env.get("PET_NPROC_PER_NODE") or "1"
        share = max(1, int(nodes) if nodes.isdigit() else 1) * (
            int(nproc) if nproc.isdigit() else 1
        )
        spec = {
            "replicas": 1,
            "nproc_per_node": 1,
            "command": argv,
            "env": env,
            "volumes": mounts,
            "tmp": str(run.dir / "tmp"),
            "job": mark.rpartition("/")[0],
            "run_id": mark.rpartition("/")[2],
        }
        environ = {
            "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '/usr/bin:/bin')}",
            "LANG": "C.UTF-8",
            "HOME": str(run.dir / "home"),
            "HF_HOME": str(run.dir / "home" / ".cache" / "huggingface"),
            **IMAGE_ENV,
            **{k: os.environ[k] for k in INJECTED if k in os.environ},
            "OMP_NUM_THREADS": env.get("OMP_NUM_THREADS")
            or str(max(1, (os.cpu_count() or 1) // share)),
        }
        program = Path(argv[0]).name
        if program.startswith("python") or program == "torchrun":
            given = _option(argv, "rdzv-endpoint")
            endpoint = self._endpoint(run.namespace, given)
            if given:
                run.seen_as[endpoint] = given
            [launch] = launches(spec, endpoint, environ)
        else:  # a program this machine has (`rm`), as it is
            env = {**environ, **mapped_env(spec, 0), "TMPDIR": spec["tmp"]}
            launch = Launch(0, argv, env)
        launch.env[POD_MARK] = mark
        if self.isolated:  # its own hostname and /etc/hosts, as a pod has
            launch.argv = [*UNSHARE, run.hostname, str(run.dir / "etc-hosts"), *launch.argv]
        return launch

    def _endpoint(self, namespace: str, given: str | None) -> str:
        """A rendezvous endpoint `<service>[.<namespace>[.svc[.cluster.local]]]:<port>` as the pods
        here reach it: its name (each pod's /etc/hosts answers it as cluster DNS would) or, where
        pods share this machine's names, the loopback address; on a port this cluster gives that
        Service's port (every pod listens on this machine's ports)."""
        if not given:
            return "127.0.0.1:0"
        host, _, port = given.rpartition(":")
        parts = host.split(".")
        ns = parts[1] if len(parts) > 1 and parts[1] != "svc" else namespace
        key = (ns, parts[0], int(port) if port.isdigit() else 0)
        if key not in self.ports:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                self.ports[key] = s.getsockname()[1]
        return f"{host if self.isolated else '127.0.0.1'}:{self.ports[key]}"

    def _dns(self, objs: dict[Key, Obj]) -> None:
        """Each running pod's /etc/hosts (kubelet_pods.go managedHostsFileContent: localhost, then
        the pod's own address and hostname) with what cluster DNS answers in its namespace: every
        pod's hostname and each Service's names, headless ones to the addresses of the pods they
        select (of every pod a kubelet here admitted: ready or not)."""
        labels = {
            uid: (objs.get(("", "pods", r.namespace, r.name)) or {})
            .get("metadata", {})
            .get("labels")
            or {}
            for uid, r in self.runs.items()
        }
        for run in self.runs.values():
            lines = [
                "# Kubernetes-managed hosts file.",
                "127.0.0.1\tlocalhost",
                "::1\tlocalhost ip6-localhost ip6-loopback",
                f"{run.ip}\t{run.hostname}",
                "# cluster DNS (kube_peer_operator)",
            ]
            mates = [r for r in self.runs.values() if r.namespace == run.namespace and r is not run]
            lines += [f"{r.ip}\t{r.hostname}" for r in mates]
            for svc in self._of(objs, "services", run.namespace):
                selector = (svc.get("spec") or {}).get("selector") or {}
                name = svc["metadata"]["name"]
                fqdn = f"{name}.{run.namespace}.svc"
                names = f"{name} {name}.{run.namespace} {fqdn} {fqdn}.cluster.local"
                lines += [
                    f"{r.ip}\t{names}"
                    for r in [run, *mates]
                    if selector and all(labels[r.uid].get(k) == v for k, v in selector.items())
                ]
            text = "\n".join(lines) + "\n"
            if text != run.hosts:
                run.dir.mkdir(parents=True, exist_ok=True)
                with open(run.dir / "etc-hosts", "w") as f:  # the same file: it is bind-mounted
                    f.write(text)
                run.hosts = text

    def _argv(
        self, pod: Obj, run: PodRun, container: Obj, env: dict[str, str]
    ) -> tuple[list[str], Path]:
        """command + args with $(VAR) expanded and every path under a mount mapped; the program as
        this machine has it. A program the image has and this machine does not, or a path outside
        the pod's mounts given to `rm`, is refused (StartError)."""
        words = [
            expand(w, env)
            for w in [*(container.get("command") or []), *(container.get("args") or [])]
        ]
        if not words:
            raise StartRefused("no command: the image's entrypoint is not known here")
        mounts = {m: d for m, d in run.mounts.items() if m != "/"}
        mapped = [_map_arg(w, mounts) for w in words]
        program = Path(words[0]).name
        if program.startswith("python") or program == "torchrun":
            argv = mapped
        elif program == "rm":
            outside = [
                w for w, m in zip(words, mapped, strict=True) if w.startswith("/") and w == m
            ]
            if outside:
                raise StartRefused(
                    f"rm of {outside[0]}: not under a volume of the pod (the image's own files are not here)"
                )
            argv = mapped
        else:
            raise StartRefused(
                f'failed to create containerd task: exec: "{words[0]}": executable file not found '
                "in $PATH: unknown"
            )
        workdir = container.get("workingDir")
        cwd = (
            Path(_map_arg(workdir, mounts))
            if workdir and _map_arg(workdir, mounts) != workdir
            else run.dir / "home"
        )
        return argv, cwd

    def _status(
        self, pod: Obj, container: Obj, restarts: int, state: Obj, previous: Obj | None = None
    ) -> Obj:
        image = container.get("image", "")
        repo = image.rpartition(":")[0] if ":" in image.rpartition("/")[2] else image
        digest = hashlib.sha256(image.encode()).hexdigest()
        which = f"{pod['metadata']['uid']}/{container['name']}/{restarts}"
        status = {
            "name": container["name"],
            "image": image,
            "imageID": f"{repo}@sha256:{digest}",
            "containerID": f"containerd://{hashlib.sha256(which.encode()).hexdigest()}",
            "restartCount": restarts,
            "started": "running" in state,
            "ready": "running" in state,
            "state": state,
        }
        last = (previous or {}).get("state", {})
        if "terminated" in last:
            status["lastState"] = {"terminated": last["terminated"]}
        return status

    def _terminated(self, run: PodRun, ended: Running, code: int) -> None:
        status = run.statuses[ended.name]
        reason = "Completed" if code == 0 else "Error"
        status["state"] = {"terminated": {
            "exitCode": code, "reason": reason, "startedAt": ended.started, "finishedAt": now(),
            "containerID": status.get("containerID")}}  # fmt: skip
        status["started"] = status["ready"] = False

    # deletion

    def _terminate(self, pod: Obj, run: PodRun) -> None:
        """A pod being deleted (killPod): SIGTERM to the running container's first process, SIGKILL
        to all its processes once its grace period (deletionGracePeriodSeconds, at least 2 s) has
        passed."""
        if run.current is None:
            return
        if run.term_at is None:
            run.term_at = time.monotonic()
            run.grace = max(MIN_GRACE_S, pod["metadata"].get("deletionGracePeriodSeconds") or 0)
            try:
                os.kill(run.current.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        elif time.monotonic() - run.term_at > run.grace:
            kill_pod(run.current.mark)
        if run.current.proc.poll() is not None:
            rc = run.current.proc.returncode
            code = 128 - rc if rc < 0 else rc
            kill_pod(run.current.mark)
            self._terminated(run, run.current, code)
            run.current = None
            run.phase = "Succeeded" if code == 0 and self._all_succeeded(pod, run) else "Failed"

    def _final_delete(self, pod: Obj, run: PodRun) -> None:
        """Once its containers are gone: the terminal status, then the pod deleted with grace 0 (the
        status manager's canBeDeleted, then Delete with the pod's uid as precondition)."""
        if run.phase not in ("Succeeded", "Failed"):
            run.phase = "Failed" if run.statuses else run.phase
        self._report(pod, run)
        if run.deleted:
            return  # a finalizer still holds it: the pod's controller lets it go
        run.deleted = True
        meta = pod["metadata"]
        body = {
            "kind": "DeleteOptions",
            "apiVersion": "v1",
            "gracePeriodSeconds": 0,
            "preconditions": {"uid": meta["uid"]},
        }
        self._call("DELETE", ("v1", "Pod", meta["namespace"], meta["name"]), body)

    # status and logs

    def _report(self, pod: Obj, run: PodRun) -> None:
        """The pod's status as the kubelet's status manager writes it, when it changed."""
        spec = pod["spec"]
        inits = spec.get("initContainers") or []
        names = [c["name"] for c in spec.get("containers") or []]
        waiting = (
            {"waiting": {"reason": run.waiting[0], "message": run.waiting[1]}}
            if run.waiting
            else {
                "waiting": {
                    "reason": "PodInitializing"
                    if run.init_done < len(inits)
                    else "ContainerCreating"
                }
            }
        )
        containers = [
            run.statuses.get(n) or self._status(pod, c, 0, waiting)
            for n, c in zip(names, spec.get("containers") or [], strict=True)
        ]
        ready = run.phase == "Running" and all(c.get("ready") for c in containers)
        initialized = run.init_done >= len(inits)
        old = {c["type"]: c for c in (pod.get("status") or {}).get("conditions") or []}

        def cond(ctype: str, ok: bool, reason: str = "") -> Obj:
            was = old.get(ctype)
            value = "True" if ok else "False"
            stamp = was["lastTransitionTime"] if was and was.get("status") == value else now()
            c = {"type": ctype, "status": value, "lastProbeTime": None, "lastTransitionTime": stamp}
            if not ok and reason:
                c["reason"] = reason
            return c

        done = run.phase in ("Succeeded", "Failed")
        mine = [
            cond("PodReadyToStartContainers", not done and bool(run.mounts)),
            cond("Initialized", initialized, "ContainersNotInitialized"),
            cond("Ready", ready, "PodCompleted" if done else "ContainersNotReady"),
            cond("ContainersReady", ready, "PodCompleted" if done else "ContainersNotReady"),
        ]
        kept = [c for t, c in old.items() if t not in {c["type"] for c in mine}]
        status: Obj = {
            "phase": run.phase,
            "conditions": [*mine, *kept],
            "hostIP": self._node_ip(run.node),
            "hostIPs": [{"ip": self._node_ip(run.node)}],
            "podIP": run.ip,
            "podIPs": [{"ip": run.ip}],
            "startTime": run.started,
            "qosClass": qos_class(pod),
            "containerStatuses": containers,
        }
        if inits:
            status["initContainerStatuses"] = [
                run.statuses.get(c["name"])
                or self._status(pod, c, 0, {"waiting": {"reason": "PodInitializing"}})
                for c in inits
            ]
        if status == run.written:
            return
        self._patch_pod_status(run.namespace, run.name, status)
        run.written = status

    def _node_ip(self, node: str) -> str:
        return f"10.1.0.{10 + self.node_names.index(node)}"

    def _feed_logs(self, run: PodRun, pod: Obj) -> None:
        """Each container's log file, as the API serves it (peer.api.logs per container, and per
        pod for the first container)."""
        first = ((pod["spec"].get("containers") or [{}])[0]).get("name")
        for name in {*run.statuses, *([first] if first else [])}:
            restarts = run.statuses.get(name, {}).get("restartCount", 0)
            log = run.dir / "logs" / name / f"{restarts}.log"
            try:
                size = log.stat().st_size
            except OSError:
                continue
            if run.log_sizes.get(name) == size:
                continue
            run.log_sizes[name] = size
            text = self._as_seen_inside(run, log.read_text(errors="replace"))
            self.peer.api.logs[(run.namespace, run.name, name)] = text
            if name == first:
                self.peer.api.logs[(run.namespace, run.name)] = text

    def _as_seen_inside(self, run: PodRun, text: str) -> str:
        """The container's output with the names the container gave: each volume's directory here
        back to its mount path, the pod's /tmp and home back to theirs, the rendezvous endpoint's
        loopback port back to the Service (the inverse of what its command and environment went
        through)."""
        inside = {d: m for m, d in run.mounts.items() if m != "/"}
        inside |= {str(run.dir / "tmp"): "/tmp", str(run.dir / "home"): IMAGE_HOME, **run.seen_as}
        for directory in sorted(inside, key=len, reverse=True):
            text = text.replace(directory, inside[directory])
        return text

    # --- what a test does to the cluster ----------------------------------------------------------

    def node_logs(self, namespace: str, name: str, container: str) -> list[str]:
        """Every run of that container in pods of that name, oldest first, one text each: the
        nodes' /var/log/pods, which outlive the pods (the API serves only a live pod's)."""
        from fsdpctl.job import crilog

        return [
            self._as_seen_inside(run, "\n".join(crilog.texts(c.log)))
            for run, c in list(self.started)
            if (run.namespace, run.name, c.name) == (namespace, name, container) and c.log.exists()
        ]

    def pod_run(self, namespace: str, name: str) -> PodRun | None:
        """The kubelet's record of the live pod of that name."""
        found = [r for r in list(self.runs.values()) if (r.namespace, r.name) == (namespace, name)]
        return found[-1] if found else None

    def processes(self, namespace: str, name: str) -> list[int]:
        """The live processes of the pod's running container."""
        run = self.pod_run(namespace, name)
        return pod_processes(run.current.mark) if run and run.current else []

    def kill(self, namespace: str, name: str, sig: int = signal.SIGKILL) -> int:
        """`sig` to every process of the pod's running container (a node that dies takes all of
        them at once); how many got it."""
        pids = self.processes(namespace, name)
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        return len(pids)


# a pod's processes in UTS and mount namespaces of their own: its hostname, its /etc/hosts
UNSHARE = [
    "unshare",
    "--uts",
    "--mount",
    "--propagation",
    "private",
    "--",
    "/bin/sh",
    "-c",
    'hostname "$1" && mount --bind "$2" /etc/hosts && shift 2 && exec "$@"',
    "pod",
]


def pod_namespaces() -> tuple[bool, str]:
    """Whether pods can have their own hostname and /etc/hosts here (root, util-linux unshare);
    why not."""
    import shutil

    if os.geteuid() != 0:
        return False, "not root: pods share this machine's hostname and the loopback address"
    if not shutil.which("unshare"):
        return False, "no unshare (util-linux): pods share this machine's hostname"
    probe = subprocess.run(
        ["unshare", "--uts", "--mount", "--propagation", "private", "--", "true"],
        capture_output=True,
        timeout=30,
    )
    if probe.returncode != 0:
        return False, f"unshare: {probe.stderr.decode(errors='replace').strip()}"
    return True, ""


class StartRefused(Exception):
    """The container cannot start here (StartError, exit code 128)."""


def _option(argv: Iterable[str], name: str) -> str | None:
    """A `--name=value` (or `--name value`) option of a command line."""
    words = list(argv)
    for i, w in enumerate(words):
        key, eq, value = w.partition("=")
        if key in (f"--{name}", f"--{name.replace('-', '_')}"):
            return value if eq else (words[i + 1] if i + 1 < len(words) else None)
    return None


def _map_arg(arg: str, mounts: dict[str, str]) -> str:
    """A command argument that is a pod path (or `--flag=path`) with its mount mapped to its
    directory (longest mount first, as `mapped_env` maps the environment)."""
    flag, eq, value = arg.rpartition("=") if arg.startswith("--") else ("", "", arg)
    mapped = mapped_env({"env": {"_": value}, "volumes": mounts}, 0)["_"]
    return f"{flag}{eq}{mapped}"

"""What fsdpctl owns on a cluster, and the proof it asks for before it changes anything there.

Every object a `job run` makes for a job carries the run's owner labels (fsdpctl.job.owner: home,
job, run id, submit token). The job's own dependents (the HF-token Secret, the record ConfigMap,
the PodDisruptionBudget, the pre-step Job) are named from the job and carry an ownerReference to
the job object, so the garbage collector deletes them with it ("Owners and Dependents",
kubernetes.io/docs/concepts/overview/working-with-objects/owners-dependents; the collector in
kubernetes pkg/controller/garbagecollector): fsdpctl never deletes them by name. An object that
is in the way and does not carry this home's and this job's labels is refused in one line naming
it and the `kubectl` that acts on it by hand; a delete of one that does carries its UID as a
precondition (a same-named object made since is not the one checked)."""

from __future__ import annotations

from typing import Any

from fsdpctl.backends.eks import configmap
from fsdpctl.errors import ExitCode, FsdpctlError
from fsdpctl.job import owner, prestep, render
from fsdpctl.job.render import Obj
from fsdpctl.settings import Config


def mine(cfg: Config, run_id: str) -> owner.Owner:
    """The owner of run `run_id` of the settings' job, made from this home (the same identity the
    job core writes in the submit's intent)."""
    return owner.Owner(owner.home_id(), cfg.job_name, run_id)


def stamped(obj: Obj, who: owner.Owner) -> Obj:
    """`obj` with the owner labels on its metadata (not its pod template: the job's pods are
    selected by fsdpctl.io/job, and a pre-step pod is not one of them)."""
    meta = obj["metadata"]
    return {**obj, "metadata": {**meta, "labels": {**(meta.get("labels") or {}), **who.labels()}}}


def mark(obj: Obj) -> owner.Mark:
    return owner.of_labels((obj.get("metadata") or {}).get("labels"))


def refusal(obj: Obj, why: str, namespace: str) -> FsdpctlError:
    """One line naming the object, why it is not this job's, and how to act on it by hand."""
    kind, name = obj.get("kind") or "object", obj["metadata"]["name"]
    return FsdpctlError(
        f"{kind} {namespace}/{name}: {why}; fsdpctl does not change or delete it",
        hint=f"act on it by hand if it is no longer wanted (kubectl -n {namespace} delete "
        f"{kind.lower()} {name}), or give this job another JOB_NAME",
        code=ExitCode.BAD_INPUT,
    )


def check(obj: Obj, cfg: Config, job: str | None = None) -> None:
    """Refused (exit 2) unless `obj` carries this home's labels for `job` (default: the settings'
    job)."""
    why = owner.why_not_ours(mark(obj), owner.home_id(), job or cfg.job_name)
    if why is not None:
        raise refusal(obj, why, cfg.job_namespace)


def dependents(cfg: Config, name: str) -> list[tuple[str, str, str]]:
    """(apiVersion, kind, name) of each per-job object a run of job `name` makes beside the job
    object."""
    return [
        ("v1", "Secret", render.job_secret_name(name)),
        ("v1", "ConfigMap", configmap.config_map_name(name)),
        ("policy/v1", "PodDisruptionBudget", name),
        ("batch/v1", "Job", prestep.job_name(name)),
    ]


def in_the_way(kube: Any, cfg: Config) -> list[Obj]:
    """The per-job objects an earlier run left (owned: they go before the new ones are made);
    refused, before anything changed, when any of them is not this home's job's."""
    found = []
    for api, kind, name in dependents(cfg, cfg.job_name):
        obj = kube.get(api, kind, name, cfg.job_namespace)
        if obj is not None:
            check({**obj, "kind": kind}, cfg)
            found.append({**obj, "apiVersion": api, "kind": kind})
    return found


def owned_by_uid(obj: Obj, uid: str) -> bool:
    return any(ref.get("uid") == uid for ref in obj["metadata"].get("ownerReferences") or [])

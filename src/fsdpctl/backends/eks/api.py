"""The cluster as the EKS backend reaches it: the connection, every API call's failure explained in
one line with its fix, and the job object by name."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from fsdpctl.errors import ExitCode, FsdpctlError
from fsdpctl.job import render
from fsdpctl.settings import Config


def connect(cfg: Config):
    """The cluster from the kubeconfig (KUBE_CONTEXT), or one line naming the command that fixes
    it."""
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


def owned_by(obj: dict, owner: dict) -> dict:
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

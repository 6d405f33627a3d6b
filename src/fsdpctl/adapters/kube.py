"""Adapter: the Kubernetes API, through the official python client's HTTP layer (kubeconfig loading, auth
refresh for EKS tokens, TLS) with plain JSON objects in and out. One generic path for every kind, so that the
same calls serve built-ins, the Training Operator's PyTorchJob and Trainer v2's TrainJob.

Errors come back as KubeError carrying the API's own status code and message; the commands turn them into
one line with the fix."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

FIELD_MANAGER = "fsdpctl"

# kinds whose objects are not in a namespace
CLUSTER_KINDS = {
    "Namespace",
    "CustomResourceDefinition",
    "ClusterRole",
    "ClusterRoleBinding",
    "Node",
    "ValidatingWebhookConfiguration",
    "MutatingWebhookConfiguration",
    "ClusterTrainingRuntime",
    "PriorityClass",
    "StorageClass",
}
IRREGULAR_PLURALS = {"Endpoints": "endpoints"}


class KubeError(RuntimeError):
    def __init__(self, status: int, reason: str, message: str):
        super().__init__(f"{status} {reason}: {message}")
        self.status, self.reason, self.message = status, reason, message


class NoCluster(RuntimeError):
    """No kubeconfig, no such context, or nothing answers at the server address."""


def plural(kind: str) -> str:
    if kind in IRREGULAR_PLURALS:
        return IRREGULAR_PLURALS[kind]
    low = kind.lower()
    if low.endswith("y"):
        return low[:-1] + "ies"
    if low.endswith("s"):
        return low + "es"
    return low + "s"


def path(
    api_version: str,
    kind: str,
    namespace: str | None = None,
    name: str | None = None,
    subresource: str | None = None,
) -> str:
    """The REST path of a collection or an object: /api/v1/... for the core group, /apis/G/V/... otherwise."""
    base = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    if namespace and kind not in CLUSTER_KINDS:
        base += f"/namespaces/{namespace}"
    base += f"/{plural(kind)}"
    if name:
        base += f"/{name}"
    if subresource:
        base += f"/{subresource}"
    return base


def obj_path(obj: dict, with_name: bool = True) -> str:
    meta = obj.get("metadata", {})
    return path(
        obj["apiVersion"], obj["kind"], meta.get("namespace"), meta.get("name") if with_name else None
    )


def selector(labels: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


def matches(obj: dict, labels: dict[str, str]) -> bool:
    have = obj.get("metadata", {}).get("labels") or {}
    return all(have.get(k) == v for k, v in labels.items())


@dataclass
class Kube:
    api: Any  # kubernetes.client.ApiClient
    context: str = ""

    @classmethod
    def connect(cls, context: str = "", kubeconfig: str | None = None) -> Kube:
        """From the kubeconfig ($KUBECONFIG or ~/.kube/config), else the pod's service account."""
        from kubernetes import config
        from kubernetes.config.config_exception import ConfigException

        # read $KUBECONFIG now: the client computes its default path once, at import
        kubeconfig = kubeconfig or os.environ.get("KUBECONFIG") or None
        try:
            api = config.new_client_from_config(config_file=kubeconfig, context=context or None)
        except ConfigException as e:
            try:
                config.load_incluster_config()
            except ConfigException:
                raise NoCluster(str(e).splitlines()[0]) from e
            from kubernetes import client

            api = client.ApiClient()
        except FileNotFoundError as e:
            raise NoCluster(f"kubeconfig not found: {e.filename}") from e
        return cls(api, context)

    @property
    def server(self) -> str:
        return self.api.configuration.host

    # --- raw -----------------------------------------------------------------------------------------------------

    def request(
        self,
        method: str,
        url: str,
        *,
        body: Any = None,
        query: dict | None = None,
        content_type: str = "application/json",
        stream: bool = False,
        timeout: float | None = 60,
    ):
        """One HTTP call; the parsed JSON answer, or the open response when `stream`."""
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        params = [(k, v) for k, v in (query or {}).items() if v is not None]
        headers = {"Accept": "application/json, */*", "Content-Type": content_type}
        try:
            resp = self.api.call_api(
                url,
                method,
                query_params=params,
                header_params=headers,
                body=body,
                auth_settings=["BearerToken"],
                _preload_content=False,
                _request_timeout=(10, timeout) if stream and timeout else timeout,
                _return_http_data_only=True,
            )
        except ApiException as e:
            raise _kube_error(e.status, e.reason, e.body) from e
        except HTTPError as e:
            raise NoCluster(f"cannot reach the Kubernetes API at {self.server}: {e}") from e
        if stream:
            return resp
        data = resp.data
        return json.loads(data) if data else {}

    # --- objects -------------------------------------------------------------------------------------------------

    def get(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> dict | None:
        try:
            return self.request("GET", path(api_version, kind, namespace, name))
        except KubeError as e:
            if e.status == 404:
                return None
            raise

    def list(
        self, api_version: str, kind: str, namespace: str | None = None, labels: dict[str, str] | None = None
    ) -> list[dict]:
        """Objects with these labels. The selector goes to the server; the filter is repeated here, which
        changes nothing on a real API server and keeps emulators that ignore selectors honest."""
        labels = labels or {}
        data = self.request(
            "GET", path(api_version, kind, namespace), query={"labelSelector": selector(labels) or None}
        )
        return [o for o in data.get("items", []) if matches(o, labels)]

    def create(self, obj: dict) -> dict:
        return self.request("POST", obj_path(obj, with_name=False), body=obj)

    def apply(self, obj: dict, dry_run: bool = False) -> dict:
        """Server-side apply as field manager `fsdpctl` (force: fsdpctl owns what it renders)."""
        return self.request(
            "PATCH",
            obj_path(obj),
            body=obj,
            content_type="application/apply-patch+yaml",
            query={"fieldManager": FIELD_MANAGER, "force": "true", "dryRun": "All" if dry_run else None},
        )

    def delete(
        self,
        api_version: str,
        kind: str,
        name: str,
        namespace: str | None = None,
        propagation: str = "Foreground",
    ) -> bool:
        """False when it was already gone."""
        try:
            self.request(
                "DELETE",
                path(api_version, kind, namespace, name),
                body={"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": propagation},
            )
            return True
        except KubeError as e:
            if e.status == 404:
                return False
            raise

    def events(self, namespace: str, name: str) -> list[dict]:
        """Events about one object (the scheduler's 'Insufficient nvidia.com/gpu', image pull errors)."""
        data = self.request(
            "GET", path("v1", "Event", namespace), query={"fieldSelector": f"involvedObject.name={name}"}
        )
        return [e for e in data.get("items", []) if e.get("involvedObject", {}).get("name") == name]

    def logs(
        self, namespace: str, pod: str, container: str = "", follow: bool = False, tail: int | None = None
    ) -> Iterator[str]:
        """The pod's log line by line; with `follow`, until the container ends."""
        query = {
            "container": container or None,
            "follow": "true" if follow else None,
            "tailLines": str(tail) if tail else None,
        }
        # no read timeout: a training step may print nothing for many minutes
        resp = self.request(
            "GET", path("v1", "Pod", namespace, pod, "log"), query=query, stream=True, timeout=None
        )
        try:
            yield from (line.decode("utf-8", errors="replace") for line in _lines(resp))
        finally:
            resp.release_conn()

    def watch(
        self,
        api_version: str,
        kind: str,
        namespace: str | None = None,
        labels: dict[str, str] | None = None,
        timeout: int = 60,
    ) -> Iterator[tuple[str, dict]]:
        """(event type, object) as the API streams them, until `timeout` seconds pass."""
        labels = labels or {}
        query = {"watch": "true", "labelSelector": selector(labels) or None, "timeoutSeconds": str(timeout)}
        # the server ends the watch after timeoutSeconds; the read timeout only guards a connection gone silent
        resp = self.request(
            "GET", path(api_version, kind, namespace), query=query, stream=True, timeout=timeout + 30
        )
        try:
            for line in filter(bytes.strip, _lines(resp)):
                event = json.loads(line)
                if matches(event.get("object", {}), labels):
                    yield event["type"], event["object"]
        finally:
            resp.release_conn()

    def proxy(
        self, method: str, namespace: str, service: str, port: int, rest: str, query: dict | None = None
    ):
        """A request to a Service through the API server's proxy (etcd, Prometheus): no port-forward needed."""
        url = f"/api/v1/namespaces/{namespace}/services/{service}:{port}/proxy/{rest.lstrip('/')}"
        return self.request(method, url, query=query)


def _lines(resp) -> Iterator[bytes]:
    """The lines of a streamed answer; a read timeout ends the stream like the server closing it."""
    from urllib3.exceptions import ReadTimeoutError

    buf = b""
    try:
        for chunk in resp.stream(4096, decode_content=True):
            buf += chunk
            *lines, buf = buf.split(b"\n")
            yield from lines
    except ReadTimeoutError:
        return
    if buf:
        yield buf


def _kube_error(status: int, reason: str, body: Any) -> KubeError:
    message = ""
    try:
        parsed = json.loads(body) if body else {}
        message, reason = parsed.get("message", ""), parsed.get("reason", reason) or reason
    except (TypeError, ValueError):
        message = (body.decode(errors="replace") if isinstance(body, bytes) else str(body or ""))[:300]
    return KubeError(status or 0, str(reason or ""), message)

"""Adapter: the Kubernetes API, through the official python client's HTTP layer (kubeconfig loading,
auth refresh for EKS tokens, TLS) with plain JSON objects in and out. One generic path for every
kind, so that the same calls serve built-ins, the Training Operator's PyTorchJob and Trainer v2's
TrainJob.

Every kind is resolved as the API server itself says through discovery: its plural, whether it lives
in a namespace, its verbs. fsdpctl keeps no table of its own: a new kind (CSIDriver,
PersistentVolume) goes to the path the server gives, and a CRD fsdpctl applies resolves from its own
spec until the server lists it.

Errors come back as KubeError carrying the API's own status code and message; the commands turn them
into one line with the fix."""

from __future__ import annotations

import builtins
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, TypedDict

from fsdpctl.adapters import shell
from fsdpctl.adapters.kube_api import CRD_API, Discovery, Resource, resources_from_crd

# the API's errors, raised by every call of the client below
from fsdpctl.adapters.kube_api import KubeError as KubeError
from fsdpctl.adapters.kube_api import NoCluster as NoCluster
from fsdpctl.adapters.kubeconfig import check_kubeconfig

FIELD_MANAGER = "fsdpctl"


def selector(labels: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


class DeleteOptions(TypedDict, total=False):
    """meta/v1 DeleteOptions, the fields fsdpctl sends (apimachinery types.go)."""

    kind: str
    apiVersion: str
    propagationPolicy: str
    preconditions: dict[str, str]  # Preconditions: {"uid": ...}


@dataclass
class Kube:
    api: Any  # kubernetes.client.ApiClient
    context: str = ""
    timeout: float = (
        30  # REQUEST_TIMEOUT: to connect, and for each answer (a follow stream: its headers)
    )
    discovery: Discovery = field(init=False, repr=False)
    # objects a server dry run could not check: their namespace or CRD comes from the same dry run,
    # which creates nothing (kubernetes/kubernetes#83562)
    unchecked: list[str] = field(default_factory=list)
    _dry_namespaces: set[str] = field(default_factory=set, repr=False)
    _dry_kinds: set[tuple[str, str]] = field(default_factory=set, repr=False)

    def __post_init__(self) -> None:
        self.discovery = Discovery(lambda url, accept: self.request("GET", url, accept=accept))

    @classmethod
    def connect(cls, context: str = "", kubeconfig: str | None = None, timeout: float = 30) -> Kube:
        """From the kubeconfig ($KUBECONFIG or ~/.kube/config), else the pod's service account.
        Every request has a deadline (`timeout`, REQUEST_TIMEOUT), and so has the kubeconfig's exec
        plugin."""
        from kubernetes import client, config
        from kubernetes.config.config_exception import ConfigException

        # read $KUBECONFIG now: the client computes its default path once, at import
        kubeconfig = kubeconfig or os.environ.get("KUBECONFIG") or None
        check_kubeconfig(kubeconfig)  # before the client reads it, in its own way
        conf = client.Configuration()
        _bound_exec_plugin(timeout)
        try:
            config.load_kube_config(
                config_file=kubeconfig, context=context or None, client_configuration=conf
            )
        except ConfigException as e:
            try:
                config.load_incluster_config(client_configuration=conf)
            except ConfigException:
                raise NoCluster(str(e).splitlines()[0]) from e
        except FileNotFoundError as e:
            raise NoCluster(f"kubeconfig not found: {e.filename}") from e
        except shell.Overdue as e:
            raise NoCluster(f"the kubeconfig's exec plugin: {e} (REQUEST_TIMEOUT)") from None
        conf.retries = _retries()
        return cls(client.ApiClient(configuration=conf), context, timeout)

    @property
    def server(self) -> str:
        return self.api.configuration.host

    # --- paths ------------------------------------------------------------------------------------

    def resource(self, api_version: str, kind: str) -> Resource:
        """The kind as the server serves it; KubeError 404 when it serves no such kind."""
        return self.discovery.resolve(api_version, kind)

    def path(
        self,
        api_version: str,
        kind: str,
        namespace: str | None = None,
        name: str | None = None,
        subresource: str | None = None,
    ) -> str:
        return self.resource(api_version, kind).path(namespace, name, subresource)

    def obj_path(self, obj: dict, with_name: bool = True) -> str:
        meta = obj.get("metadata", {})
        res = self.resource(obj["apiVersion"], obj["kind"])
        if res.namespaced and not meta.get("namespace"):
            raise ValueError(
                f"{obj['kind']} {meta.get('name')} is namespaced: give metadata.namespace"
            )
        return res.path(meta.get("namespace"), meta.get("name") if with_name else None)

    # --- raw --------------------------------------------------------------------------------------

    def request(
        self,
        method: str,
        url: str,
        *,
        body: Any = None,
        query: dict | None = None,
        content_type: str = "application/json",
        accept: str = "application/json, */*",
        stream: bool = False,
        timeout: float | None = None,
        follow: bool = False,
    ):
        """One HTTP call; the parsed JSON answer, or the open response when `stream`. It waits at
        most self.timeout to connect and `timeout` (default self.timeout) for each read, as kubectl
        gives up after its --request-timeout (the client's `_request_timeout`: a (connect, read)
        pair becomes urllib3's Timeout); a `follow` stream (`logs -f`) waits for its headers only,
        then as long as the container is quiet."""
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        params = [(k, v) for k, v in (query or {}).items() if v is not None]
        headers = {"Accept": accept, "Content-Type": content_type}
        try:
            resp = self.api.call_api(
                url,
                method,
                query_params=params,
                header_params=headers,
                body=body,
                auth_settings=["BearerToken"],
                _preload_content=False,
                _request_timeout=(self.timeout, timeout or self.timeout),
                _return_http_data_only=True,
            )
        except ApiException as e:
            raise _kube_error(e.status, e.reason, e.body) from e
        except HTTPError as e:
            raise NoCluster(_unreachable(self.server, e, timeout or self.timeout)) from e
        except shell.Overdue as e:  # the exec plugin, run again to refresh an expired token
            raise NoCluster(f"the kubeconfig's exec plugin: {e} (REQUEST_TIMEOUT)") from None
        if follow:
            _no_read_deadline(resp)
        if stream:
            return resp
        data = resp.data
        try:
            return json.loads(data) if data else {}
        except ValueError:
            raise _bad_answer(method, url, f"{bytes(data)[:60]!r}, not JSON") from None

    # --- objects ----------------------------------------------------------------------------------

    def get(
        self, api_version: str, kind: str, name: str, namespace: str | None = None
    ) -> dict | None:
        """None when the object, or its kind, is not there; an answer that is not that object (an
        empty or stray document from a proxy in between) is a KubeError naming the request."""
        try:  # a kind the server does not serve is discovery's 404 too
            path = self.path(api_version, kind, namespace, name)
            found = self.request("GET", path)
        except KubeError as e:
            if e.status == 404:
                return None
            raise
        meta = found.get("metadata") if isinstance(found, dict) else None
        if not isinstance(meta, dict) or found.get("kind") != kind or meta.get("name") != name:
            raise _bad_answer("GET", path, f"{_summary(found)}, not {kind} {name}")
        return found

    def list(
        self,
        api_version: str,
        kind: str,
        namespace: str | None = None,
        labels: dict[str, str] | None = None,
    ) -> list[dict]:
        """Objects with these labels: the API server evaluates the selector."""
        query = {"labelSelector": selector(labels or {}) or None}
        path = self.path(api_version, kind, namespace)
        found = self.request("GET", path, query=query)
        items = found.get("items") if isinstance(found, dict) else None
        if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
            raise _bad_answer("GET", path, f"{_summary(found)}, not a list of {kind}")
        return items

    def create(self, obj: dict) -> dict:
        """POST, with strict field validation (as kubectl): a field the schema lacks fails instead
        of being dropped."""
        answer = self.request(
            "POST",
            self.obj_path(obj, with_name=False),
            body=obj,
            query={"fieldValidation": "Strict"},
        )
        self._remember(obj, dry_run=False)
        return answer

    def apply(self, obj: dict, dry_run: bool = False) -> dict:
        """Server-side apply as field manager `fsdpctl` (force: fsdpctl owns what it renders). A dry
        run of an object whose namespace or CRD this same dry run 'created' cannot be checked by the
        server: it is listed in `unchecked` instead of failing."""
        query = {
            "fieldManager": FIELD_MANAGER,
            "force": "true",
            "fieldValidation": "Strict",
            "dryRun": "All" if dry_run else None,
        }
        try:
            answer = self.request(
                "PATCH",
                self.obj_path(obj),
                body=obj,
                content_type="application/apply-patch+yaml",
                query=query,
            )
        except KubeError as e:
            if not (dry_run and e.status == 404 and self._after_dry_run(obj)):
                raise
            self.unchecked.append(f"{obj['kind']}/{obj['metadata']['name']}")
            return obj
        self._remember(obj, dry_run)
        return answer

    def merge_patch(
        self, api_version: str, kind: str, name: str, namespace: str | None, patch: dict
    ) -> dict:
        """A JSON merge patch (RFC 7386) of one object, e.g. an annotation; 404 when it is gone."""
        return self.request(
            "PATCH",
            self.path(api_version, kind, namespace, name),
            body=patch,
            content_type="application/merge-patch+json",
        )

    def _remember(self, obj: dict, dry_run: bool) -> None:
        """A CRD resolves its kinds from its spec from now on; a dry-run Namespace or CRD exists for
        nothing that follows in the same dry run."""
        if (obj.get("apiVersion"), obj.get("kind")) == CRD_API:
            self.discovery.learn(obj)
            if dry_run:
                self._dry_kinds.update((r.group_version, r.kind) for r in resources_from_crd(obj))
        if dry_run and (obj.get("apiVersion"), obj.get("kind")) == ("v1", "Namespace"):
            self._dry_namespaces.add(obj["metadata"]["name"])

    def _after_dry_run(self, obj: dict) -> bool:
        namespace = obj.get("metadata", {}).get("namespace")
        return (
            namespace in self._dry_namespaces or (obj["apiVersion"], obj["kind"]) in self._dry_kinds
        )

    def delete(
        self,
        api_version: str,
        kind: str,
        name: str,
        namespace: str | None = None,
        propagation: str = "Foreground",
        uid: str | None = None,
    ) -> bool:
        """False when it was already gone. With `uid`, only that object: a same-named one made
        since is a 409 Conflict (DeleteOptions.preconditions), not deleted."""
        body = DeleteOptions(kind="DeleteOptions", apiVersion="v1", propagationPolicy=propagation)
        if uid is not None:
            body["preconditions"] = {"uid": uid}
        try:
            self.request("DELETE", self.path(api_version, kind, namespace, name), body=body)
            return True
        except KubeError as e:
            if e.status == 404:
                return False
            raise

    def events(self, namespace: str, name: str) -> builtins.list[dict]:
        """Events about one object (the scheduler's 'Insufficient nvidia.com/gpu', image pull
        errors)."""
        query = {"fieldSelector": f"involvedObject.name={name}"}
        return self.request("GET", self.path("v1", "Event", namespace), query=query).get(
            "items", []
        )

    def logs(
        self,
        namespace: str,
        pod: str,
        container: str = "",
        follow: bool = False,
        tail: int | None = None,
        since_seconds: int | None = None,
        timestamps: bool = False,
    ) -> Iterator[str]:
        """The pod's log line by line; with `follow`, until the container ends. PodLogOptions:
        tailLines, sinceSeconds, timestamps (each line then starts with its RFC 3339 time and a
        space)."""
        query = {
            "container": container or None,
            "follow": "true" if follow else None,
            "tailLines": str(tail) if tail is not None else None,
            "sinceSeconds": str(since_seconds) if since_seconds is not None else None,
            "timestamps": "true" if timestamps else None,
        }
        # following: no read deadline once it answered (a training step may print nothing for
        # minutes)
        url = self.path("v1", "Pod", namespace, pod, "log")
        resp = self.request("GET", url, query=query, stream=True, follow=follow)
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
        """(event type, object) as the API streams them, until `timeout` seconds pass. With
        `labels`, the server also sends DELETED for an object whose labels stop matching."""
        query = {
            "watch": "true",
            "labelSelector": selector(labels or {}) or None,
            "timeoutSeconds": str(timeout),
        }
        # the server ends the watch after timeoutSeconds; the read timeout guards a connection gone
        # silent
        url = self.path(api_version, kind, namespace)
        resp = self.request("GET", url, query=query, stream=True, timeout=timeout + 30)
        try:
            for line in filter(bytes.strip, _lines(resp)):
                event = json.loads(line)
                yield event["type"], event["object"]
        finally:
            resp.release_conn()

    def proxy(
        self,
        method: str,
        namespace: str,
        service: str,
        port: int,
        rest: str,
        query: dict | None = None,
    ):
        """A request to a Service through the API server's proxy (etcd, Prometheus): no
        port-forward."""
        url = (
            self.path("v1", "Service", namespace, f"{service}:{port}", "proxy")
            + "/"
            + rest.lstrip("/")
        )
        return self.request(method, url, query=query)


def _retries() -> Any:
    """urllib3's retries for every request: a refused or failed connection is tried again (twice), a
    request that was sent and never answered is not (its deadline has passed once already); the
    client's default was urllib3's Retry(3), each a full read timeout more."""
    from urllib3.util.retry import Retry

    return Retry(total=2, connect=2, read=0, status=0, other=0, redirect=5, raise_on_status=False)


def _unreachable(server: str, e: Exception, read_s: float) -> str:
    from urllib3.exceptions import MaxRetryError, TimeoutError

    reason = e.reason if isinstance(e, MaxRetryError) else e
    if isinstance(reason, TimeoutError):
        return (
            f"the Kubernetes API at {server} did not answer within {read_s:g} s (REQUEST_TIMEOUT)"
        )
    return f"cannot reach the Kubernetes API at {server}: {e}"


def _no_read_deadline(resp: Any) -> None:
    """Clear the read deadline of an answered stream's socket (urllib3 set it for the headers)."""
    sock = getattr(getattr(resp, "connection", None), "sock", None)
    if sock is not None:
        sock.settimeout(None)


def _bound_exec_plugin(timeout: float) -> None:
    """The kubernetes client runs a kubeconfig's exec credential plugin (`aws eks get-token`) and
    waits for it with no timeout (config/exec_provider.py, ExecProvider.run:
    `process.communicate()`), also when it refreshes an expired token mid-command. Its `subprocess`
    is given a Popen with a deadline."""
    import subprocess
    import types

    from kubernetes.config import exec_provider

    bounded = shell.bounded_popen(timeout, "the exec plugin")
    exec_provider.subprocess = types.SimpleNamespace(Popen=bounded, PIPE=subprocess.PIPE)


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


# what a gateway says of an answer it cannot use (RFC 9110 15.6.3, 502 Bad Gateway): an API answer
# fsdpctl cannot read as what it asked for is named, never taken for an object
BAD_ANSWER = 502


def _bad_answer(method: str, url: str, what: str) -> KubeError:
    return KubeError(BAD_ANSWER, "BadAnswer", f"the API server answered {method} {url} with {what}")


def _summary(found: Any) -> str:
    """An answer in a few words: what it is, not what it holds."""
    if isinstance(found, dict):
        return f"an object of kind {str(found.get('kind'))[:40]!r}" if found else "an empty answer"
    return f"a JSON {type(found).__name__}"


def _kube_error(status: int, reason: str, body: Any) -> KubeError:
    message = ""
    try:
        parsed = json.loads(body) if body else {}
        if not isinstance(parsed, dict):
            raise TypeError
        message, reason = parsed.get("message", ""), parsed.get("reason", reason) or reason
    except (TypeError, ValueError):
        message = (body.decode(errors="replace") if isinstance(body, bytes) else str(body or ""))[
            :300
        ]
    return KubeError(status or 0, str(reason or ""), message)

"""The Kubernetes API peer: an in-memory API server on kmock 0.8's HTTP machinery (kmock.Server, its
request parsing and request log), served on 127.0.0.1 from a background thread and spoken to by the
real `kubernetes` client through a kubeconfig.

kmock's own emulator keeps objects as merged dicts: no discovery of what it holds, no scopes, no
selectors, no resourceVersion, no validation, no garbage collection. fsdpctl depends on all of
those, so the peer answers as kube-apiserver does for them, each rule after the upstream source or
API documentation named where it is implemented (here, in kube_peer_discovery.py and
kube_peer_rules.py):

- discovery from kube-apiserver's own documents (kubernetes/kubernetes api/discovery/*.json, read from
  ../shared/vendor/kubernetes-discovery) plus every CRD applied, plain and aggregated (KEP-3352);
- routes by scope (apiserver pkg/endpoints/installer.go): a namespaced path to a cluster-scoped kind is 404,
  a named cluster path to a namespaced kind is 404 and a create there 405; a namespaced kind lists across
  namespaces at its cluster path;
- label selectors, equality- and set-based, and field selectors, evaluated by the server, in lists and
  watches; a watch sends DELETED when an object stops matching (apiserver pkg/storage/cacher/
  cache_watcher.go);
- resourceVersion on every write from one counter, 409 Conflict on a stale update or patch precondition,
  uid and creationTimestamp on create, generation bumped by spec changes, 409 AlreadyExists;
- field validation (API concepts, "Field validation"): unknown fields dropped with a Warning header by
  default, 400 naming them with fieldValidation=Strict, and server-side apply refusing them with the 500 of
  kubernetes/kubernetes#122480; custom resources pruned to their structural schema and their values checked
  (422 Invalid); built-ins checked against the Kubernetes OpenAPI of fsdpctl's target version;
- NamespaceLifecycle admission (plugin/pkg/admission/namespace/lifecycle): no create in a missing (404) or
  terminating (403) namespace, dry runs included (kubernetes/kubernetes#83562), immortal namespaces;
- status subresources: writes to the object keep its status, writes to /status change only the status;
- deletion: finalizers, graceful pod deletion, propagationPolicy Foreground / Background / Orphan with the
  owner-reference garbage collector (pkg/controller/garbagecollector/garbagecollector.go), the batch/v1 Job
  default of Orphan, the namespace controller emptying a terminating namespace, CRD deletion removing its
  objects;
- list items of built-in kinds without apiVersion/kind (kubernetes/kubernetes#3030), RBAC 403 wording;
- the eviction subresource and the disruption controller's view of a PodDisruptionBudget
  (kube_peer_disruption.py: pkg/registry/core/pod/storage/eviction.go, pkg/controller/disruption).
- the pods/binding subresource a scheduler binds with, a Secret's stringData stored as base64 data, the
  selector and pod labels the API server generates for a batch/v1 Job (pkg/registry/batch/job/strategy.go);
- `store.listeners`, told of every write (an informer's event), for the controllers beside it.
And what tests play instead of the cluster's other parts: pod logs from `peer.api.logs` (per pod, or per
(namespace, pod, container); the peer applies tailLines, sinceSeconds, sinceTime and timestamps as the kubelet
does, to lines with their own CRI times or the time they were stored), Service proxies to handlers the tests
register (e.g. a real etcd), `forbidden` plurals.
It has no controllers, no scheduler and no kubelet of its own: tests set pod and job status themselves, or
attach kube_peer_operator.Cluster, which runs the Training Operator's and the Job controller, a scheduler and
the nodes' kubelets (real processes) against it."""

from __future__ import annotations

import asyncio
import functools
import json
import random
import re
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp.web
import kmock
import yaml
from multidict import CIMultiDict

import kube_peer_disruption as disruption
import kube_peer_kubelet as kubelet
from conftest import SHARED
from kube_peer_discovery import Registry, Served, accepts_aggregated
from kube_peer_rules import (
    Schema,
    SelectorError,
    fields_match,
    merge_patch,
    name_errors,
    parse_fields,
    parse_labels,
    selects,
)

DISCOVERY = SHARED / "vendor" / "kubernetes-discovery"
NAMESPACES = re.compile(r"^/api/v1/namespaces/?$")
ROUTE = re.compile(
    r"^/(?:api/(?P<core>v1)|apis/(?P<group>[^/]+)/(?P<version>[^/]+))(?P<rest>(?:/[^/]*)*)$"
)
IMMORTAL = ("default", "kube-system", "kube-public")
HISTORY = 5000  # watch events kept for ?resourceVersion=N
Key = tuple[str, str, str, str]  # group, plural, namespace ("" when cluster-scoped), name


class Reply(Exception):
    """An API error answer (metav1.Status)."""

    def __init__(self, code: int, reason: str, message: str, details: dict | None = None):
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details or {}


def status_body(code: int, reason: str, message: str, details: dict | None = None) -> dict:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure" if code >= 300 else "Success",
        "message": message,
        "reason": reason,
        "details": details or {},
        "code": code,
    }


def not_found(res: Served, name: str) -> Reply:
    return Reply(
        404,
        "NotFound",
        f'{res.qualified} "{name}" not found',
        {"name": name, "group": res.group, "kind": res.plural},
    )


def now(offset: float = 0) -> str:
    return (datetime.now(UTC) + timedelta(seconds=offset)).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Route:
    group: str
    version: str
    namespace: str | None
    plural: str | None
    name: str | None
    sub: str | None


def parse_route(path: str) -> Route | None:
    """/api/v1/... or /apis/G/V/...; /api/v1/namespaces/N is the Namespace N itself (and its status
    and finalize subresources), a longer /namespaces/N/... path is a namespaced request."""
    m = ROUTE.match(path)
    if not m:
        return None
    group, version = (m.group("group") or ""), (m.group("version") or m.group("core"))
    rest = m.group("rest").lstrip("/")
    parts = rest.split("/") if rest else []
    namespace = None
    if (
        len(parts) >= 3
        and parts[0] == "namespaces"
        and not (len(parts) == 3 and parts[2] in ("status", "finalize"))
    ):
        namespace, parts = parts[1], parts[2:]
    plural = (parts[0] or None) if parts else None
    name = (parts[1] or None) if len(parts) > 1 else None
    return Route(group, version, namespace, plural, name, "/".join(parts[2:]) or None)


# --- objects and watches ------------------------------------------------------------------------------------


@dataclass(eq=False)
class Watcher:
    group: str
    plural: str
    namespace: str | None
    labels: list
    fields: list
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)

    def passes(self, key: Key, obj: dict | None) -> bool:
        return (
            obj is not None
            and key[:2] == (self.group, self.plural)
            and (self.namespace is None or key[2] == self.namespace)
            and selects(self.labels, obj.get("metadata", {}).get("labels"))
            and fields_match(self.fields, obj)
        )

    def offer(self, key: Key, cur: dict | None, prev: dict | None, rv: int) -> None:
        """The event this watcher sees (cache_watcher.go convertToWatchEvent): an object entering
        its selector is ADDED, one leaving it is DELETED (its previous state at the new
        resourceVersion)."""
        now_in, was_in = self.passes(key, cur), self.passes(key, prev)
        if now_in and cur is not None:
            self.queue.put_nowait(("MODIFIED" if was_in else "ADDED", cur))
        elif was_in and prev is not None:
            gone = json.loads(json.dumps(prev))
            gone["metadata"]["resourceVersion"] = str(rv)
            self.queue.put_nowait(("DELETED", gone))


class Store:
    """Objects by key, one resourceVersion counter for every write (etcd's revision), the recent
    events."""

    def __init__(self) -> None:
        self.objects: dict[Key, dict] = {}
        self.rv = 1
        self.history: deque[tuple[int, Key, dict | None, dict | None]] = deque(maxlen=HISTORY)
        self.watchers: set[Watcher] = set()
        # called on the server's loop with the key of every write, as an informer's event handler
        # is (kube_peer_operator wakes its controllers with it); they must only take note
        self.listeners: list[Callable[[Key], None]] = []

    def put(self, key: Key, obj: dict) -> dict:
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        prev = self.objects.get(key)
        self.objects[key] = obj
        self._emit(key, obj, prev)
        return obj

    def remove(self, key: Key) -> dict:
        self.rv += 1
        prev = self.objects.pop(key)
        self._emit(key, None, prev)
        return prev

    def _emit(self, key: Key, cur: dict | None, prev: dict | None) -> None:
        self.history.append((self.rv, key, cur, prev))
        for w in list(self.watchers):
            w.offer(key, cur, prev, self.rv)
        for listener in list(self.listeners):
            listener(key)

    def by_uid(self, uid: str) -> tuple[Key, dict] | None:
        return next(
            ((k, o) for k, o in self.objects.items() if o["metadata"].get("uid") == uid), None
        )

    def dependents(self, uid: str) -> list[tuple[Key, dict]]:
        return [
            (k, o)
            for k, o in list(self.objects.items())
            if any(ref.get("uid") == uid for ref in o["metadata"].get("ownerReferences") or [])
        ]


def schemas_dir() -> Path:
    """kubernetes-validate's JSON schemas of the Kubernetes OpenAPI, for the version fsdpctl
    targets."""
    import kubernetes_validate

    from fsdpctl.job.validate import KUBERNETES_VERSION

    return (
        Path(kubernetes_validate.__file__).parent
        / "kubernetes-json-schema"
        / f"v{KUBERNETES_VERSION}-local"
    )


class Schemas:
    def __init__(self, registry: Registry):
        self.registry = registry
        self.folder = schemas_dir()
        self.defs = json.loads((self.folder / "_definitions.json").read_text())["$defs"]
        self.builtin: dict[tuple[str, str, str], Schema | None] = {}

    def of(self, res: Served) -> Schema | None:
        if res.custom:
            crd = self.registry.crd_for(res.group, res.plural)
            version = next(
                (
                    v
                    for v in (crd or {}).get("spec", {}).get("versions", [])
                    if v["name"] == res.version
                ),
                None,
            )
            root = ((version or {}).get("schema") or {}).get("openAPIV3Schema")
            return Schema(root, custom=True) if root else None
        key = (res.group, res.version, res.kind)
        if key not in self.builtin:
            prefix = f"-{res.group.split('.')[0]}" if res.group else ""
            f = self.folder / f"{res.kind.lower()}{prefix}-{res.version}.json"
            self.builtin[key] = (
                Schema(json.loads(f.read_text()), self.defs) if f.is_file() else None
            )
        return self.builtin[key]


# --- the API server -----------------------------------------------------------------------------------------


class KubeApi(kmock.KubernetesScaffold):
    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self.registry = Registry(DISCOVERY)
        self.schemas = Schemas(self.registry)
        self.store = Store()
        self.aggregated = (
            True  # serve aggregated discovery (Kubernetes 1.26+); False: only the plain documents
        )
        self.logs: dict[tuple[str, str], str] = PodLogs()
        self.proxies: dict[
            tuple[str, str, int], Callable[[str, str, dict, bytes], tuple[int, bytes]]
        ] = {}
        self.forbidden: set[str] = (
            set()
        )  # plurals this user may not touch (RBAC): 403, as the real API says
        # plurals whose reads get a broken answer, (status, raw body), as an API server restarting
        # behind a load balancer or a proxy in between gives: a 503 page, an empty 200, garbage
        self.broken: dict[str, tuple[int, bytes]] = {}
        # (method, plural) whose next write gets this error (status, reason) without being
        # stored, as an API server failing a create (a 500 from an etcd timeout): one per entry
        self.failing: dict[tuple[str, str], tuple[int, str]] = {}
        self.applied: dict[
            tuple[Key, str], dict
        ] = {}  # (object, field manager) -> its last applied config
        # without a kubelet (kube_peer_operator.Cluster attaches one) the peer plays the kubelet's
        # part of a stop request (kube_peer_kubelet); a real one acts on it with the processes
        self.plays_kubelet = True
        self._gc_scheduled = False
        for name in (*IMMORTAL, "kube-node-lease"):
            self._stamp_new(
                self.registry.find("", "v1", "namespaces"),
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}},
            )

    async def __call__(self, raw: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        """kmock's path parser fails on the bare collection /api/v1/namespaces: that request is
        parsed here, into the same request log."""
        if not NAMESPACES.match(raw.path):
            return await super().__call__(raw)
        body = await raw.read()
        request = kmock.Request(
            id=len(self._requests),
            raw_request=raw,
            url=raw.url,
            method=raw.method,
            params=dict(raw.query),
            headers=dict(raw.headers),
            body=body,
            text=body.decode(errors="replace"),
            data=json.loads(body) if body.strip().startswith(b"{") else None,
        )
        self._requests.append(request)
        return await self._handle(request)

    @property
    def namespaces(self) -> dict[str, dict]:
        return {k[3]: o for k, o in list(self.store.objects.items()) if k[:2] == ("", "namespaces")}

    async def _handle(self, request):
        try:
            return await self._route(request)
        except Reply as r:
            return aiohttp.web.json_response(
                status_body(r.code, r.reason, r.message, r.details), status=r.code
            )

    async def _route(self, request):
        path, method = request.url.path, request.method.value.upper()
        if (
            method == "GET"
            and (doc := self._discovery(path, request.headers.get("Accept", ""))) is not None
        ):
            return doc
        if path == "/version":
            return aiohttp.web.json_response(
                {"major": "1", "minor": "33", "gitVersion": "v1.33.0", "platform": "linux/amd64"}
            )
        route = parse_route(path)
        if route is None:
            return await super()._handle(request)
        if route.plural is None:
            raise Reply(404, "NotFound", "the server could not find the requested resource")
        res = self._served(route, method)
        self._authorize(res, route, method, request)
        if method == "GET" and res.plural in self.broken:
            code, body = self.broken[res.plural]
            return aiohttp.web.Response(status=code, body=body, content_type="application/json")
        if (fail := self.failing.pop((method, res.plural), None)) is not None:
            raise Reply(fail[0], fail[1], f"injected: {method} {res.plural} failed")
        if route.sub:
            return await self._subresource(request, res, route, method)
        return await self._verb(request, res, route, method)

    # --- discovery ------------------------------------------------------------------------------------------

    def _discovery(self, path: str, accept: str) -> aiohttp.web.Response | None:
        """/api, /apis, /apis/G and each group version's APIResourceList; aggregated when asked for."""
        version = accepts_aggregated(accept) if self.aggregated else None
        if path in ("/api", "/apis") and version:
            body = self.registry.aggregated(path == "/api", version)
            ctype = f"application/json;g=apidiscovery.k8s.io;v={version};as=APIGroupDiscoveryList"
            return aiohttp.web.Response(text=json.dumps(body), headers={"Content-Type": ctype})
        if path == "/api":
            return aiohttp.web.json_response(self.registry.api)
        if path == "/apis":
            return aiohttp.web.json_response(self.registry.group_list())
        if m := re.fullmatch(r"/apis/([^/]+)/?", path):
            group = self.registry.group(m.group(1))
            if group is None:
                raise Reply(404, "NotFound", "the server could not find the requested resource")
            return aiohttp.web.json_response(group)
        if m := re.fullmatch(r"/api/(v1)/?|/apis/([^/]+/[^/]+)/?", path):
            doc = self.registry.resource_list(m.group(1) or m.group(2))
            if doc is None:
                raise Reply(404, "NotFound", "the server could not find the requested resource")
            return aiohttp.web.json_response(doc)
        return None

    def _served(self, route: Route, method: str) -> Served:
        """The resource behind a path, and its scope checked as the server's routes check it."""
        res = self.registry.find(route.group, route.version, route.plural or "")
        generic = Reply(404, "NotFound", "the server could not find the requested resource")
        if res is None:
            raise generic
        if route.namespace is not None and not res.namespaced:
            raise generic  # no namespaced route exists for a cluster-scoped kind
        if route.namespace is None and res.namespaced and route.name is not None:
            raise generic  # a namespaced object has no cluster-scoped path
        if route.namespace is None and res.namespaced and method != "GET":
            raise Reply(
                405,
                "MethodNotAllowed",
                "the server does not allow this method on the requested resource",
            )
        return res

    def _authorize(self, res: Served, route: Route, method: str, request) -> None:
        """RBAC's denial as the server words it (apiserver pkg/endpoints/handlers/responsewriters/
        errors.go)."""
        if res.plural not in self.forbidden:
            return
        watch = request.params.get("watch") in ("true", "1")
        verb = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}.get(method)
        verb = verb or ("watch" if watch else "get" if route.name else "list")
        where = (
            f'in the namespace "{route.namespace}"' if route.namespace else "at the cluster scope"
        )
        named = f' "{route.name}"' if route.name else ""
        raise Reply(
            403,
            "Forbidden",
            f'{res.qualified}{named} is forbidden: User "tester" cannot {verb} resource "{res.plural}" '
            f'in API group "{res.group}" {where}',
            {"group": res.group, "kind": res.plural},
        )

    # --- verbs ----------------------------------------------------------------------------------------------

    async def _verb(self, request, res: Served, route: Route, method: str):
        if method == "GET" and route.name is None:
            if request.params.get("watch") in ("true", "1"):
                return await self._watch(request, res, route)
            return self._json(self._list(request, res, route))
        if method == "GET":
            return self._json(self._typed(res, self._existing(res, route)))
        if method == "POST" and route.name is None:
            obj, warnings = self._create(request, res, route, _body(request))
            return self._json(self._typed(res, obj), 201, warnings)
        if method == "PUT" and route.name:
            return self._json(*self._update(request, res, route, _body(request)))
        if method == "PATCH" and route.name:
            obj, code, warnings = self._patch(request, res, route)
            return self._json(self._typed(res, obj), code, warnings)
        if method == "DELETE":
            return self._json(*self._delete_request(request, res, route))
        raise Reply(
            405,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource",
        )

    def _json(self, body: dict, code: int = 200, warnings: list[str] | None = None):
        # RFC 7234 warn-text: a quoted string, its quotes and backslashes escaped
        quoted = [w.replace("\\", "\\\\").replace('"', '\\"') for w in warnings or []]
        headers = CIMultiDict(("Warning", f'299 - "{w}"') for w in quoted)
        return aiohttp.web.json_response(body, status=code, headers=headers)

    def _key(self, res: Served, namespace: str | None, name: str) -> Key:
        return (res.group, res.plural, namespace or "" if res.namespaced else "", name)

    def _existing(self, res: Served, route: Route) -> dict:
        obj = self.store.objects.get(self._key(res, route.namespace, route.name or ""))
        if obj is None:
            raise not_found(res, route.name or "")
        return obj

    def _typed(self, res: Served, obj: dict) -> dict:
        """The object at the version it was asked at (no conversion: the kinds here share one
        schema)."""
        return {**obj, "apiVersion": res.group_version, "kind": res.kind}

    def _list(self, request, res: Served, route: Route) -> dict:
        labels, fields = self._selectors(request, res)
        items = [
            self._typed(res, o)
            for k, o in sorted(self.store.objects.items())
            if k[:2] == (res.group, res.plural)
            and (route.namespace is None or k[2] == route.namespace)
            and selects(labels, o["metadata"].get("labels"))
            and fields_match(fields, o)
        ]
        if (
            not res.custom
        ):  # typed lists carry no TypeMeta on their items (kubernetes/kubernetes#3030)
            items = [{k: v for k, v in o.items() if k not in ("apiVersion", "kind")} for o in items]
        meta = {"resourceVersion": str(self.store.rv)}
        return {
            "kind": f"{res.kind}List",
            "apiVersion": res.group_version,
            "metadata": meta,
            "items": items,
        }

    def _selectors(self, request, res: Served) -> tuple[list, list]:
        try:
            labels = parse_labels(request.params.get("labelSelector", ""))
            fields = parse_fields(request.params.get("fieldSelector", ""), res.group, res.plural)
        except SelectorError as e:
            raise Reply(400, "BadRequest", str(e)) from e
        return labels, fields

    async def _watch(self, request, res: Served, route: Route):
        """Existing objects as ADDED (or the events after ?resourceVersion=N), then changes as they
        happen, until ?timeoutSeconds."""
        labels, fields = self._selectors(request, res)
        watcher = Watcher(res.group, res.plural, route.namespace, labels, fields)
        first = self._replay(watcher, request.params.get("resourceVersion", ""))
        self.store.watchers.add(watcher)
        resp = aiohttp.web.StreamResponse(headers={"Content-Type": "application/json"})
        await resp.prepare(request._raw_request)
        deadline = time.monotonic() + float(request.params.get("timeoutSeconds") or 1800)
        try:
            for event in first:
                await resp.write(self._event(res, *event))
            while (left := deadline - time.monotonic()) > 0:
                try:
                    event = await asyncio.wait_for(watcher.queue.get(), left)
                except TimeoutError:
                    break
                await resp.write(self._event(res, *event))
            await resp.write_eof()
        except ConnectionError:
            pass
        finally:
            self.store.watchers.discard(watcher)
        return resp

    def _event(self, res: Served, kind: str, obj: dict) -> bytes:
        return json.dumps({"type": kind, "object": self._typed(res, obj)}).encode() + b"\n"

    def _replay(self, watcher: Watcher, rv: str) -> list[tuple[str, dict]]:
        if rv in ("", "0"):
            return [
                ("ADDED", o) for k, o in sorted(self.store.objects.items()) if watcher.passes(k, o)
            ]
        oldest = self.store.history[0][0] if self.store.history else self.store.rv
        if int(rv) < oldest - 1:
            raise Reply(410, "Expired", f"too old resource version: {rv} ({oldest})")
        probe = Watcher(
            watcher.group, watcher.plural, watcher.namespace, watcher.labels, watcher.fields
        )
        for at, key, cur, prev in self.store.history:
            if at > int(rv):
                probe.offer(key, cur, prev, at)
        return [probe.queue.get_nowait() for _ in range(probe.queue.qsize())]

    # --- writes ---------------------------------------------------------------------------------------------

    def _create(self, request, res: Served, route: Route, obj: dict) -> tuple[dict, list[str]]:
        self._check_type(res, obj)
        meta = obj.setdefault("metadata", {})
        if res.namespaced:
            if meta.get("namespace") and route.namespace and meta["namespace"] != route.namespace:
                raise Reply(
                    400,
                    "BadRequest",
                    "the namespace of the provided object does not match the namespace sent on the request",
                )
            meta["namespace"] = route.namespace
        else:
            meta.pop("namespace", None)
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + "".join(
                random.choices("bcdfghjklmnpqrstvwxz2456789", k=5)
            )
        if not meta.get("name"):
            raise Reply(
                422,
                "Invalid",
                f'{res.qualified_kind} "" is invalid: metadata.name: Required value: name or generateName '
                "is required",
            )
        self._lifecycle(res, route.namespace, meta["name"])
        stored, warnings = self._admit(request, res, obj, mode="create")
        self._check_names(res, stored)
        key = self._key(res, route.namespace, meta["name"])
        if key in self.store.objects:
            raise Reply(
                409,
                "AlreadyExists",
                f'{res.qualified} "{meta["name"]}" already exists',
                {"name": meta["name"], "group": res.group, "kind": res.plural},
            )
        stored = self._stamp_new(res, stored, dry=_dry(request))
        return stored, warnings

    def _stamp_new(self, res: Served | None, obj: dict, dry: bool = False) -> dict:
        """What the server sets on create: uid, creationTimestamp, generation, the status it starts
        from."""
        assert res is not None
        meta = obj["metadata"]
        meta.update(uid=str(uuid.uuid4()), creationTimestamp=now(), generation=1)
        for field_name in (
            "resourceVersion",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "managedFields",
        ):
            meta.pop(field_name, None)
        if "status" in res.subresources or res.plural == "namespaces":
            obj["status"] = _initial_status(res, obj)
        if res.plural == "namespaces":
            obj.setdefault("spec", {})["finalizers"] = ["kubernetes"]
        if res.plural == "customresourcedefinitions":
            meta["finalizers"] = sorted(
                {*meta.get("finalizers", []), "customresourcecleanup.apiextensions.k8s.io"}
            )
        if (res.group, res.plural) == ("batch", "jobs") and not obj.get("spec", {}).get(
            "manualSelector"
        ):
            _generate_selector(obj)
        key = self._key(res, meta.get("namespace"), meta["name"])
        if dry:
            return obj
        stored = self.store.put(key, obj)
        self._after_write(res, stored)
        if meta.get("ownerReferences"):
            self._schedule_gc()
        return stored

    def _after_write(self, res: Served, obj: dict) -> None:
        if res.plural == "customresourcedefinitions" and res.group == "apiextensions.k8s.io":
            self.registry.crds[obj["metadata"]["name"]] = obj  # established at once
        if (
            res.plural == "pods"
            and res.group == ""
            and self.plays_kubelet
            and kubelet.stop_requested(obj)
        ):
            asyncio.get_running_loop().call_later(0.1, self._pod_stops, obj["metadata"]["namespace"],
                                                  obj["metadata"]["name"])  # fmt: skip

    def _pod_stops(self, namespace: str, name: str) -> None:
        """The kubelet's part of `fsdpctl job stop`, later, as a sync of the pod would do it
        (kube_peer_kubelet): the annotation reaches the trainer through its downward API file, the
        trainer saves and ends, and the kubelet reports the container's exit code."""
        key = ("", "pods", namespace, name)
        pod = self.store.objects.get(key)
        if pod is not None and kubelet.stop_requested(pod):
            self.store.put(key, kubelet.after_stop_request(pod))

    def _lifecycle(self, res: Served, namespace: str | None, name: str) -> None:
        """NamespaceLifecycle admission on create: the namespace must exist and not be terminating
        (the refusal in admission.NewForbidden's words)."""
        if not res.namespaced or namespace is None:
            return
        ns = self.store.objects.get(("", "namespaces", "", namespace))
        if ns is None:
            raise Reply(
                404,
                "NotFound",
                f'namespaces "{namespace}" not found',
                {"name": namespace, "kind": "namespaces"},
            )
        if ns.get("status", {}).get("phase") == "Terminating":
            raise Reply(
                403,
                "Forbidden",
                f'{res.qualified} "{name}" is forbidden: unable to create new content in namespace '
                f"{namespace} because it is being terminated",
            )

    def _check_type(self, res: Served, obj: dict) -> None:
        if obj.get("apiVersion") not in (None, res.group_version):
            raise Reply(
                400,
                "BadRequest",
                f"the API version in the data ({obj['apiVersion']}) does not match the expected API "
                f"version ({res.group_version})",
            )
        if obj.get("kind") not in (None, res.kind):
            raise Reply(
                400,
                "BadRequest",
                f"the kind in the data ({obj['kind']}) does not match the expected kind ({res.kind})",
            )

    def _check_names(self, res: Served, obj: dict) -> None:
        errors = name_errors(res.plural, res.group, obj["metadata"]["name"])
        if errors:
            raise _invalid(res, obj["metadata"]["name"], [tuple(e.split(": ", 1)) for e in errors])

    def _admit(
        self, request, res: Served, obj: dict, mode: str, applied: dict | None = None
    ) -> tuple[dict, list[str]]:
        """Field validation (fieldValidation=Ignore|Warn|Strict, Warn by default) and the schema's
        value checks. The object comes back as stored: unknown fields dropped, custom resources
        pruned."""
        schema = self.schemas.of(res)
        if schema is None:
            return _converted(res, obj), []
        if mode == "apply" and applied is not None:
            unknown = schema.check(applied).unknown
            # the typed patch conversion of server-side apply fails whatever fieldValidation says
            if unknown:
                gvk = f"{res.group}/{res.version}, Kind={res.kind}"
                where = (
                    f"{applied['metadata'].get('namespace', '')}/{applied['metadata'].get('name')}"
                )
                raise Reply(
                    500,
                    "",
                    f"failed to create typed patch object ({where}; {gvk}): .{unknown[0]}: field not "
                    "declared in schema",
                )
        checked = schema.check(obj)
        directive = request.params.get("fieldValidation", "Warn")
        warnings = [f'unknown field "{u}"' for u in checked.unknown]
        if checked.unknown and directive == "Strict" and mode != "apply":
            raise Reply(
                400,
                "BadRequest",
                f'{res.kind} in version "{res.version}" cannot be handled as a {res.kind}: strict decoding '
                f"error: {', '.join(warnings)}",
            )
        self._check_values(res, obj, checked.invalid)
        return _converted(res, checked.value), warnings if directive == "Warn" else []

    def _check_values(self, res: Served, obj: dict, invalid: list[tuple[str, str]]) -> None:
        if not invalid:
            return
        name = obj.get("metadata", {}).get("name", "")
        decoding = [m for _, m in invalid if m.startswith("json: ")]
        if decoding and not res.custom:
            raise Reply(
                400,
                "BadRequest",
                f'{res.kind} in version "{res.version}" cannot be handled as a {res.kind}: {decoding[0]}',
            )
        raise _invalid(res, name, invalid)

    def _update(
        self, request, res: Served, route: Route, obj: dict, status_only: bool = False
    ) -> tuple[dict, int, list[str]]:
        """PUT: optimistic concurrency on metadata.resourceVersion, the status kept (or only it
        changed)."""
        old = self._existing(res, route)
        self._check_type(res, obj)
        _precondition(res, old, obj.get("metadata", {}).get("resourceVersion"))
        new = self._merge_status(res, old, obj, status_only)
        stored, warnings = self._admit(request, res, new, mode="update")
        return self._typed(res, self._replace(request, res, old, stored)), 200, warnings

    def _merge_status(self, res: Served, old: dict, new: dict, status_only: bool) -> dict:
        if status_only:
            return {**json.loads(json.dumps(old)), "status": new.get("status", {})}
        merged = {**new, "metadata": {**new.get("metadata", {})}}
        if "status" in res.subresources:
            merged.pop("status", None)
            if "status" in old:
                merged["status"] = old["status"]
        for system in (
            "uid",
            "creationTimestamp",
            "generation",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
        ):
            if system in old["metadata"]:
                merged["metadata"][system] = old["metadata"][system]
        if old["metadata"].get("namespace"):
            merged["metadata"]["namespace"] = old["metadata"]["namespace"]
        return merged

    def _replace(self, request, res: Served, old: dict, new: dict) -> dict:
        """Store an update: generation follows spec changes; an object being deleted whose last
        finalizer went is removed."""
        spec_changed = {k: v for k, v in old.items() if k not in ("metadata", "status")} != {
            k: v for k, v in new.items() if k not in ("metadata", "status")
        }
        new["metadata"]["generation"] = old["metadata"].get("generation", 1) + (
            1 if spec_changed else 0
        )
        if _dry(request):
            return new
        key = self._key(res, new["metadata"].get("namespace"), new["metadata"]["name"])
        # an update that leaves an object being deleted without finalizers deletes it, unless it is
        # in a grace period (a pod its kubelet is ending): apiserver pkg/registry/generic/registry/
        # store.go, ShouldDeleteDuringUpdate
        grace = old["metadata"].get("deletionGracePeriodSeconds")
        if (
            old["metadata"].get("deletionTimestamp")
            and not new["metadata"].get("finalizers")
            and not grace
        ):
            self.store.remove(key)
            self._schedule_gc()
            return new
        stored = self.store.put(key, new)
        self._after_write(res, stored)
        self._schedule_gc()
        return stored

    def _patch(
        self, request, res: Served, route: Route, status_only: bool = False
    ) -> tuple[dict, int, list[str]]:
        ctype = request.headers.get("Content-Type", "").split(";")[0].strip()
        if ctype == "application/apply-patch+yaml":
            return self._apply(request, res, route, status_only)
        if ctype == "application/strategic-merge-patch+json" and res.custom:
            raise Reply(
                415,
                "UnsupportedMediaType",
                "the body of the request was in an unknown format - accepted media types include: "
                "application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml",
            )
        if ctype not in ("application/merge-patch+json", "application/strategic-merge-patch+json"):
            raise Reply(
                415,
                "UnsupportedMediaType",
                f"{ctype}: not implemented by this test peer (kube_peer.py)",
            )
        patch = _body(request)
        old = self._existing(res, route)
        _precondition(res, old, (patch.get("metadata") or {}).get("resourceVersion"))
        new = self._merge_status(res, old, merge_patch(old, patch), status_only)
        stored, warnings = self._admit(request, res, new, mode="patch")
        return self._replace(request, res, old, stored), 200, warnings

    def _apply(
        self, request, res: Served, route: Route, status_only: bool
    ) -> tuple[dict, int, list[str]]:
        """Server-side apply: creates a missing object; else sets the fields applied and removes
        those this field manager applied before and applies no more. Lists are replaced whole (no
        per-field ownership, no conflicts between managers)."""
        manager = request.params.get("fieldManager")
        if not manager:
            raise Reply(
                400,
                "BadRequest",
                "PATCH requests with an apply patch type (application/apply-patch+yaml) must have a "
                "fieldManager",
            )
        patch = _body(request)
        self._check_type(res, patch)
        if (patch.get("metadata") or {}).get("name") != route.name:
            raise Reply(
                400,
                "BadRequest",
                f"the name of the object ({(patch.get('metadata') or {}).get('name')}) does not match the "
                f"name on the URL ({route.name})",
            )
        key = self._key(res, route.namespace, route.name or "")
        old = self.store.objects.get(key)
        if old is None:
            self._admit(request, res, json.loads(json.dumps(patch)), mode="apply", applied=patch)
            obj, warnings = self._create(request, res, route, json.loads(json.dumps(patch)))
            self._remember_applied(request, key, manager, patch)
            return obj, 201, warnings
        _precondition(res, old, (patch.get("metadata") or {}).get("resourceVersion"))
        base = _without(old, _paths(self.applied.get((key, manager), {})) - _paths(patch))
        new = self._merge_status(res, old, _apply_merge(base, patch), status_only)
        stored, warnings = self._admit(request, res, new, mode="apply", applied=patch)
        self._remember_applied(request, key, manager, patch)
        return self._replace(request, res, old, stored), 200, warnings

    def _remember_applied(self, request, key: Key, manager: str, patch: dict) -> None:
        if not _dry(request):
            self.applied[(key, manager)] = patch

    async def _subresource(self, request, res: Served, route: Route, method: str):
        top = route.sub.split("/", 1)[0] if route.sub else ""
        if top not in res.subresources:
            raise Reply(404, "NotFound", "the server could not find the requested resource")
        if (res.group, res.plural, top) == ("", "pods", "log") and method == "GET":
            return await self._log(request, route)
        if (res.group, res.plural, top) == ("", "services", "proxy"):
            return await self._proxy(request, route)
        if (res.group, res.plural, top) == ("", "pods", "eviction") and method == "POST":
            return self._evict(request, res, route)
        if (res.group, res.plural, top) == ("", "pods", "binding") and method == "POST":
            return self._bind(request, res, route)
        if top == "status" and method == "GET":
            return self._json(self._typed(res, self._existing(res, route)))
        if top == "status" and method == "PUT":
            return self._json(*self._update(request, res, route, _body(request), status_only=True))
        if top == "status" and method == "PATCH":
            obj, code, warnings = self._patch(request, res, route, status_only=True)
            return self._json(self._typed(res, obj), code, warnings)
        raise Reply(
            405, "MethodNotAllowed", f"{method} {route.sub}: not implemented by this test peer"
        )

    def _bind(self, request, res: Served, route: Route):
        """POST pods/NAME/binding (a scheduler's Binding): the pod gets its node and the
        PodScheduled condition; a pod that has one already, or is being deleted, is a 409
        (pkg/registry/core/pod/storage/storage.go, BindingREST.Create and assignPod)."""
        body = _body(request)
        pod = json.loads(json.dumps(self._existing(res, route)))
        node = ((body.get("target") or {}).get("name")) or ""
        name = pod["metadata"]["name"]
        if not node:
            raise _invalid(res, name, [("target.name", "Required value")])
        if pod["metadata"].get("deletionTimestamp"):
            raise Reply(409, "Conflict", f'Operation cannot be fulfilled on pods/binding "{name}": '
                        "pod is being deleted, cannot be assigned to a host")  # fmt: skip
        if pod.get("spec", {}).get("nodeName"):
            raise Reply(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on pods/binding "{name}": pod {name} is already '
                f'assigned to node "{pod["spec"]["nodeName"]}"',
            )
        pod["spec"]["nodeName"] = node
        status = pod.setdefault("status", {})
        conditions = [c for c in status.get("conditions") or [] if c.get("type") != "PodScheduled"]
        status["conditions"] = [
            *conditions,
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": now()},
        ]
        if not _dry(request):
            self.store.put(self._key(res, route.namespace, name), pod)
        return self._json(status_body(201, "", ""), 201)

    def _evict(self, request, res: Served, route: Route):
        """POST pods/NAME/eviction (policy/v1 Eviction): the disruption rules of
        kube_peer_disruption decide; an evicted pod gets the DisruptionTarget condition and is
        deleted as a DELETE of it would be (its grace period, the Eviction's deleteOptions)."""
        body = _body(request)
        pod = self._existing(res, route)
        namespace = route.namespace or ""
        budgets = [
            o
            for k, o in self.store.objects.items()
            if k[:3] == ("policy", "poddisruptionbudgets", namespace)
        ]
        pods = [o for k, o in self.store.objects.items() if k[:3] == ("", "pods", namespace)]
        refusal = disruption.eviction(pod, budgets, pods)
        if refusal is not None:
            raise Reply(
                refusal.code, refusal.reason, refusal.message, {"causes": list(refusal.causes)}
            )
        options = body.get("deleteOptions") or {}
        dry = _dry(request) or options.get("dryRun") in ("All", ["All"])
        key = self._key(res, route.namespace, route.name or "")
        if not dry and not disruption.can_ignore_budgets(pod):
            self.store.put(key, disruption.evicted(json.loads(json.dumps(pod))))
        self._delete(key, options, dry)
        return self._json(status_body(201, "", ""), 201)

    # --- deletion and garbage collection --------------------------------------------------------------------

    def _delete_request(self, request, res: Served, route: Route) -> tuple[dict, int, list[str]]:
        options = {**(request.data if isinstance(request.data, dict) else {}), **request.params}
        dry = _dry(request) or options.get("dryRun") in ("All", ["All"])
        if route.name is None:  # deletecollection
            labels, fields = self._selectors(request, res)
            for k, o in sorted(self.store.objects.items()):
                if (
                    k[:2] == (res.group, res.plural)
                    and k[2] == (route.namespace or "")
                    and selects(labels, o["metadata"].get("labels"))
                    and fields_match(fields, o)
                ):
                    self._delete(k, options, dry)
            return status_body(200, "", ""), 200, []
        old = self._existing(res, route)
        pre = options.get("preconditions") or {}
        if pre.get("uid") and pre["uid"] != old["metadata"]["uid"]:
            raise Reply(
                409,
                "Conflict",
                f"Precondition failed: UID in precondition: {pre['uid']}, UID in object meta: "
                f"{old['metadata']['uid']}",
            )
        _precondition(res, old, pre.get("resourceVersion"))
        if res.plural == "namespaces":
            self._namespace_delete(old)
        warnings = []
        if (res.group, res.plural) == ("batch", "jobs") and not options.get("propagationPolicy"):
            warnings.append(
                "child pods are preserved by default when jobs are deleted; set "
                "propagationPolicy=Background to remove them or set propagationPolicy=Orphan to suppress "
                "this warning"
            )
        key = self._key(res, route.namespace, route.name or "")
        gone, obj = self._delete(key, options, dry)
        if gone and not (
            res.custom or res.plural == "pods"
        ):  # generic registry: ReturnDeletedObject false
            details = {
                "name": route.name,
                "group": res.group,
                "kind": res.plural,
                "uid": obj["metadata"]["uid"],
            }
            return {**status_body(200, "", ""), "details": details}, 200, warnings
        return self._typed(res, obj), 200, warnings

    def _namespace_delete(self, ns: dict) -> None:
        name = ns["metadata"]["name"]
        if name in IMMORTAL:
            raise Reply(
                403,
                "Forbidden",
                f'namespaces "{name}" is forbidden: this namespace may not be deleted',
            )
        if ns["metadata"].get("deletionTimestamp"):
            raise Reply(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on namespaces "{name}": The system is ensuring all content '
                "is removed from this namespace.  Upon completion, this namespace will automatically be "
                "purged by the system.",
            )

    def _delete(self, key: Key, options: dict, dry: bool) -> tuple[bool, dict]:
        """One deletion (generic registry store.go Delete): a scheduled pod first gets its grace
        period; the propagation policy becomes a finalizer (foregroundDeletion, orphan) the garbage
        collector works off; an object with finalizers is only marked; anything else goes now."""
        obj = json.loads(json.dumps(self.store.objects[key]))
        meta = obj["metadata"]
        policy = options.get("propagationPolicy") or _default_policy(key, options)
        if key[:2] == ("", "pods") and self._graceful(obj, options):
            return False, obj if dry else self.store.put(key, obj)
        fin = list(meta.get("finalizers") or [])
        fin += [
            f
            for f in {"Foreground": ["foregroundDeletion"], "Orphan": ["orphan"]}.get(policy, [])
            if f not in fin
        ]
        if key[:2] == ("", "namespaces"):
            obj["status"] = {**obj.get("status", {}), "phase": "Terminating"}
        if fin or key[:2] == ("", "namespaces"):
            meta["finalizers"] = fin
            meta.setdefault("deletionTimestamp", now())
            meta.setdefault("deletionGracePeriodSeconds", 0)
            if not fin:
                meta.pop("finalizers")
            stored = obj if dry else self.store.put(key, obj)
            self._schedule_gc()
            return False, stored
        if not dry:
            self.store.remove(key)
            self._schedule_gc()
        return True, obj

    def _graceful(self, pod: dict, options: dict) -> bool:
        """A pod on a node is only marked, with its grace period, for the kubelet to end and then
        delete with grace 0; an unscheduled or finished pod goes at once
        (pkg/registry/core/pod/strategy.go)."""
        grace = options.get("gracePeriodSeconds")
        grace = (
            int(grace)
            if grace not in (None, "")
            else pod.get("spec", {}).get("terminationGracePeriodSeconds", 30)
        )
        if not pod.get("spec", {}).get("nodeName") or pod.get("status", {}).get("phase") in (
            "Succeeded",
            "Failed",
        ):
            grace = 0
        if grace <= 0:
            if pod["metadata"].get("deletionTimestamp"):  # the kubelet's final delete, grace 0
                pod["metadata"]["deletionGracePeriodSeconds"] = 0
            return False
        # a pod already being deleted keeps its deadline unless this one is shorter
        # (apiserver pkg/registry/rest/delete.go, BeforeDelete: only a shorter grace period is taken)
        current = pod["metadata"].get("deletionGracePeriodSeconds")
        if pod["metadata"].get("deletionTimestamp") and current is not None and current <= grace:
            return True
        pod["metadata"]["deletionTimestamp"] = now(grace)
        pod["metadata"]["deletionGracePeriodSeconds"] = grace
        return True

    def _schedule_gc(self) -> None:
        if not self._gc_scheduled:
            self._gc_scheduled = True
            asyncio.get_running_loop().call_soon(self._collect)

    def _collect(self) -> None:
        """The garbage collector, the namespace controller and the CRD finalizer, run until nothing
        changes: after the answer to the request that asked for a deletion, as the controllers act
        after it."""
        self._gc_scheduled = False
        before = None
        while before != self.store.rv:
            before = self.store.rv
            for key, obj in list(self.store.objects.items()):
                if self.store.objects.get(key) is obj:
                    self._collect_one(key, obj)

    def _collect_one(self, key: Key, obj: dict) -> None:
        meta = obj["metadata"]
        if not meta.get("deletionTimestamp"):
            self._orphaned(key, obj)
            return
        fin = list(meta.get("finalizers") or [])
        if "foregroundDeletion" in fin and not self._blocking(meta["uid"]):
            fin.remove("foregroundDeletion")
        if "orphan" in fin:
            self._orphan_dependents(meta["uid"])
            fin.remove("orphan")
        if "customresourcecleanup.apiextensions.k8s.io" in fin:
            self._drop_custom_objects(obj)
            fin.remove("customresourcecleanup.apiextensions.k8s.io")
        if (
            key[:2] == ("", "namespaces")
            and obj.get("spec", {}).get("finalizers")
            and not self._empty_namespace(key[3])
        ):
            return
        if fin:
            if fin != list(meta.get("finalizers") or []):
                self.store.put(key, {**obj, "metadata": {**meta, "finalizers": fin}})
            return
        if meta.get("deletionGracePeriodSeconds"):
            # a pod in its grace period: the kubelet deletes it (with grace 0) once it has ended
            return
        self.store.remove(key)
        if key[:2] == ("apiextensions.k8s.io", "customresourcedefinitions"):
            self.registry.crds.pop(key[3], None)

    def _blocking(self, uid: str) -> bool:
        """Foreground deletion: the owner's dependents are deleted (in the foreground themselves
        when they own objects); the owner waits for those with blockOwnerDeletion."""
        waiting = False
        for key, dep in self.store.dependents(uid):
            if not dep["metadata"].get("deletionTimestamp"):
                policy = (
                    "Foreground" if self.store.dependents(dep["metadata"]["uid"]) else "Background"
                )
                self._delete(key, {"propagationPolicy": policy}, False)
            ref = next(r for r in dep["metadata"]["ownerReferences"] if r.get("uid") == uid)
            waiting |= bool(ref.get("blockOwnerDeletion")) and key in self.store.objects
        return waiting

    def _orphan_dependents(self, uid: str) -> None:
        for key, dep in self.store.dependents(uid):
            refs = [r for r in dep["metadata"]["ownerReferences"] if r.get("uid") != uid]
            self.store.put(key, {**dep, "metadata": {**dep["metadata"], "ownerReferences": refs}})

    def _orphaned(self, key: Key, obj: dict) -> None:
        """Background collection: an object whose owners are all gone (by uid) is deleted; dangling
        references beside a live owner are removed."""
        refs = obj["metadata"].get("ownerReferences") or []
        live = [r for r in refs if self.store.by_uid(r.get("uid", "")) is not None]
        if refs and not live:
            self._delete(key, {"propagationPolicy": "Background"}, False)
        elif len(live) < len(refs):
            self.store.put(key, {**obj, "metadata": {**obj["metadata"], "ownerReferences": live}})

    def _empty_namespace(self, name: str) -> bool:
        """The namespace controller: everything in a terminating namespace is deleted; True once
        empty."""
        inside = [k for k in list(self.store.objects) if k[2] == name]
        for key in inside:
            if not self.store.objects[key]["metadata"].get("deletionTimestamp"):
                self._delete(key, {}, False)
        return not any(k[2] == name for k in self.store.objects)

    def _drop_custom_objects(self, crd: dict) -> None:
        group, plural = crd["spec"]["group"], crd["spec"]["names"]["plural"]
        for key in [k for k in self.store.objects if k[:2] == (group, plural)]:
            self.store.remove(key)

    # --- what a kubelet and services would answer -----------------------------------------------------------

    async def _log(self, request, route: Route):
        """The pod's log text from `logs`, with the container checks of
        pkg/registry/core/pod/strategy.go (LogLocation): a pod of several containers needs
        ?container=, which must be one of them."""
        pod = self.store.objects.get(("", "pods", route.namespace or "", route.name or ""))
        if pod is None:
            raise Reply(404, "NotFound", f'pods "{route.name}" not found')
        names = [c["name"] for c in pod.get("spec", {}).get("containers", [])]
        container = request.params.get("container")
        if not container and len(names) > 1:
            raise Reply(
                400,
                "BadRequest",
                f"a container name must be specified for pod {route.name}, choose one of: "
                f"[{' '.join(names)}]",
            )
        if container and container not in names:
            raise Reply(
                400, "BadRequest", f"container {container} is not valid for pod {route.name}"
            )
        # a container's own log when a kubelet keeps one per container, else the pod's
        key = (route.namespace or "", route.name or "")
        own = (*key, container or names[0]) if names else key
        text = _kubelet_log(self.logs.lines(own if own in self.logs else key), request.params)
        if request.params.get("follow") != "true":
            return aiohttp.web.Response(text=text, content_type="text/plain")
        resp = aiohttp.web.StreamResponse(headers={"Content-Type": "text/plain"})
        await resp.prepare(request._raw_request)
        for line in text.splitlines(keepends=True):  # a line at a time, as a kubelet streams it
            await resp.write(line.encode())
            await asyncio.sleep(0.01)
        await resp.write_eof()
        return resp

    async def _proxy(self, request, route: Route):
        """A registered handler plays the Service's endpoints; without one, a missing Service is 404
        and one without endpoints 503, as the API server's proxy answers."""
        service, _, port = (route.name or "").partition(":")
        handler = self.proxies.get((route.namespace or "", service, int(port or 0)))
        if handler is None:
            if ("", "services", route.namespace or "", service) not in self.store.objects:
                raise Reply(404, "NotFound", f'services "{service}" not found')
            raise Reply(
                503, "ServiceUnavailable", f'no endpoints available for service "{service}"'
            )
        rest = "/" + (route.sub or "").partition("/")[2]
        code, body = handler(request.method.value.upper(), rest, dict(request.params), request.body)
        return aiohttp.web.Response(status=code, body=body, content_type="application/json")


# --- helpers ------------------------------------------------------------------------------------------------

# a line of a container's log file as the runtime writes it (CRI log format: containerd
# pkg/cri/io/logger.go)
_CRI_LINE = re.compile(r"(\S+) (stdout|stderr) ([A-Z:]+) ?(.*)")


def _rfc3339_parse(text: str) -> float:
    head, _, frac = text.rstrip("Z").partition(".")
    whole = datetime.fromisoformat(head + "+00:00").timestamp()
    return whole + (int(frac) / 10 ** len(frac) if frac else 0.0)


class PodLogs(dict):
    """The kubelet's side of pod logs: the text a test stores for (namespace, pod) is the
    container's log. A line in the CRI log format keeps its own time (as the kubelet reads the
    runtime's file); any other line is stamped with the time it was stored, as the runtime stamps
    each line when it reads it."""

    def __init__(self) -> None:
        super().__init__()
        self.stored_at: dict[tuple[str, str], float] = {}

    def __setitem__(self, key, value) -> None:
        super().__setitem__(key, value)
        self.stored_at[key] = time.time()

    def lines(self, key) -> list[tuple[float, str]]:
        out = []
        for raw in self.get(key, "").splitlines():
            m = _CRI_LINE.fullmatch(raw)
            try:
                out.append(
                    (_rfc3339_parse(m.group(1)), m.group(4)) if m else (self.stored_at[key], raw)
                )
            except ValueError:
                out.append((self.stored_at[key], raw))
        return out


def _kubelet_log(lines: list[tuple[float, str]], params) -> str:
    """PodLogOptions as the kubelet applies them (pkg/kubelet/kuberuntime/logs/logs.go, ReadLogs and
    NewLogOptions): the last tailLines lines, then those at or after now - sinceSeconds or sinceTime
    (the later), each after its time in RFC3339NanoFixed and a space with timestamps=true."""
    if params.get("tailLines") is not None:
        n = int(params["tailLines"])
        lines = lines[-n:] if n > 0 else []
    since = 0.0
    if params.get("sinceSeconds"):
        since = time.time() - int(params["sinceSeconds"])
    if params.get("sinceTime"):
        since = max(since, _rfc3339_parse(params["sinceTime"]))
    stamp = params.get("timestamps") == "true"
    return "".join(
        (_rfc3339_fixed(t) + " " if stamp else "") + text + "\n" for t, text in lines if t >= since
    )


def _rfc3339_fixed(t: float) -> str:
    """Go's types.RFC3339NanoFixed in UTC: nine fraction digits, "Z"."""
    whole = int(t)
    nanos = min(round((t - whole) * 1e9), 999_999_999)
    return datetime.fromtimestamp(whole, UTC).strftime("%Y-%m-%dT%H:%M:%S") + f".{nanos:09d}Z"


def _body(request) -> dict:
    text = request.body.decode() if request.body else "{}"
    try:
        data = json.loads(text)
    except ValueError:
        data = yaml.safe_load(text)
    if not isinstance(data, dict):
        raise Reply(400, "BadRequest", "the body of the request is not an object")
    return data


def _dry(request) -> bool:
    return request.params.get("dryRun") == "All"


def _precondition(res: Served, old: dict, rv: str | None) -> None:
    """Optimistic concurrency (API concepts, "Resource versions"): a write naming a resourceVersion
    that is not the current one is a 409 Conflict."""
    if rv and rv != old["metadata"].get("resourceVersion"):
        name = old["metadata"]["name"]
        raise Reply(
            409,
            "Conflict",
            f'Operation cannot be fulfilled on {res.qualified} "{name}": the object has been modified; '
            "please apply your changes to the latest version and try again",
            {"name": name, "group": res.group, "kind": res.plural},
        )


def _invalid(res: Served, name: str, causes: list) -> Reply:
    """422 Invalid in the words of apimachinery pkg/api/errors NewInvalid."""
    text = [f"{path}: {message}" for path, message in causes]
    joined = text[0] if len(text) == 1 else "[" + ", ".join(text) + "]"
    details = {
        "name": name,
        "group": res.group,
        "kind": res.kind,
        "causes": [{"field": p, "message": m} for p, m in causes],
    }
    return Reply(422, "Invalid", f'{res.qualified_kind} "{name}" is invalid: {joined}', details)


def _converted(res: Served, obj: dict) -> dict:
    """What the API server stores of a Secret: its stringData merged into data, base64-encoded,
    and never kept (pkg/apis/core/v1/conversion.go, Convert_v1_Secret_To_core_Secret: "StringData
    overwrites Data")."""
    if (res.group, res.plural) != ("", "secrets") or "stringData" not in obj:
        return obj
    import base64

    data = dict(obj.get("data") or {})
    for key, value in (obj.get("stringData") or {}).items():
        data[key] = base64.b64encode(str(value).encode()).decode()
    return {**{k: v for k, v in obj.items() if k != "stringData"}, "data": data}


# the labels a Job's pods are selected by, set by the API server when the Job is created without a
# manual selector (pkg/registry/batch/job/strategy.go, generateSelector: the legacy unprefixed
# labels and the batch.kubernetes.io/ ones; the selector is the controller uid's)
JOB_NAME_LABELS = ("job-name", "batch.kubernetes.io/job-name")
JOB_UID_LABELS = ("controller-uid", "batch.kubernetes.io/controller-uid")


def _generate_selector(job: dict) -> None:
    meta = job["metadata"]
    template = job.setdefault("spec", {}).setdefault("template", {})
    labels = template.setdefault("metadata", {}).setdefault("labels", {})
    for key in JOB_NAME_LABELS:
        labels.setdefault(key, meta["name"])
    for key in JOB_UID_LABELS:
        labels.setdefault(key, meta["uid"])
    selector = job["spec"].setdefault("selector", {})
    selector.setdefault("matchLabels", {}).setdefault(JOB_UID_LABELS[1], meta["uid"])


def _default_policy(key: Key, options: dict) -> str:
    """Without a propagationPolicy: orphanDependents if given, batch/v1 Jobs orphan their pods
    (pkg/registry/batch/job/strategy.go DefaultGarbageCollectionPolicy), everything else is
    Background."""
    if str(options.get("orphanDependents")).lower() == "true":
        return "Orphan"
    return "Orphan" if key[:2] == ("batch", "jobs") else "Background"


def _initial_status(res: Served, obj: dict) -> dict:
    """The status a new object starts with: what the client sent is dropped (the status subresource
    owns it)."""
    if res.plural == "pods":
        return {"phase": "Pending"}
    if res.plural == "namespaces":
        return {"phase": "Active"}
    if res.plural == "customresourcedefinitions":
        names = obj.get("spec", {}).get("names", {})
        conditions = [
            {"type": t, "status": "True", "reason": r, "lastTransitionTime": now()}
            for t, r in (("NamesAccepted", "NoConflicts"), ("Established", "InitialNamesAccepted"))
        ]
        stored = [v["name"] for v in obj.get("spec", {}).get("versions", []) if v.get("storage")]
        return {"acceptedNames": names, "conditions": conditions, "storedVersions": stored}
    return {}


def _apply_merge(live: Any, applied: Any) -> Any:
    if isinstance(live, dict) and isinstance(applied, dict):
        out = dict(live)
        for k, v in applied.items():
            out[k] = _apply_merge(live.get(k), v)
        return out
    return json.loads(json.dumps(applied))


def _paths(obj: Any, prefix: tuple = ()) -> set[tuple]:
    """The dict-key paths of an applied configuration (lists count as one field)."""
    if not isinstance(obj, dict) or not obj:
        return {prefix} if prefix else set()
    out: set[tuple] = set()
    for k, v in obj.items():
        out |= _paths(v, (*prefix, k))
    return out


def _without(obj: dict, paths: set[tuple]) -> dict:
    """`obj` less the fields at `paths` (those a field manager applied before and applies no more);
    of the metadata only labels and annotations are the manager's, the rest is the server's."""
    out = json.loads(json.dumps(obj))
    for path in paths:
        if path[:1] == ("metadata",) and path[:2] not in (
            ("metadata", "labels"),
            ("metadata", "annotations"),
        ):
            continue
        node = out
        for part in path[:-1]:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(path[-1], None)
    return out


class Peer:
    """The running API: `url`, `kubeconfig` (a file naming it as context `kmock`), `api` (the
    KubeApi)."""

    def __init__(self, tmp: Path, aggregated: bool = True):
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._aggregated = aggregated
        self.thread = threading.Thread(target=lambda: asyncio.run(self._serve()), daemon=True)
        self.thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("kmock did not start")
        self.kubeconfig = tmp / "kubeconfig"
        self.kubeconfig.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "current-context": "kmock",
                    "clusters": [{"name": "kmock", "cluster": {"server": self.url}}],
                    "users": [{"name": "tester", "user": {"token": "kmock-token"}}],
                    "contexts": [
                        {"name": "kmock", "context": {"cluster": "kmock", "user": "tester"}}
                    ],
                }
            )
        )

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        async with KubeApi() as api, kmock.Server(api) as server:
            api.aggregated = self._aggregated
            self.api, self.url, self.loop = (
                api,
                str(server.url).rstrip("/"),
                asyncio.get_running_loop(),
            )
            self._ready.set()
            await self._stop.wait()

    def close(self) -> None:
        assert self._stop is not None
        self.loop.call_soon_threadsafe(self._stop.set)
        self.thread.join(10)

    def requests(self) -> list:
        """Every request the peer answered, as kmock parsed it (method, url, params, headers, data)."""
        return list(self.api)

    def objects(self, plural: str) -> list[dict]:
        """What the API holds now (for assertions), in any namespace."""
        return [o for k, o in list(self.api.store.objects.items()) if k[1] == plural]

    def call(self, fn: Callable[[], Any]) -> Any:
        """Run `fn` on the server's loop (to change its state from a test without racing a request)."""
        return asyncio.run_coroutine_threadsafe(_call(fn), self.loop).result(10)


async def _call(fn: Callable[[], Any]) -> Any:
    return fn()


@functools.lru_cache(maxsize=16)
def _documents(path: Path) -> str:
    loader = getattr(
        yaml, "CSafeLoader", yaml.SafeLoader
    )  # the C loader: the CRDs are megabytes of YAML
    return json.dumps([d for d in yaml.load_all(path.read_text(), Loader=loader) if d])


def documents(path: Path) -> list[dict]:
    """The YAML documents of a vendored file, a fresh copy each call (read once)."""
    return json.loads(_documents(path))


def wait_for(check: Callable[[], bool], seconds: float = 10) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.05)
    raise AssertionError("condition not met in time")

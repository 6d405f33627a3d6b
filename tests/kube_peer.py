"""The Kubernetes API peer: kmock 0.8's KubernetesEmulator (an aiohttp API server keeping objects in memory),
served on 127.0.0.1 from a background thread, spoken to by the real `kubernetes` client through a kubeconfig.

kmock as shipped lacks a few endpoints fsdpctl uses; they are added here and nowhere else, each as the real
API server documents it, and kept minimal:
- watches that end after ?timeoutSeconds;
- Namespaces (kmock's path parser fails on /api/v1/namespaces: 500), /version;
- server-side apply (PATCH application/apply-patch+yaml creates a missing object, merges an existing one)
  and dryRun=All (answers, stores nothing);
- pod logs (text, optionally streamed with follow=true) from `peer.logs`, set by the tests: there is no
  kubelet;
- Service proxy (/api/v1/namespaces/NS/services/NAME:PORT/proxy/...) to handlers the tests register, e.g.
  forwarding to a real etcd.
It has no controllers, no scheduler and no schema validation: tests set pod and job status themselves, and the
objects fsdpctl sends are validated against the real schemas separately (test_manifests.py)."""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path

import aiohttp.web
import kmock
from kmock._internal import enums

NS_PATH = re.compile(r"^/api/v1/namespaces(?:/([^/]+))?/?$")
PROXY_PATH = re.compile(r"^/api/v1/namespaces/([^/]+)/services/([^/:]+):(\d+)/proxy(/.*)?$")
LOG_PATH = re.compile(r"^/api/v1/namespaces/([^/]+)/pods/([^/]+)/log$")


class KubeApi(kmock.KubernetesEmulator):
    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self.namespaces: dict[str, dict] = {}
        self.logs: dict[tuple[str, str], str] = {}
        self.proxies: dict[tuple[str, str, int], Callable[[str, str, dict, bytes], tuple[int, bytes]]] = {}
        self.served: set[tuple[str, str, str]] = set()  # custom resources whose CRD was applied
        self.forbidden: set[str] = set()  # plurals this user may not touch (RBAC): 403, as the real API says
        for res in BUILTIN:
            self.resources[res] = {}

    async def __call__(self, raw: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        if m := NS_PATH.match(raw.path):
            return await self._namespace(raw, m.group(1))
        if m := PROXY_PATH.match(raw.path):
            handler = self.proxies.get((m.group(1), m.group(2), int(m.group(3))))
            if handler is None:
                return _status(
                    503, "ServiceUnavailable", f'no endpoints available for service "{m.group(2)}"'
                )
            code, body = handler(raw.method, m.group(4) or "/", dict(raw.query), await raw.read())
            return aiohttp.web.Response(status=code, body=body, content_type="application/json")
        if (m := LOG_PATH.match(raw.path)) and raw.method == "GET":
            return await self._log(raw, m.group(1), m.group(2))
        return await super().__call__(raw)

    async def _namespace(self, raw, name: str | None) -> aiohttp.web.StreamResponse:
        if raw.method == "POST":
            obj = await raw.json()
            name = obj["metadata"]["name"]
            if name in self.namespaces:
                return _status(409, "AlreadyExists", f'namespaces "{name}" already exists')
            self.namespaces[name] = {**obj, "status": {"phase": "Active"}}
            return aiohttp.web.json_response(self.namespaces[name], status=201)
        if raw.method == "PATCH" and name:  # server-side apply
            obj = await raw.json()
            if raw.query.get("dryRun") != "All":
                self.namespaces.setdefault(name, {**obj, "status": {"phase": "Active"}})
            return aiohttp.web.json_response(self.namespaces.get(name, obj))
        if raw.method == "GET" and name is None:
            return aiohttp.web.json_response(
                {"kind": "NamespaceList", "items": list(self.namespaces.values())}
            )
        if raw.method == "GET" and name in self.namespaces:
            return aiohttp.web.json_response(self.namespaces[name])
        if raw.method == "DELETE" and name in self.namespaces:
            return aiohttp.web.json_response(self.namespaces.pop(name))
        return _status(404, "NotFound", f'namespaces "{name}" not found')

    async def _log(self, raw, namespace: str, pod: str) -> aiohttp.web.StreamResponse:
        if not any(
            key[1:] == (namespace, pod) and not obj.deleted
            for key, obj in self._objects.items()
            if key[0].plural == "pods"
        ):
            return _status(404, "NotFound", f'pods "{pod}" not found')
        text = self.logs.get((namespace, pod), "")
        if raw.query.get("tailLines"):
            text = "".join(text.splitlines(keepends=True)[-int(raw.query["tailLines"]) :])
        if raw.query.get("follow") != "true":
            return aiohttp.web.Response(text=text, content_type="text/plain")
        resp = aiohttp.web.StreamResponse(headers={"Content-Type": "text/plain"})
        await resp.prepare(raw)
        for line in text.splitlines(keepends=True):  # a line at a time, as a kubelet streams it
            await resp.write(line.encode())
            await asyncio.sleep(0.01)
        await resp.write_eof()
        return resp

    async def _serve_watch(self, request):
        """kmock streams until the client leaves; a real API server ends a watch after ?timeoutSeconds."""
        seconds = float(request.params.get("timeoutSeconds") or 1800)
        deadline = asyncio.get_running_loop().time() + seconds
        events = super()._serve_watch(request)
        try:
            while (left := deadline - asyncio.get_running_loop().time()) > 0:
                try:
                    yield await asyncio.wait_for(events.__anext__(), left)
                except (TimeoutError, StopAsyncIteration):
                    return
        finally:
            await events.aclose()

    async def _handle(self, request):
        res = request.resource
        if res is not None and res.plural in self.forbidden:
            return _status(
                403,
                "Forbidden",
                f'{res.plural}.{res.group} is forbidden: User "tester" cannot '
                f'{request.method.value.lower()} resource "{res.plural}"',
            )
        if res is not None and _custom(res.group) and (res.group, res.version, res.plural) not in self.served:
            # as a real API server: a custom resource exists only once its CRD is installed
            raise kmock.KubernetesResourceNotFoundError()
        if (
            res is not None
            and res.plural == "customresourcedefinitions"
            and request.data
            and request.action in (enums.action.CREATE, enums.action.UPDATE)
        ):
            spec = request.data.get("spec", {})
            for version in spec.get("versions", []):
                self.served.add((spec["group"], version["name"], spec["names"]["plural"]))
                self.resources[f"{spec['group']}/{version['name']}/{spec['names']['plural']}"] = {}
        if request.params.get("dryRun") == "All":  # validated and answered, never stored
            return aiohttp.web.json_response(request.data or {})
        apply = "apply-patch" in request.headers.get("Content-Type", "")
        if apply and request.action == enums.action.UPDATE:  # apply to a missing object creates it
            key = (request.resource, request.namespace, request.name)
            async with self._lock:
                if key not in self._objects:
                    self._objects[key] = request.data
                elif self._objects[key].deleted:
                    self._objects[key].create(request.data)
                else:
                    key = None
                if key is not None:
                    raw = self._objects[key].last.raw
                    await self._buses[request.resource].put({"type": "ADDED", "object": raw})
                    return aiohttp.web.json_response(raw, status=201)
        return await super()._handle(request)


BUILTIN = [
    "v1/pods",
    "v1/events",
    "v1/secrets",
    "v1/services",
    "v1/configmaps",
    "v1/serviceaccounts",
    "v1/persistentvolumeclaims",
    "v1/nodes",
    "apps/v1/deployments",
    "apps/v1/daemonsets",
    "rbac.authorization.k8s.io/v1/clusterroles",
    "rbac.authorization.k8s.io/v1/clusterrolebindings",
    "rbac.authorization.k8s.io/v1/roles",
    "rbac.authorization.k8s.io/v1/rolebindings",
    "networking.k8s.io/v1/networkpolicies",
    "apiextensions.k8s.io/v1/customresourcedefinitions",
    "admissionregistration.k8s.io/v1/validatingwebhookconfigurations",
    "admissionregistration.k8s.io/v1/mutatingwebhookconfigurations",
]


def _custom(group: str | None) -> bool:
    return bool(group) and "." in group and not group.endswith(".k8s.io")


def _status(code: int, reason: str, message: str) -> aiohttp.web.Response:
    return aiohttp.web.json_response(
        {
            "kind": "Status",
            "apiVersion": "v1",
            "status": "Failure",
            "code": code,
            "reason": reason,
            "message": message,
        },
        status=code,
    )


class Peer:
    """The running API: `url`, `kubeconfig` (a file naming it as context `kmock`), `api` (the KubeApi)."""

    def __init__(self, tmp: Path):
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
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
                    "contexts": [{"name": "kmock", "context": {"cluster": "kmock", "user": "tester"}}],
                }
            )
        )

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        async with KubeApi() as api, kmock.Server(api) as server:
            self.api, self.url, self.loop = api, str(server.url).rstrip("/"), asyncio.get_running_loop()
            self._ready.set()
            await self._stop.wait()

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self._stop.set)
        self.thread.join(10)

    def requests(self) -> list:
        """Every request kmock parsed (namespaces, logs and proxies are answered before that)."""
        return list(self.api)

    def objects(self, plural: str) -> list[dict]:
        """What the API holds now (for assertions)."""
        return [
            o.raw for key, o in list(self.api._objects.items()) if key[0].plural == plural and not o.deleted
        ]


def wait_for(check: Callable[[], bool], seconds: float = 10) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.05)
    raise AssertionError("condition not met in time")

"""The Kubernetes API apart from a connection to it: its errors, and which kinds a server serves as
kubectl finds them (discovery: the aggregated document, else one list per group version, and
CRDs)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

# aggregated discovery (apidiscovery.k8s.io v2, GA in Kubernetes 1.30; v2beta1 from 1.26): one
# answer for all groups; a server without it answers the plain APIGroupList to the last entry
AGGREGATED = ",".join(
    [
        "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList",
        "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList",
        "application/json",
    ]
)


CRD_API = ("apiextensions.k8s.io/v1", "CustomResourceDefinition")


# what the apiextensions server serves for every custom resource
CUSTOM_VERBS = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")


class KubeError(RuntimeError):
    def __init__(self, status: int, reason: str, message: str):
        super().__init__(f"{status} {reason}: {message}")
        self.status, self.reason, self.message = status, reason, message


class NoCluster(RuntimeError):
    """No kubeconfig, no such context, or nothing answers at the server address."""


@dataclass(frozen=True)
class Resource:
    """One kind as discovery describes it."""

    group_version: str  # "v1" for the core group, else "group/version"
    kind: str
    plural: str
    namespaced: bool
    verbs: tuple[str, ...] = ()
    subresources: tuple[str, ...] = ()

    def path(
        self, namespace: str | None = None, name: str | None = None, subresource: str | None = None
    ) -> str:
        """The REST path of a collection or an object. A cluster-scoped kind ignores `namespace` (as
        kubectl does); a namespaced object needs one, a namespaced collection without one spans all
        namespaces."""
        gv = self.group_version
        base = f"/api/{gv}" if "/" not in gv else f"/apis/{gv}"
        if self.namespaced and namespace:
            base += f"/namespaces/{namespace}"
        elif self.namespaced and name:
            raise ValueError(f"{self.kind} {name} is namespaced: give its namespace")
        base += f"/{self.plural}"
        if name:
            base += f"/{name}"
        if subresource:
            base += f"/{subresource}"
        return base


def resources_from_list(doc: dict) -> list[Resource]:
    """An APIResourceList (/api/v1, /apis/G/V): entries named 'pods/log' are subresources of
    'pods'."""
    gv = doc["groupVersion"]
    entries = doc.get("resources") or []
    subs: dict[str, list[str]] = {}
    for r in entries:
        if "/" in r["name"]:
            parent, sub = r["name"].split("/", 1)
            subs.setdefault(parent, []).append(sub)
    return [
        Resource(
            gv,
            r["kind"],
            r["name"],
            bool(r["namespaced"]),
            tuple(r.get("verbs") or ()),
            tuple(subs.get(r["name"], ())),
        )
        for r in entries
        if "/" not in r["name"]
    ]


def resources_from_aggregated(doc: dict) -> list[Resource]:
    """An APIGroupDiscoveryList (aggregated discovery at /api and /apis): every group, version and
    kind."""
    out = []
    for group in doc.get("items") or []:
        name = (group.get("metadata") or {}).get("name", "")
        for version in group.get("versions") or []:
            gv = f"{name}/{version['version']}" if name else version["version"]
            for r in version.get("resources") or []:
                kind = (r.get("responseKind") or {}).get("kind")
                if kind:
                    subs = tuple(s["subresource"] for s in r.get("subresources") or [])
                    out.append(
                        Resource(
                            gv,
                            kind,
                            r["resource"],
                            r.get("scope") == "Namespaced",
                            tuple(r.get("verbs") or ()),
                            subs,
                        )
                    )
    return out


def resources_from_crd(crd: dict) -> list[Resource]:
    """What the server will serve once this CustomResourceDefinition is established: one Resource
    per served version, with the CRD's own plural and scope."""
    spec = crd["spec"]
    names, namespaced = spec["names"], spec["scope"] == "Namespaced"
    return [
        Resource(
            f"{spec['group']}/{v['name']}",
            names["kind"],
            names["plural"],
            namespaced,
            CUSTOM_VERBS,
            tuple(k for k in ("status", "scale") if k in (v.get("subresources") or {})),
        )
        for v in spec.get("versions") or []
        if v.get("served", True)
    ]


class Discovery:
    """kind -> Resource, read from the server once per connection: aggregated discovery where served
    (two requests in all), else /api and /apis for the group versions and each needed group
    version's APIResourceList. A kind missing from it is looked up among the CRDs applied through
    this connection, then discovery is read once more (a CRD someone else installed meanwhile);
    still missing, it is the API's 404."""

    def __init__(self, fetch: Callable[[str, str], dict]):
        self._fetch = fetch  # (path, Accept header) -> parsed answer
        self._index: dict[str, dict[str, Resource]] | None = (
            None  # group version -> kind -> Resource
        )
        self._versions: set[str] = set()  # group versions the server lists (plain discovery)
        self._learned: dict[tuple[str, str], Resource] = {}
        self._reread: set[tuple[str, str]] = set()

    def resolve(self, api_version: str, kind: str) -> Resource:
        found = self._lookup(api_version, kind) or self._learned.get((api_version, kind))
        if found is None and (api_version, kind) not in self._reread:
            self._reread.add((api_version, kind))
            self._index = None
            found = self._lookup(api_version, kind)
        if found is None:
            raise KubeError(
                404,
                "NotFound",
                f"the server could not find the requested resource: no {kind} in {api_version} (discovery)",
            )
        return found

    def learn(self, crd: dict) -> None:
        """A CRD applied through this connection: its kinds resolve from its spec until the server
        lists them."""
        for r in resources_from_crd(crd):
            self._learned[(r.group_version, r.kind)] = r

    def _lookup(self, api_version: str, kind: str) -> Resource | None:
        index = self._load()
        if api_version not in index and api_version in self._versions:
            index[api_version] = self._group_version(api_version)
        return index.get(api_version, {}).get(kind)

    def _load(self) -> dict[str, dict[str, Resource]]:
        if self._index is not None:
            return self._index
        apis = self._fetch("/apis", AGGREGATED)
        if apis.get("kind") == "APIGroupDiscoveryList":
            self._index = _by_kind(resources_from_aggregated(self._fetch("/api", AGGREGATED)))
            self._index.update(_by_kind(resources_from_aggregated(apis)))
            return self._index
        core = self._fetch("/api", "application/json")
        groups = [
            v["groupVersion"] for g in apis.get("groups") or [] for v in g.get("versions") or []
        ]
        self._versions = set(core.get("versions") or []) | set(groups)
        self._index = {}
        return self._index

    def _group_version(self, api_version: str) -> dict[str, Resource]:
        path = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
        try:
            return _by_kind(resources_from_list(self._fetch(path, "application/json")))[api_version]
        except KubeError as e:
            if e.status == 404:  # listed but gone since (an aggregated API server going away)
                return {}
            raise
        except KeyError:
            return {}


def _by_kind(resources: Iterable[Resource]) -> dict[str, dict[str, Resource]]:
    index: dict[str, dict[str, Resource]] = {}
    for r in resources:
        index.setdefault(r.group_version, {}).setdefault(r.kind, r)
    return index

"""What the Kubernetes test peer serves as API discovery: kube-apiserver's own documents (vendored
from kubernetes/kubernetes api/discovery/, read from ../shared, never copied into the repository)
plus the CRDs applied to the peer, as the plain documents (/api, /apis, /apis/G, /apis/G/V) and as
aggregated discovery (apidiscovery.k8s.io v2 and v2beta1, KEP-3352)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

# what apiextensions-apiserver serves for a custom resource and its subresources
# (apiextensions-apiserver pkg/apiserver/customresource_discovery_controller.go)
CUSTOM_VERBS = ["delete", "deletecollection", "get", "list", "patch", "create", "update", "watch"]
SUBRESOURCE_VERBS = ["get", "patch", "update"]


@dataclass(frozen=True)
class Served:
    """One resource as the peer serves it."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    subresources: frozenset[str]

    @property
    def group_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def qualified(self) -> str:
        """schema.GroupResource.String(): the name the server's messages use ("pods",
        "deployments.apps")."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def qualified_kind(self) -> str:
        """schema.GroupKind.String() ("Pod", "PyTorchJob.kubeflow.org"), for 422 messages."""
        return f"{self.kind}.{self.group}" if self.group else self.kind

    @property
    def custom(self) -> bool:
        return "." in self.group and not self.group.endswith(".k8s.io")


def version_priority(version: str) -> tuple[int, int, int, str]:
    """Kubernetes' version order (apimachinery pkg/version/helpers.go
    CompareKubeAwareVersionStrings): GA before beta before alpha, higher numbers first, other
    strings last."""
    m = re.fullmatch(r"v(\d+)(?:(alpha|beta)(\d+))?", version)
    if not m:
        return (3, 0, 0, version)
    stage = {None: 0, "beta": 1, "alpha": 2}[m.group(2)]
    return (stage, -int(m.group(1)), -int(m.group(3) or 0), "")


class Registry:
    """The vendored APIResourceLists, the APIGroupList they come with, and the established CRDs."""

    def __init__(self, folder: Path):
        self.api = json.loads((folder / "api.json").read_text())
        self.lists: dict[str, dict] = {}
        for f in sorted(folder.glob("api*__*.json")):
            doc = json.loads(f.read_text())
            self.lists[doc["groupVersion"]] = doc
        groups = json.loads((folder / "apis.json").read_text())["groups"]
        # a group version the folder holds no resource list for is left out, so that every version
        # the peer lists also answers (the vendored apis.json names a few more, from another tree)
        self.groups = [g for g in (self._served_only(g) for g in groups) if g["versions"]]
        self.crds: dict[str, dict] = {}  # name -> established CRD

    def _served_only(self, group: dict) -> dict:
        versions = [v for v in group["versions"] if v["groupVersion"] in self.lists]
        preferred = (
            group["preferredVersion"]
            if group["preferredVersion"] in versions
            else (versions or [None])[0]
        )
        return {**group, "versions": versions, "preferredVersion": preferred}

    # --- lookups --------------------------------------------------------------------------------------------

    def entries(self, gv: str) -> list[dict]:
        """The APIResourceList entries of one group version, CRDs included."""
        own = list((self.lists.get(gv) or {}).get("resources") or [])
        return own + [e for crd in self.crds.values() for e in crd_entries(crd).get(gv, [])]

    def find(self, group: str, version: str, plural: str) -> Served | None:
        gv = f"{group}/{version}" if group else version
        entries = self.entries(gv)
        top = next((e for e in entries if e["name"] == plural), None)
        if top is None:
            return None
        subs = frozenset(
            e["name"].split("/", 1)[1] for e in entries if e["name"].startswith(plural + "/")
        )
        return Served(group, version, plural, top["kind"], bool(top["namespaced"]), subs)

    def by_kind(self, api_version: str, kind: str) -> Served | None:
        group, _, version = api_version.rpartition("/")
        for e in self.entries(api_version):
            if "/" not in e["name"] and e["kind"] == kind:
                return self.find(group, version, e["name"])
        return None

    def crd_for(self, group: str, plural: str) -> dict | None:
        return next(
            (
                c
                for c in self.crds.values()
                if (c["spec"]["group"], c["spec"]["names"]["plural"]) == (group, plural)
            ),
            None,
        )

    # --- the documents --------------------------------------------------------------------------------------

    def group_list(self) -> dict:
        """/apis as APIGroupList."""
        return {"kind": "APIGroupList", "apiVersion": "v1", "groups": self.all_groups()}

    def all_groups(self) -> list[dict]:
        custom: dict[str, set[str]] = {}
        for crd in self.crds.values():
            for gv in crd_entries(crd):
                group, version = gv.split("/")
                custom.setdefault(group, set()).add(version)
        out = [g for g in self.groups if g["name"] not in custom]
        for group, versions in custom.items():
            ordered = sorted(versions, key=version_priority)
            refs = [{"groupVersion": f"{group}/{v}", "version": v} for v in ordered]
            out.append({"name": group, "versions": refs, "preferredVersion": refs[0]})
        return out

    def group(self, name: str) -> dict | None:
        """/apis/NAME as APIGroup."""
        found = next((g for g in self.all_groups() if g["name"] == name), None)
        return {"kind": "APIGroup", "apiVersion": "v1", **found} if found else None

    def resource_list(self, gv: str) -> dict | None:
        """/api/v1 or /apis/G/V as APIResourceList: the vendored document as kube-apiserver wrote
        it."""
        entries = self.entries(gv)
        if not entries:
            return None
        doc = dict(
            self.lists.get(gv)
            or {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv}
        )
        return {**doc, "resources": entries}

    def aggregated(self, core: bool, version: str) -> dict:
        """/api (core) or /apis as APIGroupDiscoveryList, converted from the same entries as
        kube-apiserver converts its own (apiserver pkg/endpoints/installer.go
        ConvertGroupVersionIntoToDiscovery)."""
        if core:
            groups = [("", self.api["versions"])]
        else:
            groups = [(g["name"], [v["version"] for v in g["versions"]]) for g in self.all_groups()]
        items = [
            {
                "metadata": {"name": name, "creationTimestamp": None},
                "versions": [
                    {
                        "version": v,
                        "resources": to_discovery(
                            name, v, self.entries(f"{name}/{v}" if name else v)
                        ),
                        "freshness": "Current",
                    }
                    for v in versions
                ],
            }
            for name, versions in groups
        ]
        return {
            "kind": "APIGroupDiscoveryList",
            "apiVersion": f"apidiscovery.k8s.io/{version}",
            "metadata": {},
            "items": items,
        }


def to_discovery(group: str, version: str, entries: list[dict]) -> list[dict]:
    """APIResource entries to APIResourceDiscovery: subresources ('pods/log') nest under their
    resource."""
    out: dict[str, dict] = {}
    for e in entries:
        gvk = {
            "group": e.get("group", group),
            "version": e.get("version", version),
            "kind": e["kind"],
        }
        if "/" not in e["name"]:
            out[e["name"]] = {
                "resource": e["name"],
                "responseKind": gvk,
                "scope": "Namespaced" if e["namespaced"] else "Cluster",
                "singularResource": e.get("singularName", ""),
                "verbs": e.get("verbs", []),
                **{k: e[k] for k in ("shortNames", "categories") if e.get(k)},
            }
    for e in entries:
        parent, _, sub = e["name"].partition("/")
        if sub and parent in out:
            gvk = {
                "group": e.get("group", group),
                "version": e.get("version", version),
                "kind": e["kind"],
            }
            out[parent].setdefault("subresources", []).append(
                {"subresource": sub, "responseKind": gvk, "verbs": e.get("verbs", [])}
            )
    return list(out.values())


def crd_entries(crd: dict) -> dict[str, list[dict]]:
    """group version -> the APIResourceList entries a CRD adds for each served version, subresources
    included (status, and scale answered as autoscaling/v1 Scale)."""
    spec = crd["spec"]
    names = spec["names"]
    out = {}
    for v in spec.get("versions") or []:
        if not v.get("served", True):
            continue
        top = {
            "name": names["plural"],
            "singularName": names.get("singular") or names["kind"].lower(),
            "namespaced": spec["scope"] == "Namespaced",
            "kind": names["kind"],
            "verbs": CUSTOM_VERBS,
            **{k: names[k] for k in ("shortNames", "categories") if names.get(k)},
        }
        subs = v.get("subresources") or {}
        sub = {
            "singularName": "",
            "namespaced": top["namespaced"],
            "kind": names["kind"],
            "verbs": SUBRESOURCE_VERBS,
        }
        entries = [top]
        if "status" in subs:
            entries.append({**sub, "name": f"{names['plural']}/status"})
        if "scale" in subs:
            scale = {"kind": "Scale", "group": "autoscaling", "version": "v1"}
            entries.append({**sub, **scale, "name": f"{names['plural']}/scale"})
        out[f"{spec['group']}/{v['name']}"] = entries
    return out


def accepts_aggregated(accept: str) -> str | None:
    """The aggregated discovery version a request's Accept header asks for first ('v2', 'v2beta1'),
    else None (apiserver pkg/endpoints/discovery/aggregated/wrapper.go: negotiation on g, v and as).
    """
    for entry in accept.split(","):
        params = dict(p.strip().split("=", 1) for p in entry.split(";")[1:] if "=" in p)
        if params.get("g") == "apidiscovery.k8s.io" and params.get("as") == "APIGroupDiscoveryList":
            if params.get("v") in ("v2", "v2beta1"):
                return params["v"]
        elif entry.split(";")[0].strip() in ("application/json", "*/*"):
            return None
    return None

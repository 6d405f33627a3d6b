"""The Kubernetes test peer (kube_peer.py) answers as kube-apiserver does where fsdpctl depends on
it: one test per behaviour its docstring names, spoken to over plain HTTP (urllib), so that what is
checked is the server and not the client. Each test names the upstream source or API documentation
it holds the peer to."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pytest

from conftest import SHARED
from kube_peer import DISCOVERY, Peer, documents, wait_for

VENDOR = SHARED / "vendor"
PYTORCHJOB_CRD = VENDOR / "kubeflow-training-operator-v1.9.4" / "kubeflow.org_pytorchjobs.yaml"
AGGREGATED = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json"
MERGE = "application/merge-patch+json"
APPLY = "application/apply-patch+yaml"


@pytest.fixture
def peer(tmp_path):
    p = Peer(tmp_path)
    yield p
    p.close()


@dataclass
class Answer:
    code: int
    headers: Any
    body: Any

    @property
    def message(self) -> str:
        return self.body.get("message", "") if isinstance(self.body, dict) else ""


def http(
    peer, method: str, path: str, body: Any = None, ctype: str = "application/json", **params
) -> Answer:
    accept = params.pop("accept", "application/json")
    url = peer.url + path + ("?" + urllib.parse.urlencode(params) if params else "")
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(
        url, data=data, method=method, headers={"Content-Type": ctype, "Accept": accept}
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return Answer(r.status, r.headers, _parse(r.read()))
    except urllib.error.HTTPError as e:
        return Answer(e.code, e.headers, _parse(e.read()))


def _parse(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode()


def namespace(peer, name: str) -> None:
    assert (
        http(
            peer,
            "POST",
            "/api/v1/namespaces",
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}},
        ).code
        == 201
    )


def pod(peer, name: str, ns: str = "team", labels: dict | None = None, **more) -> Answer:
    obj = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {}, **more.pop("metadata", {})},
        "spec": {"containers": [{"name": "main", "image": "busybox"}], **more.pop("spec", {})},
        **more,
    }
    return http(peer, "POST", f"/api/v1/namespaces/{ns}/pods", obj)


def configmap(name: str, **meta) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, **meta},
        "data": {"k": "v"},
    }


def watched(answer: Answer) -> list[tuple[str, str]]:
    """(event type, object name) of a watch's answer, one JSON event a line."""
    text = answer.body if isinstance(answer.body, str) else json.dumps(answer.body)
    return [
        (e["type"], e["object"]["metadata"]["name"]) for e in map(json.loads, text.splitlines())
    ]


def names(answer: Answer) -> list[str]:
    return sorted(o["metadata"]["name"] for o in answer.body["items"])


def crd(peer) -> None:
    obj = documents(PYTORCHJOB_CRD)[0]
    assert (
        http(peer, "POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", obj).code
        == 201
    )


# --- discovery: kubernetes/kubernetes api/discovery, KEP-3352 ---------------------------------------------


def test_discovery_serves_kube_apiservers_own_documents(peer):
    for f in sorted(DISCOVERY.glob("api*__*.json")):
        doc = json.loads(f.read_text())
        gv = doc["groupVersion"]
        path = f"/api/{gv}" if "/" not in gv else f"/apis/{gv}"
        assert http(peer, "GET", path).body == doc, f.name
    assert http(peer, "GET", "/api").body == json.loads((DISCOVERY / "api.json").read_text())
    groups = http(peer, "GET", "/apis").body["groups"]
    assert {"apps", "storage.k8s.io", "apiextensions.k8s.io"} <= {g["name"] for g in groups}
    for (
        g
    ) in groups:  # every version listed answers (those without a vendored document are left out)
        assert all(
            http(peer, "GET", f"/apis/{v['groupVersion']}").code == 200 for v in g["versions"]
        ), g
        assert (
            http(peer, "GET", f"/apis/{g['name']}").body["preferredVersion"]
            == g["preferredVersion"]
        )
    assert http(peer, "GET", "/apis/resource.k8s.io/v1alpha3").code == 404
    assert http(peer, "GET", "/apis/kubeflow.org/v1").code == 404


def test_aggregated_discovery_says_what_the_plain_documents_say(peer):
    answer = http(peer, "GET", "/apis", accept=AGGREGATED)
    assert "as=APIGroupDiscoveryList" in answer.headers["Content-Type"]
    assert (
        answer.body["kind"] == "APIGroupDiscoveryList"
        and answer.body["apiVersion"] == "apidiscovery.k8s.io/v2"
    )
    core = http(peer, "GET", "/api", accept=AGGREGATED).body["items"]
    assert [g["metadata"]["name"] for g in core] == [""]
    for group in [*core, *answer.body["items"]]:
        for version in group["versions"]:
            gv = f"{group['metadata']['name']}/{version['version']}".lstrip("/")
            plain = {
                r["name"]: r
                for r in http(peer, "GET", f"/api/{gv}" if "/" not in gv else f"/apis/{gv}").body[
                    "resources"
                ]
            }
            for r in version["resources"]:
                assert r["scope"] == (
                    "Namespaced" if plain[r["resource"]]["namespaced"] else "Cluster"
                ), (
                    gv,
                    r,
                )
                assert r["responseKind"]["kind"] == plain[r["resource"]]["kind"]
                assert {
                    f"{r['resource']}/{s['subresource']}" for s in r.get("subresources", [])
                } == {n for n in plain if n.startswith(r["resource"] + "/")}
    pods = next(r for r in core[0]["versions"][0]["resources"] if r["resource"] == "pods")
    assert {"log", "status", "exec"} <= {s["subresource"] for s in pods["subresources"]}
    beta = http(
        peer,
        "GET",
        "/apis",
        accept="application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList",
    )
    assert beta.body["apiVersion"] == "apidiscovery.k8s.io/v2beta1"
    assert (
        http(peer, "GET", "/apis").body["kind"] == "APIGroupList"
    )  # not asked for: the plain document
    peer.api.aggregated = False  # a server before 1.26
    assert http(peer, "GET", "/apis", accept=AGGREGATED).body["kind"] == "APIGroupList"


def test_a_crd_is_discovered_from_its_spec_and_its_deletion_takes_its_objects(peer):
    """apiextensions-apiserver: an established CRD's versions are served and discovered (with its
    status subresource); deleting the CRD deletes its objects (finalizer customresourcecleanup) and
    the API."""
    crd(peer)
    listed = http(peer, "GET", "/apis/kubeflow.org/v1").body["resources"]
    assert {(r["name"], r["namespaced"]) for r in listed} >= {
        ("pytorchjobs", True),
        ("pytorchjobs/status", True),
    }
    agg = http(peer, "GET", "/apis", accept=AGGREGATED).body["items"]
    kubeflow = next(g for g in agg if g["metadata"]["name"] == "kubeflow.org")
    assert kubeflow["versions"][0]["resources"][0]["scope"] == "Namespaced"
    stored = http(
        peer,
        "GET",
        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/pytorchjobs.kubeflow.org",
    ).body
    assert {c["type"] for c in stored["status"]["conditions"]} >= {"Established", "NamesAccepted"}
    namespace(peer, "team")
    job = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": "j"},
        "spec": {"pytorchReplicaSpecs": {}},
    }
    assert http(peer, "POST", "/apis/kubeflow.org/v1/namespaces/team/pytorchjobs", job).code == 201
    assert (
        http(
            peer,
            "DELETE",
            "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/pytorchjobs.kubeflow.org",
        ).code
        == 200
    )
    wait_for(lambda: http(peer, "GET", "/apis/kubeflow.org/v1").code == 404)
    assert peer.objects("pytorchjobs") == []
    assert http(peer, "GET", "/apis/kubeflow.org/v1/namespaces/team/pytorchjobs").code == 404


# --- routes by scope: apiserver pkg/endpoints/installer.go --------------------------------------------------


def test_a_namespaced_kind_has_no_named_cluster_path_but_lists_across_namespaces(peer):
    for ns in ("team", "other"):
        namespace(peer, ns)
        assert pod(peer, f"p-{ns}", ns).code == 201
    assert http(peer, "GET", "/api/v1/pods/p-team").code == 404
    answer = http(
        peer, "POST", "/api/v1/pods", {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"}}
    )
    assert answer.code == 405 and answer.body["reason"] == "MethodNotAllowed"
    assert names(http(peer, "GET", "/api/v1/pods")) == ["p-other", "p-team"]
    assert names(http(peer, "GET", "/api/v1/namespaces/team/pods")) == ["p-team"]
    assert (
        http(peer, "GET", "/api/v1/namespaces/team/nodes").code == 404
    )  # and the reverse: a cluster kind
    assert http(peer, "GET", "/api/v1/namespaces/team/widgets").code == 404  # no such resource
    body = http(peer, "GET", "/api/v1/namespaces/team/pods/nope").body
    assert body["message"] == 'pods "nope" not found' and body["details"] == {
        "name": "nope",
        "group": "",
        "kind": "pods",
    }


# --- selectors: apimachinery pkg/labels/selector.go, pkg/fields/selector.go ---------------------------------


def test_label_selectors_equality_and_set_based_are_evaluated_by_the_server(peer):
    namespace(peer, "team")
    for name, labels in {
        "a": {"app": "web", "tier": "fe"},
        "b": {"app": "web", "tier": "be"},
        "c": {"app": "db", "rank": "3"},
        "d": {},
    }.items():
        assert pod(peer, name, labels=labels).code == 201
    cases = {
        "app=web": ["a", "b"],
        "app==web": ["a", "b"],
        "app!=web": ["c", "d"],  # also objects without the key
        "app=web,tier=fe": ["a"],
        "tier in (fe, be)": ["a", "b"],
        "tier notin (fe)": ["b", "c", "d"],
        "app": ["a", "b", "c"],
        "!tier": ["c", "d"],
        "rank>2": ["c"],
        "rank<3": [],
        "app in (web,db),!tier": ["c"],
        "": ["a", "b", "c", "d"],
    }
    for selector, expected in cases.items():
        assert (
            names(http(peer, "GET", "/api/v1/namespaces/team/pods", labelSelector=selector))
            == expected
        ), selector
    for bad in ("app in (web", "app=we b", "rank>x", "=web"):
        answer = http(peer, "GET", "/api/v1/namespaces/team/pods", labelSelector=bad)
        assert answer.code == 400 and "unable to parse requirement" in answer.message, bad


def test_field_selectors_only_on_the_fields_a_kind_declares(peer):
    namespace(peer, "team")
    pod(peer, "a")
    pod(peer, "b", spec={"nodeName": "node-1"})
    assert names(
        http(peer, "GET", "/api/v1/namespaces/team/pods", fieldSelector="metadata.name=a")
    ) == ["a"]
    assert names(http(peer, "GET", "/api/v1/pods", fieldSelector="spec.nodeName=node-1")) == ["b"]
    assert names(
        http(
            peer, "GET", "/api/v1/pods", fieldSelector="spec.nodeName!=node-1,status.phase=Pending"
        )
    ) == ["a"]
    answer = http(peer, "GET", "/api/v1/pods", fieldSelector="spec.restartPolicyX=Never")
    assert answer.code == 400 and answer.message == "field label not supported: spec.restartPolicyX"
    event = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": "e1"},
        "involvedObject": {"kind": "Pod", "name": "a", "namespace": "team"},
        "reason": "FailedScheduling",
    }
    assert http(peer, "POST", "/api/v1/namespaces/team/events", event).code == 201
    assert names(
        http(peer, "GET", "/api/v1/namespaces/team/events", fieldSelector="involvedObject.name=a")
    ) == ["e1"]
    assert (
        names(
            http(
                peer, "GET", "/api/v1/namespaces/team/events", fieldSelector="involvedObject.name=b"
            )
        )
        == []
    )


def test_a_watch_applies_its_selector_to_every_change(peer):
    """cache_watcher.go: an object entering the selector is ADDED, one leaving it DELETED; a watch
    from a resourceVersion replays what followed it; without one it starts with the current objects
    as ADDED."""
    namespace(peer, "team")
    pod(peer, "before", labels={"app": "web"})
    start = http(peer, "GET", "/api/v1/namespaces/team/pods").body["metadata"]["resourceVersion"]
    pod(peer, "a", labels={"app": "web"})
    pod(peer, "other", labels={"app": "db"})
    http(
        peer,
        "PATCH",
        "/api/v1/namespaces/team/pods/other",
        {"metadata": {"labels": {"app": "web"}}},
        MERGE,
    )
    http(
        peer,
        "PATCH",
        "/api/v1/namespaces/team/pods/a",
        {"metadata": {"labels": {"app": "db"}}},
        MERGE,
    )
    http(peer, "DELETE", "/api/v1/namespaces/team/pods/other")

    def watch(**params) -> list[tuple[str, str]]:
        answer = http(
            peer,
            "GET",
            "/api/v1/namespaces/team/pods",
            watch="true",
            labelSelector="app=web",
            timeoutSeconds="1",
            **params,
        )
        return watched(answer)

    assert watch(resourceVersion=start) == [
        ("ADDED", "a"),
        ("ADDED", "other"),
        ("DELETED", "a"),
        ("DELETED", "other"),
    ]
    assert watch() == [("ADDED", "before")]
    assert (
        http(
            peer,
            "GET",
            "/api/v1/namespaces/team/pods",
            watch="true",
            resourceVersion="0",
            timeoutSeconds="1",
        ).code
        == 200
    )


def test_a_live_watch_sees_changes_as_they_happen_until_its_timeout(peer):
    namespace(peer, "team")
    seen: list[tuple[str, str]] = []

    def follow() -> None:
        answer = http(
            peer,
            "GET",
            "/api/v1/namespaces/team/pods",
            watch="1",
            labelSelector="app=web",
            timeoutSeconds="2",
        )
        seen.extend(watched(answer))

    t = threading.Thread(target=follow)
    t.start()
    wait_for(lambda: bool(peer.api.store.watchers))
    pod(peer, "a", labels={"app": "web"})
    pod(peer, "b", labels={"app": "db"})
    http(peer, "DELETE", "/api/v1/namespaces/team/pods/a")
    t.join(10)
    assert seen == [("ADDED", "a"), ("DELETED", "a")]


# --- resourceVersion: API concepts "Resource versions", "Efficient detection of changes" --------------------


def test_every_write_gets_a_new_resource_version_and_a_stale_one_conflicts(peer):
    namespace(peer, "team")
    base = "/api/v1/namespaces/team/configmaps"
    created = http(peer, "POST", base, configmap("c")).body
    meta = created["metadata"]
    assert meta["uid"] and meta["creationTimestamp"] and meta["resourceVersion"]
    patched = http(peer, "PATCH", f"{base}/c", {"data": {"k": "w"}}, MERGE).body
    assert int(patched["metadata"]["resourceVersion"]) > int(meta["resourceVersion"])
    assert patched["metadata"]["uid"] == meta["uid"]
    stale = {
        **configmap("c"),
        "metadata": {"name": "c", "resourceVersion": meta["resourceVersion"]},
    }
    answer = http(peer, "PUT", f"{base}/c", stale)
    assert answer.code == 409 and answer.body["reason"] == "Conflict"
    assert answer.message == (
        'Operation cannot be fulfilled on configmaps "c": the object has been modified; please apply your '
        "changes "
        "to the latest version and try again"
    )
    fresh = {
        **stale,
        "metadata": {"name": "c", "resourceVersion": patched["metadata"]["resourceVersion"]},
    }
    replaced = http(peer, "PUT", f"{base}/c", fresh)
    assert replaced.code == 200 and int(replaced.body["metadata"]["resourceVersion"]) > int(
        patched["metadata"]["resourceVersion"]
    )
    precondition = {"metadata": {"resourceVersion": meta["resourceVersion"]}, "data": {"k": "x"}}
    assert http(peer, "PATCH", f"{base}/c", precondition, MERGE).code == 409
    applied = {
        **configmap("c"),
        "metadata": {"name": "c", "resourceVersion": meta["resourceVersion"]},
    }
    assert http(peer, "PATCH", f"{base}/c", applied, APPLY, fieldManager="t").code == 409
    delete = {
        "kind": "DeleteOptions",
        "apiVersion": "v1",
        "preconditions": {"resourceVersion": meta["resourceVersion"]},
    }
    assert http(peer, "DELETE", f"{base}/c", delete).code == 409
    listed = http(peer, "GET", base).body["metadata"]["resourceVersion"]
    assert int(listed) >= int(replaced.body["metadata"]["resourceVersion"])
    assert http(peer, "POST", base, configmap("c")).code == 409  # AlreadyExists


def test_generation_counts_spec_changes_only(peer):
    namespace(peer, "team")
    dep = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "d"},
        "spec": {
            "selector": {"matchLabels": {"a": "b"}},
            "template": {
                "metadata": {"labels": {"a": "b"}},
                "spec": {"containers": [{"name": "c", "image": "x"}]},
            },
        },
    }
    path = "/apis/apps/v1/namespaces/team/deployments"
    assert http(peer, "POST", path, dep).body["metadata"]["generation"] == 1
    assert (
        http(peer, "PATCH", f"{path}/d", {"metadata": {"labels": {"x": "y"}}}, MERGE).body[
            "metadata"
        ]["generation"]
        == 1
    )
    assert (
        http(peer, "PATCH", f"{path}/d", {"spec": {"replicas": 3}}, MERGE).body["metadata"][
            "generation"
        ]
        == 2
    )


# --- field validation: API concepts "Field validation"; kubernetes/kubernetes#122480 ------------------------


def test_unknown_fields_are_dropped_with_a_warning_or_refused_when_strict(peer):
    namespace(peer, "team")
    base = "/api/v1/namespaces/team/configmaps"
    warned = http(peer, "POST", base, {**configmap("w"), "dataa": {"x": "y"}})
    assert warned.code == 201 and warned.headers.get_all("Warning") == [
        '299 - "unknown field \\"dataa\\""'
    ]
    assert "dataa" not in warned.body and "dataa" not in http(peer, "GET", f"{base}/w").body
    strict = http(
        peer,
        "POST",
        base,
        {**configmap("s"), "dataa": {}, "metadata": {"name": "s", "labelz": {}}},
        fieldValidation="Strict",
    )
    assert strict.code == 400 and strict.body["reason"] == "BadRequest"
    assert strict.message == (
        'ConfigMap in version "v1" cannot be handled as a ConfigMap: strict decoding error: unknown field '
        '"metadata.labelz", unknown field "dataa"'
    )
    ignored = http(peer, "POST", base, {**configmap("i"), "dataa": {}}, fieldValidation="Ignore")
    assert ignored.code == 201 and ignored.headers.get_all("Warning") is None
    typed = http(
        peer,
        "POST",
        "/api/v1/namespaces/team/pods",
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {"containers": "c"}},
    )
    assert typed.code == 400 and "cannot unmarshal string" in typed.message
    bad_name = http(peer, "POST", base, configmap("Bad_Name"))
    assert bad_name.code == 422 and bad_name.message.startswith(
        'ConfigMap "Bad_Name" is invalid: metadata.name: Invalid value'
    )


def test_server_side_apply_refuses_a_field_the_schema_lacks(peer):
    namespace(peer, "team")
    applied = {**configmap("a"), "metadata": {"name": "a", "namespace": "team"}, "spec": {"foo": 1}}
    answer = http(
        peer, "PATCH", "/api/v1/namespaces/team/configmaps/a", applied, APPLY, fieldManager="t"
    )
    assert answer.code == 500
    assert (
        answer.message
        == "failed to create typed patch object (team/a; /v1, Kind=ConfigMap): .spec: field not declared in "
        "schema"
    )
    assert http(peer, "GET", "/api/v1/namespaces/team/configmaps/a").code == 404
    ok = http(
        peer,
        "PATCH",
        "/api/v1/namespaces/team/configmaps/a",
        configmap("a"),
        APPLY,
        fieldManager="t",
    )
    assert ok.code == 201
    assert (
        http(peer, "PATCH", "/api/v1/namespaces/team/configmaps/a", configmap("a"), APPLY).code
        == 400
    )  # no manager


def test_server_side_apply_removes_what_its_manager_no_longer_applies(peer):
    namespace(peer, "team")
    path = "/api/v1/namespaces/team/configmaps/a"
    first = {**configmap("a", labels={"keep": "1", "drop": "1"}), "data": {"k": "v", "old": "x"}}
    http(peer, "PATCH", path, first, APPLY, fieldManager="fsdpctl")
    http(
        peer, "PATCH", path, {"metadata": {"labels": {"other": "1"}}}, MERGE
    )  # another writer's field
    second = {**configmap("a", labels={"keep": "1"}), "data": {"k": "v2"}}
    now = http(peer, "PATCH", path, second, APPLY, fieldManager="fsdpctl").body
    assert now["data"] == {"k": "v2"} and now["metadata"]["labels"] == {"keep": "1", "other": "1"}


def widget_crd() -> dict:
    schema = {
        "type": "object",
        "properties": {
            "spec": {
                "type": "object",
                "required": ["size"],
                "properties": {
                    "size": {"type": "integer", "minimum": 1},
                    "mode": {"type": "string", "enum": ["fast", "safe"]},
                    "extra": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                    "port": {"x-kubernetes-int-or-string": True},
                },
            },
        },
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.com"},
        "spec": {
            "group": "example.com",
            "scope": "Cluster",
            "names": {
                "plural": "widgets",
                "singular": "widget",
                "kind": "Widget",
                "listKind": "WidgetList",
            },
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": schema},
                }
            ],
        },
    }


def test_custom_resources_are_pruned_to_their_structural_schema_and_checked(peer):
    """apiextensions-apiserver pkg/apiserver/schema/pruning: fields the schema lacks are dropped
    (kept under x-kubernetes-preserve-unknown-fields); value errors are 422 Invalid in NewInvalid's
    words."""
    assert (
        http(
            peer, "POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", widget_crd()
        ).code
        == 201
    )
    base = "/apis/example.com/v1/widgets"
    w = {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}}
    created = http(
        peer,
        "POST",
        base,
        {**w, "spec": {"size": 2, "port": "http", "colour": "red", "extra": {"any": {"thing": 1}}}},
    )
    assert created.code == 201 and created.headers.get_all("Warning") == [
        '299 - "unknown field \\"spec.colour\\""'
    ]
    assert created.body["spec"] == {"size": 2, "port": "http", "extra": {"any": {"thing": 1}}}
    strict = http(
        peer,
        "POST",
        base,
        {**w, "metadata": {"name": "s"}, "spec": {"size": 1, "colour": "red"}},
        fieldValidation="Strict",
    )
    assert strict.code == 400 and 'unknown field "spec.colour"' in strict.message
    answer = http(
        peer,
        "POST",
        base,
        {**w, "metadata": {"name": "x"}, "spec": {"size": "two", "mode": "slow"}},
    )
    assert answer.code == 422 and answer.body["reason"] == "Invalid"
    assert answer.message == (
        'Widget.example.com "x" is invalid: [spec.size: Invalid value: "string": spec.size in body must be '
        "of type "
        'integer: "two", spec.mode: Unsupported value: "slow": supported values: "fast", "safe"]'
    )
    assert http(peer, "POST", base, {**w, "metadata": {"name": "y"}, "spec": {}}).message == (
        'Widget.example.com "y" is invalid: spec.size: Required value'
    )
    assert (
        http(peer, "POST", base, {**w, "metadata": {"name": "z"}, "spec": {"size": 0}}).code == 422
    )
    applied = http(
        peer,
        "PATCH",
        f"{base}/a",
        {**w, "metadata": {"name": "a"}, "spec": {"size": 1, "colour": "red"}},
        APPLY,
        fieldManager="t",
    )
    assert applied.code == 500 and ".spec.colour: field not declared in schema" in applied.message
    smp = http(
        peer, "PATCH", f"{base}/w", {"spec": {"size": 3}}, "application/strategic-merge-patch+json"
    )
    assert smp.code == 415  # custom resources take no strategic merge patch


# --- admission: plugin/pkg/admission/namespace/lifecycle, kubernetes/kubernetes#83562 -----------------------


def test_namespace_lifecycle_admission(peer):
    answer = http(peer, "POST", "/api/v1/namespaces/nope/configmaps", configmap("c"))
    assert answer.code == 404 and answer.message == 'namespaces "nope" not found'
    dry = http(peer, "POST", "/api/v1/namespaces/nope/configmaps", configmap("c"), dryRun="All")
    assert dry.code == 404  # a dry run is admitted like the real thing
    namespace(peer, "team")
    held = {**configmap("held"), "metadata": {"name": "held", "finalizers": ["example.com/hold"]}}
    assert http(peer, "POST", "/api/v1/namespaces/team/configmaps", held).code == 201
    assert http(peer, "POST", "/api/v1/namespaces/team/configmaps", configmap("other")).code == 201
    assert http(peer, "DELETE", "/api/v1/namespaces/team").body["status"]["phase"] == "Terminating"
    wait_for(lambda: http(peer, "GET", "/api/v1/namespaces/team/configmaps/other").code == 404)
    refused = http(peer, "POST", "/api/v1/namespaces/team/configmaps", configmap("late"))
    assert refused.code == 403 and "because it is being terminated" in refused.message
    assert http(peer, "DELETE", "/api/v1/namespaces/team").code == 409
    http(
        peer,
        "PATCH",
        "/api/v1/namespaces/team/configmaps/held",
        {"metadata": {"finalizers": None}},
        MERGE,
    )
    wait_for(lambda: http(peer, "GET", "/api/v1/namespaces/team").code == 404)
    assert "team" not in peer.api.namespaces
    assert http(peer, "DELETE", "/api/v1/namespaces/default").code == 403


# --- status subresource: API concepts "Subresources"; apiextensions "Status subresource" --------------------


def test_the_status_subresource_owns_the_status(peer):
    namespace(peer, "team")
    created = pod(peer, "p", status={"phase": "Running"}).body
    assert created["status"] == {
        "phase": "Pending"
    }  # what a client sends as status on create is dropped
    path = "/api/v1/namespaces/team/pods/p"
    main = http(
        peer,
        "PATCH",
        path,
        {"status": {"phase": "Running"}, "metadata": {"labels": {"x": "1"}}},
        MERGE,
    ).body
    assert main["status"]["phase"] == "Pending" and main["metadata"]["labels"] == {"x": "1"}
    status = http(
        peer,
        "PATCH",
        f"{path}/status",
        {"status": {"phase": "Running"}, "spec": {"nodeName": "n"}},
        MERGE,
    ).body
    assert status["status"]["phase"] == "Running" and "nodeName" not in status["spec"]
    assert http(peer, "GET", f"{path}/status").body["status"]["phase"] == "Running"


# --- deletion and garbage collection: pkg/controller/garbagecollector, API concepts "Garbage collection" ----


def owned_by(owner: dict, block: bool = True) -> dict:
    ref = {k: owner[k] for k in ("apiVersion", "kind")} | {
        "name": owner["metadata"]["name"],
        "uid": owner["metadata"]["uid"],
    }
    return {"ownerReferences": [{**ref, "blockOwnerDeletion": block, "controller": True}]}


def family(peer) -> tuple[dict, str]:
    """An owner ConfigMap with three dependent pods, one held by a finalizer (as a pod still
    terminating)."""
    namespace(peer, "team")
    owner = http(peer, "POST", "/api/v1/namespaces/team/configmaps", configmap("owner")).body
    for name in ("w0", "w1"):
        assert pod(peer, name, metadata=owned_by(owner)).code == 201
    assert (
        pod(peer, "held", metadata={**owned_by(owner), "finalizers": ["example.com/hold"]}).code
        == 201
    )
    return owner, "/api/v1/namespaces/team/configmaps/owner"


def test_foreground_deletion_waits_for_the_blocking_dependents(peer):
    owner, path = family(peer)
    answer = http(
        peer,
        "DELETE",
        path,
        {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Foreground"},
    )
    assert answer.code == 200 and answer.body["metadata"]["finalizers"] == ["foregroundDeletion"]
    assert answer.body["metadata"]["deletionTimestamp"]
    wait_for(lambda: sorted(p["metadata"]["name"] for p in peer.objects("pods")) == ["held"])
    held = http(peer, "GET", "/api/v1/namespaces/team/pods/held").body
    assert held["metadata"]["deletionTimestamp"]  # being deleted, waiting for its own finalizer
    assert (
        http(peer, "GET", path).code == 200
    )  # the owner stays while a blocking dependent is there
    http(
        peer,
        "PATCH",
        "/api/v1/namespaces/team/pods/held",
        {"metadata": {"finalizers": None}},
        MERGE,
    )
    wait_for(lambda: http(peer, "GET", path).code == 404)
    assert peer.objects("pods") == []


def test_background_deletion_removes_the_owner_at_once_and_then_its_dependents(peer):
    owner, path = family(peer)
    answer = http(peer, "DELETE", path, propagationPolicy="Background")
    assert (
        answer.code == 200
        and answer.body["status"] == "Success"
        and answer.body["details"]["uid"] == owner["metadata"]["uid"]
    )
    assert http(peer, "GET", path).code == 404
    wait_for(lambda: [p["metadata"]["name"] for p in peer.objects("pods")] == ["held"])
    assert http(peer, "GET", "/api/v1/namespaces/team/pods/held").body["metadata"][
        "deletionTimestamp"
    ]


def test_orphan_deletion_keeps_the_dependents_and_batch_jobs_orphan_by_default(peer):
    owner, path = family(peer)
    assert http(peer, "DELETE", path, propagationPolicy="Orphan").code == 200
    wait_for(lambda: http(peer, "GET", path).code == 404)
    pods = peer.objects("pods")
    assert len(pods) == 3 and all(not p["metadata"].get("ownerReferences") for p in pods)
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "j"},
        "spec": {
            "template": {
                "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "x"}]}
            }
        },
    }
    created = http(peer, "POST", "/apis/batch/v1/namespaces/team/jobs", job).body
    pod(peer, "job-pod", metadata=owned_by(created))
    answer = http(peer, "DELETE", "/apis/batch/v1/namespaces/team/jobs/j")
    assert "child pods are preserved by default" in answer.headers["Warning"]
    wait_for(lambda: http(peer, "GET", "/apis/batch/v1/namespaces/team/jobs/j").code == 404)
    assert http(peer, "GET", "/api/v1/namespaces/team/pods/job-pod").code == 200


def test_foreground_deletion_reaches_grandchildren_and_dangling_owners_are_collected(peer):
    namespace(peer, "team")
    top = http(peer, "POST", "/api/v1/namespaces/team/configmaps", configmap("top")).body
    mid = http(
        peer, "POST", "/api/v1/namespaces/team/configmaps", configmap("mid", **owned_by(top))
    ).body
    pod(peer, "leaf", metadata=owned_by(mid))
    http(peer, "DELETE", "/api/v1/namespaces/team/configmaps/top", propagationPolicy="Foreground")
    wait_for(lambda: peer.objects("configmaps") == [] and peer.objects("pods") == [])
    ghost = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "gone", "uid": "0000-gone"},
    }
    pod(peer, "orphan", metadata=owned_by(ghost))  # an owner that does not exist (by uid)
    wait_for(lambda: http(peer, "GET", "/api/v1/namespaces/team/pods/orphan").code == 404)


def test_a_scheduled_pod_gets_its_grace_period_and_an_unscheduled_one_goes_at_once(peer):
    """pkg/registry/core/pod/strategy.go: graceful deletion only for a pod bound to a node and not
    finished; the kubelet ends it and deletes it with gracePeriodSeconds=0."""
    namespace(peer, "team")
    pod(peer, "bound", spec={"nodeName": "node-1", "terminationGracePeriodSeconds": 45})
    pod(peer, "pending")
    marked = http(peer, "DELETE", "/api/v1/namespaces/team/pods/bound").body
    assert (
        marked["metadata"]["deletionGracePeriodSeconds"] == 45
        and marked["metadata"]["deletionTimestamp"]
    )
    assert http(peer, "GET", "/api/v1/namespaces/team/pods/bound").code == 200
    assert (
        http(peer, "DELETE", "/api/v1/namespaces/team/pods/bound", gracePeriodSeconds="0").code
        == 200
    )
    assert http(peer, "GET", "/api/v1/namespaces/team/pods/bound").code == 404
    assert http(peer, "DELETE", "/api/v1/namespaces/team/pods/pending").code == 200
    assert http(peer, "GET", "/api/v1/namespaces/team/pods/pending").code == 404


# --- the rest of what fsdpctl reads -------------------------------------------------------------------------


def test_lists_of_built_in_kinds_carry_no_type_on_their_items(peer):
    """kubernetes/kubernetes#3030: typed list items have no apiVersion/kind; a watch event's object
    does."""
    namespace(peer, "team")
    pod(peer, "p")
    item = http(peer, "GET", "/api/v1/namespaces/team/pods").body["items"][0]
    assert "kind" not in item and "apiVersion" not in item
    assert http(peer, "GET", "/api/v1/namespaces/team/pods/p").body["kind"] == "Pod"


def test_pod_logs_options_as_the_kubelet_applies_them(peer):
    """PodLogOptions as pkg/kubelet/kuberuntime/logs/logs.go applies them to the runtime's file:
    tailLines first, then since = the later of now - sinceSeconds and sinceTime; timestamps=true
    puts each line's time (RFC3339NanoFixed) and a space in front. Stored CRI lines keep their own
    times; plain lines get the time they were stored."""
    namespace(peer, "team")
    pod(peer, "p")
    now = time.time()
    fmt = "%Y-%m-%dT%H:%M:%S"
    stamp = [datetime.fromtimestamp(now - age, UTC).strftime(fmt) + ".5Z" for age in (3600, 600, 5)]
    peer.api.logs[("team", "p")] = "".join(f"{t} stdout F line {i}\n" for i, t in enumerate(stamp))
    url = "/api/v1/namespaces/team/pods/p/log"
    assert http(peer, "GET", url).body == "line 0\nline 1\nline 2\n"
    assert http(peer, "GET", url, tailLines="2").body == "line 1\nline 2\n"
    assert http(peer, "GET", url, tailLines="0").body == ""
    assert http(peer, "GET", url, sinceSeconds="1200").body == "line 1\nline 2\n"
    assert http(peer, "GET", url, sinceSeconds="1200", tailLines="1").body == "line 2\n"
    since_time = datetime.fromtimestamp(now - 60, UTC).strftime(fmt) + "Z"
    assert http(peer, "GET", url, sinceSeconds="7200", sinceTime=since_time).body == "line 2\n"
    stamped = http(peer, "GET", url, timestamps="true", tailLines="1").body
    assert stamped == stamp[2][:-3] + ".500000000Z line 2\n"
    peer.api.logs[("team", "p")] = "plain\n"
    assert http(peer, "GET", url, sinceSeconds="5").body == "plain\n"  # stored just now


def test_rbac_denials_and_pod_logs_in_the_servers_words(peer):
    namespace(peer, "team")
    pod(peer, "p", spec={"containers": [{"name": "a", "image": "x"}, {"name": "b", "image": "x"}]})
    peer.api.logs[("team", "p")] = "one\ntwo\nthree\n"
    assert (
        http(peer, "GET", "/api/v1/namespaces/team/pods/p/log", container="a", tailLines="2").body
        == "two\nthree\n"
    )
    assert http(peer, "GET", "/api/v1/namespaces/team/pods/p/log").message == (
        "a container name must be specified for pod p, choose one of: [a b]"
    )
    assert http(peer, "GET", "/api/v1/namespaces/team/pods/p/log", container="c").code == 400
    assert http(peer, "GET", "/api/v1/namespaces/team/services/etcd:2379/proxy/v2/keys").code == 404
    peer.api.forbidden.add("pods")
    answer = http(peer, "GET", "/api/v1/namespaces/team/pods")
    assert answer.code == 403 and answer.message == (
        'pods is forbidden: User "tester" cannot list resource "pods" in API group "" in the namespace "team"'
    )
    assert http(peer, "GET", "/version").body["gitVersion"] == "v1.33.0"

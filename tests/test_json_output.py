"""`-o json` on every command that reports (README "Exit codes and `-o json`"): stdout is exactly one JSON
document (json.loads of all of it), messages stay on stderr, an action's document carries `dry_run` as
kubectl's --dry-run values (none, client, server), and the exit code is the one the command has without -o.

Each command runs where it is cheap to reach: on this machine (settings, plans, manifests, local jobs),
against the Kubernetes API peer (tests/kube_peer.py: deploy, cleanup on EKS), against moto (cluster), against
a real HTTP server on 127.0.0.1 (deploy fetch). Commands with -o that are not named below (a later one) run
generically on this machine: if they succeed, stdout must be JSON; if they fail, stdout holds nothing else.
"""

from __future__ import annotations

import json

import pytest

from conftest import invoke
from test_exit_codes import LEAVES, _has
from test_kube import become_ready, install_operator, peer  # noqa: F401  (peer is a fixture)
from test_kube import cli as kcli

# covered by a test of its own, at a cost this file does not want to pay again: doctor imports torch and
# runs its probes (tests/test_doctor.py parses its -o json); monitor top needs a running job
# (tests/test_kube.py::test_monitor_top)
ELSEWHERE = {("doctor",), ("monitor", "top")}


def _doc(r, code: int = 0) -> object:
    assert r.exit_code == code, r.output
    try:
        return json.loads(r.stdout)
    except json.JSONDecodeError as e:  # pragma: no cover - the message is the point
        raise AssertionError(f"stdout is not one JSON document ({e}):\n{r.stdout[:2000]}") from None


def _json(*args: str, code: int = 0, via=invoke) -> object:
    return _doc(via(*args, "-o", "json"), code)


def test_this_machine(cli):
    shown = _json("config", "show")
    assert set(shown) == {"settings", "sources", "derived"}
    valid = _json("config", "validate")
    assert valid["ok"] is True and valid["problems"] == [] and valid["world_size"] >= 1
    bad = _json("--set", "JOB_NODES=abc", "--set", "SEQ_LEN=x", "config", "validate", code=2)
    assert bad["ok"] is False and len(bad["problems"]) == 2 and any("JOB_NODES" in p for p in bad["problems"])
    r = invoke("--set", "JOB_NODES=abc", "config", "validate", "-o", "json")
    assert "error: JOB_NODES='abc'" in r.stderr  # the lines stay on stderr as without -o
    assert isinstance(_json("plan"), dict)
    listed = _json("--set", "BACKEND=eks", "manifest", "--run-id", "r1")
    assert listed["kind"] == "List" and listed["items"]
    for dry in ((), ("--dry-run",)):
        cleaned = _json("cleanup", *dry)
        assert cleaned == {**cleaned, "dry_run": "client" if dry else "none", "removed": [], "skipped": []}
    assert _json("job", "list") == []
    assert invoke("job", "status", "nothing", "-o", "json").stdout == ""  # exit 4: no document, one line


def test_the_kubernetes_api(peer):  # noqa: F811
    """Every deploy subcommand: a client dry run (the objects, per component), a server dry run, a real
    apply (created, then unchanged on a rerun, ready), status; cleanup on EKS."""
    for part in ("etcd", "operator", "plugins", "storage", "monitoring", "all"):
        doc = _json("deploy", part, "--dry-run", via=kcli)
        assert doc["dry_run"] == "client" and doc["components"]
        assert all(c["objects"] and c["component"] for c in doc["components"])
    server = _json("deploy", "etcd", "--dry-run=server", via=kcli)
    assert server["dry_run"] == "server" and server["components"][0]["component"] == "etcd"
    assert peer.objects("deployments") == []  # a dry run stores nothing
    ready = become_ready(peer, "Deployment", "fsdp", "etcd")
    applied = _json("deploy", "etcd", "--timeout", "20", via=kcli)
    ready.join()
    [etcd] = applied["components"]
    assert applied["dry_run"] == "none" and etcd["created"] > 0 and etcd["ready"] is True
    [again] = _json("deploy", "etcd", "--timeout", "20", via=kcli)["components"]
    assert again["created"] == again["configured"] == 0 and again["unchanged"] == etcd["created"]
    rows = _json("deploy", "status", via=kcli)
    assert any(r["component"] == "etcd" and r["installed"] for r in rows)
    install_operator(peer)
    cleaned = _json("cleanup", "--dry-run", via=kcli)
    assert cleaned["dry_run"] == "client" and isinstance(cleaned["removed"], list)


def test_deploy_fetch(tmp_path, monkeypatch, cli):
    """deploy fetch from a real HTTP server on 127.0.0.1: one fetched file, one upstream does not publish."""
    import hashlib
    import http.server
    import threading

    from fsdpctl import deploy

    www = tmp_path / "www"
    www.mkdir()
    (www / "crd.yaml").write_text("kind: CustomResourceDefinition\n")

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *a, **kw):
            super().__init__(*a, directory=str(www), **kw)

        def log_message(self, *a):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/crd.yaml"
    pin = hashlib.sha256(b"kind: CustomResourceDefinition\n").hexdigest()
    files = [{"path": "rel/crd.yaml", "sha256": pin, "url": url}, {"path": "rel/r.yaml", "sha256": pin}]
    monkeypatch.setattr(deploy, "releases", lambda: {"x": {"files": files}})
    try:
        doc = _json("deploy", "fetch")
    finally:
        server.shutdown()
    assert doc["files"] == [
        {"path": "rel/crd.yaml", "outcome": "fetched"},
        {"path": "rel/r.yaml", "outcome": "unpublished"},
    ]


def test_aws(aws_env, cli):
    """cluster check, status, create and delete against moto: the dry runs' commands and AWS requests are
    data in the document, not lines around it."""
    from test_aws import make_cluster

    check = _json("cluster", "check")  # moto has no quota to read: a warning, not a fail
    assert check["ok"] is True and check["checks"]
    created = _json("cluster", "create", "--dry-run")
    assert created["dry_run"] == "client" and created["action"] == "would create"
    assert any("eksctl create cluster" in c for c in created["commands"]) and created["aws_requests"]
    gone = _json("cluster", "delete", "--yes")
    assert gone["cluster_deleted"] is False and gone["commands"] == []
    make_cluster()
    status = _json("cluster", "status")
    assert status["name"] == "fsdp-eks" and "nodegroups" in status
    dry = _json("cluster", "delete", "--dry-run")
    assert dry["dry_run"] == "client" and any("eksctl delete cluster" in c for c in dry["commands"])
    tf = _json("cluster", "create", "--tool", "terraform", "--dry-run")
    assert tf["tool"] == "terraform" and any("terraform" in c for c in tf["commands"])


@pytest.mark.parametrize(
    "path",
    [p for p, c in LEAVES if _has(c, "--output")],
    ids=[" ".join(p) for p, c in LEAVES if _has(c, "--output")],
)
def test_any_other_reporting_command(path, cli):
    """The rest, generically on this machine (with --dry-run where there is one): on success stdout is JSON;
    on a failure it holds nothing but, at most, a JSON document."""
    cmd = dict(LEAVES)[path]
    if path in ELSEWHERE:
        pytest.skip("tested elsewhere (see ELSEWHERE)")
    r = invoke(*path, *(("--dry-run",) if _has(cmd, "--dry-run") else ()), "-o", "json")
    if r.exit_code == 0 or r.stdout.strip():
        json.loads(r.stdout)

"""`-o json` on every command that reports (docs/reference/output.md): stdout is exactly
one JSON document (json.loads of all of it), messages stay on stderr, an action's document carries
`dry_run` as kubectl's --dry-run values (none, client, server), and the exit code is the one the
command has without -o.

Each command runs where it is cheap to reach: on this machine (settings, plans, manifests, local
jobs), against the Kubernetes API peer (tests/kube_peer.py: deploy, cleanup on EKS), against moto
(cluster), against a real HTTP server on 127.0.0.1 (deploy fetch). Commands with -o that are not
named below (a later one) run generically on this machine against two ended local jobs
(tests/state_home.py): each succeeds with one JSON document on stdout.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

import state_home
from conftest import invoke, scaled
from test_exit_codes import LEAVES, _has
from test_kube import become_ready, install_operator, peer  # noqa: F401  (peer is a fixture)
from test_kube import cli as kcli

# covered by a test of its own, at a cost this file does not want to pay again: doctor imports torch
# and runs its probes (tests/test_doctor.py parses its -o json); monitor top needs a running job
# (tests/test_kube.py::test_monitor_top); quickstart trains (tests/test_cli.py, slow, parses its -o
# json)
ELSEWHERE = {("doctor",), ("monitor", "top"), ("quickstart",)}
# what the tests below run in a situation of its own
NAMED = {
    *[("config", c) for c in ("show", "validate")],
    ("plan",),
    ("manifest",),
    ("cleanup",),
    *[("job", c) for c in ("list", "status")],
    *[
        ("deploy", c)
        for c in ("etcd", "operator", "plugins", "storage", "monitoring", "all", "status", "fetch")
    ],
    *[("cluster", c) for c in ("check", "status", "create", "delete")],
    ("data", "fetch"),
    ("model", "fetch"),
    *[("image", c) for c in ("build", "push")],
}


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
    assert (
        bad["ok"] is False
        and len(bad["problems"]) == 2
        and any("JOB_NODES" in p for p in bad["problems"])
    )
    r = invoke("--set", "JOB_NODES=abc", "config", "validate", "-o", "json")
    assert "error: JOB_NODES='abc'" in r.stderr  # the lines stay on stderr as without -o
    assert isinstance(_json("plan"), dict)
    listed = _json("--set", "BACKEND=eks", "manifest", "--run-id", "r1")
    assert listed["kind"] == "List" and listed["items"]
    for dry in ((), ("--dry-run",)):
        cleaned = _json("cleanup", *dry)
        assert cleaned == {
            **cleaned,
            "dry_run": "client" if dry else "none",
            "removed": [],
            "skipped": [],
        }
    assert _json("job", "list") == []
    assert (
        invoke("job", "status", "nothing", "-o", "json").stdout == ""
    )  # exit 4: no document, one line


@pytest.mark.slow  # 3-7 s: the fast lane keeps under 2 minutes; no training processes, so
@pytest.mark.beside  # CI runs it beside the serial slow lane
def test_the_kubernetes_api(peer):  # noqa: F811
    """Every deploy subcommand (the operator through `all`): a client dry run (the objects, per
    component), a server dry run, a real apply (created, then unchanged on a rerun, ready), status;
    cleanup on EKS."""
    parts = (
        "etcd",
        "plugins",
        "storage",
        "monitoring",
        "all",
    )  # `all` holds the operator (its CRDs: 1.5 MB)
    for part in parts:
        doc = _json("deploy", part, "--dry-run", via=kcli)
        assert doc["dry_run"] == "client" and all(c["objects"] for c in doc["components"])
        names = [c["component"] for c in doc["components"]]
        assert names == (
            ["etcd", "operator", "plugins", "storage", "monitoring"] if part == "all" else [part]
        )
    server = _json("deploy", "etcd", "--dry-run=server", via=kcli)
    assert server["dry_run"] == "server" and server["components"][0]["component"] == "etcd"
    assert peer.objects("deployments") == []  # a dry run stores nothing
    ready = become_ready(peer, "Deployment", "fsdp", "etcd")
    applied = _json("deploy", "etcd", "--timeout", str(round(scaled(60))), via=kcli)
    ready.join()
    [etcd] = applied["components"]
    assert applied["dry_run"] == "none" and etcd["created"] > 0 and etcd["ready"] is True
    [again] = _json("deploy", "etcd", "--timeout", str(round(scaled(60))), via=kcli)["components"]
    assert again["created"] == again["configured"] == 0 and again["unchanged"] == etcd["created"]
    rows = _json("deploy", "status", via=kcli)
    assert any(r["component"] == "etcd" and r["installed"] for r in rows)
    install_operator(peer)
    cleaned = _json("cleanup", "--dry-run", via=kcli)
    assert cleaned["dry_run"] == "client" and isinstance(cleaned["removed"], list)


@pytest.mark.slow
def test_deploy_all_and_operator(peer):  # noqa: F811
    """The operator's client dry run carries its CRDs (1.5 MB of YAML read and written: seconds)."""
    for part in ("operator", "all"):
        doc = _json("deploy", part, "--dry-run", via=kcli)
        names = [c["component"] for c in doc["components"]]
        assert names == (
            ["etcd", "operator", "plugins", "storage", "monitoring"] if part == "all" else [part]
        )
        assert all(c["objects"] for c in doc["components"])
        crds = [
            o
            for c in doc["components"]
            for o in c["objects"]
            if o["kind"] == "CustomResourceDefinition"
        ]
        assert any(o["metadata"]["name"] == "pytorchjobs.kubeflow.org" for o in crds)


def test_deploy_fetch(tmp_path, monkeypatch, cli):
    """deploy fetch from a real HTTP server on 127.0.0.1: one fetched file, one upstream does not
    publish."""
    import hashlib
    import http.server
    import threading

    from fsdpctl.cluster import deploy

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
    files = [
        {"path": "rel/crd.yaml", "sha256": pin, "url": url},
        {"path": "rel/r.yaml", "sha256": pin},
    ]
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
    """cluster check, status, create and delete against moto: the dry runs' commands and AWS
    requests are data in the document, not lines around it."""
    from test_aws import make_cluster

    check = _json("cluster", "check")  # moto has no quota to read: a warning, not a fail
    assert check["ok"] is True and check["checks"]
    created = _json("cluster", "create", "--dry-run")
    assert created["dry_run"] == "client" and created["action"] == "would create"
    assert (
        any("eksctl create cluster" in c for c in created["commands"]) and created["aws_requests"]
    )
    gone = _json("cluster", "delete", "--yes")
    assert gone["cluster_deleted"] is False and gone["commands"] == []
    make_cluster()
    status = _json("cluster", "status")
    assert status["name"] == "fsdp-eks" and "nodegroups" in status
    dry = _json("cluster", "delete", "--dry-run")
    assert dry["dry_run"] == "client" and any("eksctl delete cluster" in c for c in dry["commands"])
    tf = _json("cluster", "create", "--tool", "terraform", "--dry-run")
    assert tf["tool"] == "terraform" and any("terraform" in c for c in tf["commands"])


def test_the_hub_and_the_image(cli, monkeypatch):
    """data fetch / model fetch against the Hub-shaped HTTP peer (tests/hub_peer.py, real
    huggingface_hub via HF_ENDPOINT): a dry run, then the download, then again (nothing missing);
    image build and push as dry runs (the docker command lines as data, the ECR note among them)."""
    from hub_peer import HubPeer, running

    with running(HubPeer()) as served:
        served.add(
            "dataset",
            "org/corpus",
            {"data/train.jsonl": b'{"text": "a b c"}\n', "README.md": b"# c\n"},
        )
        served.add("model", "org/m", {"config.json": b"{}"})
        monkeypatch.setenv("HF_ENDPOINT", served.endpoint)
        dry = _json("data", "fetch", "org/corpus", "--dry-run")
        [repo] = dry["repos"]
        assert dry["dry_run"] == "client" and repo["repo"] == "org/corpus" and repo["missing"] == 2
        first = _json("data", "fetch", "org/corpus")
        assert first["dry_run"] == "none" and first["repos"][0]["path"]
        assert _json("data", "fetch", "org/corpus")["repos"][0]["missing"] == 0
        assert _json("model", "fetch", "org/m")["repos"][0]["files"] == 1
    built = _json("--set", "AWS_ACCOUNT_ID=123456789012", "image", "build", "--dry-run")
    assert any(c.startswith("docker build") or " docker build " in c for c in built["commands"]), (
        built
    )
    pushed = _json(
        "--set",
        "IMAGE_LOGIN=ecr",
        "--set",
        "AWS_ACCOUNT_ID=123456789012",
        "image",
        "push",
        "--dry-run",
    )
    assert pushed["pinned"] == "" and any("docker push" in c for c in pushed["commands"])
    assert any(c.startswith("# ECR repository") for c in pushed["commands"])


def test_every_named_command_reports():
    """NAMED lists commands that really have -o (a typo there would skip nothing and test nothing)."""
    assert all(_has(dict(LEAVES)[p], "--output") for p in NAMED | ELSEWHERE)


OTHERS = [p for p, c in LEAVES if _has(c, "--output") and p not in NAMED | ELSEWHERE]


@pytest.fixture(scope="module")
def ended_jobs(tmp_path_factory) -> Iterator[Path]:
    """A home with two ended local jobs, their records, logs and checkpoints (tests/state_home.py:
    the real supervisor, ~1 s, no torchrun): `alpha` succeeded, `beta` failed."""
    home = tmp_path_factory.mktemp("reporting") / "home"
    saved = {k: os.environ.get(k) for k in ("FSDPCTL_HOME", "FSDPCTL_LOCAL_NETNS")}
    os.environ.update(FSDPCTL_HOME=str(home), FSDPCTL_LOCAL_NETNS="0")
    try:
        state_home.build(home)
    finally:
        for k, v in saved.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    yield home


def _arguments(cmd) -> list[str]:
    """A job name for each required argument: alpha, then beta (`job diff A B` compares the two)."""
    names = iter(state_home.JOBS)
    return [next(names) for p in cmd.params if p.param_type_name == "argument" and p.required]


@pytest.mark.parametrize("path", OTHERS, ids=[" ".join(p) for p in OTHERS])
def test_any_other_reporting_command(path, cli, ended_jobs, tmp_path, monkeypatch):
    """A reporting command not named above (the job commands; one added later) run generically on
    this machine against ended local jobs (`ended_jobs`), on job alpha, with --dry-run where it has
    one: it succeeds, and its stdout is one JSON document."""
    home = tmp_path / "home"
    state_home.copy(ended_jobs, home)
    monkeypatch.setenv("FSDPCTL_HOME", str(home))
    monkeypatch.setenv("FSDPCTL_LOCAL_NETNS", "0")
    cmd = dict(LEAVES)[path]
    # --allow-drift: the record's data fingerprints are made up (state_home), a rerun would be refused
    flags = [f for f in ("--dry-run", "--allow-drift") if _has(cmd, f)]
    r = invoke(*path, *_arguments(cmd), *flags, "--set", "JOB_NAME=alpha", "-o", "json")
    output = next(p for p in cmd.params if "--output" in getattr(p, "opts", ()))
    if "one object per line" in (output.help or ""):  # `job logs`: JSON lines
        assert r.exit_code == 0 and r.stdout.strip(), r.output
        assert all(isinstance(json.loads(line), dict) for line in r.stdout.splitlines())
    else:
        _doc(r)

"""Backends own their differences (issue 31): no code outside `fsdpctl/backends/` branches on a
backend's name (it asks the place's `fsdpctl.targets.Target`), each registered place is a folder
there with a `Backend`, and the job every backend starts from is one `fsdpctl.job.spec.JobSpec`.

Peers: Python's own parser (`ast`) for the scan; the Kubernetes rendering (`render.render_job`,
pure) for the spec. The split follows torchx (torchx/specs/api.py `AppDef`,
torchx/schedulers/__init__.py `get_scheduler_factories`): one job description, each scheduler
renders it.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
from pathlib import Path

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from fsdpctl import backends
from fsdpctl.job import render
from fsdpctl.job import spec as jobspec
from fsdpctl.settings import load
from fsdpctl.targets import NAMES, TARGETS

SRC = Path(__file__).resolve().parents[1] / "src" / "fsdpctl"
# where names are declared, not branched on
ALLOWED = {Path("targets.py")}


def name_branches(source: str, names: tuple[str, ...] = NAMES) -> list[int]:
    """Lines where `source` decides by a backend's name: a comparison (==, !=, in, not in) with a
    name among its operands, a `match` case on one, a mapping keyed by one, or a subscript by one.
    """
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
        elif isinstance(node, ast.MatchValue):
            operands = [node.value]
        elif isinstance(node, ast.Dict):
            operands = [k for k in node.keys if k is not None]
        elif isinstance(node, ast.Subscript):
            operands = [node.slice]
        else:
            continue
        for operand in operands:
            if any(isinstance(c, ast.Constant) and c.value in names for c in ast.walk(operand)):
                found.append(node.lineno)
                break
    return found


def test_no_module_outside_backends_branches_on_a_backend_name():
    """Each hit names the file and line; the fix is a `Target` field or a `Backend` method."""
    hits = [
        f"{path.relative_to(SRC)}:{line}"
        for path in sorted(SRC.rglob("*.py"))
        if path.relative_to(SRC).parts[0] != "backends" and path.relative_to(SRC) not in ALLOWED
        for line in name_branches(path.read_text())
    ]
    assert hits == []


@pytest.mark.parametrize(
    "source",
    [
        'if cfg.backend == "eks":\n    pass',
        'ok = be.name != "local"',
        'x = "local" if cfg.backend in ("local", "x") else 0',
        'x = {"eks": 1, "local": 2}[cfg.backend]',
        'x = TABLE["eks"]',
        'match cfg.backend:\n    case "local":\n        pass',
        'if cfg.backend not in {"eks"}:\n    pass',
    ],
)
def test_the_scan_finds_every_form_of_a_branch(source):
    assert name_branches(source), source


def test_the_scan_leaves_other_uses_of_the_words():
    """A name in a message, a default or a call is no branch."""
    source = 'warn("runs on local disks")\nload(flags={"BACKEND": "local"})\nx = f(backend="eks")'
    assert name_branches(source) == []


def test_every_target_is_a_folder_under_backends_with_a_backend_and_every_folder_is_registered():
    """A third place is one folder and one `TARGETS` entry: create() finds its class by the entry."""
    folders = {p.name for p in (SRC / "backends").iterdir() if (p / "__init__.py").is_file()}
    assert folders == set(NAMES)
    protocol = {
        n for n, _ in inspect.getmembers(backends.Backend, inspect.isfunction) if n[0] != "_"
    }
    for name, target in TARGETS.items():
        module, cls = target.backend.split(":")
        assert module.startswith(f"fsdpctl.backends.{name}.")
        impl = getattr(importlib.import_module(module), cls)
        assert impl.name == name
        assert {n for n in protocol if callable(getattr(impl, n, None))} == protocol, name
        assert type(backends.create(load(flags={"BACKEND": name}))) is impl


@settings(max_examples=40, deadline=None)
@given(
    backend=st.sampled_from(NAMES),
    nodes=st.integers(1, 8),
    procs=st.integers(1, 4),
    shared=st.sampled_from(["", "fsx-claim"]),
    pvc=st.sampled_from(["", "ckpt-claim"]),
    restarts=st.integers(0, 5),
)
def test_the_kubernetes_manifests_are_a_rendering_of_the_job_spec(
    backend, nodes, procs, shared, pvc, restarts
):
    """Whatever the settings, the rendered job carries the spec: its nodes, processes per node,
    command, image, environment (the job's, then the run's), restart budget, grace period and
    exactly the claims the spec's storage mounts, each at its mount path."""
    flags = {
        "BACKEND": backend,
        "JOB_NODES": str(nodes),
        "LOCAL_PROCS_PER_NODE": str(procs),
        "SHARED_VOLUME": shared,
        "CHECKPOINT_PVC": pvc,
        "MAX_RESTARTS": str(restarts),
    }
    assume(nodes == 1 or shared or pvc)  # settings refuse checkpoints split over pod-local disks
    cfg = load(flags=flags)
    spec = jobspec.build(cfg, "run-1", "rec-1")
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.nodes = 3  # type: ignore[misc]
    assert spec.target.name == backend and spec.world_size == cfg.world_size
    job = render.render_job(cfg, "run-1", "rec-1")[-1]
    worker = job["spec"]["pytorchReplicaSpecs"]["Worker"]  # JOB_KIND=pytorchjob, the default
    assert worker["replicas"] == spec.nodes
    assert job["spec"]["nprocPerNode"] == str(spec.procs_per_node)
    pod = worker["template"]["spec"]
    container = pod["containers"][0]
    assert tuple(container["command"]) == spec.command and container["image"] == spec.image
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert {**spec.env, **spec.run_env}.items() <= env.items()
    assert (
        env["CHECKPOINT_DIR"] == spec.storage.checkpoints and env["HF_HOME"] == spec.storage.hf_home
    )
    assert job["spec"]["runPolicy"]["backoffLimit"] == spec.restart.backoff_limit
    assert pod["terminationGracePeriodSeconds"] == spec.stop.grace_s
    claims = {
        v["persistentVolumeClaim"]["claimName"]: v["name"]
        for v in pod["volumes"]
        if "persistentVolumeClaim" in v
    }
    assert set(claims) == set(spec.storage.mounts.values())
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert {mounts[claims[c]]: c for c in claims} == dict(spec.storage.mounts)
    assert spec.storage.on_a_claim(spec.storage.checkpoints) == bool(spec.storage.mounts)


def test_a_place_without_services_points_the_rendezvous_at_its_own_first_node():
    """torchrun takes the rendezvous endpoint as one argument (torch/distributed/run.py,
    --rdzv-endpoint); `command_at` replaces exactly that one and keeps every other."""
    spec = jobspec.build(load(flags={"BACKEND": "eks", "JOB_NODES": "2"}), "run-1")
    moved = spec.command_at("node-a:29400")
    changed = [(a, b) for a, b in zip(spec.command, moved, strict=True) if a != b]
    assert changed == [
        (
            f"--rdzv-endpoint={spec.rendezvous.host}:{spec.rendezvous.port}",
            "--rdzv-endpoint=node-a:29400",
        )
    ]

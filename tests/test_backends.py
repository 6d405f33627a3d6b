"""One job backend interface: both implementations, backend resolution, and the record that makes a
job remember where it was started. The cluster side runs against the Kubernetes API peer of
test_kube.py (kmock's emulator over HTTP, reached by the real `kubernetes` client); the local side
against real files."""

from __future__ import annotations

import inspect
import json
import random

import pytest

from conftest import isolate
from fsdpctl import backends
from fsdpctl.backends.eks.backend import EksBackend
from fsdpctl.backends.local.backend import LocalBackend
from fsdpctl.job import home, state
from fsdpctl.settings import load
from fsdpctl.targets import NAMES
from test_kube import cli, install_operator, peer, said  # noqa: F401  (peer is a fixture)

# every method of the protocol (a method added there is checked here without a list to keep)
VERBS = tuple(n for n, _ in inspect.getmembers(backends.Backend, inspect.isfunction) if n[0] != "_")


@pytest.mark.parametrize("impl", [LocalBackend, EksBackend])
def test_each_backend_implements_every_verb_of_the_protocol(impl):
    for verb in VERBS:
        assert callable(getattr(impl, verb)), f"{impl.__name__} lacks {verb}"
    assert impl.name in NAMES and impl.poll_s > 0


def test_create_picks_the_implementation_without_touching_a_cluster():
    assert isinstance(backends.create(load(flags={"BACKEND": "local"})), LocalBackend)
    assert isinstance(
        backends.create(load(flags={"BACKEND": "eks"})), EksBackend
    )  # connects on first use


def test_a_record_decides_where_a_job_lives_and_brings_its_namespace(tmp_path, monkeypatch):
    monkeypatch.setenv("FSDPCTL_HOME", str(tmp_path))
    flags = {"BACKEND": "eks", "JOB_NAME": "big", "JOB_NAMESPACE": "team-a", "JOB_KIND": "trainjob"}
    started = load(flags=flags)
    placement = {k: getattr(started, k) for k in ("job_namespace", "job_kind", "kube_context")}
    state.write(
        home.job_dir("big"),
        {"job": "big", "backend": "eks", "run_id": "big-1", "created": 1.0, **placement},
    )
    here = load(flags={"BACKEND": "local", "JOB_NAMESPACE": "fsdp"})
    placed = backends.placed(here, "big", None)
    assert (placed.backend, placed.job_namespace, placed.job_kind) == ("eks", "team-a", "trainjob")
    assert backends.placed(here, "other", None).backend == "local"  # no record: BACKEND
    assert backends.placed(here, "big", "local").backend == "local"  # --backend wins


def test_damaged_records_count_as_none(tmp_path, monkeypatch):
    """Any bytes in a placement file of a home from before the job core, or in a job's state (cut
    write, hand edit): resolution falls back to BACKEND, never raises."""
    monkeypatch.setenv("FSDPCTL_HOME", str(tmp_path))
    cfg = load(flags={"BACKEND": "local"})
    rng = random.Random(12)
    samples = [b"", b"{", b"[]", b'{"backend": "gke"}', b'{"backend": 3}', b"\xff\xfe", b"null"]
    samples += [bytes(rng.randrange(256) for _ in range(rng.randrange(1, 64))) for _ in range(40)]
    (tmp_path / "started").mkdir()
    (tmp_path / "jobs" / "fsdp").mkdir(parents=True)
    for blob in samples:
        (tmp_path / "started" / "fsdp.json").write_bytes(blob)
        (tmp_path / "jobs" / "fsdp" / "state.json").write_bytes(blob)
        assert backends.placed(cfg, "fsdp", None).backend == "local", blob


@pytest.mark.parametrize("verb", [["run"], ["status"], ["logs"], ["stop"], ["list"], ["wait"]])
def test_every_job_verb_takes_backend_and_refuses_an_unknown_one(verb, tmp_path, monkeypatch):
    isolate(monkeypatch, tmp_path)
    r = cli("job", *verb, "--backend", "gke")
    assert r.exit_code == 2, r.output
    assert "gke" in r.output and "local or eks" in r.output and "Traceback" not in r.output


@pytest.mark.slow  # 3-7 s: the fast lane keeps under 2 minutes; no training processes, so
@pytest.mark.beside  # CI runs it beside the serial slow lane
def test_a_job_started_on_eks_is_found_there_by_every_verb(peer, monkeypatch):  # noqa: F811
    """`job run --backend eks -d` with BACKEND=local: status, logs, stop and wait look on the
    cluster."""
    install_operator(peer)
    monkeypatch.setenv("FSDPCTL_BACKEND", "local")
    r = cli("job", "run", "--backend", "eks", "-d")
    assert r.exit_code == 0, r.output
    status = json.loads(cli("job", "status", "-o", "json").stdout)
    assert status["backend"] == "eks" and status["kind"] == "PyTorchJob" and status["job"] == "fsdp"
    assert cli("job", "status", "--backend", "local").exit_code == 4  # not on this machine
    assert cli("job", "wait", "--timeout", "1").exit_code == 5  # on the cluster, still running
    r = cli("job", "stop")
    assert r.exit_code == 0 and "stopped and deleted" in said(r)
    assert peer.objects("pytorchjobs") == []


def test_job_run_dry_run_on_the_cluster_contacts_nothing(tmp_path, monkeypatch):
    """A bare --dry-run lists what `run` would send; no kubeconfig is even needed. An image without
    a registry (neither AWS_ACCOUNT_ID nor IMAGE_REGISTRY: the bare name, which the kubelet pulls
    from Docker Hub) is refused, dry run or not, in one line naming both keys."""
    isolate(monkeypatch, tmp_path)  # KUBECONFIG names a file that does not exist
    bare = cli("job", "run", "--backend", "eks", "--dry-run")
    assert (
        bare.exit_code == 2 and "has no registry" in said(bare) and "IMAGE_REGISTRY" in said(bare)
    ), bare.output
    r = cli("--set", "AWS_ACCOUNT_ID=123456789012", "job", "run", "--backend", "eks", "--dry-run")
    assert r.exit_code == 0, r.output
    assert "PyTorchJob/fsdp" in r.output and "Secret/fsdp-hf-token" in r.output
    assert "nothing was created" in said(r)
    assert not (tmp_path / "home" / "started").exists()  # a dry run records nothing


@pytest.mark.parametrize(
    "settings", [{}, {"SHARED_VOLUME": "team-fsx"}, {"CHECKPOINT_PVC": "ckpt"}]
)
def test_job_run_on_eks_refuses_a_claim_that_does_not_exist(peer, settings):  # noqa: F811
    """A pod mounting a missing PersistentVolumeClaim stays Pending ('persistentvolumeclaim "..."
    not found', kube-scheduler's VolumeBinding plugin): `job run` says so before it creates
    anything."""
    from test_kube import add_claim, in_fsdp

    install_operator(peer, **settings)  # creates the shared claim the settings name
    if "CHECKPOINT_PVC" not in settings:
        k = settings.get("SHARED_VOLUME", "fsx-claim")
        from fsdpctl.adapters.kube import Kube

        Kube.connect(kubeconfig=str(peer.kubeconfig)).delete(
            "v1", "PersistentVolumeClaim", k, "fsdp"
        )
    r = cli("job", "run", "-d", **settings)
    assert r.exit_code == 2, r.output
    key = "CHECKPOINT_PVC" if "CHECKPOINT_PVC" in settings else "SHARED_VOLUME"
    assert f"{key}=" in r.output and "no PersistentVolumeClaim" in r.output and "hint:" in r.output
    assert peer.objects("pytorchjobs") == [] and in_fsdp(peer, "secrets") == []
    add_claim(
        peer, "fsdp", settings.get("CHECKPOINT_PVC") or settings.get("SHARED_VOLUME", "fsx-claim")
    )
    assert cli("job", "run", "-d", **settings).exit_code == 0


def test_job_run_on_eks_refuses_a_claim_smaller_than_what_the_job_keeps(peer):  # noqa: F811
    """Issue 27, defect 3, on the cluster: `job run` reads the bound claim's capacity
    (status.capacity.storage, the PV's: the FSx file system's size) and refuses, before creating
    anything, a job that keeps more there than it holds: 7B with CHECKPOINT_KEEP=2 keeps three
    checkpoints of ~75 GiB; a 200Gi claim is one line (exit 2) naming the claim and the size that
    fits; a 1200Gi one runs."""
    from test_kube import in_fsdp, kube

    install_operator(peer)
    k = kube(peer)

    def capacity(size: str) -> None:
        k.request(
            "PATCH",
            k.path("v1", "PersistentVolumeClaim", "fsdp", "fsx-claim", "status"),
            content_type="application/merge-patch+json",
            body={"status": {"phase": "Bound", "capacity": {"storage": size}}},
        )

    capacity("200Gi")
    r = cli("job", "run", "-d", MODEL="7b")
    assert r.exit_code == 2, r.output
    [line] = [x for x in r.output.splitlines() if x.startswith("error:")]
    assert "PersistentVolumeClaim fsx-claim (200Gi) holds 200.0 GiB" in line
    assert "FSX_STORAGE_GIB=1200" in line
    assert peer.objects("pytorchjobs") == [] and in_fsdp(peer, "secrets") == []
    capacity("1200Gi")
    assert cli("job", "run", "-d", MODEL="7b").exit_code == 0

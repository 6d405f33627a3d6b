"""The places the conformance suite runs every backend on, each the most real peer this machine has
(shared/TESTING.md), behind one shape, `Place`:

    local   this machine: the real supervisor, torchrun on CPU with gloo (loopback nodes here, so a
            cell costs seconds; the netns pods have their own suites)
    eks     the Kubernetes API peer (tests/kube_peer.py: discovery, scopes, validation, admission,
            garbage collection as kube-apiserver) with the Training Operator's install applied and
            a cluster behind it (tests/kube_peer_operator.py: the Training Operator v1.9.4's
            PyTorchJob controller, the Job controller, a scheduler and two p5 nodes' kubelets that
            run each pod's container as a process here, CPU and gloo): its jobs train
    slurm   a real Slurm 22.05 cluster (tests/slurm_peer.py: slurmctld, a slurmd per node in its own
            network and UTS namespace, munge), started once per session, its shared file system a
            directory mounted at the same path on every node and here

Every place runs `fsdpctl` both as the real executable (`run`, as from another terminal) and in
process (`invoke`, for a fault injected with monkeypatch), with the same environment. What the place
itself runs for a job (`outside`) is asked of the place, never of fsdpctl: the supervisors and
their processes (by the job's mark), the PyTorchJobs the API holds, the Slurm jobs squeue lists.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from conftest import SHARED, fsdpctl_process, invoke, isolate, prefixed
from fsdpctl.targets import NAMES

VENDOR = SHARED / "vendor"
REGISTRY = "registry.example.com:5000"

# a job every place runs in seconds: one node, one process, the tiny model
TINY = {
    "MODEL": "tiny",
    "SEQ_LEN": "64",
    "MAX_STEPS": "6",
    "WARMUP_STEPS": "2",
    "CHECKPOINT_INTERVAL": "3",
    "PRECISION": "fp32",
    "MAX_RESTARTS": "1",
    "JOB_NODES": "1",
}


def until(what: str, check: Callable[[], Any], timeout: float = 120) -> Any:
    """Poll `check` until it returns something true (a loaded machine: generous deadlines, no fixed
    sleeps)."""
    deadline = time.monotonic() + timeout
    while not (got := check()):
        assert time.monotonic() < deadline, f"{what}: not within {timeout:g} s"
        time.sleep(0.2)
    return got


@dataclass
class Place:
    """One backend on its peer: how fsdpctl is run against it, and what the place runs."""

    name: str
    home: Path
    settings: dict[str, str]
    environ: dict[str, str]
    outside: Callable[[str], list[str]]  # what the place runs (or holds) for job NAME, in words
    # this machine's address as the place's nodes reach it (a hub, a registry served here)
    here: str = "127.0.0.1"
    # the settings that run the job's trainers in a container image the place runs, where it has
    # one of its own to run (Slurm's pyxis + enroot); None: declared in `NO_CONTAINERS`
    container: dict[str, str] | None = None
    # how the place plays a disruption of job NAME (test_paths.CELLS): True when the place itself
    # ended the job (an outside scancel), False when the job goes on by itself
    disrupt: dict[str, Callable[[str], bool]] = field(default_factory=dict)
    cleanups: list[Callable[[], None]] = field(default_factory=list)

    def env(self, **settings: str) -> dict[str, str]:
        return {**self.environ, **prefixed({**self.settings, **settings})}

    def run(
        self, *args: str, timeout: float = 180, **settings: str
    ) -> subprocess.CompletedProcess[str]:
        """The real executable, as from another terminal (in its home, as fsdpctl_process runs it)."""
        self.home.mkdir(parents=True, exist_ok=True)
        return fsdpctl_process(*args, env=self.env(**settings), timeout=timeout)

    def invoke(self, monkeypatch: pytest.MonkeyPatch, *args: str, **settings: str) -> Any:
        """fsdpctl in this process, with the place's environment (for a fault injected here)."""
        for key, value in self.env(**settings).items():
            monkeypatch.setenv(key, value)
        return invoke(*args)

    def ended(self, job: str, **settings: str) -> None:
        """A run of `job` that trained to its end (eks: created, then Succeeded as the operator
        would report it)."""
        r = self.run("job", "run", "-d", JOB_NAME=job, **settings)
        assert r.returncode == 0, r.stderr
        waited = self.run("job", "wait", job, "--timeout", "240", timeout=300, JOB_NAME=job)
        assert waited.returncode == 0, waited.stdout + waited.stderr

    def status(self, job: str) -> dict[str, Any]:
        r = self.run("job", "status", job, "-o", "json", JOB_NAME=job)
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)


# ---- local ---------------------------------------------------------------------------------------------


def local_place(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, root: Path
) -> Iterator[Place]:
    from fsdpctl.backends.local import engine as local

    isolate(monkeypatch, root)
    monkeypatch.setenv("FSDPCTL_LOCAL_NETNS", "0")
    environ = {**os.environ, "FSDPCTL_LOCAL_NETNS": "0"}

    def outside(job: str) -> list[str]:
        """The runs with a process alive: every process of a run carries the run's own token
        (FSDPCTL_RUN, inherited from its supervisor), so one run is one entry however many
        processes it has."""
        prefix = f"{local.RUN_MARK}=".encode()
        runs = {
            v.decode(errors="replace")
            for pid in local.job_processes(job)
            for v in local.environ_of(pid)
            if v.startswith(prefix)
        }
        return sorted(f"run {r.partition('=')[2]}" for r in runs)

    place = Place(
        "local",
        root / "home",
        {"BACKEND": "local", "LOCAL_PROCS_PER_NODE": "1", **TINY},
        environ,
        outside=outside,
    )
    place.disrupt = {
        "killed node": lambda job: _local_kill_node(job),
        "outside end": lambda job: _local_evict(job),
        "controller gone": lambda job: _local_kill_supervisor(job),
    }
    yield place
    _kill_local(place)


def _local_state(job: str) -> dict[str, Any]:
    from fsdpctl.backends.local import engine as local

    found = local.read_state(local.job_dir(job))
    assert found is not None, job
    return found


def _local_kill_node(job: str) -> bool:
    """Every process of node 0's pod at once (a node that dies), by the pod's mark: the operator's
    rule recreates it (137) and the job resumes from its last checkpoint."""
    from fsdpctl.backends.local import engine as local

    st = _local_state(job)
    local.kill_pod(f"{local.job_dir(job)}/{st['run_id']}/node-0")
    return False


def _local_evict(job: str) -> bool:
    """A drain's eviction of node 0's pod: SIGTERM without the stop request (local.evict)."""
    from fsdpctl.backends.local import engine as local

    local.evict(job, 0)
    return False


def _local_kill_supervisor(job: str) -> bool:
    """The controller gone: the supervisor SIGKILLed (an OOM kill); its pods train on, and whoever
    reads the job next judges its end from their output."""
    import signal

    from fsdpctl.backends.local import engine as local

    st = _local_state(job)
    assert local.signal_recorded(st["supervisor"], signal.SIGKILL, st), st.get("supervisor")
    return False


def _kill_local(place: Place) -> None:
    """Every process of the test's local jobs, whatever the test left."""
    import signal

    from fsdpctl import files
    from fsdpctl.backends.local import engine as local

    jobs = place.home / "jobs"
    for jdir in jobs.iterdir() if jobs.is_dir() else []:
        if files.JOB_NAME.fullmatch(jdir.name):
            for pid in local.job_processes(jdir.name):
                local.signal_marked(pid, signal.SIGKILL, local.job_mark(jdir.name))


# ---- eks -----------------------------------------------------------------------------------------------


# a p5 node's one GPU per pod: one trainer process per node, as the other places run
EKS = {"BACKEND": "eks", "IMAGE_REGISTRY": REGISTRY, "GPUS_PER_NODE": "1"}


def eks_place(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, root: Path
) -> Iterator[Place]:
    from kube_peer import Peer
    from kube_peer_operator import Cluster

    isolate(monkeypatch, root)
    peer = Peer(root)
    cluster = Cluster(peer, root / "cluster").start()
    env = {
        "KUBECONFIG": str(peer.kubeconfig),
        "FSDPCTL_MANIFESTS": str(VENDOR),
    }
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    settings = {**EKS, **TINY}
    try:
        _install_operator(peer, settings)
    except BaseException:
        cluster.close()
        peer.close()
        raise

    def outside(job: str) -> list[str]:
        return [
            f"PyTorchJob {o['metadata']['namespace']}/{job}"
            for o in peer.objects("pytorchjobs")
            if o["metadata"]["name"] == job
        ]

    place = Place("eks", root / "home", settings, {**os.environ, **env}, outside=outside)
    place.peer = peer  # type: ignore[attr-defined]
    place.cluster = cluster  # type: ignore[attr-defined]
    place.disrupt = {
        "killed node": lambda job: _eks_kill_pod(cluster, f"{job}-worker-0"),
        "outside end": lambda job: _eks_delete_pod(peer, f"{job}-worker-0"),
        "controller gone": lambda job: _eks_api_away(peer),
    }
    try:
        yield place
    finally:
        cluster.close()
        peer.close()
    assert not cluster.errors, cluster.errors  # a controller's pass that failed, a write refused


def _eks_kill_pod(cluster: Any, pod: str) -> bool:
    """Every process of the pod at once (its node died): exit 137, which the operator retries. A
    pod between two of its container's runs has none for a moment: the next run's are killed."""
    until(f"a process of pod {pod} killed", lambda: cluster.kill("fsdp", pod), timeout=120)
    return False


def _eks_delete_pod(peer: Any, pod: str) -> bool:
    """`kubectl delete pod`: the kubelet's SIGTERM without the stop annotation (an eviction to the
    trainer), SIGKILL after the grace; the operator makes the pod again (143 is retryable)."""
    from fsdpctl.adapters.kube import Kube

    Kube.connect(kubeconfig=str(peer.kubeconfig)).delete("v1", "Pod", pod, "fsdp")
    return False


API_AWAY_S = 8.0


def _eks_api_away(peer: Any) -> bool:
    """The API server away for API_AWAY_S (a control plane upgrade, a proxy's 503s): reads of the
    job fail; the cluster's pods train on."""
    import threading

    peer.api.broken["pytorchjobs"] = (503, b"upstream connect error or disconnect/reset")
    threading.Timer(API_AWAY_S, peer.api.broken.clear).start()
    return False


def _install_operator(peer: Any, settings: dict[str, str]) -> None:
    """The Training Operator's install (`deploy operator`: the cluster runs the operator once its
    Deployment is there, and reports it available) and the shared claim a job's pods mount, as an
    admin leaves them."""
    from fsdpctl.adapters.kube import Kube

    k = Kube.connect(kubeconfig=str(peer.kubeconfig))
    r = invoke(
        *[a for k_, v in settings.items() for a in ("--set", f"{k_}={v}")],
        "deploy",
        "operator",
        "--timeout",
        "30",
    )
    assert r.exit_code == 0, r.output
    k.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "fsdp"}})
    k.apply(
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": "fsx-claim", "namespace": "fsdp"},
            "spec": {
                "accessModes": ["ReadWriteMany"],
                "resources": {"requests": {"storage": "1200Gi"}},
            },
        }
    )


# ---- slurm ---------------------------------------------------------------------------------------------


@contextmanager
def slurm_cluster(root: Path) -> Iterator[Any]:
    """A running 2-node cluster with its shared file system at root/fsx, pyxis and enroot on its
    nodes and the trainer's image (tests/slurm_peer.py, tests/pyxis_peer.py)."""
    import slurm_peer

    with slurm_peer.running(root / "cluster", nodes=2, containers=True) as cluster:
        (root / "fsx").mkdir(exist_ok=True)
        yield cluster


# what a Slurm job of this suite runs: p5 nodes as Slurm sees them, one trainer process each on the
# CPU, gloo
SLURM = {
    "BACKEND": "slurm",
    "INSTANCE_TYPE": "p5.48xlarge",
    "EFA_ENABLED": "false",
    "GPUS_PER_NODE": "1",
    "COLLECTIVE_TIMEOUT": "20",
    "RDZV_JOIN_TIMEOUT": "60",
    "SLURM_PYTHON": sys.executable,
}


def slurm_place(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, root: Path
) -> Iterator[Place]:
    from fsdpctl.settings import setting_keys

    cluster, shared = request.getfixturevalue("slurm_root")

    isolate(monkeypatch, root)
    keys = set(setting_keys())
    environ = {
        k: v
        for k, v in cluster.env.items()
        if k not in keys and not (k.startswith("FSDPCTL_") and k not in ("FSDPCTL_HOME",))
    }
    environ |= {
        "FSDPCTL_HOME": str(root / "home"),
        "NO_COLOR": "1",
        "XDG_STATE_HOME": str(root / "state"),
    }
    monkeypatch.setenv("SLURM_CONF", str(cluster.conf))
    # each test its own corner of the shared file system
    fsx = shared / root.name
    fsx.mkdir(exist_ok=True)

    def outside(job: str) -> list[str]:
        got = cluster.command("squeue", "-h", "-n", job, "-o", "%i %T", check=False).stdout.split(
            "\n"
        )
        return [f"Slurm job {line.strip()}" for line in got if line.strip()]

    place = Place(
        "slurm",
        root / "home",
        {**SLURM, **TINY, "SHARED_VOLUME_PATH": str(fsx)},
        environ,
        outside=outside,
    )
    place.cluster = cluster  # type: ignore[attr-defined]
    place.here = cluster.net.host_address  # the nodes' bridge: their 127.0.0.1 is their own
    if cluster.image is not None:
        import pyxis_peer

        place.container = {
            "SLURM_CONTAINER_IMAGE": str(cluster.image),
            "SLURM_PYTHON": pyxis_peer.IMAGE_PYTHON,  # a path only the image has
        }
    place.disrupt = {
        "killed node": lambda job: _slurm_power_loss(cluster, place, job),
        "outside end": lambda job: _slurm_scancel(cluster, place, job),
        "controller gone": lambda job: _slurm_controller_away(cluster),
    }
    yield place
    for line in outside_all(cluster):
        cluster.command("scancel", line, check=False)


def _slurm_job_id(place: Place, job: str) -> int:
    return int(place.status(job)["scheduler_job"]["id"])


def _slurm_power_loss(cluster: Any, place: Place, job: str) -> bool:
    """A power loss on the job's second node (not the batch host: a batch host lost with its
    step is Slurm's own trouble to resolve, tests/test_slurm_paths.py): every process in its
    namespace SIGKILLed; slurmctld sets it DOWN after SlurmdTimeout and requeues the job
    (sbatch(1) --requeue); the node boots again and the requeued run starts on it."""
    job_id = _slurm_job_id(place, job)
    cluster.kill_node(1)
    until("the requeue", lambda: cluster.job(job_id).get("Restarts") == "1", timeout=180)
    cluster.start_node(1)
    return False


def _slurm_scancel(cluster: Any, place: Place, job: str) -> bool:
    """A plain `scancel` by someone else (an administrator, a script): the job ends CANCELLED,
    which fsdpctl names as a cancel from outside; the test resumes it."""
    cluster.command("scancel", str(_slurm_job_id(place, job)))
    return True


CONTROLLER_AWAY_S = 8.0


def _slurm_controller_away(cluster: Any) -> bool:
    """slurmctld away for CONTROLLER_AWAY_S, then back with its saved state (restart_controller):
    the job's steps train on meanwhile under their slurmstepd. Done from the test's own thread: the
    peer's daemons die with the thread that started them (PR_SET_PDEATHSIG follows the thread, not
    the process: prctl(2)), so a helper thread's slurmctld died as the thread ended."""
    cluster.restart_controller(CONTROLLER_AWAY_S)
    return False


def outside_all(cluster: Any) -> list[str]:
    return cluster.command("squeue", "-h", "-o", "%i", check=False).stdout.split()


def remove_tree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


# the places whose jobs run in no container of the place's own, and why that is not a cell here
NO_CONTAINERS = {
    "local": "the local backend runs this checkout's trainer; the trainer's image has its own test "
    "(tests/test_image.py builds it and runs it)",
    "eks": "the API peer's kubelets run the container's command on this machine: the image is the "
    "cluster's (tests/test_image.py builds the one it pulls)",
}


# ---- the fixtures every module of the suite imports -----------------------------------------------------
PLACES = {"local": local_place, "eks": eks_place, "slurm": slurm_place}


def generate(metafunc: pytest.Metafunc) -> None:
    """Each test module's pytest_generate_tests: `place` once per backend of TARGETS."""
    if "place" in metafunc.fixturenames:
        metafunc.parametrize("place", NAMES, indirect=True)


@pytest.fixture(scope="session")
def slurm_root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[object, Path]]:
    """One Slurm cluster for the session's Slurm cells (its start costs seconds; each test gets a
    directory of its own on its shared file system)."""
    root = tmp_path_factory.mktemp("slurm")
    with slurm_cluster(root) as cluster:
        yield cluster, root / "fsx"


@pytest.fixture
def place(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    name = request.param
    if name not in PLACES:
        pytest.fail(
            f"backend {name} has no place in the conformance suite (tests/conformance/places.py)"
        )
    yield from PLACES[name](request, monkeypatch, tmp_path)

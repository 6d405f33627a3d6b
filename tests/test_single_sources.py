"""One source for each derived value, checked over generated inputs: every reader of a value gives
the answer of its one source, for every instance type, backend, job kind and world shape fsdpctl
accepts.

- EFA interfaces per instance type: `fsdpctl.plan.instances` (terraform's side: tests/test_terraform.py)
- whether a job uses EFA: `Config.uses_efa`
- the hybrid-shard group: `fsdptrain.shapes.hsdp_group_size` / `job_mesh_shape`
- the checkpoint mount: `jobpolicy.POD_CHECKPOINT_ROOT`
- the worker pod: templates/pod.j2, shared by both job kinds
"""

from __future__ import annotations

import itertools
import sys
import types

import pytest

from conftest import ROOT
from fsdpctl.cluster import doctor
from fsdpctl.errors import SettingsError
from fsdpctl.job import kstatus, render
from fsdpctl.job import policy as jobpolicy
from fsdpctl.plan import planner as P
from fsdpctl.plan.instances import INSTANCE_TYPES
from fsdpctl.settings import Config, load
from fsdptrain.config import ConfigError

EFA_CASES = list(
    itertools.product(
        INSTANCE_TYPES, ["eks", "local"], ["true", "false"], ["pytorchjob", "trainjob"]
    )
)
SOCKET_LINE = "node-0:1:1 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.0.1<0>"


def _pod(job: dict) -> dict:
    """The worker pod spec of either job kind."""
    if job["kind"] == "PyTorchJob":
        return job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
    patch = job["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]
    return patch["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]


def _run_fields(job: dict) -> tuple[list[dict], dict]:
    """(env, {requests, limits}) of the trainer container, wherever the job kind keeps them."""
    if job["kind"] == "TrainJob":
        return job["spec"]["trainer"]["env"], job["spec"]["trainer"]["resourcesPerNode"]
    container = _pod(job)["containers"][0]
    return container["env"], container["resources"]


@pytest.mark.parametrize("instance, backend, efa, kind", EFA_CASES)
def test_every_reader_of_efa_agrees_with_the_settings(
    instance, backend, efa, kind, tmp_path, monkeypatch
):
    cfg = load(
        dotenv={"BACKEND": backend, "INSTANCE_TYPE": instance, "EFA_ENABLED": efa, "JOB_KIND": kind}
    )
    interfaces = INSTANCE_TYPES[instance].efa_interfaces
    assert cfg.uses_efa == (backend == "eks" and efa == "true" and interfaces > 0)
    assert cfg.efa_per_node == (interfaces if efa == "true" else 0)
    job = render.render_job(cfg, "r")[-1]
    env, resources = _run_fields(job)
    pod = _pod(job)
    # the pod: the EFA request, the libfabric environment and the root + IPC_LOCK security context
    # together
    assert resources["limits"].get("vpc.amazonaws.com/efa") == (
        interfaces if cfg.uses_efa else None
    )
    assert ({"name": "FI_PROVIDER", "value": "efa"} in env) == cfg.uses_efa
    assert (
        pod["containers"][0]["securityContext"]["capabilities"] == {"add": ["IPC_LOCK"]}
    ) == cfg.uses_efa
    assert pod["securityContext"].get("runAsNonRoot", False) != cfg.uses_efa
    # the cluster: terraform gets the count of plan/instances.py whatever the backend
    tfvars = render.terraform_vars(cfg)
    assert (tfvars["efa_interfaces"], tfvars["efa_enabled"]) == (interfaces, efa == "true")
    # job status warns about a socket fallback, and doctor expects EFA devices, exactly when the job
    # uses EFA
    assert (kstatus.network_path([SOCKET_LINE], cfg.uses_efa)[1] is not None) == cfg.uses_efa
    monkeypatch.setenv("PATH", str(tmp_path))  # no fi_info: the check says whether it expected EFA
    assert doctor.check_efa(cfg).status == (doctor.WARN if cfg.uses_efa else doctor.SKIPPED)


def _trainer_shape(monkeypatch, strategy: str, world: int, local_world: int, hsdp: int):
    """The trainer's answer, twice: its start-up check (`python -m fsdptrain`) and the mesh it
    builds."""
    from fsdptrain import __main__ as entry
    from fsdptrain import parallel

    monkeypatch.setenv("WORLD_SIZE", str(world))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(local_world))
    monkeypatch.setenv("SHARDING_STRATEGY", strategy)
    monkeypatch.setenv("HSDP_SHARD_SIZE", str(hsdp))
    monkeypatch.setitem(sys.modules, "fsdptrain.train", types.SimpleNamespace(run=lambda cfg: 0))
    monkeypatch.setattr(
        parallel, "init_device_mesh", lambda device, shape, mesh_dim_names: tuple(shape)
    )
    started = entry.main([]) == 0
    try:
        shape = parallel.build_mesh(
            "cpu", strategy, world, hsdp_shard_size=hsdp, procs_per_node=local_world
        )
    except ConfigError:
        shape = None
    assert started == (shape is not None)
    return shape


def _settings(**env: str) -> Config | None:
    try:
        return load(dotenv=env)
    except SettingsError as e:
        assert "HSDP_SHARD_SIZE" in str(e)
        return None


@pytest.mark.parametrize("backend", ["eks", "local"])
@pytest.mark.parametrize("nodes", [1, 2, 3, 4])
def test_settings_plan_and_trainer_agree_on_the_hsdp_group(backend, nodes, monkeypatch):
    """Every (nodes, processes per node, HSDP_SHARD_SIZE incl. 0 = default): the settings accept
    exactly what the trainer accepts, with the same group, and `plan` (a cluster job: processes =
    GPUs) agrees."""
    procs_key = "GPUS_PER_NODE" if backend == "eks" else "LOCAL_PROCS_PER_NODE"
    for procs, hsdp in itertools.product(range(1, 9), range(0, 17)):
        cfg = _settings(
            BACKEND=backend,
            JOB_NODES=str(nodes),
            SHARDING_STRATEGY="HYBRID_SHARD",
            HSDP_SHARD_SIZE=str(hsdp),
            **{procs_key: str(procs)},
        )
        shape = _trainer_shape(monkeypatch, "HYBRID_SHARD", nodes * procs, procs, hsdp)
        assert (cfg is not None) == (shape is not None), (nodes, procs, hsdp)
        if cfg is None or shape is None:
            continue
        assert shape == (nodes * procs // (hsdp or procs), hsdp or procs)
        if backend == "eks":
            t = cfg.training
            job = P.Job(
                model=t.model,
                instance_type=cfg.instance_type,
                nodes=cfg.job_nodes,
                gpus_per_node=cfg.gpus,
                strategy=t.sharding_strategy,
                precision=t.precision,
                ac=t.activation_checkpointing,
                ac_every=t.ac_every,
                micro_batch=t.micro_batch_size,
                seq_len=t.seq_len,
                hsdp_shard_size=t.hsdp_shard_size,
            )
            assert (job.world // job.shard_size, job.shard_size) == shape


@pytest.mark.parametrize("strategy", ["FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD"])
def test_other_strategies_ignore_the_hsdp_group(strategy, monkeypatch):
    for nodes, procs in itertools.product([1, 2, 3], [1, 3, 8]):
        cfg = load(
            dotenv={
                "JOB_NODES": str(nodes),
                "LOCAL_PROCS_PER_NODE": str(procs),
                "SHARDING_STRATEGY": strategy,
            }
        )
        world = cfg.world_size
        assert _trainer_shape(monkeypatch, strategy, world, procs, 0) == (
            (world, 1) if strategy == "NO_SHARD" else (world,)
        )


@pytest.mark.parametrize(
    "backend, kind", [("eks", "pytorchjob"), ("eks", "trainjob"), ("local", "pytorchjob")]
)
def test_the_checkpoint_mount_has_one_path(backend, kind):
    cfg = load(
        dotenv={"BACKEND": backend, "JOB_KIND": kind, "JOB_NAME": "ck", "CHECKPOINT_PVC": "fsx"}
    )
    pod = _pod(render.render_job(cfg, "r")[-1])
    env = {e["name"]: e["value"] for e in _run_fields(render.render_job(cfg, "r")[-1])[0]}
    mounts = {m["name"]: m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
    assert mounts["checkpoints"] == jobpolicy.POD_CHECKPOINT_ROOT
    assert env["CHECKPOINT_DIR"] == f"{jobpolicy.POD_CHECKPOINT_ROOT}/ck"
    cleaner = render.render_checkpoint_cleaner(cfg, "ck")["spec"]["containers"][0]
    assert cleaner["volumeMounts"][0]["mountPath"] == jobpolicy.POD_CHECKPOINT_ROOT
    assert cleaner["command"][-1] == f"{jobpolicy.POD_CHECKPOINT_ROOT}/ck"
    for template in (ROOT / "templates").glob("*.j2"):
        assert jobpolicy.POD_CHECKPOINT_ROOT not in template.read_text(), template


@pytest.mark.parametrize(
    "instance, efa, pvc, port",
    list(itertools.product(INSTANCE_TYPES, ["true", "false"], ["", "fsx"], ["", "9300"])),
)
def test_both_job_kinds_run_the_same_pod(instance, efa, pvc, port):
    """pod.j2 serves both kinds: a TrainJob's runtime patch is the PyTorchJob's pod without the two
    fields the patch schema lacks, with image, command, env and resources moved to spec.trainer."""
    env = {"BACKEND": "eks", "INSTANCE_TYPE": instance, "EFA_ENABLED": efa, "CHECKPOINT_PVC": pvc}
    env |= {
        "NODE_SELECTOR": "team=ml",
        "TOLERATIONS": "x=y:NoExecute",
        **({"METRICS_PORT": port} if port else {}),
    }
    pytorchjob = render.render_job(load(dotenv=env), "r")[-1]
    trainjob = render.render_job(load(dotenv={**env, "JOB_KIND": "trainjob"}), "r")[-1]
    full, patch = _pod(pytorchjob), _pod(trainjob)
    run = ("image", "imagePullPolicy", "command", "env", "resources")
    container = {k: v for k, v in full["containers"][0].items() if k not in {"name", *run}}
    assert patch["containers"] == [{"name": "node", **container}]
    assert {k: v for k, v in full.items() if k != "containers"} == {
        **{k: v for k, v in patch.items() if k != "containers"},
        "automountServiceAccountToken": False,
    }
    assert _run_fields(pytorchjob) == _run_fields(trainjob)
    template = trainjob["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]
    assert (
        template["replicatedJobs"][0]["template"]["spec"]["template"]["metadata"]
        == (pytorchjob["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["metadata"])
    )

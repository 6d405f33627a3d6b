"""The paths a Slurm job takes beyond the plain one (issue 36), each on the real Slurm peer of
tests/slurm_peer.py: Debian's slurm-wlm 22.05.8 (slurmctld, one slurmd per simulated node in its own
network and UTS namespace, munge), with NVIDIA's pyxis v0.24.0 and enroot v4.1.2 built from
../shared/vendor for the container cases (tests/pyxis_peer.py), the Hugging Face Hub's HTTP contract
served by tests/hub_peer.py on the nodes' bridge, the real trainer on CPU with gloo, driven through
the fsdpctl CLI as a user's shell would.

    a Hub model                the download runs online on the first node, the trainers offline
    a container                the download and the trainers in the image, the job's HF_HOME over
                               the image's ENV
    `job stop`                 one SIGTERM per process: the stop checkpoint is written
    an outside `scancel`       the trainer names the scheduler, the job reads as cancelled outside
    a SIGKILLed slurmd         requeued once, the node's leftover step aborted, resumed with every
                               loss equal to an uninterrupted run's; a run that had finished when
                               the requeue came ends Succeeded

Each test's wall time on this 2-core machine is in its docstring (measured with `pytest
--durations`, idle machine).
"""

from __future__ import annotations

import json
import re
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

import hub_peer
import pyxis_peer
import slurm_peer
from conftest import fsdpctl_process as fsdpctl
from conftest import logged_events, prefixed, scaled
from fsdpctl.backends.slurm import states
from fsdptrain import events

MODEL = "org/tiny-llama"
# a tiny job: 2 nodes, one process each, gloo on CPU
RUN = {
    "BACKEND": "slurm",
    "INSTANCE_TYPE": "p5.48xlarge",
    "EFA_ENABLED": "false",
    "GPUS_PER_NODE": "1",
    "SEQ_LEN": "64",
    "PRECISION": "fp32",
    "MAX_STEPS": "12",
    "WARMUP_STEPS": "2",
    "CHECKPOINT_INTERVAL": "4",
    "MAX_RESTARTS": "2",
    "COLLECTIVE_TIMEOUT": "20",
    "RDZV_JOIN_TIMEOUT": "60",
}


def env_for(cluster, root: Path, name: str, **settings: str) -> dict[str, str]:
    """fsdpctl's environment for one job on the peer: its own FSDPCTL_HOME, the shared file system
    under `root`, the tests' Python on the nodes, no setting of this machine's."""
    from fsdpctl.settings import setting_keys

    keys = set(setting_keys())
    (root / "home").mkdir(exist_ok=True)
    (root / "fsx").mkdir(exist_ok=True)  # the shared file system, mounted where fsdpctl runs
    base = {k: v for k, v in cluster.env.items() if k not in keys and not k.startswith("FSDPCTL_")}
    shared = {"SHARED_VOLUME_PATH": str(root / "fsx"), "SLURM_PYTHON": sys.executable}
    return (
        base
        | {"FSDPCTL_HOME": str(root / "home"), "NO_COLOR": "1"}
        | prefixed(RUN | shared | {"JOB_NAME": name} | settings)
    )


def status(env: dict[str, str]) -> dict:
    got = fsdpctl("job", "status", "-o", "json", env=env)
    assert got.returncode == 0, got.stderr
    return json.loads(got.stdout)


def losses(env: dict[str, str]) -> dict[int, float]:
    text = fsdpctl("job", "logs", "-o", "json", env=env).stdout
    return {e.step: e.loss for e in logged_events(text) if isinstance(e, events.Step)}


def run_dir(env: dict[str, str]) -> Path:
    found = list(
        (Path(env["FSDPCTL_SHARED_VOLUME_PATH"]) / "fsdpctl/slurm").glob(
            f"{env['FSDPCTL_JOB_NAME']}/*/job.sbatch"
        )
    )
    assert len(found) == 1, found
    return found[0].parent


def leader_step(env: dict[str, str]) -> int:
    log = run_dir(env) / "node-0.log"
    lines = log.read_text(errors="replace").splitlines() if log.exists() else []
    return max((e.step for e in events.parse(lines) if isinstance(e, events.Step)), default=0)


def until(what: str, check, timeout: float = 240):
    """Poll `check` until true; the deadline stretched by the machine's load (conftest.scaled)."""
    timeout = scaled(timeout)
    deadline = time.monotonic() + timeout
    while not (got := check()):
        assert time.monotonic() < deadline, f"{what}: not within {timeout:g} s"
        time.sleep(0.3)
    return got


def said(cluster, env: dict[str, str]) -> str:
    """What a failed assertion shows: the run's batch log and the daemons' last lines."""
    batch = run_dir(env) / "batch.log"
    text = batch.read_text(errors="replace")[-3000:] if batch.exists() else "(no batch log)"
    return f"--- batch.log\n{text}\n{cluster.logs(40)}"


def run_to_end(env: dict[str, str]) -> dict:
    """`job run` followed to its end; the final status."""
    ran = fsdpctl("job", "run", env=env, timeout=scaled(600))
    assert ran.returncode == 0, (ran.stdout[-2000:], ran.stderr[-3000:])
    return status(env)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory, assets) -> Path:
    """A real (tiny) Llama checkpoint in the Hub's layout (safetensors, config, tokenizer), saved
    with transformers' own save_pretrained, as tests/test_prestep.py serves it."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    out = tmp_path_factory.mktemp("tiny-llama")
    tokenizer = AutoTokenizer.from_pretrained(str(assets[1]))
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=256,
    )
    LlamaForCausalLM(config).save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    return out


@contextmanager
def hub_job(cluster, tmp_path, name: str, tiny_model: Path, **settings: str):
    """A hub peer on the nodes' bridge serving MODEL, and the job's environment pointing at it
    (HF_ENDPOINT reaches the job as sbatch exports the submitting environment, sbatch(1) --export)."""
    with hub_peer.running(host=cluster.net.host_address) as peer:
        peer.add_dir("model", MODEL, tiny_model)
        env = env_for(cluster, tmp_path, name, PRETRAINED=MODEL, **settings)
        env["HF_ENDPOINT"] = peer.endpoint
        yield peer, env


def _assert_trained_from_the_hub(env: dict[str, str], peer, final: dict) -> None:
    assert final["phase"] == "Succeeded", final
    assert sorted(losses(env)) == list(range(1, int(RUN["MAX_STEPS"]) + 1))
    assert peer.downloads(".safetensors") == 1  # once for the job, by the download step
    cache = Path(env["FSDPCTL_SHARED_VOLUME_PATH"]) / "hf-cache" / "hub"
    snapshot = next((cache / "models--org--tiny-llama" / "snapshots").iterdir())
    assert (snapshot / "model.safetensors").is_file()
    batch = (run_dir(env) / "batch.log").read_text()
    fetched = [json.loads(x) for x in batch.splitlines() if x.startswith('{"event":"fetch"')]
    assert fetched and fetched[-1]["state"] == "complete", batch[-2000:]


@pytest.mark.slow
def test_a_hub_model_downloads_online_and_trains_offline(tmp_path, tiny_model):
    """S1. huggingface_hub reads HF_HUB_OFFLINE once, at import (constants.py:
    `HF_HUB_OFFLINE = _is_true(os.environ.get("HF_HUB_OFFLINE") ...)`), and then refuses every
    request (utils/_http.py: OfflineModeIsEnabled). The script exported it for the trainers before
    it ran the download, so every job with a Hub model failed before `srun`. Now the download is a
    step of its own without it (`env -u HF_HUB_OFFLINE`, also when the submitting shell had it set:
    set here), the trainers keep it: the job trains to MAX_STEPS from the one download, on two nodes
    of the real peer. ~40 s here."""
    with slurm_peer.running(tmp_path / "cluster", nodes=2) as cluster:
        with hub_job(cluster, tmp_path, "hub", tiny_model) as (peer, env):
            env["HF_HUB_OFFLINE"] = "1"  # a login shell that had it: sbatch passes it on
            final = run_to_end(env)
            _assert_trained_from_the_hub(env, peer, final)


@pytest.mark.slow
def test_a_container_job_downloads_and_trains_in_its_image_with_the_jobs_hf_home(
    tmp_path, tiny_model
):
    """S2 and S3, with real pyxis + enroot (the peer with containers=True). The image's
    /etc/environment sets HF_HOME=/opt/image-hf-home as a Dockerfile's ENV would (enroot
    src/docker.sh writes an image's Env there); pyxis lets the image's values win over the job's
    exported ones except the names given to --container-env (pyxis v0.24.0
    pyxis_slurmstepd.c spank_import_container_env: `overwrite = 1` unless the name is in
    --container-env; args.c: "their existing values in the image take precedence"). And the
    container options apply to `srun` (pyxis README "Usage"), so the download runs as a one-task
    step in the image, not in the batch shell with the node's python. The job trains to MAX_STEPS:
    the download went to the job's HF_HOME on the shared file system (nothing was written at the
    image's), and both steps ran in containers (slurmd's log: "pyxis: starting container"). ~60 s
    here."""
    with slurm_peer.running(tmp_path / "cluster", nodes=2, containers=True) as cluster:
        assert cluster.image is not None
        # the image's own python: a path the batch shell on the node does not have
        settings = {"SLURM_CONTAINER_IMAGE": str(cluster.image)}
        settings["SLURM_PYTHON"] = pyxis_peer.IMAGE_PYTHON
        with hub_job(cluster, tmp_path, "boxed", tiny_model, **settings) as (peer, env):
            final = run_to_end(env)
            _assert_trained_from_the_hub(env, peer, final)
        logs = "".join(p.read_text() for p in (cluster.root / "log").glob("slurmd-node*.log"))
        job = final["scheduler_job"]["id"]
        # step 0: the download on the first node; step 1: the trainers on both
        assert f"[{job}.0] pyxis: starting container" in logs
        assert logs.count(f"[{job}.1] pyxis: starting container") == 2, logs[-3000:]
        # what the trainer saw: the job's HF_HOME, in a container whose own said otherwise
        leader = (run_dir(env) / "node-0.log").read_text()
        assert "/opt/image-hf-home" not in leader


@pytest.mark.slow
def test_a_stop_writes_its_checkpoint_and_an_outside_scancel_is_named(tmp_path):
    """S6. `scancel --signal=TERM` reaches every process of the job's steps: slurmstepd signals the
    step's whole container through the proctrack plugin (Slurm 22.05 slurmd/slurmstepd/req.c
    _handle_signal_container; proctrack/linuxproc here, proctrack/cgroup on a cluster: every
    process). torchrun has its SIGTERM from Slurm; the launcher forwarding another one reached
    torchrun inside its shutdown, which torch's handler turns into a second SignalException
    (torch/distributed/elastic/multiprocessing/api.py _terminate_process_handler) out of `_close`'s
    wait for the workers: the workers, still writing the stop checkpoint, were killed with the step.
    With a save that takes 4 s (FSDPTRAIN_FAILPOINT=slow-save), `job stop` ends the job Stopped,
    with the trainer's stop summary and its checkpoint published.
    Then a job cancelled from outside fsdpctl (`scancel JOB`: SIGTERM to the batch shell and every
    step, scancel(1)) ends CANCELLED without the stop request: the trainer says the scheduler sent
    the SIGTERM (not "pod evicted"), and states.outside_cancel names it for `status`. ~90 s here."""
    with slurm_peer.running(tmp_path / "cluster", nodes=2) as cluster:
        env = env_for(cluster, tmp_path, "stopped", MAX_STEPS="200")
        env["FSDPTRAIN_FAILPOINT"] = "slow-save:4"  # sbatch exports it to the trainers
        assert fsdpctl("job", "run", "--detach", env=env).returncode == 0
        until("step 2", lambda: leader_step(env) >= 2)
        stopped = fsdpctl("job", "stop", env=env, timeout=scaled(300))
        assert stopped.returncode == 0, stopped.stderr
        final = status(env)
        assert final["phase"] == "Stopped" and final["summary"]["stopped"], final
        assert final["summary"]["stop_reason"] == "stop", final["summary"]
        steps = final["summary"]["steps"]
        ckpt = Path(env["FSDPCTL_SHARED_VOLUME_PATH"]) / "checkpoints" / "stopped"
        assert (ckpt / f"step-{steps:08d}" / "meta.json").is_file()
        assert (ckpt / "latest").read_text().strip() == f"step-{steps:08d}"
        # each torchrun re-raises its one SignalException once its shutdown is done (elastic/agent/
        # server/api.py `run`); a second signal would show as another (tests/test_launch_signals)
        for node in (0, 1):
            log = (run_dir(env) / f"node-{node}.log").read_text()
            assert log.count("got signal: 15") == 1, log[-3000:]

        outside = env_for(cluster, tmp_path, "cancelled", MAX_STEPS="400")
        assert fsdpctl("job", "run", "--detach", env=outside).returncode == 0
        until("step 2", lambda: leader_step(outside) >= 2)
        job = status(outside)["scheduler_job"]["id"]
        cluster.command("scancel", str(job))
        until("cancelled", lambda: cluster.job(job)["JobState"] == "CANCELLED")
        record = cluster.job(job)
        assert states.outside_cancel(record, stop_requested=False)
        assert not states.outside_cancel(record, stop_requested=True)
        log = run_dir(outside) / "node-0.log"
        until(
            "the trainer's line",
            lambda: "SIGTERM from the scheduler" in log.read_text(errors="replace"),
            timeout=60,
        )
        assert "pod evicted" not in log.read_text(errors="replace")


def _kill_slurmd_until_requeued(cluster, env: dict[str, str], node: int) -> str:
    """SIGKILL node N's slurmd (its steps keep running) and wait for slurmctld to set the node
    DOWN and requeue the job (job_mgr.c kill_running_job_by_node_name after SlurmdTimeout: slurm.conf
    (5) JobRequeue=1 and sbatch --requeue); the job id."""
    job = status(env)["scheduler_job"]["id"]
    cluster.kill_slurmd(node)
    until("the requeue", lambda: cluster.job(job)["Restarts"] == "1", timeout=120)
    return job


@pytest.mark.slow
def test_a_killed_slurmd_requeues_once_and_the_run_resumes_with_exact_losses(tmp_path):
    """The slurmd-kill fault on the real peer: SIGKILL to one node's slurmd alone mid-job (a crash
    or an OOM kill of the daemon): its slurmstepd and the trainer there keep running; slurmctld
    sets the node DOWN after SlurmdTimeout and requeues the job (sbatch(1) --requeue). When the
    node's slurmd comes back it registers reporting the earlier run's step, and slurmctld sends the
    node an abort for the job id (job_mgr.c validate_jobs_on_node: "Registered PENDING JobId=..
    on node"; abort_job_on_node) while it schedules the requeued run onto that node in the same
    instant; the abort revokes the job's credentials up to its second and kills every step of the
    job there (slurmd/req.c _rpc_abort_job; slurm_cred.c _credential_revoked), the new one
    included: before, that ended the requeued run FAILED within a second with restarts unused.
    The script now starts the trainers' step again when Slurm ended it (a task killed by a signal,
    not an exit code of the trainers), after the abort is through: the run resumes from the last
    checkpoint on the shared file system, Restarts=1, and every step's loss equals the
    uninterrupted reference run's (abs 1e-6).
    Second, a job whose trainers finish before slurmctld sets the node DOWN (a small MAX_STEPS: the
    node's tasks keep training for SlurmdTimeout) is requeued with its last checkpoint at MAX_STEPS:
    the requeued copy says so and ends 0 (fsdptrain.launch.already_finished), Succeeded, where
    before it refused that checkpoint (exit 2) and the job FAILED. ~3 min here."""
    with slurm_peer.running(tmp_path / "cluster", nodes=2) as cluster:
        ref = env_for(cluster, tmp_path, "ref", MAX_STEPS="24")
        reference = losses(ref) if run_to_end(ref)["phase"] == "Succeeded" else {}
        assert sorted(reference) == list(range(1, 25))

        # 1. mid-run: saves of 2 s keep the trainers busy well past the requeue
        env = env_for(cluster, tmp_path, "killed", MAX_STEPS="24", CHECKPOINT_INTERVAL="2")
        env["FSDPTRAIN_FAILPOINT"] = "slow-save:2"
        assert fsdpctl("job", "run", "--detach", env=env).returncode == 0
        latest = Path(env["FSDPCTL_SHARED_VOLUME_PATH"]) / "checkpoints" / "killed" / "latest"
        until("a checkpoint", lambda: latest.exists())
        job = _kill_slurmd_until_requeued(cluster, env, node=1)
        # the node returns once the requeued job could start but for it: registration, abort and
        # the new run's launch there all at once
        until(
            "the requeued job waiting for the node",
            lambda: cluster.job(job)["Reason"] not in ("BeginTime", "None"),
            timeout=120,
        )
        cluster.start_node(1)
        waited = fsdpctl("job", "wait", "--timeout", "400", env=env, timeout=scaled(430))
        final = status(env)
        assert waited.returncode == 0 and final["phase"] == "Succeeded", said(cluster, env)
        assert final["restarts"] == 1 and cluster.job(job)["Restarts"] == "1"
        got = losses(env)
        assert sorted(got) == list(range(1, 25))
        for step in range(1, 25):
            assert got[step] == pytest.approx(reference[step], abs=1e-6), step
        assert final["summary"]["start_step"] > 0  # resumed, not started over
        batch = (run_dir(env) / "batch.log").read_text()
        assert re.search(r"start 1 on node0", batch), batch

    # 2. finished before the requeue came, on a cluster of its own: after the fault above the
    # earlier run's step 0 lives on node1 for about a minute (the requeued run's step 0 took its
    # spool socket name, so slurmd's kill never reached it), and killing that slurmd again
    # meanwhile got the node DRAINED "Kill task failed" (ESLURMD_KILL_TASK_FAILED,
    # slurmstepd/step_terminate_monitor.c) in 2 of 3 runs here
    with slurm_peer.running(tmp_path / "cluster2", nodes=2) as cluster:
        done = env_for(cluster, tmp_path, "finished", MAX_STEPS="6", CHECKPOINT_INTERVAL="3")
        assert fsdpctl("job", "run", "--detach", env=done).returncode == 0
        until("a checkpoint", lambda: leader_step(done) >= 1)
        job = _kill_slurmd_until_requeued(cluster, done, node=1)
        cluster.start_node(1)
        waited = fsdpctl("job", "wait", "--timeout", "300", env=done, timeout=scaled(330))
        final = status(done)
        assert waited.returncode == 0 and final["phase"] == "Succeeded", said(cluster, done)
        assert cluster.job(job)["Restarts"] == "1"
        leader = (run_dir(done) / "node-0.log").read_text()
        assert "this run already trained to MAX_STEPS=6" in leader, leader[-2000:]

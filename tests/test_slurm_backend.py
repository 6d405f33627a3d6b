"""BACKEND=slurm (issue 32): the job as a Slurm batch script, submitted with sbatch and watched with
scontrol.

Fast tests read the rendered script against awsome-distributed-training's FSDP sbatch
(3.test_cases/pytorch/FSDP/slurm/llama2_7b-training.sbatch at 03282a1a, "awsome" below) and Slurm
22.05's own documentation and source (SchedMD/slurm, tag slurm-22-05-8-1: doc/man/man1/sbatch.1,
srun.1, squeue.1, scancel.1), run it with real bash and a recording `srun` in place of Slurm's, and
read `scontrol -o show job` records captured from the real peer (tests/slurm_scontrol_22.05.json:
Debian slurm-wlm 22.05.8, the tests/slurm_peer.py cluster). The one slow test runs the whole job
under that peer: real slurmctld, one slurmd per simulated node in its own network and UTS namespace,
the real trainer on CPU across two nodes.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import slurm_peer
from conftest import ROOT, logged_events, prefixed
from conftest import fsdpctl_process as fsdpctl
from fsdpctl.backends.slurm import script, states
from fsdpctl.job import spec as jobspec
from fsdpctl.settings import Settings, load
from fsdptrain import events

CAPTURED = json.loads((ROOT / "tests" / "slurm_scontrol_22.05.json").read_text())
P5 = {"BACKEND": "slurm", "INSTANCE_TYPE": "p5.48xlarge", "JOB_NODES": "4", "MODEL": "7b"}
# a recording srun: its arguments and environment, one JSON line per call
SRUN = """#!/bin/sh
exec python3 -c 'import json, os, sys
print(json.dumps({"argv": sys.argv[1:], "env": dict(os.environ)}))' "$@" >> "$SRUN_CALLS"
"""


def cfg_of(**flags: str):
    return load(environ={}, flags={**P5, **flags})


def directives(text: str) -> list[str]:
    return [
        line.removeprefix("#SBATCH ") for line in text.splitlines() if line.startswith("#SBATCH ")
    ]


def trainer_srun(text: str) -> str:
    """The script's line that starts the trainers (inside its try loop), without the `|| rc=$?`."""
    line = next(x.strip() for x in text.splitlines() if " fsdptrain.launch " in x)
    assert line.startswith("srun ") and line.endswith(" || rc=$?"), line
    return line.removesuffix(" || rc=$?")


def run_script(
    tmp_path: Path, text: str, **env: str
) -> tuple[subprocess.CompletedProcess[str], list[dict]]:
    """The script under real bash, as slurmstepd starts it on the first node (sbatch(1): "a single
    copy of the batch script on the first node"), with Slurm's output environment and srun recording
    its call."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "srun").write_text(SRUN)
    (bin_dir / "srun").chmod(0o755)
    calls = tmp_path / "srun.jsonl"
    calls.unlink(missing_ok=True)
    path = tmp_path / "job.sbatch"
    path.write_text(text)
    base = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "SRUN_CALLS": str(calls)}
    base |= {"SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST": "node[0-3]"}
    got = subprocess.run(
        ["bash", str(path)], env=base | env, capture_output=True, text=True, timeout=30
    )
    said = [json.loads(line) for line in calls.read_text().splitlines()] if calls.exists() else []
    return got, said


# ---- the script --------------------------------------------------------------------------------------------


def test_the_p5_script_reads_like_awsome_fsdp_sbatch():
    """awsome: `#SBATCH --nodes=4`, `--exclusive`; GPUS_PER_NODE=8 "for P4/P5" as torchrun's
    --nproc_per_node; --nnodes=$SLURM_JOB_NUM_NODES, --rdzv_id=$SLURM_JOB_ID, --rdzv_backend=c10d,
    --rdzv_endpoint=$(hostname) evaluated by the batch script (on the first node); `NCCL_DEBUG=INFO` and
    `FI_PROVIDER=efa`; the checkpoint and resume directory on the shared file system. Here the same, from
    the pods' own environment (jobpolicy.pod_env: FI_EFA_USE_DEVICE_RDMA=1, FI_EFA_FORK_SAFE=1, which awsome's
    Kubernetes template says "for P5 ... should be uncommented"), the port c10d's default 29400 (torchrun
    --rdzv-endpoint: "host[:port]"), a fresh rendezvous id per requeue, and --open-mode=append so that a
    requeued job's output is not truncated (sbatch.1 --open-mode)."""
    cfg = cfg_of()
    text = script.render_script(cfg, "fsdp-r1")
    opts = directives(text)
    assert {
        "--nodes=4",
        "--ntasks-per-node=1",
        "--exclusive",
        "--open-mode=append",
        "--requeue",
    } <= set(opts)
    assert "--job-name=fsdp" in opts
    assert "export FI_PROVIDER=efa" in text and "export NCCL_DEBUG=INFO" in text
    assert "export FI_EFA_USE_DEVICE_RDMA=1" in text and "export FI_EFA_FORK_SAFE=1" in text
    assert "export CHECKPOINT_DIR=/fsx/checkpoints/fsdp" in text
    assert 'head="$(hostname)"' in text and 'rdzv_id="${SLURM_JOB_ID}-${restarts}-${try}"' in text
    srun = trainer_srun(text)
    for arg in (
        "--nnodes=4",
        "--nproc-per-node=8",
        "--rdzv-backend=c10d",
        '--rdzv-endpoint="$head":29400',
    ):
        assert f" {arg} " in srun, arg
    assert srun.endswith(" -m fsdptrain") and " -m fsdptrain.launch " in srun
    assert "--container-image" not in text  # no image: the nodes' own Python


def test_a_container_image_goes_to_pyxis_and_hyperpod_gets_auto_resume():
    """awsome: `srun ${AUTO_RESUME} -l --container-image $CONTAINER_IMAGE --container-mounts
    $FSX_MOUNT` (pyxis's options, NVIDIA/pyxis README), AUTO_RESUME="--auto-resume=1" only `if [ -d
    "/opt/sagemaker_cluster" ]` (SageMaker HyperPod's resiliency: "srun --auto-resume=1", AWS
    HyperPod docs). The shared file system is mounted at the same path inside the container.
    Debian's Slurm has neither pyxis nor --auto-resume, so these are read as the script's words."""
    cfg = cfg_of(SLURM_CONTAINER_IMAGE="/fsx/pytorch-fsdp.sqsh", SHARED_VOLUME_PATH="/fsx")
    text = script.render_script(cfg, "fsdp-r1")
    srun = trainer_srun(text)
    words = shlex.split(srun.replace('${auto_resume[@]+"${auto_resume[@]}"}', "AUTO"))
    assert words[:2] == ["srun", "AUTO"]
    assert (
        "--container-image=/fsx/pytorch-fsdp.sqsh" in words
        and "--container-mounts=/fsx:/fsx" in words
    )
    assert "if [ -d /opt/sagemaker_cluster ]; then auto_resume=(--auto-resume=1); fi" in text


@settings(
    max_examples=20,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    nodes=st.integers(1, 64),
    gpus=st.sampled_from(["0", "1", "4", "8"]),
    restarts=st.integers(0, 5),
    name=st.from_regex(r"[a-z][a-z0-9-]{0,20}[a-z0-9]", fullmatch=True),
    token=st.from_regex(r"hf_[A-Za-z0-9]{30}", fullmatch=True),
)
def test_the_script_runs_one_torchrun_task_per_node_with_the_pods_environment(
    tmp_path, nodes, gpus, restarts, name, token
):
    """Real bash runs the script with a recording srun: exactly one srun call, one task per node
    (srun.1 --ntasks-per-node), each node's output in its own appended file (%n: "Node identifier
    relative to current job"), the launcher's torchrun arguments with $head and the rendezvous id
    expanded (SLURM_JOB_ID 77, SLURM_RESTART_COUNT unset on a first run: sbatch.1 OUTPUT ENVIRONMENT
    VARIABLES), and the environment the EKS pod gets (script.trainer_env) exported to it. The HF
    token set as HF_TOKEN is nowhere in the script (sbatch passes it from the submitting
    environment)."""
    shared = str(tmp_path / "fsx")
    flags = {
        "JOB_NODES": str(nodes),
        "GPUS_PER_NODE": gpus,
        "MAX_RESTARTS": str(restarts),
        "JOB_NAME": name,
    }
    cfg = cfg_of(**flags, SHARED_VOLUME_PATH=shared, HF_TOKEN=token)
    text = script.render_script(cfg, f"{name}-r1")
    assert token not in text
    assert ("--requeue" if restarts else "--no-requeue") in directives(text)
    got, calls = run_script(tmp_path, text)
    assert got.returncode == 0, got.stderr
    assert len(calls) == 1
    argv, env = calls[0]["argv"], calls[0]["env"]
    root = script.paths(cfg, f"{name}-r1").root
    assert argv[:5] == [
        f"--nodes={nodes}",
        "--ntasks-per-node=1",
        "--kill-on-bad-exit=1",
        f"--output={root}/node-%n.log",
        "--open-mode=append",
    ]
    head = subprocess.run(["hostname"], capture_output=True, text=True).stdout.strip()
    launch = argv[5:]
    assert launch[:3] == ["python3", "-m", "fsdptrain.launch"]
    assert launch[3:8] == [
        f"--nnodes={nodes}",
        f"--nproc-per-node={cfg.gpus}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={head}:29400",
        "--rdzv-id=77-0-1",
    ]
    assert launch[-3:] == [f"--max-restarts={restarts}", "-m", "fsdptrain"]
    for key, value in script.trainer_env(jobspec.build(cfg, f"{name}-r1"), cfg).items():
        assert env[key] == value, key
    assert Path(root).is_dir()  # made before srun: its --output files go there


def test_a_requeue_beyond_max_restarts_ends_the_job_before_any_trainer_starts(tmp_path):
    """A requeued job runs the script again "from its beginning" (sbatch.1 --requeue) with
    SLURM_RESTART_COUNT set; Slurm 22.05's own bound is MAX_BATCH_REQUEUE, 5, compiled in
    (src/slurmctld/ slurmctld.h; job_mgr.c holds the job with reason JobHoldMaxRequeue past it), so
    the script bounds it at MAX_RESTARTS: restart 2 of MAX_RESTARTS=2 still trains, restart 3 exits
    1 before srun, naming the setting."""
    cfg = cfg_of(MAX_RESTARTS="2", SHARED_VOLUME_PATH=str(tmp_path / "fsx"))
    text = script.render_script(cfg, "fsdp-r1")
    got, calls = run_script(tmp_path, text, SLURM_RESTART_COUNT="2")
    assert got.returncode == 0 and "--rdzv-id=77-2-1" in calls[0]["argv"]
    got, calls = run_script(tmp_path, text, SLURM_RESTART_COUNT="3")
    assert got.returncode == 1 and not calls
    assert "restart 3 exceeds MAX_RESTARTS=2" in got.stderr


def test_max_restarts_zero_submits_no_requeue():
    """sbatch.1 --no-requeue: "Specifies that the batch job should never be requeued under any
    circumstances"; a node failure then ends it NODE_FAIL (seen on the peer, test_slurm_peer)."""
    assert "--no-requeue" in directives(script.render_script(cfg_of(MAX_RESTARTS="0"), "r"))


MEANINGLESS = sorted(script.MEANINGLESS)


def _other_value(key: str) -> str:
    return {
        "JOB_KIND": "trainjob",
        "CHECKPOINT_PVC": "ckpt",
        "NODE_SELECTOR": "a=b",
        "TOLERATIONS": "gpu",
        "SCHEDULER_NAME": "volcano",
        "GANG_SCHEDULING": "true",
        "HUGEPAGES_2MI": "5120Mi",
        "LOCAL_PROCS_PER_NODE": "2",
        "RDZV_BACKEND": "etcd",
        "KUBE_CONTEXT": "ctx",
    }[key]


@settings(
    max_examples=12,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(keys=st.lists(st.sampled_from(MEANINGLESS), min_size=1, max_size=3, unique=True))
def test_settings_that_mean_nothing_on_slurm_are_refused_with_one_line(cli, keys):
    """Every Kubernetes-only or local-only setting, set away from its default, is refused by
    admission (`config validate`, with --force too, `manifest`, `job run`) with exit 2 and one line
    per key naming it, its value and where it was set; nothing is written (no run record, no Slurm
    job record). Each key alone reaches the Slurm refusal."""
    flags = [arg for key in keys for arg in ("--set", f"{key}={_other_value(key)}")]
    verbs = (
        ["config", "validate"],
        ["config", "validate", "--force"],
        ["manifest"],
        ["job", "run"],
    )
    for verb in verbs:
        result = cli("--set", "BACKEND=slurm", *flags, *verb)
        assert result.exit_code == 2, result.output
        lines = result.stderr.strip().splitlines()
        # a combination the settings refuse anyway (GANG_SCHEDULING without SCHEDULER_NAME) says so
        # first
        assert any(lines[0].startswith(f"error: {key}=") for key in keys), lines
        if "GANG_SCHEDULING" not in keys:
            for key in keys:
                assert any(
                    li.startswith(f"error: {key}=") and "means nothing on Slurm" in li
                    for li in lines
                ), (key, lines)
        assert not (cli.home / "slurm").exists() and not (cli.home / "records").exists()


@pytest.mark.parametrize("key", [k for k in MEANINGLESS if k != "GANG_SCHEDULING"])
def test_each_meaningless_key_alone_gets_the_slurm_refusal(cli, key):
    shown = repr(_other_value(key)) if key not in ("LOCAL_PROCS_PER_NODE",) else _other_value(key)
    for verb in (["manifest"], ["config", "validate"]):
        result = cli("--set", "BACKEND=slurm", "--set", f"{key}={_other_value(key)}", *verb)
        assert result.exit_code == 2
        assert result.stderr.startswith(f"error: {key}={shown} (--set) means nothing on Slurm: "), (
            result.stderr
        )


def test_meaningless_keys_are_settings_with_defaults():
    """The refusal compares with each key's own default: a renamed key fails here, not silently."""
    assert all(key.lower() in Settings.model_fields for key in script.MEANINGLESS)


def test_manifest_prints_the_script(cli):
    """`fsdpctl manifest` on Slurm prints the batch script `job run` submits (same settings, same
    run id: the same text); Kubernetes-only output options are refused."""
    result = cli("--set", "BACKEND=slurm", "--set", "MODEL=tiny", "manifest", "--run-id", "fsdp-r9")
    assert result.exit_code == 0, result.output
    assert result.stdout == script.render_script(
        load(environ={}, flags={"BACKEND": "slurm", "MODEL": "tiny"}), "fsdp-r9"
    )
    assert cli("--set", "BACKEND=slurm", "manifest", "--validate").exit_code == 2


CLOSED = """ClusterName=nowhere
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={port}
NodeName=n0 CPUs=1
PartitionName=p Nodes=ALL Default=YES
"""


@pytest.mark.skipif(
    shutil.which("sbatch") is None, reason="no Slurm client here (scripts/system-deps)"
)
@pytest.mark.slow  # 3-7 s: the fast lane keeps under 2 minutes; no training processes, so
@pytest.mark.beside  # CI runs it beside the serial slow lane
def test_an_unreachable_slurmctld_is_one_line_within_request_timeout_and_leaves_nothing(
    cli, tmp_path, monkeypatch
):
    """Peer: Debian's real sbatch and scontrol (slurm-client 22.05) with a slurm.conf whose
    controller port nothing listens on. They retry the connection (measured here: sbatch 18 s,
    scontrol 9 s, then "Unable to contact slurm controller (connect failure)"); fsdpctl waits
    REQUEST_TIMEOUT (2 s here) and says which command did not answer, exit 1. A failed `job run`
    leaves no run record, no state and not the run's directory it made on the shared file system.
    A job whose controller does not answer is Unknown in `job status`, with what was asked: never
    an end, and exit 1, so that a script tells it from a job that is fine."""
    from fsdpctl.adapters.etcd import free_port

    conf = tmp_path / "slurm.conf"
    conf.write_text(CLOSED.format(port=free_port()))
    monkeypatch.setenv("SLURM_CONF", str(conf))
    shared = tmp_path / "fsx"
    shared.mkdir()  # the cluster's shared file system, mounted here
    sets = ["--set", "BACKEND=slurm", "--set", "REQUEST_TIMEOUT=2", "--set", "MODEL=tiny"]
    sets += ["--set", f"SHARED_VOLUME_PATH={shared}"]
    result = cli(*sets, "job", "run", "-d")
    assert result.exit_code == 1, result.output
    assert re.match(
        r"error: `sbatch --parsable \S+/job\.sbatch` did not finish within 2 s", result.stderr
    )
    assert "REQUEST_TIMEOUT" in result.stderr and len(result.stderr.strip().splitlines()) == 2
    assert list(shared.iterdir()) == [] and not (cli.home / "jobs" / "fsdp" / "state.json").exists()
    assert not list((cli.home / "records").rglob("*.json"))  # the run record was discarded
    state = {"job": "fsdp", "backend": "slurm", "run_id": "fsdp-r1", "slurm_job": 5}
    state |= {"nodes": 2, "max_restarts": 3, "created": 1.0}
    (cli.home / "jobs" / "fsdp").mkdir(parents=True, exist_ok=True)  # its lock is there
    (cli.home / "jobs" / "fsdp" / "state.json").write_text(json.dumps(state))
    result = cli(*sets, "job", "status", "-o", "json")
    # shown, and not "fine": kubectl exits 1 when it cannot reach its server
    assert result.exit_code == 1, result.output
    report = json.loads(result.stdout)
    assert report["phase"] == "Unknown"
    assert report["reason"].startswith("`scontrol -o show job 5` did not finish within 2 s")


def test_since_is_refused_on_slurm_logs_that_carry_no_times(cli):
    """srun's --output files hold what the tasks printed, no time per line (srun.1 --output), so
    `job logs --since` cannot choose lines: one line, exit 2, before Slurm is asked anything."""
    record = {"job": "fsdp", "run_id": "fsdp-r1", "slurm_job": 5, "root": "/nonexistent/r"}
    record |= {"nodes": 2, "max_restarts": 3, "created": 1.0}
    (cli.home / "slurm").mkdir(parents=True)
    (cli.home / "slurm" / "fsdp.json").write_text(json.dumps(record))
    result = cli("--set", "BACKEND=slurm", "job", "logs", "--since", "5m")
    assert result.exit_code == 2 and "--since needs each line's time" in result.stderr
    assert cli("--set", "BACKEND=slurm", "job", "status", "nope").exit_code == 4


# ---- what Slurm says ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("captured", "phase", "reason"),
    [
        ("running", "Running", ""),
        ("resources", "Pending", "Resources: waiting for nodes"),
        ("priority", "Pending", "Priority: waiting behind higher-priority jobs"),
        ("held", "Pending", "JobHeldUser: held by its user"),
        ("begin", "Pending", "BeginTime: waiting for its earliest start time"),
        ("cancelled", "Stopped", ""),
        ("failed", "Failed", "NonZeroExitCode: ended with a non-zero exit code"),
        ("completed", "Succeeded", ""),
    ],
)
def test_records_captured_from_the_peer_read_as_phases_and_reasons_in_words(
    captured, phase, reason
):
    """`scontrol -o show job` records of real jobs on the peer (slurm-wlm 22.05.8): JobState read as
    the other backends' phases (squeue.1 JOB STATE CODES: CANCELLED "explicitly cancelled by the
    user", FAILED "non-zero exit code or other failure condition"), Reason as squeue.1 JOB REASON
    CODES describe it, ExitCode as code:signal (doc/html/job_exit_code.shtml: 3:0 for `exit 3`, 0:15
    for scancel)."""
    job = states.parse_record(CAPTURED[captured])
    assert states.phase(job, stop_requested=False) == phase
    assert states.reason_words(job["Reason"]).startswith(reason)
    assert states.exit_code(job) == {"failed": (3, 0), "cancelled": (0, 15)}.get(captured, (0, 0))


def test_a_requeued_job_is_restarting_and_a_stop_request_wins():
    """A requeued job is PENDING again with Restarts>0 (scontrol show job `Requeue=1 Restarts=1`,
    seen on the peer) or REQUEUED (squeue.1: "Completing job is being requeued"): Restarting. A job
    asked to stop completes with exit 0 (the trainer's stop checkpoint), which is Stopped, not
    Succeeded."""
    requeued = states.parse_record(CAPTURED["begin"].replace("Restarts=0", "Restarts=1"))
    assert states.phase(requeued, stop_requested=False) == "Restarting"
    assert states.phase({"JobState": "REQUEUED"}, stop_requested=False) == "Restarting"
    done = states.parse_record(CAPTURED["completed"])
    assert states.phase(done, stop_requested=True) == "Stopped"
    running = states.parse_record(CAPTURED["running"])
    assert states.phase(running, stop_requested=True) == "Stopping"


@given(
    code=st.sampled_from(sorted(k for k in states.REASONS if k != "None")),
    nodes=st.from_regex(r"node\[[0-9]-[0-9]\]", fullmatch=True),
)
def test_every_reason_code_has_words_and_unavailable_nodes_are_named(code, nodes):
    """squeue's %r keeps spaces, scontrol writes `_` for them; ReqNodeNotAvail carries
    `UnavailableNodes:<list>` (squeue.1 JOB REASON CODES); Assoc*/QOS* limits are a family."""
    for form in (f"{code}, UnavailableNodes:{nodes}", f"{code},_UnavailableNodes:{nodes}"):
        words = states.reason_words(form)
        assert words.startswith(f"{code}: ") and words.endswith(f"(unavailable: {nodes})")
    assert states.reason_words("QOSGrpNodeLimit").startswith(
        "QOSGrpNodeLimit: an account or QOS limit"
    )
    assert (
        states.reason_words("Nodes_required_for_job_are_DOWN") == "Nodes required for job are DOWN"
    )


def test_the_captured_states_cover_every_state_code_of_the_man_page():
    """Each JOB STATE CODE of squeue.1 (22.05) has a phase."""
    codes = {
        "BOOT_FAIL",
        "CANCELLED",
        "COMPLETED",
        "CONFIGURING",
        "COMPLETING",
        "DEADLINE",
        "FAILED",
    }
    codes |= {
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "PENDING",
        "PREEMPTED",
        "RUNNING",
        "RESV_DEL_HOLD",
        "REQUEUE_FED",
    }
    codes |= {
        "REQUEUE_HOLD",
        "REQUEUED",
        "RESIZING",
        "REVOKED",
        "SIGNALING",
        "SPECIAL_EXIT",
        "STAGE_OUT",
    }
    codes |= {"STOPPED", "SUSPENDED", "TIMEOUT"}
    assert codes <= set(states.PHASES)


# ---- the real thing ----------------------------------------------------------------------------------------

RUN = {
    "BACKEND": "slurm",
    "INSTANCE_TYPE": "p5.48xlarge",
    "EFA_ENABLED": "false",  # gloo on CPU: no EFA
    "GPUS_PER_NODE": "1",  # one trainer process per node
    "SEQ_LEN": "64",
    "PRECISION": "fp32",
    "MAX_STEPS": "40",
    "WARMUP_STEPS": "2",
    "CHECKPOINT_INTERVAL": "10",
    "MAX_RESTARTS": "2",
    "COLLECTIVE_TIMEOUT": "10",
    "RDZV_JOIN_TIMEOUT": "60",
}


def _env(cluster, root: Path, name: str) -> dict[str, str]:
    from fsdpctl.settings import setting_keys

    keys = set(setting_keys())
    (root / "home").mkdir(exist_ok=True)  # the fsdpctl process runs there
    (root / "fsx").mkdir(exist_ok=True)  # the shared file system, mounted on every node and here
    base = {k: v for k, v in cluster.env.items() if k not in keys and not k.startswith("FSDPCTL_")}
    shared = {"SHARED_VOLUME_PATH": str(root / "fsx"), "SLURM_PYTHON": str(Path(os.sys.executable))}
    return (
        base
        | {"FSDPCTL_HOME": str(root / "home"), "NO_COLOR": "1"}
        | prefixed(RUN | shared | {"JOB_NAME": name})
    )


def _status(env: dict[str, str]) -> dict:
    got = fsdpctl("job", "status", "-o", "json", env=env)
    assert got.returncode == 0, got.stderr
    return json.loads(got.stdout)


def _losses(env: dict[str, str]) -> dict[int, float]:
    text = fsdpctl("job", "logs", "-o", "json", env=env).stdout
    return {e.step: e.loss for e in logged_events(text) if isinstance(e, events.Step)}


def _leader_step(env: dict[str, str]) -> int:
    """The leader's last logged step, read from its log file (a status per look lags a tiny model)."""
    logs = list(
        (Path(env["FSDPCTL_SHARED_VOLUME_PATH"]) / "fsdpctl/slurm").glob(
            f"{env['FSDPCTL_JOB_NAME']}/*/node-0.log"
        )
    )
    steps = (
        [
            e.step
            for e in events.parse(logs[0].read_text().splitlines())
            if isinstance(e, events.Step)
        ]
        if logs
        else []
    )
    return max(steps, default=0)


def _until(what: str, check, timeout: float = 300):
    deadline = time.monotonic() + timeout
    while not (got := check()):
        assert time.monotonic() < deadline, f"{what}: not within {timeout:g} s"
        time.sleep(0.3)
    return got


@pytest.mark.slow
def test_a_two_node_job_trains_requeues_after_a_node_failure_resumes_and_stops(tmp_path):
    """Peer: the real Slurm cluster of tests/slurm_peer.py (3 nodes), the real trainer on CPU, gloo.
    1. `fsdpctl job run` (followed) of a 2-node job: sbatch of the rendered script, trains to
       MAX_STEPS, Succeeded; its step losses are the reference.
    2. The same job under another name, detached: status Running on two nodes; once its first
       checkpoint is published every process of the second node dies (slurm_peer.kill_node, a power
       loss). slurmctld marks the node DOWN and requeues the --requeue job (job_mgr.c:
       kill_running_job_by_node_name; sbatch.1 --requeue): status says Restarting with the pending
       reason in words (BeginTime: a requeued job waits cred_expire + 1 s, slurm.conf.5 AuthInfo) and
       the restart count; the script runs again on two healthy nodes, every rank resumes from the last
       checkpoint on the shared file system and every step's loss equals the reference; `job wait`
       exits 0; the logs keep one file per node; `job describe -o json` gives its run record with
       what its trainer said at start.
    3. A third job is stopped mid-run (`job stop`: the stop file, then scancel --signal=TERM to its
       steps, scancel.1): the trainer writes its stop checkpoint, the job ends Stopped, `job wait`
       exits 6, and `job list -o json` shows all three."""
    with slurm_peer.running(tmp_path / "cluster", nodes=3) as cluster:
        ref = _env(cluster, tmp_path, "ref")
        ran = fsdpctl("job", "run", env=ref, timeout=400)
        assert ran.returncode == 0, ran.stderr[-3000:]
        reference = _losses(ref)
        assert sorted(reference) == list(range(1, 41)) and _status(ref)["phase"] == "Succeeded"

        env = _env(cluster, tmp_path, "killed")
        assert fsdpctl("job", "run", "--detach", env=env).returncode == 0
        _until("step 1", lambda: _leader_step(env) >= 1)
        first = _status(env)
        assert (first["phase"], first["nodes"], first["restarts"]) == ("Running", 2, 0)
        nodes = cluster.hostnames(first["scheduler_job"]["nodes"])
        ckpts = tmp_path / "fsx/checkpoints/killed"
        saved = ckpts / "latest"
        # a tiny model steps in a fraction of a second: the kill follows a checkpoint closely
        _until("a checkpoint", lambda: saved.exists() and saved.read_text().startswith("step-"))
        cluster.kill_node(cluster.names.index(nodes[1]))
        at_kill = int(saved.read_text().removeprefix("step-"))
        job_id = first["scheduler_job"]["id"]
        _until(
            "the requeue",
            lambda: (
                cluster.job(job_id)["Restarts"] == "1"
                and cluster.job(job_id)["JobState"] == "PENDING"
            ),
        )
        requeued = _status(env)
        assert requeued["phase"] == "Restarting" and requeued["restarts"] == 1, requeued
        assert requeued["reason"].startswith("BeginTime: "), requeued
        waited = fsdpctl("job", "wait", "--timeout", "300", env=env, timeout=330)
        final = _status(env)
        assert waited.returncode == 0 and final["phase"] == "Succeeded", (final, waited.stderr)
        assert nodes[1] not in cluster.hostnames(
            final["scheduler_job"]["nodes"]
        )  # on healthy nodes
        resumed_at = final["summary"]["start_step"]
        # the last checkpoint: the one published when the node died, or one being written then
        assert resumed_at % 10 == 0 and at_kill <= resumed_at < 40, (at_kill, final["summary"])
        lines = fsdpctl("job", "logs", "--all", "-o", "json", env=env).stdout.splitlines()
        assert {json.loads(x)["node"] for x in lines} == {"node-0", "node-1"}
        text = fsdpctl("job", "logs", env=env).stdout
        assert (
            f"step-{resumed_at:08d} at step {resumed_at}" in text
        )  # the leader's "resumed from" line
        got = _losses(env)
        for step in range(1, 41):
            assert got[step] == pytest.approx(reference[step], abs=1e-6), step
        described = fsdpctl("job", "describe", "-o", "json", env=env)
        assert described.returncode == 0, described.stderr
        rec = json.loads(described.stdout)
        assert (rec["backend"], rec["run_id"]) == ("slurm", final["run_id"])
        assert rec["trainer"], (
            rec
        )  # the trainer's start line, learnt from the leader's log (run_lines)
        batch = next((tmp_path / "fsx/fsdpctl/slurm/killed").glob("*/batch.log")).read_text()
        assert re.search(r"start 0 on node\d", batch) and re.search(r"start 1 on node\d", batch)

        stop = _env(cluster, tmp_path, "stopped")
        assert fsdpctl("job", "run", "--detach", env=stop).returncode == 0
        _until("step 5", lambda: _leader_step(stop) >= 5)
        assert fsdpctl("job", "stop", env=stop, timeout=300).returncode == 0
        stopped = _status(stop)
        assert stopped["phase"] == "Stopped" and stopped["summary"]["stopped"], stopped
        assert stopped["checkpoint"].endswith(f"step-{stopped['summary']['steps']:08d}")
        assert fsdpctl("job", "wait", env=stop).returncode == 6
        listed = json.loads(fsdpctl("job", "list", "-o", "json", env=stop).stdout)
        assert {(j["job"], j["phase"]) for j in listed} == {
            ("ref", "Succeeded"),
            ("killed", "Succeeded"),
            ("stopped", "Stopped"),
        }


def test_the_slurm_backend_implements_every_verb_and_is_created_by_its_target():
    """Every method of the Backend protocol (as tests/test_backends.py checks the others'), and
    `backends.create` finds it through its `targets.TARGETS` entry alone."""
    from fsdpctl import backends
    from fsdpctl.backends.slurm.backend import SlurmBackend

    verbs = [
        n for n, _ in __import__("inspect").getmembers(backends.Backend, callable) if n[0] != "_"
    ]
    assert all(callable(getattr(SlurmBackend, verb)) for verb in verbs)
    assert isinstance(backends.create(load(environ={}, flags={"BACKEND": "slurm"})), SlurmBackend)

"""Every command through the isolated `cli` fixture (conftest.py); the local backend end to end with
real torchrun, real etcd (Debian etcd-server) and status/logs/stop from separate processes; Ctrl-C
and --debug on the real executable."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest
import yaml

from conftest import SHARED, prefixed

CRD_DIR = SHARED / "vendor" / "kubeflow-training-operator-v1.9.4"
TOKEN = "hf_ZyXwVuTsRqPoNmLkJiHgFeDcBa987654"


COMMANDS = [
    ["config", "show"],
    ["config", "validate"],
    ["manifest"],
    ["quickstart"],
    ["job", "run"],
    ["job", "status"],
    ["job", "logs"],
    ["job", "stop"],
    ["job", "list"],
    ["job", "wait"],
    ["plan"],
    ["doctor"],
    ["cluster", "check"],
    ["cluster", "status"],
    ["cluster", "create"],
    ["cluster", "delete"],
    ["image", "build"],
    ["image", "push"],
    ["deploy", "etcd"],
    ["deploy", "operator"],
    ["deploy", "plugins"],
    ["deploy", "storage"],
    ["deploy", "monitoring"],
    ["deploy", "all"],
    ["deploy", "status"],
    ["deploy", "fetch"],
    ["cleanup"],
    ["monitor", "top"],
    ["model", "fetch"],
    ["data", "fetch"],
    ["sandbox", "slurm", "up"],
    ["sandbox", "slurm", "down"],
    ["sandbox", "slurm", "status"],
]


def test_the_command_surface(cli):
    """Freezes the CLI surface: a rename shows up here. Every command's help carries an example."""
    for cmd in COMMANDS:
        result = cli(*cmd, "--help")
        assert result.exit_code == 0, cmd
        assert "Example:" in result.stdout, cmd


def test_help_imports_nothing_heavy(cli):
    code = (
        "import sys; from typer.testing import CliRunner; from fsdpctl.cli import app;"
        "r = CliRunner().invoke(app, ['--help']); assert r.exit_code == 0;"
        "r = CliRunner().invoke(app, ['plan', '--model', '7b']); assert r.exit_code == 0;"
        "heavy = ('torch', 'transformers', 'boto3', 'kubernetes', 'jinja2', 'matplotlib', 'plotext', 'wandb',"
        " 'tensorboard', 'prometheus_client');"
        "print([m for m in heavy if m in sys.modules])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env=cli.env(),
        cwd=cli.cwd,
    ).stdout
    assert out.strip() == "[]"


def test_config_show_masks_secrets_and_names_sources(cli, tmp_path, monkeypatch):
    (tmp_path / ".env").write_text("MODEL=13b\nJOB_NODES=4\n")
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    monkeypatch.setenv("FSDPCTL_JOB_NODES", "6")
    monkeypatch.setenv("SEQ_LEN", "abc")  # a plain name: another program's, not read
    result = cli("--set", "SEQ_LEN=512", "config", "show", "-o", "json")
    assert result.exit_code == 0
    data = json.loads(result.stdout)
    assert data["settings"]["MODEL"] == "13b" and data["sources"]["MODEL"] == ".env line 1"
    assert (
        data["settings"]["JOB_NODES"] == 6
        and data["sources"]["JOB_NODES"] == "environment FSDPCTL_JOB_NODES"
    )
    assert data["settings"]["SEQ_LEN"] == 512 and data["sources"]["SEQ_LEN"] == "--set"
    assert data["sources"]["HF_TOKEN"] == "environment HF_TOKEN"
    assert data["settings"]["HF_TOKEN"] == "***"
    for fmt in ("table", "yaml"):
        shown = cli("config", "show", "-o", fmt)
        assert shown.exit_code == 0 and TOKEN not in shown.stdout + shown.stderr
    assert yaml.safe_load(cli("config", "show", "-o", "yaml").stdout)["derived"]["world_size"] == 6


def test_config_validate_reports_every_bad_value_with_exit_2(cli, tmp_path):
    (tmp_path / "bad.env").write_text(
        "JOB_NODES=zero\nPRECISION=int4\nSHARDING_STRATEGIE=FULL_SHARD\n"
    )
    result = cli("--env-file", "bad.env", "config", "validate")
    assert result.exit_code == 2
    assert "JOB_NODES='zero' (bad.env line 1) is not a whole number" in result.stderr
    assert (
        "PRECISION='int4' (bad.env line 2) is not allowed: use one of bf16, fp16, fp32"
        in result.stderr
    )
    assert "did you mean SHARDING_STRATEGY?" in result.stderr
    assert cli("--env-file", "missing.env", "config", "validate").exit_code == 2
    assert cli("--set", "NOEQUALS", "config", "validate").exit_code == 2
    assert cli("config", "validate").exit_code == 0


def test_manifest_stdout_files_and_validation(cli, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    result = cli(
        "--set",
        "BACKEND=eks",
        "--set",
        "RDZV_BACKEND=etcd",
        "manifest",
        "--run-id",
        "r1",
        "--validate",
        "--crd-dir",
        str(CRD_DIR),
    )
    assert result.exit_code == 0, result.stderr
    kinds = [o["kind"] for o in yaml.safe_load_all(result.stdout)]
    assert kinds == [
        "Namespace",
        "Deployment",
        "Service",
        "NetworkPolicy",
        "Job",
        "PodDisruptionBudget",
        "PyTorchJob",
    ]
    assert TOKEN not in result.stdout
    assert (
        cli("--set", "BACKEND=eks", "manifest", "--run-id", "r1").stdout
        == cli("--set", "BACKEND=eks", "manifest", "--run-id", "r1").stdout
    )
    written = cli("manifest", "--out-dir", "out")
    assert written.exit_code == 0
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        ".fsdpctl-fsdp.sha256",  # what fsdpctl wrote for the job (tests/test_manifest_dir.py)
        "job-fsdp-fetch.yaml",
        "namespace-fsdp.yaml",
        "poddisruptionbudget-fsdp.yaml",
        "pytorchjob-fsdp.yaml",
    ]
    assert cli("manifest", "--validate").exit_code == 2  # no --crd-dir
    (tmp_path / "empty").mkdir()
    assert cli("manifest", "--validate", "--crd-dir", str(tmp_path / "empty")).exit_code == 2


def render_file_name(obj: dict) -> str:
    from fsdpctl.job import render

    return render.file_name(obj)


def test_manifest_output_format_is_yaml_or_json_on_stdout_and_in_files(cli, tmp_path):
    as_yaml = list(
        yaml.safe_load_all(cli("--set", "BACKEND=eks", "manifest", "--run-id", "r1").stdout)
    )
    listed = json.loads(
        cli("--set", "BACKEND=eks", "manifest", "--run-id", "r1", "-o", "json").stdout
    )
    assert listed == {"apiVersion": "v1", "kind": "List", "items": as_yaml}
    assert (
        cli("--set", "BACKEND=eks", "manifest", "--run-id", "r1", "--output", "yaml").stdout
        == cli("--set", "BACKEND=eks", "manifest", "--run-id", "r1").stdout
    )
    written = cli(
        "--set", "BACKEND=eks", "manifest", "--run-id", "r1", "-o", "json", "--out-dir", "j"
    )
    assert written.exit_code == 0 and written.stdout == ""
    files = sorted(p for p in (tmp_path / "j").iterdir() if p.suffix == ".json")
    assert [p.name for p in files] == [
        "job-fsdp-fetch.json",  # the pre-step: volume-prep of the claim
        "namespace-fsdp.json",
        "poddisruptionbudget-fsdp.json",
        "pytorchjob-fsdp.json",
    ]
    by_name = {render_file_name(o): o for o in as_yaml}
    assert {p.name.replace(".json", ".yaml"): json.loads(p.read_text()) for p in files} == by_name
    bad = cli("manifest", "-o", "out")  # -o was the directory before --out-dir
    assert bad.exit_code == 2 and not (tmp_path / "out").exists()


def test_job_commands_on_missing_jobs(cli):
    assert cli("job", "status", "nope").exit_code == 4
    assert cli("job", "wait", "nope").exit_code == 4
    assert cli("job", "list", "-o", "json").stdout.strip() == "[]"
    result = cli("--set", "AWS_ACCOUNT_ID=123456789012", "job", "run", "--backend", "eks")
    assert result.exit_code == 1 and "no Kubernetes cluster to talk to" in result.stderr
    assert "hint: aws eks update-kubeconfig --name fsdp-eks --region us-west-2" in result.stderr
    assert cli("job", "run", "--backend", "gke").exit_code == 2


def test_job_run_dry_run_starts_nothing(cli, tmp_path):
    result = cli("--set", "JOB_NODES=3", "job", "run", "--dry-run")
    assert result.exit_code == 0
    # the container command: fsdptrain.launch checks the settings on the node, then becomes torchrun
    assert (
        result.stdout.count("-m fsdptrain.launch --nnodes=3 --nproc-per-node=1 --rdzv-backend=c10d")
        == 3
    )
    assert not (tmp_path / "home").exists()


def test_quickstart_dry_run_starts_nothing_and_an_unfit_one_is_refused(cli):
    """Every command that changes state has --dry-run: the quickstart's shows its launchers and
    leaves no job directory; a quickstart this machine cannot hold (more than 4 processes per core)
    is refused as `job run` refuses it, exit 2, nothing started."""
    result = cli("quickstart", "--dry-run", "--nodes", "3")
    assert result.exit_code == 0, result.output
    assert result.stdout.count("-m fsdptrain.launch --nnodes=3 --nproc-per-node=1") == 3
    assert "nothing was created" in result.stderr and not cli.home.exists()
    refused = cli("quickstart", "--nodes", str(4 * (os.cpu_count() or 1) + 1))
    assert refused.exit_code == 2 and "local processes for this machine's" in refused.stderr, (
        refused.output
    )
    assert not cli.home.exists()


@pytest.fixture
def running_job(cli):
    """A local job every verb sees as Running, with nothing training: its state names a live
    supervisor (a `sleep` this fixture owns, as the local adapter records its own) and node-0's log
    has one line."""
    supervisor = subprocess.Popen(["sleep", "600"])
    jdir = cli.home / "jobs" / "held"
    logs = jdir / "logs" / "held-run-1"
    logs.mkdir(parents=True)
    (logs / "node-0.log").write_text("hello from node-0\n")
    state = {
        "job": "held",
        "run_id": "held-run-1",
        "phase": "Running",
        "created": time.time(),
        "replicas": 1,
        "log_dir": str(logs),
        "checkpoint_dir": str(jdir / "checkpoints"),
        "supervisor_pid": supervisor.pid,
        "launchers": [],
        "stop_requested": False,
    }
    (jdir / "state.json").write_text(json.dumps(state))
    yield "held"
    supervisor.kill()
    supervisor.wait()


@pytest.mark.parametrize("verb", [["job", "logs", "-f"], ["job", "status", "-w"]], ids=" ".join)
def test_ctrl_c_on_a_real_process_exits_130_with_one_line(cli, running_job, verb):
    """SIGINT, as a terminal sends on Ctrl-C, once the command is in its follow loop (it has
    printed)."""
    proc = cli.popen(*verb, running_job, env={"PYTHONUNBUFFERED": "1"})
    try:
        first = proc.stdout.readline()
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert first.strip(), stderr
    assert proc.returncode == 130, stderr
    assert stderr == "interrupted\n"


def test_ctrl_c_in_job_wait_exits_130_with_one_line(cli, running_job, monkeypatch):
    """`job wait` prints nothing while it waits: the interrupt arrives in its poll (in process: no
    race)."""

    def ctrl_c(seconds: float) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(time, "sleep", ctrl_c)
    r = cli("job", "wait", running_job)
    assert (r.exit_code, r.stdout, r.stderr) == (130, "", "interrupted\n")


@pytest.mark.parametrize(
    "args, line",
    [
        (
            ["--env-file", f"{TOKEN}.env", "config", "show"],
            "error: --env-file ***.env does not exist",
        ),
        (
            ["--set", f"MODEL={TOKEN}", "config", "validate"],
            "error: MODEL='***' (--set) is unknown: use one of",
        ),
    ],
    ids=["missing env file", "bad setting"],
)
def test_debug_adds_a_traceback_and_neither_shows_a_secret(cli, args, line):
    """The real executable (Python's own exception hook would print a raw message): a bad input that
    carries a token gives one line and exit 2; --debug adds the traceback above that line and keeps
    the exit code."""
    plain = cli.run(*args, env={"HF_TOKEN": TOKEN})
    debug = cli.run("--debug", *args, env={"HF_TOKEN": TOKEN})
    assert plain.exit_code == 2 and debug.exit_code == 2, debug.stderr
    first_error = next(s for s in plain.stderr.splitlines() if s.startswith("error:"))
    assert "Traceback" not in plain.stderr and first_error.startswith(line), plain.stderr
    assert debug.stderr.startswith("Traceback (most recent call last):\n"), debug.stderr
    assert debug.stderr.endswith(plain.stderr)  # the same line(s) and hint after the traceback
    assert (
        line.split("***")[-1].strip() in debug.stderr.split("\nerror:")[0]
    )  # the raised error, masked
    for r in (plain, debug):
        assert TOKEN not in r.stdout + r.stderr and r.stdout == ""


@pytest.mark.slow
def test_quickstart_trains_two_simulated_nodes(cli, tmp_path):
    result = cli("quickstart", "--steps", "8")
    assert result.exit_code == 0, result.stderr
    assert "quickstart: Succeeded" in result.stdout
    from fsdpctl.cli.quickstart_cmd import next_commands

    assert result.stdout.endswith(
        next_commands("quickstart")
    )  # what to run next, with this job's name
    # checkpoints on the shared volume (SHARED_VOLUME=fsx-claim: one directory every simulated node
    # mounts)
    assert (
        tmp_path / "home/volumes/fsx-claim/checkpoints/quickstart/step-00000008/meta.json"
    ).is_file()
    # and nothing half-written left on any node's own disk (the kubelet's downward API file of the
    # pod's annotations is the kubelet's, not the job's)
    nodes = tmp_path / "home/jobs/quickstart/nodes"
    assert not [p for p in nodes.rglob("*") if p.is_file() and p.parent.name != "podinfo"]
    status = json.loads(cli("job", "status", "quickstart", "-o", "json").stdout)
    assert status["phase"] == "Succeeded" and status["step"] == 8 and status["nodes"] == 2
    assert status["summary"]["final_loss"] < status["summary"]["first_loss"]
    _logs_of_a_real_job(cli, "quickstart", result.stdout)
    # -o json: one document on stdout (the final report and the next commands); the progress stays on stderr
    r = cli("quickstart", "--steps", "2", "--nodes", "1", "-o", "json")
    doc = json.loads(r.stdout)
    assert r.exit_code == doc["exit_code"] == 0 and doc["job"] == "quickstart", r.output
    assert doc["report"]["phase"] == "Succeeded" and doc["report"]["step"] == 2
    assert doc["next"][0] == "fsdpctl job status quickstart"


def _logs_of_a_real_job(cli, job: str, shown: str) -> None:
    """`job logs` options on the logs the relay wrote for real torchrun launchers (kubectl logs
    semantics: tests/test_job_logs.py names the sources)."""
    plain = cli("job", "logs", job).stdout.splitlines()
    assert plain and not any(line.startswith('{"event"') for line in plain)  # human lines only
    assert any(
        line.startswith("step     8/8 |") for line in plain
    ) and "leader: node rank 0" in "\n".join(plain)
    every = cli("job", "logs", job, "--all", "--tail", "3", "--timestamps").stdout.splitlines()
    assert len(every) == 6 and {line.split(" ")[0] for line in every} == {"[node-0]", "[node-1]"}
    stamps = [line.split(" ")[1] for line in every]
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{9}Z", t) for t in stamps), every
    assert (
        cli("job", "logs", job, "--since", "1h").stdout.splitlines() == plain
    )  # it ran a minute ago
    time.sleep(1.1)
    assert cli("job", "logs", job, "--since", "1s").stdout == ""  # ended over a second ago
    records = [json.loads(x) for x in cli("job", "logs", job, "-o", "json").stdout.splitlines()]
    steps = [r["event"]["step"] for r in records if r.get("event", {}).get("event") == "step"]
    assert steps == list(range(1, 9)) and all(r["node"] == "node-0" and r["time"] for r in records)


@pytest.mark.slow
@pytest.mark.skipif(
    not shutil.which("etcd"), reason="etcd-server not installed (scripts/system-deps installs it)"
)
def test_detached_job_over_real_etcd_status_logs_stop_and_resume(cli, tmp_path):
    """Each step is a separate fsdpctl process, as from another terminal."""
    settings = {
        "HF_TOKEN": TOKEN,  # read plain, as huggingface_hub reads it
        **prefixed(
            {
                "RDZV_BACKEND": "etcd",
                "JOB_NAME": "e2e",
                "MAX_STEPS": "300",
                "SEQ_LEN": "64",
                "WARMUP_STEPS": "2",
                "PRECISION": "fp32",
                "CHECKPOINT_INTERVAL": "100",
            }
        ),
    }

    def _fsdpctl(*args: str, timeout: float = 60):
        return cli.run(*args, env=settings, timeout=timeout)

    started = _fsdpctl("job", "run", "--detach")
    assert started.exit_code == 0, started.stderr
    again = _fsdpctl(
        "job", "run", "--detach"
    )  # same name while running: refused (README: exit 2, one line)
    assert again.exit_code == 2 and "job e2e is running (" in again.stderr, again.output

    # the event, not a pace: `job wait --for` (kubectl wait --for) returns once step 3 is done
    reached = _fsdpctl(
        "job", "wait", "--for", "step=3", "--timeout", "180", "-o", "json", timeout=200
    )
    assert reached.exit_code == 0, reached.output
    assert json.loads(reached.stdout)["step"] >= 3
    status = json.loads(_fsdpctl("job", "status", "-o", "json").stdout)
    assert status["phase"] == "Running" and status["step"] >= 3, status
    assert status["max_steps"] == 300 and status["eta_s"] > 0

    logs = _fsdpctl("job", "logs").stdout
    assert re.search(r"(?m)^step +\d+/300 \| loss", logs) and '{"event"' not in logs
    every = _fsdpctl("job", "logs", "--all").stdout
    assert "[node-0]" in every and "[node-1]" in every

    stopped = _fsdpctl("job", "stop", timeout=180)
    assert stopped.exit_code == 0 and "Stopped" in stopped.stderr, stopped.stderr
    assert _fsdpctl("job", "wait").exit_code == 6
    after_stop = json.loads(_fsdpctl("job", "status", "-o", "json").stdout)
    assert after_stop["summary"]["stopped"] is True and after_stop["checkpoint"]

    resumed = _fsdpctl("job", "run", "--detach")
    assert resumed.exit_code == 0, resumed.stderr
    assert _fsdpctl("job", "wait", "--timeout", "240", timeout=300).exit_code == 0
    final = json.loads(_fsdpctl("job", "status", "-o", "json").stdout)
    assert final["phase"] == "Succeeded" and final["step"] == 300
    assert _fsdpctl("job", "wait", "--for", "checkpoint").exit_code == 0
    short = _fsdpctl("job", "wait", "--for", "step=301")  # ended short of it: no wait, exit 1
    assert short.exit_code == 1 and "before step 301" in short.stderr, short.output
    assert final["summary"]["start_step"] == after_stop["step"]
    assert "resumed from" in _fsdpctl("job", "logs").stdout
    # the token reached the trainer's environment only, never the job's files
    for path in tmp_path.rglob("*"):
        if path.is_file():
            assert TOKEN.encode() not in path.read_bytes(), path

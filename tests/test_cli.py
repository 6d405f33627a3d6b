"""Every command through typer's CliRunner; the local backend end to end with real torchrun, real etcd
(Debian etcd-server) and status/logs/stop from separate processes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import pytest
import yaml
from typer.testing import CliRunner

from conftest import SHARED
from fsdpctl.cli import app

CRD_DIR = SHARED / "vendor" / "kubeflow-training-operator-v1.9.4"
TOKEN = "hf_ZyXwVuTsRqPoNmLkJiHgFeDcBa987654"


@pytest.fixture
def cli(tmp_path, monkeypatch):
    """An isolated CLI: its own FSDPCTL_HOME and working dir, no settings leaking in from the environment."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FSDPCTL_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "no-kubeconfig"))  # never a developer's real cluster
    from fsdpctl.settings import setting_keys

    for key in setting_keys():
        monkeypatch.delenv(key, raising=False)
    runner = CliRunner()

    def invoke(*args, **kw):
        return runner.invoke(app, list(args), catch_exceptions=False, **kw)

    return invoke


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
    ["deploy", "monitoring"],
    ["deploy", "all"],
    ["deploy", "status"],
    ["deploy", "fetch"],
    ["cleanup"],
    ["monitor", "top"],
]


def test_the_command_surface(cli):
    """Freezes the CLI surface: a rename shows up here. Every command's help carries an example."""
    for cmd in COMMANDS:
        result = cli(*cmd, "--help")
        assert result.exit_code == 0, cmd
        assert "Example:" in result.stdout, cmd


def test_help_imports_nothing_heavy():
    code = (
        "import sys; from typer.testing import CliRunner; from fsdpctl.cli import app;"
        "r = CliRunner().invoke(app, ['--help']); assert r.exit_code == 0;"
        "r = CliRunner().invoke(app, ['plan', '--model', '7b']); assert r.exit_code == 0;"
        "print([m for m in ('torch', 'transformers', 'boto3', 'kubernetes', 'jinja2') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_config_show_masks_secrets_and_names_sources(cli, tmp_path, monkeypatch):
    (tmp_path / ".env").write_text("MODEL=13b\nJOB_NODES=4\n")
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    monkeypatch.setenv("JOB_NODES", "6")
    result = cli("--set", "SEQ_LEN=512", "config", "show", "-o", "json")
    assert result.exit_code == 0
    data = json.loads(result.stdout)
    assert data["settings"]["MODEL"] == "13b" and data["sources"]["MODEL"] == ".env"
    assert data["settings"]["JOB_NODES"] == 6 and data["sources"]["JOB_NODES"] == "env"
    assert data["settings"]["SEQ_LEN"] == 512 and data["sources"]["SEQ_LEN"] == "flag"
    assert data["settings"]["HF_TOKEN"] == "***"
    for fmt in ("table", "yaml"):
        shown = cli("config", "show", "-o", fmt)
        assert shown.exit_code == 0 and TOKEN not in shown.stdout + shown.stderr
    assert yaml.safe_load(cli("config", "show", "-o", "yaml").stdout)["derived"]["world_size"] == 6


def test_config_validate_reports_every_bad_value_with_exit_2(cli, tmp_path):
    (tmp_path / "bad.env").write_text("JOB_NODES=zero\nPRECISION=int4\nSHARDING_STRATEGIE=FULL_SHARD\n")
    result = cli("--env-file", "bad.env", "config", "validate")
    assert result.exit_code == 2
    assert "JOB_NODES='zero' is not a whole number" in result.stderr
    assert "PRECISION='int4' is not allowed: use one of bf16, fp16, fp32" in result.stderr
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
    assert kinds == ["Namespace", "Deployment", "Service", "NetworkPolicy", "PyTorchJob"]
    assert TOKEN not in result.stdout
    assert (
        cli("--set", "BACKEND=eks", "manifest", "--run-id", "r1").stdout
        == cli("--set", "BACKEND=eks", "manifest", "--run-id", "r1").stdout
    )
    written = cli("manifest", "-o", "out")
    assert written.exit_code == 0
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "namespace-fsdp.yaml",
        "pytorchjob-fsdp.yaml",
    ]
    assert cli("manifest", "--validate").exit_code == 2  # no --crd-dir
    (tmp_path / "empty").mkdir()
    assert cli("manifest", "--validate", "--crd-dir", str(tmp_path / "empty")).exit_code == 2


def test_job_commands_on_missing_jobs(cli):
    assert cli("job", "status", "nope").exit_code == 4
    assert cli("job", "wait", "nope").exit_code == 4
    assert cli("job", "list", "-o", "json").stdout.strip() == "[]"
    result = cli("job", "run", "--backend", "eks")
    assert result.exit_code == 1 and "no Kubernetes cluster to talk to" in result.stderr
    assert "hint: aws eks update-kubeconfig --name fsdp-eks --region us-west-2" in result.stderr
    assert cli("job", "run", "--backend", "gke").exit_code == 2


def test_job_run_dry_run_starts_nothing(cli, tmp_path):
    result = cli("--set", "JOB_NODES=3", "job", "run", "--dry-run")
    assert result.exit_code == 0
    assert result.stdout.count("torch.distributed.run --nnodes=3 --nproc-per-node=1 --rdzv-backend=c10d") == 3
    assert not (tmp_path / "home").exists()


def test_quickstart_trains_two_simulated_nodes(cli, tmp_path):
    result = cli("quickstart", "--steps", "8")
    assert result.exit_code == 0, result.stderr
    assert "quickstart: Succeeded" in result.stdout
    assert (tmp_path / "home/jobs/quickstart/checkpoints/quickstart/step-00000008/meta.json").is_file()
    status = json.loads(cli("job", "status", "quickstart", "-o", "json").stdout)
    assert status["phase"] == "Succeeded" and status["step"] == 8 and status["nodes"] == 2
    assert status["summary"]["final_loss"] < status["summary"]["first_loss"]


def _fsdpctl(*args, env, timeout=60):
    return subprocess.run(
        [sys.executable, "-m", "fsdpctl.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=env["FSDPCTL_HOME"],
    )


@pytest.mark.skipif(
    not shutil.which("etcd"), reason="etcd-server not installed (scripts/system-deps installs it)"
)
def test_detached_job_over_real_etcd_status_logs_stop_and_resume(tmp_path):
    """Each step is a separate fsdpctl process, as from another terminal."""
    env = {
        **os.environ,
        "FSDPCTL_HOME": str(tmp_path),
        "NO_COLOR": "1",
        "COLUMNS": "200",
        "HF_TOKEN": TOKEN,
        "RDZV_BACKEND": "etcd",
        "JOB_NAME": "e2e",
        "MAX_STEPS": "300",
        "SEQ_LEN": "64",
        "WARMUP_STEPS": "2",
        "PRECISION": "fp32",
        "CHECKPOINT_INTERVAL": "100",
    }
    started = _fsdpctl("job", "run", "--detach", env=env)
    assert started.returncode == 0, started.stderr
    assert _fsdpctl("job", "run", "--detach", env=env).returncode == 1  # same name while running: refused

    deadline = time.monotonic() + 180
    while True:
        status = json.loads(_fsdpctl("job", "status", "-o", "json", env=env).stdout)
        if status["step"] >= 3 or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert status["phase"] == "Running" and status["step"] >= 3, status
    assert status["max_steps"] == 300 and status["eta_s"] > 0

    logs = _fsdpctl("job", "logs", env=env).stdout
    assert '{"event":"step"' in logs
    every = _fsdpctl("job", "logs", "--all", env=env).stdout
    assert "[node-0]" in every and "[node-1]" in every

    stopped = _fsdpctl("job", "stop", env=env, timeout=180)
    assert stopped.returncode == 0 and "Stopped" in stopped.stderr, stopped.stderr
    assert _fsdpctl("job", "wait", env=env).returncode == 6
    after_stop = json.loads(_fsdpctl("job", "status", "-o", "json", env=env).stdout)
    assert after_stop["summary"]["stopped"] is True and after_stop["checkpoint"]

    resumed = _fsdpctl("job", "run", "--detach", env=env)
    assert resumed.returncode == 0, resumed.stderr
    assert _fsdpctl("job", "wait", "--timeout", "240", env=env, timeout=300).returncode == 0
    final = json.loads(_fsdpctl("job", "status", "-o", "json", env=env).stdout)
    assert final["phase"] == "Succeeded" and final["step"] == 300
    assert final["summary"]["start_step"] == after_stop["step"]
    assert "resumed from" in _fsdpctl("job", "logs", env=env).stdout
    # the token reached the trainer's environment only, never the job's files
    for path in tmp_path.rglob("*"):
        if path.is_file():
            assert TOKEN.encode() not in path.read_bytes(), path

"""Secrets never leave: a real token-shaped HF token and AWS keys are grepped for in everything fsdpctl prints
or writes: config show, manifests, error messages, job logs and status, and every file of a real local run."""

from __future__ import annotations

from typer.testing import CliRunner

from fsdpctl.cli import app
from fsdpctl.settings import setting_keys

SECRETS = {
    "HF_TOKEN": "hf_aBcDeFgHiJkLmNoPqRsTuVwXyZ01234567",
    "AWS_ACCESS_KEY_ID": "AKIAIOSFODNN7EXAMPLE",
    "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
}


def test_no_secret_in_any_output_or_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for key in setting_keys():
        monkeypatch.delenv(key, raising=False)
    for key, value in SECRETS.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("FSDPCTL_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("NO_COLOR", "1")
    runner = CliRunner()
    job = [
        "--set",
        "JOB_NAME=secret",
        "--set",
        "MAX_STEPS=4",
        "--set",
        "WARMUP_STEPS=1",
        "--set",
        "SEQ_LEN=64",
        "--set",
        "PRECISION=fp32",
    ]
    outputs = []
    for args in (
        ["config", "show"],
        ["config", "show", "-o", "json"],
        ["config", "show", "-o", "yaml"],
        ["manifest"],
        ["manifest", "-o", "out"],
        ["--set", "BACKEND=eks", "manifest"],
        # the token pasted into the wrong key: the error names the key, not the token
        ["--set", f"MODEL={SECRETS['HF_TOKEN']}", "config", "validate"],
        ["--set", f"JOB_NAME={SECRETS['AWS_SECRET_ACCESS_KEY']}", "config", "validate"],
        [*job, "job", "run"],
        [*job, "job", "status"],
        [*job, "job", "logs", "--all"],
        [*job, "job", "status", "-o", "json"],
        ["job", "list", "-o", "json"],
    ):
        result = runner.invoke(app, args)
        outputs.append((args, result.exit_code, result.stdout + result.stderr))
    assert [code for args, code, _ in outputs if args[-1] == "validate"] == [2, 2]
    assert next(code for args, code, _ in outputs if args[-2:] == ["job", "run"]) == 0
    assert "HF token set" in next(text for args, _, text in outputs if args[-2:] == ["logs", "--all"])
    for args, _, text in outputs:
        for key, value in SECRETS.items():
            assert value not in text, (key, args)
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert any(p.name == "node-0.log" for p in files) and any(p.name == "pytorchjob-fsdp.yaml" for p in files)
    for path in files:
        data = path.read_bytes()
        for key, value in SECRETS.items():
            assert value.encode() not in data, (key, path)


def test_trainer_sees_the_token_from_env_or_the_mounted_secret_file(tmp_path, monkeypatch):
    from fsdptrain.train import _hf_token_given

    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("HF_TOKEN_PATH", str(tmp_path / "HF_TOKEN"))
    assert not _hf_token_given()  # optional Secret absent: no file
    (tmp_path / "HF_TOKEN").write_text("hf_x")
    assert _hf_token_given()
    monkeypatch.delenv("HF_TOKEN_PATH")
    monkeypatch.setenv("HF_TOKEN", "hf_y")
    assert _hf_token_given()

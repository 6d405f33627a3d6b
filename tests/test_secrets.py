"""Secrets never leave: a real token-shaped HF token and AWS keys are grepped for in everything fsdpctl prints
or writes: config show, manifests, error messages, job logs and status, and every file of a real local run."""

from __future__ import annotations

from pathlib import Path

import pytest

SECRETS = {
    "HF_TOKEN": "hf_aBcDeFgHiJkLmNoPqRsTuVwXyZ01234567",
    "AWS_ACCESS_KEY_ID": "AKIAIOSFODNN7EXAMPLE",
    "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
}


JOB = [
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


def _outputs(cli, monkeypatch, commands) -> list[tuple[list[str], int, str]]:
    """Each command's exit code and everything it printed, with the secrets in the environment."""
    for key, value in SECRETS.items():
        monkeypatch.setenv(key, value)
    outputs = []
    for args in commands:
        result = cli(*args)
        outputs.append((args, result.exit_code, result.stdout + result.stderr))
    return outputs


def _assert_no_secret(outputs, root: Path) -> list[Path]:
    for args, _, text in outputs:
        for key, value in SECRETS.items():
            assert value not in text, (key, args)
    files = [p for p in root.rglob("*") if p.is_file()]
    for path in files:
        data = path.read_bytes()
        for key, value in SECRETS.items():
            assert value.encode() not in data, (key, path)
    return files


def test_no_secret_in_settings_manifests_or_errors(cli, tmp_path, monkeypatch):
    outputs = _outputs(
        cli,
        monkeypatch,
        [
            ["config", "show"],
            ["config", "show", "-o", "json"],
            ["config", "show", "-o", "yaml"],
            ["manifest"],
            ["manifest", "--out-dir", "out"],
            ["--set", "BACKEND=eks", "manifest"],
            # the token pasted into the wrong key: the error names the key, not the token
            ["--set", f"MODEL={SECRETS['HF_TOKEN']}", "config", "validate"],
            ["--set", f"JOB_NAME={SECRETS['AWS_SECRET_ACCESS_KEY']}", "config", "validate"],
            ["job", "list", "-o", "json"],
        ],
    )
    assert [code for args, code, _ in outputs if args[-1] == "validate"] == [2, 2]
    files = _assert_no_secret(outputs, tmp_path)
    assert any(p.name == "pytorchjob-fsdp.yaml" for p in files)


@pytest.mark.slow
def test_no_secret_in_any_output_or_file_of_a_real_local_run(cli, tmp_path, monkeypatch):
    outputs = _outputs(
        cli,
        monkeypatch,
        [
            [*JOB, "job", "run"],
            [*JOB, "job", "status"],
            [*JOB, "job", "logs", "--all"],
            [*JOB, "job", "status", "-o", "json"],
            ["job", "list", "-o", "json"],
        ],
    )
    assert next(code for args, code, _ in outputs if args[-2:] == ["job", "run"]) == 0
    assert "HF token set" in next(text for args, _, text in outputs if args[-2:] == ["logs", "--all"])
    files = _assert_no_secret(outputs, tmp_path)
    assert any(p.name == "node-0.log" for p in files)


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

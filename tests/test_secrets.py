"""Secrets never leave: a real token-shaped HF token and AWS keys are grepped for in everything
fsdpctl prints or writes: config show, manifests, error messages, job logs and status, and every
file of a real local run."""

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
    assert "HF token set" in next(
        text for args, _, text in outputs if args[-2:] == ["logs", "--all"]
    )
    files = _assert_no_secret(outputs, tmp_path)
    assert any(p.name == "node-0.log" for p in files)


def test_trainer_sees_the_token_from_env_or_the_mounted_secret_file(tmp_path, monkeypatch):
    from fsdptrain.report import hf_token_given

    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("HF_TOKEN_PATH", str(tmp_path / "HF_TOKEN"))
    assert not hf_token_given()  # optional Secret absent: no file
    (tmp_path / "HF_TOKEN").write_text("hf_x")
    assert hf_token_given()
    monkeypatch.delenv("HF_TOKEN_PATH")
    monkeypatch.setenv("HF_TOKEN", "hf_y")
    assert hf_token_given()


# ---- secret-shaped values in keys that are not secret, on every output path ------------------------------
# Shapes as their issuers print them: HF user access tokens `hf_` + 34 alphanumerics (huggingface_hub docs,
# "User access tokens"), AWS access key ids AKIA/ASIA + 16 of [A-Z2-7] (IAM user guide, "unique ID prefixes"),
# GitHub classic tokens `ghp_` + 36 (GitHub docs, "token formats").

ALNUM = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"


def shaped(kind: str, rng) -> str:
    if kind == "hf":
        return "hf_" + "".join(rng.choice(ALNUM) for _ in range(34))
    if kind == "aws":
        return rng.choice(("AKIA", "ASIA")) + "".join(
            rng.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZ234567") for _ in range(16)
        )
    return "ghp_" + "".join(rng.choice(ALNUM) for _ in range(36))


def _free_text_keys() -> list[str]:
    """Every key (but the secret itself) that accepts a pasted token: found by validating one, not
    listed."""
    from fsdpctl.errors import SettingsError
    from fsdpctl.settings import load, setting_keys

    found = []
    for key in sorted(setting_keys()):
        if key == "HF_TOKEN":
            continue
        try:
            load(flags={key: "hf_" + "a" * 34})
        except SettingsError:
            continue
        found.append(key)
    return found


FREE_TEXT = _free_text_keys()
PATHS = [
    ["config", "show"],
    ["config", "show", "-o", "json"],
    ["config", "show", "-o", "yaml"],
    ["manifest", "--force"],
    ["manifest", "--force", "-o", "json"],
    ["manifest", "--force", "--out-dir", "out"],
    ["--set", "BACKEND=eks", "manifest", "-o", "yaml"],
    ["job", "run", "--dry-run", "--force"],
    ["--set", "BACKEND=eks", "job", "run", "--dry-run", "--force"],
    ["deploy", "all", "--dry-run"],
    ["cluster", "create", "--dry-run"],
    ["cluster", "create", "--dry-run", "--tool", "terraform"],
    ["--debug", "--set", "JOB_NODES=nan", "config", "validate"],
]


def test_free_text_keys_are_found():
    """The keys a token could be pasted into unnoticed: the issue's three are among them."""
    assert {"TOKENIZER", "DATASET_SPLIT", "AWS_PROFILE"} <= set(FREE_TEXT), FREE_TEXT


# the three keys in `make test-fast`; every other free-text key in the whole suite (about 4
# s each)
FAST_FREE_TEXT = {"TOKENIZER", "IMAGE_TAG", "DATASET_SPLIT"}


@pytest.mark.parametrize(
    "key",
    [k if k in FAST_FREE_TEXT else pytest.param(k, marks=pytest.mark.slow) for k in FREE_TEXT],
)
def test_a_token_in_a_free_text_key_is_masked_everywhere_and_named(cli, tmp_path, monkeypatch, key):
    """A generated token of each shape, through each way in (.env, environment, --set), in `key`: no
    output of any path (config show, manifests printed and written, every --dry-run, a --debug
    traceback) and no file written holds it, and a warning names the key."""
    import random

    from invariants import snapshot, written

    rng = random.Random(key)
    for i, kind in enumerate(("hf", "aws", "gh")):
        token = shaped(kind, rng)
        channel = ("dotenv", "env", "set")[(i + len(key)) % 3]
        head: list[str] = []
        if channel == "dotenv":
            (tmp_path / ".env").write_text(f"{key}={token}\n")
        elif channel == "env":
            monkeypatch.setenv(f"FSDPCTL_{key}", token)
        else:
            head = ["--set", f"{key}={token}"]
        for args in PATHS:
            before = snapshot(tmp_path)
            result = cli(*head, *args)
            text = result.stdout + result.stderr
            assert token not in text and token[4:20] not in text, (key, channel, args, text[-2000:])
            for path in written(before, snapshot(tmp_path)):
                if path.is_file():
                    assert token[4:20].encode() not in path.read_bytes(), (key, channel, args, path)
            if args == ["config", "show"]:
                assert f"warning: {key} " in result.stderr, (key, channel, result.stderr)
        (tmp_path / ".env").unlink(missing_ok=True)
        monkeypatch.delenv(f"FSDPCTL_{key}", raising=False)


def test_a_debug_traceback_is_masked(cli, monkeypatch):
    """--debug prints the traceback of the error, masked: the token in its message shows as ***."""
    token = "hf_" + "Q" * 34
    result = cli("--debug", "--set", f"JOB_NAME={token}", "config", "validate")
    assert result.exit_code == 2
    assert "Traceback (most recent call last)" in result.stderr
    assert token not in result.stderr and "QQQQQQQQ" not in result.stderr


def test_an_unexpected_exception_is_one_masked_line_and_its_traceback_masked_with_debug(
    cli, monkeypatch
):
    """An exception fsdpctl does not expect (a defect) still gives one line, exit 1, no traceback; with
    --debug its traceback, masked (Python's own hook would print the token)."""
    import fsdpctl.settings

    token = "ghp_" + "Z" * 36

    def broken(**kw):
        raise RuntimeError(f"boom {token}")

    monkeypatch.setattr(fsdpctl.settings, "load", broken)
    result = cli("config", "show")
    assert result.exit_code == 1 and "Traceback" not in result.stderr
    assert result.stderr.startswith("error: internal error: RuntimeError: boom ***")
    debug = cli("--debug", "config", "show")
    assert debug.exit_code == 1 and "Traceback (most recent call last)" in debug.stderr
    assert token not in debug.stderr and "ZZZZZZZZ" not in debug.stderr


def test_click_usage_errors_are_masked(cli):
    """click quotes the value it refused (`Invalid value for '--nodes': ...`); the quote is masked
    too."""
    token = "AKIA" + "ABCDEFGHIJKLMNOP"
    result = cli("plan", "--nodes", token)
    assert result.exit_code == 2 and token not in result.stderr


@pytest.mark.parametrize(
    "line",
    [
        # unclosed quote: the secret key's whole value
        'HF_TOKEN="hf_aBcDeFgHiJkLmNoPqRsTuVwXyZ01234567',
        'HF_TOKEN="plainsecretvaluewithnoshape',
        'TOKENIZER="hf_aBcDeFgHiJkLmNoPqRsTuVwXyZ01234567',
        "export AWS_SECRET_ACCESS_KEY='wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
    ],
)
def test_a_malformed_env_line_is_masked_before_it_is_cut(cli, tmp_path, line):
    """The error quotes at most 40 characters of the line it cannot parse: masked first, so no part
    of a secret (its first characters, as a cut would leave them) shows."""
    (tmp_path / ".env").write_text(line + "\n")
    result = cli("config", "show")
    assert result.exit_code == 2, result.stderr
    assert "cannot parse" in result.stderr
    value = line.split("=", 1)[1].strip("\"'")
    assert value[:12] not in result.stderr, result.stderr


def test_a_secret_from_a_file_or_flag_is_masked_whatever_its_shape(cli):
    """HF_TOKEN with no token shape (an org's own proxy token), given by --set, is masked where it
    shows: pasted also into TOKENIZER, config show, the manifest and the dry run hide it."""
    secret = "plain-secret-value-42"
    for args in (
        ["config", "show"],
        ["manifest", "--force"],
        ["job", "run", "--dry-run", "--force"],
    ):
        result = cli("--set", f"HF_TOKEN={secret}", "--set", f"TOKENIZER={secret}", *args)
        assert secret not in result.stdout + result.stderr, (args, result.stdout[-1000:])

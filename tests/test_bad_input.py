"""Bad input, table-driven over every settings key: each bad value gives one line naming the key, the value and
the fix, exit code 2, and writes nothing. Driven through the real CLI (`manifest -o DIR`, which would write)."""

from __future__ import annotations

import dataclasses
import typing

import pytest
from typer.testing import CliRunner

from fsdpctl.cli import app
from fsdpctl.settings import TRAIN_KEYS_DERIVED, Settings, setting_keys
from fsdptrain.config import TrainConfig


def _settings_cases():
    for name, f in Settings.model_fields.items():
        key = name.upper()
        ann = f.annotation
        meta = {type(m).__name__: m for m in f.metadata}
        if typing.get_origin(ann) is typing.Literal:
            yield key, "bogus", "wrong choice"
        elif ann is bool:
            yield key, "maybe", "wrong type"
        elif ann is int:
            yield key, "abc", "wrong type"
            if "Ge" in meta:
                yield key, str(meta["Ge"].ge - 1), "below minimum"
            if "Le" in meta:
                yield key, str(meta["Le"].le + 1), "above maximum"
        elif ann is str and f.metadata and any(hasattr(m, "pattern") and m.pattern for m in f.metadata):
            yield key, "Not Valid!", "wrong format"


def _training_cases():
    for f in dataclasses.fields(TrainConfig):
        if f.name in TRAIN_KEYS_DERIVED:
            continue
        key, kind = f.metadata["env"], type(f.default)
        if f.metadata["choices"]:
            yield key, "bogus", "wrong choice"
        elif kind is bool:
            yield key, "maybe", "wrong type"
        elif kind in (int, float):
            yield key, "abc", "wrong type"
            if f.metadata["min"] is not None:
                yield key, str(kind(f.metadata["min"]) - 1), "below minimum"


CASES = [
    *_settings_cases(),
    *_training_cases(),
    ("INSTANCE_TYPE", "p3.16xlarge", "unknown instance type"),
    ("INSTANCE_TYPE", "p5.48XLARGE", "unknown instance type"),
    ("MODEL", "65b", "unknown model"),
    ("GPUS_PER_NODE", "9", "more GPUs than the instance has"),
    ("HSDP_SHARD_SIZE", "3", "world size not divisible by the hybrid group"),
    ("PRETRAINED", "meta-llama/Llama-2-70b-hf", "gated model without HF token"),
    ("DATASET", "", "empty data set"),
    ("IMAGE_TAG", "latest", "unpinned image"),
    ("GANG_SCHEDULING", "true", "gang scheduling without a gang scheduler"),
    ("JOB_KIND", "trainjob", "TrainJob with an etcd rendezvous"),
]
EXTRA = {
    "HSDP_SHARD_SIZE": "SHARDING_STRATEGY=HYBRID_SHARD\n",
    "GPUS_PER_NODE": "BACKEND=eks\n",
    "JOB_KIND": "BACKEND=eks\nRDZV_BACKEND=etcd\n",
}


def test_every_key_is_covered():
    covered = {key for key, _, _ in CASES}
    free_text = {
        "AWS_PROFILE",
        "HF_TOKEN",
        "HF_TOKEN_FILE",
        "TOKENIZER",
        "DATASET_SPLIT",
        "DATASET_TEXT_FIELD",
        "RESUME",
        "EXPORT_DIR",
        "KUBE_CONTEXT",
    }  # any string is a valid value
    assert set(setting_keys()) - covered == free_text
    assert len(CASES) >= 60


@pytest.fixture
def run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for key in setting_keys():
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("FSDPCTL_HOME", str(tmp_path / "home"))

    def invoke(env_text: str):
        (tmp_path / "bad.env").write_text(env_text)
        return CliRunner().invoke(app, ["--env-file", "bad.env", "manifest", "-o", "out"])

    return invoke


@pytest.mark.parametrize("key, value, why", CASES, ids=[f"{k}={v!r}:{w}" for k, v, w in CASES])
def test_bad_value_one_line_exit_2_nothing_written(run, tmp_path, key, value, why):
    result = run(EXTRA.get(key, "") + f"{key}={value}\n")
    assert result.exit_code == 2, result.stdout
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr
    line = errors[0]
    assert key in line and (repr(value) in line or f"{key}={value}" in line), line
    fix = line.split(":", 2)[-1]
    assert len(fix.strip()) > 5, line  # something after the value: what is allowed or what to do
    assert not (tmp_path / "out").exists() and not (tmp_path / "home").exists()


@pytest.mark.parametrize(
    "text, expected",
    [
        ("MODEL 7b\n", "bad.env line 1: cannot parse 'MODEL 7b': write KEY=VALUE"),
        ("MODEL=7b\n'unterminated\n", "bad.env line 2: cannot parse"),
    ],
)
def test_malformed_env_lines(run, tmp_path, text, expected):
    result = run(text)
    assert result.exit_code == 2 and expected in result.stderr
    assert not (tmp_path / "out").exists()


def test_unknown_key_warns_with_the_closest_and_still_works(run, tmp_path):
    result = run("MODLE=7b\nJOB_NODE=4\n")
    assert result.exit_code == 0
    assert "unknown key MODLE: did you mean MODEL?" in result.stderr
    assert "unknown key JOB_NODE: did you mean JOB_NODES?" in result.stderr
    assert (tmp_path / "out" / "pytorchjob-fsdp.yaml").is_file()

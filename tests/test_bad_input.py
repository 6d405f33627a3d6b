"""Bad input, table-driven over every settings key: each bad value gives one line naming the key, the value
and the fix, exit code 2, and writes nothing. Driven through the real CLI (`manifest --out-dir DIR`, which
would write), isolated by the `cli` fixture. Each case carries the fix its line must end with; for generated
cases the allowed values or bounds come from the field's own declaration."""

from __future__ import annotations

import dataclasses
import typing

import pytest

from fsdpctl.settings import TRAIN_KEYS_DERIVED, Settings, setting_keys
from fsdptrain.config import TrainConfig


def _settings_cases():
    for name, f in Settings.model_fields.items():
        key = name.upper()
        ann = f.annotation
        meta = {type(m).__name__: m for m in f.metadata}
        pattern = next((m.pattern for m in f.metadata if getattr(m, "pattern", None)), None)
        if typing.get_origin(ann) is typing.Literal:
            yield (
                key,
                "bogus",
                "wrong choice",
                "is not allowed: use one of " + ", ".join(typing.get_args(ann)),
            )
        elif ann is bool:
            yield key, "maybe", "wrong type", "is not a boolean: use true or false"
        elif ann is int:
            yield key, "abc", "wrong type", "is not a whole number: give one, e.g. 2"
            if "Ge" in meta:
                yield (
                    key,
                    str(meta["Ge"].ge - 1),
                    "below minimum",
                    f"is too small: use at least {meta['Ge'].ge}",
                )
            if "Le" in meta:
                yield (
                    key,
                    str(meta["Le"].le + 1),
                    "above maximum",
                    f"is too large: use at most {meta['Le'].le}",
                )
        elif ann is str and pattern:
            yield key, "Not Valid!", "wrong format", f"is not valid: it must match {pattern}"


def _training_cases():
    for f in dataclasses.fields(TrainConfig):
        if f.name in TRAIN_KEYS_DERIVED:
            continue
        key, kind = f.metadata["env"], type(f.default)
        if f.metadata["choices"]:
            yield (
                key,
                "bogus",
                "wrong choice",
                "is not allowed: use one of " + ", ".join(f.metadata["choices"]),
            )
        elif kind is bool:
            yield key, "maybe", "wrong type", "is not valid: give true or false"
        elif kind in (int, float):
            what = "a whole number, e.g. 2" if kind is int else "a number, e.g. 0.001"
            yield key, "abc", "wrong type", f"is not valid: give {what}"
            if f.metadata["min"] is not None:
                low = f.metadata["min"]
                yield key, str(kind(low) - 1), "below minimum", f"is too small: use at least {low:g}"


CASES = [
    *_settings_cases(),
    *_training_cases(),
    (
        "INSTANCE_TYPE",
        "p3.16xlarge",
        "unknown instance type",
        "is not supported: use one of p4de.24xlarge, p5.48xlarge, p5e.48xlarge",
    ),
    (
        "INSTANCE_TYPE",
        "p5.48XLARGE",
        "unknown instance type",
        "is not supported: use one of p4de.24xlarge, p5.48xlarge, p5e.48xlarge",
    ),
    ("MODEL", "65b", "unknown model", "is unknown: use one of 7b, 13b, 70b, tiny, tiny-gqa"),
    (
        "GPUS_PER_NODE",
        "9",
        "more GPUs than the instance has",
        "exceeds the 8 GPUs of a p5.48xlarge: use at most 8 (0 = all)",
    ),
    (
        "HSDP_SHARD_SIZE",
        "3",
        "world size not divisible by the hybrid group",
        "does not divide the world size 2: use a divisor of 2 (usually the GPUs per node) "
        "(world = JOB_NODES 2 x 1 processes per node)",
    ),
    (
        "PRETRAINED",
        "meta-llama/Llama-2-70b-hf",
        "gated model without HF token",
        "is gated on the hub; set HF_TOKEN or HF_TOKEN_FILE (it goes into a Kubernetes Secret, never into a "
        "manifest)",
    ),
    (
        "DATASET",
        "",
        "empty data set",
        "is empty: use 'builtin', a text/jsonl/parquet file or a hub dataset id",
    ),
    (
        "IMAGE_TAG",
        "latest",
        "unpinned image",
        "is not allowed: pin a version so every pod runs the same image",
    ),
    (
        "GANG_SCHEDULING",
        "true",
        "gang scheduling without a gang scheduler",
        "needs SCHEDULER_NAME (e.g. volcano): the default scheduler does not start pods as a group",
    ),
    (
        "JOB_KIND",
        "trainjob",
        "TrainJob with an etcd rendezvous",
        "the Trainer starts torchrun with a static rendezvous; use RDZV_BACKEND=c10d or JOB_KIND=pytorchjob",
    ),
]
EXTRA = {
    "HSDP_SHARD_SIZE": "SHARDING_STRATEGY=HYBRID_SHARD\n",
    "GPUS_PER_NODE": "BACKEND=eks\n",
    "JOB_KIND": "BACKEND=eks\nRDZV_BACKEND=etcd\n",
}


def test_every_key_is_covered():
    covered = {key for key, _, _, _ in CASES}
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
def run(cli, tmp_path):
    def invoke(env_text: str):
        (tmp_path / "bad.env").write_text(env_text)
        return cli("--env-file", "bad.env", "manifest", "--out-dir", "out")

    return invoke


@pytest.mark.parametrize("key, value, why, fix", CASES, ids=[f"{k}={v!r}:{w}" for k, v, w, _ in CASES])
def test_bad_value_one_line_exit_2_nothing_written(run, tmp_path, key, value, why, fix):
    result = run(EXTRA.get(key, "") + f"{key}={value}\n")
    assert result.exit_code == 2, result.stdout
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr
    line = errors[0]
    assert key in line and (repr(value) in line or f"{key}={value}" in line), line
    # after the value, in full: what is allowed or what to do (a long pattern wraps: fold the whitespace)
    said = " ".join(result.stderr[result.stderr.index(line) :].split())
    assert said.endswith(" " + fix), said
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

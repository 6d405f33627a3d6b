"""Settings: precedence, derived values, and one clear line per bad value (pure core, no peer
needed)."""

from __future__ import annotations

import pytest

from fsdpctl.errors import SettingsError
from fsdpctl.settings import derived, load, parse_dotenv, redacted


def test_precedence_flag_over_env_over_dotenv_over_default():
    """The environment counts under FSDPCTL_ only: the plain JOB_NODES and MODEL beside them are
    ignored."""
    cfg = load(
        dotenv={"MODEL": "13b", "JOB_NODES": "4", "SEQ_LEN": "256"},
        environ={
            "FSDPCTL_MODEL": "7b",
            "FSDPCTL_JOB_NODES": "8",
            "JOB_NODES": "x",
            "MODEL": "",
            "OTHER": "x",
        },
        flags={"MODEL": "70b"},
    )
    assert cfg.training.model == "70b" and cfg.sources["MODEL"] == "--set"
    assert cfg.job_nodes == 8 and cfg.sources["JOB_NODES"] == "environment FSDPCTL_JOB_NODES"
    assert cfg.training.seq_len == 256 and cfg.sources["SEQ_LEN"] == ".env"
    assert cfg.training.precision == "bf16" and cfg.sources["PRECISION"] == "default"


def test_derived_values_per_instance_type():
    p4 = load(
        dotenv={
            "BACKEND": "eks",
            "INSTANCE_TYPE": "p4de.24xlarge",
            "JOB_NODES": "16",
            "AWS_ACCOUNT_ID": "123456789012",
            "AWS_REGION": "us-east-1",
        }
    )
    assert derived(p4) == {
        "gpus_per_node": 8,
        "procs_per_node": 8,
        "world_size": 128,
        "efa_per_node": 4,
        "image_uri": "123456789012.dkr.ecr.us-east-1.amazonaws.com/fsdpctl-trainer:0.1.0",
        "gpu": "A100",
        "gpu_memory_gib": 80,
    }
    p5 = load(dotenv={"BACKEND": "eks", "EFA_ENABLED": "false", "GPUS_PER_NODE": "4"})
    assert (p5.efa_per_node, p5.world_size, p5.image_uri) == (0, 8, "fsdpctl-trainer:0.1.0")
    local = load(dotenv={"LOCAL_PROCS_PER_NODE": "2", "JOB_NODES": "3"})
    assert local.world_size == 6


@pytest.mark.parametrize(
    "values, line",
    [
        (
            {"INSTANCE_TYPE": "p3.16xlarge"},
            "INSTANCE_TYPE='p3.16xlarge' is not supported: use one of p4de.24xlarge",
        ),
        (
            {"GPUS_PER_NODE": "16"},
            "GPUS_PER_NODE=16 exceeds the 8 GPUs of a p5.48xlarge: use at most 8",
        ),
        ({"JOB_NODES": "0"}, "JOB_NODES='0' is too small: use at least 1"),
        ({"JOB_NODES": "many"}, "JOB_NODES='many' is not a whole number: give one, e.g. 2"),
        (
            {"RDZV_BACKEND": "zookeeper"},
            "RDZV_BACKEND='zookeeper' is not allowed: use one of c10d, etcd, etcd-v2",
        ),
        ({"JOB_NAME": "My_Job"}, "JOB_NAME='My_Job' is not valid: it must match"),
        ({"AWS_ACCOUNT_ID": "12345"}, "AWS_ACCOUNT_ID='12345' is not valid"),
        ({"IMAGE_TAG": "latest"}, "IMAGE_TAG='latest' is not allowed: pin a version"),
        ({"CAPACITY_RESERVATION_ID": "cr-1"}, "CAPACITY_RESERVATION_ID='cr-1' is not valid"),
        (
            {"SHARDING_STRATEGY": "ZERO3"},
            "SHARDING_STRATEGY='ZERO3' is not allowed: use one of FULL_SHARD",
        ),
        ({"MAX_STEPS": "1.5"}, "MAX_STEPS='1.5' is not valid: give a whole number"),
        (
            {"SHARDING_STRATEGY": "HYBRID_SHARD", "HSDP_SHARD_SIZE": "3", "JOB_NODES": "2"},
            "HSDP_SHARD_SIZE=3 does not divide the world size 2",
        ),
        (
            {"PRETRAINED": "meta-llama/Llama-2-7b-hf"},
            "HF_TOKEN is missing: PRETRAINED='meta-llama/Llama-2-7b-hf' is gated",
        ),
    ],
)
def test_bad_values_give_one_line_naming_key_value_and_fix(values, line):
    with pytest.raises(SettingsError) as e:
        load(dotenv=values)
    assert len(e.value.lines) == 1
    # the value the line is about is named with its source: here .env (a dict given as such has no
    # lines)
    assert line in e.value.lines[0].replace(" (.env)", "", 1) and " (.env) " in e.value.lines[0]


def test_every_problem_is_reported_at_once():
    with pytest.raises(SettingsError) as e:
        load(dotenv={"JOB_NODES": "x", "RDZV_BACKEND": "y", "SEQ_LEN": "z"})
    assert len(e.value.lines) == 3


def test_unknown_dotenv_key_warns_with_the_closest_valid_key():
    cfg = load(dotenv={"SHARDING_STRATEGIE": "FULL_SHARD"})
    assert cfg.warnings == (
        ".env: unknown key SHARDING_STRATEGIE: did you mean SHARDING_STRATEGY?",
    )


def test_unknown_flag_key_is_an_error():
    with pytest.raises(SettingsError, match="--set MODLE: unknown key: did you mean MODEL"):
        load(flags={"MODLE": "7b"})


def test_malformed_dotenv_line_names_the_line():
    with pytest.raises(
        SettingsError, match="line 2: cannot parse 'this is not a setting': write KEY=VALUE"
    ):
        parse_dotenv("MODEL=7b\nthis is not a setting\n")
    assert parse_dotenv('export MODEL="7b"  # comment\n\n# x\n') == {"MODEL": "7b"}


def test_secrets_are_masked():
    cfg = load(environ={"HF_TOKEN": "hf_abcdefghijklmnopqrstuvwxyz012345"})
    assert redacted(cfg)["HF_TOKEN"] == "***"
    assert "hf_abcdefghijklmnopqrstuvwxyz012345" not in repr(cfg.settings)
    assert cfg.hf_token_value() == "hf_abcdefghijklmnopqrstuvwxyz012345"


def test_env_example_documents_every_key_with_its_default():
    """Every key with its default; the keys a named model sets itself
    (fsdptrain.config.MODEL_DEFAULT_KEYS) are there commented out as `#KEY=value` with tiny's value:
    a copy of the file used as .env must leave them to the model, since a key set in .env beats the
    model's default."""
    import re

    from conftest import ROOT
    from fsdpctl.settings import DERIVED_KEYS, setting_keys
    from fsdptrain.config import MODEL_DEFAULT_KEYS

    text = (ROOT / ".env.example").read_text()
    values = parse_dotenv(text, ".env.example")
    per_model = dict(re.findall(r"^#([A-Z][A-Z0-9_]*)=(.*)$", text, re.M))
    assert set(per_model) == {name.upper() for name in MODEL_DEFAULT_KEYS} | set(DERIVED_KEYS)
    assert set(values) | set(per_model) == set(setting_keys()) and not set(values) & set(per_model)
    assert redacted(load(dotenv={**values, **per_model})) == redacted(load())
    assert load(dotenv={**values, "MODEL": "7b"}).sources["SEQ_LEN"] == "model default"


def test_label_rules_match_apimachinery():
    """k8s.io/apimachinery/pkg/util/validation/validation.go: IsQualifiedName (an optional DNS-1123
    subdomain prefix of at most 253, then a name of at most 63 that starts and ends alphanumeric,
    with - _ . between) and IsValidLabelValue (the same as the name, possibly empty). Boundaries at
    63/64 and 253/254."""
    from fsdpctl.job.validate import label_value_problem, qualified_name_problem

    valid = ["a", "a" * 63, "A.b-c_d", "example.com/a", ("a" * 63 + ".") * 3 + "b" * 61 + "/n"]
    invalid = [
        "",
        "a" * 64,
        "-a",
        "a-",
        "/a",
        "a/",
        "Ex.com/a",
        "a/b/c",
        ("a" * 63 + ".") * 3 + "b" * 62 + "/n",
    ]
    assert len(valid[-1].split("/")[0]) == 253 and len(invalid[-1].split("/")[0]) == 254
    assert [k for k in valid if qualified_name_problem(k)] == []
    assert [k for k in invalid if not qualified_name_problem(k)] == []
    assert [v for v in ["", "a", "v" * 63, "A-b_c.1"] if label_value_problem(v)] == []
    assert [v for v in ["v" * 64, "-v", "v.", "a b", "a/b"] if not label_value_problem(v)] == []


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "1e400"])
def test_training_floats_are_finite_by_kind(value):
    with pytest.raises(SettingsError) as e:
        load(dotenv={"LR": value, "WEIGHT_DECAY": value})
    assert e.value.lines == [
        f"LR={value!r} (.env) is not a finite number: give one, e.g. 0.001",
        f"WEIGHT_DECAY={value!r} (.env) is not a finite number: give one, e.g. 0.001",
    ]


def test_a_huge_value_is_reported_by_its_size_not_echoed():
    with pytest.raises(SettingsError) as e:
        load(dotenv={"DATASET_SPLIT": "x" * 70_000})
    assert e.value.lines == [
        "DATASET_SPLIT=<70000 bytes> (.env) is too long: use at most 65536 bytes (each value reaches the "
        "trainer as one environment string, which Linux caps at 128 KiB: E2BIG)"
    ]


def test_a_nul_byte_is_no_value():
    """No environment string can carry a NUL (execve ends the string there; Python refuses it
    outright)."""
    import subprocess

    with pytest.raises(ValueError, match="embedded null byte"):
        subprocess.run(["true"], env={"TOKENIZER": "a\x00b"})
    with pytest.raises(SettingsError) as e:
        load(dotenv={"TOKENIZER": "a\x00b"})
    assert e.value.lines == [
        "TOKENIZER='a\\x00b' (.env) holds a NUL byte: remove it (no environment string can carry one)"
    ]


def test_timeout_bounds_are_what_timedelta_holds():
    """COLLECTIVE_TIMEOUT and RDZV_JOIN_TIMEOUT become datetime.timedelta(seconds=...) in torch: the
    largest accepted value makes one; a day more overflows it."""
    import datetime

    from fsdpctl.settings import INT_MAX, TIMEDELTA_MAX_SECONDS

    assert datetime.timedelta(seconds=TIMEDELTA_MAX_SECONDS) <= datetime.timedelta.max
    with pytest.raises(OverflowError):
        datetime.timedelta(seconds=TIMEDELTA_MAX_SECONDS + 86_400)
    assert INT_MAX["COLLECTIVE_TIMEOUT"] == INT_MAX["RDZV_JOIN_TIMEOUT"] == TIMEDELTA_MAX_SECONDS
    cfg = load(dotenv={"COLLECTIVE_TIMEOUT": str(TIMEDELTA_MAX_SECONDS)})
    assert cfg.training.collective_timeout == TIMEDELTA_MAX_SECONDS

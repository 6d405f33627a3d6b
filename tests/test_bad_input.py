"""Bad input, table-driven over every settings key: each bad value gives one line naming the key,
the value and the fix, exit code 2, and writes nothing. Driven through the real CLI (`manifest
--out-dir DIR`, which would write), isolated by the `cli` fixture. Each case carries the fix its
line must end with; for generated cases the allowed values or bounds come from the field's own
declaration."""

from __future__ import annotations

import dataclasses
import errno
import os
import subprocess
import sys
import typing
from pathlib import Path

import pytest

from fsdpctl.settings import (
    INT64_MAX,
    INT_MAX,
    MAX_VALUE_BYTES,
    TRAIN_KEYS_DERIVED,
    Settings,
    setting_keys,
)
from fsdptrain.config import TrainConfig

sys.path.insert(0, str(Path(__file__).parent))
from invariants import check_outcome, snapshot  # noqa: E402


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
        elif ann is float:
            yield key, "abc", "wrong type", "is not a number: give one, e.g. 30"
            if "Ge" in meta:
                yield (
                    key,
                    str(meta["Ge"].ge / 2),
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
                yield (
                    key,
                    str(kind(low) - 1),
                    "below minimum",
                    f"is too small: use at least {low:g}",
                )
            if f.metadata["max"] is not None:
                high = f.metadata["max"]
                yield (
                    key,
                    str(kind(high) + 1),
                    "above maximum",
                    f"is too large: use at most {high:g}",
                )


VPC_FIX = "needs PRIVATE_SUBNET_IDS: set the VPC's private subnets (two or more, in different AZs)"
SUBNETS_FIX = (
    "names too few subnets: give two or more distinct ones, in different AZs (EKS needs two AZs)"
)
ZONES_FIX = (
    "give each subnet's AZ in the same order, one subnet per AZ (or leave it empty: `cluster create` reads "
    "them from EC2)"
)
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
    ("VPC_ID", "vpc-0123456789abcdef0", "existing VPC without subnets", VPC_FIX),
    (
        "PRIVATE_SUBNET_IDS",
        "subnet-0123456789abcdef0",
        "one subnet (eksctl wants two)",
        SUBNETS_FIX,
    ),
    ("PRIVATE_SUBNET_IDS", "subnet-01234567,subnet-01234567", "the same subnet twice", SUBNETS_FIX),
    ("AVAILABILITY_ZONES", "us-west-2a", "fewer AZs than subnets", ZONES_FIX),
    ("AVAILABILITY_ZONES", "us-west-2a,us-west-2a", "one AZ for two subnets", ZONES_FIX),
    (
        "TENSORBOARD_DIR",
        "/tmp/tb",
        "TensorBoard events off the shared volume",
        "is not on the shared volume (SHARED_VOLUME_PATH=/fsx): the event files would vanish with each pod; "
        "use e.g. /fsx/tensorboard",
    ),
    (
        "WANDB_MODE",
        "cloud",
        "unknown W&B mode",
        "is not allowed: use one of online, offline, disabled",
    ),
    (
        "SDPA_BACKENDS",
        "flash,fast",
        "an unknown attention kernel",
        "is not allowed: give an order of cudnn, flash, efficient, math separated by commas, "
        "e.g. cudnn,flash,efficient,math",
    ),
    (
        "SDPA_BACKENDS",
        "math,math",
        "a kernel named twice",
        "names a kernel twice: give each once, e.g. cudnn,flash,efficient,math",
    ),
]
EXTRA = {
    "HSDP_SHARD_SIZE": "SHARDING_STRATEGY=HYBRID_SHARD\n",
    "GPUS_PER_NODE": "BACKEND=eks\n",
    "JOB_KIND": "BACKEND=eks\nRDZV_BACKEND=etcd\n",
    "PRIVATE_SUBNET_IDS": "VPC_ID=vpc-0123456789abcdef0\n",
    "AVAILABILITY_ZONES": "VPC_ID=vpc-0a1b2c3d\nPRIVATE_SUBNET_IDS=subnet-01234567,subnet-89abcdef\n",
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
        "WANDB_PROJECT",
    }  # any string is a valid value
    assert set(setting_keys()) - covered == free_text
    assert len(CASES) >= 60


@pytest.fixture
def run(cli, tmp_path):
    """`manifest --out-dir out` with the settings file `env_text`, checked by the shared invariants
    (tests/invariants.py) against snapshots of the whole test directory (FSDPCTL_HOME, out/ and the
    cwd)."""

    def invoke(env_text: str, *, names: tuple[str, ...] = (), codes=(0, 2)):
        (tmp_path / "bad.env").write_text(env_text)
        before = snapshot(tmp_path)
        result = cli("--env-file", "bad.env", "manifest", "--out-dir", "out")
        check_outcome(
            result,
            written_before=before,
            written_after=snapshot(tmp_path),
            names=names,
            allowed_codes=codes,
        )
        return result

    return invoke


@pytest.mark.parametrize(
    "key, value, why, fix", CASES, ids=[f"{k}={v!r}:{w}" for k, v, w, _ in CASES]
)
def test_bad_value_one_line_exit_2_nothing_written(run, tmp_path, key, value, why, fix):
    text = EXTRA.get(key, "") + f"{key}={value}\n"
    result = run(text, names=(key,), codes=(2,))
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr
    line = errors[0]
    assert key in line and (repr(value) in line or f"{key}={value}" in line), line
    # ... and where the value came from, right after it: the file as given and the key's line in it
    assert f"{key}=" in line and f" (bad.env line {text.count(chr(10))})" in line, line
    # after the value, in full: what is allowed or what to do (a long pattern wraps: fold the
    # whitespace)
    said = " ".join(result.stderr[result.stderr.index(line) :].split())
    assert said.endswith(" " + fix), said


@pytest.mark.parametrize(
    "text, expected",
    [
        ("MODEL 7b\n", "bad.env line 1: cannot parse 'MODEL 7b': write KEY=VALUE"),
        ("MODEL=7b\n'unterminated\n", "bad.env line 2: cannot parse"),
    ],
)
def test_malformed_env_lines(run, tmp_path, text, expected):
    result = run(text, names=("bad.env",), codes=(2,))
    assert expected in result.stderr


def test_unknown_key_warns_with_the_closest_and_still_works(run, tmp_path):
    result = run("MODLE=7b\nJOB_NODE=4\n", codes=(0,))
    assert "unknown key MODLE: did you mean MODEL?" in result.stderr
    assert "unknown key JOB_NODE: did you mean JOB_NODES?" in result.stderr
    assert (tmp_path / "out" / "pytorchjob-fsdp.yaml").is_file()


# ---- classes of values accepted before and failing later (issue 15): each by kind, over every key ----------

NON_FINITE = ("nan", "NaN", "inf", "-inf", "Infinity", "1e400")  # float("1e400") is inf


def _float_keys() -> list[str]:
    train = [f.metadata["env"] for f in dataclasses.fields(TrainConfig) if type(f.default) is float]
    infra = [name.upper() for name, f in Settings.model_fields.items() if f.annotation is float]
    return train + infra


def _int_keys() -> list[str]:
    train = [
        f.metadata["env"]
        for f in dataclasses.fields(TrainConfig)
        if type(f.default) is int and f.name not in TRAIN_KEYS_DERIVED
    ]
    infra = [name.upper() for name, f in Settings.model_fields.items() if f.annotation is int]
    return train + infra


FLOAT_CASES = [(key, value) for key in _float_keys() for value in NON_FINITE]


@pytest.mark.parametrize("key, value", FLOAT_CASES, ids=[f"{k}={v}" for k, v in FLOAT_CASES])
def test_every_float_key_refuses_nan_and_inf(run, key, value):
    """NaN and inf parse as floats (Python's float() takes them) and compare False with every bound,
    so a minimum alone let `LR=nan` validate and render. Refused by the float kind, for every float
    key."""
    result = run(f"{key}={value}\n", names=(f"{key}={value!r}",), codes=(2,))
    assert "is not a finite number" in result.stderr


def _int_range_cases():
    declared = {
        name.upper(): m.le
        for name, f in Settings.model_fields.items()
        for m in f.metadata
        if hasattr(m, "le")
    }
    for key in _int_keys():
        most = declared.get(key, INT_MAX.get(key, INT64_MAX))
        yield key, str(most + 1), f"is too large: use at most {most}"
        yield key, str(2**64), f"is too large: use at most {most}"  # beyond any 64-bit integer
    yield "SEED", "-1", "is too small: use at least 0"
    yield "METRICS_PORT", "-1", "is too small: use at least 0"


INT_CASES = list(_int_range_cases())


@pytest.mark.parametrize("key, value, fix", INT_CASES, ids=[f"{k}={v}" for k, v, _ in INT_CASES])
def test_every_int_key_has_a_range(run, key, value, fix):
    """Every whole number fits where it goes: int64 by kind (torch.manual_seed refuses a SEED beyond
    2**64-1 once the trainer adds its per-shard offset; Kubernetes integer fields are int64), a TCP
    port at most 65535, a timeout within datetime.timedelta's range (torch's process-group timeout
    is one)."""
    result = run(f"{key}={value}\n", names=(key,), codes=(2,))
    assert fix in " ".join(result.stderr.split())


@pytest.mark.parametrize("key, value", [("SEED", str(INT64_MAX)), ("METRICS_PORT", "65535")])
def test_the_largest_whole_number_in_range_is_taken(run, key, value):
    run(f"{key}={value}\n", codes=(0,))


@pytest.mark.parametrize("port", ["0", "65536", "99999"])
def test_registry_port_is_a_tcp_port(run, port):
    result = run(
        f"IMAGE_REGISTRY=registry.example.com:{port}\n", names=("IMAGE_REGISTRY",), codes=(2,)
    )
    assert "use a TCP port from 1 to 65535" in result.stderr


@pytest.mark.parametrize("key", sorted(setting_keys()))
def test_a_value_too_large_for_execve_is_refused_by_size(run, key):
    """Every value reaches the trainer as one environment string `KEY=value`; Linux refuses execve
    with E2BIG for any single string over MAX_ARG_STRLEN, 32 pages = 128 KiB
    (include/uapi/linux/binfmts.h). Any key's value over MAX_VALUE_BYTES is refused up front, the
    line giving its size, never the value itself."""
    value = "a" * (MAX_VALUE_BYTES + 1)
    result = run(f"{key}={value}\n", names=(key,), codes=(2,))
    assert f"{key}=<{MAX_VALUE_BYTES + 1} bytes> (bad.env line 1) is too long" in result.stderr
    assert value[:100] not in result.stderr


def test_the_size_limit_is_below_what_execve_takes():
    """The limit leaves room under MAX_ARG_STRLEN for the key: a real process starts with a value of
    MAX_VALUE_BYTES in its environment, and the kernel refuses one over 128 KiB (E2BIG)."""
    ok = subprocess.run(["true"], env={"TOKENIZER": "a" * MAX_VALUE_BYTES})
    assert ok.returncode == 0
    with pytest.raises(OSError) as e:
        subprocess.run(["true"], env={"TOKENIZER": "a" * (128 * 1024)})
    assert e.value.errno == errno.E2BIG


# JOB_NAME: the Training Operator names every pod and its Service `<job>-<replica type>-<index>`
# (training-operator pkg/core/utils.go GenGeneralName), here `<job>-worker-<n-1>`; its webhook wants
# the name itself a DNS-1035 label (pkg/webhooks/pytorch/pytorchjob_webhook.go NameIsDNS1035Label: a
# letter first). A TrainJob's pods are JobSet's `<job>-node-0-<n-1>`. Over index widths up to
# NODE_COUNT's most (64).
NAME_CASES = [(kind, nodes) for kind in ("pytorchjob", "trainjob") for nodes in (1, 2, 10, 11, 64)]


@pytest.mark.parametrize("kind, nodes", NAME_CASES, ids=[f"{k}-{n}" for k, n in NAME_CASES])
def test_job_name_leaves_room_for_every_derived_name(run, tmp_path, kind, nodes):
    middle = "-worker-" if kind == "pytorchjob" else "-node-0-"
    room = 63 - len(f"{middle}{nodes - 1}")
    base = f"BACKEND=eks\nJOB_KIND={kind}\nJOB_NODES={nodes}\nNODE_COUNT=64\n"
    too_long = "j" * (room + 1)
    result = run(base + f"JOB_NAME={too_long}\n", names=(f"JOB_NAME={too_long!r}",), codes=(2,))
    assert f"use at most {room} characters" in result.stderr
    longest = "j" * room
    run(base + f"JOB_NAME={longest}\n", codes=(0,))
    import yaml

    for path in (tmp_path / "out").glob(
        "*.yaml"
    ):  # beside them the .sha256 index (test_manifest_dir)
        for obj in yaml.safe_load_all(path.read_text()):
            assert len(obj["metadata"]["name"]) <= 63, (path, obj["metadata"]["name"])
    assert len(f"{longest}{middle}{nodes - 1}") == 63


@pytest.mark.parametrize("name", ["1job", "9", "0abc"])
def test_job_name_starting_with_a_digit_is_refused(run, name):
    result = run(f"JOB_NAME={name}\n", names=(f"JOB_NAME={name!r}",), codes=(2,))
    assert "^[a-z]" in result.stderr


# NODE_SELECTOR and TOLERATIONS keys and values, as apimachinery's IsQualifiedName and
# IsValidLabelValue (k8s.io/apimachinery/pkg/util/validation/validation.go) refuse them; each passes
# the settings' pattern.
BAD_LABELS = [
    "-zone=a",  # a name starts with an alphanumeric
    "zone-=a",  # ... and ends with one
    "a/=b",  # empty name after the prefix
    "/a=b",  # empty prefix
    "Example.COM/zone=a",  # the prefix is a DNS subdomain: lower case
    "a/b/c=d",  # one slash at most (the prefix 'a/b' is no subdomain)
    "k" * 64 + "=v",  # a name part has at most 63 characters
    "k=" + "v" * 64,  # a value has at most 63 characters
    "k=-v",  # a value starts with an alphanumeric
    "k=v.",  # ... and ends with one
    "good=ok,-bad=x",  # every pair is checked
]
GOOD_LABELS = [
    "topology.kubernetes.io/zone=us-west-2a",
    "node.kubernetes.io/instance-type=p5.48xlarge",
    "example.com/" + "n" * 63 + "=" + "v" * 63,
    "a=",
    "A_b.c=X-y_z.1",
]


@pytest.mark.parametrize("selector", BAD_LABELS)
def test_node_selector_keys_and_values_follow_the_label_rules(run, selector):
    run(f"NODE_SELECTOR={selector}\n", names=(f"NODE_SELECTOR={selector!r}",), codes=(2,))


@pytest.mark.parametrize("selector", BAD_LABELS)
def test_toleration_keys_and_values_follow_the_label_rules(run, selector):
    run(f"TOLERATIONS={selector}:NoSchedule\n", names=("TOLERATIONS",), codes=(2,))


@pytest.mark.parametrize("selector", GOOD_LABELS)
def test_valid_node_selectors_are_taken(run, tmp_path, selector):
    run(f"BACKEND=eks\nNODE_SELECTOR={selector}\n", codes=(0,))
    assert "nodeSelector" in (tmp_path / "out" / "pytorchjob-fsdp.yaml").read_text()


# ---- the settings file (--env-file) ------------------------------------------------------------------------


def _env_file_cases(tmp_path: Path) -> dict[str, tuple[str, str]]:
    """name -> (the --env-file argument, what its line says), each made in tmp_path."""
    (tmp_path / "adir").mkdir()
    (tmp_path / "latin1.env").write_bytes("MODEL=7b\n# caf\xe9\n".encode("latin-1"))
    (tmp_path / "binary.env").write_bytes(bytes(range(256)))
    (tmp_path / "plain").write_text("MODEL=7b\n")
    (tmp_path / "huge.env").write_bytes(b"#" * (2 * 1024 * 1024))
    return {
        "directory": ("adir", "--env-file adir is a directory, not a file"),
        "non-UTF-8 text": ("latin1.env", "--env-file latin1.env is not UTF-8 text"),
        "binary": ("binary.env", "--env-file binary.env is not UTF-8 text"),
        "missing, explicit": ("some/dir/.env", "--env-file some/dir/.env does not exist"),
        "missing, other name": ("missing.env", "--env-file missing.env does not exist"),
        "below a file": ("plain/.env", "--env-file plain/.env cannot be read: Not a directory"),
        "too large": ("huge.env", "--env-file huge.env has 2097152 bytes"),
    }


ENV_FILE_CASES = [
    "directory",
    "non-UTF-8 text",
    "binary",
    "missing, explicit",
    "missing, other name",
    "below a file",
    "too large",
]


@pytest.mark.parametrize("case", ENV_FILE_CASES)
@pytest.mark.parametrize("how", ["flag", "FSDPCTL_ENV_FILE"])
def test_env_file_that_is_not_a_readable_text_file(cli, tmp_path, monkeypatch, case, how):
    """Each file-system situation is one line naming the path, exit 2, nothing written; an explicit
    path that does not exist is an error (only the default ./.env may be absent), by flag or by
    variable."""
    arg, line = _env_file_cases(tmp_path)[case]
    before = snapshot(tmp_path)
    if how == "flag":
        result = cli("--env-file", arg, "manifest", "--out-dir", "out")
    else:
        monkeypatch.setenv("FSDPCTL_ENV_FILE", arg)
        result = cli("manifest", "--out-dir", "out")
    check_outcome(
        result,
        written_before=before,
        written_after=snapshot(tmp_path),
        names=(arg,),
        allowed_codes=(2,),
    )
    assert "error: " + line in result.stderr


def test_default_env_file_may_be_absent_but_not_a_directory(cli, tmp_path):
    before = snapshot(tmp_path)
    result = cli("config", "show")
    check_outcome(
        result, written_before=before, written_after=snapshot(tmp_path), allowed_codes=(0,)
    )
    (tmp_path / ".env").mkdir()
    before = snapshot(tmp_path)
    result = cli("config", "show")
    check_outcome(
        result,
        written_before=before,
        written_after=snapshot(tmp_path),
        names=(".env",),
        allowed_codes=(2,),
    )


@pytest.mark.parametrize("kind", ["fifo", "fifo-default", "socket"])
def test_env_file_fifo_or_socket_does_not_hang(cli, tmp_path, kind):
    """open() of a FIFO blocks until a writer opens it: `--env-file FIFO` hung forever. The real
    executable, with a timeout: the file type is checked before opening, so it answers at once."""
    import socket

    path = tmp_path / (".env" if kind == "fifo-default" else "settings.env")
    if kind.startswith("fifo"):
        os.mkfifo(path)
    else:
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(path))
    args = () if kind == "fifo-default" else ("--env-file", path.name)
    before = snapshot(tmp_path)
    result = cli.run(*args, "manifest", "--out-dir", "out", timeout=60)
    check_outcome(
        result,
        written_before=before,
        written_after=snapshot(tmp_path),
        names=(path.name,),
        allowed_codes=(2,),
    )
    assert "is not a regular file" in result.stderr


# ---- where output goes: manifest --out-dir ----------------------------------------------------------------


@pytest.fixture
def tmpfs(tmp_path):
    """A 1 MiB tmpfs this test mounts (root only), unmounted in teardown: a real full disk, a real
    read-only file system."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (CI runs as root)")
    mounted = []

    def mount(name: str, *options: str) -> Path:
        where = tmp_path / name
        where.mkdir()
        opts = ",".join(("size=1m", *options))
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(where)], capture_output=True
        )
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
        mounted.append(where)
        return where

    yield mount
    for where in reversed(mounted):
        subprocess.run(["umount", str(where)], check=False)


def _manifest_into(cli, tmp_path, out: str, *, codes, names=()):
    before = snapshot(tmp_path)
    result = cli("manifest", "--out-dir", out)
    check_outcome(
        result,
        written_before=before,
        written_after=snapshot(tmp_path),
        names=names,
        allowed_codes=codes,
    )
    return result


@pytest.mark.parametrize("out", ["taken", "taken/below", "taken/below/deeper"])
def test_manifest_out_dir_where_a_file_is(cli, tmp_path, out):
    (tmp_path / "taken").write_text("a file the user keeps\n")
    result = _manifest_into(cli, tmp_path, out, codes=(2,), names=(f"--out-dir {out}",))
    assert "is not a directory (a file is in the way)" in result.stderr
    assert (tmp_path / "taken").read_text() == "a file the user keeps\n"


def test_manifest_out_dir_on_a_read_only_file_system(cli, tmp_path, tmpfs):
    ro = tmpfs("ro", "ro")
    result = _manifest_into(
        cli, tmp_path, f"{ro.name}/out", codes=(2,), names=("--out-dir ro/out",)
    )
    assert "cannot be written: Read-only file system" in result.stderr


def test_manifest_out_dir_unwritable_for_a_user(cli, tmp_path):
    """EACCES as an ordinary user sees it (root passes permission bits: skipped there, the read-only
    file system above stands in)."""
    if os.geteuid() == 0:
        pytest.skip("root writes through permission bits")
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    result = _manifest_into(
        cli, tmp_path, "locked/out", codes=(2,), names=("--out-dir locked/out",)
    )
    assert "Permission denied" in result.stderr


@pytest.mark.parametrize("out", ["full", "full/new/deeper"])
def test_manifest_out_dir_on_a_full_disk(cli, tmp_path, tmpfs, out):
    """ENOSPC on a real 1 MiB tmpfs filled up: exit 1 (the disk, not the input), one line, and
    nothing left behind: no half file, no temp directory, no folder the command made."""
    full = tmpfs("full")
    with open(full / "filler", "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError as e:
            assert e.errno == errno.ENOSPC
    result = _manifest_into(cli, tmp_path, out, codes=(1,), names=(f"--out-dir {out}",))
    assert "no space left on its device; nothing was written" in result.stderr
    assert sorted(p.name for p in full.iterdir()) == ["filler"]


# ---- float options: one shared callback (cli/common.finite) ---------------------------------------------

FLOAT_OPTIONS = [
    (("plan",), "--mfu", "from 0 to 1"),
    (("plan",), "--tokens", "above 0"),
    (("plan",), "--price", "from 0 to 1e+06"),
    (("job", "wait", "fsdp"), "--timeout", "of at least 0"),
    (("job", "status", "fsdp"), "--stall-after", "of at least 0"),
    (("deploy", "operator"), "--timeout", "of at least 0"),
]
BAD_FLOATS = ["nan", "inf", "-inf", "-1", "1e400"]


@pytest.mark.parametrize("value", BAD_FLOATS)
@pytest.mark.parametrize(
    "argv, option, span", FLOAT_OPTIONS, ids=[" ".join((*a, o)) for a, o, _ in FLOAT_OPTIONS]
)
def test_float_options_take_only_finite_numbers_in_range(cli, tmp_path, argv, option, span, value):
    """click parses `nan` and `inf` as floats; `job wait --timeout nan` waited forever. Every float
    option goes through one callback: one line naming the option, exit 2, before anything runs."""
    before = snapshot(tmp_path)
    result = cli(*argv, option, value)
    check_outcome(
        result,
        written_before=before,
        written_after=snapshot(tmp_path),
        names=(option,),
        allowed_codes=(2,),
    )
    assert f"give a finite number {span}" in result.stderr


@pytest.mark.parametrize(
    "option, value",
    [("--mfu", "1.5"), ("--tokens", "0"), ("--tokens", "1e308"), ("--price", "1e308")],
)
def test_plan_bounds_beyond_the_sign(cli, tmp_path, option, value):
    """Beyond the sign: an MFU is a fraction; tokens and prices have maxima far past any real run
    that keep time and cost finite (1e308 tokens printed `$inf`)."""
    before = snapshot(tmp_path)
    result = cli("plan", option, value)
    check_outcome(
        result,
        written_before=before,
        written_after=snapshot(tmp_path),
        names=(option,),
        allowed_codes=(2,),
    )


def test_plan_takes_finite_values_in_range(cli, tmp_path):
    before = snapshot(tmp_path)
    result = cli("plan", "--mfu", "0.4", "--tokens", "1e9", "--price", "0", "-o", "json")
    check_outcome(
        result, written_before=before, written_after=snapshot(tmp_path), allowed_codes=(0,)
    )
    assert "NaN" not in result.stdout and "Infinity" not in result.stdout


# ---- outside systems out of reach ------------------------------------------------------------------------


def test_deploy_fetch_offline_is_one_line_and_leaves_no_folder(cli, tmp_path, monkeypatch):
    """Offline as urllib sees it: every request goes to a proxy on a port nothing listens on
    (ECONNREFUSED, urllib's URLError), whatever the network of the machine running the test."""
    from fsdpctl.adapters.etcd import free_port

    proxy = f"http://127.0.0.1:{free_port()}"
    for var in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY"):
        monkeypatch.setenv(var, proxy)
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)
    before = snapshot(tmp_path)
    result = cli("deploy", "fetch")
    check_outcome(
        result,
        written_before=before,
        written_after=snapshot(tmp_path),
        names=("https://",),
        allowed_codes=(1,),
    )
    assert (
        "cannot download https://" in result.stderr and "  hint: check the network" in result.stderr
    )


@pytest.mark.parametrize("command", [("cluster", "create"), ("cluster", "delete", "--yes")])
def test_cluster_without_aws_credentials_is_one_line_with_a_hint(
    cli, tmp_path, monkeypatch, command
):
    """botocore's NoCredentialsError (no keys in the environment, no shared files, no instance
    metadata) is one line and a hint, exit 1, never a traceback, and nothing written (the tool's
    input, clusterconfig.yaml, only once AWS has answered)."""
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    result = cli(*command)
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    assert not (cli.home / "clusters").exists() or not any((cli.home / "clusters").rglob("*"))
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors == ["error: NoCredentialsError: Unable to locate credentials"], result.stderr
    hint = result.stderr.splitlines()[result.stderr.splitlines().index(errors[0]) + 1]
    assert hint.startswith("  hint: check credentials")


@pytest.mark.parametrize(
    "content, line",
    [
        (bytes(range(256)), "is not text (byte 128 is not UTF-8)"),
        (b"hf_" + b"a" * 30 + b"\0tail", "does not hold one token"),
        (b"hf_one hf_two\n", "does not hold one token"),
    ],
    ids=["binary", "NUL inside", "two words"],
)
def test_hf_token_file_that_is_not_one_token(cli, tmp_path, content, line):
    """The token file is read at the last moment (the Secret, the launchers' environment): a binary
    or garbled file is one line naming HF_TOKEN_FILE, exit 2, no job started and nothing written;
    its content never shown."""
    token_file = tmp_path / "token"
    token_file.write_bytes(content)
    before = snapshot(tmp_path)
    result = cli(
        "--set",
        f"HF_TOKEN_FILE={token_file}",
        "--set",
        "JOB_NODES=1",
        "--set",
        "MAX_STEPS=1",
        "--set",
        "WARMUP_STEPS=0",
        "job",
        "run",
    )
    check_outcome(
        result,
        written_before=before,
        written_after=snapshot(tmp_path),
        secrets=("hf_" + "a" * 30, "hf_one", "hf_two"),
        names=("HF_TOKEN_FILE",),
        allowed_codes=(2,),
    )
    assert line in result.stderr

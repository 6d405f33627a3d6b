"""Run records (fsdpctl.job.record, fsdptrain.fingerprint): built from generated settings, hashed,
written as a .env that loads back to the same run, compared, checked for drift. Pure and fast; the
real runs are in tests/test_record_runs.py (local, slow) and tests/test_record_kube.py (the
Kubernetes API peer)."""

from __future__ import annotations

import json
import shutil

import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from fsdpctl.backends.eks import configmap
from fsdpctl.job import record, record_view
from fsdpctl.redact import secret_kind
from fsdpctl.settings import load, parse_dotenv
from fsdptrain import events, fingerprint

TOKEN = "hf_RecordTestTokenAbCdEfGhIjKlMnOpQr"
CODE = {
    "fsdpctl": "0.1.0",
    "fsdptrain": "0.1.0",
    "commit": "a" * 40,
    "dirty": False,
    "diff_sha256": None,
}
# keys whose value is free text (no pattern, no choice): where quoting is tested
# (AWS_PROFILE and KUBE_CONTEXT have a shape now, one printable line: settings/rules.py SHAPES)
FREE_TEXT = ("DATASET_TEXT_FIELD", "DATASET_SPLIT", "WANDB_PROJECT")
# one other valid value per key of a sample: a setting changed between two runs
OTHER = {
    "LR": "0.002",
    "MAX_STEPS": "7",
    "SEED": "99",
    "JOB_NODES": "1",
    "PRECISION": "fp32",
    "SHARDING_STRATEGY": "NO_SHARD",
    "GRAD_ACCUM_STEPS": "3",
    "DATASET_SPLIT": "validation",
    "WARMUP_STEPS": "0",
    "DETERMINISTIC": "false",
    "IMAGE_TAG": "0.2.0",
    "CHECKPOINT_KEEP": "5",
}
# any text a .env line may hold: quotes, backslashes, '#', '$', spaces, newlines; no NUL (no
# environment string carries one: settings refuses it) and nothing shaped like a secret (masked by
# design)
TEXT = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=40
).filter(lambda s: not secret_kind(s))


def _cfg(backend: str = "local", token: str = TOKEN, **flags: str):
    return load(environ={"HF_TOKEN": token} if token else {}, flags={"BACKEND": backend, **flags})


def _rec(cfg, run_id: str = "job-1", code: dict | None = None, image: dict | None = None):
    return record.build(
        cfg, run_id=run_id, code=code or CODE, image=image, created=1.0, secret_name="fsdp-hf-token"
    )


@hsettings(max_examples=300, deadline=None)
@given(value=TEXT)
def test_a_quoted_value_reads_back_unchanged_through_python_dotenv(value):
    """python-dotenv's own parser (dotenv.parser.parse_stream: a bare value ends at whitespace+'#',
    a single-quoted one unescapes only \\ and \') is the peer: whatever the text, the line gives it
    back."""
    assert parse_dotenv(f"K={record_view.quoted(value)}  # a source\n") == {"K": value}


@hsettings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(key=st.sampled_from(FREE_TEXT), value=TEXT, backend=st.sampled_from(["local", "eks"]))
def test_the_env_of_a_record_loads_back_to_the_same_resolved_settings(key, value, backend):
    """`job describe -o env` read back as a .env file is read (settings.parse_dotenv, then
    settings.load) gives every resolved value again, training and infrastructure, for any text value
    of a free-text key."""
    cfg = _cfg(backend, **{key: value})
    rec = _rec(cfg)
    text = record_view.env_text(rec)
    again = load(dotenv=parse_dotenv(text), flags={})
    assert record.resolved_settings(again) == record.resolved_settings(cfg)
    assert again.training == cfg.training and again.settings.model_dump(
        exclude={"hf_token"}
    ) == cfg.settings.model_dump(exclude={"hf_token"})
    assert TOKEN not in text and TOKEN not in json.dumps(rec)
    assert (
        "# HF_TOKEN=<secret: " in text and not again.hf_token.get_secret_value()
    )  # a reference, no value


@pytest.mark.parametrize(
    "backend, where", [("local", "the environment of `job run`"), ("eks", "fsdp-hf-token")]
)
def test_a_secret_is_recorded_as_where_it_lives(backend, where):
    rec = _rec(_cfg(backend))
    assert where in rec["secrets"]["HF_TOKEN"] and "HF_TOKEN" not in rec["settings"]
    assert TOKEN not in json.dumps(rec) + record_view.env_text(rec)
    assert _rec(_cfg(backend, token=""))["secrets"] == {}  # no token, no reference


def test_a_token_pasted_into_another_key_is_masked_in_the_record():
    rec = _rec(_cfg(DATASET_TEXT_FIELD=TOKEN))
    assert rec["settings"]["DATASET_TEXT_FIELD"] == "***" and TOKEN not in json.dumps(rec)


@pytest.mark.parametrize("part", record.MADE)
def test_the_id_covers_what_made_the_run_and_nothing_learnt_later(part):
    rec = _rec(_cfg("eks"), image={"uri": "r/fsdpctl-trainer:0.1.0", "digest": None})
    assert record.problem(rec) is None and rec["id"] == rec["hash"][: record.ID_CHARS]
    changed = {**rec, part: {"changed": True}}
    assert record.digest(changed) != rec["hash"] and record.problem(
        changed
    )  # a tampered record is refused
    fp = {"source": "builtin", "local": False}
    trainer = {"python": "3", "torch": "x", "transformers": "5", "dataset": fp, "tokenizer": fp}
    later = {**rec, "trainer": trainer, "manifests": "kind: X", "sources": {}, "created": 9.0}
    later["image"] = {**rec["image"], "digest": "sha256:" + "0" * 64}  # learnt from a pod: same run
    assert record.digest(later) == rec["hash"] and record.problem(later) is None


def test_two_runs_of_the_same_settings_have_different_ids():
    cfg = _cfg()
    assert _rec(cfg, "job-1")["id"] != _rec(cfg, "job-2")["id"]


@pytest.mark.parametrize("key", sorted(OTHER))
def test_diff_names_only_the_setting_that_differs(key):
    """Any one key changed between two runs: `diff` names it, and nothing else among the settings."""
    a = _rec(_cfg(MAX_STEPS="5"), "a")
    b = _rec(_cfg(**{"MAX_STEPS": "5", key: OTHER[key]}), "b")
    d = record_view.diff(a, b)
    assert list(d["settings"]) == [key] and d["settings"][key] == [a["settings"][key], OTHER[key]]
    assert d["versions"] == {} and d["data"] == {} and d["placement"] == {}


def test_diff_keeps_placement_apart_and_compares_versions_and_data():
    a = _rec(_cfg(), "a")
    b = _rec(_cfg(JOB_NAME="other"), "b")
    b = {
        **b,
        "code": {**CODE, "commit": "b" * 40},
        "trainer": {"torch": "2.9", "dataset": {"digest": "d"}},
    }
    d = record_view.diff(a, b)
    assert d["settings"] == {} and d["placement"] == {"JOB_NAME": ["fsdp", "other"]}
    assert d["versions"]["commit"] == ["a" * 40, "b" * 40] and d["versions"]["torch"] == [
        None,
        "2.9",
    ]
    assert d["data"] == {"dataset": [None, "d"]}


def test_fingerprint_is_where_independent_and_sees_a_changed_head(tmp_path):
    data = tmp_path / "data"
    (data / "shards").mkdir(parents=True)
    (data / "shards" / "a.jsonl").write_bytes(b'{"text": "one"}\n' * 1000)
    (data / "b.txt").write_text("two\n")
    (data / ".cache").mkdir()
    (data / ".cache" / "x").write_text("not data")
    here = fingerprint.fingerprint("/fsx/data", str(data))
    moved = tmp_path / "elsewhere"
    shutil.copytree(data, moved)
    assert fingerprint.fingerprint("/other", str(moved))["digest"] == here["digest"]
    assert here["files"] == 2 and [e["name"] for e in here["listed"]] == ["b.txt", "shards/a.jsonl"]
    (moved / "b.txt").write_text("TWO\n")  # same size, other bytes
    now = fingerprint.fingerprint("/other", str(moved))
    assert now["digest"] != here["digest"] and "changed: b.txt" in fingerprint.difference(here, now)
    assert fingerprint.fingerprint("org/hub-set") == {"source": "org/hub-set", "local": False}
    assert (
        fingerprint.difference(here, {"source": "x", "local": False}) is None
    )  # not comparable: no claim


def test_drift_names_the_code_and_the_data_that_differ(tmp_path):
    (tmp_path / "corpus.txt").write_text("hello\n")
    fp = fingerprint.fingerprint(str(tmp_path / "corpus.txt"))
    rec = {**_rec(_cfg()), "trainer": {"dataset": fp, "tokenizer": {"source": "t", "local": False}}}
    assert record_view.drift(rec, code=CODE, data={"dataset": fp}) == []
    dirty = {**CODE, "dirty": True, "diff_sha256": "f" * 64}
    assert record_view.drift(rec, code=dirty, data={}) == [
        "code: uncommitted changes (git diff HEAD) were none, now sha256 ffffffffffff"
    ]
    assert record_view.drift(rec, code={**CODE, "commit": "c" * 40}, data={}) == [
        f"code: commit was {'a' * 40}, now {'c' * 40}"
    ]
    (tmp_path / "corpus.txt").write_text("hello, changed\n")
    [line] = record_view.drift(
        rec, code=CODE, data={"dataset": fingerprint.fingerprint(str(tmp_path / "corpus.txt"))}
    )
    assert line.startswith(f"dataset ({tmp_path / 'corpus.txt'}): 1 files/6 bytes then, 1/15 now")


def test_the_start_event_round_trips_and_joins_only_its_own_record():
    rec = _rec(_cfg())
    start = events.Start(
        record_id=rec["id"],
        python="3.11",
        torch="2.6.0",
        transformers="4.50",
        cuda=None,
        nccl=None,
        device="cpu",
        start_step=0,
        dataset={"source": "builtin", "local": False},
        tokenizer={"source": "builtin", "local": False},
        time=1.0,
    )
    line = events.to_line(start)
    assert list(events.parse([line])) == [start]
    assert record.learnt(rec, ["noise", line])["trainer"]["torch"] == "2.6.0"
    from dataclasses import replace

    other = events.to_line(replace(start, record_id="someone-else"))
    assert (
        record.learnt(rec, [other]) == rec
    )  # another run's start line (a shared log): not this record's


def test_losses_come_from_the_summary_else_the_step_lines():
    def step(s: int, loss: float) -> str:
        return json.dumps(
            {
                "event": "step",
                "step": s,
                "max_steps": 9,
                "loss": loss,
                "step_time_s": 1,
                "time": 1,
                "tokens_per_s": 1,
            }
        )

    assert record.losses([step(2, 5.0), step(4, 4.0)]) == {
        2: 5.0,
        4: 4.0,
    }  # LOG_INTERVAL=2: every other
    summary = {
        "event": "summary",
        "steps": 2,
        "start_step": 2,
        "final_loss": 3.0,
        "first_loss": 3.5,
        "losses": [3.5, 3.0],
        "tokens_per_s": 1,
        "tokens_per_s_per_device": 1,
        "mfu": None,
        "param_bytes": 0,
        "grad_bytes": 0,
        "optim_bytes": 0,
        "activation_bytes": 0,
        "checkpoint": None,
        "export": None,
        "stopped": False,
    }
    assert record.losses([step(4, 9.0), json.dumps(summary)]) == {3: 3.5, 4: 3.0}


def test_the_config_map_holds_the_record_and_leaves_out_manifests_over_a_mebibyte():
    """kubernetes.io/docs/concepts/configuration/configmap: "The data stored in a ConfigMap cannot
    exceed 1 MiB"."""
    rec = {**_rec(_cfg("eks")), "manifests": "kind: PyTorchJob\n"}
    cm = configmap.config_map(rec, "fsdp")
    assert (
        cm["metadata"]["name"] == "fsdp-record"
        and cm["metadata"]["annotations"][configmap.ANNOTATION] == rec["hash"]
    )
    assert configmap.from_config_map(cm) == rec and TOKEN not in json.dumps(cm)
    big = {**rec, "manifests": "x" * configmap.CONFIG_MAP_MAX_BYTES}
    data = configmap.config_map(big, "fsdp")["data"]
    assert "manifests.yaml" not in data and "1 MiB" in data["manifests.note"]
    assert sum(len(v.encode()) for v in data.values()) < configmap.CONFIG_MAP_MAX_BYTES


def test_the_image_digest_comes_from_the_pods_container_status():
    """ContainerStatus.imageID (Kubernetes API reference, core/v1): the image the runtime resolved,
    e.g. containerd's `repo@sha256:...` or dockershim's `docker-pullable://repo@sha256:...`."""
    digest = "sha256:" + "ab" * 32
    pods = [
        {"metadata": {"name": "p0"}, "status": {}},
        {
            "metadata": {"name": "p1"},
            "status": {
                "containerStatuses": [
                    {"name": "sidecar", "imageID": "x@sha256:" + "cd" * 32},
                    {"name": "pytorch", "imageID": f"docker-pullable://r/fsdpctl-trainer@{digest}"},
                ]
            },
        },
    ]
    assert configmap.image_digest(pods, "pytorch") == (digest, "p1")
    rec = _rec(_cfg("eks"))
    rec = {**rec, "image": {"uri": "r/fsdpctl-trainer:0.1.0", "digest": None}}
    assert configmap.with_digest(rec, (digest, "p1"))["image"]["digest"] == digest
    assert configmap.image_digest(pods[:1], "pytorch") is None


@hsettings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    losses=st.lists(st.floats(0.01, 20, allow_nan=False), min_size=1, max_size=20),
    start_step=st.integers(0, 50),
    ended=st.booleans(),
)
def test_a_record_keeps_the_losses_of_an_ended_run_and_its_id(losses, start_step, ended):
    """An ended run's losses are kept in its record (`learnt`), so a later `job diff` has them when
    the log went with the run's pods (EKS: a rerun replaces the job; the kubelet serves a pod's log
    only while the pod exists). What is kept changes neither the record's id nor its validity; a
    run still going keeps none yet; a tampered kept loss makes the record refused."""
    rec = _rec(_cfg("eks"))
    start = events.Start(
        record_id=rec["id"], python="3.11", torch="2.6.0", transformers="4.50", cuda=None,
        nccl=None, device="cpu", start_step=start_step,
        dataset={"source": "builtin", "local": False},
        tokenizer={"source": "builtin", "local": False}, time=1.0,
    )  # fmt: skip
    log = [events.to_line(start)]
    if ended:
        from dataclasses import replace

        from test_events import SUMMARY

        log.append(events.to_line(replace(SUMMARY, start_step=start_step, losses=losses)))
    now = record.learnt(rec, log)
    assert now["id"] == rec["id"] and record.problem(now) is None
    want = {start_step + 1 + i: x for i, x in enumerate(losses)} if ended else {}
    assert record.kept_losses(json.loads(json.dumps(now))) == want
    if ended:
        assert record.problem({**now, "losses": {"1": "nan"}}) is not None
        assert record.problem({**now, "losses": {"x": 1.0}}) is not None


@pytest.mark.parametrize("model", ["", "7b"])
def test_a_copy_of_the_env_example_sets_no_key_off_its_default(tmp_path, model):
    """After `cp .env.example .env` every key comes from `.env line N`, each at its default: `job
    describe` listed about 90 keys as "not at their default" (issue 44). Only what differs from the
    defaults (the model's own, for a model's keys) is listed, with where it came from."""
    from conftest import ROOT
    from fsdpctl.settings import parse_dotenv

    dotenv = parse_dotenv((ROOT / ".env.example").read_text())
    if model:
        dotenv = {**dotenv, "MODEL": model}  # its MICRO_BATCH_SIZE, LR, ...: the model's defaults
    rec = _rec(load(dotenv={**dotenv, "SEED": "99"}))
    assert all(src.startswith(".env") for k, src in rec["sources"].items() if k in dotenv)
    chosen = record_view.not_default(rec, record_view.defaults_of(rec["settings"]["MODEL"]))
    assert set(chosen) == {"SEED", *(["MODEL"] if model else [])}
    assert chosen["SEED"] == ("99", ".env")

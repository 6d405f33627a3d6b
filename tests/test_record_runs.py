"""Run records of real local jobs (torchrun on CPU, gloo): a run, its rerun from the record, a rerun
with one setting changed, and a rerun refused because the data changed. One test: the three short
runs are shared. A tracked file of the checkout edited while it runs is code drift, and the rerun is
refused: as it should."""

from __future__ import annotations

import json
import shutil

import pytest

from fsdpctl.job import record
from fsdpctl.settings import load, parse_dotenv

TOKEN = "hf_RecordRunTokenZyXwVuTsRqPoNmLkJi98"
SHORT = {
    "JOB_NAME": "rec",
    "JOB_NODES": "1",
    "LOCAL_PROCS_PER_NODE": "2",
    "MAX_STEPS": "3",
    "SEQ_LEN": "32",
    "WARMUP_STEPS": "1",
    "PRECISION": "fp32",
    # a rerun of the job name would resume from the first run's checkpoint: these runs start fresh
    # each time
    "RESUME": "never",
}


def _json(r) -> dict:
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


@pytest.mark.slow
def test_a_rerun_from_the_record_trains_the_same_losses_and_diff_names_the_one_changed_setting(
    cli, tmp_path, assets
):
    corpus = tmp_path / "data" / "corpus.txt"
    corpus.parent.mkdir()
    shutil.copy(assets[0], corpus)
    (tmp_path / "run.env").write_text(
        f"HF_TOKEN={TOKEN}\nDATASET={corpus}\n" + "".join(f"{k}={v}\n" for k, v in SHORT.items())
    )
    env = ("--env-file", "run.env")  # the token, as a user's .env holds it
    first = cli(*env, "job", "run")
    assert first.exit_code == 0, first.output
    a = _json(cli("job", "describe", "rec", "-o", "json"))
    assert (
        a["trainer"]["torch"] and a["trainer"]["cuda"] is None and a["trainer"]["start_step"] == 0
    )
    assert a["trainer"]["dataset"]["digest"] and a["trainer"]["tokenizer"]["local"]
    where = f"run.env line {3 + list(SHORT).index('MAX_STEPS')}"  # after HF_TOKEN and DATASET
    assert a["sources"]["MAX_STEPS"] == where and "HF_TOKEN" in a["secrets"]

    # the .env of the record is the run: loaded back, the same resolved settings
    text = cli("job", "describe", a["run_id"], "-o", "env").stdout
    assert record.resolved_settings(load(dotenv=parse_dotenv(text))) == a["settings"]

    again = cli(*env, "job", "rerun", a["run_id"])
    assert again.exit_code == 0, again.output
    b = _json(cli("job", "describe", "rec", "-o", "json"))
    assert b["run_id"] != a["run_id"] and b["id"] != a["id"]
    # the same settings but where a rerun lives and starts: a directory of its own, the start of its
    # run
    assert {k: v for k, v in b["settings"].items() if k not in record.PLACEMENT} == {
        k: v for k, v in a["settings"].items() if k not in record.PLACEMENT
    }
    assert b["settings"]["CHECKPOINT_SUBDIR"] == f"reruns/{b['run_id']}"
    assert b["settings"]["RESUME"] == "never"  # its run started afresh
    assert b["sources"]["MAX_STEPS"] == f"record {a['id']}: {where}"
    same = _json(cli("job", "diff", a["run_id"], b["run_id"], "-o", "json"))
    assert same["settings"] == {} and same["versions"] == {} and same["data"] == {}
    assert [r["step"] for r in same["losses"]] == [1, 2, 3]
    assert all(r["a"] == r["b"] for r in same["losses"]), same[
        "losses"
    ]  # CPU, fixed seed: bit-identical

    # the summary and the checkpoint name the record of the run that made them
    status = _json(cli("job", "status", "rec", "-o", "json"))
    assert status["summary"]["record_id"] == b["id"]
    meta = (
        tmp_path
        / f"home/volumes/fsx-claim/checkpoints/rec/reruns/{b['run_id']}/step-00000003/meta.json"
    )
    assert json.loads(meta.read_text())["record_id"] == b["id"]

    changed = cli(*env, "job", "rerun", a["id"], "--set", "LR=0.002")
    assert changed.exit_code == 0, changed.output
    c = _json(cli("job", "describe", "rec", "-o", "json"))
    d = _json(cli("job", "diff", a["run_id"], c["run_id"], "-o", "json"))
    assert d["settings"] == {"LR": ["0.003", "0.002"]} and d["versions"] == {} and d["data"] == {}
    table = cli("job", "diff", a["run_id"], c["run_id"]).stdout
    assert "LR: 0.003 -> 0.002" in table and "MAX_STEPS" not in table

    # the data changed since: refused, naming the file; nothing started
    corpus.write_text(corpus.read_text() + "one more line\n")
    refused = cli(*env, "job", "rerun", a["run_id"])
    assert (
        refused.exit_code == 2
        and "dataset" in refused.stderr
        and "changed: corpus.txt" in refused.stderr
    )
    assert "--allow-drift" in refused.stderr
    assert _json(cli("job", "describe", "rec", "-o", "json"))["id"] == c["id"]

    for r in (first, again, changed, refused):
        assert TOKEN not in r.output
    for path in tmp_path.rglob(
        "*"
    ):  # records, logs, state: the token reached no file but the user's own
        if path.is_file() and path.name != "run.env":
            assert TOKEN.encode() not in path.read_bytes(), path

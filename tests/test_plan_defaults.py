"""`fsdpctl plan` of the named Llama-2 models from their own defaults, `plan --table` narrowed by --model and
--nodes, and the commands `quickstart` prints at its end (issue 16).

Sources of the numbers checked here (one table, fsdptrain.config.MODEL_DEFAULTS, holds them):
- SEQ_LEN 4096: Llama 2's context, `max_position_embeddings: 4096` in meta-llama/Llama-2-7b-hf's config.json
  (and the Llama 2 paper, Touvron et al. 2023, section 2.2: "we doubled the context length" to 4k).
- MICRO_BATCH_SIZE 2 (7B), 1 (13B), 1 with full checkpointing (70B): IBM/Meta's fms-fsdp README runs and
  aws-samples/awsome-distributed-training's models/llama2_70b.txt, where the published FSDP throughput comes
  from.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from fsdpctl.plan import sweep
from fsdptrain.config import MODEL_DEFAULTS

sys.path.insert(0, str(Path(__file__).parent))
from test_golden import GOLDEN, check, normalised  # noqa: E402  (the goldens' one writer and checker)

NAMED = tuple(MODEL_DEFAULTS)


def planned(cli, *args: str) -> dict:
    r = cli("plan", *args, "-o", "json")
    assert (r.exit_code, r.stderr) == (0, ""), r.output
    return json.loads(r.stdout)["job"]


@pytest.mark.parametrize("model", NAMED)
def test_plan_of_a_named_model_starts_from_its_own_defaults(cli, model):
    """No SEQ_LEN or MICRO_BATCH_SIZE anywhere: the model's own (4096 tokens), never the tiny
    model's 128."""
    job = planned(cli, "--model", model)
    d = MODEL_DEFAULTS[model]
    assert (job["seq_len"], job["micro_batch"], job["ac"]) == (
        d.seq_len,
        d.micro_batch_size,
        d.activation_checkpointing,
    )
    assert job["seq_len"] == 4096


@pytest.mark.parametrize("model", NAMED)
@pytest.mark.parametrize("where", ["flag", "env", "dotenv"])
def test_a_value_the_user_set_wins_over_the_models(cli, monkeypatch, model, where):
    """SEQ_LEN / MICRO_BATCH_SIZE set by a flag, the environment or .env stay what the user said,
    even when it equals the tiny model's default (128, 2): being set, not being different, is what
    counts."""
    seq, mb = (128, 2) if model == "70b" else (512, 3)
    args: list[str] = ["--model", model]
    if where == "flag":
        args += ["--seq-len", str(seq), "--micro-batch", str(mb)]
    elif where == "env":
        monkeypatch.setenv("FSDPCTL_SEQ_LEN", str(seq))
        monkeypatch.setenv("FSDPCTL_MICRO_BATCH_SIZE", str(mb))
    else:
        (cli.cwd / ".env").write_text(f"SEQ_LEN={seq}\nMICRO_BATCH_SIZE={mb}\n")
    job = planned(cli, *args)
    assert (job["seq_len"], job["micro_batch"]) == (seq, mb)


def test_plan_of_7b_reports_a_realistic_mfu_not_single_digits(cli):
    """The symptom of issue 16: 7B at 128 tokens showed single-digit MFU. At its defaults the
    planner's MFU is near the compute MFU it assumes for the GPU (IBM/Meta, PyTorch blog 2024-03:
    37% on H100)."""
    r = json.loads(cli("plan", "--model", "7b", "-o", "json").stdout)
    assert r["speed"]["mfu"] > 0.30


# --- plan --table --model/--nodes --------------------------------------------------------------------


def table(cli, *args: str) -> list[dict]:
    r = cli("plan", "--table", *args, "-o", "json")
    assert (r.exit_code, r.stderr) == (0, ""), r.output
    return json.loads(r.stdout)


@pytest.mark.parametrize(
    "args, models, nodes",
    [
        ([], set(sweep.SWEEP_MODELS), set(sweep.SWEEP_NODES)),
        (["--model", "13b"], {"13b"}, set(sweep.SWEEP_NODES)),
        (["--nodes", "4"], set(sweep.SWEEP_MODELS), {4}),
        (["--model", "70b", "--nodes", "8"], {"70b"}, {8}),
    ],
)
def test_the_table_keeps_only_the_rows_asked_for_and_they_equal_the_full_tables(
    cli, args, models, nodes
):
    """Narrowing selects rows: each one is the full table's row of the same model, instance and
    nodes."""
    full = {(r["model"], r["instance_type"], r["nodes"]): r for r in table(cli)}
    rows = table(cli, *args)
    assert {r["model"] for r in rows} == models and {r["nodes"] for r in rows} == nodes
    assert len(rows) == len(models) * len(nodes) * len(sweep.SWEEP_INSTANCES)
    for r in rows:
        assert r == full[(r["model"], r["instance_type"], r["nodes"])]


@pytest.mark.parametrize("nodes", [3, 6, 32])
def test_a_node_count_off_the_sweep_is_planned_too_and_scales_against_one_node(cli, nodes):
    """--nodes outside 1..16 gives its own rows; scaling still compares with one node of the same model."""
    rows = table(cli, "--model", "13b", "--nodes", str(nodes))
    assert [r["nodes"] for r in rows] == [nodes] * len(sweep.SWEEP_INSTANCES)
    for r in rows:
        alone = json.loads(
            cli(
                "plan",
                "--model",
                "13b",
                "--nodes",
                str(nodes),
                "--instance-type",
                r["instance_type"],
                "-o",
                "json",
            ).stdout
        )
        one = json.loads(
            cli(
                "plan",
                "--model",
                "13b",
                "--nodes",
                "1",
                "--instance-type",
                r["instance_type"],
                "-o",
                "json",
            ).stdout
        )
        assert r["memory_gib"] == alone["memory_gib"]["total"]
        per_gpu = alone["speed"]["tokens_per_s_per_gpu"]
        assert r["scaling"] == pytest.approx(per_gpu / one["speed"]["tokens_per_s_per_gpu"])


def test_a_bad_node_count_is_one_line_and_exit_2(cli):
    r = cli("plan", "--table", "--nodes", "0")
    assert (
        r.exit_code == 2
        and "JOB_NODES" in r.stderr
        and "Traceback" not in r.stderr
        and r.stdout == ""
    )


def test_golden_table_of_one_model_and_size(cli):
    r = cli("plan", "--table", "--model", "13b", "--nodes", "4")
    assert (r.exit_code, r.stderr) == (0, ""), r.output
    check(GOLDEN / "cli" / "plan-table-13b-4.txt", normalised(r.stdout, cli.cwd))


# --- quickstart's next commands ----------------------------------------------------------------------


@pytest.mark.parametrize("name", ["quickstart", "qs-2", "a"])
def test_the_next_commands_name_the_job_that_ran(name):
    from fsdpctl.cli.quickstart_cmd import next_commands

    text = next_commands(name)
    assert f"fsdpctl job status {name} " in text
    assert f"fsdpctl job logs {name} " in text
    assert (
        "job status fsdp" not in text
    )  # the default JOB_NAME, which finds nothing after a quickstart


def test_each_next_command_exists_in_the_cli(cli):
    """Every command printed parses: its --help exits 0 (a renamed verb or option fails here)."""
    from fsdpctl.cli.quickstart_cmd import next_commands

    for line in next_commands("quickstart").splitlines()[1:]:
        argv = line.split("#")[0].split()
        assert argv[0] == "fsdpctl"
        r = cli(*argv[1:], "--help")
        assert r.exit_code == 0, (line, r.output)


def test_golden_next_commands():
    from fsdpctl.cli.quickstart_cmd import next_commands

    check(GOLDEN / "cli" / "quickstart-next.txt", next_commands("quickstart"))

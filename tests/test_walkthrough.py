"""The walk-through of issue 28 as one golden: a real local job (torchrun on CPU, gloo, 2 simulated nodes, the
tiny Llama) taken through `job run` -> `job stop` -> `job status` -> `job resume` -> `job rerun` -> `job diff`
-> `job history`, every command's whole output frozen in tests/golden/cli/walkthrough.txt (run ids, record
ids, times, durations, throughput, the bar's drawing and the losses' digits normalised; the difference column
of `job diff`, which must be 0.000000, is not). Besides the golden: the stop ends the run at step 5 (the
trainer holds after step 4 until its SIGTERM: FSDPTRAIN_FAILPOINT=hold-until-stop, so the output does not
depend on the machine's speed), the resume starts from that stop checkpoint with the job's own settings
although .env changed since, and the rerun of the resumed run starts from the same checkpoint in a directory
of its own and trains the same losses bit for bit.
"""

from __future__ import annotations

import json
import re
import time

import pytest

from test_golden import GOLDEN, check, normalised, without_the_clock

ENV = {
    "JOB_NAME": "walk",
    "JOB_NODES": "2",
    "MAX_STEPS": "8",
    "WARMUP_STEPS": "2",
    "PRECISION": "fp32",
    "SEQ_LEN": "32",
    "CHECKPOINT_INTERVAL": "2",
}


# what a followed job says off a terminal, a line per stage it was seen in and one every 30 s: which
# stages a poll sees depends on the machine's pace (tests/test_output_streams.py checks the lines)
SPOKEN = re.compile(r"(?m)^walk: (step \d+/\d+.*|.* \.\.\.)\n")


def _normalised(text: str, root) -> str:
    text = without_the_clock(normalised(SPOKEN.sub("", text), root))
    text = re.sub(r"\b[0-9a-f]{12}\b", "<RECORD>", text)
    text = re.sub(
        r"━[━ ]*", "<BAR> ", text
    )  # the progress bar's drawing (and how much of it is drawn)
    text = re.sub(r"\b\d+:\d\d:\d\d\b", "<ELAPSED>", text)
    text = re.sub(r"\b\d+ mean of this run \(\d+ per", "<N> mean of this run (<N> per", text)
    text = re.sub(
        r"\b(?!0\.000000\b)\d+\.\d{4,}\b", "<LOSS>", text
    )  # digits that differ across CPUs
    # what `job stop` sees after the first line depends on when it looks: the stop checkpoint, the
    # launchers
    late = re.compile(r"waiting: \d+ launchers? to exit")
    return "".join(x + "\n" for x in text.splitlines() if not late.match(x))


@pytest.mark.slow
def test_run_stop_resume_rerun_diff(cli, monkeypatch):
    (cli.cwd / ".env").write_text("".join(f"{k}={v}\n" for k, v in ENV.items()))
    said: list[str] = []

    def run(*args: str, code: int = 0):
        r = cli(*args)
        said.append(f"$ fsdpctl {' '.join(args)}\n{r.output}")
        assert r.exit_code == code, r.output
        return r

    monkeypatch.setenv("FSDPTRAIN_FAILPOINT", "hold-until-stop:4")
    run("job", "run", "-d")
    monkeypatch.delenv(
        "FSDPTRAIN_FAILPOINT"
    )  # the job's processes have it; the runs after it do not
    deadline = time.monotonic() + 300
    while json.loads(cli("job", "status", "walk", "-o", "json").stdout)["step"] < 4:
        assert time.monotonic() < deadline, "no step 4"
        time.sleep(0.3)
    run("job", "stop", "walk")
    status = run("job", "status", "walk")
    assert "step 5/8" in status.stdout and "Stopped" in status.stdout

    # .env changed since the stop: `job run` would refuse that checkpoint; `job resume` takes the
    # record's
    (cli.cwd / ".env").write_text(
        (cli.cwd / ".env").read_text().replace("PRECISION=fp32", "PRECISION=bf16")
    )
    refused = run("job", "run", code=2)
    assert "PRECISION fp32 -> bf16" in refused.stderr
    run("job", "resume", "walk")
    run("job", "rerun", "walk")
    runs = json.loads(cli("job", "history", "walk", "-o", "json").stdout)
    assert [r["from"] for r in runs] == [
        "afresh (step 0)",
        "from checkpoint step-00000005 (step 5)",
        "from checkpoint step-00000005 (step 5)",
    ]
    diff = run("job", "diff", runs[1]["run_id"], runs[2]["run_id"])
    # the same losses are said in one line, and no row differs (job diff: only differing rows)
    assert "losses: the same at all 3 steps both runs logged" in diff.stdout, diff.stdout
    assert not re.findall(r"^\s+\d+ .* \S+$", diff.stdout, re.M), diff.stdout
    run("job", "history", "walk")
    check(GOLDEN / "cli" / "walkthrough.txt", _normalised("\n".join(said), cli.cwd))

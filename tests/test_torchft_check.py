"""benchmarks/torchft_check.py where torchft is not installed (CI, the project's venv): it skips in one JSON
line with the reason and exit 0, refuses an unknown gradient path in one line with exit 2, and its judge of
a heal (both groups' weight digests equal at every step both printed after it) holds on generated step
lines. The check itself needs torchft and is run by hand (docs/reliability.md "Per-step recovery (torchft)").

The step lines are the worker's own ({"step": Manager.current_step(), "n": Manager.num_participants(),
"digest": ...}, torchft 0.2.0 torchft/manager.py); no peer is involved in what runs here."""

from __future__ import annotations

import importlib.util
import json
import os
import random
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "torchft_check.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("torchft_check", SCRIPT)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # its top level imports only the standard library
    return mod


def _run(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT)],
        env=os.environ | env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_it_skips_with_the_reason_without_torchft() -> None:
    assert importlib.util.find_spec("torchft") is None, (
        "this test is for a venv without torchft (CI's)"
    )
    done = _run({})
    assert done.returncode == 0, done.stderr
    line = json.loads(done.stdout)
    assert "torchft not installed" in line["skipped"] and "docstring" in line["skipped"]


def test_an_unknown_gradient_path_is_one_line_and_exit_2() -> None:
    done = _run({"TORCHFT_CHECK_WRAP": "fsdp"})
    assert done.returncode == 2
    assert done.stdout == "" and "Traceback" not in done.stderr
    assert (
        done.stderr.count("\n") == 1
        and "TORCHFT_CHECK_WRAP='fsdp'" in done.stderr
        and "manual" in done.stderr
    )


def _lines(digests: dict[int, float]) -> list[dict[str, Any]]:
    return [{"step": s, "n": 2, "digest": d} for s, d in digests.items()]


def test_a_heal_is_judged_on_every_common_step_after_it() -> None:
    same_weights = _load()._same_weights
    rng = random.Random(43)
    for _ in range(200):
        after = rng.randint(0, 50)
        steps = range(after - 5, after + 1 + rng.randint(1, 20))  # at least one step after the heal
        a = {s: rng.uniform(-10, 10) for s in steps}
        b = {s: d if s > after else rng.uniform(-10, 10) for s, d in a.items()}  # before: anything
        assert same_weights(_lines(a), _lines(b), after=after)
        bad = rng.choice([s for s in steps if s > after])
        b[bad] += 1e-6 * max(1.0, abs(b[bad]))  # beyond float noise: one step's weights differ
        assert not same_weights(_lines(a), _lines(b), after=after)
        assert not same_weights(
            _lines(a), _lines({s: d for s, d in a.items() if s <= after}), after=after
        )

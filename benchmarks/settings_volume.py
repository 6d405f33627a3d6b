"""The settings file at volume (issue 37): a .env of 50,000 unknown keys, read by python-dotenv's
parse_stream and by fsdpctl's one-pass reader (fsdpctl.settings.dotenv.bindings, held equal to it by
tests/test_value_shapes.py), and `fsdpctl config validate` on it end to end (the real executable:
start-up, the read, the warnings, 20 and a count). Median of N rounds, CPU time of this process for
the readers, wall time for the command. Run: .venv/bin/python benchmarks/settings_volume.py [N]"""

from __future__ import annotations

import io
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

KEYS = 50_000


def text() -> str:
    return "".join(f"K{i}={i}\n" for i in range(KEYS))  # under the 1 MiB a settings file may have


def cpu(fn) -> float:
    started = time.process_time()
    fn()
    return time.process_time() - started


def main(rounds: int) -> None:
    from dotenv.parser import parse_stream

    from fsdpctl.settings.dotenv import bindings

    body = text()
    theirs = [cpu(lambda: list(parse_stream(io.StringIO(body)))) for _ in range(rounds)]
    ours = [cpu(lambda: list(bindings(body))) for _ in range(rounds)]
    exe = Path(sys.executable).parent / "fsdpctl"
    walls, lines = [], 0
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / ".env").write_text(body)
        env = {**os.environ, "FSDPCTL_HOME": str(Path(tmp) / "home"), "NO_COLOR": "1"}
        for _ in range(rounds):
            started = time.monotonic()
            p = subprocess.run(
                [str(exe), "config", "validate"], cwd=tmp, env=env, capture_output=True, text=True
            )
            walls.append(time.monotonic() - started)
            lines = len(p.stderr.splitlines())
    print(f"| {KEYS:,} unknown keys ({len(body.encode()):,} bytes) | median of {rounds} |")
    print("|---|---|")
    print(f"| python-dotenv parse_stream, CPU s | {statistics.median(theirs):.3f} |")
    print(f"| fsdpctl bindings, CPU s | {statistics.median(ours):.3f} |")
    print(
        f"| `fsdpctl config validate`, wall s (lines on stderr: {lines}) | {statistics.median(walls):.3f} |"
    )


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 5)

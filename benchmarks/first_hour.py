"""What a new user waits for in the first hour (issue 38), measured on this machine.

python benchmarks/first_hour.py silence [--log FILE] -- COMMAND...
    runs COMMAND under a pseudo-terminal (as at a person's terminal: pip draws its progress bars) and
    reports the longest stretch with no output at all, what was last printed before it, and the total
    time. Issue 38's target for `make quickstart` from a fresh clone with a fresh venv: under 15 s.
    A fresh clone: git clone . /tmp/fresh && cd /tmp/fresh && python .../first_hour.py silence -- make
    quickstart

python benchmarks/first_hour.py first-step [--rounds N]
    starts the README's first job (the tiny Llama, 2 simulated nodes, fp32, BACKEND=local) with
    `fsdpctl job run -d` in a fresh directory and FSDPCTL_HOME, and reports the seconds from the start of
    that command to the first `fsdpctl job status -o json` that shows a step (polled every 0.2 s), and
    the step rate after it; N rounds, each job stopped after.
"""

from __future__ import annotations

import argparse
import json
import os
import pty
import re
import select
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FSDPCTL = Path(sys.executable).parent / "fsdpctl"


ANSI = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")


def visible(data: bytes) -> str:
    """What a terminal shows of `data`: escape sequences out, the last of the lines a \\r redraws."""
    text = ANSI.sub(b"", data).decode(errors="replace")
    # a pty ends lines with \r\n: that \r ends the line, it redraws nothing
    return "\n".join(line.rstrip("\r").rsplit("\r", 1)[-1] for line in text.split("\n")).strip()


def silence(command: list[str], log: Path | None) -> dict:
    """The longest stretch in which what `command` shows at a terminal (a pty) does not change: a
    progress bar redrawn with the same text is no progress."""
    pid, fd = pty.fork()
    if pid == 0:  # the child: the command on the pty
        os.execvp(command[0], command)
    start = last = time.monotonic()
    longest, before, seen, chunks = 0.0, [""], "", []
    while True:
        ready, _, _ = select.select([fd], [], [], 1.0)
        if not ready:
            continue
        try:
            data = os.read(fd, 65536)
        except OSError:  # EIO: the child closed the pty
            break
        if not data:
            break
        now = time.monotonic()
        shown = visible(data)
        if not shown or shown == seen:  # nothing new on the screen
            continue
        if now - last > longest:
            longest = now - last
            before = seen.splitlines()[-1:]
        last, seen = now, shown
        chunks.append(f"{time.monotonic() - start:8.2f} {data.decode(errors='replace')!r}\n")
    _, status = os.waitpid(pid, 0)
    if time.monotonic() - last > longest:  # quiet up to its end
        longest, before = time.monotonic() - last, seen.splitlines()[-1:]
    if log:
        log.write_text("".join(chunks))
    return {
        "command": " ".join(command),
        "exit_code": os.waitstatus_to_exitcode(status),
        "total_s": round(time.monotonic() - start, 1),
        "longest_silence_s": round(longest, 1),
        "last_output_before_it": before[0] if before else "",
    }


def _status(env: dict[str, str], cwd: Path) -> dict:
    p = subprocess.run(
        [str(FSDPCTL), "job", "status", "first", "-o", "json"],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
    )
    return json.loads(p.stdout) if p.returncode == 0 and p.stdout.strip() else {}


def first_step(rounds: int) -> dict:
    """Seconds from `job run -d` to a step in `job status`, per round."""
    waits, rates = [], []
    for _ in range(rounds):
        with tempfile.TemporaryDirectory() as tmp:
            cwd = Path(tmp)
            env = {k: v for k, v in os.environ.items() if not k.startswith("FSDPCTL_")}
            env["FSDPCTL_HOME"] = str(cwd / "home")
            shutil.copy(ROOT / ".env.example", cwd / ".env")
            with (cwd / ".env").open("a") as f:
                f.write("JOB_NAME=first\nJOB_NODES=2\nMAX_STEPS=600\nPRECISION=fp32\n")
                f.write("CHECKPOINT_INTERVAL=50\n")
            start = time.monotonic()
            subprocess.run([str(FSDPCTL), "job", "run", "-d"], env=env, cwd=cwd, check=True)
            while (step := _status(env, cwd).get("step") or 0) < 1:
                if time.monotonic() - start > 300:
                    raise SystemExit("no step within 300 s")
                time.sleep(0.2)
            waits.append(time.monotonic() - start)
            t0, s0 = time.monotonic(), step
            time.sleep(10)
            rates.append(((_status(env, cwd).get("step") or s0) - s0) / (time.monotonic() - t0))
            subprocess.run(
                [str(FSDPCTL), "job", "stop", "first"], env=env, cwd=cwd, capture_output=True
            )
    return {
        "rounds": rounds,
        "run_to_first_step_s": [round(w, 1) for w in waits],
        "median_s": round(statistics.median(waits), 1),
        "steps_per_s_after": [round(r, 1) for r in rates],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    s = sub.add_parser("silence")
    s.add_argument("--log", type=Path)
    s.add_argument("command", nargs="+")
    f = sub.add_parser("first-step")
    f.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if args.what == "silence":
        result = silence(args.command, args.log)
    else:
        result = first_step(args.rounds)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()

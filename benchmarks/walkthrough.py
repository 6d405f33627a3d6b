"""The README's first hour (its first screen and its walkthrough, as tests/test_first_hour.py types
them: a fresh clone, `make quickstart` with the install done, then every command of the walkthrough
in fresh shells at an 80-column terminal) timed on this machine as it is and with BUSY processes
spinning beside it (issue 44: the walkthrough must hold on a busy laptop, load 4):

    PYTHONPATH=src:trainer .venv/bin/python benchmarks/walkthrough.py [--busy 4] [--write]

Both legs in one run, the quiet one first; each line gives the wall time, the commands typed and
the load average (1 min) at its start and end, which says how quiet "as it is" was. --write puts
the table in BENCHMARKS.md between its `walkthrough` markers.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import test_first_hour  # noqa: E402 - the walkthrough as the tests type it, one definition

BENCHMARKS = ROOT / "BENCHMARKS.md"
START, END = "<!-- walkthrough:start -->", "<!-- walkthrough:end -->"


def _load() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def leg(busy: int) -> dict[str, float | int]:
    """The first hour once, with `busy` spinning processes beside it (ended with it)."""
    spin = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
        for _ in range(busy)
    ]
    before, started = _load(), time.monotonic()
    samples: list[float] = []
    done = threading.Event()
    sampler = threading.Thread(target=_sample, args=(samples, done), daemon=True)
    sampler.start()
    typed: list[str] = []
    original = test_first_hour.Person.type

    def counted(self, command, **kw):  # type: ignore[no-untyped-def]
        typed.append(command)
        return original(self, command, **kw)

    test_first_hour.Person.type = counted  # type: ignore[method-assign]
    try:
        with tempfile.TemporaryDirectory(prefix="fsdpctl-walk-") as tmp:
            try:
                test_first_hour.first_hour(Path(tmp))
            finally:
                _end_what_runs_under(tmp)
    finally:
        test_first_hour.Person.type = original  # type: ignore[method-assign]
        for proc in spin:
            proc.kill()
            proc.wait(timeout=30)
    wall = time.monotonic() - started
    done.set()
    sampler.join()
    return {"busy": busy, "wall_s": round(wall), "commands": len(typed), "load_before": before,
            "load_after": _load(), "load_mean": sum(samples) / max(len(samples), 1),
            "load_max": max(samples, default=before)}  # fmt: skip


def _sample(into: list[float], done: threading.Event, every: float = 5.0) -> None:
    """The 1-minute load average every few seconds while a leg runs: its start and end alone say
    little about the minutes between (other work on the machine comes and goes)."""
    while not done.wait(every):
        into.append(_load())


def _name(busy: int) -> str:
    return "as it is" if busy == 0 else f"{busy} spinning processes beside it"


def _end_what_runs_under(tmp: str) -> None:
    """The walkthrough's job, if a failed or interrupted leg left it running (its supervisor, pods
    and log relays name the leg's directory): SIGTERM, then SIGKILL what is left after 30 s."""
    import os
    import signal

    def found() -> list[int]:
        pids = []
        for entry in Path("/proc").iterdir():
            try:
                if entry.name.isdigit() and tmp.encode() in (entry / "cmdline").read_bytes():
                    pids.append(int(entry.name))
            except OSError:
                continue
        return pids

    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in found():
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 30
        while found() and time.monotonic() < deadline:
            time.sleep(0.5)


HEAD = (
    "| leg | wall time | commands typed | load (1 min) at start → end | load mean (max) | measured |\n"
    "|---|---|---|---|---|---|\n"
)


def markdown(rows: list[dict[str, float | int]]) -> str:
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    return "".join(
        f"| {_name(int(r['busy']))} | {r['wall_s']} s | {r['commands']} "
        f"| {r['load_before']:.1f} → {r['load_after']:.1f} "
        f"| {r['load_mean']:.1f} ({r['load_max']:.1f}) | {stamp} |\n"
        for r in rows
    )


def write(rows: str) -> None:
    """The section between the markers, each leg's row replaced by its new one and the other leg's
    kept (`--only` measures one leg, when the machine is as that leg needs it)."""
    text = BENCHMARKS.read_text()
    head, _, rest = text.partition(START) if START in text else (text.rstrip() + "\n\n", "", "")
    old, _, tail = rest.partition(END)
    kept = {line.split("|")[1]: line for line in old.splitlines() if _is_row(line)}
    kept.update({line.split("|")[1]: line for line in rows.splitlines()})
    table = HEAD + "".join(f"{line}\n" for line in kept.values())
    section = f"## The README's first hour, timed (`benchmarks/walkthrough.py --write`)\n\n{table}"
    BENCHMARKS.write_text(f"{head}{START}\n{section}{END}{tail or chr(10)}")


def _is_row(line: str) -> bool:
    return line.startswith("| ") and not line.startswith("| leg |")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--busy", type=int, default=test_first_hour.BUSY)
    p.add_argument("--write", action="store_true")
    p.add_argument("--only", choices=("quiet", "busy"), help="one leg (the other keeps its row)")
    args = p.parse_args()
    legs = {"quiet": 0, "busy": args.busy}
    table = markdown([leg(n) for name, n in legs.items() if args.only in (None, name)])
    if args.write:
        write(table)
    print(HEAD + table)
    return 0


if __name__ == "__main__":
    sys.exit(main())

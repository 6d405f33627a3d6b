"""CPU time a command costs before it does anything (issue 44): user + sys CPU of the child process
(resource.getrusage(RUSAGE_CHILDREN), the difference around each run), the minimum of N runs, for
`python -c pass` (the interpreter's own floor), the imports every command or every settings reader
pays (typer and rich; pydantic and the settings model), `fsdpctl version`, `fsdpctl --help`,
`fsdpctl job list` and `fsdpctl job status <missing>` on a fresh FSDPCTL_HOME. CPU time, not wall
time, and the minimum: on a machine others share, waiting for a core is not the CLI's cost.
Modules run from their cached bytecode, as an installed fsdpctl's do (a first round, not counted,
writes it).

Each command runs as the `fsdpctl` console script does (fsdpctl.entry.main), with the source tree
given first on PYTHONPATH. `--before DIR` measures a second tree (e.g. `git archive main | tar -x -C
DIR`) in the same rounds, interleaved, so both columns see the same machine.

python benchmarks/cli_start.py [--rounds 5] [--before DIR] [--write]   # --write: BENCHMARKS.md
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "BENCHMARKS.md"
BEGIN = "<!-- cli-start:begin (benchmarks/cli_start.py --write writes this section) -->"
END = "<!-- cli-start:end -->"
# the console script's own lines (pip's wrapper), so `python -c` costs what `fsdpctl` costs
SCRIPT = "import sys; from fsdpctl.entry import main; sys.argv[0] = 'fsdpctl'; sys.exit(main())"
FSDPCTL = ["-c", SCRIPT]
COMMANDS: dict[str, list[str]] = {  # python's arguments
    "`python -c pass`": ["-c", "pass"],
    # what every command imports before its own code (typer, rich), and a verb that loads the
    # settings before it reads them (pydantic and the settings model; the read verbs do without):
    # the floors the rows below sit on
    "`import typer, rich.console, rich.table`": ["-c", "import typer, rich.console, rich.table"],
    "`import pydantic`": ["-c", "import pydantic"],
    "`from fsdpctl.settings import Config` (pydantic + the settings model)": [
        "-c",
        "from fsdpctl.settings import Config",
    ],
    "`fsdpctl version`": [*FSDPCTL, "version"],
    "`fsdpctl --help`": [*FSDPCTL, "--help"],
    "`fsdpctl job list`": [*FSDPCTL, "job", "list"],
    "`fsdpctl job status missing`": [*FSDPCTL, "job", "status", "missing"],
}
TARGETS = {  # the targets, CPU seconds
    "`fsdpctl version`": 0.25,
    "`fsdpctl --help`": 0.25,
    "`fsdpctl job list`": 0.35,
    "`fsdpctl job status missing`": 0.35,
}


def argv_of(args: list[str]) -> list[str]:
    return [sys.executable, *args]


def cpu_of(argv: list[str], env: dict[str, str], cwd: str) -> float:
    """User + sys CPU seconds of one child run to its end."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(argv, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def env_for(tree: Path, home: Path) -> dict[str, str]:
    path = f"{tree / 'src'}{os.pathsep}{tree / 'trainer'}"
    env = {**os.environ, "PYTHONPATH": path, "FSDPCTL_HOME": str(home), "NO_COLOR": "1"}
    # as an installed fsdpctl runs: from cached bytecode (pip writes it; a checkout's first run
    # does), not compiling every module on every start
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def measure(trees: dict[str, Path], rounds: int) -> dict[str, dict[str, float]]:
    """{tree label: {command: min CPU s}}: every round runs every command of every tree in turn."""
    best: dict[str, dict[str, float]] = {label: {} for label in trees}
    with tempfile.TemporaryDirectory() as tmp:
        for tree in trees.values():  # not counted: writes each tree's bytecode cache
            for args in COMMANDS.values():
                cpu_of(argv_of(args), env_for(tree, Path(tmp) / "warm"), tmp)
        for _ in range(rounds):
            for label, tree in trees.items():
                home = Path(tmp) / label / "home"  # fresh: no job, no record, no config
                env = env_for(tree, home)
                for name, args in COMMANDS.items():
                    took = cpu_of(argv_of(args), env, tmp)
                    best[label][name] = min(best[label].get(name, took), took)
    return best


def section(best: dict[str, dict[str, float]], rounds: int) -> str:
    labels = list(best)
    head = " | ".join(f"{label}, CPU s" for label in labels)
    lines = [
        BEGIN,
        f"## Command start-up CPU (user + sys, min of {rounds}; `benchmarks/cli_start.py`)",
        "",
        "Each command runs as the `fsdpctl` script does, on a fresh FSDPCTL_HOME, beside `python -c "
        'pass`. Commands load lazily (docs/code-layout.md, "How commands load"); '
        "`tests/test_cli_imports.py` fails when a read verb imports torch, pydantic or a backend it "
        "does not use. `job list` and `job status` read BACKEND and JOB_NAME without the settings "
        "model (`fsdpctl.settings.reading`; on EKS and Slurm the backend loads it): they sit on "
        "typer's row, not on the model's (pydantic and the settings model, built at import), which "
        "every verb that loads the settings pays.",
        *(
            [
                "",
                "The columns ran interleaved in the same rounds; the import rows, the same code in both, "
                "show how far this machine's load moves a number.",
            ]
            if len(labels) > 1
            else []
        ),
        f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on {os.cpu_count()} cores.",
        "",
        f"| command | {head} | target |",
        "|---|" + "---|" * len(labels) + "---|",
    ]
    for name in COMMANDS:
        cells = " | ".join(f"{best[label][name]:.3f}" for label in labels)
        target = f"<= {TARGETS[name]:.2f}" if name in TARGETS else ""
        lines.append(f"| {name} | {cells} | {target} |")
    return "\n".join([*lines, END]) + "\n"


def render(text: str, new: str) -> str:
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        return head + new.rstrip("\n") + rest.split(END, 1)[1]
    return text.rstrip("\n") + "\n\n" + new


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--before", type=Path, help="a second source tree, measured as 'before'")
    ap.add_argument("--label", default="now", help="this tree's column name")
    ap.add_argument("--before-label", default="before")
    ap.add_argument("--write", action="store_true", help="rewrite the section in BENCHMARKS.md")
    args = ap.parse_args()
    trees = {args.before_label: args.before} if args.before else {}
    trees[args.label] = ROOT
    new = section(measure(trees, args.rounds), args.rounds)
    print(new, end="")
    if args.write:
        BENCHMARKS.write_text(render(BENCHMARKS.read_text(), new))


if __name__ == "__main__":
    main()

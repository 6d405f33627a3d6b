"""fsdpctl job plot|tensorboard: pictures of a job, from its step lines and its TensorBoard event
files. Registered on the `job` group by job_cmd."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Annotated

import typer

from fsdpctl.cli.common import BackendOpt, DryRunOpt, NameArg, ok, out, resolve_job
from fsdpctl.errors import BadInput, ExitCode, FsdpctlError

TENSORBOARD_PORT = 6006  # TensorBoard's own default


def plot(
    ctx: typer.Context,
    name: str | None = NameArg,
    out_file: Annotated[
        Path | None, typer.Option("--out", help="the PNG to write (default: ./NAME-steps.png)")
    ] = None,
    dry_run: DryRunOpt = False,
    backend: BackendOpt = None,
) -> None:
    """Write a PNG of loss, learning rate, tokens/s and MFU over steps. From the leader's step
    lines: locally the job's whole curve across its stops and resumes (each run from the step it
    resumed), on EKS the current run's leader pod. Exit 2 when no step finished yet. --dry-run: say
    what it would draw.

    Example: fsdpctl job plot quickstart --out loss.png
    """
    import importlib.util

    from fsdpctl.cli import plots

    if (
        importlib.util.find_spec("matplotlib") is None
    ):  # an optional extra: say so before reading anything
        raise FsdpctlError(
            "`job plot` needs matplotlib, which is not installed",
            hint="pip install 'fsdpctl[plot]'",
        )
    be, name = resolve_job(ctx, name, backend)
    path = out_file or Path(f"{name}-steps.png")
    if path.is_dir():
        raise BadInput(
            f"--out {path} is a directory", hint=f"name a file in it, e.g. {path / name}.png"
        )
    if path.suffix.lower() != ".png":
        raise BadInput(
            f"--out {path} is not a .png file", hint=f"name the file e.g. {path.stem}.png"
        )
    steps = plots.steps_of(be.history(name))
    if not steps:
        source = getattr(be, "history_source", "")  # the log it read, where the backend says
        raise FsdpctlError(
            f"job {name} has no finished step yet{f' in {source}' if source else ''}: nothing to plot",
            hint=f"`fsdpctl job status {name}` shows its phase",
            code=ExitCode.BAD_INPUT,
        )
    if dry_run:
        ok(f"dry run: would write {path} ({len(steps)} steps, {steps[0].step}..{steps[-1].step})")
        return
    plots.write_png(steps, path, title=f"{name}: steps {steps[0].step}..{steps[-1].step}")
    ok(f"wrote {path} ({len(steps)} steps, {steps[0].step}..{steps[-1].step})")


def tensorboard(
    ctx: typer.Context,
    name: str | None = NameArg,
    port: Annotated[int, typer.Option("--port", help="TensorBoard's port", min=1, max=65535)] = (
        TENSORBOARD_PORT
    ),
    print_only: Annotated[
        bool, typer.Option("--print-only", help="print the command instead of running it")
    ] = False,
    backend: BackendOpt = None,
) -> None:
    """TensorBoard on the job's event files (TENSORBOARD_DIR/<job>, one TensorBoard run per run of
    the job). Local: runs `tensorboard --logdir DIR` on this machine (Ctrl-C ends it). EKS: the
    files are on the shared volume, which only pods mount: prints how to serve them from a pod and
    reach it with kubectl port-forward.

    Example: fsdpctl job tensorboard quickstart --port 6007
    """
    be, name = resolve_job(ctx, name, backend)
    logdir = be.tensorboard_dir(name)
    if logdir is None:
        raise BadInput(
            f"job {name} was started without TENSORBOARD_DIR: it wrote no TensorBoard events",
            hint="set TENSORBOARD_DIR (e.g. --set TENSORBOARD_DIR=/fsx/tensorboard) and run the job again",
        )
    argv = ["tensorboard", "--logdir", logdir, "--port", str(port)]
    if (elsewhere := be.tensorboard_elsewhere(name, argv)) is not None:
        out.print("\n".join(elsewhere), markup=False, highlight=False)
        return
    if print_only:
        out.print(shlex.join(argv), markup=False, highlight=False)
        return
    if not Path(logdir).is_dir():
        raise FsdpctlError(
            f"{logdir} does not exist yet: job {name} has logged no step",
            hint=f"`fsdpctl job status {name}`; TensorBoard can start once a step is logged",
        )
    from fsdpctl.adapters import shell

    ok(f"TensorBoard on {logdir}: http://localhost:{port}/ (Ctrl-C ends it)")
    sys.stdout.flush()
    shell.replace_process(argv)

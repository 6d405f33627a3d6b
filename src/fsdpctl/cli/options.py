"""The options several commands share that change or check state: --dry-run (and its
`--dry-run=server` spelling), --force, and the callback of every float option (`finite`). Apart
from fsdpctl.cli.common, which re-exports them, to keep each module short."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Annotated

import typer

from fsdpctl.errors import BadInput

# One --dry-run for every command that changes state: a bare flag. Where the Kubernetes API server
# can check the objects itself, `--dry-run=server` asks it to (dryRun=All: validated and admitted,
# never stored); the root group spells that as the hidden flag below before click parses (see
# fsdpctl.cli._Group.main).
SERVER_DRY_RUN_FLAG = "--dry-run-server"


DryRunOpt = Annotated[
    bool, typer.Option("--dry-run", help="show what would change; change nothing")
]


ServerDryRunOpt = Annotated[
    bool,
    typer.Option(
        SERVER_DRY_RUN_FLAG,
        hidden=True,
        help="--dry-run=server: the API server validates and admits everything, stores nothing",
    ),
]


DRY_RUN_SPELLINGS = {"--dry-run=server": SERVER_DRY_RUN_FLAG, "--dry-run=client": "--dry-run"}


def dry_run_mode(client: bool, server: bool) -> str:
    """'' (none), 'client' or 'server'; both given is refused (exit 2) rather than one picked in
    silence, as kubectl takes one --dry-run value."""
    if client and server:
        raise BadInput(
            "--dry-run and --dry-run=server were both given",
            hint="give one: --dry-run prints what would be sent, --dry-run=server has the API server check "
            "it",
        )
    return "server" if server else "client" if client else ""


# config validate, manifest and job run refuse a job that cannot fit or be scheduled (`admit`);
# --force runs it anyway, with a warning naming each refusal it overrode.
ForceOpt = Annotated[
    bool,
    typer.Option(
        "--force",
        help="go on although the job does not fit or cannot be scheduled (each refusal is warned)",
    ),
]


def finite(
    *, minimum: float = 0.0, maximum: float | None = None, above: bool = False
) -> Callable[[typer.Context, typer.CallbackParam, float | None], float | None]:
    """The callback of every float option (`typer.Option(..., callback=finite())`): the value is a
    finite number within [minimum, maximum] (above: strictly above minimum), else one line naming
    the option, exit 2. Without it click takes `nan` and `inf` as floats: `--timeout nan` would wait
    forever."""

    def check(ctx: typer.Context, param: typer.CallbackParam, value: float | None) -> float | None:
        if value is None or ctx.resilient_parsing:
            return value
        low_ok = value > minimum if above else value >= minimum
        if math.isfinite(value) and low_ok and (maximum is None or value <= maximum):
            return value
        span = f"above {minimum:g}" if above else f"of at least {minimum:g}"
        if maximum is not None:
            span = (
                f"above {minimum:g}, at most {maximum:g}"
                if above
                else f"from {minimum:g} to {maximum:g}"
            )
        name = max(param.opts, key=len) if param.opts else str(param.name)
        raise BadInput(f"{name} {value!r} is not valid: give a finite number {span}")

    return check

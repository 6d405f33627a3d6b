"""fsdpctl sandbox: a place on this machine to try a backend, started and torn down for the user
(`sandbox slurm up|down|status`: fsdpctl.sandbox.slurm)."""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING, Annotated, cast

import typer

from fsdpctl.cli.common import (
    DryRunOpt,
    Output,
    OutputOpt,
    command_group,
    emit,
    emit_text,
    note,
    ok,
    out,
)
from fsdpctl.cli.tables import PlainTable

if TYPE_CHECKING:
    from fsdpctl.sandbox.slurm_layout import Layout

app = command_group("A place on this machine to try a backend: fsdpctl sandbox slurm up.")
slurm_app = command_group(
    "A real Slurm cluster on this machine (slurmctld, a slurmd per simulated node, munge) for BACKEND=slurm."
)
# its verbs in a session's order (the groups' shared ORDER is the job verbs', where status is second)
slurm_app.info.cls = type(
    "SandboxVerbs", (cast(type, slurm_app.info.cls),), {"ORDER": ("up", "status", "down")}
)
app.add_typer(slurm_app, name="slurm")

NodesOpt = Annotated[
    int,
    typer.Option(
        "--nodes",
        min=1,
        max=16,
        help="simulated nodes, each a slurmd in a network namespace of its own",
    ),
]


def _exports(values: dict[str, str]) -> str:
    return "".join(f"export {k}={shlex.quote(v)}\n" for k, v in values.items())


@slurm_app.command()
def up(nodes: NodesOpt = 2, dry_run: DryRunOpt = False) -> None:
    """Start munged, slurmctld and a slurmd per node, detached, and wait until every node is idle;
    print the shell exports that point Slurm's commands and fsdpctl at it (SLURM_CONF, BACKEND=slurm,
    SHARED_VOLUME_PATH, SLURM_PYTHON). Where this machine has pyxis and enroot (installed, or built by
    the tests), every node gets them: SLURM_CONTAINER_IMAGE runs a job in a container; where not,
    one line says so and the sandbox runs without. A sandbox already up is left as it is and its
    exports printed again. Needs root, iproute2, util-linux, slurm-wlm and munge (Debian's). State in
    FSDPCTL_HOME/sandbox/slurm; `down` removes it all.

    Example: eval "$(fsdpctl sandbox slurm up)"
    """
    from fsdpctl.sandbox import slurm

    where = slurm.root()
    if dry_run:
        _plan(slurm.plan(nodes, where), slurm.missing())
        return
    sb, already = slurm.up(nodes, where)
    emit_text(_exports(slurm.exports(sb)))
    names = " ".join(sb.layout.names)
    ok(f"Slurm sandbox {'already up' if already else 'up'}: {names} idle, state in {where}")
    if sb.containers is not None:
        note(
            "containers: pyxis + enroot on every node: SLURM_CONTAINER_IMAGE=<.sqsh or docker://...>"
        )
    else:  # one line, and the sandbox runs without (SLURM_PYTHON on the nodes themselves)
        note(f"containers: none, jobs run without them ({sb.no_containers})")
    note('next: eval "$(fsdpctl sandbox slurm up)"    # the exports above, in this shell')
    note(
        "      fsdpctl job run                          # sbatch of the job on the sandbox's nodes"
    )
    note("      fsdpctl sandbox slurm down               # stops it all, removes its state")


def _plan(layout: Layout, why_not: str | None) -> None:
    from fsdpctl.sandbox.slurm_layout import PARTITION

    net = layout.net
    out.print(
        f"would start in {layout.root} (munge and spool in {layout.munge_dir}):", markup=False
    )
    out.print(
        f"  munged, slurmctld (host name slurmctl, {net.host_address} on bridge {net.bridge})",
        markup=False,
    )
    for node, name in enumerate(layout.names):
        out.print(
            f"  slurmd {name} at {net.address(node)} in namespace {net.namespace(node)}",
            markup=False,
        )
    out.print(f"  partition {PARTITION}: {' '.join(layout.names)}", markup=False)
    if why_not:
        note(f"but no Slurm sandbox can start here now: {why_not}")


@slurm_app.command()
def down(dry_run: DryRunOpt = False) -> None:
    """Cancel the sandbox's jobs, stop every daemon it started (each proven by its recorded pid and
    start time, never found by name), end what is left in its nodes' namespaces, remove its network
    namespaces and links, its state and its shared directory. Nothing there: nothing to do, exit 0.

    Example: fsdpctl sandbox slurm down
    """
    from fsdpctl.sandbox import slurm

    where = slurm.root()
    found = slurm.load(where)
    if found is None:
        ok(f"no Slurm sandbox in {where}: nothing to do")
        return
    if dry_run:
        running = [n for n, alive in found.living().items() if alive]
        out.print(f"would stop {', '.join(running) or 'no daemon'}; remove {where}", markup=False)
        return
    slurm.require()
    for line in slurm.down(where):
        note(line)
    ok("Slurm sandbox down")


@slurm_app.command()
def status(output: Output = OutputOpt) -> None:
    """What runs: each daemon (pid, running or not), each node's state as sinfo says it, the
    sandbox's jobs, and its exports.

    Example: fsdpctl sandbox slurm status -o json
    """
    from fsdpctl.sandbox import slurm

    got = slurm.status(slurm.root())
    if emit(got, output):
        return
    if got is None:
        note(f"no Slurm sandbox in {slurm.root()}: fsdpctl sandbox slurm up")
        return
    table = PlainTable("daemon", "pid", "running")
    for name, d in got["daemons"].items():
        table.add_row(name, str(d["pid"]), "yes" if d["running"] else "no")
    out.print(table)
    nodes = ", ".join(f"{n} {s}" for n, s in got["nodes"].items()) or "slurmctld does not answer"
    out.print(f"nodes: {nodes}", markup=False)
    out.print(f"jobs: {' '.join(got['jobs']) or 'none'}", markup=False)
    out.print(f"containers: {got['containers']}", markup=False)

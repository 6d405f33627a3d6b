"""fsdpctl cluster check|status|create|delete: over `fsdpctl.cluster` and `fsdpctl.preflight`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from fsdpctl.cli.common import (
    DryRunOpt,
    Output,
    OutputOpt,
    command_group,
    emit,
    ok,
    out,
    report_checks,
    run_tool,
    state,
    warn,
)
from fsdpctl.errors import BadInput, FsdpctlError

if TYPE_CHECKING:
    from fsdpctl.settings import Config

app = command_group("The EKS cluster: preflight, status, create and delete (eksctl or terraform).")

ToolOpt = Annotated[str | None, typer.Option("--tool", help="eksctl or terraform (default: CLUSTER_TOOL)")]


def _config(ctx: typer.Context, tool: str | None, **overrides: str) -> Config:
    return state(ctx).config(**({"CLUSTER_TOOL": tool} if tool else {}), **overrides)


def _in_reservation_zone(ctx: typer.Context, cfg: Config, tool: str | None, dry_run: bool) -> Config:
    """With a reservation and no AVAILABILITY_ZONES, the GPU node group goes in the reservation's AZ (its
    nodes launch nowhere else). Without an answer from EC2 a real create stops; the dry run says so and
    keeps the default zones."""
    from fsdpctl import cluster
    from fsdpctl.adapters.aws import AwsError

    if cfg.availability_zones or not cfg.capacity_reservation_id:
        return cfg
    try:
        zones = cluster.reservation_zones(cfg)
    except AwsError as e:
        if not dry_run:
            hint = "set AVAILABILITY_ZONES (the reservation's AZ first) or fix the credentials"
            raise FsdpctlError(
                f"could not read the AZ of {cfg.capacity_reservation_id}: {e}", hint=hint
            ) from e
        warn(
            f"could not read the AZ of {cfg.capacity_reservation_id} ({e}); the dry run keeps the default AZs"
        )
        return cfg
    ok(f"AVAILABILITY_ZONES={zones}: the GPU node group goes in {cfg.capacity_reservation_id}'s AZ")
    return _config(ctx, tool, AVAILABILITY_ZONES=zones)


@app.command()
def check(ctx: typer.Context, output: Output = OutputOpt) -> None:
    """Preflight against AWS: credentials, instance type offered in the AZ, P-instance quota, capacity
    reservation (type, instance type, AZ, count; a Capacity Block's start and end), a cluster of the same
    name. Exit 1 on any fail.

    Example: fsdpctl --set INSTANCE_TYPE=p4de.24xlarge --set CAPACITY_RESERVATION_ID=cr-0123456789abcdef0
    cluster check
    """
    from fsdpctl import cluster, preflight

    cfg = state(ctx).config()
    report_checks(preflight.run_checks(cfg, cluster.connect(cfg)), output)


@app.command()
def status(ctx: typer.Context, output: Output = OutputOpt) -> None:
    """The cluster and its node groups as AWS reports them (instance types, sizes, state).

    Example: fsdpctl cluster status -o json
    """
    from fsdpctl import cluster

    data = cluster.status(state(ctx).config())
    if not emit(data, output):
        _print_status(data)


def _print_status(data: dict[str, Any]) -> None:
    out.print(
        f"cluster {data['name']}: {data['status']} (Kubernetes {data['version']}) {data['endpoint'] or ''}"
    )
    t = Table("node group", "status", "instance types", "desired", "min", "max")
    for g in data["nodegroups"]:
        sizes = (str(g["desired"]), str(g["min"]), str(g["max"]))
        t.add_row(g["name"], g["status"], ", ".join(g["instance_types"] or []), *sizes)
    out.print(t)


@app.command()
def create(ctx: typer.Context, tool: ToolOpt = None, dry_run: DryRunOpt = False) -> None:
    """Create the EKS cluster with eksctl (rendered ClusterConfig) or terraform (terraform/ + tfvars).

    With eksctl an existing cluster is left alone; terraform converges to the settings. The dry run writes
    the tool's input and prints it, then the commands.

    Example: fsdpctl cluster create --tool terraform --dry-run
    """
    from fsdpctl import cluster

    cfg = _in_reservation_zone(ctx, _config(ctx, tool), tool, dry_run)
    run = cluster.prepare(cfg, "create")
    if dry_run:
        out.print(run.text, markup=False, end="")
    elif cfg.cluster_tool == "eksctl" and (existing := cluster.find(cfg)):
        ok(f"cluster {cfg.cluster_name} already exists ({existing['status']}); nothing to do")
        return
    for cmd in run.commands:
        run_tool(cmd, run.log, dry_run=dry_run, comment=True, hint="`fsdpctl cluster check` for preflight")
    if dry_run:
        ok(f"dry run: {run.tool_input} written; nothing created")
    else:
        ok(f"cluster {cfg.cluster_name} created with {cfg.cluster_tool}; next: fsdpctl cluster status")


@app.command()
def delete(
    ctx: typer.Context,
    tool: ToolOpt = None,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="do not ask")] = False,
    dry_run: DryRunOpt = False,
) -> None:
    """Delete the EKS cluster (eksctl delete cluster --wait, or terraform destroy). Asks first unless --yes.

    With terraform, destroy runs whenever its state in FSDPCTL_HOME/clusters/<name>/terraform holds resources,
    also when the EKS cluster is gone (a half-failed create leaves a VPC, NAT gateway and KMS key there).

    Example: fsdpctl cluster delete --yes
    """
    from fsdpctl import cluster

    cfg = _config(ctx, tool)
    run = cluster.prepare(cfg, "delete")
    what = _what_to_delete(cfg, dry_run)
    if what is None:
        return
    if not dry_run and not yes and not typer.confirm(f"Delete {what}?", err=True):
        raise BadInput("not confirmed", hint="pass --yes to delete without asking")
    for cmd in run.commands:
        run_tool(cmd, run.log, dry_run=dry_run)
    if dry_run:
        ok(f"dry run: would delete {what}; nothing deleted")
    else:
        warn(f"cluster {cfg.cluster_name} deleted; checkpoints on its volumes are gone with it")


def _what_to_delete(cfg: Config, dry_run: bool) -> str | None:
    """What the delete commands would remove, None (said why) when there is nothing. terraform goes by its
    state alone (read offline, so the dry run tells the truth too); eksctl by the cluster in EKS."""
    from fsdpctl import cluster

    name = f"cluster {cfg.cluster_name} in {cfg.aws_region}"
    if cfg.cluster_tool == "terraform":
        resources = cluster.terraform_state(cfg)
        state_dir = cluster.workdir(cfg) / "terraform"
        if resources:
            shown = ", ".join(resources[:5]) + (", ..." if len(resources) > 5 else "")
            return f"{name}: {len(resources)} resources in the terraform state in {state_dir} ({shown})"
        if not dry_run and cluster.find(cfg):
            raise FsdpctlError(
                f"{name} exists but the terraform state in {state_dir} holds nothing: terraform destroy "
                "would delete nothing",
                hint="delete it with the tool that made it (`--tool eksctl`) or from that state's machine",
            )
        ok(f"no terraform state in {state_dir}{'' if dry_run else ' and no ' + name}; nothing to delete")
        return None
    if dry_run:
        return name + " (if it exists)"
    if not cluster.find(cfg):
        ok(f"no {name}; nothing to delete")
        return None
    return name

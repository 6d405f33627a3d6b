"""fsdpctl cluster check|status|create|delete: over `fsdpctl.cluster.lifecycle` and
`fsdpctl.cluster.preflight`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, NotRequired, TypedDict

import typer

from fsdpctl.cli.common import (
    DryRunOpt,
    Output,
    OutputOpt,
    command_group,
    emit,
    ok,
    out,
    state,
    warn,
)
from fsdpctl.cli.tables import PlainTable
from fsdpctl.cli.tools import confirm, report_checks, run_tool
from fsdpctl.errors import BadInput, FsdpctlError

if TYPE_CHECKING:
    from fsdpctl.adapters.aws_shapes import FileSystem, Request
    from fsdpctl.cluster.fsx import FsxSettings
    from fsdpctl.cluster.lifecycle import ClusterStatus
    from fsdpctl.settings import Config

app = command_group("The EKS cluster: preflight, status, create and delete (eksctl or terraform).")

ToolOpt = Annotated[
    str | None, typer.Option("--tool", help="eksctl or terraform (default: CLUSTER_TOOL)")
]


def _config(ctx: typer.Context, tool: str | None, **overrides: str) -> Config:
    # AVAILABILITY_ZONES is only ever overridden with the AZs EC2 reported (the reservation's, the
    # subnets')
    set_by = {"CLUSTER_TOOL": "--tool", "AVAILABILITY_ZONES": "EC2"}
    return state(ctx).config(**({"CLUSTER_TOOL": tool} if tool else {}), **overrides, set_by=set_by)


def _in_reservation_zone(
    ctx: typer.Context, cfg: Config, tool: str | None, dry_run: bool
) -> Config:
    """With a reservation and no AVAILABILITY_ZONES, the GPU node group goes in the reservation's AZ
    (its nodes launch nowhere else). Without an answer from EC2 a real create stops; the dry run
    says so and keeps the default zones."""
    from fsdpctl.adapters.aws import AwsError
    from fsdpctl.cluster import lifecycle as cluster

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


def _in_subnet_zones(ctx: typer.Context, cfg: Config, tool: str | None, dry_run: bool) -> Config:
    """An existing VPC's subnets checked against EC2 (in VPC_ID, one per AZ, in AVAILABILITY_ZONES'
    order) and their AZs as AVAILABILITY_ZONES, which the ClusterConfig keys them by. Without an
    answer from EC2 only a dry run with AVAILABILITY_ZONES set goes on."""
    from fsdpctl.adapters.aws import AwsError
    from fsdpctl.cluster import lifecycle as cluster

    if not cfg.subnet_ids:
        return cfg
    try:
        zones = cluster.subnet_zones(cfg)
    except AwsError as e:
        if not (dry_run and cfg.availability_zones):
            hint = "set AVAILABILITY_ZONES (each subnet's AZ, in order) for a dry run, or fix the credentials"
            raise FsdpctlError(f"could not read the subnets of {cfg.vpc_id}: {e}", hint=hint) from e
        warn(
            f"could not read the subnets of {cfg.vpc_id} ({e}); the dry run takes AVAILABILITY_ZONES as given"
        )
        return cfg
    ok(f"AVAILABILITY_ZONES={zones}: the AZs of PRIVATE_SUBNET_IDS in {cfg.vpc_id}")
    return _config(ctx, tool, AVAILABILITY_ZONES=zones)


@app.command()
def check(ctx: typer.Context, output: Output = OutputOpt) -> None:
    """Preflight against AWS: credentials, instance type offered in the AZ, P-instance quota,
    capacity reservation (type, instance type, AZ, count; a Capacity Block's start and end), a
    cluster of the same name. Exit 1 on any fail.

    Example: fsdpctl --set INSTANCE_TYPE=p4de.24xlarge --set
    CAPACITY_RESERVATION_ID=cr-0123456789abcdef0 cluster check
    """
    from fsdpctl.cluster import lifecycle as cluster
    from fsdpctl.cluster import preflight

    cfg = state(ctx).config()
    report_checks(preflight.run_checks(cfg, cluster.connect(cfg)), output)


@app.command()
def status(ctx: typer.Context, output: Output = OutputOpt) -> None:
    """The cluster and its node groups as AWS reports them (instance types, sizes, state).

    Example: fsdpctl cluster status -o json
    """
    from fsdpctl.cluster import lifecycle as cluster

    data = cluster.status(state(ctx).config())
    if not emit(data, output):
        _print_status(data)


def _print_status(data: ClusterStatus) -> None:
    out.print(
        f"cluster {data['name']}: {data['status']} (Kubernetes {data['version']}) {data['endpoint'] or ''}"
    )
    t = PlainTable("node group", "status", "instance types", "desired", "min", "max")
    for g in data["nodegroups"]:
        sizes = (str(g["desired"]), str(g["min"]), str(g["max"]))
        t.add_row(g["name"], g["status"], ", ".join(g["instance_types"] or []), *sizes)
    out.print(t)


class AwsRequest(TypedDict):
    """A request `cluster create --dry-run` would send to AWS: the call and its parameters."""

    call: str  # "<service> <Operation>", e.g. "fsx CreateFileSystem"
    request: Request


class CreateReport(TypedDict):
    """`cluster create -o json|yaml`."""

    dry_run: str  # none | client
    cluster: str
    tool: str
    tool_input: str
    action: str  # would create | exists | created
    commands: list[str]
    aws_requests: NotRequired[list[AwsRequest]]  # eksctl, FSX_CREATE, dry run
    fsx_settings: NotRequired[FsxSettings]  # eksctl, FSX_CREATE


@app.command()
def create(
    ctx: typer.Context, tool: ToolOpt = None, dry_run: DryRunOpt = False, output: Output = OutputOpt
) -> None:
    """Create the EKS cluster with eksctl (rendered ClusterConfig) or terraform (terraform/ +
    tfvars).

    With eksctl an existing cluster is left alone; terraform converges to the settings. With
    FSX_CREATE both make the shared FSx for Lustre file system: terraform as a resource (its
    outputs), eksctl's through the AWS API once the cluster is up (one tagged for the cluster is
    reused), printing the FSX_* settings for `deploy storage`. The dry run writes the tool's input
    and prints it, then the commands and AWS requests.

    Example: fsdpctl cluster create --tool terraform --dry-run
    """
    from fsdpctl.cluster import lifecycle as cluster

    cfg = _in_reservation_zone(
        ctx, _in_subnet_zones(ctx, _config(ctx, tool), tool, dry_run), tool, dry_run
    )
    fsx_on = cfg.cluster_tool == "eksctl" and cfg.fsx_create
    # AWS asked before the tool's input is written: a create that cannot reach AWS leaves nothing
    # behind
    existing = cluster.find(cfg) if cfg.cluster_tool == "eksctl" and not dry_run else None
    run = cluster.prepare(cfg, "create")
    table = output == Output.table
    report = _create_report(cfg, str(run.tool_input), dry_run, bool(existing))
    if dry_run and table:
        out.print(run.text, markup=False, end="")
    elif existing:
        then = "its FSx file system next" if fsx_on else "nothing to do"
        ok(f"cluster {cfg.cluster_name} already exists ({existing['status']}); {then}")
    for cmd in [] if existing else run.commands:
        shown = None if table else report["commands"]
        hint = "`fsdpctl cluster check` for preflight"
        run_tool(cmd, run.log, dry_run=dry_run, comment=True, hint=hint, shown=shown)
    if fsx_on and dry_run:
        report["aws_requests"] = _fsx_dry_run(cfg, table)
    elif fsx_on:
        report["fsx_settings"] = _fsx_create(cfg, table)
    emit(report, output)
    if dry_run:
        ok(f"dry run: {run.tool_input} written; nothing created")
    elif not existing:
        ok(
            f"cluster {cfg.cluster_name} created with {cfg.cluster_tool}; next: fsdpctl cluster status"
        )


def _create_report(cfg: Config, tool_input: str, dry_run: bool, exists: bool) -> CreateReport:
    """The report before the tool runs: its commands and AWS calls are added as they go."""
    done = "would create" if dry_run else "exists" if exists else "created"
    return {
        "dry_run": "client" if dry_run else "none",
        "cluster": cfg.cluster_name,
        "tool": cfg.cluster_tool,
        "tool_input": tool_input,
        "action": done,
        "commands": [],
    }


def _fsx_dry_run(cfg: Config, table: bool) -> list[AwsRequest]:
    """The AWS requests that would make the file system, as `# ` comments after the ClusterConfig
    (`table`) and returned: planned from the cluster when it exists (read only), else with eksctl's
    future choices named."""
    import json

    from fsdpctl.cluster import lifecycle as cluster

    plan = cluster.fsx_placeholder_plan(cfg)
    try:
        if cluster.find(cfg):
            if found := cluster.fsx_of_cluster(cfg):
                ok(
                    f"dry run: FSx for Lustre {found[0]['FileSystemId']} of {cfg.cluster_name} exists; reused"
                )
                return []
            plan = cluster.fsx_plan(cfg, cluster.connect(cfg))
    except (
        FsdpctlError
    ) as e:  # AWS unreachable, or a cluster the plan cannot place it in: a real run stops
        warn(
            f"could not plan from cluster {cfg.cluster_name} ({e}); the requests name what eksctl will choose"
        )
    requests = cluster.fsx_requests(plan, "<the new security group>", "<the new key's ARN>")
    for call, request in requests if table else []:
        out.print(
            f"# aws {call} {json.dumps(request)}", markup=False, highlight=False, soft_wrap=True
        )
    return [{"call": call, "request": request} for call, request in requests]


def _fsx_create(cfg: Config, table: bool) -> FsxSettings:
    """The file system, AVAILABLE, and the settings `deploy storage` needs (stdout, .env lines)."""
    from fsdpctl.cluster import fsx
    from fsdpctl.cluster import lifecycle as cluster

    fs = cluster.ensure_fsx(cfg, ok)
    settings = fsx.settings(fs)
    for key, value in settings.items() if table else []:
        out.print(f"{key}={value}", markup=False, highlight=False)
    where = "the lines above" if table else "fsx_settings"
    ok(f"FSx for Lustre {fs['FileSystemId']} AVAILABLE; add {where} to .env for `deploy storage`")
    return settings


class DeleteReport(TypedDict):
    """`cluster delete -o json|yaml`."""

    dry_run: str  # none | client
    cluster: str
    tool: str
    cluster_deleted: bool
    what: str | None  # what the tool deletes, None when nothing
    commands: list[str]
    file_systems: list[str]  # FSx file system ids
    security_groups: list[str]  # ids


@app.command()
def delete(
    ctx: typer.Context,
    tool: ToolOpt = None,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="do not ask")] = False,
    dry_run: DryRunOpt = False,
    output: Output = OutputOpt,
) -> None:
    """Delete the EKS cluster (eksctl delete cluster --wait, or terraform destroy). Asks first
    unless --yes.

    With terraform, destroy runs whenever its state in FSDPCTL_HOME/clusters/<name>/terraform holds
    resources, also when the EKS cluster is gone (a half-failed create leaves a VPC, NAT gateway and
    KMS key there). A shared FSx for Lustre file system of the cluster (its data: checkpoints, the
    HF cache) needs a confirmation of its own; without a terminal only --yes deletes it. With eksctl
    it is deleted first, then its security group, then the cluster (its network interfaces would
    stop the VPC's deletion).

    Example: fsdpctl cluster delete --yes
    """
    from fsdpctl.cluster import lifecycle as cluster

    cfg = _in_subnet_zones(ctx, _config(ctx, tool), tool, dry_run)  # eksctl's input keys them by AZ
    what = _what_to_delete(cfg, dry_run)
    file_systems, groups = _fsx_to_delete(cfg, dry_run)
    report = _delete_report(cfg, what, file_systems, groups, dry_run)
    if what is None and not (file_systems or groups):
        emit(report, output)
        return
    if not dry_run and not yes:
        _confirm_delete(cfg, what, file_systems)
    # the tool's input is written once AWS has answered and the user has: a lookup that fails or a
    # "no" leaves the cluster's directory as it was (terraform's variables there are the ones it was
    # made with)
    run = cluster.prepare(cfg, "delete")
    _delete_fsx_first(cfg, file_systems, groups, dry_run)
    for cmd in run.commands if what else []:
        run_tool(
            cmd,
            run.log,
            dry_run=dry_run,
            shown=None if output == Output.table else report["commands"],
        )
    emit(report, output)
    if dry_run:
        ok(f"dry run: would delete {what or 'the file systems above'}; nothing deleted")
    elif what:
        warn(f"cluster {cfg.cluster_name} deleted; checkpoints on its volumes are gone with it")


def _delete_report(
    cfg: Config, what: str | None, file_systems: list[FileSystem], groups: list[str], dry_run: bool
) -> DeleteReport:
    """The report before anything is deleted: the commands are added as they run."""
    return {
        "dry_run": "client" if dry_run else "none",
        "cluster": cfg.cluster_name,
        "tool": cfg.cluster_tool,
        "cluster_deleted": bool(what),
        "what": what,
        "commands": [],
        "file_systems": [fs["FileSystemId"] for fs in file_systems],
        "security_groups": groups,
    }


def _confirm_delete(cfg: Config, what: str | None, file_systems: list[FileSystem]) -> None:
    """The file systems asked first (their data outlives jobs), then the cluster."""
    _confirm_fsx(cfg, file_systems)
    if what:
        confirm(
            f"Delete {what}?",
            refused="not confirmed",
            hint="pass --yes to delete without asking",
        )


def _delete_fsx_first(
    cfg: Config, file_systems: list[FileSystem], groups: list[str], dry_run: bool
) -> None:
    """With eksctl the file systems and their security groups go before the cluster (their network
    interfaces would stop the VPC's deletion); a dry run says what would go."""
    from fsdpctl.cluster import lifecycle as cluster

    if dry_run:
        for fs in file_systems:
            ok(f"dry run: would delete {fsx_summary(fs)}")
        if groups:
            ok(
                f"dry run: would delete security group {', '.join(groups)} and the FSx KMS key (in 7 days)"
            )
    elif cfg.cluster_tool == "eksctl" and (file_systems or groups):
        cluster.delete_fsx(cfg, file_systems, ok)


def fsx_summary(fs: FileSystem) -> str:
    from fsdpctl.cluster import fsx

    return fsx.summary(fs)


def _interactive() -> bool:
    import sys

    return sys.stdin.isatty()


def _confirm_fsx(cfg: Config, file_systems: list[FileSystem]) -> None:
    """A file system's data outlives jobs: its deletion is asked on its own, never taken from piped
    input."""
    if not file_systems:
        return
    for fs in file_systems:
        warn(f"cluster {cfg.cluster_name} has {fsx_summary(fs)}")
    ids = ", ".join(fs["FileSystemId"] for fs in file_systems)
    if not _interactive():
        raise BadInput(
            f"not deleting FSx for Lustre {ids} without a confirmation (no terminal to ask on)",
            hint="copy off what you need, then pass --yes to delete it with the cluster",
        )
    confirm(
        f"Delete FSx for Lustre {ids} and all data on it?",
        refused="FSx deletion not confirmed",
        hint="copy off what you need, then run again",
    )


def _fsx_to_delete(cfg: Config, dry_run: bool) -> tuple[list[FileSystem], list[str]]:
    """The cluster's file systems and (eksctl) the Lustre security groups to remove before eksctl
    runs. A dry run that cannot reach AWS says so and goes on; a real run stops on the error."""
    from fsdpctl.adapters.aws import AwsError
    from fsdpctl.cluster import lifecycle as cluster

    if cfg.cluster_tool == "terraform":
        return cluster.fsx_of_cluster(cfg), []  # destroy deletes them with the rest of the state
    try:
        aws = cluster.connect(cfg)
        return cluster.fsx_of_cluster(cfg, aws), cluster.fsx_leftovers(cfg, aws)
    except AwsError as e:
        if not dry_run:
            raise
        warn(f"could not list the FSx file systems of {cfg.cluster_name} ({e})")
        return [], []


def _what_to_delete(cfg: Config, dry_run: bool) -> str | None:
    """What the delete commands would remove, None (said why) when there is nothing. terraform goes
    by its state alone (read offline, so the dry run tells the truth too); eksctl by the cluster in
    EKS."""
    from fsdpctl.cluster import lifecycle as cluster

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
        ok(
            f"no terraform state in {state_dir}{'' if dry_run else ' and no ' + name}; nothing to delete"
        )
        return None
    if dry_run:
        return name + " (if it exists)"
    if not cluster.find(cfg):
        ok(f"no {name}; nothing to delete")
        return None
    return name

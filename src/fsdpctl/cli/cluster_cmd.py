"""fsdpctl cluster check|status|create|delete"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from fsdpctl.cli.common import Output, OutputOpt, emit, ok, out, report_checks, run_tool, state, warn
from fsdpctl.errors import BadInput, ExitCode, FsdpctlError

app = typer.Typer(
    no_args_is_help=True,
    rich_markup_mode=None,
    help="The EKS cluster: preflight, status, create and delete (eksctl or terraform).",
)


def _aws(cfg):
    try:
        from fsdpctl.adapters.aws import Aws
    except ImportError as e:
        raise FsdpctlError("boto3 is not installed", hint="pip install 'fsdpctl[aws]'") from e
    return Aws(cfg.aws_region, cfg.aws_profile)


def cluster_dir(name: str) -> Path:
    from fsdpctl.adapters.local import home

    return home() / "clusters" / name


def eksctl_command(cfg, verb: str, config_file: Path):
    from fsdpctl.adapters.shell import Command

    env = {"AWS_REGION": cfg.aws_region, **({"AWS_PROFILE": cfg.aws_profile} if cfg.aws_profile else {})}
    argv = ["eksctl", verb, "cluster", "-f", str(config_file)]
    return Command(argv + (["--wait"] if verb == "delete" else []), env)


def terraform_commands(cfg, verb: str, workdir: Path) -> list:
    """init, then apply or destroy, in the job's copy of terraform/ (state stays there)."""
    import os

    from fsdpctl.adapters.shell import Command

    env = {"AWS_REGION": cfg.aws_region, **({"AWS_PROFILE": cfg.aws_profile} if cfg.aws_profile else {})}
    plugins = os.environ.get("FSDPCTL_TF_PLUGIN_DIR")  # offline provider mirror, e.g. /opt/tf-plugins
    init = [
        "terraform",
        f"-chdir={workdir}",
        "init",
        "-input=false",
        *([f"-plugin-dir={plugins}"] if plugins else []),
    ]
    run = ["terraform", f"-chdir={workdir}", verb, "-input=false", "-auto-approve"]
    return [Command(init, env), Command(run, env)]


def _write_config(cfg) -> tuple[Path, str]:
    """The tool's input under FSDPCTL_HOME/clusters/<name>/, written atomically: eksctl's ClusterConfig, or
    a copy of terraform/ with fsdpctl.auto.tfvars.json (the copy keeps the state between runs)."""
    import json
    import shutil

    from fsdpctl import render
    from fsdpctl.files import write_atomic

    base = cluster_dir(cfg.cluster_name)
    base.mkdir(parents=True, exist_ok=True)
    if cfg.cluster_tool == "eksctl":
        text, path = render.to_yaml([render.render_clusterconfig(cfg)]), base / "clusterconfig.yaml"
    else:
        path = base / "terraform"
        shutil.copytree(
            render.data_dir("terraform"),
            path,
            dirs_exist_ok=True,
            ignore=shutil.ignore_patterns(".terraform*", "*.tfstate*"),
        )
        text = json.dumps(render.terraform_vars(cfg), indent=2) + "\n"
        path = path / "fsdpctl.auto.tfvars.json"
    write_atomic(path, text)
    return path, text


def _commands(cfg, verb: str, path: Path) -> list:
    if cfg.cluster_tool == "eksctl":
        return [eksctl_command(cfg, verb, path)]
    return terraform_commands(cfg, "apply" if verb == "create" else "destroy", path.parent)


@app.command()
def check(ctx: typer.Context, output: Output = OutputOpt) -> None:
    """Preflight against AWS: credentials, instance type offered in the AZ, P-instance quota, capacity
    reservation, a cluster of the same name. Exit 1 on any fail.

    Example: fsdpctl --set INSTANCE_TYPE=p4de.24xlarge --set CAPACITY_RESERVATION_ID=cr-0123456789abcdef0 cluster check
    """
    from fsdpctl import preflight

    cfg = state(ctx).config()
    report_checks(preflight.run_checks(cfg, _aws(cfg)), output)


@app.command()
def status(ctx: typer.Context, output: Output = OutputOpt) -> None:
    """The cluster and its node groups as AWS reports them (instance types, sizes, state).

    Example: fsdpctl cluster status -o json
    """
    from fsdpctl.adapters.aws import AwsError

    cfg = state(ctx).config()
    aws = _aws(cfg)
    try:
        cluster = aws.cluster(cfg.cluster_name)
        groups = aws.nodegroups(cfg.cluster_name) if cluster else []
    except AwsError as e:
        raise FsdpctlError(str(e), hint="check credentials and AWS_REGION (`fsdpctl cluster check`)") from e
    if cluster is None:
        raise FsdpctlError(
            f"no cluster {cfg.cluster_name!r} in {cfg.aws_region}",
            hint="`fsdpctl cluster create`",
            code=ExitCode.JOB_NOT_FOUND,
        )
    data = {
        "name": cluster["name"],
        "status": cluster["status"],
        "version": cluster.get("version"),
        "endpoint": cluster.get("endpoint"),
        "nodegroups": [
            {
                "name": g["nodegroupName"],
                "status": g["status"],
                "instance_types": g.get("instanceTypes"),
                "desired": g.get("scalingConfig", {}).get("desiredSize"),
                "min": g.get("scalingConfig", {}).get("minSize"),
                "max": g.get("scalingConfig", {}).get("maxSize"),
            }
            for g in groups
        ],
    }
    if emit(data, output):
        return
    out.print(
        f"cluster {data['name']}: {data['status']} (Kubernetes {data['version']}) {data['endpoint'] or ''}"
    )
    t = Table("node group", "status", "instance types", "desired", "min", "max")
    for g in data["nodegroups"]:
        t.add_row(
            g["name"],
            g["status"],
            ", ".join(g["instance_types"] or []),
            str(g["desired"]),
            str(g["min"]),
            str(g["max"]),
        )
    out.print(t)


@app.command()
def create(
    ctx: typer.Context,
    tool: Annotated[
        str | None, typer.Option("--tool", help="eksctl or terraform (default: CLUSTER_TOOL)")
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="print the commands and the tool's input, run nothing")
    ] = False,
) -> None:
    """Create the EKS cluster with eksctl (rendered ClusterConfig) or terraform (terraform/ + tfvars).

    With eksctl an existing cluster is left alone; terraform converges to the settings.

    Example: fsdpctl cluster create --tool terraform --dry-run
    """
    cfg = state(ctx).config(**({"CLUSTER_TOOL": tool} if tool else {}))
    path, text = _write_config(cfg)
    cmds = _commands(cfg, "create", path)
    if dry_run:
        out.print(text, markup=False, end="")
        for cmd in cmds:
            out.print("# " + cmd.shell_line(), markup=False)
        ok(f"dry run: {path} written; nothing created")
        return
    if cfg.cluster_tool == "eksctl":
        existing = _aws(cfg).cluster(cfg.cluster_name)
        if existing:
            ok(f"cluster {cfg.cluster_name} already exists ({existing['status']}); nothing to do")
            return
    log = cluster_dir(cfg.cluster_name) / "create.log"
    for cmd in cmds:
        run_tool(cmd, log, hint="`fsdpctl cluster check` for preflight")
    ok(f"cluster {cfg.cluster_name} created with {cfg.cluster_tool}; next: fsdpctl cluster status")


@app.command()
def delete(
    ctx: typer.Context,
    tool: Annotated[
        str | None, typer.Option("--tool", help="eksctl or terraform (default: CLUSTER_TOOL)")
    ] = None,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="do not ask")] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="print the commands, delete nothing")] = False,
) -> None:
    """Delete the EKS cluster (eksctl delete cluster --wait, or terraform destroy). Asks first unless --yes.

    Example: fsdpctl cluster delete --yes
    """
    cfg = state(ctx).config(**({"CLUSTER_TOOL": tool} if tool else {}))
    path, _ = _write_config(cfg)
    cmds = _commands(cfg, "delete", path)
    if dry_run:
        for cmd in cmds:
            out.print(cmd.shell_line(), markup=False)
        ok("dry run: nothing deleted")
        return
    if not _aws(cfg).cluster(cfg.cluster_name):
        ok(f"no cluster {cfg.cluster_name} in {cfg.aws_region}; nothing to delete")
        return
    if not yes and not typer.confirm(f"Delete cluster {cfg.cluster_name} in {cfg.aws_region}?", err=True):
        raise BadInput("not confirmed", hint="pass --yes to delete without asking")
    log = cluster_dir(cfg.cluster_name) / "delete.log"
    for cmd in cmds:
        run_tool(cmd, log)
    warn(f"cluster {cfg.cluster_name} deleted; checkpoints on its volumes are gone with it")

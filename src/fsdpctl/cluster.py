"""The EKS cluster the settings describe: the input of the tool that makes it (eksctl's ClusterConfig, or a
copy of terraform/ with the settings as variables) under FSDPCTL_HOME/clusters/<name>/, the command lines that
create or delete it, and what AWS reports about it. The commands run through the shell adapter."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fsdpctl import render
from fsdpctl.adapters import eksctl, terraform
from fsdpctl.errors import ExitCode, FsdpctlError
from fsdpctl.files import home
from fsdpctl.settings import Config

if TYPE_CHECKING:
    from fsdpctl.adapters.aws import Aws
    from fsdpctl.adapters.shell import Command


@dataclass(frozen=True)
class ToolRun:
    """What `cluster create|delete` runs: the tool's input (written), its text, the commands and their log."""

    tool_input: Path
    text: str
    commands: list[Command]
    log: Path


def workdir(cfg: Config) -> Path:
    return home() / "clusters" / cfg.cluster_name


def tool_env(cfg: Config) -> dict[str, str]:
    """What eksctl and terraform need from the settings to reach the right account and region."""
    return {"AWS_REGION": cfg.aws_region, **({"AWS_PROFILE": cfg.aws_profile} if cfg.aws_profile else {})}


def prepare(cfg: Config, verb: str) -> ToolRun:
    """Write the tool's input (atomically; terraform's copy keeps its state between runs) and build the
    commands that `create` or `delete` the cluster with CLUSTER_TOOL."""
    base = workdir(cfg)
    base.mkdir(parents=True, exist_ok=True)
    log = base / f"{verb}.log"
    if cfg.cluster_tool == "eksctl":
        text = render.to_yaml([render.render_clusterconfig(cfg)])
        path = eksctl.write_config(base, text)
        return ToolRun(path, text, [eksctl.cluster_command(verb, path, tool_env(cfg))], log)
    tf_dir = base / "terraform"
    path, text = terraform.prepare(render.data_dir("terraform"), tf_dir, render.terraform_vars(cfg))
    tf_verb = "apply" if verb == "create" else "destroy"
    return ToolRun(path, text, terraform.commands(tf_verb, tf_dir, tool_env(cfg)), log)


def terraform_state(cfg: Config) -> list[str]:
    """What terraform's state for this cluster holds (resource addresses): a half-failed create leaves its
    VPC, NAT gateway and KMS key there without any EKS cluster, and only `terraform destroy` removes them."""
    return terraform.state_resources(workdir(cfg) / "terraform")


def reservation_zones(cfg: Config) -> str:
    """AVAILABILITY_ZONES when the setting is empty and CAPACITY_RESERVATION_ID names a reservation: its AZ
    first (the GPU node group takes the first), then the region's next one (an EKS cluster needs two)."""
    aws = connect(cfg)
    zone = aws.capacity_reservation(cfg.capacity_reservation_id)["AvailabilityZone"]
    return ",".join([zone, *[z for z in aws.zones() if z != zone][:1]])


def connect(cfg: Config) -> Aws:
    from fsdpctl.adapters.aws import Aws

    return Aws(cfg.aws_region, cfg.aws_profile)


def find(cfg: Config) -> dict[str, Any] | None:
    """The cluster as EKS describes it, None when there is none of that name in AWS_REGION."""
    return connect(cfg).cluster(cfg.cluster_name)


def status(cfg: Config) -> dict[str, Any]:
    """The cluster and its node groups (instance types, sizes, state); exit 4 when there is none."""
    aws = connect(cfg)
    cluster = aws.cluster(cfg.cluster_name)
    if cluster is None:
        raise FsdpctlError(
            f"no cluster {cfg.cluster_name!r} in {cfg.aws_region}",
            hint="`fsdpctl cluster create`",
            code=ExitCode.JOB_NOT_FOUND,
        )
    return {
        "name": cluster["name"],
        "status": cluster["status"],
        "version": cluster.get("version"),
        "endpoint": cluster.get("endpoint"),
        "nodegroups": [_nodegroup(g) for g in aws.nodegroups(cfg.cluster_name)],
    }


def _nodegroup(g: dict[str, Any]) -> dict[str, Any]:
    scaling = g.get("scalingConfig", {})
    return {
        "name": g["nodegroupName"],
        "status": g["status"],
        "instance_types": g.get("instanceTypes"),
        "desired": scaling.get("desiredSize"),
        "min": scaling.get("minSize"),
        "max": scaling.get("maxSize"),
    }

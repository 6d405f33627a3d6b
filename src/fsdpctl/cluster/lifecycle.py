"""The EKS cluster the settings describe: the input of the tool that makes it (eksctl's
ClusterConfig, or a copy of terraform/ with the settings as variables) under
FSDPCTL_HOME/clusters/<name>/, the command lines that create or delete it, and what AWS reports
about it. The commands run through the shell adapter."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

from fsdpctl.adapters import eksctl, terraform
from fsdpctl.cluster import fsx
from fsdpctl.errors import BadInput, ExitCode, FsdpctlError
from fsdpctl.files import home
from fsdpctl.job import render
from fsdpctl.settings import Config

if TYPE_CHECKING:
    from fsdpctl.adapters.aws import Aws
    from fsdpctl.adapters.aws_shapes import Cluster, FileSystem, Nodegroup, Request, Subnet
    from fsdpctl.adapters.shell import Command


@dataclass(frozen=True)
class ToolRun:
    """What `cluster create|delete` runs: the tool's input (written), its text, the commands and
    their log."""

    tool_input: Path
    text: str
    commands: list[Command]
    log: Path


def workdir(cfg: Config) -> Path:
    return home() / "clusters" / cfg.cluster_name


def tool_env(cfg: Config) -> dict[str, str]:
    """What eksctl and terraform need from the settings to reach the right account and region."""
    return {
        "AWS_REGION": cfg.aws_region,
        **({"AWS_PROFILE": cfg.aws_profile} if cfg.aws_profile else {}),
    }


def prepare(cfg: Config, verb: str) -> ToolRun:
    """Write the tool's input (atomically; terraform's copy keeps its state between runs) and build
    the commands that `create` or `delete` the cluster with CLUSTER_TOOL."""
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
    """What terraform's state for this cluster holds (resource addresses): a half-failed create
    leaves its VPC, NAT gateway and KMS key there without any EKS cluster, and only `terraform
    destroy` removes them."""
    return terraform.state_resources(workdir(cfg) / "terraform")


def reservation_zones(cfg: Config) -> str:
    """AVAILABILITY_ZONES when the setting is empty and CAPACITY_RESERVATION_ID names a reservation:
    its AZ first (the GPU node group takes the first), then the region's next one (an EKS cluster
    needs two)."""
    aws = connect(cfg)
    zone = aws.capacity_reservation(cfg.capacity_reservation_id)["AvailabilityZone"]
    return ",".join([zone, *[z for z in aws.zones() if z != zone][:1]])


def subnet_zones(cfg: Config) -> str:
    """AVAILABILITY_ZONES of an existing VPC: the AZ of each of PRIVATE_SUBNET_IDS, in their order,
    as EC2 describes them (DescribeSubnets)."""
    return zones_of_subnets(cfg, connect(cfg).subnets(cfg.subnet_ids))


def zones_of_subnets(cfg: Config, described: list[Subnet]) -> str:
    """The check of `subnet_zones` on EC2's Subnets: every subnet in VPC_ID, one per AZ (eksctl keys
    them by AZ), and AVAILABILITY_ZONES, when set, naming those AZs in the same order."""
    by_id = {s["SubnetId"]: s for s in described}
    fix = "give the private subnets of VPC_ID, one per AZ (`aws ec2 describe-subnets --filters Name=vpc-id,"
    fix += f"Values={cfg.vpc_id}`)"
    for subnet in cfg.subnet_ids:
        found = by_id.get(subnet)
        if found is None or found["VpcId"] != cfg.vpc_id:
            where = f"is in {found['VpcId']}" if found else "was not found"
            raise BadInput(
                f"PRIVATE_SUBNET_IDS: {subnet} {where}, not in VPC_ID={cfg.vpc_id}", hint=fix
            )
    zones = [by_id[s]["AvailabilityZone"] for s in cfg.subnet_ids]
    if len(set(zones)) != len(zones):
        raise BadInput(
            f"PRIVATE_SUBNET_IDS={cfg.private_subnet_ids}: two subnets share an AZ ({zones})",
            hint=fix,
        )
    if cfg.availability_zones and cfg.availability_zones != ",".join(zones):
        raise BadInput(
            f"AVAILABILITY_ZONES={cfg.availability_zones}: PRIVATE_SUBNET_IDS are in {','.join(zones)}",
            hint=f"set AVAILABILITY_ZONES={','.join(zones)} or leave it empty",
        )
    return ",".join(zones)


def connect(cfg: Config) -> Aws:
    from fsdpctl.adapters.aws import Aws

    return Aws(cfg.aws_region, cfg.aws_profile, cfg.request_timeout)


def find(cfg: Config) -> Cluster | None:
    """The cluster as EKS describes it, None when there is none of that name in AWS_REGION."""
    return connect(cfg).cluster(cfg.cluster_name)


class NodegroupStatus(TypedDict):
    """A node group in `cluster status` (-o json: `nodegroups`), from EKS's Nodegroup."""

    name: str
    status: str
    instance_types: list[str] | None
    desired: int | None
    min: int | None
    max: int | None


class ClusterStatus(TypedDict):
    """`cluster status` (-o json), from EKS's Cluster and its node groups."""

    name: str
    status: str
    version: str | None
    endpoint: str | None
    nodegroups: list[NodegroupStatus]


def status(cfg: Config) -> ClusterStatus:
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


def _nodegroup(g: Nodegroup) -> NodegroupStatus:
    scaling = g.get("scalingConfig", {})
    return {
        "name": g["nodegroupName"],
        "status": g["status"],
        "instance_types": g.get("instanceTypes"),
        "desired": scaling.get("desiredSize"),
        "min": scaling.get("minSize"),
        "max": scaling.get("maxSize"),
    }


# ---- the shared FSx for Lustre file system (eksctl: made and deleted here through boto3) ---------

Say = Callable[[str], None]


@dataclass(frozen=True)
class Waiting:
    """How long and how often `cluster create|delete` polls FSx for a file system's state."""

    limit_s: float
    poll_s: float
    sleep: Callable[[float], None] = time.sleep


# FSx takes minutes (often 10-20) to make a PERSISTENT_2 file system and some minutes to delete one
FSX_WAITING = Waiting(limit_s=45 * 60, poll_s=30.0)


def gpu_nodegroup(cfg: Config) -> str:
    return f"gpu-{cfg.instance_type.split('.')[0]}"  # render_clusterconfig's GPU node group name


def fsx_plan(cfg: Config, aws: Aws) -> fsx.Plan:
    """Where the file system goes, read from the cluster and GPU node group eksctl made."""
    found = aws.cluster(cfg.cluster_name)
    group = aws.nodegroup(cfg.cluster_name, gpu_nodegroup(cfg)) if found else None
    if found is None or group is None:
        what = f"node group {gpu_nodegroup(cfg)} in " if found else ""
        raise FsdpctlError(
            f"no {what}cluster {cfg.cluster_name} in {cfg.aws_region}: nowhere to put FSx for Lustre",
            hint="`fsdpctl cluster create` makes the cluster first",
        )
    template = group.get("launchTemplate") or {}
    groups = aws.launch_template_groups(template) if template.get("id") else []
    ids = [*found.get("resourcesVpcConfig", {}).get("subnetIds", []), *group.get("subnets", [])]
    subnets = aws.subnets(list(dict.fromkeys(ids)))
    return fsx.plan(
        cfg.cluster_name,
        cfg.fsx_storage_gib,
        found,
        group,
        subnets,
        groups,
        cfg.fsx_throughput_per_tib,
    )


def fsx_placeholder_plan(cfg: Config) -> fsx.Plan:
    """The plan a dry run shows before eksctl made the cluster: what eksctl will choose is named."""
    return fsx.Plan(
        cluster=cfg.cluster_name,
        vpc_id="<the cluster's VPC>",
        zone="<the GPU node group's AZ>",
        subnet_id=f"<a private subnet of node group {gpu_nodegroup(cfg)}>",
        client_groups=(
            "<the cluster security group>",
            f"<the security groups of {gpu_nodegroup(cfg)}>",
        ),
        storage_gib=cfg.fsx_storage_gib,
        throughput_per_tib=cfg.fsx_throughput_per_tib,
    )


def fsx_requests(p: fsx.Plan, group_id: str, key_arn: str) -> list[tuple[str, Request]]:
    """The AWS calls that make the file system, in order (for the dry run)."""
    alias = fsx.key_alias(p.cluster)
    return [
        ("ec2 CreateSecurityGroup", p.security_group_request()),
        ("ec2 AuthorizeSecurityGroupIngress", p.ingress_request(group_id)),
        ("kms CreateKey", p.key_request()),
        ("kms EnableKeyRotation", {"KeyId": "<the new key>"}),
        ("kms CreateAlias", {"AliasName": alias, "TargetKeyId": "<the new key>"}),
        ("fsx CreateFileSystem", p.file_system_request(group_id, key_arn)),
    ]


def fsx_of_cluster(cfg: Config, aws: Aws | None = None) -> list[FileSystem]:
    """The cluster's file systems: tagged for it in FSx (eksctl), in terraform's state (offline)."""
    if cfg.cluster_tool == "terraform":
        return terraform_file_systems(workdir(cfg) / "terraform")
    return [
        f for f in (aws or connect(cfg)).lustre_file_systems() if fsx.is_ours(f, cfg.cluster_name)
    ]


def terraform_file_systems(tf_dir: Path) -> list[FileSystem]:
    """aws_fsx_lustre_file_system instances in terraform's local state, as FSx names their
    fields: the resource's `id` and `storage_capacity` attributes (terraform-provider-aws,
    internal/service/fsx/lustre_file_system.go) under the state's resources[].instances[]."""
    path = tf_dir / terraform.STATE_FILE
    if not path.is_file() or not path.read_text().strip():
        return []
    found: list[FileSystem] = []
    for r in json.loads(path.read_text()).get("resources", []):
        if r.get("mode") == "managed" and r.get("type") == "aws_fsx_lustre_file_system":
            for inst in r.get("instances", []):
                attrs = inst.get("attributes", {})
                found.append(
                    {
                        "FileSystemId": attrs.get("id"),
                        "StorageCapacity": attrs.get("storage_capacity"),
                    }
                )
    return found


def ensure_fsx(cfg: Config, say: Say, waiting: Waiting | None = None) -> FileSystem:
    """The cluster's file system, AVAILABLE: the one tagged for it if there is one (a rerun makes no
    second), else a new one with its security group and KMS key (each reused when a half-done run
    left it)."""
    aws, waiting = connect(cfg), waiting or FSX_WAITING
    existing = fsx_of_cluster(cfg, aws)
    if existing:
        fs = existing[0]
        say(
            f"FSx for Lustre {fs['FileSystemId']} of {cfg.cluster_name} exists ({fs.get('Lifecycle')})"
        )
        return wait_available(aws, fs, say, waiting)
    p = fsx_plan(cfg, aws)
    group = aws.security_group(p.vpc_id, fsx.group_name(cfg.cluster_name))
    if group:
        aws.authorize_ingress(p.ingress_request(group))  # its rules converge to the plan's
    else:
        group = aws.create_security_group(p.security_group_request(), p.ingress_request)
    alias = fsx.key_alias(cfg.cluster_name)
    key = aws.kms_key(alias) or aws.create_kms_key(p.key_request(), alias)
    fs = aws.create_file_system(p.file_system_request(group, key))
    say(
        f"creating FSx for Lustre {fs['FileSystemId']} ({p.storage_gib} GiB) in {p.subnet_id} ({p.zone})"
    )
    return wait_available(aws, fs, say, waiting)


def wait_available(aws: Aws, fs: FileSystem, say: Say, waiting: Waiting) -> FileSystem:
    fs_id, waited = fs["FileSystemId"], 0.0
    while fs.get("Lifecycle") != fsx.READY:
        if fs.get("Lifecycle") in fsx.FAILED:
            why = fs.get("FailureDetails", {}).get("Message", "no reason given")
            raise FsdpctlError(
                f"FSx for Lustre {fs_id} is {fs['Lifecycle']}: {why}",
                hint="`fsdpctl cluster delete` removes it; check the subnet and security group, then create",
            )
        if waited >= waiting.limit_s:
            raise FsdpctlError(
                f"FSx for Lustre {fs_id} is still {fs.get('Lifecycle')} after {waited / 60:.0f} min",
                hint="run `fsdpctl cluster create` again later: it waits for the same file system",
            )
        say(f"FSx for Lustre {fs_id}: {fs.get('Lifecycle') or 'no state yet'} ({waited:.0f} s)")
        waiting.sleep(waiting.poll_s)
        waited += waiting.poll_s
        found = aws.file_system(fs_id)
        if found is None:
            raise FsdpctlError(
                f"FSx for Lustre {fs_id} disappeared while being created", hint="create again"
            )
        fs = found
    return fs


def delete_fsx(
    cfg: Config, file_systems: list[FileSystem], say: Say, waiting: Waiting | None = None
) -> None:
    """Before `eksctl delete cluster`: the file systems (waiting until FSx has released their
    network interfaces in the cluster's subnets), then the Lustre security group (its rules name the
    cluster's security group), then the KMS key is scheduled for deletion. Either left behind makes
    CloudFormation's delete of eksctl's VPC stack fail with DependencyViolation."""
    aws, waiting = connect(cfg), waiting or FSX_WAITING
    for fs in file_systems:
        aws.delete_file_system(fs["FileSystemId"])
        say(f"deleting FSx for Lustre {fs['FileSystemId']}")
    for fs in file_systems:
        waited = 0.0
        while aws.file_system(fs["FileSystemId"]) is not None:
            if waited >= waiting.limit_s:
                raise FsdpctlError(
                    f"FSx for Lustre {fs['FileSystemId']} still exists after {waited / 60:.0f} min",
                    hint="run `fsdpctl cluster delete` again: eksctl cannot delete the VPC before it is gone",
                )
            waiting.sleep(waiting.poll_s)
            waited += waiting.poll_s
    for group in aws.tagged_security_groups(fsx.TAG_KEY, cfg.cluster_name):
        aws.delete_security_group(group["GroupId"])
        say(f"deleted security group {group['GroupId']} ({group.get('GroupName')})")
    if arn := aws.schedule_key_deletion(fsx.key_alias(cfg.cluster_name), fsx.KMS_DELETION_DAYS):
        say(f"KMS key {arn} scheduled for deletion in {fsx.KMS_DELETION_DAYS} days")


def fsx_leftovers(cfg: Config, aws: Aws | None = None) -> list[str]:
    """The security groups tagged for the cluster (what delete_fsx removes besides file systems), by
    id."""
    return [
        g["GroupId"]
        for g in (aws or connect(cfg)).tagged_security_groups(fsx.TAG_KEY, cfg.cluster_name)
    ]

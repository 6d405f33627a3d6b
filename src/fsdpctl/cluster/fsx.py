"""The shared FSx for Lustre file system of an eksctl cluster (pure): where it goes, the AWS
requests that make it, and what `deploy storage` needs from it. The terraform path makes the same
file system from terraform/modules/eks-gpu/fsx.tf; the choices below are that resource's, so both
tools make the same one.

Lustre traffic: "inbound traffic on ports 988 and 1018-1023" from the file system's own security
group and from the clients' (FSx for Lustre User Guide, "File system access control with Amazon
VPC", https://docs.aws.amazon.com/fsx/latest/LustreGuide/limit-access-security-groups.html; creation
fails with "do not permit Lustre LNET network traffic on port 988" otherwise:
.../LustreGuide/cannot-create-fs.html)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypedDict

from fsdpctl.adapters.aws_shapes import (
    AuthorizeSecurityGroupIngressRequest,
    Cluster,
    CreateFileSystemRequest,
    CreateKeyRequest,
    CreateSecurityGroupRequest,
    FileSystem,
    Nodegroup,
    Subnet,
    Tag,
    UserIdGroupPair,
)
from fsdpctl.errors import FsdpctlError

# how `cluster create` finds its file system again and `cluster delete` finds it
TAG_KEY = "fsdpctl.io/cluster"
LUSTRE_PORTS = ((988, 988), (1018, 1023))
# terraform/modules/eks-gpu/fsx.tf (aws_fsx_lustre_file_system.shared) and terraform/variables.tf's
# default
DEPLOYMENT_TYPE = "PERSISTENT_2"
THROUGHPUT_MB_PER_TIB = 250
COMPRESSION = "LZ4"
LUSTRE_VERSION = "2.15"
KMS_DELETION_DAYS = 7  # terraform's deletion_window_in_days

# FSx Lifecycle values (service-2.json, FileSystemLifecycle): the ones a wait stops at
READY, FAILED, GONE = (
    "AVAILABLE",
    ("FAILED", "MISCONFIGURED", "MISCONFIGURED_UNAVAILABLE"),
    "DELETING",
)


def group_name(cluster: str) -> str:
    return f"{cluster}-lustre"  # terraform's aws_security_group.lustre name


def key_alias(cluster: str) -> str:
    return f"alias/fsdpctl/{cluster}/fsx"


def tags(cluster: str) -> list[Tag]:
    return [
        {"Key": TAG_KEY, "Value": cluster},
        {"Key": "Name", "Value": f"{cluster}-shared"},
        {"Key": "managed-by", "Value": "fsdpctl"},
    ]


def is_ours(fs: FileSystem, cluster: str) -> bool:
    """A Lustre file system tagged for this cluster and not on its way out."""
    tagged = {t["Key"]: t["Value"] for t in fs.get("Tags", [])}
    return (
        fs.get("FileSystemType") == "LUSTRE"
        and tagged.get(TAG_KEY) == cluster
        and fs.get("Lifecycle") != GONE
    )


@dataclass(frozen=True)
class Plan:
    """Where the file system goes and who may reach it, read from the cluster eksctl made."""

    cluster: str
    vpc_id: str
    zone: str
    subnet_id: str
    client_groups: tuple[
        str, ...
    ]  # the nodes' security groups (the cluster's, the launch template's)
    storage_gib: int
    throughput_per_tib: int = THROUGHPUT_MB_PER_TIB  # FSX_THROUGHPUT_PER_TIB

    def security_group_request(self) -> CreateSecurityGroupRequest:
        return {
            "GroupName": group_name(self.cluster),
            "Description": "FSx for Lustre: TCP 988 and 1018-1023 from the nodes and the file servers",
            "VpcId": self.vpc_id,
            "TagSpecifications": [{"ResourceType": "security-group", "Tags": tags(self.cluster)}],
        }

    def ingress_request(self, group_id: str) -> AuthorizeSecurityGroupIngressRequest:
        """Lustre's ports from the group itself (server to server) and from every client group."""
        pairs: list[UserIdGroupPair] = [{"GroupId": g} for g in (group_id, *self.client_groups)]
        return {
            "GroupId": group_id,
            "IpPermissions": [
                {"IpProtocol": "tcp", "FromPort": lo, "ToPort": hi, "UserIdGroupPairs": pairs}
                for lo, hi in LUSTRE_PORTS
            ],
        }

    def key_request(self) -> CreateKeyRequest:
        return {
            "Description": f"{self.cluster}: FSx for Lustre encryption at rest",
            "Tags": [{"TagKey": t["Key"], "TagValue": t["Value"]} for t in tags(self.cluster)],
        }

    def file_system_request(self, group_id: str, kms_key_id: str) -> CreateFileSystemRequest:
        return {
            # no ClientRequestToken: botocore fills a fresh one per call (idempotencyToken in the
            # model), covering its own retries; a fixed one would hand a re-create after a delete
            # the old file system
            "FileSystemType": "LUSTRE",
            "FileSystemTypeVersion": LUSTRE_VERSION,
            "StorageCapacity": self.storage_gib,
            "StorageType": "SSD",
            "SubnetIds": [self.subnet_id],
            "SecurityGroupIds": [group_id],
            "KmsKeyId": kms_key_id,
            "Tags": tags(self.cluster),
            "LustreConfiguration": {
                "DeploymentType": DEPLOYMENT_TYPE,
                "PerUnitStorageThroughput": self.throughput_per_tib,
                "DataCompressionType": COMPRESSION,
            },
        }


def plan(
    cluster_name: str,
    storage_gib: int,
    cluster: Cluster,
    nodegroup: Nodegroup,
    subnets: Sequence[Subnet],
    launch_template_groups: Sequence[str] = (),
    throughput_per_tib: int = THROUGHPUT_MB_PER_TIB,
) -> Plan:
    """The file system's place: a private subnet (no public IPs on launch) of the GPU node group in
    the cluster's VPC, the first by AZ then id (eksctl puts an EFA node group in one AZ; the CSI
    driver mounts only in the file system's AZ). `subnets` is EC2's DescribeSubnets answer for the
    cluster's and the node group's subnets."""
    vpc = cluster.get("resourcesVpcConfig", {})
    # EKS names the VPC; without it (an emulator), the VPC of the cluster's own subnets
    own = {s.get("VpcId") for s in subnets if s["SubnetId"] in vpc.get("subnetIds", [])}
    vpc_id: str = vpc.get("vpcId") or (own.pop() or "" if len(own) == 1 else "")
    mine = set(nodegroup.get("subnets", []))
    private = sorted(
        (
            s
            for s in subnets
            if s["SubnetId"] in mine
            and s.get("VpcId") == vpc_id
            and not s.get("MapPublicIpOnLaunch")
        ),
        key=lambda s: (s["AvailabilityZone"], s["SubnetId"]),
    )
    if not private:
        raise FsdpctlError(
            f"node group {nodegroup.get('nodegroupName')} of {cluster_name} has no private subnet in VPC "
            f"{vpc_id or '?'} (its subnets: {', '.join(sorted(mine)) or 'none'}): nowhere to put FSx",
            hint="set FSX_CREATE=false, or recreate the cluster (its GPU node group uses privateNetworking)",
        )
    groups = [g for g in (vpc.get("clusterSecurityGroupId"), *launch_template_groups) if g]
    return Plan(
        cluster=cluster_name,
        vpc_id=vpc_id,
        zone=private[0]["AvailabilityZone"],
        subnet_id=private[0]["SubnetId"],
        client_groups=tuple(dict.fromkeys(groups)),
        storage_gib=storage_gib,
        throughput_per_tib=throughput_per_tib,
    )


class FsxSettings(TypedDict):
    """The FSX_* settings `deploy storage` reads, as `cluster create` prints them (.env lines, or
    `fsx_settings` in its -o json document)."""

    FSX_FILE_SYSTEM_ID: str
    FSX_DNS_NAME: str
    FSX_MOUNT_NAME: str
    FSX_STORAGE_GIB: str


def settings(fs: FileSystem) -> FsxSettings:
    """What `deploy storage` reads (FSX_* settings) from DescribeFileSystems' answer."""
    return {
        "FSX_FILE_SYSTEM_ID": fs["FileSystemId"],
        "FSX_DNS_NAME": fs.get("DNSName", ""),
        "FSX_MOUNT_NAME": fs.get("LustreConfiguration", {}).get("MountName", ""),
        "FSX_STORAGE_GIB": str(fs.get("StorageCapacity", "")),
    }


def summary(fs: FileSystem) -> str:
    """One line for the delete question: id, size, what is on it."""
    return (
        f"FSx for Lustre {fs['FileSystemId']} ({fs.get('StorageCapacity', '?')} GiB"
        f"{', ' + fs['Lifecycle'] if fs.get('Lifecycle') else ''}): its data (checkpoints, the Hugging Face "
        "cache, datasets) goes with it"
    )

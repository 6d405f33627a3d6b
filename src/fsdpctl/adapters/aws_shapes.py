"""What fsdpctl asks of AWS and reads back, as types (pure: no boto3 here).

Each TypedDict is the part fsdpctl reads or writes of the AWS API shape of the same name, as the
botocore service models define it (botocore/data/<service>/<version>/service-2.json: eks
2017-11-01, ec2 2016-11-15, fsx 2018-03-01, kms 2014-11-01) and the API references document it
(e.g. https://docs.aws.amazon.com/fsx/latest/APIReference/API_FileSystem.html). Answers are
total=False: no member of these output shapes is required in the models ("Required: No"), and an
emulator (moto) leaves some out, so every optional one is read with `.get`. Requests are total:
fsdpctl always sends each field named.

The adapter (fsdpctl.adapters.aws) is the boundary: botocore parses the answer into plain dicts
(typed Any), and each of its methods returns them as the shape its model names.
"""

from __future__ import annotations

from typing import TypedDict

# ---- shared -------------------------------------------------------------------------------------


class Tag(TypedDict):
    """FSx's and EC2's `Tag` (FSx: both members required)."""

    Key: str
    Value: str


# ---- EKS: DescribeCluster, DescribeNodegroup ----------------------------------------------------


class VpcConfigResponse(TypedDict, total=False):
    """EKS `VpcConfigResponse` (a Cluster's resourcesVpcConfig)."""

    subnetIds: list[str]
    vpcId: str
    clusterSecurityGroupId: str


class Cluster(TypedDict, total=False):
    """EKS `Cluster` (DescribeCluster's `cluster`)."""

    name: str
    status: str  # ClusterStatus: CREATING, ACTIVE, DELETING, FAILED, UPDATING, PENDING
    version: str
    endpoint: str
    resourcesVpcConfig: VpcConfigResponse


class NodegroupScalingConfig(TypedDict, total=False):
    """EKS `NodegroupScalingConfig`."""

    minSize: int
    maxSize: int
    desiredSize: int


class LaunchTemplateSpecification(TypedDict, total=False):
    """EKS `LaunchTemplateSpecification` (a Nodegroup's launchTemplate)."""

    name: str
    version: str
    id: str


class Nodegroup(TypedDict, total=False):
    """EKS `Nodegroup` (DescribeNodegroup's `nodegroup`)."""

    nodegroupName: str
    status: str  # NodegroupStatus
    instanceTypes: list[str]
    scalingConfig: NodegroupScalingConfig
    subnets: list[str]
    launchTemplate: LaunchTemplateSpecification


# ---- EC2: DescribeSubnets, security groups ------------------------------------------------------


class Subnet(TypedDict, total=False):
    """EC2 `Subnet` (DescribeSubnets' `Subnets`)."""

    SubnetId: str
    VpcId: str
    AvailabilityZone: str
    MapPublicIpOnLaunch: bool


class SecurityGroup(TypedDict, total=False):
    """EC2 `SecurityGroup` (DescribeSecurityGroups' `SecurityGroups`)."""

    GroupId: str
    GroupName: str


class TagSpecification(TypedDict):
    """EC2 `TagSpecification`."""

    ResourceType: str
    Tags: list[Tag]


class CreateSecurityGroupRequest(TypedDict):
    """EC2 `CreateSecurityGroupRequest` (GroupName and Description required)."""

    GroupName: str
    Description: str
    VpcId: str
    TagSpecifications: list[TagSpecification]


class UserIdGroupPair(TypedDict):
    """EC2 `UserIdGroupPair`: traffic from the members of a security group."""

    GroupId: str


class IpPermission(TypedDict):
    """EC2 `IpPermission`: a protocol's port range, from the groups named."""

    IpProtocol: str
    FromPort: int
    ToPort: int
    UserIdGroupPairs: list[UserIdGroupPair]


class AuthorizeSecurityGroupIngressRequest(TypedDict):
    """EC2 `AuthorizeSecurityGroupIngressRequest`."""

    GroupId: str
    IpPermissions: list[IpPermission]


# ---- KMS ----------------------------------------------------------------------------------------


class KmsTag(TypedDict):
    """KMS `Tag` (TagKey and TagValue required; not EC2's Key/Value)."""

    TagKey: str
    TagValue: str


class CreateKeyRequest(TypedDict):
    """KMS `CreateKeyRequest` (a symmetric key: KeySpec and KeyUsage left to their defaults)."""

    Description: str
    Tags: list[KmsTag]


class EnableKeyRotationRequest(TypedDict):
    """KMS `EnableKeyRotationRequest` (KeyId required)."""

    KeyId: str


class CreateAliasRequest(TypedDict):
    """KMS `CreateAliasRequest` (AliasName and TargetKeyId required)."""

    AliasName: str
    TargetKeyId: str


# ---- FSx: DescribeFileSystems, CreateFileSystem -------------------------------------------------


class FileSystemFailureDetails(TypedDict, total=False):
    """FSx `FileSystemFailureDetails`."""

    Message: str


class LustreFileSystemConfiguration(TypedDict, total=False):
    """FSx `LustreFileSystemConfiguration` (a FileSystem's LustreConfiguration)."""

    MountName: str


class FileSystem(TypedDict, total=False):
    """FSx `FileSystem` (DescribeFileSystems' `FileSystems`, CreateFileSystem's `FileSystem`)."""

    FileSystemId: str
    FileSystemType: str  # WINDOWS | LUSTRE | ONTAP | OPENZFS
    Lifecycle: str  # FileSystemLifecycle: AVAILABLE, CREATING, FAILED, DELETING, MISCONFIGURED, ...
    FailureDetails: FileSystemFailureDetails
    StorageCapacity: int  # GiB
    DNSName: str
    Tags: list[Tag]
    LustreConfiguration: LustreFileSystemConfiguration


class CreateFileSystemLustreConfiguration(TypedDict):
    """FSx `CreateFileSystemLustreConfiguration`."""

    DeploymentType: str
    PerUnitStorageThroughput: int
    DataCompressionType: str


class CreateFileSystemRequest(TypedDict):
    """FSx `CreateFileSystemRequest` (FileSystemType and SubnetIds required; ClientRequestToken
    left to botocore, which fills a fresh one)."""

    FileSystemType: str
    FileSystemTypeVersion: str
    StorageCapacity: int
    StorageType: str
    SubnetIds: list[str]
    SecurityGroupIds: list[str]
    KmsKeyId: str
    Tags: list[Tag]
    LustreConfiguration: CreateFileSystemLustreConfiguration


# what `cluster create --dry-run` lists as the requests it would send, in order
Request = (
    CreateSecurityGroupRequest
    | AuthorizeSecurityGroupIngressRequest
    | CreateKeyRequest
    | EnableKeyRotationRequest
    | CreateAliasRequest
    | CreateFileSystemRequest
)

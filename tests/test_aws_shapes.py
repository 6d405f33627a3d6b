"""The AWS shapes fsdpctl reads and sends (fsdpctl.adapters.aws_shapes) are the AWS models' own.

Peers: botocore's service models (botocore/data/<service>/<version>/service-2.json, the source of
the API references such as https://docs.aws.amazon.com/fsx/latest/APIReference/API_FileSystem.html)
for the names and kinds of every field; moto 5 in server mode (the `aws_env` fixture) for answers
fed through the adapter's typed methods. moto's EKS leaves resourcesVpcConfig.vpcId out and its FSx
reports no Lifecycle (tests/test_fsx.py's docstring): the answers are total=False for that reason,
and the conformance check below only holds the fields that are there to their declared kinds.
"""

from __future__ import annotations

import inspect
import types
import typing
from typing import Any, get_args, get_origin, get_type_hints, is_typeddict

import botocore.session
import pytest

from fsdpctl.adapters import aws_shapes
from fsdpctl.adapters.aws import Aws
from test_fsx import REGION, eksctl_like_cluster, moto_file_system

# each TypedDict: the model shape(s) it is a part of, (service, shape name)
MODEL = {
    aws_shapes.Tag: [("fsx", "Tag"), ("ec2", "Tag")],
    aws_shapes.VpcConfigResponse: [("eks", "VpcConfigResponse")],
    aws_shapes.Cluster: [("eks", "Cluster")],
    aws_shapes.NodegroupScalingConfig: [("eks", "NodegroupScalingConfig")],
    aws_shapes.LaunchTemplateSpecification: [("eks", "LaunchTemplateSpecification")],
    aws_shapes.Nodegroup: [("eks", "Nodegroup")],
    aws_shapes.Subnet: [("ec2", "Subnet")],
    aws_shapes.SecurityGroup: [("ec2", "SecurityGroup")],
    aws_shapes.TagSpecification: [("ec2", "TagSpecification")],
    aws_shapes.CreateSecurityGroupRequest: [("ec2", "CreateSecurityGroupRequest")],
    aws_shapes.UserIdGroupPair: [("ec2", "UserIdGroupPair")],
    aws_shapes.IpPermission: [("ec2", "IpPermission")],
    aws_shapes.AuthorizeSecurityGroupIngressRequest: [
        ("ec2", "AuthorizeSecurityGroupIngressRequest")
    ],
    aws_shapes.KmsTag: [("kms", "Tag")],
    aws_shapes.CreateKeyRequest: [("kms", "CreateKeyRequest")],
    aws_shapes.EnableKeyRotationRequest: [("kms", "EnableKeyRotationRequest")],
    aws_shapes.CreateAliasRequest: [("kms", "CreateAliasRequest")],
    aws_shapes.FileSystemFailureDetails: [("fsx", "FileSystemFailureDetails")],
    aws_shapes.LustreFileSystemConfiguration: [("fsx", "LustreFileSystemConfiguration")],
    aws_shapes.FileSystem: [("fsx", "FileSystem")],
    aws_shapes.CreateFileSystemLustreConfiguration: [
        ("fsx", "CreateFileSystemLustreConfiguration")
    ],
    aws_shapes.CreateFileSystemRequest: [("fsx", "CreateFileSystemRequest")],
}
KINDS = {str: "string", int: "integer", bool: "boolean"}
SESSION = botocore.session.get_session()


def typed_dicts() -> list[type]:
    return [c for _, c in inspect.getmembers(aws_shapes, inspect.isclass) if is_typeddict(c)]


def disagreements(td: Any, shape: Any, where: str) -> list[str]:
    """Where TypedDict `td` and botocore model `shape` disagree: a field the model lacks, a field
    of another kind, a member the model requires that `td` leaves out."""
    found = []
    hints = get_type_hints(td)
    for name, hint in hints.items():
        member = shape.members.get(name)
        if member is None:
            found.append(f"{where}.{name}: not in {shape.name}")
        else:
            found += kind_disagreements(hint, member, f"{where}.{name}")
    found += [f"{where}: leaves out required {m}" for m in shape.required_members if m not in hints]
    return found


def kind_disagreements(hint: Any, member: Any, where: str) -> list[str]:
    if hint in KINDS:
        ok = member.type_name == KINDS[hint]
        return [] if ok else [f"{where}: {hint.__name__}, the model's {member.type_name}"]
    if get_origin(hint) is list:
        if member.type_name != "list":
            return [f"{where}: a list, the model's {member.type_name}"]
        return kind_disagreements(get_args(hint)[0], member.member, where + "[]")
    if is_typeddict(hint):
        if member.type_name != "structure":
            return [f"{where}: a structure, the model's {member.type_name}"]
        return disagreements(hint, member, where)
    return [f"{where}: {hint} has no model kind"]


def test_every_shape_names_its_model_shape():
    assert set(typed_dicts()) == set(MODEL)


@pytest.mark.parametrize("td", list(MODEL), ids=lambda td: td.__name__)
def test_each_field_is_the_models_field_of_the_same_kind(td):
    """A misspelt or mistyped field (`DNSname`, StorageCapacity as str) fails here, not as a None
    read from every real answer; nested shapes are compared as deep as fsdpctl names them."""
    for service, name in MODEL[td]:
        shape = SESSION.get_service_model(service).shape_for(name)
        assert disagreements(td, shape, f"{service}:{name}") == []


def test_answers_are_total_false_and_requests_total():
    """The models require no member of these answers; fsdpctl sends every field of a request."""
    for td in MODEL:
        if td.__name__.endswith("Request") or td.__name__ in {
            "Tag",
            "KmsTag",
            "TagSpecification",
            "UserIdGroupPair",
            "IpPermission",
            "CreateFileSystemLustreConfiguration",
        }:
            assert td.__optional_keys__ == frozenset(), td.__name__
        else:
            assert td.__required_keys__ == frozenset(), td.__name__


def conformance(value: Any, hint: Any, where: str = "answer") -> list[str]:
    """Where an answer is not of the declared type: each field the TypedDict names that is there
    holds its kind (a missing total=False field is allowed)."""
    if get_origin(hint) in (typing.Union, types.UnionType):
        opts = [conformance(value, a, where) for a in get_args(hint)]
        return [] if any(not o for o in opts) else opts[0]
    if hint is type(None):
        return [] if value is None else [f"{where}: {value!r} is not None"]
    if hint in KINDS:
        good = isinstance(value, hint) and (hint is bool or not isinstance(value, bool))
        return [] if good else [f"{where}: {value!r} is not {hint.__name__}"]
    if get_origin(hint) is dict:  # a map: its values (keys are JSON's, always strings)
        if not isinstance(value, dict):
            return [f"{where}: {value!r} is not an object"]
        value_hint = get_args(hint)[1]
        return [e for k, v in value.items() for e in conformance(v, value_hint, f"{where}[{k}]")]
    if get_origin(hint) is list:
        if not isinstance(value, list):
            return [f"{where}: {value!r} is not a list"]
        return [
            e
            for i, v in enumerate(value)
            for e in conformance(v, get_args(hint)[0], f"{where}[{i}]")
        ]
    if is_typeddict(hint):
        if not isinstance(value, dict):
            return [f"{where}: {value!r} is not an object"]
        missing = [f"{where}: no {k}" for k in hint.__required_keys__ if k not in value]
        hints = get_type_hints(hint)
        return missing + [
            e
            for k, h in hints.items()
            if k in value
            for e in conformance(value[k], h, f"{where}.{k}")
        ]
    raise AssertionError(f"{where}: {hint} is not checked here")


def test_the_conformance_check_catches_a_wrong_kind():
    assert (
        conformance({"FileSystemId": "fs-1", "StorageCapacity": 1200}, aws_shapes.FileSystem) == []
    )
    assert conformance({"StorageCapacity": "1200"}, aws_shapes.FileSystem) != []
    assert conformance({"Tags": [{"Key": "k"}]}, aws_shapes.FileSystem) != []  # Value required
    assert conformance({"MapPublicIpOnLaunch": 1}, aws_shapes.Subnet) != []


def test_moto_answers_through_the_adapter_are_the_declared_shapes(aws_env):
    """What eksctl leaves (a cluster, its GPU node group on a private subnet, a launch template)
    and a tagged file system with its Lustre security group, made in moto, then read back through
    the adapter's typed methods: every answer holds the fields and kinds its TypedDict declares, and
    the identifiers fsdpctl indexes by are there."""
    env = eksctl_like_cluster()
    fs_id, group = moto_file_system(env)
    aws = Aws(REGION)
    cluster = aws.cluster("fsdp-eks")
    groups = aws.nodegroups("fsdp-eks")
    subnets = aws.subnets([env.private_a, env.private_b])
    file_systems = aws.lustre_file_systems()
    one = aws.file_system(fs_id)
    tagged = aws.tagged_security_groups("fsdpctl.io/cluster", "fsdp-eks")
    answers = [
        (cluster, aws_shapes.Cluster),
        *[(g, aws_shapes.Nodegroup) for g in groups],
        *[(s, aws_shapes.Subnet) for s in subnets],
        *[(f, aws_shapes.FileSystem) for f in file_systems],
        (one, aws_shapes.FileSystem),
        *[(g, aws_shapes.SecurityGroup) for g in tagged],
    ]
    assert [e for value, td in answers for e in conformance(value, td, td.__name__)] == []
    assert cluster is not None and cluster["name"] == "fsdp-eks"
    assert [g["nodegroupName"] for g in groups] == ["gpu-p5"]
    assert groups[0]["launchTemplate"]["id"] and groups[0]["scalingConfig"]["desiredSize"] == 2
    assert {s["SubnetId"] for s in subnets} == {env.private_a, env.private_b}
    assert one is not None and one["FileSystemId"] == fs_id and one["StorageCapacity"] == 2400
    assert [g["GroupId"] for g in tagged] == [group]

"""An existing VPC (issue 14): VPC_ID and PRIVATE_SUBNET_IDS, rendered for eksctl (vpc.id and
vpc.subnets.private.<az>.id) and terraform (vpc_id, private_subnet_ids: no VPC made), each subnet's
AZ read from EC2 (DescribeSubnets) against moto in server mode.

Sources: eksctl v0.230's schema
(../shared/vendor/eksctl-v0.230.0/clusterconfig-v1alpha5.schema.json: ClusterSubnets,
AZSubnetMapping keyed by AZ); eksctl refuses vpc.subnets beside availabilityZones
(pkg/ctl/cmdutils/configfile.go: "vpc.subnets and availabilityZones cannot be set at the same
time"), a node group with both subnets and availabilityZones
(pkg/apis/eksctl.io/v1alpha5/validation.go), and fewer than two private subnets (vpc.go:
MinRequiredSubnets = 2)."""

from __future__ import annotations

import json
from itertools import permutations

import pytest

from conftest import SHARED
from fsdpctl.cluster import lifecycle as cluster
from fsdpctl.errors import BadInput
from fsdpctl.job import render
from fsdpctl.plan.instances import INSTANCE_TYPES
from fsdpctl.settings import load

SCHEMA = SHARED / "vendor" / "eksctl-v0.230.0" / "clusterconfig-v1alpha5.schema.json"
VPC = "vpc-0a1b2c3d4e5f60718"
SUBNETS = ["subnet-0123456789abcdef0", "subnet-0fedcba9876543210", "subnet-00112233"]
ZONES = ["us-west-2c", "us-west-2a", "us-west-2b"]


def existing(n: int, **more: str):
    return load(
        dotenv={
            "VPC_ID": VPC,
            "PRIVATE_SUBNET_IDS": ",".join(SUBNETS[:n]),
            "AVAILABILITY_ZONES": ",".join(ZONES[:n]),
            **more,
        }
    )


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("instance", list(INSTANCE_TYPES))
def test_the_clusterconfig_keys_the_subnets_by_az_and_puts_the_gpu_nodes_in_the_first(instance, n):
    import jsonschema

    cc = render.render_clusterconfig(
        existing(n, INSTANCE_TYPE=instance, CAPACITY_RESERVATION_ID="cr-0123456789abcdef0")
    )
    assert list(jsonschema.Draft7Validator(json.loads(SCHEMA.read_text())).iter_errors(cc)) == []
    assert cc["vpc"] == {
        "id": VPC,
        "subnets": {"private": {z: {"id": s} for z, s in zip(ZONES[:n], SUBNETS[:n], strict=True)}},
    }
    assert "availabilityZones" not in cc  # eksctl refuses it beside vpc.subnets
    system, gpu = cc["managedNodeGroups"]
    assert gpu["subnets"] == [SUBNETS[0]] and "availabilityZones" not in gpu
    assert "subnets" not in system and system["privateNetworking"] and gpu["privateNetworking"]
    tfvars = render.terraform_vars(existing(n, INSTANCE_TYPE=instance))
    assert tfvars["vpc_id"] == VPC and tfvars["private_subnet_ids"] == SUBNETS[:n]
    assert tfvars["availability_zones"] == ZONES[:n]


def test_without_an_existing_vpc_nothing_changes():
    cc = render.render_clusterconfig(load(dotenv={"AVAILABILITY_ZONES": "us-west-2a,us-west-2b"}))
    assert "vpc" not in cc and cc["availabilityZones"] == ["us-west-2a", "us-west-2b"]
    assert cc["managedNodeGroups"][1]["availabilityZones"] == ["us-west-2a"]
    tfvars = render.terraform_vars(load(dotenv={}))
    assert tfvars["vpc_id"] == "" and tfvars["private_subnet_ids"] == []


def test_the_clusterconfig_needs_the_azs():
    with pytest.raises(BadInput, match="AVAILABILITY_ZONES"):
        render.render_clusterconfig(existing(2, AVAILABILITY_ZONES=""))


def described(subnets: list[str], zones: list[str], vpc: str = VPC) -> list[dict]:
    """EC2 DescribeSubnets' Subnets as the service returns them (in its own order)."""
    return [
        {"SubnetId": s, "VpcId": vpc, "AvailabilityZone": z, "State": "available"}
        for s, z in sorted(zip(subnets, zones, strict=True))
    ]


@pytest.mark.parametrize("order", list(permutations(range(3))))
def test_the_azs_come_in_the_order_of_the_setting_whatever_ec2s(order):
    subnets = [SUBNETS[i] for i in order]
    zones = [ZONES[i] for i in order]
    cfg = load(dotenv={"VPC_ID": VPC, "PRIVATE_SUBNET_IDS": ",".join(subnets)})
    assert cluster.zones_of_subnets(cfg, described(SUBNETS, ZONES)) == ",".join(zones)
    same = load(
        dotenv={
            "VPC_ID": VPC,
            "PRIVATE_SUBNET_IDS": ",".join(subnets),
            "AVAILABILITY_ZONES": ",".join(zones),
        }
    )
    assert cluster.zones_of_subnets(same, described(SUBNETS, ZONES)) == ",".join(zones)


@pytest.mark.parametrize(
    "answer, says",
    [
        (
            described(SUBNETS[:1], ZONES[:1]) + described(SUBNETS[1:2], ZONES[1:2], "vpc-99999999"),
            "is in vpc-99999999",
        ),
        (described(SUBNETS[:1], ZONES[:1]), f"{SUBNETS[1]} was not found"),
        (described(SUBNETS[:2], ZONES[:1] * 2), "two subnets share an AZ"),
    ],
)
def test_a_subnet_outside_the_vpc_or_sharing_an_az_is_bad_input(answer, says):
    cfg = load(dotenv={"VPC_ID": VPC, "PRIVATE_SUBNET_IDS": ",".join(SUBNETS[:2])})
    with pytest.raises(BadInput, match=says) as e:
        cluster.zones_of_subnets(cfg, answer)
    assert e.value.hint and "describe-subnets" in e.value.hint


def test_azs_that_do_not_match_the_subnets_are_bad_input():
    cfg = existing(2, AVAILABILITY_ZONES=",".join(reversed(ZONES[:2])))
    with pytest.raises(BadInput, match=f"PRIVATE_SUBNET_IDS are in {','.join(ZONES[:2])}"):
        cluster.zones_of_subnets(cfg, described(SUBNETS[:2], ZONES[:2]))


# ---- against moto ---------------------------------------------------------------------------------------


def make_vpc(zones: list[str]) -> tuple[str, list[str]]:
    """A VPC with one private subnet per AZ in moto; (vpc id, subnet ids in `zones` order)."""
    import boto3

    ec2 = boto3.client("ec2", region_name="us-east-1")
    vpc = ec2.create_vpc(CidrBlock="10.7.0.0/16")["Vpc"]["VpcId"]
    subnets = [
        ec2.create_subnet(VpcId=vpc, CidrBlock=f"10.7.{i}.0/24", AvailabilityZone=z)["Subnet"][
            "SubnetId"
        ]
        for i, z in enumerate(zones)
    ]
    return vpc, subnets


def test_cluster_create_reads_the_subnets_azs_from_ec2(aws_env, cli):
    """The dry run with VPC_ID and PRIVATE_SUBNET_IDS only: each subnet's AZ comes from
    DescribeSubnets (moto), in the setting's order, into the ClusterConfig eksctl would get and
    terraform's variables."""
    import yaml

    vpc, subnets = make_vpc(["us-east-1d", "us-east-1a"])
    keys = ["--set", f"VPC_ID={vpc}", "--set", f"PRIVATE_SUBNET_IDS={','.join(subnets)}"]
    dry = cli(*keys, "cluster", "create", "--dry-run")
    assert dry.exit_code == 0, dry.output
    assert "AVAILABILITY_ZONES=us-east-1d,us-east-1a" in dry.output
    cc = yaml.safe_load((cli.home / "clusters/fsdp-eks/clusterconfig.yaml").read_text())
    assert cc["vpc"] == {
        "id": vpc,
        "subnets": {
            "private": {"us-east-1d": {"id": subnets[0]}, "us-east-1a": {"id": subnets[1]}}
        },
    }
    assert cc["managedNodeGroups"][1]["subnets"] == [subnets[0]]
    tf = cli(*keys, "cluster", "create", "--tool", "terraform", "--dry-run")
    assert tf.exit_code == 0, tf.output
    tfvars = json.loads(
        (cli.home / "clusters/fsdp-eks/terraform/fsdpctl.auto.tfvars.json").read_text()
    )
    assert (tfvars["vpc_id"], tfvars["private_subnet_ids"]) == (vpc, subnets)
    assert tfvars["availability_zones"] == ["us-east-1d", "us-east-1a"]


def test_a_subnet_of_another_vpc_stops_create_with_one_line(aws_env, cli):
    vpc, subnets = make_vpc(["us-east-1a", "us-east-1b"])
    other, [stray] = make_vpc(["us-east-1c"])
    keys = ["--set", f"VPC_ID={vpc}", "--set", f"PRIVATE_SUBNET_IDS={subnets[0]},{stray}"]
    result = cli(*keys, "cluster", "create", "--dry-run")
    assert result.exit_code == 2, result.output
    [line] = [x for x in result.stderr.splitlines() if x.startswith("error:")]
    assert f"{stray} is in {other}, not in VPC_ID={vpc}" in line
    assert not (cli.home / "clusters/fsdp-eks/clusterconfig.yaml").exists()

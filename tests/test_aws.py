"""AWS side against `moto` in server mode on 127.0.0.1 (real boto3 calls over HTTP), and botocore's Stubber on
the real service models where moto lacks the API (Service Quotas answers NoSuchResource, capacity reservations
500). eksctl is not installed here: its ClusterConfig is validated against eksctl's published schema
(../shared/vendor) and its command line is checked exactly."""

from __future__ import annotations

import json
import shutil
from datetime import UTC, datetime, timedelta

import pytest

from conftest import SHARED
from fsdpctl.adapters.aws import Aws
from fsdpctl.cluster import preflight
from fsdpctl.job import render
from fsdpctl.settings import load

SCHEMA = SHARED / "vendor" / "eksctl-v0.230.0" / "clusterconfig-v1alpha5.schema.json"


def make_cluster(name="fsdp-eks", region="us-east-1"):
    import boto3

    eks = boto3.client("eks", region_name=region)
    eks.create_cluster(
        name=name, roleArn="arn:aws:iam::123456789012:role/eks", resourcesVpcConfig={}
    )
    eks.create_nodegroup(
        clusterName=name,
        nodegroupName="gpu-p5",
        nodeRole="arn:aws:iam::123456789012:role/node",
        subnets=["subnet-1"],
        instanceTypes=["p5.48xlarge"],
        scalingConfig={"minSize": 0, "maxSize": 2, "desiredSize": 2},
    )


def test_check_against_moto(aws_env, cli):
    result = cli("cluster", "check", "-o", "json")
    checks = {c["name"]: c for c in json.loads(result.stdout)["checks"]}
    assert (
        checks["credentials"]["status"] == "ok"
        and "123456789012" in checks["credentials"]["detail"]
    )
    assert (
        checks["p5.48xlarge offered"]["status"] == "ok"
        and "us-east-1a" in checks["p5.48xlarge offered"]["detail"]
    )
    assert (
        checks["P instance quota"]["status"] == "warn"
    )  # moto: NoSuchResource; the Stubber tests cover it
    assert checks["cluster name"]["status"] == "ok"
    assert result.exit_code == 0

    bad = cli(
        "--set",
        "AWS_ACCOUNT_ID=111111111111",
        "--set",
        "AVAILABILITY_ZONES=us-east-1z",
        "cluster",
        "check",
        "-o",
        "json",
    )
    checks = {c["name"]: c for c in json.loads(bad.stdout)["checks"]}
    assert bad.exit_code == 1
    assert (
        checks["credentials"]["status"] == "fail"
        and "AWS_ACCOUNT_ID is 111111111111" in checks["credentials"]["detail"]
    )
    assert (
        checks["p5.48xlarge offered"]["status"] == "fail"
        and "not offered in us-east-1z" in checks["p5.48xlarge offered"]["detail"]
    )

    make_cluster()
    again = json.loads(cli("cluster", "check", "-o", "json").stdout)["checks"]
    assert next(c for c in again if c["name"] == "cluster name")["status"] == "warn"


def _stubbed(aws: Aws, service: str):
    from botocore.stub import Stubber

    stub = Stubber(aws.client(service))
    stub.activate()
    return stub


def test_quota_check_with_stubber_on_the_real_service_model(aws_env):
    """moto has no Service Quotas data: the request we send is checked against the real model."""
    cfg = load(environ={"FSDPCTL_NODE_COUNT": "2"})
    aws = Aws("us-east-1")
    stub = _stubbed(aws, "service-quotas")
    for value in (96.0, 1152.0):
        stub.add_response(
            "get_service_quota",
            {"Quota": {"ServiceCode": "ec2", "QuotaCode": "L-417A185B", "Value": value}},
            {"ServiceCode": "ec2", "QuotaCode": "L-417A185B"},
        )
    low, high = preflight.check_quota(cfg, aws), preflight.check_quota(cfg, aws)
    assert (
        low.status == "fail"
        and "need 384 vCPUs, the quota is 96" in low.detail
        and "L-417A185B" in low.fix
    )
    assert high.status == "ok"
    stub.assert_no_pending_responses()


def test_capacity_reservation_with_stubber(aws_env):
    """moto answers 500 to describe_capacity_reservations, so the real model's Stubber stands in."""
    cfg = load(
        flags={"CAPACITY_RESERVATION_ID": "cr-0123456789abcdef0", "INSTANCE_TYPE": "p4de.24xlarge"}
    )
    aws = Aws("us-east-1")
    stub = _stubbed(aws, "ec2")
    base = {
        "CapacityReservationId": "cr-0123456789abcdef0",
        "AvailabilityZone": "us-east-1a",
        "State": "active",
        "InstanceType": "p4de.24xlarge",
        "TotalInstanceCount": 4,
        "AvailableInstanceCount": 4,
    }
    for r in (base, {**base, "InstanceType": "p5.48xlarge", "AvailableInstanceCount": 1}):
        stub.add_response(
            "describe_capacity_reservations",
            {"CapacityReservations": [r]},
            {"CapacityReservationIds": ["cr-0123456789abcdef0"]},
        )
    assert preflight.check_reservation(cfg, aws).status == "ok"
    wrong = preflight.check_reservation(cfg, aws)
    assert (
        wrong.status == "fail"
        and "reserves p5.48xlarge" in wrong.detail
        and "1 instances available" in wrong.detail
    )


def test_status_reads_the_cluster_and_node_groups(aws_env, cli):
    assert cli("cluster", "status").exit_code == 4
    make_cluster()
    data = json.loads(cli("cluster", "status", "-o", "json").stdout)
    assert data["status"] == "ACTIVE"
    assert data["nodegroups"] == [
        {
            "name": "gpu-p5",
            "status": "ACTIVE",
            "instance_types": ["p5.48xlarge"],
            "desired": 2,
            "min": 0,
            "max": 2,
        }
    ]
    assert "gpu-p5" in cli("cluster", "status").stdout


@pytest.mark.parametrize(
    "settings",
    [
        {
            "INSTANCE_TYPE": "p4de.24xlarge",
            "CAPACITY_RESERVATION_ID": "cr-0123456789abcdef0",
            "AVAILABILITY_ZONES": "us-east-1a,us-east-1b",
        },
        {"INSTANCE_TYPE": "p5.48xlarge", "NODE_COUNT": "16"},
        {"INSTANCE_TYPE": "p5e.48xlarge", "EFA_ENABLED": "false"},
    ],
)
def test_clusterconfig_validates_against_eksctls_schema(settings):
    import jsonschema

    obj = render.render_clusterconfig(load(dotenv=settings))
    assert list(jsonschema.Draft7Validator(json.loads(SCHEMA.read_text())).iter_errors(obj)) == []
    gpu = obj["managedNodeGroups"][1]
    assert gpu["instanceType"] == settings["INSTANCE_TYPE"] and gpu["efaEnabled"] == (
        settings.get("EFA_ENABLED") != "false"
    )
    assert gpu["taints"] == [{"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}]
    if "CAPACITY_RESERVATION_ID" in settings:
        assert (
            gpu["capacityReservation"]["capacityReservationTarget"]["capacityReservationID"]
            == "cr-0123456789abcdef0"
        )
        assert gpu["availabilityZones"] == ["us-east-1a"]


@pytest.mark.skipif(shutil.which("eksctl") is not None, reason="describes a machine without eksctl")
def test_create_and_delete(aws_env, tmp_path, cli):
    dry = cli("cluster", "create", "--dry-run")
    assert dry.exit_code == 0
    path = tmp_path / "home/clusters/fsdp-eks/clusterconfig.yaml"
    assert f"# AWS_REGION=us-east-1 eksctl create cluster -f {path}" in dry.stdout
    assert path.is_file()
    missing = cli("cluster", "create")
    assert (
        missing.exit_code == 1
        and "eksctl is not installed" in missing.stderr
        and "eksctl.io" in missing.stderr
    )
    assert cli("cluster", "delete", "--yes").stdout == ""  # nothing to delete: a no-op
    make_cluster()
    exists = cli("--set", "FSX_CREATE=false", "cluster", "create")  # FSx: tests/test_fsx.py
    assert exists.exit_code == 0 and "already exists (ACTIVE); nothing to do" in exists.stderr
    assert f"eksctl delete cluster -f {path} --wait" in cli("cluster", "delete", "--dry-run").stdout
    refused = cli("cluster", "delete", input="n\n")
    assert refused.exit_code == 2


def test_eksctl_command_lines_and_the_tool_environment(tmp_path):
    from fsdpctl.adapters import eksctl
    from fsdpctl.cluster import lifecycle as cluster

    path = eksctl.write_config(tmp_path, "kind: ClusterConfig\n")
    assert path == tmp_path / "clusterconfig.yaml" and path.read_text() == "kind: ClusterConfig\n"
    env = cluster.tool_env(load(dotenv={"AWS_REGION": "eu-west-1", "AWS_PROFILE": "ml"}))
    assert env == {"AWS_REGION": "eu-west-1", "AWS_PROFILE": "ml"}
    assert eksctl.cluster_command("create", path, env).argv == [
        "eksctl",
        "create",
        "cluster",
        "-f",
        str(path),
    ]
    assert eksctl.cluster_command("delete", path, env).shell_line() == (
        f"AWS_PROFILE=ml AWS_REGION=eu-west-1 eksctl delete cluster -f {path} --wait"
    )
    assert cluster.tool_env(load(dotenv={"AWS_REGION": "eu-west-1"})) == {"AWS_REGION": "eu-west-1"}
    with pytest.raises(ValueError):
        eksctl.cluster_command("upgrade", path, env)


def test_an_aws_error_is_one_line_with_the_credentials_hint(aws_env, monkeypatch):
    from fsdpctl.adapters.aws import AwsError
    from fsdpctl.errors import ExitCode, FsdpctlError

    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    with pytest.raises(AwsError) as e:
        Aws("us-east-1").cluster("fsdp-eks")
    assert isinstance(e.value, FsdpctlError) and e.value.code == ExitCode.FAILURE
    assert e.value.aws_code == "EndpointConnectionError" and "AWS_REGION" in e.value.hint


# Capacity Blocks for ML as EC2 describes them (botocore's ec2 service model, shape
# CapacityReservation: ReservationType 'capacity-block', State 'scheduled' before StartDate and
# 'active' until EndDate, then 'expired'; the AWS EC2 user guide, "Capacity Blocks for ML"). moto
# answers 500, so the Stubber on the real model checks each request and response shape.
BLOCK_ID = "cr-0123456789abcdef0"
START = datetime(2026, 12, 10, 11, 30, tzinfo=UTC)
BLOCK = {
    "CapacityReservationId": BLOCK_ID,
    "AvailabilityZone": "us-east-1d",
    "State": "scheduled",
    "InstanceType": "p5.48xlarge",
    "TotalInstanceCount": 4,
    "AvailableInstanceCount": 0,
    "ReservationType": "capacity-block",
    "StartDate": START,
    "EndDate": START + timedelta(days=7),
    "EndDateType": "limited",
    "InstanceMatchCriteria": "targeted",
    "Tenancy": "default",
    "InstancePlatform": "Linux/UNIX",
}


def _block_checks(settings: dict[str, str], reservations: list[dict], now: datetime) -> list:
    cfg = load(flags={"CAPACITY_RESERVATION_ID": BLOCK_ID, **settings})
    aws = Aws("us-east-1")
    stub = _stubbed(aws, "ec2")
    for r in reservations:
        stub.add_response(
            "describe_capacity_reservations",
            {"CapacityReservations": [r]},
            {"CapacityReservationIds": [BLOCK_ID]},
        )
    checks = [preflight.check_reservation(cfg, aws, now=now) for _ in reservations]
    stub.assert_no_pending_responses()
    return checks


def test_capacity_block_type_az_count_and_window_with_stubber(aws_env):
    """A p5 Capacity Block (the real DescribeCapacityReservations shape): ok while active with the
    settings matching it; fails before its start (saying when), after its end, in another AZ, short
    of NODE_COUNT, and when CAPACITY_RESERVATION_TYPE does not say capacity-block."""
    block = {"CAPACITY_RESERVATION_TYPE": "capacity-block", "NODE_COUNT": "4"}
    active = {**BLOCK, "State": "active", "AvailableInstanceCount": 4}
    during = START + timedelta(hours=2)
    ok, short = _block_checks(block, [active, {**active, "AvailableInstanceCount": 3}], during)
    assert ok.status == "ok", ok.detail
    assert (
        "Capacity Block, active" in ok.detail
        and "2026-12-10 11:30 UTC to 2026-12-17 11:30 UTC" in ok.detail
    )
    assert short.status == "fail" and "3 instances available, 4 needed" in short.detail

    (early,) = _block_checks(block, [BLOCK], START - timedelta(hours=5))
    assert early.status == "fail"
    assert (
        "it starts at 2026-12-10 11:30 UTC (in 5.0 h)" in early.detail
        and "after 2026-12-10" in early.fix
    )
    (late,) = _block_checks(block, [{**BLOCK, "State": "expired"}], START + timedelta(days=8))
    assert late.status == "fail" and "it ended at 2026-12-17 11:30 UTC" in late.detail

    elsewhere = {**block, "AVAILABILITY_ZONES": "us-east-1a,us-east-1b", "NODE_COUNT": "8"}
    (wrong,) = _block_checks(elsewhere, [active], during)
    assert "the GPU node group's AZ is us-east-1a, the reservation's us-east-1d" in wrong.detail
    assert "4 instances available, 8 needed" in wrong.detail
    assert "AVAILABILITY_ZONES to start with us-east-1d" in wrong.fix
    (untyped,) = _block_checks({"NODE_COUNT": "4"}, [active], during)
    assert untyped.status == "fail" and "CAPACITY_RESERVATION_TYPE=capacity-block" in untyped.fix
    (scheduled_ok,) = _block_checks(
        {**block, "NODE_COUNT": "4"}, [BLOCK], START + timedelta(minutes=1)
    )
    assert scheduled_ok.status == "ok", (
        scheduled_ok.detail
    )  # the window counts: the state may lag behind it


@pytest.mark.parametrize("tool", ["eksctl", "terraform"])
def test_create_puts_the_gpu_nodes_in_the_capacity_blocks_az(aws_env, cli, monkeypatch, tool):
    """With AVAILABILITY_ZONES empty `cluster create` reads the block's AZ (Stubber on the real ec2
    model: DescribeCapacityReservations, DescribeAvailabilityZones) and the GPU node group goes
    there: the ClusterConfig validates against eksctl's schema with instanceMarketOptions.marketType
    capacity-block (eksctl v0.230.0's ManagedNodeGroup.instanceMarketOptions), and terraform's
    tfvars carry the type."""
    from fsdpctl.cluster import lifecycle as cluster

    aws = Aws("us-east-1")
    stub = _stubbed(aws, "ec2")
    stub.add_response(
        "describe_capacity_reservations",
        {"CapacityReservations": [BLOCK]},
        {"CapacityReservationIds": [BLOCK_ID]},
    )
    zones = [
        {"ZoneName": f"us-east-1{c}", "State": "available", "ZoneType": "availability-zone"}
        for c in "abd"
    ]
    zone_filter = [{"Name": "zone-type", "Values": ["availability-zone"]}]
    stub.add_response(
        "describe_availability_zones", {"AvailabilityZones": zones}, {"Filters": zone_filter}
    )
    monkeypatch.setattr(cluster, "connect", lambda cfg: aws)
    block = [
        "--set",
        f"CAPACITY_RESERVATION_ID={BLOCK_ID}",
        "--set",
        "CAPACITY_RESERVATION_TYPE=capacity-block",
    ]
    result = cli(*block, "cluster", "create", "--tool", tool, "--dry-run")
    assert result.exit_code == 0, result.stderr
    assert "AVAILABILITY_ZONES=us-east-1d,us-east-1a" in result.stderr
    stub.assert_no_pending_responses()
    work = cli.home / "clusters/fsdp-eks"
    if tool == "terraform":
        tfvars = json.loads((work / "terraform/fsdpctl.auto.tfvars.json").read_text())
        assert tfvars["availability_zones"] == ["us-east-1d", "us-east-1a"]
        assert tfvars["capacity_reservation_type"] == "capacity-block"
        return
    import jsonschema
    import yaml

    obj = yaml.safe_load((work / "clusterconfig.yaml").read_text())
    assert list(jsonschema.Draft7Validator(json.loads(SCHEMA.read_text())).iter_errors(obj)) == []
    assert obj["availabilityZones"] == ["us-east-1d", "us-east-1a"]
    gpu = obj["managedNodeGroups"][1]
    assert gpu["availabilityZones"] == ["us-east-1d"]
    assert gpu["instanceMarketOptions"] == {"marketType": "capacity-block"}
    assert (
        gpu["capacityReservation"]["capacityReservationTarget"]["capacityReservationID"] == BLOCK_ID
    )


def test_an_on_demand_reservation_has_no_market_options():
    obj = render.render_clusterconfig(load(dotenv={"CAPACITY_RESERVATION_ID": BLOCK_ID}))
    assert "instanceMarketOptions" not in obj["managedNodeGroups"][1]
    assert render.terraform_vars(load(dotenv={}))["capacity_reservation_type"] == "default"


def test_create_stops_when_the_reservations_az_cannot_be_read(aws_env, cli, monkeypatch):
    """moto answers describe_capacity_reservations with HTTP 500 (an HTML page): a real create stops
    before running anything, naming the setting to set; the dry run warns and keeps the default AZs.
    """
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    block = [
        "--set",
        f"CAPACITY_RESERVATION_ID={BLOCK_ID}",
        "--set",
        "CAPACITY_RESERVATION_TYPE=capacity-block",
    ]
    real = cli(*block, "cluster", "create", "--tool", "terraform")
    assert real.exit_code == 1 and f"could not read the AZ of {BLOCK_ID}" in real.stderr
    assert (
        "AVAILABILITY_ZONES" in real.stderr
        and not (cli.home / "clusters/fsdp-eks/create.log").exists()
    )
    dry = cli(*block, "cluster", "create", "--tool", "terraform", "--dry-run")
    assert dry.exit_code == 0 and "the dry run keeps the default AZs" in dry.stderr

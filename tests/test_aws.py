"""AWS side against `moto` in server mode on 127.0.0.1 (real boto3 calls over HTTP), and botocore's Stubber on
the real service models where moto lacks the API (Service Quotas answers NoSuchResource, capacity reservations
500). eksctl is not installed here: its ClusterConfig is validated against eksctl's published schema
(../shared/vendor) and its command line is checked exactly."""

from __future__ import annotations

import json
import shutil

import pytest

from conftest import SHARED
from fsdpctl import preflight, render
from fsdpctl.adapters.aws import Aws
from fsdpctl.settings import load

SCHEMA = SHARED / "vendor" / "eksctl-v0.230.0" / "clusterconfig-v1alpha5.schema.json"


def make_cluster(name="fsdp-eks", region="us-east-1"):
    import boto3

    eks = boto3.client("eks", region_name=region)
    eks.create_cluster(name=name, roleArn="arn:aws:iam::123456789012:role/eks", resourcesVpcConfig={})
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
    assert checks["credentials"]["status"] == "ok" and "123456789012" in checks["credentials"]["detail"]
    assert (
        checks["p5.48xlarge offered"]["status"] == "ok"
        and "us-east-1a" in checks["p5.48xlarge offered"]["detail"]
    )
    assert checks["P instance quota"]["status"] == "warn"  # moto: NoSuchResource; the Stubber tests cover it
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
    cfg = load(environ={"NODE_COUNT": "2"})
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
        low.status == "fail" and "need 384 vCPUs, the quota is 96" in low.detail and "L-417A185B" in low.fix
    )
    assert high.status == "ok"
    stub.assert_no_pending_responses()


def test_capacity_reservation_with_stubber(aws_env):
    """moto answers 500 to describe_capacity_reservations, so the real model's Stubber stands in."""
    cfg = load(environ={"CAPACITY_RESERVATION_ID": "cr-0123456789abcdef0", "INSTANCE_TYPE": "p4de.24xlarge"})
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
    exists = cli("cluster", "create")
    assert exists.exit_code == 0 and "already exists (ACTIVE); nothing to do" in exists.stderr
    assert f"eksctl delete cluster -f {path} --wait" in cli("cluster", "delete", "--dry-run").stdout
    refused = cli("cluster", "delete", input="n\n")
    assert refused.exit_code == 2


def test_eksctl_command_lines_and_the_tool_environment(tmp_path):
    from fsdpctl import cluster
    from fsdpctl.adapters import eksctl

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

"""`fsdpctl cluster check`: before any money is spent, ask AWS whether the cluster the settings describe can
be created. Each check is ok / warn / fail with the fix; the AWS calls go through the `adapters.aws` object.
"""

from __future__ import annotations

from fsdpctl.adapters.aws import P_INSTANCES_QUOTA, Aws, AwsError
from fsdpctl.checks import FAIL, OK, WARN, Check
from fsdpctl.settings import Config


def check_identity(cfg: Config, aws: Aws) -> Check:
    try:
        who = aws.identity()
    except AwsError as e:
        return Check("credentials", FAIL, str(e), "configure credentials: `aws configure` or AWS_PROFILE")
    if cfg.aws_account_id and who["Account"] != cfg.aws_account_id:
        return Check(
            "credentials",
            FAIL,
            f"credentials are for account {who['Account']}, AWS_ACCOUNT_ID is {cfg.aws_account_id}",
            "switch AWS_PROFILE or fix AWS_ACCOUNT_ID",
        )
    return Check("credentials", OK, f"account {who['Account']} as {who['Arn']}")


def check_offering(cfg: Config, aws: Aws) -> Check:
    name = f"{cfg.instance_type} offered"
    try:
        zones = aws.instance_type_zones(cfg.instance_type)
    except AwsError as e:
        return Check(name, FAIL, str(e), "check AWS_REGION")
    wanted = [z for z in cfg.availability_zones.split(",") if z]
    if not zones:
        return Check(
            name, FAIL, f"not offered in {cfg.aws_region}", "pick a region that has it (us-east-1, us-west-2)"
        )
    if wanted and wanted[0] not in zones:
        offered = ", ".join(zones)
        fix = f"set AVAILABILITY_ZONES to start with one of {offered}"
        return Check(name, FAIL, f"not offered in {wanted[0]}; offered in {offered}", fix)
    return Check(name, OK, f"offered in {', '.join(zones)}")


def check_quota(cfg: Config, aws: Aws) -> Check:
    name = "P instance quota"
    try:
        need = aws.vcpus(cfg.instance_type) * cfg.node_count
        quota = aws.p_instance_quota()
    except AwsError as e:
        fix = f"check Service Quotas {P_INSTANCES_QUOTA[0]}/{P_INSTANCES_QUOTA[1]} by hand"
        return Check(name, WARN, f"could not read the quota ({e})", fix)
    if need > quota:
        detail = f"{cfg.node_count} x {cfg.instance_type} need {need} vCPUs, the quota is {quota:.0f}"
        fix = f"request an increase of Service Quotas {P_INSTANCES_QUOTA[1]} (Running On-Demand P instances)"
        return Check(name, FAIL, detail, fix)
    return Check(name, OK, f"{need} of {quota:.0f} vCPUs")


def check_reservation(cfg: Config, aws: Aws) -> Check:
    name = "capacity reservation"
    if not cfg.capacity_reservation_id:
        return Check(name, OK, "none requested (On-Demand capacity is not guaranteed for P instances)")
    try:
        r = aws.capacity_reservation(cfg.capacity_reservation_id)
    except AwsError as e:
        return Check(name, FAIL, str(e), "check CAPACITY_RESERVATION_ID and AWS_REGION")
    problems = []
    if r["State"] != "active":
        problems.append(f"state {r['State']}")
    if r["InstanceType"] != cfg.instance_type:
        problems.append(f"it reserves {r['InstanceType']}, not {cfg.instance_type}")
    if r["AvailableInstanceCount"] < cfg.node_count:
        problems.append(f"{r['AvailableInstanceCount']} instances available, {cfg.node_count} needed")
    detail = (
        f"{r['CapacityReservationId']} in {r['AvailabilityZone']}: {r['AvailableInstanceCount']}/"
        f"{r['TotalInstanceCount']} available"
    )
    if problems:
        return Check(name, FAIL, detail + "; " + "; ".join(problems), "fix the reservation or the settings")
    return Check(name, OK, detail)


def check_existing(cfg: Config, aws: Aws) -> Check:
    try:
        cluster = aws.cluster(cfg.cluster_name)
    except AwsError as e:
        return Check("cluster name", WARN, f"could not look it up ({e})")
    if cluster:
        return Check(
            "cluster name",
            WARN,
            f"cluster {cfg.cluster_name} exists ({cluster['status']})",
            "`cluster create` will leave it as is; pick another CLUSTER_NAME for a new one",
        )
    return Check("cluster name", OK, f"{cfg.cluster_name} is free in {cfg.aws_region}")


def run_checks(cfg: Config, aws: Aws) -> list[Check]:
    return [
        check(cfg, aws)
        for check in (check_identity, check_offering, check_quota, check_reservation, check_existing)
    ]

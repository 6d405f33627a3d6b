"""`fsdpctl cluster check`: before any money is spent, ask AWS whether the cluster the settings
describe can be created. Each check is ok / warn / fail with the fix; the AWS calls go through the
`adapters.aws` object.
"""

from __future__ import annotations

from datetime import UTC, datetime

from fsdpctl.adapters.aws import P_INSTANCES_QUOTA, Aws, AwsError
from fsdpctl.cluster.checks import FAIL, OK, WARN, Check
from fsdpctl.settings import Config


def check_identity(cfg: Config, aws: Aws) -> Check:
    try:
        who = aws.identity()
    except AwsError as e:
        return Check(
            "credentials", FAIL, str(e), "configure credentials: `aws configure` or AWS_PROFILE"
        )
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
            name,
            FAIL,
            f"not offered in {cfg.aws_region}",
            "pick a region that has it (us-east-1, us-west-2)",
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
        detail = (
            f"{cfg.node_count} x {cfg.instance_type} need {need} vCPUs, the quota is {quota:.0f}"
        )
        fix = f"request an increase of Service Quotas {P_INSTANCES_QUOTA[1]} (Running On-Demand P instances)"
        return Check(name, FAIL, detail, fix)
    return Check(name, OK, f"{need} of {quota:.0f} vCPUs")


def check_reservation(cfg: Config, aws: Aws, now: datetime | None = None) -> Check:
    """The reservation against the settings: its type (a Capacity Block launches only as market type
    capacity-block), instance type, AZ (the GPU node group's), count and, for a block, its time
    window."""
    name = "capacity reservation"
    if not cfg.capacity_reservation_id:
        return Check(
            name, OK, "none requested (On-Demand capacity is not guaranteed for P instances)"
        )
    try:
        r = aws.capacity_reservation(cfg.capacity_reservation_id)
    except AwsError as e:
        return Check(name, FAIL, str(e), "check CAPACITY_RESERVATION_ID and AWS_REGION")
    kind = "Capacity Block" if r.get("ReservationType") == "capacity-block" else "reservation"
    detail = (
        f"{r['CapacityReservationId']} ({kind}, {r['State']}) of {r['InstanceType']} in "
        f"{r['AvailabilityZone']}: {r['AvailableInstanceCount']}/{r['TotalInstanceCount']} available"
    )
    if r.get("StartDate") and r.get("EndDate"):
        detail += f", {_when(r['StartDate'])} to {_when(r['EndDate'])}"
    problems = _reservation_problems(cfg, r, now or datetime.now(UTC))
    if problems:
        text, fixes = (
            "; ".join(p for p, _ in problems),
            "; ".join(dict.fromkeys(f for _, f in problems)),
        )
        return Check(name, FAIL, f"{detail}; {text}", fixes)
    return Check(name, OK, detail)


def _when(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")


def _reservation_problems(cfg: Config, r: dict, now: datetime) -> list[tuple[str, str]]:
    """(what is wrong, the fix) for each way the reservation and the settings disagree."""
    problems = []
    rtype, zone = r.get("ReservationType", "default"), r["AvailabilityZone"]
    if rtype != cfg.capacity_reservation_type:
        problems.append(
            (
                f"it is of type {rtype}, CAPACITY_RESERVATION_TYPE is {cfg.capacity_reservation_type}",
                f"set CAPACITY_RESERVATION_TYPE={rtype}",
            )
        )
    if r["InstanceType"] != cfg.instance_type:
        problems.append(
            (
                f"it reserves {r['InstanceType']}, not {cfg.instance_type}",
                f"set INSTANCE_TYPE={r['InstanceType']}",
            )
        )
    wanted = next((z for z in cfg.availability_zones.split(",") if z), zone)
    if wanted != zone:
        fix = f"set AVAILABILITY_ZONES to start with {zone} (empty: the reservation's AZ)"
        problems.append((f"the GPU node group's AZ is {wanted}, the reservation's {zone}", fix))
    problems += _count_problem(cfg, r) + _window_problem(r, now)
    return problems


def _count_problem(cfg: Config, r: dict) -> list[tuple[str, str]]:
    # before a block starts nothing is "available" yet: what it will hold is its total
    active = r["State"] == "active"
    count = r["AvailableInstanceCount"] if active else r["TotalInstanceCount"]
    if count >= cfg.node_count:
        return []
    what = "instances available" if active else "instances reserved"
    return [
        (
            f"{count} {what}, {cfg.node_count} needed",
            f"set NODE_COUNT to at most {count} or reserve more",
        )
    ]


def _window_problem(r: dict, now: datetime) -> list[tuple[str, str]]:
    """A Capacity Block's nodes exist only between its start and end (its dates decide: EC2's state
    may lag behind them by minutes); any other reservation must be active."""
    start, end, state = r.get("StartDate"), r.get("EndDate"), r["State"]
    if (end and end <= now) or state in ("expired", "cancelled"):
        ended = f"it ended at {_when(end)}" if end else f"it is {state}"
        return [
            (ended, "buy a new Capacity Block (or reservation) and set CAPACITY_RESERVATION_ID")
        ]
    if start and start > now:
        hours = (start - now).total_seconds() / 3600
        starts = f"it starts at {_when(start)} (in {hours:.1f} h); no node launches before"
        return [(starts, f"run `fsdpctl cluster create` after {_when(start)}")]
    if state != "active" and not (start and state == "scheduled"):
        return [(f"state {state}", "wait until EC2 reports it active")]
    return []


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
        for check in (
            check_identity,
            check_offering,
            check_quota,
            check_reservation,
            check_existing,
        )
    ]

"""The shared FSx for Lustre file system of an eksctl cluster: made by `cluster create` through
boto3, asked about and deleted by `cluster delete` (issue 14, shared storage).

Peers. moto 5.2 (server mode, the `aws_env` fixture) serves EC2, EKS and KMS for real here, and FSx
in part. Tried here, moto's FSx does: CreateFileSystem (answers the request's fields back, DNSName
`<id>.fsx.<region>.amazonaws.com`), DescribeFileSystems (all, or by id), tags given at creation
(Tags in the description), DeleteFileSystem (FileSystemNotFound for an unknown id). It does not:
report a Lifecycle (no CREATING/AVAILABLE/DELETING ever), a LustreConfiguration.MountName, VpcId or
network interfaces; honour ClientRequestToken (the same token twice makes two file systems); keep a
deleting file system (it vanishes at once, and DescribeFileSystems by its id answers an empty list
where AWS answers FileSystemNotFound). Also moto's EKS gives resourcesVpcConfig no vpcId and no
clusterSecurityGroupId. So: deletion, tags and the listing run against moto's FSx; creation and the
wait for AVAILABLE run against botocore's Stubber on the real FSx model (botocore's
data/fsx/.../service-2.json: the Stubber checks every request and every canned answer against it),
with EC2/EKS/KMS still moto's. Requests the dry run prints are validated against the real models
too.

Lustre's ports (TCP 988, 1018-1023 from the file system's group and the clients'): FSx for Lustre
User Guide, "File system access control with Amazon VPC" and "Creating an FSx for Lustre file system
fails" (docs.aws.amazon.com/fsx/latest/LustreGuide/limit-access-security-groups.html,
.../cannot-create-fs.html). The file system's choices are terraform's
(terraform/modules/eks-gpu/fsx.tf), checked against that file."""

from __future__ import annotations

import json
import re
from types import SimpleNamespace

import boto3
import pytest
from botocore.stub import Stubber
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from conftest import ROOT
from fsdpctl.adapters.aws import Aws
from fsdpctl.cluster import fsx
from fsdpctl.cluster import lifecycle as cluster
from fsdpctl.errors import FsdpctlError
from fsdpctl.settings import load

REGION = "us-east-1"
NAME = "fsdp-eks"  # the default CLUSTER_NAME
FS_ID = "fs-0123456789abcdef0"
EKSCTL = ("--tool", "eksctl")
# several CLI runs over moto server each (a boto3 session and its clients per run): 3-20 s on a
# shared box
SLOW = pytest.mark.slow


# ---- peers -------------------------------------------------------------------------------------------------


def eksctl_like_cluster(name: str = NAME) -> SimpleNamespace:
    """In moto, what `eksctl create cluster` leaves for an EFA GPU node group: a VPC with a public
    and a private subnet per AZ, the cluster on all four, the GPU node group on one private subnet,
    its launch template giving the EFA interface the shared node group and the EFA security groups.
    """
    ec2 = boto3.client("ec2", region_name=REGION)
    vpc = ec2.create_vpc(CidrBlock="192.168.0.0/16")["Vpc"]["VpcId"]

    def subnet(cidr: str, zone: str, public: bool) -> str:
        sid = ec2.create_subnet(VpcId=vpc, CidrBlock=cidr, AvailabilityZone=zone)["Subnet"][
            "SubnetId"
        ]
        if public:
            ec2.modify_subnet_attribute(SubnetId=sid, MapPublicIpOnLaunch={"Value": True})
        return sid

    public_a, public_b = (
        subnet("192.168.0.0/19", "us-east-1a", True),
        subnet("192.168.32.0/19", "us-east-1b", True),
    )
    private_a = subnet("192.168.64.0/19", "us-east-1a", False)
    private_b = subnet("192.168.96.0/19", "us-east-1b", False)
    groups = [
        ec2.create_security_group(GroupName=g, Description=g, VpcId=vpc)["GroupId"]
        for g in (f"eksctl-{name}-cluster-ClusterSharedNodeSecurityGroup", f"eksctl-{name}-efa")
    ]
    nic = {"DeviceIndex": 0, "NetworkCardIndex": 0, "InterfaceType": "efa", "Groups": groups}
    template = ec2.create_launch_template(
        LaunchTemplateName=f"eksctl-{name}-gpu-p5", LaunchTemplateData={"NetworkInterfaces": [nic]}
    )["LaunchTemplate"]
    eks = boto3.client("eks", region_name=REGION)
    eks.create_cluster(
        name=name,
        roleArn="arn:aws:iam::123456789012:role/eks",
        resourcesVpcConfig={"subnetIds": [public_a, public_b, private_a, private_b]},
    )
    eks.create_nodegroup(
        clusterName=name,
        nodegroupName="gpu-p5",
        nodeRole="arn:aws:iam::123456789012:role/node",
        subnets=[private_b],
        scalingConfig={"minSize": 0, "maxSize": 2, "desiredSize": 2},
        launchTemplate={"id": template["LaunchTemplateId"], "version": "1"},
    )
    return SimpleNamespace(vpc=vpc, private_b=private_b, private_a=private_a, groups=groups)


def described(lifecycle: str, fs_id: str = FS_ID, name: str = NAME, **extra) -> dict:
    """A DescribeFileSystems entry as FSx gives it (fields and types from the real model's
    FileSystem)."""
    return {
        "OwnerId": "123456789012",
        "FileSystemId": fs_id,
        "FileSystemType": "LUSTRE",
        "FileSystemTypeVersion": "2.15",
        "Lifecycle": lifecycle,
        "StorageCapacity": 1200,
        "StorageType": "SSD",
        "VpcId": "vpc-0123456789abcdef0",
        "SubnetIds": ["subnet-0123456789abcdef0"],
        "NetworkInterfaceIds": ["eni-0123456789abcdef0"],
        "DNSName": f"{fs_id}.fsx.{REGION}.amazonaws.com",
        "KmsKeyId": f"arn:aws:kms:{REGION}:123456789012:key/00000000-0000-0000-0000-000000000000",
        "ResourceARN": f"arn:aws:fsx:{REGION}:123456789012:file-system/{fs_id}",
        "Tags": fsx.tags(name),
        "LustreConfiguration": {
            "DeploymentType": "PERSISTENT_2",
            "PerUnitStorageThroughput": 250,
            "MountName": "abcdefgh",
            "DataCompressionType": "LZ4",
        },
        **extra,
    }


@pytest.fixture
def stub_fsx(aws_env, monkeypatch):
    """FSx through botocore's Stubber on the real model (EC2/EKS/KMS stay moto's); every
    CreateFileSystem request is kept in `.created`. Polls do not sleep."""
    client = boto3.client("fsx", region_name=REGION)
    stub = Stubber(client)
    created: list[dict] = []
    client.meta.events.register(
        "provide-client-params.fsx.CreateFileSystem", lambda params, **_: created.append(params)
    )
    real = Aws.client
    monkeypatch.setattr(
        Aws, "client", lambda self, service: client if service == "fsx" else real(self, service)
    )
    monkeypatch.setattr(
        cluster, "FSX_WAITING", cluster.Waiting(limit_s=600, poll_s=30, sleep=lambda s: None)
    )
    stub.activate()
    stub.created = created
    yield stub
    stub.deactivate()


def lustre_groups(name: str = NAME) -> list[dict]:
    ec2 = boto3.client("ec2", region_name=REGION)
    return ec2.describe_security_groups(Filters=[{"Name": f"tag:{fsx.TAG_KEY}", "Values": [name]}])[
        "SecurityGroups"
    ]


def key_state(name: str = NAME) -> str | None:
    kms = boto3.client("kms", region_name=REGION)
    aliases = [a for a in kms.list_aliases()["Aliases"] if a["AliasName"] == fsx.key_alias(name)]
    return (
        kms.describe_key(KeyId=aliases[0]["TargetKeyId"])["KeyMetadata"]["KeyState"]
        if aliases
        else None
    )


def rules(group: dict) -> dict[tuple[int, int], set[str]]:
    return {
        (p["FromPort"], p["ToPort"]): {g["GroupId"] for g in p["UserIdGroupPairs"]}
        for p in group["IpPermissions"]
        if p["IpProtocol"] == "tcp"
    }


def settings_lines(stdout: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in stdout.splitlines() if line.startswith("FSX_"))


# ---- the plan (pure) ---------------------------------------------------------------------------------------

subnet_st = st.fixed_dictionaries(
    {
        "zone": st.sampled_from(["us-east-1a", "us-east-1b", "us-east-1c"]),
        "public": st.booleans(),
        "in_vpc": st.booleans(),
        "in_group": st.booleans(),
    }
)


@hsettings(max_examples=100, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(subnet_st, max_size=8), st.lists(st.sampled_from(["sg-a", "sg-b", "sg-c"]), max_size=4)
)
def test_the_plan_puts_it_in_a_private_subnet_of_the_gpu_node_group(specs, template_groups):
    """Over generated VPC layouts (subnets public or private, in the cluster's VPC or not, the node
    group's or not): the chosen subnet is always the node group's, in the cluster's VPC, private, in
    the first such AZ; with none the plan fails naming the node group; the ingress admits Lustre's
    ports from the group itself, the cluster security group and every launch-template group, once
    each."""
    subnets = [
        {
            "SubnetId": f"subnet-{i:017x}",
            "AvailabilityZone": s["zone"],
            "VpcId": "vpc-1" if s["in_vpc"] else "vpc-2",
            "MapPublicIpOnLaunch": s["public"],
        }
        for i, s in enumerate(specs)
    ]
    group = {
        "nodegroupName": "gpu-p5",
        "subnets": [n["SubnetId"] for n, s in zip(subnets, specs, strict=True) if s["in_group"]],
    }
    found = {
        "resourcesVpcConfig": {
            "vpcId": "vpc-1",
            "clusterSecurityGroupId": "sg-cluster",
            "subnetIds": [],
        }
    }
    fit = [
        n
        for n, s in zip(subnets, specs, strict=True)
        if s["in_group"] and s["in_vpc"] and not s["public"]
    ]
    if not fit:
        with pytest.raises(
            FsdpctlError, match="node group gpu-p5 of c has no private subnet in VPC vpc-1"
        ):
            fsx.plan("c", 1200, found, group, subnets, template_groups)
        return
    p = fsx.plan("c", 2400, found, group, subnets, template_groups)
    chosen = next(n for n in subnets if n["SubnetId"] == p.subnet_id)
    assert chosen in fit and p.zone == chosen["AvailabilityZone"] == min(
        n["AvailabilityZone"] for n in fit
    )
    assert p.vpc_id == "vpc-1"
    request = p.file_system_request("sg-lustre", "arn:key")
    assert request["SubnetIds"] == [p.subnet_id] and request["StorageCapacity"] == 2400
    ingress = p.ingress_request("sg-lustre")
    want = [
        "sg-lustre",
        "sg-cluster",
        *dict.fromkeys(g for g in template_groups if g != "sg-cluster"),
    ]
    assert {(r["FromPort"], r["ToPort"]) for r in ingress["IpPermissions"]} == {
        (988, 988),
        (1018, 1023),
    }
    for r in ingress["IpPermissions"]:
        assert r["IpProtocol"] == "tcp" and [g["GroupId"] for g in r["UserIdGroupPairs"]] == want


def test_the_vpc_comes_from_the_clusters_subnets_when_eks_names_none():
    """moto's EKS leaves resourcesVpcConfig.vpcId out; the cluster's own subnets then name the VPC."""
    subnets = [{"SubnetId": "subnet-1", "AvailabilityZone": "us-east-1a", "VpcId": "vpc-9"}]
    found = {"resourcesVpcConfig": {"subnetIds": ["subnet-1"]}}
    p = fsx.plan("c", 1200, found, {"subnets": ["subnet-1"]}, subnets)
    assert (p.vpc_id, p.subnet_id, p.client_groups) == ("vpc-9", "subnet-1", ())


def test_the_requests_are_valid_for_the_real_service_models():
    """Every request the plan makes validates against botocore's models (a wrong field name or type
    is caught here, not by AWS)."""
    from botocore.validate import ParamValidator

    sg = "sg-0123456789abcdef{}".format
    p = fsx.Plan(
        NAME,
        "vpc-0123456789abcdef0",
        "us-east-1b",
        "subnet-0123456789abcdef0",
        (sg(1), sg(2)),
        1200,
    )
    key = f"arn:aws:kms:{REGION}:123456789012:key/00000000-0000-0000-0000-000000000000"
    calls = {
        ("ec2", "CreateSecurityGroup"): p.security_group_request(),
        ("ec2", "AuthorizeSecurityGroupIngress"): p.ingress_request(sg(0)),
        ("kms", "CreateKey"): p.key_request(),
        ("fsx", "CreateFileSystem"): p.file_system_request(sg(0), key),
    }
    session = boto3.session.Session(region_name=REGION)
    for (service, op), request in calls.items():
        model = session.client(service).meta.service_model.operation_model(op)
        report = ParamValidator().validate(request, model.input_shape)
        assert not report.has_errors(), report.generate_report()


def test_both_tools_make_the_same_file_system():
    """The eksctl path's choices are terraform's: read from terraform/modules/eks-gpu/fsx.tf and the
    root module's fsx_throughput default."""
    tf = (ROOT / "terraform/modules/eks-gpu/fsx.tf").read_text()
    variables = (ROOT / "terraform/variables.tf").read_text()

    def attr(name: str) -> str:
        return re.search(rf'^\s*{name}\s*=\s*"([^"]+)"', tf, re.M).group(1)  # type: ignore[union-attr]

    assert attr("deployment_type") == fsx.DEPLOYMENT_TYPE
    assert attr("data_compression_type") == fsx.COMPRESSION
    assert attr("file_system_type_version") == fsx.LUSTRE_VERSION
    assert attr("name") == fsx.group_name("${var.cluster_name}")
    throughput = re.search(r'variable "fsx_throughput" \{[^}]*default\s*=\s*(\d+)', variables, re.S)
    assert throughput and int(throughput.group(1)) == fsx.THROUGHPUT_MB_PER_TIB
    window = re.search(
        r"deletion_window_in_days\s*=\s*(\d+)", tf[tf.index('"aws_kms_key" "fsx"') :]
    )
    assert window and int(window.group(1)) == fsx.KMS_DELETION_DAYS
    ports = {tuple(int(x) for x in pair) for pair in re.findall(r"\[(\d+), (\d+)\]", tf)}
    assert ports == set(fsx.LUSTRE_PORTS)


# ---- cluster create ----------------------------------------------------------------------------------------


@SLOW
def test_create_makes_it_where_the_gpu_nodes_are_and_a_rerun_makes_no_second(stub_fsx, cli):
    """The cluster exists (eksctl is not run): the security group (Lustre from itself and both node
    groups of the launch template) and the rotated KMS key are made in moto, CreateFileSystem goes
    to the GPU node group's private subnet in us-east-1b, the wait shows CREATING until AVAILABLE,
    and the printed FSX_* lines are settings `deploy storage` accepts. A rerun finds the tagged file
    system and creates nothing; a rerun after a half-done create (no file system yet) reuses the
    group and the key."""
    env = eksctl_like_cluster()
    stub_fsx.add_response("describe_file_systems", {"FileSystems": []}, {})
    stub_fsx.add_response("create_file_system", {"FileSystem": described("CREATING")})
    for state in ("CREATING", "AVAILABLE"):
        stub_fsx.add_response(
            "describe_file_systems", {"FileSystems": [described(state)]}, {"FileSystemIds": [FS_ID]}
        )
    made = cli("cluster", "create", *EKSCTL)
    assert made.exit_code == 0, made.stderr
    stub_fsx.assert_no_pending_responses()
    assert "FSx for Lustre fs-0123456789abcdef0: CREATING (0 s)" in made.stderr
    assert "CREATING (30 s)" in made.stderr and f"in {env.private_b} (us-east-1b)" in made.stderr
    printed = settings_lines(made.stdout)
    assert printed == {
        "FSX_FILE_SYSTEM_ID": FS_ID,
        "FSX_DNS_NAME": f"{FS_ID}.fsx.{REGION}.amazonaws.com",
        "FSX_MOUNT_NAME": "abcdefgh",
        "FSX_STORAGE_GIB": "1200",
    }
    assert made.stdout.splitlines() == [
        f"{k}={v}" for k, v in printed.items()
    ]  # `>> .env` takes only these
    cfg = load(dotenv=printed)
    assert (cfg.fsx_file_system_id, cfg.fsx_mount_name) == (FS_ID, "abcdefgh")

    (group,) = lustre_groups()
    assert group["GroupName"] == f"{NAME}-lustre" and group["VpcId"] == env.vpc
    assert rules(group) == {
        (988, 988): {group["GroupId"], *env.groups},
        (1018, 1023): {group["GroupId"], *env.groups},
    }
    assert key_state() == "Enabled"
    kms = boto3.client("kms", region_name=REGION)
    key_arn = kms.describe_key(KeyId=fsx.key_alias(NAME))["KeyMetadata"]["Arn"]
    assert kms.get_key_rotation_status(KeyId=key_arn)["KeyRotationEnabled"]
    (request,) = stub_fsx.created
    assert request["SubnetIds"] == [env.private_b] and request["SecurityGroupIds"] == [
        group["GroupId"]
    ]
    assert request["KmsKeyId"] == key_arn and request["StorageCapacity"] == 1200
    assert request["LustreConfiguration"]["DeploymentType"] == "PERSISTENT_2"
    assert {"Key": fsx.TAG_KEY, "Value": NAME} in request["Tags"]

    stub_fsx.add_response("describe_file_systems", {"FileSystems": [described("AVAILABLE")]}, {})
    again = cli("cluster", "create", *EKSCTL)
    assert again.exit_code == 0, again.stderr
    stub_fsx.assert_no_pending_responses()
    assert len(stub_fsx.created) == 1 and "exists (AVAILABLE)" in again.stderr
    assert settings_lines(again.stdout) == printed

    stub_fsx.add_response("describe_file_systems", {"FileSystems": [described("DELETING")]}, {})
    stub_fsx.add_response(
        "create_file_system", {"FileSystem": described("AVAILABLE", fs_id="fs-0123456789abcdef1")}
    )
    half = cli("cluster", "create", *EKSCTL)
    assert half.exit_code == 0, half.stderr
    assert len(lustre_groups()) == 1 and stub_fsx.created[1]["SecurityGroupIds"] == [
        group["GroupId"]
    ]
    assert stub_fsx.created[1]["KmsKeyId"] == key_arn


@SLOW
def test_another_clusters_file_system_is_not_reused(stub_fsx, cli):
    env = eksctl_like_cluster()
    stub_fsx.add_response(
        "describe_file_systems", {"FileSystems": [described("AVAILABLE", name="other")]}, {}
    )
    stub_fsx.add_response("create_file_system", {"FileSystem": described("AVAILABLE")})
    made = cli("cluster", "create", *EKSCTL)
    assert made.exit_code == 0, made.stderr
    assert len(stub_fsx.created) == 1 and stub_fsx.created[0]["SubnetIds"] == [env.private_b]


def test_the_wait_is_bounded_and_a_failed_file_system_says_why(aws_env):
    """Against the real model's answers: a file system stuck CREATING ends the wait at its limit
    (polls counted), a FAILED one ends it at once with FSx's FailureDetails."""
    aws = Aws(REGION)
    stub = Stubber(aws.client("fsx"))
    stub.activate()
    for _ in range(2):
        stub.add_response(
            "describe_file_systems",
            {"FileSystems": [described("CREATING")]},
            {"FileSystemIds": [FS_ID]},
        )
    sleeps: list[float] = []
    said: list[str] = []
    waiting = cluster.Waiting(limit_s=60, poll_s=30, sleep=sleeps.append)
    with pytest.raises(FsdpctlError, match="still CREATING after 1 min") as stuck:
        cluster.wait_available(aws, described("CREATING"), said.append, waiting)
    assert (
        sleeps == [30, 30]
        and len(said) == 2
        and "cluster create` again" in (stuck.value.hint or "")
    )
    why = {"Message": "The subnet has no free IP addresses"}
    with pytest.raises(FsdpctlError, match="is FAILED: The subnet has no free IP addresses"):
        cluster.wait_available(aws, described("FAILED", FailureDetails=why), said.append, waiting)
    stub.assert_no_pending_responses()


@SLOW
def test_fsx_create_off_or_terraform_leaves_fsx_to_others(stub_fsx, cli):
    """FSX_CREATE=false: an existing eksctl cluster is left alone, no FSx call; terraform makes its
    own."""
    eksctl_like_cluster()
    off = cli("--set", "FSX_CREATE=false", "cluster", "create", *EKSCTL)
    assert off.exit_code == 0 and "nothing to do" in off.stderr and stub_fsx.created == []
    dry = cli("cluster", "create", "--tool", "terraform", "--dry-run")
    assert dry.exit_code == 0 and "# aws" not in dry.stdout
    assert lustre_groups() == []


def printed_requests(stdout: str) -> list[tuple[str, str, dict]]:
    found = []
    for line in stdout.splitlines():
        if line.startswith("# aws "):
            service, op, body = line[len("# aws ") :].split(" ", 2)
            found.append((service, op, json.loads(body)))
    return found


@SLOW
def test_dry_run_prints_the_requests_and_creates_nothing(aws_env, cli):
    """Before the cluster exists the requests name what eksctl will choose; once it exists they
    carry its real subnet and groups. Each validates against the real service model; nothing is made
    either time."""
    from botocore.validate import ParamValidator

    before = cli("cluster", "create", *EKSCTL, "--dry-run")
    assert before.exit_code == 0, before.stderr
    calls = printed_requests(before.stdout)
    assert [f"{s} {op}" for s, op, _ in calls] == [
        "ec2 CreateSecurityGroup",
        "ec2 AuthorizeSecurityGroupIngress",
        "kms CreateKey",
        "kms EnableKeyRotation",
        "kms CreateAlias",
        "fsx CreateFileSystem",
    ]
    assert calls[-1][2]["SubnetIds"] == ["<a private subnet of node group gpu-p5>"]
    env = eksctl_like_cluster()
    after = cli("cluster", "create", *EKSCTL, "--dry-run")
    assert after.exit_code == 0, after.stderr
    calls = printed_requests(after.stdout)
    assert calls[-1][2]["SubnetIds"] == [env.private_b] and calls[0][2]["VpcId"] == env.vpc
    pairs = calls[1][2]["IpPermissions"][0]["UserIdGroupPairs"]
    assert [p["GroupId"] for p in pairs][1:] == env.groups
    session = boto3.session.Session(region_name=REGION)
    for service, op, request in calls:
        model = session.client(service).meta.service_model.operation_model(op)
        assert not ParamValidator().validate(request, model.input_shape).has_errors(), op
    assert lustre_groups() == [] and key_state() is None
    assert boto3.client("fsx", region_name=REGION).describe_file_systems()["FileSystems"] == []
    assert "nothing created" in after.stderr

    eks = boto3.client("eks", region_name=REGION)
    eks.create_cluster(
        name="bare", roleArn="arn:aws:iam::123456789012:role/eks", resourcesVpcConfig={}
    )
    bare = ("--set", "CLUSTER_NAME=bare", "cluster", "create", *EKSCTL)
    dry = cli(*bare, "--dry-run")
    assert dry.exit_code == 0 and "no node group gpu-p5 in cluster bare" in dry.stderr
    assert "<a private subnet of node group gpu-p5>" in dry.stdout
    real = cli(*bare)  # no GPU node group: one line, exit 1, nothing made
    assert real.exit_code == 1 and "no node group gpu-p5 in cluster bare" in real.stderr
    assert (
        "Traceback" not in real.stderr and lustre_groups("bare") == [] and key_state("bare") is None
    )


# ---- cluster delete ----------------------------------------------------------------------------------------


def moto_file_system(
    env: SimpleNamespace | None = None, name: str = NAME
) -> tuple[str, str | None]:
    """A file system and its security group in moto's FSx/EC2, tagged as `cluster create` tags them."""
    ec2 = boto3.client("ec2", region_name=REGION)
    group = None
    if env is not None:
        p = fsx.Plan(name, env.vpc, "us-east-1b", env.private_b, tuple(env.groups), 1200)
        group = ec2.create_security_group(**p.security_group_request())["GroupId"]
        ec2.authorize_security_group_ingress(**p.ingress_request(group))
    fs = boto3.client("fsx", region_name=REGION).create_file_system(
        FileSystemType="LUSTRE",
        StorageCapacity=2400,
        SubnetIds=[env.private_b if env else "subnet-0123456789abcdef0"],
        Tags=fsx.tags(name),
        LustreConfiguration={"DeploymentType": "PERSISTENT_2", "PerUnitStorageThroughput": 250},
    )["FileSystem"]
    return fs["FileSystemId"], group


def fsx_ids() -> list[str]:
    return [
        f["FileSystemId"]
        for f in boto3.client("fsx", region_name=REGION).describe_file_systems()["FileSystems"]
    ]


@SLOW
def test_delete_asks_about_the_file_system_and_never_takes_piped_input(aws_env, cli, monkeypatch):
    """moto's FSx holds the cluster's file system (and another cluster's). Without a terminal and without
    --yes the delete refuses (exit 2) naming the id, the size and what is lost, even with "y" piped in;
    at a terminal the file system's own question is asked first and "n" stops everything; the dry run says
    what it would delete. Nothing is deleted by any of these."""
    from fsdpctl.cli import cluster_cmd

    env = eksctl_like_cluster()
    fs_id, group = moto_file_system(env)
    other, _ = moto_file_system(name="other")
    for piped in (None, "y\ny\n"):
        refused = cli("cluster", "delete", *EKSCTL, input=piped)
        assert refused.exit_code == 2, refused.stderr
        assert (
            f"FSx for Lustre {fs_id} (2400 GiB)" in refused.stderr
            and "checkpoints" in refused.stderr
        )
        assert "--yes" in refused.stderr and other not in refused.stderr
    monkeypatch.setattr(cluster_cmd, "_interactive", lambda: True)
    asked = cli("cluster", "delete", *EKSCTL, input="n\n")
    assert (
        asked.exit_code == 2
        and f"Delete FSx for Lustre {fs_id} and all data on it?" in asked.stderr
    )
    assert "Delete cluster" not in asked.stderr
    dry = cli("cluster", "delete", *EKSCTL, "--dry-run")
    assert dry.exit_code == 0, dry.stderr
    assert (
        f"would delete FSx for Lustre {fs_id}" in dry.stderr
        and f"security group {group}" in dry.stderr
    )
    assert sorted(fsx_ids()) == sorted([fs_id, other]) and len(lustre_groups()) == 1


@SLOW
def test_delete_removes_the_file_system_before_the_cluster(aws_env, cli, monkeypatch):
    """With --yes: the file system (another cluster's stays), then its security group, then the KMS
    key (scheduled, 7 days) go before eksctl runs: eksctl is absent here, so the delete stops there
    (exit 1) with the FSx part done. Without an EKS cluster a leftover file system is still found
    and deleted."""
    import shutil

    env = eksctl_like_cluster()
    fs_id, group = moto_file_system(env)
    other, _ = moto_file_system(name="other")
    kms = boto3.client("kms", region_name=REGION)
    key = kms.create_key(Description="k")["KeyMetadata"]["KeyId"]
    kms.create_alias(AliasName=fsx.key_alias(NAME), TargetKeyId=key)
    result = cli("cluster", "delete", *EKSCTL, "--yes")
    if shutil.which("eksctl") is None:
        assert result.exit_code == 1 and "eksctl is not installed" in result.stderr
    assert (
        f"deleting FSx for Lustre {fs_id}" in result.stderr
        and f"deleted security group {group}" in result.stderr
    )
    assert fsx_ids() == [other] and lustre_groups() == []
    assert kms.describe_key(KeyId=key)["KeyMetadata"]["KeyState"] == "PendingDeletion"
    order = [
        result.stderr.index(s)
        for s in ("deleting FSx", "deleted security group", "scheduled for deletion")
    ]
    assert order == sorted(order)

    boto3.client("eks", region_name=REGION).delete_nodegroup(
        clusterName=NAME, nodegroupName="gpu-p5"
    )
    boto3.client("eks", region_name=REGION).delete_cluster(name=NAME)
    left, _ = moto_file_system()
    leftover = cli("cluster", "delete", *EKSCTL, "--yes")
    assert leftover.exit_code == 0, leftover.stderr
    assert fsx_ids() == [other] and f"deleting FSx for Lustre {left}" in leftover.stderr


def test_deletion_waits_until_fsx_lets_go_of_the_subnets(aws_env, monkeypatch):
    """Real FSx keeps a file system DELETING for minutes (its interfaces stay in eksctl's subnets)
    and then answers FileSystemNotFound (the real model's error): the delete waits through both,
    boundedly."""
    aws = Aws(REGION)
    stub = Stubber(aws.client("fsx"))
    stub.activate()
    stub.add_response(
        "delete_file_system",
        {"FileSystemId": FS_ID, "Lifecycle": "DELETING"},
        {"FileSystemId": FS_ID},
    )
    stub.add_response(
        "describe_file_systems",
        {"FileSystems": [described("DELETING")]},
        {"FileSystemIds": [FS_ID]},
    )
    stub.add_client_error(
        "describe_file_systems", "FileSystemNotFound", "File system 'fs' does not exist.", 400
    )
    sleeps: list[float] = []
    monkeypatch.setattr(cluster, "connect", lambda cfg: aws)
    waiting = cluster.Waiting(60, 30, sleeps.append)
    cluster.delete_fsx(load(environ={}), [{"FileSystemId": FS_ID}], lambda s: None, waiting)
    assert sleeps == [30]
    stub.assert_no_pending_responses()


TF_STATE = {
    "version": 4,
    "terraform_version": "1.9.0",
    "serial": 9,
    "lineage": "00000000-0000-0000-0000-000000000000",
    "outputs": {},
    "resources": [
        {
            "module": "module.eks_gpu",
            "mode": "managed",
            "type": "aws_fsx_lustre_file_system",
            "name": "shared",
            "provider": 'provider["registry.terraform.io/hashicorp/aws"]',
            "instances": [{"index_key": 0, "attributes": {"id": FS_ID, "storage_capacity": 4800}}],
        },
        {
            "module": "module.eks_gpu",
            "mode": "managed",
            "type": "aws_vpc",
            "name": "this",
            "provider": 'provider["registry.terraform.io/hashicorp/aws"]',
            "instances": [{"attributes": {"id": "vpc-1"}}],
        },
    ],
}


def test_terraform_delete_asks_about_the_file_system_in_its_state(aws_env, cli, monkeypatch):
    """terraform's state (format 4, as `terraform show -json` documents it) holds the file system:
    its id and size come from there (offline); destroy deletes it, so the question is all fsdpctl
    adds."""
    from fsdpctl.cli import cluster_cmd

    state_dir = cli.home / "clusters/fsdp-eks/terraform"
    assert cli("cluster", "create", "--tool", "terraform", "--dry-run").exit_code == 0
    (state_dir / "terraform.tfstate").write_text(json.dumps(TF_STATE))
    refused = cli("cluster", "delete", "--tool", "terraform")
    assert refused.exit_code == 2 and f"FSx for Lustre {FS_ID} (4800 GiB)" in refused.stderr
    monkeypatch.setattr(cluster_cmd, "_interactive", lambda: True)
    kept = cli("cluster", "delete", "--tool", "terraform", input="n\n")
    assert kept.exit_code == 2 and "FSx deletion not confirmed" in kept.stderr
    dry = cli("cluster", "delete", "--tool", "terraform", "--dry-run")
    assert dry.exit_code == 0 and f"would delete FSx for Lustre {FS_ID}" in dry.stderr
    assert "destroy" in dry.stdout


# ---- AWS errors --------------------------------------------------------------------------------------------


@SLOW
def test_access_denied_and_no_credentials_are_one_line_with_a_hint(stub_fsx, cli, monkeypatch):
    """FSx's AccessDeniedException (real model error shape) and boto3 without credentials end the
    command with exit 1, an error line and a hint: no traceback."""
    eksctl_like_cluster()
    denied = "User: arn:aws:iam::123456789012:user/x is not authorized to perform: fsx:DescribeFileSystems"
    for command in (("create", *EKSCTL), ("delete", *EKSCTL, "--yes")):
        stub_fsx.add_client_error("describe_file_systems", "AccessDeniedException", denied, 400)
        result = cli("cluster", *command)
        assert result.exit_code == 1, result.stderr
        assert (
            f"AccessDeniedException: {denied}" in result.stderr
            and "hint: check credentials" in result.stderr
        )
        assert "Traceback" not in result.stderr + result.stdout
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    for command in (("create", *EKSCTL), ("delete", *EKSCTL, "--yes")):
        result = cli("cluster", *command)
        assert result.exit_code == 1 and "NoCredentialsError" in result.stderr, result.stderr
        assert "hint:" in result.stderr and "Traceback" not in result.stderr

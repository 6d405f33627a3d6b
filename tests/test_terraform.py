"""terraform/ against the real terraform binary where it is installed (fmt, validate, and a real
`plan` through the AWS provider against moto in server mode), and parsed with python-hcl2
everywhere. moto cannot create placement groups (HTTP 500, the provider retries forever), so the
test plans rather than applies."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import hcl2
import pytest
import yaml

from conftest import ROOT
from fsdpctl.job import render
from fsdpctl.plan.instances import INSTANCE_TYPES
from fsdpctl.settings import load

TF = ROOT / "terraform"
PLUGINS = Path(os.environ.get("FSDPCTL_TF_PLUGIN_DIR", "/opt/tf-plugins"))
HAVE_TERRAFORM = shutil.which("terraform") is not None
HAVE_PROVIDER = PLUGINS.joinpath("registry.terraform.io/hashicorp/aws").is_dir()


def _variables(path: Path) -> dict[str, dict]:
    blocks = hcl2.load(path.open())["variable"]
    return {name.strip('"'): body for block in blocks for name, body in block.items()}


def test_every_root_variable_has_a_description_and_a_default():
    variables = _variables(TF / "variables.tf")
    assert {
        "region",
        "availability_zones",
        "instance_type",
        "node_count",
        "capacity_reservation_id",
        "efa_enabled",
        "efa_interfaces",
    } <= set(variables)
    for name, body in variables.items():
        assert body.get("description") and "default" in body, name
    assert all(
        b.get("description") for b in _variables(TF / "modules/eks-gpu/variables.tf").values()
    )
    # the EFA count is one number fsdpctl writes from plan/instances.py, not a table of terraform's own:
    # no .tf file names an instance type other than the default one
    assert (
        variables["efa_interfaces"]["type"] == "number"
        and variables["efa_interfaces"]["default"] is None
    )
    others = [
        name for name in INSTANCE_TYPES if name != variables["instance_type"]["default"].strip('"')
    ]
    for tf in TF.rglob("*.tf"):
        assert not any(name in tf.read_text() for name in others), tf


@pytest.mark.parametrize("instance", list(INSTANCE_TYPES))
def test_tfvars_carry_the_efa_interfaces_of_instances_py(instance):
    on = render.terraform_vars(load(dotenv={"INSTANCE_TYPE": instance}))
    off = render.terraform_vars(load(dotenv={"INSTANCE_TYPE": instance, "EFA_ENABLED": "false"}))
    assert on["efa_interfaces"] == off["efa_interfaces"] == INSTANCE_TYPES[instance].efa_interfaces
    assert (on["efa_enabled"], off["efa_enabled"]) == (True, False)
    assert set(on) <= set(_variables(TF / "variables.tf"))


@pytest.mark.skipif(not HAVE_TERRAFORM, reason="terraform is not installed here")
def test_terraform_fmt_is_clean():
    p = subprocess.run(
        ["terraform", "fmt", "-check", "-recursive", str(TF)], capture_output=True, text=True
    )
    assert p.returncode == 0, p.stdout + p.stderr


def test_dry_run_writes_tfvars_from_the_settings(cli):
    result = cli(
        "--set",
        "INSTANCE_TYPE=p4de.24xlarge",
        "--set",
        "NODE_COUNT=4",
        "--set",
        "CAPACITY_RESERVATION_ID=cr-0123456789abcdef0",
        "cluster",
        "create",
        "--tool",
        "terraform",
        "--dry-run",
    )
    assert result.exit_code == 0, result.stderr
    work = cli.home / "clusters/fsdp-eks/terraform"
    tfvars = json.loads((work / "fsdpctl.auto.tfvars.json").read_text())
    assert tfvars["instance_type"] == "p4de.24xlarge" and tfvars["node_count"] == 4
    assert tfvars["availability_zones"] == ["us-west-2a", "us-west-2b"]
    assert set(tfvars) <= set(_variables(TF / "variables.tf"))
    assert f"terraform -chdir={work} init -input=false" in result.stdout
    assert f"terraform -chdir={work} apply -input=false -auto-approve" in result.stdout
    assert (work / "modules/eks-gpu/main.tf").is_file()


def _initialized(work):
    """`terraform` in the cluster's work dir (init from the plugin mirror, then validate, both
    asserted)."""
    env = {**os.environ, "TF_IN_AUTOMATION": "1"}

    def tf(*args):
        return subprocess.run(
            ["terraform", f"-chdir={work}", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )

    assert tf("init", "-input=false", "-no-color", f"-plugin-dir={PLUGINS}").returncode == 0
    valid = tf("validate", "-no-color")
    assert valid.returncode == 0 and "The configuration is valid" in valid.stdout
    return tf


@pytest.mark.slow
@pytest.mark.skipif(
    not (HAVE_TERRAFORM and HAVE_PROVIDER), reason="terraform or its cached AWS provider missing"
)
def test_validate_and_plan_against_moto(aws_env, cli):
    result = cli(
        "--set",
        "CAPACITY_RESERVATION_ID=cr-0123456789abcdef0",
        "cluster",
        "create",
        "--tool",
        "terraform",
        "--dry-run",
    )
    assert result.exit_code == 0
    tf = _initialized(cli.home / "clusters/fsdp-eks/terraform")
    plan = tf("plan", "-input=false", "-no-color")
    assert plan.returncode == 0, plan.stderr[-2000:]
    # FSx: file system, its key, SG; no placement group with a reservation (below)
    assert "Plan: 30 to add, 0 to change, 0 to destroy." in plan.stdout
    assert 'capacity_reservation_id = "cr-0123456789abcdef0"' in plan.stdout
    _assert_no_new_placement_group(plan.stdout)
    free = tf("plan", "-input=false", "-no-color", "-var", "capacity_reservation_id=")
    assert free.returncode == 0, free.stderr[-2000:]
    assert "module.eks_gpu.aws_placement_group.gpu[0] will be created" in free.stdout
    assert re.search(r'strategy\s+= "cluster"', free.stdout) and "Plan: 31 to add" in free.stdout
    assert plan.stdout.count('interface_type        = "efa"') == 32  # every EFA interface of a p5
    _assert_fsx_planned(plan.stdout)
    _assert_raid0_user_data(plan.stdout)
    _assert_system_disk(plan.stdout)


def _assert_system_disk(plan: str) -> None:
    """Issue 36, S4, as the AWS provider plans it: the system node group's disk_size is eksctl's
    80 GiB, not left to EKS's 20."""
    group = plan[plan.index("module.eks_gpu.aws_eks_node_group.system will be created") :]
    group = group[: group.index("\n    }\n")]
    assert re.search(r"\+ disk_size\s+= 80\n", group), group


def _assert_no_new_placement_group(plan: str) -> None:
    """Issue 27, defect 8. With a capacity reservation or Capacity Block targeted, no placement
    group is made and the launch template names none: the reservation's instances are placed already
    (eksctl v0.230.0 pkg/cfn/builder/managed_launch_template.go, makeLaunchTemplateData, makes its
    NodeGroupPlacementGroup only when `mng.Placement == nil && mng.CapacityReservation == nil`)."""
    assert "aws_placement_group" not in plan
    template = plan[plan.index("module.eks_gpu.aws_launch_template.gpu will be created") :]
    assert "+ placement {" not in template[: template.index("\n    }\n")]


def _assert_raid0_user_data(plan: str) -> None:
    """Local NVMe (REFERENCE.md, last section): the GPU launch template's user data, as the plan
    shows it (base64), is a MIME multi-part whose application/node.eks.aws part is an AL2023 nodeadm
    NodeConfig (node.eks.aws/v1alpha1) asking for the instance store as RAID0
    (spec.instance.localStorage.strategy)."""
    import base64
    import email

    template = plan[plan.index("module.eks_gpu.aws_launch_template.gpu will be created") :]
    [encoded] = re.findall(
        r'\+ user_data\s+= "([A-Za-z0-9+/=]+)"', template[: template.index("\n    }\n")]
    )
    message = email.message_from_string(base64.b64decode(encoded).decode())
    assert message.is_multipart()
    [part] = [p for p in message.walk() if p.get_content_type() == "application/node.eks.aws"]
    node_config = yaml.safe_load(part.get_payload())
    assert (node_config["apiVersion"], node_config["kind"]) == (
        "node.eks.aws/v1alpha1",
        "NodeConfig",
    )
    assert node_config["spec"] == {"instance": {"localStorage": {"strategy": "RAID0"}}}


def _assert_fsx_planned(plan: str) -> None:
    """The shared FSx for Lustre file system (FSX_CREATE, default on) in the GPU node group's
    subnet, behind a security group open on Lustre's ports, TCP 988 and 1018-1023, to the nodes
    (REFERENCE.md, FSx for Lustre; aws-fsx-csi-driver: the file system must be in the nodes' AZ and
    subnet)."""
    fsx = plan[plan.index("module.eks_gpu.aws_fsx_lustre_file_system.shared[0] will be created") :]
    fsx = fsx[: fsx.index("\n    }\n")]
    assert re.search(r"storage_capacity\s+= 1200\n", fsx) and re.search(
        r'deployment_type\s+= "PERSISTENT_2"', fsx
    )
    sg = plan[plan.index("module.eks_gpu.aws_security_group.lustre[0] will be created") :]
    sg = sg[: sg.index("\n    }\n")]
    ingress = sg[sg.index("+ ingress") : sg.index("+ name ")]
    ports = [
        (re.search(r"from_port\s+= (\d+)", b)[1], re.search(r"to_port\s+= (\d+)", b)[1])  # type: ignore[index]
        for b in ingress.split("+ {")[1:]
        if re.search(r'protocol\s+= "tcp"', b)
    ]
    assert sorted(ports) == [("1018", "1023"), ("988", "988")], sg


# A mock AWS provider for `terraform test`: plan-time values only, so a plan runs without any
# endpoint.
MOCK_AWS = """
mock_provider "aws" {
  mock_data "aws_iam_policy_document" {
    defaults = { json = "{}" }
  }
  mock_data "aws_caller_identity" {
    defaults = { account_id = "123456789012", arn = "arn:aws:iam::123456789012:root" }
  }
  mock_resource "aws_iam_role" {
    defaults = { arn = "arn:aws:iam::123456789012:role/mock" }
  }
  mock_resource "aws_kms_key" {
    defaults = { arn = "arn:aws:kms:us-west-2:123456789012:key/mock" }
  }
}

run "efa_interfaces_unset" {
  command         = plan
  expect_failures = [var.efa_interfaces]
}
"""
EFA_RUN = """
run "{name}" {{
  command = plan
  variables {{
{variables}
  }}
  assert {{
    condition     = output.gpu_efa_interfaces == {expected}
    error_message = "{name}: ${{output.gpu_efa_interfaces}} EFA interfaces, the pods request {expected}"
  }}
}}
"""


@pytest.mark.slow
@pytest.mark.skipif(
    not (HAVE_TERRAFORM and HAVE_PROVIDER), reason="terraform or its cached AWS provider missing"
)
def test_nodes_get_the_efa_interfaces_the_pods_request(tmp_path):
    """For every instance type, EFA on and off: the launch template terraform plans from fsdpctl's
    tfvars lists as many EFA interfaces as the rendered pod requests, both from plan/instances.py
    (`terraform test` with a mock AWS provider)."""
    work = tmp_path / "terraform"
    shutil.copytree(TF, work)
    text = MOCK_AWS
    for instance, efa in [(i, e) for i in INSTANCE_TYPES for e in ("true", "false")]:
        cfg = load(dotenv={"BACKEND": "eks", "INSTANCE_TYPE": instance, "EFA_ENABLED": efa})
        pod = render.render_job(cfg, "r")[-1]["spec"]["pytorchReplicaSpecs"]["Worker"]["template"][
            "spec"
        ]
        requested = pod["containers"][0]["resources"]["limits"].get("vpc.amazonaws.com/efa", 0)
        assert requested == (INSTANCE_TYPES[instance].efa_interfaces if efa == "true" else 0)
        variables = "\n".join(
            f"    {k} = {json.dumps(v)}" for k, v in render.terraform_vars(cfg).items()
        )
        name = f"{instance.replace('.', '_')}_efa_{efa}"
        text += EFA_RUN.format(name=name, variables=variables, expected=requested)
    (work / "tests").mkdir()
    (work / "tests/efa.tftest.hcl").write_text(text)
    env = {**os.environ, "TF_IN_AUTOMATION": "1"}
    init = [
        "terraform",
        f"-chdir={work}",
        "init",
        "-input=false",
        "-no-color",
        f"-plugin-dir={PLUGINS}",
    ]
    assert subprocess.run(init, env=env, capture_output=True, timeout=300).returncode == 0
    test = subprocess.run(
        ["terraform", f"-chdir={work}", "test", "-no-color"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    runs = 1 + 2 * len(INSTANCE_TYPES)
    assert test.returncode == 0 and f"Success! {runs} passed, 0 failed." in test.stdout, (
        test.stdout[-3000:]
    )


def test_the_workdir_keeps_its_state_and_init_uses_the_plugin_mirror(tmp_path, monkeypatch):
    from fsdpctl.adapters import terraform

    module = tmp_path / "module"
    (module / ".terraform").mkdir(parents=True)
    (module / "main.tf").write_text("# module\n")
    (module / ".terraform" / "cache").write_text("a provider download\n")
    work = tmp_path / "work"
    path, text = terraform.prepare(module, work, {"node_count": 2})
    assert path == work / "fsdpctl.auto.tfvars.json" and json.loads(path.read_text()) == {
        "node_count": 2
    }
    assert (
        text == path.read_text()
        and (work / "main.tf").is_file()
        and not (work / ".terraform").exists()
    )
    (work / "terraform.tfstate").write_text("{state}")
    terraform.prepare(module, work, {"node_count": 4})
    assert (
        work / "terraform.tfstate"
    ).read_text() == "{state}"  # a rerun converges, it does not start over
    assert json.loads(path.read_text()) == {"node_count": 4}

    monkeypatch.delenv("FSDPCTL_TF_PLUGIN_DIR", raising=False)
    init, destroy = terraform.commands("destroy", work, {"AWS_REGION": "eu-west-1"})
    assert init.argv == ["terraform", f"-chdir={work}", "init", "-input=false"]
    assert (
        destroy.shell_line()
        == f"AWS_REGION=eu-west-1 terraform -chdir={work} destroy -input=false -auto-approve"
    )
    monkeypatch.setenv("FSDPCTL_TF_PLUGIN_DIR", "/opt/tf-plugins")
    assert terraform.commands("apply", work, {})[0].argv[-1] == "-plugin-dir=/opt/tf-plugins"
    with pytest.raises(ValueError):
        terraform.commands("plan", work, {})


@pytest.mark.slow
@pytest.mark.skipif(
    not (HAVE_TERRAFORM and HAVE_PROVIDER), reason="terraform or its cached AWS provider missing"
)
def test_plan_launches_a_capacity_block_with_its_market_type(aws_env, cli):
    """A real `plan` (hashicorp/aws 5.100.0 against moto) of a p5 Capacity Block: the launch
    template carries instance_market_options.market_type capacity-block and the reservation target,
    the node group's capacity_type is CAPACITY_BLOCK (the provider's schema for aws_launch_template
    and aws_eks_node_group; the EKS user guide, "Capacity Blocks for ML" with managed node groups),
    in the block's AZ."""
    block = [
        "--set",
        "CAPACITY_RESERVATION_ID=cr-0123456789abcdef0",
        "--set",
        "CAPACITY_RESERVATION_TYPE=capacity-block",
        "--set",
        "AVAILABILITY_ZONES=us-east-1d,us-east-1a",
    ]
    assert cli(*block, "cluster", "create", "--tool", "terraform", "--dry-run").exit_code == 0
    work = cli.home / "clusters/fsdp-eks/terraform"
    env = {**os.environ, "TF_IN_AUTOMATION": "1"}

    def tf(*args):
        return subprocess.run(
            ["terraform", f"-chdir={work}", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )

    assert tf("init", "-input=false", "-no-color", f"-plugin-dir={PLUGINS}").returncode == 0
    plan = tf("plan", "-input=false", "-no-color")
    assert plan.returncode == 0, plan.stderr[-2000:]
    assert 'market_type = "capacity-block"' in plan.stdout
    assert 'capacity_type          = "CAPACITY_BLOCK"' in plan.stdout
    _assert_no_new_placement_group(plan.stdout)
    # eksctl v0.230.0 pkg/cfn/builder/managed_nodegroup.go: with market type capacity-block the
    # instance type goes in the launch template (`launchTemplateData.InstanceType =
    # instanceTypes[0]`), not the node group
    template = plan.stdout[
        plan.stdout.index("module.eks_gpu.aws_launch_template.gpu will be created") :
    ]
    assert re.search(r'\+ instance_type\s+= "p5.48xlarge"', template[: template.index("\n    }\n")])
    group = plan.stdout[
        plan.stdout.index("module.eks_gpu.aws_eks_node_group.gpu will be created") :
    ]
    assert (
        "p5.48xlarge" not in group[: group.index("\n    }\n")]
    )  # instance_types: (known after apply)
    assert 'capacity_reservation_id = "cr-0123456789abcdef0"' in plan.stdout
    assert 'availability_zone                              = "us-east-1d"' in plan.stdout
    bad = tf("plan", "-input=false", "-no-color", "-var", "capacity_reservation_type=spot")
    assert (
        bad.returncode == 1 and "capacity_reservation_type: default or capacity-block" in bad.stderr
    )


def _resource(doc: dict, kind: str, name: str) -> dict:
    """hcl2 keeps the quotes of block labels: '"aws_eks_node_group"'."""
    [body] = [
        b[f'"{kind}"'][f'"{name}"']
        for b in doc["resource"]
        if f'"{name}"' in b.get(f'"{kind}"', {})
    ]
    return body


def test_both_tools_give_the_system_nodes_eksctls_80_gib_root_volume():
    """Issue 36, S4. A managed node group made without a launch template gets EKS's default root
    volume, 20 GiB on Linux (CreateNodegroup diskSize, the EKS API reference and botocore's
    eks/2017-11-01 service model), which terraform's system nodes had: too small for the trainer's
    ~20 GB image, which the pre-step and htop pulled there. eksctl's default for a managed node
    group is 80 GiB (v0.230.0 pkg/apis/eksctl.io/v1alpha5/types.go DefaultNodeVolumeSize, its
    schema's volumeSize default, read here from the vendored schema). Both tools now give the
    system group that size, terraform through the node group's disk_size (a field EKS refuses
    beside a launch template: the system group has none), eksctl written out; the ClusterConfig
    still passes eksctl's schema."""
    import jsonschema

    from conftest import SHARED

    schema = json.loads(
        (SHARED / "vendor/eksctl-v0.230.0/clusterconfig-v1alpha5.schema.json").read_text()
    )
    eksctl_default = schema["definitions"]["ManagedNodeGroup"]["properties"]["volumeSize"][
        "default"
    ]
    assert eksctl_default == render.SYSTEM_VOLUME_GIB == 80
    module = hcl2.load((TF / "modules/eks-gpu/main.tf").open())
    system = _resource(module, "aws_eks_node_group", "system")
    assert system["disk_size"] == "${var.system_volume_size}" and "launch_template" not in system
    root = _variables(TF / "variables.tf")["system_volume_size"]
    assert root["default"] == eksctl_default and root["type"] == "number"
    cfg = load(dotenv={"INSTANCE_TYPE": "p5.48xlarge"})
    assert render.terraform_vars(cfg)["system_volume_size"] == eksctl_default
    cc = render.render_clusterconfig(cfg)
    assert list(jsonschema.Draft7Validator(schema).iter_errors(cc)) == []
    [group] = [g for g in cc["managedNodeGroups"] if g["name"] == "system"]
    assert group["volumeSize"] == eksctl_default


def test_the_file_system_sits_in_the_gpu_node_groups_subnet():
    """Read from the module (a plan only knows the subnet after apply): the FSx for Lustre file
    system's only subnet is the GPU node group's, so it is in the nodes' AZ (aws-fsx-csi-driver: the
    file system must be in the nodes' AZ and subnet), and its security group admits the GPU nodes'
    security groups."""
    module = hcl2.load((TF / "modules/eks-gpu/main.tf").open())
    fsx = hcl2.load((TF / "modules/eks-gpu/fsx.tf").open())

    def resource(doc: dict, kind: str, name: str) -> dict:
        """hcl2 keeps the quotes of block labels: '"aws_eks_node_group"'."""
        [body] = [
            b[f'"{kind}"'][f'"{name}"']
            for b in doc["resource"]
            if f'"{name}"' in b.get(f'"{kind}"', {})
        ]
        return body

    gpu = resource(module, "aws_eks_node_group", "gpu")
    fs = resource(fsx, "aws_fsx_lustre_file_system", "shared")
    assert fs["subnet_ids"] == gpu["subnet_ids"] == ["${local.private_subnet_ids[0]}"]
    template = resource(module, "aws_launch_template", "gpu")
    [interfaces] = [
        d['"network_interfaces"'] for d in template["dynamic"] if '"network_interfaces"' in d
    ]
    node_groups = interfaces["content"][0]["security_groups"]
    lustre = resource(fsx, "aws_security_group", "lustre")
    rules = lustre["dynamic"][0]['"ingress"']["content"][0]
    assert rules["security_groups"] == node_groups and rules["self"] is True


@pytest.mark.slow
@pytest.mark.skipif(
    not (HAVE_TERRAFORM and HAVE_PROVIDER), reason="terraform or its cached AWS provider missing"
)
def test_plan_in_an_existing_vpc_makes_no_network_and_uses_its_subnets(aws_env, cli):
    """VPC_ID and PRIVATE_SUBNET_IDS of a VPC made in moto (its subnets' AZs read by `cluster
    create` from DescribeSubnets): a real `plan` makes no VPC, subnet, gateway, route table or
    default-group rules (15 fewer resources than with a VPC of its own), puts the cluster, both node
    groups and the FSx file system in the given subnets (the GPU nodes and FSx in the first) and
    opens Lustre's egress to the VPC's own CIDR, read by the aws_vpc data source. A single subnet
    fails the module's precondition."""
    import boto3

    ec2 = boto3.client("ec2", region_name="us-east-1")
    vpc = ec2.create_vpc(CidrBlock="10.9.0.0/16")["Vpc"]["VpcId"]
    subnets = [
        ec2.create_subnet(VpcId=vpc, CidrBlock=f"10.9.{i}.0/24", AvailabilityZone=z)["Subnet"][
            "SubnetId"
        ]
        for i, z in enumerate(["us-east-1b", "us-east-1a"])
    ]
    keys = ["--set", f"VPC_ID={vpc}", "--set", f"PRIVATE_SUBNET_IDS={','.join(subnets)}"]
    assert cli(*keys, "cluster", "create", "--tool", "terraform", "--dry-run").exit_code == 0
    tf = _initialized(cli.home / "clusters/fsdp-eks/terraform")
    plan = tf("plan", "-input=false", "-no-color")
    assert plan.returncode == 0, plan.stderr[-2000:]
    assert "Plan: 16 to add, 0 to change, 0 to destroy." in plan.stdout
    for made in (
        "aws_vpc.",
        "aws_subnet.",
        "aws_nat_gateway.",
        "aws_route_table",
        "aws_default_security",
    ):
        assert f"module.eks_gpu.{made}" not in plan.stdout, made
    lists = [
        sorted(re.findall(r'"(subnet-\w+)"', b))
        for b in re.findall(r"subnet_ids\s+= \[(.*?)\]", plan.stdout, re.S)
    ]
    # the cluster and the system nodes in both; the GPU nodes and FSx in the first
    assert sorted(lists) == sorted(
        [[subnets[0]], [subnets[0]], sorted(subnets), sorted(subnets)]
    ), lists
    sg = plan.stdout[
        plan.stdout.index("module.eks_gpu.aws_security_group.lustre[0] will be created") :
    ]
    assert '"10.9.0.0/16"' in sg[: sg.index("\n    }\n")]
    one = tf("plan", "-input=false", "-no-color", "-var", f'private_subnet_ids=["{subnets[0]}"]')
    assert one.returncode == 1 and "two or more subnets of vpc_id" in one.stderr

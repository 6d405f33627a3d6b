"""`cluster delete --tool terraform` goes by terraform's state (issue 14, defect 2's cleanup half):
destroy runs whenever the state in FSDPCTL_HOME/clusters/<name>/terraform holds resources, also
without an EKS cluster; the dry run says so; no state and no cluster is nothing to do. The real
terraform binary destroys a VPC that a real `terraform apply` made in moto, with no EKS cluster
there."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import boto3
import pytest

from test_aws import make_cluster
from test_terraform import HAVE_PROVIDER, HAVE_TERRAFORM, PLUGINS

# The layout of terraform's local state (format version 4, as `terraform show -json` documents and
# terraform 1.x writes): managed resources with their instances, data sources as mode "data".
CRAFTED_STATE = {
    "version": 4,
    "terraform_version": "1.9.0",
    "serial": 3,
    "lineage": "00000000-0000-0000-0000-000000000000",
    "outputs": {},
    "resources": [
        {
            "module": "module.eks_gpu",
            "mode": "managed",
            "type": "aws_vpc",
            "name": "this",
            "provider": 'provider["registry.terraform.io/hashicorp/aws"]',
            "instances": [{"attributes": {"id": "vpc-1"}}],
        },
        {
            "module": "module.eks_gpu",
            "mode": "managed",
            "type": "aws_kms_key",
            "name": "eks",
            "provider": 'provider["registry.terraform.io/hashicorp/aws"]',
            "instances": [{"attributes": {"id": "k-1"}}],
        },
        {
            "mode": "data",
            "type": "aws_caller_identity",
            "name": "current",
            "provider": 'provider["registry.terraform.io/hashicorp/aws"]',
            "instances": [{"attributes": {}}],
        },
        {"mode": "managed", "type": "aws_eip", "name": "gone", "provider": "p", "instances": []},
    ],
}


def test_state_resources_lists_what_destroy_would_delete(tmp_path):
    from fsdpctl.adapters import terraform

    assert terraform.state_resources(tmp_path) == []
    (tmp_path / "terraform.tfstate").write_text("")
    assert terraform.state_resources(tmp_path) == []
    (tmp_path / "terraform.tfstate").write_text(json.dumps(CRAFTED_STATE))
    assert terraform.state_resources(tmp_path) == [
        "module.eks_gpu.aws_vpc.this",
        "module.eks_gpu.aws_kms_key.eks",
    ]


def test_delete_goes_by_the_state_without_a_cluster(aws_env, cli):
    """No state, no cluster: nothing to do (dry run and real). A state with resources and no EKS
    cluster (moto has none): the dry run lists init + destroy and what they delete; the real run
    asks first."""
    state_dir = cli.home / "clusters/fsdp-eks/terraform"
    nothing = cli("cluster", "delete", "--tool", "terraform", "--yes")
    assert (
        nothing.exit_code == 0
        and "no terraform state" in nothing.stderr
        and "nothing to delete" in nothing.stderr
    )
    assert "terraform" not in nothing.stdout
    dry = cli("cluster", "delete", "--tool", "terraform", "--dry-run")
    assert dry.exit_code == 0 and "destroy" not in dry.stdout and "nothing to delete" in dry.stderr

    assert not state_dir.exists()  # nothing to delete: no tool input written either
    state_dir.mkdir(parents=True)
    (state_dir / "terraform.tfstate").write_text(json.dumps(CRAFTED_STATE))
    dry = cli("cluster", "delete", "--tool", "terraform", "--dry-run")
    assert dry.exit_code == 0, dry.stderr
    assert f"terraform -chdir={state_dir} destroy -input=false -auto-approve" in dry.stdout
    assert (
        "2 resources in the terraform state" in dry.stderr
        and "module.eks_gpu.aws_vpc.this" in dry.stderr
    )
    refused = cli("cluster", "delete", "--tool", "terraform", input="n\n")
    assert refused.exit_code == 2 and "2 resources" in refused.stderr


def test_a_cluster_without_terraform_state_is_not_said_to_be_deleted(aws_env, cli):
    make_cluster()
    result = cli("cluster", "delete", "--tool", "terraform", "--yes")
    assert (
        result.exit_code == 1
        and "holds nothing" in result.stderr
        and "--tool eksctl" in result.stderr
    )


TINY = """
resource "aws_vpc" "leftover" {
  cidr_block = "10.99.0.0/16"
  tags       = { Name = "fsdpctl-leftover" }
}
"""


@pytest.mark.slow
@pytest.mark.skipif(
    not (HAVE_TERRAFORM and HAVE_PROVIDER), reason="terraform or its cached AWS provider missing"
)
def test_destroy_runs_with_the_real_terraform_when_the_cluster_is_gone(
    aws_env, cli, tmp_path, monkeypatch
):
    """A real `terraform apply` (hashicorp/aws against moto) leaves a VPC in a state and no EKS
    cluster, as a half-failed create does; that state in the cluster's workdir is destroyed by
    `cluster delete`, and a second delete finds nothing to do."""
    env = {**os.environ, "TF_IN_AUTOMATION": "1"}
    tiny = tmp_path / "tiny"
    tiny.mkdir()
    (tiny / "main.tf").write_text(TINY)
    for args in (["init", f"-plugin-dir={PLUGINS}"], ["apply", "-auto-approve"]):
        p = subprocess.run(
            ["terraform", f"-chdir={tiny}", *args, "-input=false", "-no-color"],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    ec2 = boto3.client("ec2", region_name="us-east-1")
    leftover = {"Name": "tag:Name", "Values": ["fsdpctl-leftover"]}
    assert len(ec2.describe_vpcs(Filters=[leftover])["Vpcs"]) == 1
    assert boto3.client("eks", region_name="us-east-1").list_clusters()["clusters"] == []

    assert cli("cluster", "create", "--tool", "terraform", "--dry-run").exit_code == 0
    state_dir = cli.home / "clusters/fsdp-eks/terraform"
    shutil.copy(tiny / "terraform.tfstate", state_dir / "terraform.tfstate")
    monkeypatch.setenv("FSDPCTL_TF_PLUGIN_DIR", str(PLUGINS))
    monkeypatch.setenv("TF_IN_AUTOMATION", "1")
    deleted = cli("cluster", "delete", "--tool", "terraform", "--yes")
    assert deleted.exit_code == 0, deleted.stderr[-3000:]
    assert ec2.describe_vpcs(Filters=[leftover])["Vpcs"] == []
    again = cli("cluster", "delete", "--tool", "terraform", "--yes")
    assert again.exit_code == 0 and "nothing to delete" in again.stderr

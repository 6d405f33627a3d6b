"""Rendered manifests against the real schemas: the PyTorchJob CRD of Training Operator v1.9.4 (from
../shared/vendor, strict: undeclared fields fail) and the Kubernetes 1.33 OpenAPI (kubernetes-validate)."""

from __future__ import annotations

import itertools
import os

import pytest
import yaml

from conftest import ROOT, SHARED
from fsdpctl import render
from fsdpctl.instances import INSTANCE_TYPES
from fsdpctl.settings import load
from fsdpctl.validate import crd_schemas, validate

CRD = SHARED / "vendor" / "kubeflow-training-operator-v1.9.4" / "kubeflow.org_pytorchjobs.yaml"
GOLDEN = ROOT / "tests" / "golden"
STRATEGIES = ["FULL_SHARD", "SHARD_GRAD_OP", "HYBRID_SHARD", "NO_SHARD"]
RDZV = ["c10d", "etcd", "etcd-v2"]
EKS_COMBOS = list(itertools.product(INSTANCE_TYPES, STRATEGIES, RDZV))
LOCAL_COMBOS = list(itertools.product(STRATEGIES, RDZV))


@pytest.fixture(scope="module")
def schemas():
    return crd_schemas(yaml.safe_load_all(CRD.read_text()))


def eks(instance, strategy, rdzv, **more):
    return load(dotenv={"BACKEND": "eks", "INSTANCE_TYPE": instance, "SHARDING_STRATEGY": strategy,
                        "RDZV_BACKEND": rdzv, "JOB_NODES": "16", "AWS_ACCOUNT_ID": "123456789012",
                        "MODEL": "70b", "CHECKPOINT_PVC": "fsx-claim", **more})


@pytest.mark.parametrize("instance, strategy, rdzv", EKS_COMBOS)
def test_every_eks_combination_validates(schemas, instance, strategy, rdzv):
    objs = render.render_job(eks(instance, strategy, rdzv), "fsdp-run-1")
    assert validate(objs, schemas) == []
    job = objs[-1]
    container = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    facts = INSTANCE_TYPES[instance]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == facts.gpus
    assert container["resources"]["limits"]["vpc.amazonaws.com/efa"] == facts.efa_interfaces
    assert container["securityContext"]["capabilities"]["add"] == ["IPC_LOCK"]
    assert job["spec"]["elasticPolicy"]["rdzvBackend"] == rdzv
    assert job["spec"]["elasticPolicy"]["rdzvId"] == "fsdp-run-1"
    assert {"etcd"} <= {o["metadata"]["name"] for o in objs} if rdzv != "c10d" else len(objs) == 2


@pytest.mark.parametrize("strategy, rdzv", LOCAL_COMBOS)
def test_every_local_combination_validates(schemas, strategy, rdzv):
    cfg = load(dotenv={"SHARDING_STRATEGY": strategy, "RDZV_BACKEND": rdzv})
    assert validate(render.render_job(cfg, "fsdp-run-1"), schemas) == []


def test_schema_validation_is_strict(schemas):
    objs = render.render_job(eks("p5.48xlarge", "FULL_SHARD", "c10d"), "r")
    objs[-1]["spec"]["elasticPolicy"]["rdzvBakend"] = "c10d"
    objs[-1]["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] = "two"
    objs[0]["metadata"]["lables"] = {}
    problems = validate(objs, schemas)
    assert any("'rdzvBakend' was unexpected" in p for p in problems)
    assert any("replicas: 'two' is not of type 'integer'" in p for p in problems)
    assert any(p.startswith("Namespace/fsdp") for p in problems)


def test_output_is_deterministic_and_ids_differ_per_run():
    cfg = eks("p4de.24xlarge", "HYBRID_SHARD", "etcd")
    assert render.to_yaml(render.render_job(cfg, render.stable_run_id(cfg))) == \
        render.to_yaml(render.render_job(cfg, render.stable_run_id(cfg)))
    assert render.new_run_id("fsdp") != render.new_run_id("fsdp")
    assert render.stable_run_id(cfg) != render.stable_run_id(eks("p4de.24xlarge", "FULL_SHARD", "etcd"))


@pytest.mark.parametrize("name, cfg", [
    ("eks-p5-70b-hybrid-etcd", lambda: eks("p5.48xlarge", "HYBRID_SHARD", "etcd", CAPACITY_RESERVATION_ID="")),
    ("local-c10d", lambda: load(dotenv={})),
])
def test_golden_manifests(name, cfg):
    """The whole rendered output, compared after normalising the run id. FSDPCTL_UPDATE_GOLDEN=1 rewrites."""
    text = render.to_yaml(render.render_job(cfg(), "RUN-ID"))
    path = GOLDEN / f"{name}.yaml"
    if os.environ.get("FSDPCTL_UPDATE_GOLDEN"):
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
    assert text == path.read_text()


def test_token_goes_only_into_the_secret(schemas):
    token = "hf_QwErTyUiOpAsDfGhJkLzXcVbNm123456"
    cfg = load(environ={"HF_TOKEN": token})
    assert token not in render.to_yaml(render.render_job(cfg, "r"))
    secret = render.render_secret(cfg, token, "r")
    assert secret["stringData"]["HF_TOKEN"] == token
    assert validate([secret], schemas) == []
    job = render.render_job(cfg, "r")[-1]
    pod = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
    env = pod["containers"][0]["env"]
    # the Secret reaches the pod as a read-only file that huggingface_hub reads through HF_TOKEN_PATH
    assert {"name": "HF_TOKEN_PATH", "value": f"{render.HF_TOKEN_DIR}/HF_TOKEN"} in env
    assert not any(e["name"] == "HF_TOKEN" for e in env)
    assert {"name": "hf-token", "secret": {"secretName": "fsdp-hf-token", "optional": True,
                                           "defaultMode": 0o440}} in pod["volumes"]
    assert {"name": "hf-token", "mountPath": render.HF_TOKEN_DIR, "readOnly": True} in \
        pod["containers"][0]["volumeMounts"]

"""Rendered manifests against the real schemas: the PyTorchJob CRD of Training Operator v1.9.4 (from
../shared/vendor, strict: undeclared fields fail) and the Kubernetes 1.33 OpenAPI
(kubernetes-validate)."""

from __future__ import annotations

import itertools
import os
import random
import re
import string

import pytest

from conftest import ROOT, SHARED, yaml_docs
from fsdpctl import files
from fsdpctl.backends.eks import configmap
from fsdpctl.job import policy as jobpolicy
from fsdpctl.job import record, render
from fsdpctl.job.validate import crd_schemas, validate
from fsdpctl.plan.instances import INSTANCE_TYPES
from fsdpctl.settings import load

CRD = SHARED / "vendor" / "kubeflow-training-operator-v1.9.4" / "kubeflow.org_pytorchjobs.yaml"
TRAINJOB_CRD = SHARED / "vendor" / "kubeflow-trainer-v2.3.0" / "trainer.kubeflow.org_trainjobs.yaml"
GOLDEN = ROOT / "tests" / "golden"
STRATEGIES = ["FULL_SHARD", "SHARD_GRAD_OP", "HYBRID_SHARD", "NO_SHARD"]
RDZV = ["c10d", "etcd", "etcd-v2"]
EKS_COMBOS = list(itertools.product(INSTANCE_TYPES, STRATEGIES, RDZV))
LOCAL_COMBOS = list(itertools.product(STRATEGIES, RDZV))


@pytest.fixture(scope="module")
def schemas():
    return crd_schemas([*yaml_docs(CRD), *yaml_docs(TRAINJOB_CRD)])


def eks(instance, strategy, rdzv, **more):
    return load(
        dotenv={
            "BACKEND": "eks",
            "INSTANCE_TYPE": instance,
            "SHARDING_STRATEGY": strategy,
            "RDZV_BACKEND": rdzv,
            "JOB_NODES": "16",
            "AWS_ACCOUNT_ID": "123456789012",
            "MODEL": "70b",
            "CHECKPOINT_PVC": "fsx-claim",
            **more,
        }
    )


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
    # with the pre-step (volume-prep of the claim) and the PodDisruptionBudget
    assert {"etcd"} <= {o["metadata"]["name"] for o in objs} if rdzv != "c10d" else len(objs) == 4


@pytest.mark.parametrize("strategy, rdzv", LOCAL_COMBOS)
def test_every_local_combination_validates(schemas, strategy, rdzv):
    cfg = load(dotenv={"SHARDING_STRATEGY": strategy, "RDZV_BACKEND": rdzv})
    assert validate(render.render_job(cfg, "fsdp-run-1"), schemas) == []


@pytest.mark.parametrize("instance, strategy", list(itertools.product(INSTANCE_TYPES, STRATEGIES)))
def test_every_trainjob_combination_validates(schemas, instance, strategy):
    """TrainJob (Trainer v2.3.0) against its CRD, strictly: runtimePatches carry the pod details."""
    cfg = eks(
        instance,
        strategy,
        "c10d",
        JOB_KIND="trainjob",
        NODE_SELECTOR="team=ml",
        TOLERATIONS="dedicated=gpu:NoSchedule",
    )
    objs = render.render_job(cfg, "fsdp-run-1")
    assert [o["kind"] for o in objs] == ["Namespace", "Job", "PodDisruptionBudget", "TrainJob"]
    assert validate(objs, schemas) == []
    spec = objs[-1]["spec"]
    assert spec["runtimeRef"]["name"] == "torch-distributed" and spec["trainer"]["numNodes"] == 16
    assert (
        spec["trainer"]["resourcesPerNode"]["limits"]["nvidia.com/gpu"]
        == INSTANCE_TYPES[instance].gpus
    )
    pod = spec["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0][
        "template"
    ]["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"node.kubernetes.io/instance-type": instance, "team": "ml"}
    assert {"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"} in pod[
        "tolerations"
    ]


def test_node_selector_tolerations_and_gang_scheduling(schemas):
    cfg = eks(
        "p5.48xlarge",
        "FULL_SHARD",
        "c10d",
        NODE_SELECTOR="team=ml,pool=a",
        TOLERATIONS="spot,x=y:NoExecute",
        SCHEDULER_NAME="volcano",
        GANG_SCHEDULING="true",
    )
    job = render.render_job(cfg, "r")[-1]
    assert validate([job], schemas) == []
    pod = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
    assert pod["nodeSelector"] == {
        "node.kubernetes.io/instance-type": "p5.48xlarge",
        "team": "ml",
        "pool": "a",
    }
    assert pod["tolerations"][1:] == [
        {"key": "spot", "operator": "Exists"},
        {"key": "x", "operator": "Equal", "value": "y", "effect": "NoExecute"},
    ]
    assert pod["schedulerName"] == "volcano"
    assert job["spec"]["runPolicy"]["schedulingPolicy"] == {"minAvailable": 16}


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
    assert render.to_yaml(render.render_job(cfg, jobpolicy.stable_run_id(cfg))) == render.to_yaml(
        render.render_job(cfg, jobpolicy.stable_run_id(cfg))
    )
    assert jobpolicy.new_run_id("fsdp") != jobpolicy.new_run_id("fsdp")
    assert jobpolicy.stable_run_id(cfg) != jobpolicy.stable_run_id(
        eks("p4de.24xlarge", "FULL_SHARD", "etcd")
    )


@pytest.mark.parametrize(
    "name, cfg",
    [
        (
            "eks-p5-70b-hybrid-etcd",
            lambda: eks("p5.48xlarge", "HYBRID_SHARD", "etcd", CAPACITY_RESERVATION_ID=""),
        ),
        ("local-c10d", lambda: load(dotenv={})),
        (  # no shared volume: traces and HF cache on each node's /local scratch (hostPath)
            "eks-p5-local-scratch",
            lambda: eks(
                "p5.48xlarge", "FULL_SHARD", "c10d", SHARED_VOLUME="", CHECKPOINT_PVC="ckpt-claim"
            ),
        ),
        (
            "eks-p5e-trainjob-efa",
            lambda: eks(
                "p5e.48xlarge", "FULL_SHARD", "c10d", JOB_KIND="trainjob", NODE_SELECTOR="team=ml"
            ),
        ),
        (
            "eks-p4de-no-efa-gang",
            lambda: eks(
                "p4de.24xlarge",
                "NO_SHARD",
                "etcd-v2",
                EFA_ENABLED="false",
                CHECKPOINT_PVC="",
                TOLERATIONS="spot",
                SCHEDULER_NAME="volcano",
                GANG_SCHEDULING="true",
                METRICS_PORT="9300",
            ),
        ),
    ],
)
def test_golden_manifests(name, cfg):
    """The whole rendered output, compared after normalising the run id. FSDPCTL_UPDATE_GOLDEN=1
    rewrites."""
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
    # the Secret reaches the pod as a read-only file that huggingface_hub reads through
    # HF_TOKEN_PATH
    assert {"name": "HF_TOKEN_PATH", "value": f"{render.HF_TOKEN_DIR}/HF_TOKEN"} in env
    assert not any(e["name"] == "HF_TOKEN" for e in env)
    assert {
        "name": "hf-token",
        "secret": {"secretName": "fsdp-hf-token", "optional": True, "defaultMode": 0o440},
    } in pod["volumes"]
    assert {"name": "hf-token", "mountPath": render.HF_TOKEN_DIR, "readOnly": True} in pod[
        "containers"
    ][0]["volumeMounts"]


def test_deploy_components_validate_and_the_dashboard_has_its_panels(schemas):
    """What `fsdpctl deploy etcd|plugins|monitoring` applies and what `cleanup --checkpoints`
    starts, against the Kubernetes OpenAPI; the dashboard queries every metric the issue names, the
    trainer's included."""
    import json

    from fsdpctl.cluster import deploy

    cfg = eks("p5.48xlarge", "FULL_SHARD", "etcd")
    objs = (
        deploy.etcd(cfg).objects
        + deploy.plugins(cfg, [SHARED / "vendor"]).objects
        + deploy.monitoring(cfg).objects
        + [render.render_checkpoint_cleaner(cfg, "fsdp")]
    )
    assert validate(objs, schemas) == []
    [dashboards] = [o for o in objs if o["metadata"]["name"] == "grafana-dashboards"]
    exprs = [
        t["expr"]
        for d in dashboards["data"].values()
        for p in json.loads(d)["panels"]
        for t in p.get("targets", [])
    ]
    assert all(any(m in e for e in exprs) for m in deploy.DASHBOARD_METRICS)
    from fsdptrain.prometheus import PROMETHEUS_GAUGES

    trainer_metrics = {m for m in deploy.DASHBOARD_METRICS if m.startswith("fsdptrain_")}
    assert trainer_metrics <= set(PROMETHEUS_GAUGES)  # the dashboard reads what the trainer serves
    job = render.render_job(cfg, "r")[-1]
    template = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]
    port = template["metadata"]["annotations"]["prometheus.io/port"]
    env = {e["name"]: e.get("value") for e in template["spec"]["containers"][0]["env"]}
    assert env["METRICS_PORT"] == port == "9101"


# apimachinery pkg/util/validation/validation.go: a label value is at most 63 characters of
# (([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?; an object's name a DNS-1123 subdomain
# (IsDNS1123Subdomain)
LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def _run_ids(rng: random.Random):
    """Run ids `job run --run-id` takes (files.RUN_ID), every length, with '-', '_' and '.' at
    character 63 (where a bare [:63] cut them) and anywhere else."""
    inner = string.ascii_letters + string.digits + "-_."
    for length in [1, 2, 62, 63, 64, 65, 100, 127, 128] + [
        rng.randrange(1, 129) for _ in range(30)
    ]:
        body = [rng.choice(inner) for _ in range(length)]
        body[0], body[-1] = rng.choice(string.ascii_letters), rng.choice(string.digits)
        if length > 64:
            body[62] = rng.choice("-_.")
        run_id = "".join(body).replace("..", "a.")
        assert files.RUN_ID.fullmatch(run_id), run_id
        yield run_id


@pytest.mark.parametrize("kind", ["pytorchjob", "trainjob"])
def test_every_label_and_name_from_a_run_id_or_job_name_is_one_the_api_server_takes(kind):
    """Generated run ids and the longest job names JOB_NODES allows: every label value on every
    object the job brings (its objects, the checkpoint cleaner, the run record's ConfigMap) is a
    valid label value and every name a DNS-1123 subdomain, as the API server's ValidateObjectMeta
    checks them; a run id longer than 63 characters is cut to one that still ends in a letter or
    digit."""
    rng = random.Random(23)
    for run_id, job in zip(
        _run_ids(rng), itertools.cycle(["a" * 47 + "-bcdef", "b" * 52 + "1", "fsdp"])
    ):
        cfg = eks("p5.48xlarge", "FULL_SHARD", "c10d", JOB_KIND=kind, JOB_NAME=job)
        rec = record.build(cfg, run_id=run_id, code={}, image=None, created=0.0, secret_name="s")
        objs = [
            *render.render_job(cfg, run_id),
            render.render_checkpoint_cleaner(cfg, job),
            configmap.config_map({**rec, "id": "r1", "hash": "h"}, cfg.job_namespace),
        ]
        for obj in objs:
            meta = obj["metadata"]
            assert DNS_SUBDOMAIN.fullmatch(meta["name"]) and len(meta["name"]) <= 253, meta["name"]
            for key, value in meta.get("labels", {}).items():
                assert LABEL_VALUE.fullmatch(value) and len(value) <= 63, (obj["kind"], key, value)
        assert objs[-1]["metadata"]["labels"]["fsdpctl.io/run-id"] == run_id[:63].rstrip("-_.")

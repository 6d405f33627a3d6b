"""The cluster example at the bottom of .env.example is true (issue 13, defect 2): as written it
validates, renders objects the Training Operator's CRD and Kubernetes 1.33 accept, with its DATASET
on the shared volume every pod mounts; and it runs on the local backend with only what a CPU machine
needs changed."""

from __future__ import annotations

import json
import re

import pytest

from conftest import ROOT, SHARED, prefixed, yaml_docs
from fsdpctl.job import render
from fsdpctl.job.validate import crd_schemas, validate
from fsdpctl.settings import load, parse_dotenv, setting_keys

HEADER = "## A cluster run of"
CRDS = [
    SHARED / "vendor" / "kubeflow-training-operator-v1.9.4" / "kubeflow.org_pytorchjobs.yaml",
    SHARED / "vendor" / "kubeflow-trainer-v2.3.0" / "trainer.kubeflow.org_trainjobs.yaml",
]
# what a CPU machine needs instead: the tiny model and no hub weights (nothing gated to fetch, no
# token), a short fp32 run; the example's DATASET, JOB_NODES, SHARED_VOLUME, micro-batch and
# checkpointing stay
ON_THIS_MACHINE = {
    "BACKEND": "local",
    "MODEL": "tiny",
    "PRETRAINED": "",
    "HF_TOKEN_FILE": "",
    "SEQ_LEN": "64",
    "PRECISION": "fp32",
    "MAX_STEPS": "4",
    "WARMUP_STEPS": "1",
    "CHECKPOINT_INTERVAL": "2",
    "JOB_NAME": "example",
}


def example_text() -> str:
    """The commented KEY=VALUE lines after the example's header, uncommented: a .env a user would
    write."""
    text = (ROOT / ".env.example").read_text()
    block = text[text.index(HEADER) :].splitlines()
    return "\n".join(line[2:] for line in block if re.match(r"# [A-Z][A-Z0-9_]*=", line)) + "\n"


@pytest.fixture
def example(cli, tmp_path, monkeypatch) -> dict[str, str]:
    """The example as the user's .env, and the token file it names where `huggingface-cli login`
    writes it (under a HOME of the test's own)."""
    monkeypatch.setenv("HOME", str(tmp_path / "user"))
    token = tmp_path / "user" / ".cache" / "huggingface" / "token"
    token.parent.mkdir(parents=True)
    token.write_text("hf_ExAmPlEtOkEnNotReAl0123456789abcd\n")
    (tmp_path / ".env").write_text(example_text())
    return parse_dotenv(example_text(), ".env.example")


def test_the_example_is_a_cluster_run_of_known_settings(example):
    assert set(example) <= set(setting_keys())
    assert example["BACKEND"] == "eks" and example["DATASET"].startswith("/fsx/")
    assert (
        example["PRETRAINED"].startswith("meta-llama/") and example["HF_TOKEN_FILE"]
    )  # gated: a token


def test_the_example_validates_and_renders_what_the_crds_accept(cli, example):
    checked = cli("config", "validate")
    assert checked.exit_code == 0, checked.output
    assert cli("manifest", "--out-dir", "out").exit_code == 0
    schemas = crd_schemas([doc for crd in CRDS for doc in yaml_docs(crd)])
    objs = render.render_job(load(dotenv=example), "example-run-1")
    assert validate(objs, schemas) == []
    job = next(o for o in objs if o["kind"] == "PyTorchJob")
    pod = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
    container = pod["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    claims = {
        v["name"]: v["persistentVolumeClaim"]["claimName"]
        for v in pod["volumes"]
        if "persistentVolumeClaim" in v
    }
    mounted = {
        m["mountPath"]: claims[m["name"]] for m in container["volumeMounts"] if m["name"] in claims
    }
    # the data, the Hugging Face cache and the checkpoints are all on the claim every pod mounts at
    # /fsx
    assert mounted == {"/fsx": "fsx-claim"}
    for key in ("DATASET", "HF_HOME", "CHECKPOINT_DIR"):
        assert env[key].startswith("/fsx/"), (key, env[key])
    assert job["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 2
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 8  # a p5.48xlarge's


@pytest.mark.slow
def test_the_example_runs_on_the_local_backend(cli, example, assets):
    """The local backend maps the claim to FSDPCTL_HOME/volumes/fsx-claim for every simulated node,
    so the example's DATASET=/fsx/data/corpus.jsonl is read from there; a corpus not yet copied is
    refused first."""
    missing = cli.run("job", "run", env=prefixed(ON_THIS_MACHINE))
    assert missing.exit_code == 2, missing.output
    corpus_here = cli.home / "volumes" / "fsx-claim" / "data" / "corpus.jsonl"
    said = " ".join(missing.output.split())
    assert (
        "DATASET='/fsx/data/corpus.jsonl' (.env line " in said
        and "does not exist on this machine" in said
    )
    assert f"(the local backend reads it at {corpus_here})" in said
    corpus_here.parent.mkdir(parents=True)
    lines = [line for line in assets[0].read_text().splitlines() if line.strip()]
    corpus_here.write_text("".join(json.dumps({"text": line}) + "\n" for line in lines))

    ran = cli.run("job", "run", env=prefixed(ON_THIS_MACHINE), timeout=300)
    assert ran.exit_code == 0, ran.output[-3000:]
    status = json.loads(cli.run("job", "status", "example", "-o", "json").stdout)
    assert status["phase"] == "Succeeded" and status["step"] == 4 and status["nodes"] == 2
    spec = json.loads((cli.home / "jobs" / "example" / "spec.json").read_text())
    assert (
        spec["env"]["DATASET"] == "/fsx/data/corpus.jsonl"
        and spec["env"]["MICRO_BATCH_SIZE"] == "1"
    )
    assert spec["env"]["ACTIVATION_CHECKPOINTING"] == "full"
    assert (cli.home / "volumes/fsx-claim/checkpoints/example/step-00000004/meta.json").is_file()

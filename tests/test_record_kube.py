"""The run record on a cluster, against the Kubernetes API peer (tests/kube_peer.py, see
tests/test_kube.py): `job run` creates the ConfigMap <job>-record owned by the job
(garbage-collected with it, as the API server's ownerReferences say) and annotates the job with the
record's hash; `job describe` reads it back, with the image digest the kubelet reports in the pod's
status.containerStatuses[].imageID and the trainer's start line from the leader's log."""

from __future__ import annotations

import json

import pytest

from fsdpctl.backends.eks import configmap
from fsdpctl.job import record
from fsdpctl.settings import load, parse_dotenv
from kube_peer import wait_for
from test_kube import add_pod, cli, in_fsdp, install_operator, kube, peer  # noqa: F401 - `peer`: a fixture

TOKEN = "hf_KubeRecordTokenAbCdEfGhIjKlMnOpQr"
DIGEST = "sha256:" + "5e" * 32


def _start_line(record_id: str) -> str:
    return json.dumps(
        {
            "event": "start",
            "record_id": record_id,
            "python": "3.11.9",
            "torch": "2.6.0",
            "transformers": "4.50.0",
            "cuda": "12.4",
            "nccl": "2.21.5",
            "device": "cuda",
            "start_step": 0,
            "dataset": {"source": "org/set", "local": False},
            "tokenizer": {
                "source": "/fsx/tok",
                "local": True,
                "files": 1,
                "bytes": 9,
                "digest": "d" * 64,
            },
            "time": 1.0,
        }
    )


@pytest.mark.slow  # 3-7 s: the fast lane keeps under 2 minutes; no training processes, so
@pytest.mark.beside  # CI runs it beside the serial slow lane
def test_job_run_on_eks_records_the_run_in_a_config_map_owned_by_the_job_and_describe_reads_it(
    peer,  # noqa: F811
    monkeypatch,
):
    install_operator(peer)
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    r = cli("job", "run", "-d", MAX_STEPS="50", LR="0.0005")
    assert r.exit_code == 0, r.output
    [job] = peer.objects("pytorchjobs")
    [cm] = [c for c in in_fsdp(peer, "configmaps") if c["metadata"]["name"] == "fsdp-record"]
    rec = configmap.from_config_map(cm)
    assert record.problem(rec) is None
    assert (
        job["metadata"]["annotations"][configmap.ANNOTATION]
        == rec["hash"]
        == cm["metadata"]["annotations"][configmap.ANNOTATION]
    )
    [owner] = cm["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"]) == (
        "PyTorchJob",
        "fsdp",
        job["metadata"]["uid"],
    )
    assert rec["settings"]["LR"] == "0.0005" and rec["image"]["digest"] is None
    assert "Kubernetes Secret fsdp-hf-token" in rec["secrets"]["HF_TOKEN"]
    manifests = cm["data"]["manifests.yaml"]
    assert "kind: PyTorchJob" in manifests and "FSDPTRAIN_RECORD_ID" in manifests
    env = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["env"]
    assert {"name": "FSDPTRAIN_RECORD_ID", "value": rec["id"]} in env  # what the trainer echoes
    assert TOKEN not in json.dumps(cm) and TOKEN not in r.output

    # the pods ran: the kubelet reports the image by digest, the leader's log the trainer's versions
    k = kube(peer)
    add_pod(
        k,
        peer,
        "fsdp",
        0,
        log="master_addr=fsdp-worker-0\n" + _start_line(rec["id"]) + "\n",
        containerStatuses=[
            {
                "name": "pytorch",
                "image": "fsdpctl-trainer:0.1.0",
                "imageID": f"123456789012.dkr.ecr.us-west-2.amazonaws.com/fsdpctl-trainer@{DIGEST}",
                "ready": True,
                "restartCount": 0,
            }
        ],
    )
    d = cli("job", "describe", "fsdp", "-o", "json")
    assert d.exit_code == 0, d.output
    got = json.loads(d.stdout)
    assert got["id"] == rec["id"] and got["image"]["digest"] == DIGEST
    assert got["trainer"]["cuda"] == "12.4" and got["trainer"]["nccl"] == "2.21.5"
    # kept in the ConfigMap, so it outlives the pods
    [cm] = [c for c in in_fsdp(peer, "configmaps") if c["metadata"]["name"] == "fsdp-record"]
    assert configmap.from_config_map(cm)["image"]["digest"] == DIGEST
    table = cli("job", "describe", "fsdp")
    assert "ConfigMap fsdp/fsdp-record" in table.said and DIGEST in table.said, table.output
    text = cli("job", "describe", "fsdp", "-o", "env").stdout
    assert record.resolved_settings(load(dotenv=parse_dotenv(text))) == rec["settings"]
    assert TOKEN not in d.output + table.output + text

    # a rerun from the record: a new run id and record, the ConfigMap now the new job's
    rerun = cli("job", "rerun", "fsdp", "--replace", "-d", MAX_STEPS="60")
    assert rerun.exit_code == 0, rerun.output
    assert "data: the cluster's volume cannot be read from here" in rerun.said  # said, not guessed
    [job2] = peer.objects("pytorchjobs")
    [cm] = [c for c in in_fsdp(peer, "configmaps") if c["metadata"]["name"] == "fsdp-record"]
    new = configmap.from_config_map(cm)
    assert (
        new["run_id"] != rec["run_id"]
        and job2["metadata"]["annotations"][configmap.ANNOTATION] == new["hash"]
    )
    assert (
        cm["metadata"]["ownerReferences"][0]["uid"]
        == job2["metadata"]["uid"]
        != job["metadata"]["uid"]
    )
    assert (
        new["sources"]["LR"] == f"record {rec['id']}: --set"
        and new["sources"]["MAX_STEPS"] == "--set"
    )
    d = cli("job", "diff", rec["run_id"], new["run_id"], "-o", "json")
    assert json.loads(d.stdout)["settings"] == {"MAX_STEPS": ["50", "60"]}, d.output
    assert TOKEN not in rerun.output + json.dumps(cm)

    # the record goes with its job (ownerReferences: the garbage collector deletes the dependent)
    assert cli("job", "stop", "fsdp").exit_code == 0
    wait_for(
        lambda: "fsdp-record" not in [c["metadata"]["name"] for c in in_fsdp(peer, "configmaps")],
        20,
    )
    # this machine's copy stays, with what was learnt
    again = cli("job", "describe", rec["run_id"], "-o", "json")
    assert again.exit_code == 0 and json.loads(again.stdout)["image"]["digest"] == DIGEST
    assert cli("job", "describe", "fsdp").exit_code == 0  # the newest run's copy, its job gone

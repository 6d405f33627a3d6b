"""`job stop` relies on Foreground propagation: the job stays, marked for deletion, until the
garbage collector has deleted the pods it owns and the kubelet has ended them (SIGTERM, the trainer
checkpoints); only then does the job go, and `stop` waits for that. Against the peer's garbage
collector (kube_peer.py), with the test playing the Training Operator (pods owned by the job) and
the kubelet (ending terminating pods)."""

from __future__ import annotations

import threading

from conftest import SHARED
from fsdpctl.adapters.kube import Kube
from fsdpctl.backends.eks import engine
from fsdpctl.job import render
from fsdpctl.settings import load
from kube_peer import Peer, documents, wait_for

CRD = SHARED / "vendor" / "kubeflow-training-operator-v1.9.4" / "kubeflow.org_pytorchjobs.yaml"


def test_stop_waits_until_the_jobs_pods_are_gone(tmp_path):
    peer = Peer(tmp_path)
    try:
        k = Kube.connect(kubeconfig=str(peer.kubeconfig))
        cfg = load(flags={"BACKEND": "eks", "JOB_NAMESPACE": "fsdp"})
        k.apply(documents(CRD)[0])
        *infra, job = render.render_job(cfg, "run-1")
        for obj in infra:
            k.apply(obj)
        job = k.create(job)
        owner = {
            "apiVersion": job["apiVersion"],
            "kind": job["kind"],
            "name": job["metadata"]["name"],
        }
        ref = {
            **owner,
            "uid": job["metadata"]["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        }
        for i in range(2):  # as the operator makes them: owned by the job, bound to a node
            pod = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": f"fsdp-worker-{i}",
                    "namespace": "fsdp",
                    "ownerReferences": [ref],
                },
                "spec": {
                    "nodeName": f"node-{i}",
                    "containers": [{"name": "pytorch", "image": "x"}],
                },
            }
            k.create(pod)

        stopped: list[bool] = []
        stopper = threading.Thread(
            target=lambda: stopped.append(engine.stop(k, cfg, "fsdp", timeout=30))
        )
        stopper.start()
        wait_for(lambda: all(p["metadata"].get("deletionTimestamp") for p in peer.objects("pods")))
        marked = k.get("kubeflow.org/v1", "PyTorchJob", "fsdp", "fsdp")
        assert marked is not None and marked["metadata"]["finalizers"] == ["foregroundDeletion"]
        assert stopper.is_alive()  # the job stays while its pods terminate
        for pod in peer.objects("pods"):  # the kubelet: containers ended, the pod deleted for good
            k.request(
                "DELETE",
                k.path("v1", "Pod", "fsdp", pod["metadata"]["name"]),
                query={"gracePeriodSeconds": "0"},
            )
        stopper.join(30)
        assert (
            stopped == [True] and peer.objects("pytorchjobs") == [] and peer.objects("pods") == []
        )
    finally:
        peer.close()

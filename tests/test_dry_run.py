"""What a server dry run can prove. A real kube-apiserver creates nothing in a dry run, so an object
whose namespace or CRD comes from the same dry run cannot be checked (kubernetes/kubernetes#83562;
the peer of test_kube.py answers so, see kube_peer's NamespaceLifecycle). fsdpctl must not count
those as accepted."""

from __future__ import annotations

from test_kube import cli, install_operator, peer, said  # noqa: F401  (peer is a fixture)


def test_server_dry_run_on_a_fresh_cluster_names_what_it_could_not_check(peer):  # noqa: F811
    r = cli("deploy", "operator", "--dry-run=server")
    assert r.exit_code == 0, r.output
    text = said(r)
    assert "not checkable before their namespace or CRD exists" in text
    assert (
        "Deployment/training-operator" in text
    )  # lives in the namespace the same dry run 'creates'
    assert peer.objects("customresourcedefinitions") == []  # and nothing was stored


def test_deploy_status_finds_the_job_crd_by_discovery(peer):  # noqa: F811
    """The CRD's name is `<plural>.<group>` with the plural the CRD declares, read from discovery."""
    import json

    rows = json.loads(cli("deploy", "status", "-o", "json").stdout)
    [crd] = [r for r in rows if r["object"].startswith("CRD")]
    assert crd == {**crd, "installed": False, "object": "CRD of PyTorchJob (kubeflow.org/v1)"}
    install_operator(peer)
    rows = json.loads(cli("deploy", "status", "-o", "json").stdout)
    [crd] = [r for r in rows if r["object"].startswith("CRD")]
    assert crd["installed"] and crd["object"] == "CRD pytorchjobs.kubeflow.org"

"""fsdpctl acts only on what it can prove it owns on a cluster (issue 42), against the Kubernetes API
peer (tests/kube_peer.py: label selectors evaluated by the server, UIDs and resourceVersions, the
owner-reference garbage collector, DeleteOptions.preconditions), driven through the CLI.

Upstream behaviour the code and these tests rely on:
- ownerReferences and the garbage collector: "Owners and dependents" and "Garbage collection"
  (kubernetes.io/docs/concepts/overview/working-with-objects/owners-dependents,
  kubernetes.io/docs/concepts/architecture/garbage-collection; kubernetes
  pkg/controller/garbagecollector/garbagecollector.go): a dependent whose owner (by UID) is gone is
  deleted by the collector, so the job's Secret, ConfigMap, budget and pre-step go with the job and
  fsdpctl never deletes them by name;
- DeleteOptions.preconditions.uid (apimachinery pkg/apis/meta/v1 types.go, Preconditions): a
  delete of a same-named object with another UID is 409 Conflict, so a delete hits only the object
  whose labels were checked;
- label selectors are evaluated by the API server (API concepts, "Label selectors"): cleanup lists
  only this home's objects, and checks each one's labels again;
- the kubelet and a secret volume marked optional (kubernetes.io/docs/concepts/configuration/secret,
  "Optional Secrets"; kubelet pkg/volume/secret/secret.go): a pod whose optional Secret does not
  exist yet starts with an empty volume, and the kubelet projects the keys once the Secret exists
  (mounted Secrets are updated on its sync), so the job may be created before its Secret.

The generated matrix: every verb that stops, deletes, replaces or cleans x a thing of every owner
(this home's job, no fsdpctl labels, another home's, another job's of this home) x every kind of
per-job object (PyTorchJob, Secret, ConfigMap, PodDisruptionBudget). The invariant checked on every
cell: comparing the peer's whole store before and after, only objects carrying this home's labels
for the job changed; a thing in the way that is not the job's is refused in one line naming it and
the kubectl that acts on it (exit 2)."""

from __future__ import annotations

import itertools
import json
import signal

import pytest

from conftest import SHARED
from fsdpctl.backends.eks import configmap
from fsdpctl.job import owner, render
from fsdpctl.job import store as record_store
from fsdpctl.settings import load
from kube_peer import documents, wait_for
from test_kube import (  # noqa: F401 - `peer`: a fixture
    add_claim,
    add_pod,
    cli,
    kube,
    peer,
    said,
    set_condition,
    step_line,
)

# out of the fast lane (it keeps under 2 minutes): beside the serial slow lane (conftest)
pytestmark = pytest.mark.slow

CRD = SHARED / "vendor" / "kubeflow-training-operator-v1.9.4" / "kubeflow.org_pytorchjobs.yaml"
OTHER_HOME = "0123456789abcdef"

OWNERS = ("own", "foreign", "other-home", "other-job")
KINDS = ("PyTorchJob", "Secret", "ConfigMap", "PodDisruptionBudget")
VERBS = ("stop", "run", "run --replace", "cleanup", "resume")


@pytest.fixture
def cluster(peer):  # noqa: F811
    """The peer with the PyTorchJob CRD, the job namespace and the shared claim the pods mount
    (what `deploy operator` and `deploy storage` leave)."""
    k = kube(peer)
    k.apply(documents(CRD)[0])
    add_claim(peer, "fsdp", "fsx-claim")
    return peer


def labels_of(who: str, job: str) -> dict[str, str]:
    if who == "foreign":
        return {"team": "theirs"}
    home, of = {
        "own": (owner.home_id(), job),
        "other-home": (OTHER_HOME, job),
        "other-job": (owner.home_id(), "someone-else"),
    }[who]
    return owner.Owner(home, of, "r-old").labels()


def plant(cluster, kind: str, job: str, labels: dict[str, str]) -> dict:
    """A `kind` object named as job `job`'s own would be, carrying `labels`."""
    cfg = load(flags={"BACKEND": "eks", "JOB_NAME": job})
    meta = {"namespace": "fsdp", "labels": labels}
    obj = {
        "PyTorchJob": lambda: render.render_job(cfg, "r-old")[-1],
        "PodDisruptionBudget": lambda: render.render_pdb(cfg, "r-old")[0],
        "Secret": lambda: {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": render.secret_name(cfg)},
            "stringData": {"HF_TOKEN": "theirs"},
        },
        "ConfigMap": lambda: {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": f"{job}-record"},
            "data": _record_data(job),
        },
    }[kind]()
    obj = {**obj, "metadata": {**obj["metadata"], **meta}}
    return kube(cluster).create(obj)


def _record_data(job: str) -> dict[str, str]:
    """A ConfigMap's data: the newest record this home has of `job` (what an earlier run's
    ConfigMap held), or data that is no record."""
    runs = record_store.of_job(job, [])
    if not runs:
        return {"theirs": "yes"}
    return configmap.config_map(runs[-1], "fsdp")["data"]


def store(cluster) -> dict[tuple, tuple[str, str, dict]]:
    """Every object the peer holds: (uid, resourceVersion, labels) by key."""
    return {
        key: (
            o["metadata"]["uid"],
            o["metadata"].get("resourceVersion"),
            o["metadata"].get("labels") or {},
        )
        for key, o in cluster.call(lambda: dict(cluster.api.store.objects)).items()
    }


def only_ours_changed(before: dict, after: dict, job: str) -> list:
    """The objects that changed or went though they are not this home's job's."""
    home = owner.home_id()
    return [
        key
        for key, (uid, rv, labels) in before.items()
        if owner.why_not_ours(owner.of_labels(labels), home, job) is not None
        and after.get(key, (None, None, None))[:2] != (uid, rv)
    ]


def verb_args(verb: str, job: str) -> list[str]:
    return {
        "stop": ["job", "stop", job],
        "run": ["--set", f"JOB_NAME={job}", "job", "run", "-d"],
        "run --replace": ["--set", f"JOB_NAME={job}", "job", "run", "-d", "--replace"],
        "cleanup": ["--set", f"JOB_NAME={job}", "cleanup", "--yes"],
        "resume": ["job", "resume", job, "-d"],
    }[verb]


def touches(verb: str, kind: str) -> bool:
    """Whether the verb acts on an object of `kind` named as the job's: a run makes every per-job
    object; stop and cleanup act on the job object (its dependents go with it)."""
    return verb in ("run", "run --replace", "resume") or kind == "PyTorchJob"


def before_verb(cluster, verb: str, kind: str, job: str) -> None:
    """What each verb needs first: a run of the job to resume (this home's, then gone from the
    cluster as after `kubectl delete`: its dependents with it)."""
    if verb != "resume":
        return
    assert cli("job", "run", "-d", JOB_NAME=job).exit_code == 0
    k = kube(cluster)
    k.delete("kubeflow.org/v1", "PyTorchJob", job, "fsdp", propagation="Background")
    wait_for(
        lambda: (
            not any(
                (o["metadata"].get("labels") or {}).get(owner.JOB_LABEL) == job
                for p in ("pytorchjobs", "secrets", "configmaps", "poddisruptionbudgets")
                for o in cluster.objects(p)
            )
        )
    )


RUNS = ("run", "resume")  # without --replace: this home's running job is refused (needs --replace)
# the fast lane keeps two cells (about 1.5 s each); the slow lane runs the whole product (~40 s)
FAST = {("run", "foreign"), ("stop", "other-home")}
CELLS = [
    pytest.param(v, w, id=f"{v}-{w}", marks=() if (v, w) in FAST else pytest.mark.slow)
    for v, w in itertools.product(VERBS, OWNERS)
]


@pytest.mark.parametrize("verb, who", CELLS)
def test_a_verb_changes_only_what_this_home_s_job_owns(cluster, verb, who):
    bystander = plant(cluster, "Secret", "bystander", {})  # never anyone's business here
    for i, kind in enumerate(KINDS):
        job = f"j{i}-{kind.lower()[:6]}"
        before_verb(cluster, verb, kind, job)
        planted = plant(cluster, kind, job, labels_of(who, job))
        if verb == "cleanup" and kind == "PyTorchJob":
            set_condition(kube(cluster), planted, "Succeeded")
        before = store(cluster)
        r = cli(*verb_args(verb, job))
        after = store(cluster)
        cell = f"{verb} x {who} {kind}: {r.output}"
        assert only_ours_changed(before, after, job) == [], cell
        assert r.exception is None or isinstance(r.exception, SystemExit), cell
        key = next(
            k for k in before if k[3] == planted["metadata"]["name"] and k[1] == plural(kind)
        )
        gone_or_new = key not in after or after[key][0] != planted["metadata"]["uid"]
        if who != "own" and touches(verb, kind) and verb != "cleanup":
            assert r.exit_code == 2, cell
            # named, with the kubectl that acts on it; a resume without --replace of a job whose
            # run this home recorded is refused earlier, as a run of it that still runs would be
            named = f"{kind} fsdp/{planted['metadata']['name']}" in said(r)
            assert (named and "kubectl -n fsdp delete" in said(r)) or (
                verb == "resume" and kind == "PyTorchJob" and "is running" in said(r)
            ), cell
            assert len(r.stderr.strip().splitlines()) <= 2, cell  # the line and its hint
        elif who == "own" and touches(verb, kind) and not (verb in RUNS and kind == "PyTorchJob"):
            assert r.exit_code == 0, cell
            if verb in ("stop", "cleanup"):
                wait_for(lambda key=key: key not in store(cluster))
            else:  # made again for the new run
                assert gone_or_new, cell
    assert (
        kube(cluster).get("v1", "Secret", "bystander-hf-token", "fsdp")["metadata"][
            "resourceVersion"
        ]
        == bystander["metadata"]["resourceVersion"]
    )


def plural(kind: str) -> str:
    return {"PodDisruptionBudget": "poddisruptionbudgets"}.get(kind, kind.lower() + "s")


# ---- submit exactly once; a job's end is kept -----------------------------------------------------

JOB_KINDS = ("pytorchjobs", "secrets", "configmaps", "poddisruptionbudgets", "jobs")


def of_job(cluster, job: str) -> dict[str, list[dict]]:
    """The objects of the namespace that carry job `job`'s label or are named from it."""
    return {
        p: [
            o
            for o in cluster.objects(p)
            if o["metadata"].get("namespace") == "fsdp"
            and (
                (o["metadata"].get("labels") or {}).get(owner.JOB_LABEL) == job
                or o["metadata"]["name"].startswith(job)
            )
        ]
        for p in JOB_KINDS
    }


@pytest.mark.parametrize(
    "write, code, reason",
    [
        (("POST", "pytorchjobs"), 500, "InternalError"),
        (("POST", "pytorchjobs"), 503, "ServiceUnavailable"),
        (("PATCH", "secrets"), 500, "InternalError"),  # the job made, its Secret not
    ],
)
def test_a_run_the_api_fails_leaves_no_secret_and_nothing_of_the_run(
    cluster, monkeypatch, write, code, reason
):
    """The job object is created first and its Secret after it, owned by it: a create that fails
    leaves no token on the cluster (the issue's case: a 500 on the PyTorchJob's create left the
    job's token Secret behind); a job made whose Secret failed is found by its token and deleted,
    what it owns with it (the garbage collector)."""
    monkeypatch.setenv("HF_TOKEN", "hf_NeverLeftBehindAbCdEfGhIjKlMnOp")
    cluster.api.failing[write] = (code, reason)
    r = cli("job", "run", "-d", JOB_NAME="ec")
    assert r.exit_code != 0 and str(code) in said(r), r.output
    wait_for(lambda: all(objs == [] for objs in of_job(cluster, "ec").values()))
    assert not (owner_home() / "jobs" / "ec" / "submitting.json").exists()
    assert cli("job", "run", "-d", JOB_NAME="ec").exit_code == 0  # nothing in the way after


def owner_home():
    from fsdpctl import files

    return files.home()


KILLED_AFTER_CREATE = """
import os, signal, sys
from fsdpctl.adapters import kube

create = kube.Kube.create

def create_then_die(self, obj):
    made = create(self, obj)
    if obj.get("kind") == "PyTorchJob":  # the API holds the job; nothing after it ran
        os.kill(os.getpid(), signal.SIGKILL)
    return made

kube.Kube.create = create_then_die
from fsdpctl.cli import app

sys.argv[0] = "fsdpctl"
app()
"""


@pytest.mark.slow  # ~6 s: a real process started and killed
def test_a_run_killed_once_the_api_held_its_job_is_recorded_by_the_next_run_which_is_refused(
    cluster, tmp_path
):
    """SIGKILL of `job run -d` (a real process, killed by the kernel: no handler runs) the moment
    the API server held the PyTorchJob, before its Secret: the next `job run -d` settles the intent
    the first left, finds the job by its submit token (fsdpctl.io/submit, a label selector the API
    server evaluates), records it, makes the Secret it lacked (owned by it) and is refused as a
    second run of a running job: one job, never two."""
    import subprocess
    import sys

    script = tmp_path / "killed.py"
    script.write_text(KILLED_AFTER_CREATE)
    first = subprocess.run(
        [sys.executable, str(script), "job", "run", "-d"], capture_output=True, timeout=120
    )
    assert first.returncode == -signal.SIGKILL, first.stderr
    [job] = of_job(cluster, "fsdp")["pytorchjobs"]
    assert of_job(cluster, "fsdp")["secrets"] == []  # killed before its Secret
    assert (owner_home() / "jobs" / "fsdp" / "submitting.json").exists()

    again = cli("job", "run", "-d")
    assert again.exit_code == 2, again.output
    assert "found by its token and recorded" in said(again), again.output
    assert "is running" in said(again) and "--replace" in said(again), again.output
    [still] = of_job(cluster, "fsdp")["pytorchjobs"]
    assert still["metadata"]["uid"] == job["metadata"]["uid"]
    [secret] = of_job(cluster, "fsdp")["secrets"]
    assert owned_refs(secret) == [job["metadata"]["uid"]]
    status = json.loads(cli("job", "status", "-o", "json").stdout)
    assert status["run_id"] == job["metadata"]["labels"][owner.RUN_LABEL]
    assert not (owner_home() / "jobs" / "fsdp" / "submitting.json").exists()


def owned_refs(obj: dict) -> list[str]:
    return [ref["uid"] for ref in obj["metadata"].get("ownerReferences") or []]


@pytest.mark.parametrize("end", ["Succeeded", "Failed"])
def test_stop_of_an_ended_job_leaves_it_and_how_it_ended(cluster, end):
    """How a run ended is the user's record: `job stop` of an ended job deletes nothing and
    annotates nothing (the issue's case: stop of a Succeeded job deleted it and said Stopped)."""
    assert cli("job", "run", "-d").exit_code == 0
    [job] = of_job(cluster, "fsdp")["pytorchjobs"]
    set_condition(kube(cluster), job, end, "ENOSPC at a save" if end == "Failed" else "")
    before = store(cluster)
    r = cli("job", "stop", "fsdp")
    assert r.exit_code == 0 and f"is not running ({end}); nothing to stop" in said(r), r.output
    assert store(cluster) == before
    assert json.loads(cli("job", "status", "-o", "json").stdout)["phase"] == end


def test_every_object_of_a_run_carries_its_owner_and_cleanup_names_it(cluster):
    """Every object `job run` makes for the job carries the owner labels; the per-job ones are
    owned by the job object (garbage-collected with it); `cleanup --dry-run` names each one's
    owner."""
    assert cli("job", "run", "-d", MAX_STEPS="50").exit_code == 0
    made = of_job(cluster, "fsdp")
    [job] = made["pytorchjobs"]
    who = owner.of_labels(job["metadata"]["labels"])
    assert who.home == owner.home_id() and who.job == "fsdp" and who.token
    for plural, objs in made.items():
        for o in objs:
            assert owner.of_labels(o["metadata"]["labels"]) == who, (plural, o["metadata"])
            if plural != "pytorchjobs":
                assert owned_refs(o) == [job["metadata"]["uid"]], (plural, o["metadata"])
    set_condition(kube(cluster), job, "Succeeded")
    r = cli("cleanup", "--dry-run")
    line = f"(owner: {who.describe()})"
    assert f"would remove PyTorchJob/fsdp {line}" in said(r), r.output
    assert f"would remove Secret/fsdp-hf-token {line}" in said(r), r.output
    assert f"would remove ConfigMap/fsdp-record {line}" in said(r), r.output


@pytest.mark.slow  # ~3 s: a run, its end and a resume through the CLI
def test_a_failed_run_s_outcome_stays_in_history_after_the_job_is_resumed(cluster):
    """The issue's case: a run that failed (ENOSPC at a save) read `unknown: its output is gone` in
    `job history` once `job resume` replaced its job object (its pods and their logs went with it).
    How it ended is learnt into its record before the old job goes (runner._learn_before_it_goes)."""
    assert cli("job", "run", "-d").exit_code == 0
    [job] = of_job(cluster, "fsdp")["pytorchjobs"]
    first = job["metadata"]["labels"][owner.RUN_LABEL]
    log = "master_addr=fsdp-worker-0\n" + "\n".join(step_line(s) for s in (10, 20, 30)) + "\n"
    log += "OSError: [Errno 28] No space left on device\n"
    add_pod(kube(cluster), cluster, "fsdp", 0, phase="Failed", log=log, owner=job)
    set_condition(kube(cluster), job, "Failed", "ENOSPC at a save")
    r = cli("job", "resume", "fsdp", "-d")
    assert r.exit_code == 0, r.output
    rows = json.loads(cli("job", "history", "fsdp", "-o", "json").stdout)
    [old] = [row for row in rows if row["run_id"] == first]
    assert old["outcome"].startswith("Failed at step 30"), rows
    assert len(rows) == 2 and rows[-1]["run_id"] != first


@pytest.mark.slow  # ~3 s: a run and its stop through the CLI
def test_a_stopped_run_s_end_stays_in_history_after_its_pods_went(cluster):
    """`job stop` deletes the job with foreground propagation, and its pods' logs go with them
    (the kubelet serves pods/log only while the pod exists): the run's record learns how it ended
    from the leader's log just before the delete (EksBackend._keep_its_end), so `job history` says
    "Stopped at step N", not "unknown: its output is gone"."""
    assert cli("job", "run", "-d").exit_code == 0
    [job] = of_job(cluster, "fsdp")["pytorchjobs"]
    run = job["metadata"]["labels"][owner.RUN_LABEL]
    log = "master_addr=fsdp-worker-0\n" + "\n".join(step_line(s) for s in (10, 20)) + "\n"
    add_pod(kube(cluster), cluster, "fsdp", 0, phase="Running", log=log, owner=job)
    r = cli("job", "stop", "fsdp")
    assert r.exit_code == 0, r.output
    assert of_job(cluster, "fsdp")["pytorchjobs"] == []
    rows = json.loads(cli("job", "history", "fsdp", "-o", "json").stdout)
    [row] = [row for row in rows if row["run_id"] == run]
    assert row["outcome"] == "Stopped at step 20", rows

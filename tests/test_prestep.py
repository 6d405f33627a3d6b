"""The job's hub downloads happen once, before any process group (fsdpctl.job.prestep, fsdptrain.fetch),
and `fsdpctl model fetch` / `data fetch` pre-stage them.

Peer: no Hugging Face Hub is reachable from these machines, so tests/hub_peer.py serves the Hub's
HTTP contract on 127.0.0.1 (repo info, tree listing, resolve with X-Repo-Commit/ETag/X-Linked-*
headers, Range, RepoNotFound/GatedRepo errors with the Hub's status codes) and counts every request.
The client is the real huggingface_hub (its HF_ENDPOINT points at the peer); the model it serves is
a real Llama checkpoint that the test saves with transformers'
LlamaConfig/LlamaForCausalLM.save_pretrained, with the offline tokenizer of fsdptrain.assets.
Kubernetes objects validate against the Kubernetes 1.33 OpenAPI and the CRDs
(tests/test_manifests.py's fixture); the EKS flow runs against tests/kube_peer.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import ROOT, invoke, prefixed
from fsdpctl.job import prestep, render
from fsdpctl.job.validate import validate
from fsdpctl.settings import load
from fsdptrain import fetch
from fsdptrain.config import ConfigError
from hub_peer import HubPeer, running
from test_kube import install_operator, kube, peer  # noqa: F401 - `peer`: the Kubernetes API peer fixture
from test_manifests import schemas  # noqa: F401 - the fixture: CRD schemas for validate()

TOKEN = "hf_GatedAccessTokenZyXwVuTsRqPoNm98"
MODEL = "org/tiny-llama"
# gated on the peer (meta-llama/* the settings already refuse without a token)
GATED = "acme/llama-gated"


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory, assets) -> Path:
    """A real (tiny) Llama checkpoint in the Hugging Face layout: safetensors, config, tokenizer."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    out = tmp_path_factory.mktemp("tiny-llama")
    tokenizer = AutoTokenizer.from_pretrained(str(assets[1]))
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=256,
    )
    LlamaForCausalLM(config).save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    return out


@pytest.fixture
def hub(tiny_model, monkeypatch):
    """The peer with a public model, a gated one (TOKEN has access) and a data set; HF_ENDPOINT at
    it."""
    rows = "".join(
        json.dumps({"text": f"document {i}: " + "the quick brown fox " * 8}) + "\n"
        for i in range(64)
    )
    with running(HubPeer()) as served:
        served.add_dir("model", MODEL, tiny_model)
        served.add_dir("model", GATED, tiny_model, gated_tokens={TOKEN})
        served.add(
            "dataset", "org/corpus", {"data/train.jsonl": rows.encode(), "README.md": b"# corpus\n"}
        )
        monkeypatch.setenv("HF_ENDPOINT", served.endpoint)
        monkeypatch.setenv(fetch.PROGRESS_ENV, "0.2")
        yield served


def cache(cli) -> Path:
    """The local shared volume's Hugging Face cache: what pods see at /fsx/hf-cache/hub."""
    return cli.home / "volumes" / "fsx-claim" / "hf-cache" / "hub"


def file_gets(served: HubPeer) -> dict[str, int]:
    counts: dict[str, int] = {}
    for method, path in served.requests:
        if method == "GET" and "/resolve/" in path:
            counts[path.rsplit("/", 1)[1]] = counts.get(path.rsplit("/", 1)[1], 0) + 1
    return counts


# ---- what a job fetches, and how the objects say it ----------------------------------------------------


def test_which_settings_name_hub_repos():
    assert fetch.is_hub_id("meta-llama/Llama-2-7b-hf") and fetch.is_hub_id("org/data.v2")
    for value in ("builtin", "", "/fsx/data", "./data", "~/x/y", "gpt2", "a/b/c", "org/.."):
        assert not fetch.is_hub_id(value), value
    t = fetch.targets({"PRETRAINED": GATED, "TOKENIZER": "", "DATASET": "org/corpus"})
    assert [(x.kind, x.repo_id, x.key) for x in t] == [
        ("model", GATED, "PRETRAINED"),
        ("dataset", "org/corpus", "DATASET"),
    ]
    assert set(fetch.TOKENIZER_PATTERNS) <= set(
        t[0].patterns or ()
    )  # the model repo is the tokenizer too
    t = fetch.targets({"PRETRAINED": GATED, "TOKENIZER": "org/tok", "DATASET": "builtin"})
    assert [(x.repo_id, x.patterns) for x in t] == [
        (GATED, fetch.MODEL_PATTERNS),
        ("org/tok", fetch.TOKENIZER_PATTERNS),
    ]
    # a value that exists here is a local directory, as the trainer decides
    assert fetch.targets({"DATASET": "org/corpus"}, exists=lambda p: True) == []


def eks(**more):
    return load(
        dotenv={
            "BACKEND": "eks",
            "AWS_ACCOUNT_ID": "123456789012",
            "JOB_NODES": "16",
            "MODEL": "7b",
            **more,
        }
    )


@pytest.mark.parametrize(
    "cfg",
    [
        lambda: eks(PRETRAINED=GATED, HF_TOKEN=TOKEN),
        lambda: eks(PRETRAINED=GATED, HF_TOKEN=TOKEN, JOB_KIND="trainjob", DATASET="org/corpus"),
        lambda: eks(DATASET="org/corpus", RDZV_BACKEND="etcd", CHECKPOINT_PVC="ckpt"),
        lambda: load(dotenv={"PRETRAINED": MODEL}),
    ],
    ids=["pytorchjob", "trainjob", "dataset-etcd", "local"],
)
def test_the_prestep_job_validates_and_the_workers_wait_for_its_marker(schemas, cfg):  # noqa: F811
    cfg = cfg()
    objs = render.render_job(cfg, "run-7")
    assert validate(objs, schemas) == []
    *_, fetch_job, pdb, job = objs
    assert pdb["kind"] == "PodDisruptionBudget"
    assert (fetch_job["apiVersion"], fetch_job["kind"], fetch_job["metadata"]["name"]) == (
        "batch/v1",
        "Job",
        "fsdp-fetch",
    )
    pod = fetch_job["spec"]["template"]["spec"]
    [container] = pod["containers"]
    env = {e["name"]: e["value"] for e in container["env"]}
    marker = "/fsx/hf-cache/.fsdpctl/prestep/run-7.json"
    assert container["command"] == ["python", "-m", "fsdptrain.fetch", "--marker", marker]
    # it downloads into the HF_HOME the workers read, on the claim they mount, with the job's token
    assert env["HF_HOME"] == "/fsx/hf-cache" and "HF_HUB_OFFLINE" not in env
    assert {"name": "shared", "persistentVolumeClaim": {"claimName": "fsx-claim"}} in pod["volumes"]
    assert {"name": "shared", "mountPath": "/fsx"} in container["volumeMounts"]
    assert env["HF_TOKEN_PATH"].startswith(render.HF_TOKEN_DIR) and TOKEN not in render.to_yaml(
        objs
    )
    # its pod is not one of the job's nodes (those are listed by fsdpctl.io/job)
    assert "fsdpctl.io/job" not in fetch_job["spec"]["template"]["metadata"]["labels"]
    # a wrong id or no access (exit 2), or a hub still down after retries (1): the Job fails at
    # once; so does a volume its first container cannot prepare
    [rule, prep, disruption] = fetch_job["spec"]["podFailurePolicy"]["rules"]
    assert rule["action"] == "FailJob" and rule["onExitCodes"]["values"] == [1, 2]
    assert prep["onExitCodes"] == {"containerName": "volume-prep", "operator": "In", "values": [1]}
    assert disruption["action"] == "Ignore" and pod["restartPolicy"] == "Never"
    # every worker waits for the marker, then never touches the hub
    text = json.dumps(job)
    assert json.dumps({"name": fetch.MARKER_ENV, "value": marker}) in text
    assert json.dumps({"name": "HF_HUB_OFFLINE", "value": "1"}) in text
    assert json.dumps({"name": "HF_HOME", "value": "/fsx/hf-cache"}) in text


def test_without_a_hub_repo_the_prestep_only_prepares_the_volume():
    """Every job whose pods mount a claim gets the pre-step for its first container (volume-prep),
    which makes the job's directories before anything of the job writes; without a hub repo it
    downloads nothing, the workers stay online, and they wait for it no longer than its pod takes to
    start."""
    for cfg in (
        load(dotenv={}),
        eks(),
        eks(PRETRAINED="/fsx/models/llama", DATASET="/fsx/data/c.jsonl"),
    ):
        objs = render.render_job(cfg, "r")
        [pre] = [o for o in objs if o["kind"] == "Job"]
        env = {
            e["name"]: e["value"] for e in pre["spec"]["template"]["spec"]["containers"][0]["env"]
        }
        assert not {"PRETRAINED", "TOKENIZER", "DATASET"} & set(env)
        assert "HF_HUB_OFFLINE" not in json.dumps(objs) and fetch.MARKER_ENV in json.dumps(objs[-1])
        wait = json.dumps({"name": fetch.WAIT_ENV, "value": str(prestep.PREP_ONLY_WAIT_S)})
        assert wait in json.dumps(objs[-1])
    # no claim at all (one node, pod-local disks): nothing to prepare, no disk the pre-step and the
    # pods share; the trainer downloads per node, before any process group
    # (fsdptrain.fetch.before_process_group)
    single = eks(JOB_NODES="1", SHARED_VOLUME="", PRETRAINED=GATED, HF_TOKEN=TOKEN)
    assert [o["kind"] for o in render.render_job(single, "r")] == [
        "Namespace",
        "PodDisruptionBudget",
        "PyTorchJob",
    ]


# ---- fsdpctl model fetch / data fetch -------------------------------------------------------------------


def test_model_fetch_twice_downloads_once_and_dry_run_writes_nothing(cli, hub):
    dry = cli("--set", f"PRETRAINED={MODEL}", "model", "fetch", "--dry-run")
    assert dry.exit_code == 0, dry.output
    assert (
        "would download 5 files" in dry.stderr and not cache(cli).exists() and file_gets(hub) == {}
    )

    first = cli("--set", f"PRETRAINED={MODEL}", "model", "fetch")
    assert first.exit_code == 0, first.output
    gets = file_gets(hub)
    assert sorted(gets) == sorted(p.name for p in hub_files(hub)) and set(gets.values()) == {1}
    repo = cache(cli) / "models--org--tiny-llama"
    sha = (repo / "refs" / "main").read_text()
    snapshot = repo / "snapshots" / sha
    assert first.stdout.strip() == str(snapshot) and (snapshot / "model.safetensors").is_file()
    assert "downloaded 5 files" in first.stderr

    again = cli("model", "fetch", MODEL)
    assert again.exit_code == 0, again.output
    assert "already complete, nothing downloaded" in again.stderr
    assert file_gets(hub) == gets  # not one file fetched again
    # --to: any HF_HOME (a workstation's mount of the shared volume)
    elsewhere = cli("model", "fetch", MODEL, "--to", "mnt/hf")
    assert (
        elsewhere.exit_code == 0
        and (cli.cwd / "mnt/hf/hub/models--org--tiny-llama/refs/main").is_file()
    )


def hub_files(served: HubPeer) -> list[Path]:
    return [Path(p) for p in served.repos[("model", MODEL)].files]


@pytest.mark.parametrize(
    "args, token, says",
    [
        (
            ["model", "fetch", "org/no-such-model"],
            None,
            "model='org/no-such-model' is not a model repo on the hub",
        ),
        (
            ["--set", f"PRETRAINED={GATED}", "model", "fetch"],
            None,
            f"PRETRAINED='{GATED}' is a gated repo",
        ),
        (
            ["model", "fetch", GATED],
            "hf_NotGrantedTokenAbCdEfGhIjKlMn12",
            "the token has no access",
        ),
        (["data", "fetch", "org/corpus", "--revision", "v9"], None, "has no revision 'v9'"),
    ],
    ids=["unknown", "gated-no-token", "gated-token-without-access", "no-revision"],
)
def test_a_wrong_repo_or_token_is_one_line_exit_2_and_nothing_written(cli, hub, args, token, says):
    if token:
        (cli.cwd / "token").write_text(token + "\n")
        args = ["--set", "HF_TOKEN_FILE=token", *args]
    r = cli(*args)
    assert r.exit_code == 2, r.output
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and says in " ".join(r.stderr.split()), r.stderr
    assert "hint:" in r.stderr and (token or TOKEN) not in r.output
    assert not (
        cli.home / "volumes"
    ).exists()  # nothing half-written: it failed before the first byte


def test_a_gated_model_with_a_granted_token_from_a_file(cli, hub):
    (cli.cwd / "token").write_text(TOKEN + "\n")
    r = cli("--set", "HF_TOKEN_FILE=token", "--set", f"PRETRAINED={GATED}", "model", "fetch")
    assert r.exit_code == 0, r.output
    assert (
        TOKEN not in r.output
        and (cache(cli) / "models--acme--llama-gated" / "refs" / "main").is_file()
    )


@pytest.mark.slow  # starts the fetch program or the trainer as processes of their own
def test_an_interrupted_download_stays_invisible_until_the_next_fetch_finishes_it(cli, hub):
    hub.cut.add("model.safetensors")  # the connection drops half-way, every time
    r = cli("model", "fetch", MODEL)
    assert r.exit_code == 1 and "run it again" in r.stderr, r.output
    repo = cache(cli) / "models--org--tiny-llama"
    assert not (
        repo / "refs" / "main"
    ).exists()  # offline loaders resolve refs/main: they see nothing
    assert not list(repo.rglob("model.safetensors"))
    assert offline_load(cache(cli).parent, "config").returncode != 0
    hub.cut.clear()
    before = file_gets(hub)
    r = cli("model", "fetch", MODEL)
    assert r.exit_code == 0 and "downloaded 1 file," in r.stderr, r.output
    after = file_gets(hub)
    assert {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)} == {
        "model.safetensors": 1
    }
    assert offline_load(cache(cli).parent, "config").returncode == 0


def offline_load(hf_home: Path, what: str) -> subprocess.CompletedProcess:
    """transformers, as the trainer calls it, in a fresh process with HF_HUB_OFFLINE=1 and the hub
    gone."""
    code = {
        "config": f"import transformers as t; print(t.AutoConfig.from_pretrained({MODEL!r}).hidden_size)",
    }[what]
    env = {
        **os.environ,
        "HF_HOME": str(hf_home),
        "HF_HUB_OFFLINE": "1",
        "HF_ENDPOINT": "http://127.0.0.1:9",
    }
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )


@pytest.mark.slow  # starts the fetch program or the trainer as processes of their own
def test_data_fetch_then_the_trainer_streams_the_snapshot_offline(cli, hub, assets):
    r = cli("data", "fetch", "org/corpus", "--to", "hf")
    assert r.exit_code == 0, r.output
    hub.down()  # from here on the hub is unreachable
    code = (
        "from fsdptrain.config import TrainConfig;"
        "from fsdptrain.data import StreamingBlocks, load_tokenizer;"
        f"tok = load_tokenizer({str(assets[1])!r});"
        "cfg = TrainConfig(dataset='org/corpus', seq_len=16);"
        "rows = StreamingBlocks(cfg, tok).take(0, 3); print(rows.shape)"
    )
    env = {
        **os.environ,
        "HF_HOME": str(cli.cwd / "hf"),
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
    }
    p = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=180, cwd=ROOT
    )
    assert p.returncode == 0 and p.stdout.strip() == "(3, 17)", p.stderr[-2000:]
    # a repo not fetched: one line naming the fix, not a hub error
    missing = code.replace("org/corpus", "org/never-fetched")
    p = subprocess.run(
        [sys.executable, "-c", missing], env=env, capture_output=True, text=True, timeout=180
    )
    assert p.returncode != 0 and "fetch it first" in p.stderr


def test_eks_needs_a_directory_to_fetch_into(cli, hub):
    r = cli("--set", "BACKEND=eks", "model", "fetch", MODEL)
    assert r.exit_code == 2 and "--to DIR" in r.stderr


# ---- the pre-step program and the trainers' wait ----------------------------------------------------------


def run_fetch(hf_home: Path, marker: Path, **env: str) -> subprocess.CompletedProcess:
    full = {
        **os.environ,
        "HF_HOME": str(hf_home),
        "PRETRAINED": "",
        "TOKENIZER": "",
        "DATASET": "builtin",
        **env,
    }
    argv = [sys.executable, "-m", "fsdptrain.fetch", "--marker", str(marker)]
    return subprocess.run(argv, env=full, capture_output=True, text=True, timeout=120)


@pytest.mark.slow  # starts the fetch program or the trainer as processes of their own
def test_the_prestep_program_tells_its_verdict_in_the_marker(hub, tmp_path):
    p = run_fetch(tmp_path / "hf", tmp_path / "ok.json", PRETRAINED=MODEL, DATASET="org/corpus")
    assert p.returncode == 0, p.stderr
    verdict = fetch.read_marker(tmp_path / "ok.json")
    assert verdict["ok"] and [r["repo"] for r in verdict["repos"]] == [MODEL, "org/corpus"]
    states = [r["state"] for r in fetch.parse(p.stdout.splitlines())]
    assert states == ["complete", "complete"]
    # a wrong id: exit 2 (the Job fails at once) and the trainers learn why
    p = run_fetch(tmp_path / "hf", tmp_path / "bad.json", PRETRAINED="org/nope")
    assert (
        p.returncode == 2
        and "is not a model repo" in fetch.read_marker(tmp_path / "bad.json")["error"]
    )
    # the hub unreachable after its retries: exit 1, and the trainers stop waiting too
    hub.down()
    p = run_fetch(
        tmp_path / "hf2", tmp_path / "down.json", PRETRAINED=MODEL, **{fetch.ATTEMPTS_ENV: "2"}
    )
    assert p.returncode == 1 and "failed" in fetch.read_marker(tmp_path / "down.json")["error"]


def test_the_wait_is_a_file_poll_with_a_deadline(tmp_path):
    """No collective (a download of 138 GB outlasts any collective timeout) but a deadline (issue 27, defect
    1): a pre-step that could not write its marker (EACCES on a root-owned volume) left every trainer waiting
    with its GPUs held, forever. The deadline (PRESTEP_TIMEOUT, rendered as FSDPTRAIN_FETCH_WAIT_S) fails the
    pod with one line naming it, exit 2 from the launcher: the job fails instead."""
    marker, said, clock = tmp_path / "m.json", [], [0.0]

    def sleep(s: float) -> None:  # the marker turns up after three hours of polling
        clock[0] += s
        if clock[0] >= 3 * 3600:
            fetch.write_marker(marker, error=None, fetched=[])

    wait = dict(say=said.append, clock=lambda: clock[0], sleep=sleep)
    record = fetch.wait_for_marker(marker, timeout_s=4 * 3600, **wait)
    assert record["ok"] and len(said) == 3 * 60  # said at once, then once a minute, for 3 hours
    marker.unlink()
    clock[0] = 0.0
    with pytest.raises(
        ConfigError, match=r"gave no result in 1800 s \(PRESTEP_TIMEOUT\): no marker"
    ):
        fetch.wait_for_marker(marker, timeout_s=1800, **wait)
    assert 1800 <= clock[0] < 1800 + 5  # gave up at the deadline, not before, not much after
    assert fetch.wait_timeout({fetch.WAIT_ENV: "900"}) == 900 and fetch.wait_timeout({}) == 7200
    fetch.write_marker(marker, error="PRETRAINED='x/y' is a gated repo: set HF_TOKEN", fetched=[])
    with pytest.raises(ConfigError, match="gated repo"):
        fetch.wait_for_marker(marker, say=said.append)


@pytest.mark.slow  # starts the fetch program or the trainer as processes of their own
def test_without_a_prestep_local_rank_0_downloads_for_its_node_before_any_process_group(
    hub, tmp_path
):
    """`torchrun -m fsdptrain` with a hub id and no pre-step: the node's download runs in a child
    process before the process group, then the trainer is offline."""
    code = (
        "import os; from fsdptrain.fetch import before_process_group;"
        f"before_process_group({{'PRETRAINED': {MODEL!r}}}, os.environ);"
        "import sys; print(os.environ['HF_HUB_OFFLINE'], 'huggingface_hub' in sys.modules)"
    )
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "LOCAL_RANK": "0", "RANK": "0"}
    p = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert p.returncode == 0 and p.stdout.strip().splitlines()[-1] == "1 False", p.stdout + p.stderr
    assert file_gets(hub)["model.safetensors"] == 1
    assert offline_load(tmp_path / "hf", "config").returncode == 0


# ---- job status -------------------------------------------------------------------------------------------


def test_status_says_what_the_prestep_is_doing():
    line = fetch.Progress(
        repo=GATED,
        kind="model",
        state="downloading",
        files_done=3,
        files_total=7,
        bytes_done=3 << 30,
        bytes_total=13 << 30,
    ).line()
    records = fetch.parse(["noise", line])
    running = prestep.report(records, "Running")
    assert prestep.describe(running) == f"Running: 3/7 files, 3.0 GiB of 13.0 GiB ({GATED})"
    cached = fetch.Progress(
        repo=GATED,
        kind="model",
        state="complete",
        files_done=7,
        files_total=7,
        bytes_done=13 << 30,
        bytes_total=13 << 30,
    ).line()
    done = prestep.report(fetch.parse([line, cached]), "Succeeded")
    assert prestep.describe(done).endswith(f"all cached, nothing downloaded ({GATED})")
    failed = fetch.Progress(
        repo=GATED, kind="model", state="failed", error="is a gated repo"
    ).line()
    assert prestep.describe(prestep.report(fetch.parse([failed]), "Running")).startswith(
        "Failed: is a gated repo"
    )
    job = {
        "status": {
            "conditions": [
                {"type": "Failed", "status": "True", "message": "exit code 2 matching FailJob"}
            ]
        }
    }
    assert prestep.job_phase(job) == ("Failed", "exit code 2 matching FailJob")
    assert prestep.job_phase({"status": {"active": 1}}) == ("Running", None)
    assert (
        prestep.job_phase({"status": {"conditions": [{"type": "Complete", "status": "True"}]}})[0]
        == "Succeeded"
    )


def test_eks_job_run_creates_the_prestep_owned_by_the_job_and_status_follows_it(peer):  # noqa: F811
    install_operator(peer)
    settings = ["--set", f"PRETRAINED={GATED}", "--set", f"HF_TOKEN={TOKEN}"]
    r = invoke(*settings, "job", "run", "-d")
    assert r.exit_code == 0, r.output
    [job] = peer.objects("pytorchjobs")
    [fetch_job] = [j for j in peer.objects("jobs") if j["metadata"]["namespace"] == "fsdp"]
    assert fetch_job["metadata"]["name"] == "fsdp-fetch"
    [owner] = fetch_job["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"]) == (
        "PyTorchJob",
        "fsdp",
        job["metadata"]["uid"],
    )

    status = json.loads(invoke(*settings, "job", "status", "-o", "json").stdout)
    assert status["prestep"]["phase"] == "Pending" and status["stalled"] is False

    k = kube(peer)  # play the Job controller and the kubelet: its pod runs and logs progress
    k.create(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": "fsdp-fetch-x1",
                "namespace": "fsdp",
                "labels": {prestep.OF_LABEL: "fsdp"},
            },
            "spec": {"containers": [{"name": "fetch", "image": "x"}]},
        }
    )
    progress = fetch.Progress(
        repo=GATED,
        kind="model",
        state="downloading",
        files_done=2,
        files_total=5,
        bytes_done=2 << 30,
        bytes_total=13 << 30,
    )
    peer.api.logs[("fsdp", "fsdp-fetch-x1")] = progress.line() + "\n"
    k.request(
        "PATCH",
        "/apis/batch/v1/namespaces/fsdp/jobs/fsdp-fetch/status",
        content_type="application/merge-patch+json",
        body={"status": {"active": 1}},
    )
    r = invoke(*settings, "job", "status")
    assert (
        r.exit_code == 0
        and "pre-step" in r.stdout
        and "Running: 2/5 files, 2.0 GiB of 13.0 GiB" in r.stdout
    )

    assert (
        invoke(*settings, "job", "stop").exit_code == 0
    )  # the garbage collector takes the pre-step too
    assert [j for j in peer.objects("jobs") if j["metadata"]["namespace"] == "fsdp"] == []


# ---- a real two-node local job ---------------------------------------------------------------------------


@pytest.mark.slow
def test_a_two_node_job_downloads_once_before_training_and_trains_offline(cli, hub, assets):
    """Two simulated nodes (own network namespaces as root): the pre-step downloads each file once
    while both nodes' trainers wait for its marker (the weights are slowed down so they do wait);
    the hub goes down the moment the marker appears, and the trainers load weights and tokenizer
    from the shared cache."""
    hub.delay_s["model.safetensors"] = 20
    settings = {
        "PRETRAINED": MODEL,
        "DATASET": str(assets[0]),
        "MAX_STEPS": "3",
        "SEQ_LEN": "32",
        "PRECISION": "fp32",
        "WARMUP_STEPS": "1",
        "JOB_NODES": "2",
    }
    markers = cache(cli).parent / ".fsdpctl" / "prestep"
    stop = threading.Event()

    def hub_goes_down_at_the_marker():
        while not stop.wait(0.2):
            if markers.is_dir() and list(markers.glob("*.json")):
                hub.down()
                return

    watcher = threading.Thread(target=hub_goes_down_at_the_marker, daemon=True)
    watcher.start()
    env = {**prefixed(settings), "HF_ENDPOINT": hub.endpoint}
    try:
        started = cli.run("job", "run", "--detach", env=env)
        assert started.exit_code == 0, started.output
        seen = watch_status(cli, env)  # job status while the weights come in
        waited = cli.run("job", "wait", "--timeout", "500", env=env, timeout=540)
    finally:
        stop.set()
    assert seen["phase"] == "Running" and seen["step"] == 0 and seen["stalled"] is False, seen
    assert seen["prestep"]["phase"] == "Running" and seen["prestep"]["files_total"] == 5, seen[
        "prestep"
    ]
    assert (
        seen["prestep"]["files_done"] == 4
        and seen["prestep"]["bytes_done"] < seen["prestep"]["bytes_total"]
    )
    logs = cli.home / "jobs" / "fsdp" / "logs"
    [node0] = logs.glob("*/node-0.log")
    assert waited.exit_code == 0, node0.read_text()[-3000:]
    assert hub.server is None  # it went down before training
    assert set(file_gets(hub).values()) == {1} and len(file_gets(hub)) == len(hub_files(hub))
    text = node0.read_text()
    assert "waiting for the download before training" in text and f"model {MODEL}" in text
    status = json.loads(cli.run("job", "status", "-o", "json").stdout)
    assert status["phase"] == "Succeeded" and status["step"] == 3
    assert status["prestep"]["phase"] == "Succeeded" and status["prestep"]["files_done"] == 5
    assert status["prestep"]["downloaded_bytes"] == status["prestep"]["bytes_total"] > 500_000


def watch_status(cli, env: dict[str, str]) -> dict:
    """`job status -o json` until it shows the download part-way (or 60 s pass): that report. (Bytes
    within a file show in huggingface_hub's 10 MiB write steps: the tiny weights come in one.)"""
    deadline = time.monotonic() + 60
    while True:
        r = json.loads(cli.run("job", "status", "-o", "json", env=env).stdout)
        pre = r.get("prestep") or {}
        if pre.get("phase") == "Running" and 0 < pre.get("files_done", 0) < pre.get(
            "files_total", 0
        ):
            return r
        if time.monotonic() > deadline:
            return r
        time.sleep(0.5)


@pytest.mark.parametrize(
    "endpoint, forwarded",
    [
        ("", False),
        ("http://127.0.0.1:8080", True),
        ("https://hub.internal.example", True),
        ("https://mirror.example:8443/prefix", True),
        ("http://user:Hub-Pa55word-x1@127.0.0.1:9", "credentials"),
        ("https://Hub-Pa55word-x1@hub.example", "credentials"),
        ("ftp://hub.example", "bad"),
        ("hub.example", "bad"),
        ("http://", "bad"),
        ("http://[::1", "bad"),
    ],
)
def test_hf_endpoint_reaches_the_containers_that_download_without_credentials(
    endpoint, forwarded, monkeypatch
):
    """huggingface_hub reads HF_ENDPOINT from its process environment (constants.py ENDPOINT). A
    pod's environment is only what its manifest says (kubelet_pods.go makeEnvironmentVariables),
    where a local or Slurm job inherits the shell's (sbatch(1) --export=ALL): so the pre-step's
    container and the trainers get fsdpctl's HF_ENDPOINT in the rendered job. One holding
    credentials would put them in the manifest: refused without printing them; one that is no
    http(s) URL is refused naming it."""
    if endpoint:
        monkeypatch.setenv("HF_ENDPOINT", endpoint)
    else:
        monkeypatch.delenv("HF_ENDPOINT", raising=False)
    cfg = load(environ={}, flags={"BACKEND": "eks", "MODEL": "tiny", "SHARED_VOLUME": "fsx"})
    if forwarded in ("credentials", "bad"):
        from fsdpctl.errors import BadInput

        with pytest.raises(BadInput) as refused:
            render.render_job(cfg, "fsdp-r1")
        said = f"{refused.value} {refused.value.hint}"
        assert "HF_ENDPOINT" in said and "Pa55word" not in said
        return
    objs = render.render_job(cfg, "fsdp-r1")
    envs = [
        {e["name"]: e.get("value") for e in c.get("env", [])}
        for o in objs
        for spec in _pod_specs(o)
        for c in spec.get("containers", [])
    ]
    assert envs and all((e.get("HF_ENDPOINT") == endpoint) == forwarded for e in envs), envs


def _pod_specs(obj: dict) -> list[dict]:
    """Every pod template's spec in an object (a Job's, each replica's of a PyTorchJob)."""
    found = []
    if obj.get("kind") == "Job":
        found.append(obj["spec"]["template"]["spec"])
    for replica in (obj.get("spec", {}).get("pytorchReplicaSpecs") or {}).values():
        found.append(replica["template"]["spec"])
    return found

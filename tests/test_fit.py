"""Refusing what cannot fit or be scheduled, before anything is created (issue 13, defect 6):
`config validate`, `manifest` and `job run` exit 2 with one line per problem and its fix, write
nothing, and go on with a warning per override under --force. On the cluster: plan's GPU memory
(over generated model x instance x nodes x strategy combinations the refusal agrees with
`plan.memory().fits`, and the fix it names makes the job pass) and JOB_NODES against NODE_COUNT;
locally: processes against this machine's cores, memory against its RAM, and
DATASET/TOKENIZER/PRETRAINED/HF_TOKEN_FILE paths (under SHARED_VOLUME_PATH: the claim's directory
under FSDPCTL_HOME/volumes)."""

from __future__ import annotations

import itertools
import os
import random
import re
from pathlib import Path

import pytest

from fsdpctl.plan import fit
from fsdpctl.plan import planner as P
from fsdpctl.plan.instances import INSTANCE_TYPES
from fsdpctl.settings import load, local_path, placement_problems

MODELS = ("7b", "13b", "70b")
NODES = (1, 2, 4, 16)
STRATEGIES = ("FULL_SHARD", "SHARD_GRAD_OP", "HYBRID_SHARD", "NO_SHARD")
COMBOS = list(itertools.product(MODELS, INSTANCE_TYPES, NODES, STRATEGIES))
RAM = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
CORES = os.cpu_count() or 1
GIB = 1024**3


def eks(model: str, instance: str, nodes: int, strategy: str, **more: str) -> dict[str, str]:
    return {
        "BACKEND": "eks",
        "MODEL": model,
        "INSTANCE_TYPE": instance,
        "JOB_NODES": str(nodes),
        "NODE_COUNT": str(nodes),
        "SHARDING_STRATEGY": strategy,
        # an image with a registry: `job run` on EKS refuses one without
        "AWS_ACCOUNT_ID": "123456789012",
        **more,
    }


def sets(values: dict[str, str]) -> list[str]:
    return [f"--set={k}={v}" for k, v in values.items()]


def _said(result, prefix: str) -> list[str]:
    """The stderr lines that start with `prefix`, each with the lines rich wrapped it onto."""
    entries: list[str] = []
    for line in result.stderr.splitlines():
        if re.match(r"(error:|warning:|✓|  hint:)", line) or not entries:
            entries.append(line)
        else:
            entries[-1] += " " + line.strip()
    return [" ".join(e[len(prefix) :].split()) for e in entries if e.startswith(prefix)]


def errors(result) -> list[str]:
    return _said(result, "error:")


def warnings(result) -> list[str]:
    return _said(result, "warning:")


def fix_of(line: str) -> dict[str, str]:
    """The settings a refusal's fix names (`...: set A=1 and B=2, the cheapest change that fits
    ...`); a node-count fix grows NODE_COUNT with it."""
    wanted = line.rsplit(": set ", 1)[1].split(", the cheapest", 1)[0]
    fix = dict(re.findall(r"([A-Z][A-Z0-9_]*)=([\w.]+)", wanted))
    if "JOB_NODES" in fix:
        fix.setdefault("NODE_COUNT", fix["JOB_NODES"])
    return fix


# --- GPU memory on the cluster ----------------------------------------------------------------------------


@pytest.mark.parametrize("ac", ["none", "full"])
@pytest.mark.parametrize("micro_batch", ["1", "4"])
def test_the_pure_check_agrees_with_plan_memory(ac, micro_batch):
    for model, instance, nodes, strategy in COMBOS:
        cfg = load(
            flags=eks(
                model,
                instance,
                nodes,
                strategy,
                ACTIVATION_CHECKPOINTING=ac,
                MICRO_BATCH_SIZE=micro_batch,
            )
        )
        fits = P.memory(P.job_from(cfg, mfu=0.0, price=None)).fits
        line = fit.fit_problem(cfg, ram_bytes=0)  # RAM is for local jobs only
        assert (line is None) == fits, (model, instance, nodes, strategy, line)


@pytest.mark.parametrize(
    "model, instance, nodes, strategy", COMBOS, ids=["-".join(map(str, c)) for c in COMBOS]
)
def test_config_validate_refuses_exactly_what_does_not_fit_and_the_fix_passes(
    cli, model, instance, nodes, strategy
):
    values = eks(model, instance, nodes, strategy)
    fits = P.memory(P.job_from(load(flags=values), mfu=0.0, price=None)).fits
    r = cli(*sets(values), "config", "validate")
    assert r.exit_code == (0 if fits else 2), r.output
    if fits:
        return
    [line] = errors(r)
    # each value named with where it came from (here --set)
    assert (
        line.startswith(f"MODEL={model} (--set) needs ")
        and f"INSTANCE_TYPE={instance} (--set)" in line
    )
    assert (
        f"JOB_NODES={nodes} (--set)" in line and f"SHARDING_STRATEGY={strategy} (--set)" in line
    ), line
    if "no single change fits" in line:
        return
    again = cli(*sets({**values, **fix_of(line)}), "config", "validate")
    assert again.exit_code == 0, f"the fix of {line!r} does not pass: {again.output}"


def test_the_issues_examples_are_refused_with_their_fix(cli):
    """70B HYBRID_SHARD with the default group (one node's 8 GPUs) rendered and would run out of
    memory; 70B on one p4de validated."""
    hybrid = cli(*sets(eks("70b", "p5.48xlarge", 16, "HYBRID_SHARD")), "manifest")
    assert hybrid.exit_code == 2 and hybrid.stdout == ""
    [line] = errors(hybrid)
    assert "shard group 8" in line and "set SHARDING_STRATEGY=FULL_SHARD" in line, line
    one = cli(*sets(eks("70b", "p4de.24xlarge", 1, "FULL_SHARD")), "config", "validate")
    [line] = errors(one)
    assert (
        one.exit_code == 2 and "JOB_NODES=1 (--set) x INSTANCE_TYPE=p4de.24xlarge (--set)" in line
    )
    assert "set JOB_NODES=4 and NODE_COUNT=4" in line, line


# --- nothing written or created; --force ----------------------------------------------------------------


def test_refused_manifest_writes_nothing_and_force_writes_it_loudly(cli, tmp_path):
    values = sets(eks("70b", "p5.48xlarge", 1, "FULL_SHARD", JOB_NODES="2"))
    r = cli(*values, "manifest", "--out-dir", "out")
    assert r.exit_code == 2 and len(errors(r)) == 2, (
        r.stderr
    )  # 70B on 2 nodes; JOB_NODES 2 > NODE_COUNT 1
    assert not (tmp_path / "out").exists() and not cli.home.exists()
    forced = cli(*values, "manifest", "--out-dir", "out", "--force")
    assert forced.exit_code == 0, forced.output
    said = warnings(forced)
    assert len(said) == 2 and all(w.startswith("--force: going on although ") for w in said)
    assert any("MODEL=70b (--set) needs" in w for w in said)
    assert any("JOB_NODES=2 (--set) exceeds NODE_COUNT=1 (--set)" in w for w in said)
    assert (tmp_path / "out" / "pytorchjob-fsdp.yaml").is_file()


def test_job_run_is_refused_before_anything_is_created(cli):
    """On the cluster (a dry run contacts nothing: the refusal comes first) and locally (no job
    directory)."""
    refused = cli(*sets(eks("70b", "p5.48xlarge", 1, "FULL_SHARD")), "job", "run", "--dry-run")
    assert (
        refused.exit_code == 2
        and refused.stdout == ""
        and "MODEL=70b (--set) needs" in refused.stderr
    )
    forced = cli(
        *sets(eks("70b", "p5.48xlarge", 1, "FULL_SHARD")), "job", "run", "--dry-run", "--force"
    )
    assert (
        forced.exit_code == 0 and "PyTorchJob/fsdp" in forced.stdout and "--force" in forced.stderr
    )
    local = cli("--set=DATASET=/fsx/data/missing.jsonl", "job", "run", "--detach")
    assert (
        local.exit_code == 2
        and "DATASET='/fsx/data/missing.jsonl' (--set) does not exist" in local.stderr
    )
    assert not (cli.home / "jobs").exists()


def test_config_validate_force_warns_and_passes(cli):
    r = cli(
        *sets(eks("13b", "p5.48xlarge", 2, "FULL_SHARD", JOB_NODES="4")),
        "config",
        "validate",
        "--force",
    )
    assert r.exit_code == 0 and warnings(r) == [
        "--force: going on although JOB_NODES=4 (--set) exceeds NODE_COUNT=2 (--set), the GPU nodes of the "
        "node group: the "
        "other pods would stay Pending; set JOB_NODES=2, or NODE_COUNT=4 and grow the node group"
    ]


# --- scheduling: the cluster's node group ------------------------------------------------------------------


@pytest.mark.parametrize("job_nodes, node_count", [(1, 1), (2, 2), (2, 3), (3, 2), (16, 4)])
def test_job_nodes_against_node_count_on_eks_only(cli, job_nodes, node_count):
    values = {"JOB_NODES": str(job_nodes), "NODE_COUNT": str(node_count)}
    r = cli(
        *sets({**values, "BACKEND": "eks", "IMAGE_REGISTRY": "registry.example.com:5000"}),
        "config",
        "validate",
    )
    assert r.exit_code == (2 if job_nodes > node_count else 0), r.output
    if job_nodes > node_count:
        assert errors(r) == [
            f"JOB_NODES={job_nodes} (--set) exceeds NODE_COUNT={node_count} (--set), the GPU nodes of the "
            "node group: the "
            f"other pods would stay Pending; set JOB_NODES={node_count}, or NODE_COUNT={job_nodes} and grow "
            "the node group"
        ]
    if job_nodes <= 4 * CORES:  # locally NODE_COUNT means nothing
        assert cli(*sets(values), "config", "validate").exit_code == 0


# --- this machine: cores, RAM, paths ------------------------------------------------------------------------


@pytest.mark.parametrize("extra", [-1, 0, 1])
def test_local_processes_against_this_machines_cores(cli, extra):
    most = 4 * CORES
    nodes = most + extra
    r = cli(f"--set=JOB_NODES={nodes}", "config", "validate")
    assert r.exit_code == (2 if nodes > most else 0), r.output
    if nodes > most:
        assert errors(r) == [
            f"JOB_NODES={nodes} (--set) x LOCAL_PROCS_PER_NODE=1 is {nodes} local processes for this "
            f"machine's {CORES} cores: use at most {most} (4 per core), or BACKEND=eks"
        ]


@pytest.mark.parametrize("model", ["tiny", "7b", "70b"])
def test_local_memory_against_this_machines_ram(cli, model):
    cfg = load(flags={"MODEL": model})
    need = fit.host_memory(cfg)
    r = cli(f"--set=MODEL={model}", "config", "validate")
    assert r.exit_code == (2 if need > RAM else 0), r.output
    if need > RAM:  # (a 70B job's checkpoints may not fit this disk either: its own line)
        [line] = [e for e in errors(r) if e.startswith("MODEL=")]
        cfg_t = cfg.training
        assert line.startswith(
            f"MODEL={model} (--set) at SEQ_LEN={cfg_t.seq_len} x MICRO_BATCH_SIZE={cfg_t.micro_batch_size} "
            f"needs about {need / GIB:.1f} GiB for 2 local processes"
        )
        assert line.endswith("use MODEL=tiny here, or BACKEND=eks")
    assert model != "tiny" or need < 2 * GIB


def test_the_one_change_a_local_memory_error_names_fits():
    """Generated settings against a generated amount of RAM they do not fit in: the change the line
    names (MODEL=tiny, a lower SEQ_LEN, MICRO_BATCH_SIZE=1), applied alone, fits; it is never the
    value already set (SEQ_LEN=100000000 on the tiny model was told to `use MODEL=tiny`); and a line
    that names none is right that none of them fits."""
    rng = random.Random(17)
    for _ in range(150):
        flags = {
            "MODEL": rng.choice(["tiny", "7b", "13b"]),
            "SEQ_LEN": str(rng.choice([64, 512, 4096, 65536, 1 << 20])),
            "MICRO_BATCH_SIZE": str(rng.choice([1, 2, 8, 64])),
        }
        cfg = load(flags=flags)
        ram = int(fit.host_memory(cfg) * rng.uniform(0.001, 0.99))
        line = fit.fit_problem(cfg, ram_bytes=ram) or ""
        fixed = re.search(
            r": (use MODEL=tiny|lower SEQ_LEN to (\d+)|set MICRO_BATCH_SIZE=1|no single)", line
        )
        assert fixed, line
        change = {
            "use MODEL=tiny": {"MODEL": "tiny"},
            "set MICRO_BATCH_SIZE=1": {"MICRO_BATCH_SIZE": "1"},
        }.get(fixed.group(1), {"SEQ_LEN": fixed.group(2)} if fixed.group(2) else {})
        if not change:
            tries = [{"MODEL": "tiny"}, {"SEQ_LEN": "8"}, {"MICRO_BATCH_SIZE": "1"}]
            assert all(fit.host_memory(load(flags={**flags, **t})) > ram for t in tries), (
                flags,
                ram,
            )
            continue
        assert all(flags[k] != v for k, v in change.items()), (flags, line)
        assert fit.host_memory(load(flags={**flags, **change})) <= ram, (flags, change, ram)


def test_local_memory_is_every_process_together():
    one = load(flags={"MODEL": "13b", "JOB_NODES": "1"})
    four = load(flags={"MODEL": "13b", "JOB_NODES": "2", "LOCAL_PROCS_PER_NODE": "2"})
    state = 16 * P.MODEL_CONFIGS["13b"].num_params()
    assert (
        fit.host_memory(one) > state and fit.host_memory(four) > state
    )  # the state is split, not dropped
    assert fit.host_memory(four) > fit.host_memory(one)  # each process adds activations and itself
    assert fit.fit_problem(one, ram_bytes=fit.host_memory(one)) is None
    assert "this machine has" in (fit.fit_problem(one, ram_bytes=fit.host_memory(one) - 1) or "")


def test_local_paths_map_through_the_shared_volume(cli):
    path = "/fsx/data/corpus.jsonl"
    r = cli(f"--set=DATASET={path}", "config", "validate")
    here = cli.home / "volumes" / "fsx-claim" / "data" / "corpus.jsonl"
    assert r.exit_code == 2 and errors(r) == [
        f"DATASET={path!r} (--set) does not exist on this machine (the local backend reads it at {here}): "
        "put it there or fix DATASET"
    ]
    assert not cli.home.exists()  # checking creates nothing
    here.parent.mkdir(parents=True)
    here.write_text('{"text": "x"}\n')
    assert cli(f"--set=DATASET={path}", "config", "validate").exit_code == 0
    # on the cluster the path is inside the pod: not checked here
    assert (
        cli(
            "--set=DATASET=/fsx/other.jsonl",
            "--set=BACKEND=eks",
            "--set=IMAGE_REGISTRY=registry.example.com:5000",
            "config",
            "validate",
        ).exit_code
        == 0
    )
    # with the volume mounted elsewhere, /fsx/... is a path of this machine's own
    moved = cli("--set=SHARED_VOLUME_PATH=/data", f"--set=DATASET={path}", "config", "validate")
    assert moved.exit_code == (0 if Path(path).exists() else 2)
    assert "the local backend reads it at" not in moved.stderr


@pytest.mark.parametrize("key", ["DATASET", "TOKENIZER", "PRETRAINED"])
def test_local_paths_outside_any_volume_are_the_machines_own(cli, tmp_path, key):
    missing = cli(f"--set={key}=./nowhere/x", "config", "validate")
    assert missing.exit_code == 2 and errors(missing) == [
        f"{key}='./nowhere/x' (--set) does not exist on this machine: put it there or fix {key}"
    ]
    (tmp_path / "there").mkdir()
    assert cli(f"--set={key}={tmp_path / 'there'}", "config", "validate").exit_code == 0
    assert (
        cli(f"--set={key}=org/hub-id", "config", "validate").exit_code == 0
    )  # a hub id is no path


@pytest.mark.parametrize("backend", ["local", "eks"])
def test_a_missing_token_file_is_refused_on_both_backends(cli, tmp_path, backend):
    """The token file is read on this machine (into the environment or the Secret), whatever the
    backend."""
    r = cli(
        f"--set=BACKEND={backend}",
        "--set=IMAGE_REGISTRY=registry.example.com:5000",
        "--set=HF_TOKEN_FILE=~/no-such-token",
        "config",
        "validate",
    )
    assert r.exit_code == 2 and errors(r) == [
        "HF_TOKEN_FILE='~/no-such-token' (--set) does not exist: check the path, or set HF_TOKEN"
    ]
    token = tmp_path / "token"
    token.write_text("hf_x\n")
    assert (
        cli(
            f"--set=BACKEND={backend}",
            "--set=IMAGE_REGISTRY=registry.example.com:5000",
            f"--set=HF_TOKEN_FILE={token}",
            "config",
            "validate",
        ).exit_code
        == 0
    )
    with_token = cli(
        f"--set=BACKEND={backend}",
        "--set=IMAGE_REGISTRY=registry.example.com:5000",
        "--set=HF_TOKEN_FILE=/nope",
        "config",
        "validate",
    )
    assert with_token.exit_code == 2
    os.environ["HF_TOKEN"] = "hf_abcdefghijklmnopqrstuvwxyz012345"
    try:  # HF_TOKEN wins over the file, which then is not read
        assert (
            cli(
                f"--set=BACKEND={backend}",
                "--set=IMAGE_REGISTRY=registry.example.com:5000",
                "--set=HF_TOKEN_FILE=/nope",
                "config",
                "validate",
            ).exit_code
            == 0
        )
    finally:
        del os.environ["HF_TOKEN"]


# --- the pure checks, with the machine injected -----------------------------------------------------------


def test_placement_problems_take_the_machine_as_arguments():
    cfg = load(flags={"DATASET": "/fsx/d/x.txt", "TOKENIZER": "/tok", "JOB_NODES": "9"})
    seen = []

    def exists(path: str) -> bool:
        seen.append(path)
        return path == "/tok"

    lines = placement_problems(
        cfg, cores=2, exists=exists, mounts={"/fsx": "/v/fsx-claim", "/fsx/d": "/v/d"}
    )
    assert seen == [
        "/v/d/x.txt",
        "/tok",
    ]  # the longest mount wins; paths outside mounts are the machine's
    assert [line.split("=")[0] for line in lines] == ["JOB_NODES", "DATASET"]
    assert placement_problems(cfg, cores=3, exists=lambda p: True, mounts={}) == []
    assert (
        local_path("/fsx", {"/fsx/": "/v"}) == "/v"
        and local_path("/fsxx/a", {"/fsx": "/v"}) == "/fsxx/a"
    )

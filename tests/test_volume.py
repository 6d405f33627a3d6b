"""The shared volume against what the job writes there (issue 27, defects 3 and 6): its size (FSx
for Lustre PERSISTENT_2 capacities, FSx API CreateFileSystem StorageCapacity: 1200 GiB, 2400 GiB and
increments of 2400 GiB), its rate (PerUnitStorageThroughput is MB/s per TiB for the whole file
system, all clients together: FSx for Lustre User Guide, "Aggregate file system performance"), what
the trainer keeps there (fsdptrain.checkpoint: `prune` keeps CHECKPOINT_KEEP after `publish`, so one
more exists during a save; DCP writes each replicated shard once,
torch/distributed/checkpoint/_dedup_save_plans.py), and the preflight that refuses a volume too
small. Peers: the settings loader and the CLI in process; the Kubernetes API peer (kmock) for the
claim's capacity `job run` reads."""

from __future__ import annotations

import math
import re

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from conftest import invoke
from fsdpctl.errors import SettingsError
from fsdpctl.job import policy as jobpolicy
from fsdpctl.job import render
from fsdpctl.plan import volume
from fsdpctl.settings import load
from fsdptrain.shapes import MODEL_CONFIGS

GIB = 1024**3
EKS = {"BACKEND": "eks", "AWS_ACCOUNT_ID": "123456789012", "INSTANCE_TYPE": "p5.48xlarge"}


def valid_fsx(gib: int) -> bool:
    return gib == 1200 or (gib >= 2400 and gib % 2400 == 0)


jobs = st.fixed_dictionaries(
    {
        "MODEL": st.sampled_from(["tiny", "7b", "13b", "70b"]),
        "CHECKPOINT_KEEP": st.integers(1, 6).map(str),
        "PRETRAINED": st.sampled_from(["", "meta-llama/Llama-2-7b-hf"]),
        "EXPORT_DIR": st.sampled_from(["", "/fsx/export", "/elsewhere/export"]),
        "FSX_THROUGHPUT_PER_TIB": st.sampled_from(["125", "250", "500", "1000"]),
    }
)


def cluster(job: dict[str, str], **more: str):
    """On 16 p5 nodes, where 70B fits in GPU memory; a hub PRETRAINED needs a token."""
    token = {"HF_TOKEN": "hf_" + "x" * 34} if job.get("PRETRAINED") else {}
    return load(dotenv={**EKS, "JOB_NODES": "16", "NODE_COUNT": "16", **job, **token, **more})


def test_the_default_file_system_holds_a_70b_jobs_checkpoints():
    """A 70B checkpoint is 12 bytes per parameter, ~771 GiB; with CHECKPOINT_KEEP=2 three exist
    during the third save of a fresh run, four during a resumed run's later saves (the one it
    resumed from is never pruned): ~3084 GiB, which the old fixed default of 1200 GiB could not hold
    (the second save filled it). The default is now sized from the model for a run that may resume
    (RESUME=auto, on a cluster fsdpctl cannot look at): 4800 GiB, and says where it came from."""
    cfg = cluster({"MODEL": "70b"})
    ckpt = 12 * MODEL_CONFIGS["70b"].num_params()
    assert 770 * GIB < ckpt < 772 * GIB
    assert volume.need(cfg).total == 4 * ckpt
    assert volume.need(cluster({"MODEL": "70b", "RESUME": "never"})).total == 3 * ckpt
    assert cfg.fsx_storage_gib == 4800 and cfg.sources["FSX_STORAGE_GIB"] == "derived"
    assert cfg.fsx_storage_gib * GIB * volume.FILL_AT_MOST >= 4 * ckpt
    assert load(dotenv={}).fsx_storage_gib == 1200  # the tiny model keeps a few MB


@settings(max_examples=40, deadline=None, derandomize=True)
@given(job=jobs)
def test_the_derived_size_is_a_valid_fsx_size_that_holds_the_job(job):
    """Whatever the model, keep count, hub weights and export: the derived FSX_STORAGE_GIB is a size
    FSx accepts, holds the need within FILL_AT_MOST, and is the smallest such size."""
    cfg = cluster(job)
    need = volume.need(cfg).total
    size = cfg.fsx_storage_gib
    assert valid_fsx(size), size
    assert need <= size * GIB * volume.FILL_AT_MOST
    smaller = 1200 if size == 2400 else size - 2400
    assert size == 1200 or need > smaller * GIB * volume.FILL_AT_MOST
    assert volume.fsx_problem(cfg) is None


@settings(
    max_examples=25,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(job=jobs, short=st.integers(1, 2400))
def test_a_file_system_too_small_is_refused_with_the_size_that_fits(cli, job, short):
    """Preflight (`config validate`, `job run`, `manifest`): FSX_STORAGE_GIB below what the job
    keeps is one line naming both sizes and the size that fits, exit 2, before anything is created;
    that size passes."""
    fits = cluster(job).fsx_storage_gib
    need = volume.need(cluster(job)).total
    # a size FSx takes (1200, 2400, n x 2400: settings/rules.py SHAPES) that is too small
    smaller = [s for s in (1200, *range(2400, fits, 2400)) if s * GIB * volume.FILL_AT_MOST < need]
    if not smaller:
        return  # only a few MB to keep: any size holds it
    given_gib = smaller[-min(short, len(smaller))]
    r = invoke(*sets(cluster_env(job, given_gib)), "config", "validate")
    assert r.exit_code == 2, r.output
    line = next(x for x in r.output.splitlines() if "FSX_STORAGE_GIB=" in x)
    assert f"FSX_STORAGE_GIB={given_gib} " in line and f"set FSX_STORAGE_GIB={fits} " in line
    assert "Traceback" not in r.output
    ok = invoke(*sets(cluster_env(job, fits)), "config", "validate")
    assert ok.exit_code == 0, ok.output


def sets(values: dict[str, str]) -> list[str]:
    return [a for k, v in values.items() for a in ("--set", f"{k}={v}")]


def cluster_env(job: dict[str, str], gib: int) -> dict[str, str]:
    token = {"HF_TOKEN": "hf_" + "x" * 34} if job.get("PRETRAINED") else {}
    return {
        **EKS,
        "JOB_NODES": "16",
        "NODE_COUNT": "16",
        **job,
        **token,
        "FSX_STORAGE_GIB": str(gib),
    }


def test_the_stop_grace_follows_the_file_systems_aggregate_throughput():
    """Issue 27, defect 6: FSx's throughput is the file system's, capacity x
    PerUnitStorageThroughput, for all nodes at once: 1200 GiB at 250 MB/s/TiB is ~293 MB/s. The old
    grace assumed 500 MB/s per node (8 GB/s for 16 nodes) and gave a 70B job 248 s for a save that
    takes ~47 minutes on such a file system; torchrun's SIGKILL would have cut every stop
    checkpoint."""
    cfg = cluster(
        {"MODEL": "70b"}, FSX_STORAGE_GIB="1200"
    )  # --force's case: the user kept the old size
    rate = volume.write_rate(cfg)
    assert 292e6 < rate < 294e6
    save_s = 12 * MODEL_CONFIGS["70b"].num_params() / rate
    assert 2800 < save_s < 2850
    timing = jobpolicy.stop_timing(cfg)
    assert timing.shutdown_s >= 2 * save_s and timing.grace_s > timing.shutdown_s
    job = render.render_job(cfg, "r")[-1]
    pod = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] == str(timing.shutdown_s)
    assert pod["terminationGracePeriodSeconds"] == timing.grace_s


@settings(max_examples=30, deadline=None, derandomize=True)
@given(
    nodes=st.sampled_from([2, 4, 8, 16]),
    size=st.sampled_from([1200, 2400, 4800, 9600]),
    per_tib=st.sampled_from([125, 250, 500, 1000]),
)
def test_a_save_takes_the_checkpoint_over_the_aggregate_rate_whatever_the_node_count(
    nodes, size, per_tib
):
    cfg = cluster({"MODEL": "13b"}, JOB_NODES=str(nodes), FSX_STORAGE_GIB=str(size),
                  FSX_THROUGHPUT_PER_TIB=str(per_tib))  # fmt: skip
    expected = 12 * MODEL_CONFIGS["13b"].num_params() / (size / 1024 * per_tib * 1e6)
    assert volume.save_seconds(cfg) == pytest.approx(expected)
    assert jobpolicy.stop_timing(cfg).expected_s >= expected


def test_a_save_slower_than_the_interval_it_protects_is_warned(cli):
    """7B on the default 1200 GiB: a save of ~75 GiB at ~293 MB/s takes ~276 s, while 10 steps of ~1
    s are what it protects; `config validate` warns with the interval that would not (exit 0: a
    choice, not an error), `plan` says the same, and an interval long enough or saving only at the
    end says nothing. A run shorter than that interval is told to save only at its end."""
    job = {**EKS, "MODEL": "7b", "CHECKPOINT_INTERVAL": "10", "MAX_STEPS": "1000"}
    r = cli.run("config", "validate", env={f"FSDPCTL_{k}": v for k, v in job.items()})
    assert r.exit_code == 0, r.output
    [warning] = [line for line in r.output.splitlines() if "CHECKPOINT_INTERVAL=10" in line]
    assert warning.startswith("warning: ") and "longer than the" in warning
    cfg = load(dotenv=job)
    step_s = jobpolicy.step_seconds(cfg)
    enough = math.ceil(volume.save_seconds(cfg) / step_s)
    assert f"set CHECKPOINT_INTERVAL={enough} or more" in warning
    assert volume.interval_warning(load(dotenv={**job, "CHECKPOINT_INTERVAL": str(enough)}),
                                   step_s) is None  # fmt: skip
    assert (
        volume.interval_warning(load(dotenv={**job, "CHECKPOINT_INTERVAL": "0"}), step_s) is None
    )  # at the end only
    short = volume.interval_warning(load(dotenv={**job, "MAX_STEPS": "100"}), step_s)
    assert short and short.endswith(
        "set CHECKPOINT_INTERVAL=0 (a save only at MAX_STEPS=100 and on a stop), or a faster file system"
    )
    plan = cli.run("plan", "--model", "7b", "-o", "json", env={"FSDPCTL_CHECKPOINT_INTERVAL": "10"})
    import json

    v = json.loads(plan.stdout)["volume"]
    assert v["warning"] and v["fits"] and v["save_s"] == pytest.approx(volume.save_seconds(cfg))


README_FIRST_JOB = {"JOB_NAME": "first", "JOB_NODES": "2", "MAX_STEPS": "60", "PRECISION": "fp32",
                    "CHECKPOINT_INTERVAL": "10"}  # fmt: skip


@pytest.mark.parametrize("backend", ["eks", "slurm", "local"])
def test_the_readmes_first_job_gets_no_warning_on_any_backend(cli, backend):
    """Issue 38, item 7: with the README's "Your first own job" settings (the tiny model, a save every
    10 steps) every Slurm and EKS command warned "each save ... takes about 0 s ... longer than the 0
    s of training it protects: set CHECKPOINT_INTERVAL=682". A tiny model's save is ~0.04 s at the
    default FSx rate, under a second, where the planner's step (no launch or collective latency)
    and the save's rate (no metadata or fsync latency) say nothing about which is longer: no
    warning, and none about the assumed rate either."""
    env = {f"FSDPCTL_{k}": v for k, v in {**README_FIRST_JOB, "BACKEND": backend}.items()}
    if backend == "eks":
        env["FSDPCTL_AWS_ACCOUNT_ID"] = "123456789012"
    if backend == "slurm":  # the cluster's shared file system, mounted here (job run needs it)
        (cli.cwd / "fsx").mkdir()
        env["FSDPCTL_SHARED_VOLUME_PATH"] = str(cli.cwd / "fsx")
    r = cli.run("config", "validate", env=env)
    assert r.exit_code == 0, r.output
    assert "warning" not in r.output, r.output


SHOWN = re.compile(
    r"^CHECKPOINT_INTERVAL=(?P<interval>\d+): each save of (?P<size>[\d.]+ [MG]iB) takes about "
    r"(?P<save>[\d.,e-]+) s at (?P<rate>[\d,]+) MB/s \((?P<basis>.+)\), longer than the "
    r"(?P<train>[\d.,e-]+) s of training it protects \((?P=interval) steps of (?P<step>[\d.,e-]+) s\): "
    r"set CHECKPOINT_INTERVAL=(?P<fix>\d+)(?P<rest>.*)$"
)


def _number(text: str) -> float:
    return float(text.replace(",", ""))


def _shown_near(shown: str, value: float) -> bool:
    """`shown` is events.seconds_text(value): whole seconds from 10, a tenth from 1, two significant
    digits below."""
    x = _number(shown)
    return abs(x - value) <= (0.5 if value >= 10 else 0.05 if value >= 1 else 0.05 * value + 1e-12)


intervals = st.one_of(st.just(0), st.integers(1, 20), st.integers(21, 5000))


@settings(max_examples=120, deadline=None, derandomize=True)
@given(
    backend=st.sampled_from(["eks", "slurm", "local"]),
    model=st.sampled_from(["tiny", "7b", "13b", "70b"]),
    nodes=st.sampled_from([1, 2, 4, 8, 16, 32]),
    interval=intervals,
    max_steps=st.sampled_from([60, 1000, 100000]),
    per_tib=st.sampled_from(["125", "250", "500", "1000"]),
    mbps=st.sampled_from(["0", "0", "1", "40", "2000", "100000"]),
)
def test_the_interval_warning_is_shown_exactly_when_true_with_its_numbers(
    backend, model, nodes, interval, max_steps, per_tib, mbps
):
    """Over models, node counts, intervals, backends and write rates: the warning is shown exactly
    when a save (at least a second long, MATERIAL_SAVE_S) takes longer than the CHECKPOINT_INTERVAL
    steps of training it protects, on GPUs (the planner's step time; CPU steps are not estimated).
    When shown, its numbers are the ones computed, none of them shown as 0: the save longer than
    the training, the rate and where it comes from (SHARED_VOLUME_WRITE_MBPS, FSx's size x
    throughput where fsdpctl sizes it, or an assumption said as such on Slurm), and an interval
    that would not be warned about (the fewest steps as long as a save), or saving only at the end
    when no interval within MAX_STEPS is."""
    job = {
        **EKS,
        "BACKEND": backend,
        "MODEL": model,
        "JOB_NODES": str(nodes),
        "NODE_COUNT": str(nodes),
        "CHECKPOINT_INTERVAL": str(interval),
        "MAX_STEPS": str(max_steps),
        "FSX_THROUGHPUT_PER_TIB": per_tib,
        "SHARED_VOLUME_WRITE_MBPS": mbps,
    }
    cfg = load(dotenv=job)
    step_s = jobpolicy.step_seconds(cfg)
    warning = volume.interval_warning(cfg, step_s)
    save_s, train_s = volume.save_seconds(cfg), interval * step_s
    true = bool(cfg.target.gpus and interval and save_s > train_s and save_s >= 1)
    assert (warning is not None) == true, (warning, save_s, train_s)
    event("warned" if warning else "quiet")
    if warning is None:
        return
    m = SHOWN.match(warning)
    assert m, warning
    save, train, step = (_number(m[k]) for k in ("save", "train", "step"))
    assert 0 < train <= save and step > 0
    assert _shown_near(m["save"], save_s) and _shown_near(m["train"], train_s)
    assert _shown_near(m["step"], step_s)
    r = volume.rate(cfg)
    assert int(m["interval"]) == interval and _number(m["rate"]) == round(r.mb_per_s)
    if mbps != "0":
        assert m["basis"] == f"SHARED_VOLUME_WRITE_MBPS={mbps}"
    elif backend == "slurm":
        assert m["basis"].startswith("assumed: SHARED_VOLUME_WRITE_MBPS is unset") and r.assumed
    else:
        assert m["basis"].startswith(f"FSX_STORAGE_GIB={cfg.fsx_storage_gib} ") and not r.assumed
    fix = int(m["fix"])
    if fix == 0:
        assert m["rest"].startswith(f" (a save only at MAX_STEPS={max_steps} and on a stop)")
        assert volume.steps_covering(save_s, step_s) >= max_steps
    else:
        assert fix * step_s >= save_s > (fix - 1) * step_s and fix < max_steps
        again = load(dotenv={**job, "CHECKPOINT_INTERVAL": str(fix)})
        assert volume.interval_warning(again, step_s) is None


def test_a_throughput_fsx_does_not_offer_is_refused():
    with pytest.raises(SettingsError) as e:
        load(dotenv={"FSX_THROUGHPUT_PER_TIB": "300"})
    assert e.value.lines == [
        "FSX_THROUGHPUT_PER_TIB=300 (.env) is not a PERSISTENT_2 throughput: use one of 125, 250, 500, 1000 "
        "(MB/s per TiB)"
    ]


@pytest.mark.parametrize(
    ("text", "expected"),
    [("1200Gi", 1200 * GIB), ("4800Gi", 4800 * GIB), ("1Ti", 1024 * GIB), ("500G", 500 * 10**9),
     ("12e3", 12000), ("2Ki", 2048), ("x", None), ("-1Gi", None)],
)  # fmt: skip
def test_quantities_as_apimachinery_reads_them(text, expected):
    """k8s.io/apimachinery pkg/api/resource/quantity.go suffixes: binary Ki..Ei, decimal k..E,
    exponents."""
    assert volume.quantity_bytes(text) == expected


@settings(max_examples=40, deadline=None, derandomize=True)
@given(
    model=st.sampled_from(["tiny", "7b", "13b", "70b"]),
    fsx_gib=st.sampled_from(["1200", "2400", "9600"]),
    per_tib=st.sampled_from(["125", "1000"]),
    mbps=st.sampled_from([0, 50, 1500, 20000]),
)
def test_on_slurm_the_stop_grace_rests_on_the_shared_file_systems_rate(
    model, fsx_gib, per_tib, mbps
):
    """Issue 36, S9. On Slurm the shared file system is the cluster's own at SHARED_VOLUME_PATH
    (HyperPod's, ParallelCluster's), which fsdpctl neither made nor read: FSX_STORAGE_GIB and
    FSX_THROUGHPUT_PER_TIB describe nothing there and do not move the stop grace. With
    SHARED_VOLUME_WRITE_MBPS the save is the checkpoint at that rate; without, at the assumed
    slowest FSx for Lustre SSD file system (1200 GiB x 125 MB/s/TiB, CreateFileSystem's smallest
    size and PERSISTENT_2's lowest PerUnitStorageThroughput), marked as assumed. The grace is torch's
    30 s plus twice the step and the save (TORCH_ELASTIC_SHUTDOWN_TIMEOUT: torch
    launcher/api.py), and the batch script exports that value."""
    from fsdpctl import targets

    job = {
        "BACKEND": "slurm",
        "MODEL": model,
        "JOB_NODES": "16",
        "SHARED_VOLUME_WRITE_MBPS": str(mbps),
    }
    cfg = load(dotenv={**job, "FSX_STORAGE_GIB": fsx_gib, "FSX_THROUGHPUT_PER_TIB": per_tib})
    assert jobpolicy.stop_timing(cfg) == jobpolicy.stop_timing(load(dotenv=job))
    rate = mbps * 1e6 if mbps else 1200 / 1024 * 125 * 1e6
    save_s = 12 * MODEL_CONFIGS[cfg.training.model].num_params() / rate
    timing = jobpolicy.stop_timing(cfg)
    assert volume.save_seconds(cfg) == pytest.approx(save_s)
    assert timing.shutdown_s == 30 + math.ceil(2 * (jobpolicy.step_seconds(cfg) + save_s))
    assert timing.assumed == (mbps == 0) == volume.rate(cfg).assumed
    assert ("assumed: SHARED_VOLUME_WRITE_MBPS is unset" in timing.basis) == (mbps == 0)
    script = targets.resolve(cfg.target.manifest)(cfg, "run-1")
    assert f"export TORCH_ELASTIC_SHUTDOWN_TIMEOUT={timing.shutdown_s}\n" in script


def test_an_assumed_rate_is_said_where_it_sets_the_stop_grace(cli):
    """`config validate` (and `job run`, `manifest`: the same admission) on Slurm names the
    assumption when it matters: a save of at least a second at the assumed rate (7B: ~552 s), with
    the key that replaces it. Not when SHARED_VOLUME_WRITE_MBPS or STOP_GRACE_SECONDS is set, not for
    the tiny model (its save is ~0.08 s whatever the file system), never on EKS, where the rate
    follows from the FSx fsdpctl sizes."""
    shared = cli.cwd / "fsx"  # the cluster's shared file system, mounted here (job run needs it)
    shared.mkdir()
    base = {"MODEL": "7b", "MICRO_BATCH_SIZE": "1", "CHECKPOINT_INTERVAL": "0", "JOB_NODES": "16"}
    base["SHARED_VOLUME_PATH"] = str(shared)

    def lines(**more: str) -> list[str]:
        env = {f"FSDPCTL_{k}": v for k, v in {**base, **more}.items()}
        r = cli.run("config", "validate", "--force", env=env)
        assert r.exit_code == 0, r.output
        return [x for x in r.output.splitlines() if "SHARED_VOLUME_WRITE_MBPS is unset" in x]

    [said] = lines(BACKEND="slurm")
    assert said.startswith(
        "warning: SHARED_VOLUME_WRITE_MBPS is unset: the stop grace counts 552 s"
    )
    assert f"SHARED_VOLUME_PATH={shared}" in said and "set SHARED_VOLUME_WRITE_MBPS" in said
    assert lines(BACKEND="slurm", SHARED_VOLUME_WRITE_MBPS="4000") == []
    assert lines(BACKEND="slurm", STOP_GRACE_SECONDS="900") == []
    assert lines(BACKEND="slurm", MODEL="tiny", MICRO_BATCH_SIZE="2") == []
    assert lines(BACKEND="eks", AWS_ACCOUNT_ID="123456789012") == []

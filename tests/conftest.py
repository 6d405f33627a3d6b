"""Shared fixtures. Peers: real torchrun processes on CPU with gloo; offline assets built by
fsdptrain.assets. Every CLI test goes through the `cli` fixture: fsdpctl in a sealed room (its own
FSDPCTL_HOME and working dir, no setting from the developer's environment, fixed terminal width, no
colour)."""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _shared() -> Path:
    """../shared beside the checkout (FSDPCTL_SHARED overrides). A clone made elsewhere from a local
    checkout (`git clone /work/main /tmp/x`) finds it beside the checkout it was cloned from."""
    if os.environ.get("FSDPCTL_SHARED"):
        return Path(os.environ["FSDPCTL_SHARED"])
    here = ROOT.parent / "shared"
    if here.is_dir():
        return here
    origin = subprocess.run(
        ["git", "-C", str(ROOT), "config", "--get", "remote.origin.url"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    if origin and Path(origin).is_dir() and (Path(origin).resolve().parent / "shared").is_dir():
        return Path(origin).resolve().parent / "shared"
    # a git worktree (`git worktree add /work/wt/x`) finds it beside its main checkout
    common = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--path-format=absolute", "--git-common-dir"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    if common and (Path(common).parent.parent / "shared").is_dir():
        return Path(common).parent.parent / "shared"
    return here


SHARED = _shared()


def slack() -> float:
    """How much slower than idle this machine runs now: its 1-minute load average per core
    (getloadavg(3)), at least 1, at most 4; FSDPCTL_TEST_SLACK sets it. `make test` runs the slow
    lane as two pytest processes beside whatever else the machine does: a deadline fit for an idle
    machine (a daemon's answer, one fuzz case's imports) is too short at load 4 on 2 cores."""
    if os.environ.get("FSDPCTL_TEST_SLACK"):
        return max(1.0, float(os.environ["FSDPCTL_TEST_SLACK"]))
    try:
        per_core = os.getloadavg()[0] / (os.cpu_count() or 1)
    except OSError:
        return 1.0
    return min(4.0, max(1.0, per_core))


def scaled(seconds: float) -> float:
    """A deadline of `seconds` on an idle machine, stretched by `slack()`."""
    return seconds * slack()


@pytest.fixture(scope="session")
def assets(tmp_path_factory):
    from fsdptrain.assets import ensure_assets

    corpus, tok = ensure_assets(tmp_path_factory.mktemp("assets"))
    return corpus, tok


@dataclass
class Run:
    rc: int
    stdout: str
    stderr: str

    @property
    def records(self) -> list[dict]:
        return [
            json.loads(line) for line in self.stdout.splitlines() if line.startswith('{"event"')
        ]

    def events(self, kind: str) -> list[dict]:
        return [r for r in self.records if r["event"] == kind]

    @property
    def summary(self) -> dict:
        found = self.events("summary")
        assert found, (
            f"no summary line; rc={self.rc}\nstdout:\n{self.stdout[-3000:]}\nstderr:\n{self.stderr[-3000:]}"
        )
        return found[0]

    @property
    def losses(self) -> list[float]:
        return [r["loss"] for r in self.events("step")]


def train_env(assets, **settings) -> dict:
    corpus, tok = assets
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("FSDP", "PET_", "TORCHELASTIC"))
    }
    # fp32 unless a test asks for another precision: bf16 matmuls are 3-4x slower on CPUs without
    # bf16 units
    env.update(
        DATASET=str(corpus),
        TOKENIZER=str(tok),
        MODEL="tiny",
        SEQ_LEN="64",
        MICRO_BATCH_SIZE="2",
        WARMUP_STEPS="3",
        LR="3e-3",
        PRECISION="fp32",
        PYTHONUNBUFFERED="1",
    )
    env.update({k: str(v) for k, v in settings.items()})
    return env


def torchrun_argv(nproc: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        "-m",
        "fsdptrain",
    ]


def torchrun(assets, nproc: int = 2, timeout: int = 300, **settings) -> Run:
    """A real multi-process torchrun of the trainer (CPU, gloo)."""
    p = subprocess.run(
        torchrun_argv(nproc),
        env=train_env(assets, **settings),
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )
    return Run(p.returncode, p.stdout, p.stderr)


# ---- the isolated CLI ------------------------------------------------------------------------------------

# the installed console script (what a user runs); `python -m fsdpctl.cli` where the venv has no
# scripts
FSDPCTL_EXE = Path(sys.executable).parent / "fsdpctl"
# machine facts and test switches that may stay; every other FSDPCTL_* variable changes what the CLI
# does
KEEP_FSDPCTL_VARS = (
    "FSDPCTL_SHARED",
    "FSDPCTL_TF_PLUGIN_DIR",
    "FSDPCTL_CHECKOV",
    "FSDPCTL_TEST_",
    "FSDPCTL_UPDATE_",
)
COLUMNS = 200  # wide enough that no error line wraps; click's help still wraps at its own 80


def prefixed(settings: dict[str, str]) -> dict[str, str]:
    """Settings as the environment gives them to fsdpctl: FSDPCTL_<KEY> (it reads no plain name but
    HF_TOKEN, AWS_REGION and AWS_PROFILE, whose own tools share them)."""
    return {f"FSDPCTL_{key}": str(value) for key, value in settings.items()}


def _import_the_cli_at_the_fixed_width() -> None:
    """fsdpctl's rich consoles are made when fsdpctl.cli is first imported and keep the width they
    found then (in a pytest-xdist worker: 80, whatever the fixture sets later). Import it here,
    before any test module can, under the fixed width: the same wrapping for every test, alone, in
    any order, in parallel."""
    saved = {key: os.environ.get(key) for key in ("COLUMNS", "NO_COLOR")}
    os.environ.update(COLUMNS=str(COLUMNS), NO_COLOR="1")
    try:
        import fsdpctl.cli  # noqa: F401
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


_import_the_cli_at_the_fixed_width()


@dataclass
class CliResult:
    exit_code: int
    stdout: str
    stderr: str
    output: str  # both streams as a terminal shows them
    exception: BaseException | None = field(default=None, repr=False)

    @property
    def said(self) -> str:
        """The output with runs of whitespace (rich's wrapping) folded to one space."""
        return " ".join(self.output.split())


def invoke(*args: str, input: str | None = None, catch_exceptions: bool = False) -> CliResult:
    """fsdpctl in this process through click's runner (stdout and stderr apart). An exception
    fsdpctl does not turn into an exit code fails the test, unless catch_exceptions. Isolated only
    under the `cli` fixture."""
    from typer import testing

    from fsdpctl.cli import app
    from fsdpctl.redact import forget

    forget()  # each run starts as a new process would: no secret remembered from an earlier one
    testing._get_command = _command  # type: ignore[attr-defined]
    r = testing.CliRunner().invoke(
        app, list(args), input=input, catch_exceptions=catch_exceptions, prog_name="fsdpctl"
    )
    return CliResult(r.exit_code, r.stdout, r.stderr, r.output, r.exception)


_COMMANDS: dict[int, tuple[object, object]] = {}


def _command(app):
    """typer's click command for `app`, built once per worker as a real `fsdpctl` process builds it
    once: typer builds it again on every CliRunner.invoke (the parameters of ~30 commands from their
    signatures), which was most of the CPU of a short in-process command."""
    import typer.main

    if id(app) not in _COMMANDS:
        _COMMANDS[id(app)] = (app, typer.main.get_command(app))
    return _COMMANDS[id(app)][1]


class Cli:
    """The runner the `cli` fixture returns: `cli(*args)` in process, `cli.run(*args)` /
    `cli.popen(*args)` as the real `fsdpctl` executable (a separate process, as from another
    terminal)."""

    def __init__(self, home: Path, cwd: Path) -> None:
        self.home, self.cwd = home, cwd

    def __call__(
        self, *args: str, input: str | None = None, catch_exceptions: bool = False
    ) -> CliResult:
        return invoke(*args, input=input, catch_exceptions=catch_exceptions)

    def argv(self, *args: str) -> list[str]:
        exe = [str(FSDPCTL_EXE)] if FSDPCTL_EXE.exists() else [sys.executable, "-m", "fsdpctl.cli"]
        return [*exe, *args]

    def env(self, **extra: str) -> dict[str, str]:
        """The isolated environment (the fixture already cleaned os.environ) plus `extra`."""
        return {**os.environ, **extra}

    def run(self, *args: str, env: dict[str, str] | None = None, timeout: float = 120) -> CliResult:
        p = subprocess.run(
            self.argv(*args),
            env=self.env(**(env or {})),
            cwd=self.cwd,
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
        return CliResult(p.returncode, p.stdout, p.stderr, p.stdout + p.stderr)

    def popen(self, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
        return subprocess.Popen(
            self.argv(*args),
            env=self.env(**(env or {})),
            cwd=self.cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
            preexec_fn=_terminal_signals,
        )


def _terminal_signals() -> None:
    """In the child before exec: SIGINT and SIGQUIT as a terminal's foreground job has them. A shell without
    job control (`cmd &`, a test run started in the background) starts its children with both ignored (POSIX
    2.11 Signals and Error Handling), exec keeps an ignored signal ignored, and CPython then installs no
    KeyboardInterrupt handler: the Ctrl-C test waited out its 60 s on a process that could not see the
    signal (reproduced: `(pytest -k ctrl_c_on_a_real &)` fails without this, passes with it)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)


def isolate(monkeypatch: pytest.MonkeyPatch, root: Path) -> Cli:
    """Seal fsdpctl off from this machine's user: FSDPCTL_HOME=root/home
    (XDG_STATE_HOME=root/state), cwd=root (so the only .env is one the test writes), no settings key
    or FSDPCTL_ENV_FILE from the environment, no colour, a fixed width, and a KUBECONFIG that does
    not exist (never a developer's real cluster)."""
    from fsdpctl.settings import setting_keys

    for key in setting_keys():
        monkeypatch.delenv(key, raising=False)
    for key in list(os.environ):
        if key.startswith("FSDPCTL_") and not key.startswith(KEEP_FSDPCTL_VARS):
            monkeypatch.delenv(key)
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.setenv("COLUMNS", str(COLUMNS))
    monkeypatch.setenv("LINES", "50")
    monkeypatch.setenv("FSDPCTL_HOME", str(root / "home"))
    # where a test unsets FSDPCTL_HOME, the default (XDG_STATE_HOME/fsdpctl) is still under root:
    # never the user's real ~/.local/state
    monkeypatch.setenv("XDG_STATE_HOME", str(root / "state"))
    monkeypatch.setenv("KUBECONFIG", str(root / "no-kubeconfig"))
    monkeypatch.chdir(root)
    return Cli(root / "home", root)


@pytest.fixture
def cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Cli:
    """An isolated fsdpctl: see `isolate`. Returns the runner (in process, or the real executable)."""
    return isolate(monkeypatch, tmp_path)


@pytest.fixture(scope="session")
def moto_server():
    """AWS stand-in: moto in server mode on 127.0.0.1, spoken to over HTTP by real boto3 /
    terraform."""
    from fsdpctl.adapters.etcd import free_port

    port = free_port()
    exe = Path(sys.executable).parent / "moto_server"
    proc = subprocess.Popen(
        [str(exe), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    for _ in range(100):
        try:
            urllib.request.urlopen(url + "/moto-api/", timeout=1)
            break
        except OSError:
            time.sleep(0.1)
    yield url
    proc.terminate()
    proc.wait(10)


@pytest.fixture
def aws_env(moto_server, cli, monkeypatch):
    """A clean moto (state reset), fake credentials, on the isolated CLI (the `cli` fixture)."""
    urllib.request.urlopen(urllib.request.Request(moto_server + "/moto-api/reset", method="POST"))
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_server)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    return moto_server


def fsdpctl_process(
    *args: str, env: dict[str, str], timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """The real executable as from another terminal, in FSDPCTL_HOME, with no standard input."""
    return subprocess.run(
        [sys.executable, "-m", "fsdpctl.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=env["FSDPCTL_HOME"],
        stdin=subprocess.DEVNULL,
    )


# The slow lane (`make test`) runs as two pytest processes at once: every slow test one at a time
# ("slow and not beside": the multi-process runs keep their own timing, as alone), and beside them
# these modules' slow tests, which wait on docker, terraform, moto or endpoints that never answer,
# or run fsdpctl in process on one core (CI's slow lane took 26 min serially on 2 cores).
SLOW_BESIDE = frozenset(
    {
        "test_image",
        "test_terraform",
        "test_fsx",
        "test_cluster_delete",
        "test_silent_endpoints",
        "test_untrusted_state",
        "test_fuzz",
        "test_disruption_budget",
        "test_ownership_slurm",
        # issue 42's and 44's generated cells, out of the fast lane (2 minutes): peers in process,
        # real supervisors and fsdpctl processes, nothing that needs the machine to itself
        "test_ownership_local",
        "test_ownership_eks",
        "test_ownership_files",
        "test_cli_imports",
        "test_submit_once",
        "test_wait_for",
    }
)


# modules whose every test, the quick ones too, leaves the fast lane for the beside lane: the fast
# lane's heaviest modules in process (moto's server, generated settings values and hostile files,
# volume sizing, FSx requests: 180 s of its ~590 s of test time at load 4), which kept `make
# test-fast` over 2 minutes on CI's machine; beside the serial slow lane they cost CI no minute.
# CI's run of c5a2921 still took 143 s: the next heaviest (the Kubernetes API peer's verbs and waits,
# moto's answers, closed and full streams: 100 s of the 420 s of test time, one process at load 6),
# which mostly wait on their peers' processes
WHOLLY_BESIDE = frozenset(
    {
        "test_aws",
        "test_value_shapes",
        "test_volume",
        "test_untrusted_state",
        "test_fsx",
        "test_kube",
        "test_kube_peer",
        "test_aws_shapes",
        "test_disruption_budget",
        "test_output_streams",
        # CI's run of fa80c05: the fast lane took 123 s, of which about 90 s per worker in tests and
        # the rest each worker's collection; these six (in process: rendering, generated settings,
        # moto's EC2, scripts; 37 s of its 180 s of test time) leave it too
        "test_scheduling",
        "test_backends",
        "test_slurm_script",
        "test_set_anywhere",
        "test_existing_vpc",
        "test_env_prefix",
    }
)


def pytest_ignore_collect(collection_path, config):
    """In the fast lane (`-m "not slow"`), the modules whose every test is slow are not even
    imported: each xdist worker collects every module it is given, and their imports (moto,
    boto3, the API peers) cost each worker seconds for tests it would deselect."""
    if config.getoption("markexpr", "") == "not slow" and collection_path.stem in WHOLLY_BESIDE:
        return True
    return None


# slow tests CI leaves to `make test-all` (marked `extended`): each repeats a class the conformance
# suite (tests/conformance) plays on every backend in CI, on a path of its own that costs minutes; CI's
# 40 minutes hold the conformance cells instead (docs/testing.md "What CI runs")
EXTENDED = frozenset(
    {
        # a killed node resumed exactly: test_paths' "killed node" cell on local, EKS and Slurm
        "tests/test_faults.py::test_sigkill_of_a_worker_restarts_the_group_and_resumes_exactly",
        "tests/test_stop_and_restarts.py::test_a_killed_node_is_recreated_and_the_job_resumes",
        "tests/test_kube_peer_operator.py::test_a_killed_pod_is_recreated_and_the_job_resumes",
        # issue 43: node 0 lost on etcd-v2, the rendezvous an EKS range uses (real etcd, torchrun)
        "tests/test_elastic_eks.py::test_node_0_lost_on_the_etcd_v2_rendezvous_is_any_nodes_loss",
        # on the API peer's cluster: node 0 and a non-store node lost (its [node 0] and [non-store
        # node] cells), and a drain of one node with real training
        "tests/test_elastic_eks.py::test_on_the_peer_cluster_node_0_lost_trains_on_and_grows_back",
        "tests/test_elastic_eks.py::test_on_the_peer_cluster_a_drain_of_one_node_trains_on_at_the"
        "_minimum_and_grows_back",
        "tests/test_slurm_backend.py::test_a_two_node_job_trains_requeues_after_a_node_failure_resumes"
        "_and_stops",
        # the batch host's slurmd killed (the Slurm cell kills the second node's)
        "tests/test_slurm_paths.py::test_a_killed_slurmd_requeues_once_and_the_run_resumes_with_exact"
        "_losses",
        # issue 43 on Slurm: the batch host lost (requeued onto the nodes that are up) and a stop
        # during the re-rendezvous with the node back; the lost non-batch node stays in CI
        "tests/test_slurm_elastic.py::test_the_batch_host_lost_requeues_onto_the_nodes_that_are_up"
        "_resharded",
        "tests/test_slurm_elastic.py::test_a_stop_during_the_re_rendezvous_and_the_node_back_for_the"
        "_next_run",
        "tests/test_slurm_elastic.py::test_the_node_back_grows_the_next_run_to_every_node_resharded",
        # the GPU check's rehearsal on CPU: the script a GPU session runs, not the product
        "tests/test_gpu_check.py::test_a_cpu_rehearsal_runs_every_row",
        # a worker and then the supervisor SIGKILLed, a save killed until the budget is spent, on real
        # training: the fault kinds on launchers that behave as torchrun's stay in CI, and the local
        # cells "killed node" and "controller gone" play the real-training kills
        "tests/test_fault_kinds.py::test_fault_kinds_on_real_training",
        # the quickstart on two nodes: test_first_hour.py runs `make quickstart` itself, in CI
        "tests/test_cli.py::test_quickstart_trains_two_simulated_nodes",
        # the first hour on a busy machine (4 spinning processes): the same walkthrough as CI's, twice
        # as long
        "tests/test_first_hour.py::test_the_readme_first_hour_on_a_busy_machine",
        # the legacy `etcd` rendezvous through every verb (90-130 s): etcd's path stays in CI with a
        # restart of etcd during the rendezvous (test_faults.py)
        "tests/test_cli.py::test_detached_job_over_real_etcd_status_logs_stop_and_resume",
        # the cluster peer's job trains with the local backend's losses (CI keeps its stop and resume
        # there, on real training: test_a_stopped_job_resumes_with_the_losses_of_a_run_never_stopped)
        "tests/test_kube_peer_operator.py::test_a_job_trains_on_the_cluster_with_the_local_backends"
        "_losses",
        # CI's run of 1c2f8c4 took 45 minutes: these 30-40 s cells repeat a class CI keeps elsewhere.
        # A killed node back with every rank at one step: test_paths' local killed-node cell
        "tests/test_pods.py::test_a_killed_node_comes_back_and_every_rank_resumes_from_the_same_step",
        # the peer's own node failure and requeue: Slurm's elastic cell powers a node off in CI
        "tests/test_slurm_peer.py::test_a_killed_node_goes_down_its_requeue_job_runs_again_and_the"
        "_other_fails",
        # the CPU levers' losses: each lever has its fast test, and the walkthrough's rerun is exact
        "tests/test_levers.py::test_cpu_levers_together_give_the_default_losses",
        # a rerun's same losses and diff: test_walkthrough's golden reruns and diffs bit for bit
        "tests/test_record_runs.py::test_a_rerun_from_the_record_trains_the_same_losses_and_diff_names"
        "_the_one_changed_setting",
        # CI's run of c5a2921 took 40.5 minutes. HSDP on two ranks (a mesh of one replica): the real
        # 2x2 mesh on four processes stays in CI (test_hybrid_shard_2x2_on_four_processes)
        "tests/test_trainer.py::test_each_strategy_trains_and_loss_decreases[HYBRID_SHARD]",
        # CI's run of fa80c05 took 40.4 minutes (serial lane 2,046 s): a full volume at a save is
        # test_lifecycle's "full volume" case and test_volume_resume's refusal, in CI; the memory
        # estimate of HSDP on one node is FULL_SHARD's, whose cell stays
        "tests/test_faults.py::test_disk_full_during_a_checkpoint_is_a_clear_error",
        "tests/test_trainer.py::test_plan_memory_estimate_matches_the_measured_allocation[HYBRID_SHARD]",
    }
)

# mostly a person's pauses (the first hour typed at a reading pace): beside the others, as SLOW_BESIDE
PAUSED = frozenset(
    {
        "tests/test_first_hour.py::test_the_readme_first_hour_in_a_fresh_clone",
        "tests/test_first_hour.py::test_the_readme_first_hour_on_a_busy_machine",
    }
)


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects: it reads the `beside` mark added here
def pytest_collection_modifyitems(config, items):
    """The `beside` mark (SLOW_BESIDE), and for `--dist loadgroup` in the fast lane: the tests that
    build the offline assets (tokenizers, transformers, torch) meant to share one worker, and so the
    ones on the moto server. (xdist 3.8 writes the group into `item._nodeid`, which pytest 9.2 no
    longer reads, so today the groups do not hold and each worker pays those start-ups; the fast
    lane stays under 2 minutes anyway.)"""
    for item in items:
        module = item.module.__name__.rpartition(".")[2]
        if module in WHOLLY_BESIDE:
            item.add_marker(pytest.mark.slow)
        if module in SLOW_BESIDE | WHOLLY_BESIDE or item.nodeid in PAUSED:
            item.add_marker(pytest.mark.beside)
        in_ci = getattr(item.module, "IN_CI", None)  # a module that says which of its cells CI runs
        if {item.nodeid, item.nodeid.partition("[")[0]} & EXTENDED or (
            in_ci is not None and not in_ci(item)
        ):
            item.add_marker(pytest.mark.extended)
        if "assets" in item.fixturenames:
            item.add_marker(pytest.mark.xdist_group("torch"))
        elif "moto_server" in item.fixturenames:
            item.add_marker(pytest.mark.xdist_group("moto"))


@functools.cache
def yaml_docs(path: Path) -> tuple:
    """The non-empty documents of a YAML file, parsed once per worker with libyaml: the vendored
    CRDs are megabytes, seconds of CPU each for the pure-Python parser."""
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return tuple(d for d in yaml.load_all(path.read_text(), Loader=loader) if d)


def logged_events(json_lines: str) -> list:
    """The trainer's events in `fsdpctl job logs -o json` output (one object per log line; an event
    line's object holds the event under "event"): plain `job logs` shows human lines, not the JSON
    ones."""
    from fsdptrain import events

    objs = [json.loads(line) for line in json_lines.splitlines() if line.strip()]
    return list(
        events.parse(json.dumps(o["event"]) for o in objs if isinstance(o.get("event"), dict))
    )


# ---- nothing a test run started outlives it ------------------------------------------------------
#
# A test's own teardown stops what it started; this is the net under it. Every process this run
# starts inherits RUN_MARK (a fresh id per pytest controller; xdist workers inherit the controller's),
# and so do the processes Slurm starts for a batch job (sbatch --export=ALL: the script, its srun
# and tasks) though slurmstepd is no child of the test's. At the end of the run, any process still
# carrying this run's mark is listed and killed (CI once found a killed-node cell's batch script and
# srun running 30 minutes after the run, their cluster gone).
RUN_MARK = "PYTEST_FSDPCTL_RUN"


def pytest_configure(config):
    if not hasattr(config, "workerinput"):  # the controller: workers inherit its environment
        os.environ[RUN_MARK] = os.urandom(8).hex()


def pytest_unconfigure(config):
    if hasattr(config, "workerinput") or not (mark := os.environ.get(RUN_MARK)):
        return
    left = outliving(mark)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if left:
        names = ", ".join(f"{pid} ({left[pid]})" for pid in sorted(left))
        sys.stderr.write(f"\nwarning: {len(left)} processes outlived the tests, killed: {names}\n")


def _ancestors() -> set[int]:
    found, pid = set(), os.getpid()
    while pid > 1:
        found.add(pid)
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            break
    return found


def outliving(mark: str) -> dict[int, str]:
    """pid -> command line of every living process (not this one or its ancestors) that carries
    this run's mark in its environment."""
    want = f"{RUN_MARK}={mark}".encode()
    mine, found = _ancestors(), {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in mine:
            continue
        try:
            if want not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            state = (entry / "stat").read_text().rsplit(") ", 1)[1][0]
            argv = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, IndexError):
            continue
        if state != "Z":
            found[int(entry.name)] = argv.strip()[:80]
    return found


def pytest_runtest_logreport(report):
    """Each test phase's seconds appended to $FSDPCTL_TEST_TIMES as it ends (`make test`'s lanes
    print only the slowest at their end: a lane cut short, or one being trimmed under CI's 40
    minutes, is read from this file while it runs)."""
    where = os.environ.get("FSDPCTL_TEST_TIMES")
    if where and getattr(report, "node", None) is None:  # not xdist's controller's copy again
        with open(where, "a", encoding="utf-8") as f:
            f.write(f"{report.duration:.1f}\t{report.when}\t{report.outcome}\t{report.nodeid}\n")

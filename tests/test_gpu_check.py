"""benchmarks/gpu_check.sh on a machine without a GPU (CI): it refuses in one line with exit 2, its
bash parses, its python half imports without torch, and the parts that read the trainer's output and
write the table are checked with fixed and generated records.

The trainer's side is the real one: its JSON event lines (fsdptrain.events.Step / Checkpoint, as
`fsdptrain.events.as_record` writes them) and its `python -m fsdptrain --help` text (argparse, built
by fsdptrain.config.from_sources)."""

from __future__ import annotations

import importlib.util
import json
import os
import random
import re
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from fsdptrain import events as E
from fsdptrain.config import from_sources
from fsdptrain.shapes import MODEL_CONFIGS, ModelShape

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "gpu_check.sh"


def _module():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "benchmarks" / "gpu_check.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


G = _module()

# The Python distributions of the GPU machine's image (nvidia-h200, 'cuda'), as the device library
# listed them on 2026-11-17 (/work/.library/device/KINDS.md, "Python packages already there";
# nothing can be fetched there): what gpu_check.sh may import without carrying a wheel. `datasets`
# is not among them.
GPU_MACHINE_PACKAGES = frozenset(
    """
    absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build
    certifi charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings
    cuda-core cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils
    execnet filelock flatbuffers flax fonttools formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet
    httpcore httpx huggingface-hub humanize hypothesis idna imageio iniconfig interface-meta jax
    jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib kiwisolver lazy-loader lightning
    lightning-utilities linear-operator lineax llvmlite lxml markdown markdown-it-py markupsafe matplotlib
    mdurl meson ml-dtypes mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind
    narwhals networkx ninja numba numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti
    nvidia-cuda-nvrtc nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand
    nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13 nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink
    nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime onnxscript opencv-python-headless optax
    opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec patsy peft pillow pip
    pluggy portalocker prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments
    pyparsing pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout
    pytest-xdist python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu safetensors
    scikit-build-core scikit-image scikit-learn scipy seaborn sentencepiece sentence-transformers
    setuptools shellingham simplejson six sortedcontainers statsmodels sympy tabulate tensorboard
    tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm tokenizers toolz torch
    torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm transformers treescope triton
    typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel wrapt xarray xxhash
    yarl zipp
    """.split()
)


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def gpu_machine_python(tmp: Path) -> Path:
    """A Python with only the GPU machine's packages, the most real peer of that machine's Python
    that runs here: a fresh venv (no pip) whose site-packages links, from this one, each entry that
    a distribution in GPU_MACHINE_PACKAGES owns (by the distributions' RECORD files), so a package
    missing there is missing here too, for torchrun's workers as well (they run sys.executable), and
    an optional import finds nothing, as it would there."""
    import sysconfig
    import venv
    from importlib.metadata import distributions

    from packaging.requirements import Requirement

    here = {_normal(d.metadata["Name"] or ""): d for d in distributions()}
    # what those packages need is there too (their versions there may need other things than ours
    # here)
    allowed, todo = set(), [_normal(n) for n in GPU_MACHINE_PACKAGES]
    while todo:
        name = todo.pop()
        if name in allowed or name not in here:
            continue
        allowed.add(name)
        for text in here[name].requires or []:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(_normal(req.name))
    tops = {file.parts[0] for name in allowed for file in here[name].files or []}
    env = tmp / "gpu-machine-venv"
    venv.create(env, with_pip=False, symlinks=True)
    python = env / "bin" / "python"
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        if entry.name in tops:
            (Path(site) / entry.name).symlink_to(entry)
    return python


def test_bash_syntax():
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)


def test_without_a_gpu_it_exits_2_with_one_line(tmp_path):
    """CI has no GPU (and the CPU build of torch): one line naming the reason, exit 2, nothing else
    run."""
    env = {"PATH": "/usr/bin:/bin", "PYTHON": sys.executable, "GPU_CHECK_DIR": str(tmp_path / "w")}
    p = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=60)
    lines = (p.stdout + p.stderr).strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1, (p.returncode, lines)
    assert "no CUDA GPU" in lines[0]
    assert not (tmp_path / "w").exists()


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["gpu", "probe"])
def test_without_cuda_the_python_probe_exits_2_with_one_line(mode):
    """Where a device node exists but torch sees no GPU (or is the CPU build), the python probe
    refuses."""
    p = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), mode],
        capture_output=True,
        text=True,
    )
    lines = (p.stdout + p.stderr).strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1 and "no CUDA GPU" in lines[0]


def test_the_python_half_imports_without_torch():
    code = f"import runpy, sys; runpy.run_path({str(ROOT / 'benchmarks' / 'gpu_check.py')!r}); "
    code += "print('torch' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "False"


def test_the_script_stays_under_eight_minutes():
    """The hard timeouts in the script add up to less than 8 minutes, and the python budget sits
    inside."""
    limits = [int(x) for x in re.findall(r"^timeout (\d+) ", SCRIPT.read_text(), re.M)]
    assert len(limits) == 2 and sum(limits) < 480
    assert G.BUDGET_S + 20 < limits[1]


def test_every_required_row_fits_the_budget_at_its_expected_time():
    """Rows start only while the budget holds their expected time (x1.1), so a row is never cut
    half-way by the budget (v1's FSDP_PREFETCH=0 'FAIL' was that); at the times they took on the
    H200 every row that is not optional starts, and the optional ones come after all of them."""
    left = G.BUDGET_S
    required = [r for r in G.ROWS if not r.optional]
    assert G.ROWS[: len(required)] == tuple(required)
    for row in required:
        assert left >= row.expect * 1.1, (row.name, left)
        left -= row.expect
        assert row.limit >= 2 * row.expect  # its own timeout leaves room for a slow start
    assert len({r.name for r in G.ROWS}) == len(G.ROWS)


@pytest.mark.parametrize("row", [r for r in G.ROWS if r.mode == "train"], ids=lambda r: r.name)
def test_every_trainer_row_is_a_config_the_trainer_takes(row, monkeypatch):
    """A setting the trainer refuses would turn the row into a FAIL on the GPU and measure nothing:
    each row's settings pass fsdptrain.config's own parsing and validation (with the check's shapes
    registered, for this test only: other tests list the named models)."""
    monkeypatch.setattr("fsdptrain.shapes.MODEL_CONFIGS", dict(MODEL_CONFIGS))
    import fsdptrain.shapes

    G._add_shapes()
    settings = {k: v for k, v in row.settings.items() if k != "RESUME" or v == "never"}
    cfg = from_sources([], environ={**settings, "DATASET": "builtin", "PRECISION": "bf16"})
    assert cfg.model in fsdptrain.shapes.MODEL_CONFIGS


def test_the_throughput_shape_has_7bs_layer():
    s, seven = ModelShape(*G.SHAPE_ARGS), MODEL_CONFIGS["7b"]
    assert s.layer_params() == seven.layer_params() and s.layers < seven.layers
    assert (s.vocab, s.hidden, s.context) == (seven.vocab, seven.hidden, seven.context)


def _steps(n: int, rng: random.Random) -> list[dict]:
    out = []
    for i in range(1, n + 1):
        step = E.Step(
            step=i,
            max_steps=n,
            loss=rng.uniform(1, 10),
            step_time_s=rng.uniform(0.1, 2.0),
            time=float(i),
            tokens_per_s=rng.uniform(1000, 9000),
            mfu=rng.uniform(0.1, 0.6),
            mem_allocated_gib=rng.uniform(1, 100),
        )
        out.append(E.as_record(step))
    return out


@pytest.mark.parametrize("seed", range(8))
def test_measure_takes_medians_and_the_total_time_rate_after_the_warm_steps(seed):
    """Medians (a 583 ms stall among 190 ms steps no longer pulls the figure down, ANALYSIS.md
    section 0), the total-time rate over the same steps (where a stall does count), the first step's
    time, the slowest measured step, and the peak memory of all steps."""
    rng = random.Random(seed)
    recs = _steps(rng.randint(6, 25), rng)
    start = E.as_record(
        E.Start(
            record_id="",
            python="3.12",
            torch="2.11",
            transformers="5",
            cuda="13",
            nccl=None,
            device="cuda",
            start_step=0,
            dataset={},
            tokenizer={},
            time=0.0,
            levers={"compile": "on (COMPILE=auto: on with CUDA)"},
        )
    )
    text = (
        "some human log line\n" + json.dumps(start) + "\n" + "\n".join(json.dumps(r) for r in recs)
    )
    got = G.measure("x", G.events(text + "\nnot json {\n"))
    kept = recs[G.WARM :]
    assert got.status == "ok" and got.levers == {"compile": "on (COMPILE=auto: on with CUDA)"}
    assert got.tokens_per_s == pytest.approx(statistics.median(r["tokens_per_s"] for r in kept))
    tokens = sum(r["tokens_per_s"] * r["step_time_s"] for r in kept)
    assert got.tokens_per_s_total == pytest.approx(tokens / sum(r["step_time_s"] for r in kept))
    assert got.mfu == pytest.approx(statistics.median(r["mfu"] for r in kept))
    assert got.peak_gib == max(r["mem_allocated_gib"] for r in recs)
    assert got.first_step_s == recs[0]["step_time_s"]
    assert got.max_step_ms == pytest.approx(1000 * max(r["step_time_s"] for r in kept))
    assert G.lever_note(got.levers) == "compile on"
    assert G.measure("y", []).status.startswith("FAIL")


def _titan_line(step: int, loss: float, mem: float, tps: float, mfu: float, colour: bool) -> str:
    """torchtitan 0.2.2's step line, as torchtitan/components/metrics.py MetricsProcessor.log
    formats it."""
    c = (lambda code: f"\x1b[{code}m") if colour else (lambda code: "")
    return (
        f"[titan] 2026-12-04 18:50:31,477 - root - INFO - "
        f"{c(31)}step: {step:2}  {c(32)}loss: {loss:8.5f}  {c(33)}grad_norm: {1.2345:7.4f}  "
        f"{c(36)}memory: {mem:5.2f}GiB({100 * mem / 140:.2f}%)  {c(34)}tps: {round(tps):,}  "
        f"{c(96)}tflops: {tps * 12.11e9 / 1e12:,.2f}  {c(35)}mfu: {mfu:.2f}%{c(0)}"
    )


@pytest.mark.parametrize("seed", range(6))
def test_torchtitans_step_lines_become_step_events(seed):
    rng = random.Random(seed)
    colour = seed % 2 == 0
    rows = [
        (i, rng.uniform(2, 11), rng.uniform(0, 139), rng.uniform(10, 99999), rng.uniform(0, 80))
        for i in range(1, rng.randint(2, 30))
    ]
    text = "\n".join(
        ["[titan] ... - root - INFO - Training starts at step 1"]
        + [_titan_line(*r, colour) for r in rows]
        + [
            "[titan] ... - root - INFO - validate step:  3  loss:  7.0000  memory: 1.00GiB(1%)  tps: 5"
        ]
    )
    evs = G.titan_events(text, tokens_per_step=4096)
    assert [e["step"] for e in evs] == [r[0] for r in rows]
    for e, (_, loss, mem, tps, mfu) in zip(evs, rows, strict=True):
        assert e["loss"] == pytest.approx(loss, abs=1e-5) and e[
            "mem_allocated_gib"
        ] == pytest.approx(mem, abs=0.01)
        assert e["tokens_per_s"] == round(tps) and e["mfu"] == pytest.approx(mfu / 100, abs=1e-4)
        assert e["step_time_s"] == pytest.approx(4096 / round(tps))
    assert G.measure("titan", evs, warm=1).status == "ok"


def test_events_read_the_trainers_checkpoint_lines():
    line = json.dumps(E.as_record(E.Checkpoint(step=4, path="/tmp/c/step-4")))
    assert G.events(line) == [json.loads(line)] and G.events(line)[0]["event"] == "checkpoint"


@pytest.mark.parametrize("seed", range(5))
def test_resume_equality_passes_equal_losses_and_fails_any_difference(seed):
    rng = random.Random(seed)
    full = {s: rng.uniform(1, 10) for s in range(1, 9)}
    resumed = {s: full[s] for s in range(5, 9)}
    assert G.resume_equal(full, resumed).startswith("ok")
    bad = dict(resumed)
    bad[rng.randint(5, 8)] *= 1.001
    assert G.resume_equal(full, bad).startswith("FAIL")
    assert G.resume_equal(full, {}).startswith("FAIL")
    assert G.resume_equal(full, {9: 1.0}).startswith("FAIL")


def test_the_table_has_a_row_per_record_and_eight_cells_each():
    records = [
        G.Record(
            "7b-8l trainer defaults",
            "ok (31 s; compile on)",
            12345.6,
            12000.2,
            0.4123,
            31.25,
            7.5,
            120.4,
        ),
        G.Record("7b-8l FLOAT8=true", "skipped: torchao not installed"),
        G.Record("a|b", "FAIL: exit 1: x | y"),
    ]
    md = G.table(records)
    lines = md.strip().splitlines()
    assert len(lines) == 2 + len(records) and all(line.count("|") == 9 for line in lines)
    assert (
        lines[2]
        == "| 7b-8l trainer defaults | 12,346 | 12,000 | 41.2% | 31.2 | 7.5 | 120 | ok (31 s; compile on) |"
    )
    assert (
        lines[3] == "| 7b-8l FLOAT8=true | - | - | - | - | - | - | skipped: torchao not installed |"
    )


@pytest.mark.parametrize("seed", range(6))
def test_the_targets_are_ratios_of_rows_of_the_same_run(seed):
    """Each target of issue 30 is one line: the ratio of two rows measured in this run, met or not,
    or 'not measured' naming the missing row; never a number from elsewhere."""
    rng = random.Random(seed)
    names = [r.name for r in G.ROWS]
    records = [
        G.Record(n, "ok (1 s)" if rng.random() < 0.7 else "FAIL: x", rng.uniform(100, 50000))
        for n in names
        if rng.random() < 0.8
    ]
    lines = G.ratios(records)
    assert len(lines) == 5
    by = {r.config: r.tokens_per_s for r in records if r.status.startswith("ok")}
    for line in lines:
        if "not measured" in line:
            continue
        x = float(re.search(r": ([\d.]+)x", line).group(1))
        assert any(abs(by[a] / by[b] - x) < 1e-3 for a in by for b in by if a != b)
        assert line.endswith("met")


def test_an_unknown_mode_is_refused():
    assert G.main(["nope"]) == 2


def test_torchtitan_flags_run_the_rows_shape_and_checkpointing():
    """The peer's command line (torchtitan 0.2.2 torchtitan/config/job_config.py): the 7b-8l flavor
    the peer registers, batch 1 x SEQ_LEN, STEPS steps, one uncoloured line per step, and the row's
    AC and compile."""
    flags = G.torchtitan_flags({"TITAN_AC": "op"}, Path("/t"), Path("/d"), Path("/o"))
    pairs = dict(zip(flags[::2], flags[1::2], strict=False))
    assert pairs["--model.flavor"] == G.TITAN_FLAVOR and pairs["--training.seq_len"] == str(
        G.SEQ_LEN
    )
    assert pairs["--training.local_batch_size"] == "1" and pairs["--training.steps"] == str(G.STEPS)
    assert "--metrics.disable_color_printing" in flags and "--compile.enable" not in flags
    assert flags[-4:] == [
        "--activation_checkpoint.mode",
        "selective",
        "--activation_checkpoint.selective_ac_option",
        "op",
    ]
    assert "--compile.enable" in G.torchtitan_flags(
        {"TITAN_COMPILE": "1"}, Path("/t"), Path("/d"), Path("/o")
    )


def _carried_wheels(tmp: Path) -> Path | None:
    """benchmarks/gpu_check_wheels.txt's torchtitan and what it needs (not torchao: FLOAT8 needs a
    GPU), installed from PyPI into a folder, as the GPU run installs the carried wheels; None where
    pip cannot."""
    names = [
        line.strip()
        for line in (ROOT / "benchmarks" / "gpu_check_wheels.txt").read_text().splitlines()
        if line.strip() and not line.startswith("#") and not line.startswith("torchao")
    ]
    site = tmp / "carried"
    p = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), *names],
        capture_output=True,
        text=True,
        timeout=300,
    )
    return site if p.returncode == 0 else None


@pytest.mark.slow
def test_a_cpu_rehearsal_runs_every_row(tmp_path):
    """`gpu_check.py all` end to end on the CPU build (GPU_CHECK_REHEARSE=cpu: a 2-layer shape,
    fp32, gloo, compile through aot_eager, real torchrun and the real trainer), in a Python holding
    only the GPU machine's packages (`gpu_machine_python`: it caught every trainer row importing
    `datasets`, which that machine lacks) plus the wheels the GPU run carries
    (benchmarks/gpu_check_wheels.txt, from PyPI): every row but FLOAT8 (GPU only) runs and measures
    tokens/s, torchtitan 0.2.2 included (benchmarks/peers/ torchtitan_peer.py on the CPU), the
    resume row's losses equal, selective without compile falls back to layer-level, and the report
    lands in OUT with the targets' ratios. The GPU path differs only in the shape, bf16, NCCL and
    the compile backend."""
    env = {
        **os.environ,
        "GPU_CHECK_REHEARSE": "cpu",
        "GPU_CHECK_BUDGET_S": "600",
        "OUT": str(tmp_path),
    }
    carried = _carried_wheels(tmp_path)
    if carried is not None:
        env["PYTHONPATH"] = str(carried)
    python = gpu_machine_python(tmp_path)  # `datasets`, pydantic, ... are not there
    p = subprocess.run(
        [python, str(ROOT / "benchmarks" / "gpu_check.py"), "all", str(tmp_path / "w")],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        cwd=ROOT,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    report = (tmp_path / "gpu_check.md").read_text()
    rows = {
        line.split(" | ")[0].strip("| "): line.split(" | ")
        for line in report.split("\n\n")[0].splitlines()[2:]
    }
    statuses = {name: cells[-1].rstrip(" |") for name, cells in rows.items()}
    assert set(rows) == {r.name for r in G.ROWS}
    assert statuses["resume: from step 4 to 8"].startswith("ok (steps 5-8"), statuses
    for row in G.ROWS:
        status = statuses[row.name]
        if row.gpu_only or (row.mode == "titan" and carried is None):
            assert status.startswith("skipped:"), (row.name, status)
            continue
        assert status.startswith("ok"), (row.name, status)
        if not row.name.startswith("resume"):
            assert float(rows[row.name][1].replace(",", "")) > 0, rows[row.name]
    assert "AC every-k" in statuses["7b-8l ACTIVATION_CHECKPOINTING=selective COMPILE=false"]
    assert "compile on, AC selective" in statuses["7b-8l ACTIVATION_CHECKPOINTING=selective"]
    assert "compile on" in statuses["7b-8l trainer defaults"]
    assert "Targets (issue 30)" in report and "- eager selective / eager full: " in report

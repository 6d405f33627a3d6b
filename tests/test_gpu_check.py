"""benchmarks/gpu_check.sh on a machine without a GPU (CI): it refuses in one line with exit 2, its bash
parses, its python half imports without torch, and the parts that read the trainer's output and write the
table are checked with fixed and generated records.

The trainer's side is the real one: its JSON event lines (fsdptrain.events.Step / Checkpoint, as
`fsdptrain.events.as_record` writes them) and its `python -m fsdptrain --help` text (argparse, built by
fsdptrain.config.from_sources)."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import random
import re
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

# The Python distributions of the GPU machine's image (nvidia-h200, 'cuda'), as the device library listed
# them on 2026-11-17 (/work/.library/device/KINDS.md, "Python packages already there"; nothing can be
# fetched there): what gpu_check.sh may import without carrying a wheel. `datasets` is not among them.
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
    """A Python with only the GPU machine's packages, the most real peer of that machine's Python that runs
    here: a fresh venv (no pip) whose site-packages links, from this one, each entry that a distribution in
    GPU_MACHINE_PACKAGES owns (by the distributions' RECORD files), so a package missing there is missing
    here too, for torchrun's workers as well (they run sys.executable), and an optional import finds
    nothing, as it would there."""
    import sysconfig
    import venv
    from importlib.metadata import distributions

    from packaging.requirements import Requirement

    here = {_normal(d.metadata["Name"] or ""): d for d in distributions()}
    # what those packages need is there too (their versions there may need other things than ours here)
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
    """CI has no GPU (and the CPU build of torch): one line naming the reason, exit 2, nothing else run."""
    env = {"PATH": "/usr/bin:/bin", "PYTHON": sys.executable, "GPU_CHECK_DIR": str(tmp_path / "w")}
    p = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=60)
    lines = (p.stdout + p.stderr).strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1, (p.returncode, lines)
    assert "no CUDA GPU" in lines[0]
    assert not (tmp_path / "w").exists()


@pytest.mark.slow
def test_without_cuda_the_python_probe_exits_2_with_one_line():
    """Where a device node exists but torch sees no GPU (or is the CPU build), the python probe refuses."""
    p = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "gpu"], capture_output=True, text=True
    )
    lines = (p.stdout + p.stderr).strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1 and "no CUDA GPU" in lines[0]


def test_the_python_half_imports_without_torch():
    code = f"import runpy, sys; runpy.run_path({str(ROOT / 'benchmarks' / 'gpu_check.py')!r}); "
    code += "print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_the_script_stays_under_eight_minutes():
    """The hard timeouts in the script add up to less than 8 minutes, and the python budget sits inside."""
    limits = [int(x) for x in re.findall(r"^timeout (\d+) ", SCRIPT.read_text(), re.M)]
    assert len(limits) == 2 and sum(limits) < 480
    assert G.BUDGET_S + 20 < limits[1]


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
            step_time_s=1.0,
            time=float(i),
            tokens_per_s=rng.uniform(1000, 9000),
            mfu=rng.uniform(0.1, 0.6),
            mem_allocated_gib=rng.uniform(1, 100),
        )
        out.append(E.as_record(step))
    return out


@pytest.mark.parametrize("seed", range(5))
def test_measure_averages_after_the_warm_steps_and_takes_the_peak_of_all(seed):
    rng = random.Random(seed)
    recs = _steps(rng.randint(5, 15), rng)
    text = "some human log line\n" + "\n".join(json.dumps(r) for r in recs) + "\nnot json {\n"
    got = G.measure("x", G.events(text))
    kept = recs[G.WARM :]
    assert got.status == "ok"
    assert got.tokens_per_s == pytest.approx(sum(r["tokens_per_s"] for r in kept) / len(kept))
    assert got.mfu == pytest.approx(sum(r["mfu"] for r in kept) / len(kept))
    assert got.peak_gib == max(r["mem_allocated_gib"] for r in recs)
    assert G.measure("y", []).status.startswith("FAIL")


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


def test_the_table_has_a_row_per_record_and_five_cells_each():
    records = [
        G.Record("7b-8l baseline", "ok (31 s)", 12345.6, 0.4123, 31.25),
        G.Record("7b-8l FLOAT8=true", "skipped: torchao not installed"),
        G.Record("a|b", "FAIL: exit 1: x | y"),
    ]
    md = G.table(records)
    lines = md.strip().splitlines()
    assert lines[0] == "| config | tokens/s | MFU | peak GiB | status |" and len(lines) == 2 + len(records)
    assert all(line.count("|") == 6 for line in lines)
    assert lines[2] == "| 7b-8l baseline | 12,346 | 41.2% | 31.2 | ok (31 s) |"
    assert lines[3] == "| 7b-8l FLOAT8=true | - | - | - | skipped: torchao not installed |"


def test_levers_come_from_the_trainers_own_help(capsys):
    """`python -m fsdptrain --help` is argparse's help of fsdptrain.config.from_sources; every setting shows
    as '(env KEY, default VALUE' (wrapped where argparse wraps it)."""
    from fsdptrain.config import TrainConfig

    with pytest.raises(SystemExit):
        from_sources(["--help"], environ={})
    keys = G.available_keys(capsys.readouterr().out)
    fields = {f.metadata["env"]: f.default for f in dataclasses.fields(TrainConfig)}
    assert set(keys) == set(fields)
    assert all(keys[k] == str(v).lower() for k, v in fields.items())
    runs = G.lever_runs(keys, have_torchao=False)
    by_name = {name: (settings, skip) for name, settings, skip in runs}
    assert len(runs) == sum(len(v) for v in G.LEVERS.values())
    for key, values in G.LEVERS.items():
        for value in values:
            settings, skip = by_name[f"7b-8l {key}={value}"]
            if key not in keys:
                assert skip == "skipped: lever not available in this trainer" and not settings
            elif keys[key] == value:
                assert skip.startswith("skipped: the trainer's default") and not settings
            elif key == "FLOAT8" and value == "true":
                assert skip == "skipped: torchao not installed"
            else:
                assert settings == {key: value} and not skip


@pytest.mark.parametrize("seed", range(5))
def test_lever_runs_for_generated_trainers(seed):
    """Whatever subset of the levers a trainer lists, and whatever its defaults: one row per lever value,
    each either run with exactly that setting or skipped with a reason."""
    rng = random.Random(seed)
    keys = {k: rng.choice(v) for k, v in G.LEVERS.items() if rng.random() < 0.6}
    runs = G.lever_runs(keys, have_torchao=rng.random() < 0.5)
    assert len({name for name, _, _ in runs}) == len(runs) == sum(len(v) for v in G.LEVERS.values())
    for name, settings, skip in runs:
        assert bool(skip) != bool(settings)
        if settings:
            ((key, value),) = settings.items()
            assert key in keys and keys[key] != value and name.endswith(f"{key}={value}")


def test_an_unknown_mode_is_refused():
    assert G.main(["nope"]) == 2


@pytest.mark.parametrize(("key", "value"), [(k, v) for k, vs in G.LEVERS.items() for v in vs])
def test_every_lever_value_is_one_the_trainer_takes(key, value):
    """A value the trainer's parser refuses (FUSED_OPTIMIZER takes auto/on/off, not true/false) would turn the
    lever's row into 'not offered' on the GPU and measure nothing: each value must pass fsdptrain.config's
    own parsing and validation (FLOAT8's device check comes later, in fsdptrain.launch.check_device)."""
    cfg = from_sources([], environ={key: value, "MODEL": "7b"})
    field = next(f for f in dataclasses.fields(cfg) if f.metadata["env"] == key)
    assert str(getattr(cfg, field.name)).lower() == value


@pytest.mark.slow
def test_a_cpu_rehearsal_runs_every_row(tmp_path):
    """`gpu_check.py all` end to end on the CPU build (GPU_CHECK_REHEARSE=cpu: a 2-layer shape, fp32, gloo,
    real torchrun and the real trainer), in a Python holding only the GPU machine's packages
    (`gpu_machine_python`: it caught every trainer row importing `datasets`, which that machine lacks):
    every strategy's smoke row and the resume row pass, the bare loop and
    every lever row measure tokens/s, and only what needs a GPU or torchao (FLOAT8=true) is skipped; the table
    lands in OUT. The GPU path differs only in the shape, bf16, NCCL and the bare loop's compile."""
    env = {**os.environ, "GPU_CHECK_REHEARSE": "cpu", "GPU_CHECK_BUDGET_S": "400", "OUT": str(tmp_path)}
    python = gpu_machine_python(tmp_path)  # `datasets`, pydantic, ... are not there
    p = subprocess.run(
        [python, str(ROOT / "benchmarks" / "gpu_check.py"), "all", str(tmp_path / "w")],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    rows = {
        line.split(" | ")[0].strip("| "): line.split(" | ")
        for line in (tmp_path / "gpu_check.md").read_text().splitlines()[2:]
    }
    statuses = {name: cells[-1].rstrip(" |") for name, cells in rows.items()}
    smoke = [n for n in rows if n.startswith("smoke tiny ")]
    assert sorted(s.split()[-1] for s in smoke) == sorted(G.SMOKE_STRATEGIES)
    assert statuses["resume: from step 4 to 8"].startswith("ok (steps 5-8"), statuses
    lever_rows = [n for n in rows if n.startswith("7b-8l ") and "=" in n]
    assert len(lever_rows) == sum(len(v) for v in G.LEVERS.values())
    for name, status in statuses.items():
        if name == "7b-8l FLOAT8=true":
            assert status.startswith("skipped:"), status
        elif status.startswith("skipped:"):
            assert "the trainer's default" in status, (name, status)
        else:
            assert status.startswith("ok"), (name, status)
            if name.startswith(("7b-8l", "bare")):
                assert float(rows[name][1].replace(",", "")) > 0, rows[name]

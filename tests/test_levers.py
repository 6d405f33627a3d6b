"""The trainer's GPU levers (issue 17): COMPILE, FUSED_OPTIMIZER, DETERMINISTIC,
ACTIVATION_CHECKPOINTING= selective, FLOAT8, FSDP_PREFETCH. Each one that a CPU can run is checked
against the default run under real torchrun (gloo); FLOAT8, which needs a Hopper/Ada GPU, is checked
for its refusal."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import torchrun, train_env
from fsdptrain.config import (
    AC_MODES,
    ConfigError,
    TrainConfig,
    from_sources,
)
from fsdptrain.levers import (
    GarbageCollection,
    float8_refusal,
    float8_warning,
    resolve_activation_checkpointing,
    resolve_compile,
    resolve_deterministic,
    resolve_fused_optimizer,
)

DEVICE_TYPES = ("cpu", "cuda", "xpu", "mps")


@pytest.mark.parametrize("device", DEVICE_TYPES)
def test_deterministic_auto_is_on_for_cpu_tests_and_off_with_cuda(device):
    """torch's reproducibility notes: deterministic CUDA kernels are slower, so auto leaves them off
    with CUDA; every other device (the CPU tests compare losses exactly) keeps them on. true/false
    always win."""
    assert resolve_deterministic("auto", device) is (device != "cuda")
    assert resolve_deterministic("true", device) is True
    assert resolve_deterministic("false", device) is False


@pytest.mark.parametrize("device", DEVICE_TYPES)
def test_fused_adamw_auto_only_with_cuda(device):
    assert resolve_fused_optimizer("auto", device) is (device == "cuda")
    assert resolve_fused_optimizer("on", device) is True
    assert resolve_fused_optimizer("off", device) is False


def test_lever_defaults_and_choices():
    cfg = TrainConfig()
    assert (cfg.compile, cfg.float8, cfg.fused_optimizer, cfg.deterministic, cfg.fsdp_prefetch) == (
        "auto",
        False,
        "auto",
        "auto",
        1,
    )
    assert (cfg.float8_recipe, cfg.gc_interval, cfg.sdpa_backends) == (
        "tensorwise",
        50,
        "cudnn,flash,efficient,math",
    )
    env = {"ACTIVATION_CHECKPOINTING": "selective", "COMPILE": "on", "FUSED_OPTIMIZER": "off"}
    parsed = from_sources([], {**env, "DETERMINISTIC": "false", "FSDP_PREFETCH": "0"})
    assert (parsed.activation_checkpointing, parsed.compile) == ("selective", "true")
    assert (parsed.fused_optimizer, parsed.deterministic, parsed.fsdp_prefetch) == (
        "off",
        "false",
        0,
    )
    for key, bad, says in [
        (
            "FUSED_OPTIMIZER",
            "yes",
            "FUSED_OPTIMIZER='yes' is not allowed: use one of auto, on, off",
        ),
        ("DETERMINISTIC", "on", "DETERMINISTIC='on' is not allowed: use one of auto, true, false"),
        ("FSDP_PREFETCH", "-1", "FSDP_PREFETCH=-1 is too small: use at least 0"),
        ("COMPILE", "maybe", "COMPILE='maybe' is not allowed: use one of auto, true, false"),
        (
            "FLOAT8_RECIPE",
            "blockwise",
            "FLOAT8_RECIPE='blockwise' is not allowed: use one of tensorwise, rowwise",
        ),
        ("GC_INTERVAL", "-1", "GC_INTERVAL=-1 is too small: use at least 0"),
        (
            "SDPA_BACKENDS",
            "flash,fast",
            "SDPA_BACKENDS='flash,fast' is not allowed: give an order of cudnn",
        ),
        ("SDPA_BACKENDS", "flash,flash", "SDPA_BACKENDS='flash,flash' names a kernel twice"),
        ("SDPA_BACKENDS", "", "SDPA_BACKENDS='' is not allowed"),
    ]:
        with pytest.raises(ConfigError, match=f"^{re.escape(says)}"):
            from_sources([], {key: bad})


@pytest.mark.parametrize(
    "word", ["1", "yes", "on", "true", "TRUE", " On ", "0", "no", "off", "false", "False"]
)
def test_compile_keeps_the_words_its_boolean_took(word):
    """COMPILE was a true/false switch: every word the boolean parser took still means the same."""
    want = "true" if word.strip().lower() in ("1", "yes", "on", "true") else "false"
    assert from_sources([], {"COMPILE": word}).compile == want


COMPILE_SETTINGS = ("auto", "true", "false")
COMPILERS = ("", "/usr/bin/gcc", "clang")


@pytest.mark.parametrize("setting", COMPILE_SETTINGS)
@pytest.mark.parametrize("device", DEVICE_TYPES)
@pytest.mark.parametrize("compiler", COMPILERS)
def test_compile_auto_is_on_with_cuda_and_a_compiler_only(setting, device, compiler):
    """COMPILE=auto: on with CUDA where Triton can build its launchers (a C compiler and Python's
    headers, triton/runtime/build.py), off on every other device and without a compiler; true/false
    always win. Every decision names its reason in one line, which the banner and the start event
    carry."""
    choice = resolve_compile(setting, device, compiler)
    if setting != "auto":
        assert choice.on is (setting == "true") and choice.why == f"COMPILE={setting}"
    else:
        assert choice.on is (device == "cuda" and bool(compiler))
        assert choice.why.startswith("COMPILE=auto: ") and "\n" not in choice.why
        if device == "cuda" and not compiler:
            assert "gcc" in choice.why and "python3-dev" in choice.why  # the fix is named
        if choice.on:
            assert compiler in choice.why


def test_triton_compiler_follows_tritons_own_search(tmp_path, monkeypatch):
    """triton/runtime/build.py `_build`: CC if set, else gcc, else clang; the launcher includes
    Python.h, so without the headers there is nothing Triton can build either."""
    import sysconfig

    from fsdptrain import levers

    monkeypatch.setattr(
        levers.shutil, "which", lambda name: f"/usr/bin/{name}" if name != "clang" else None
    )
    have_headers = (Path(sysconfig.get_paths()["include"]) / "Python.h").is_file()
    assert levers.triton_compiler({}) == ("/usr/bin/gcc" if have_headers else "")
    assert levers.triton_compiler({"CC": "cc"}) == ("cc" if have_headers else "")
    monkeypatch.setattr(levers.shutil, "which", lambda name: None)
    assert levers.triton_compiler({}) == ""
    assert levers.triton_compiler({"CC": "/nonexistent/cc"}) == ""
    headerless = {"include": str(tmp_path)}  # an interpreter without python3-dev
    monkeypatch.setattr(levers.shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(levers.sysconfig, "get_paths", lambda **_: headerless)
    assert levers.triton_compiler({}) == ""


@pytest.mark.parametrize("mode", AC_MODES)
@pytest.mark.parametrize("compiled", [True, False])
@pytest.mark.parametrize("every", [1, 2, 3])
def test_selective_checkpointing_is_op_level_only_compiled(mode, compiled, every):
    """Op-level selective checkpointing runs its policy in Python on every aten op when eager (it
    lost to full checkpointing on an H200, shared/gpu/2026-12-04/ANALYSIS.md section 1); without
    compile it becomes layer-level, every 2nd layer, torchtitan v0.2's default (job_config.py
    selective_ac_option="2"), with a note. Every other mode, and selective when compiled, is applied
    as set."""
    got = resolve_activation_checkpointing(mode, every, compiled)
    if mode == "selective" and not compiled:
        assert (got.mode, got.every) == ("every-k", 2) and got.note.startswith(
            "ACTIVATION_CHECKPOINTING="
        )
        assert "\n" not in got.note
    else:
        assert (got.mode, got.every, got.note) == (mode, every, "")


@pytest.mark.parametrize("float8", [True, False])
@pytest.mark.parametrize("compiled", [True, False])
def test_float8_without_compile_runs_with_the_measured_warning(float8, compiled):
    """FLOAT8 runs compiled under COMPILE=auto on its GPUs; with compile off it still runs (numerics
    debugging) but says what it costs, quoting the H200's eager float8 against eager bf16."""
    warning = float8_warning(float8, compiled)
    assert bool(warning) is (float8 and not compiled)
    if warning:
        assert warning.startswith("FLOAT8=true without compile: ") and "0.52x" in warning


def test_gc_control_disables_the_automatic_collector_and_collects_every_n_steps(monkeypatch):
    """torchtitan/tools/utils.py GarbageCollection (gc_freq=50): automatic collection off for the
    run, a generation-1 collection at every N-th step (not step 1), Python's collector back on at
    the end; 0 leaves Python's own collector alone."""
    import gc

    from fsdptrain import levers

    collected: list[int] = []
    monkeypatch.setattr(
        levers.gc, "collect", lambda generation=2: collected.append(generation) or 0
    )
    assert gc.isenabled()
    control = GarbageCollection(5)
    try:
        assert not gc.isenabled() and collected == [1]  # one at the start, as torchtitan
        for step in range(1, 21):
            control.step(step)
        assert collected == [1, 1, 1, 1, 1] and control.policy == "gc every 5 steps"
    finally:
        control.close()
    assert gc.isenabled()
    collected.clear()
    off = GarbageCollection(0)
    for step in range(1, 21):
        off.step(step)
    off.close()
    assert gc.isenabled() and collected == [] and off.policy == "gc automatic"


@pytest.mark.parametrize(
    "device, capability, runs",
    [
        ("no CUDA GPU (cpu)", None, False),
        ("NVIDIA A100-SXM4-80GB", (8, 0), False),
        ("NVIDIA A10G", (8, 6), False),
        ("NVIDIA L40S", (8, 9), True),
        ("NVIDIA H100 80GB HBM3", (9, 0), True),
        ("NVIDIA H200", (9, 0), True),
        ("NVIDIA B200", (10, 0), True),
    ],
)
def test_float8_runs_only_from_compute_capability_8_9(device, capability, runs):
    """torchao's float8 training needs float8 tensor cores: compute capability 8.9 (Ada) and 9.0
    (Hopper) on (torchao/float8/README.md); the refusal is one line naming the key, the device and
    the fix."""
    line = float8_refusal(device, capability)
    assert (line is None) is runs
    if line is not None:
        assert (
            line.startswith("FLOAT8=true needs a CUDA GPU of compute capability 8.9")
            and "\n" not in line
        )
        assert device in line and line.endswith("unset FLOAT8 or run on such a GPU")


def test_float8_refused_on_this_cpu_with_one_line_and_exit_2(assets):
    """The trainer as torchrun starts it: refused before any process group exists."""
    p = subprocess.run(
        [sys.executable, "-m", "fsdptrain"],
        env=train_env(assets, FLOAT8="true", CUDA_VISIBLE_DEVICES=""),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 2, p.stderr[-2000:]
    assert p.stderr.strip().splitlines() == [
        "fsdptrain: error: FLOAT8=true needs a CUDA GPU of compute capability 8.9 or newer "
        "(H100, H200, L40S) and this process has no CUDA GPU (cpu): unset FLOAT8 or run on such a GPU"
    ]
    assert '{"event"' not in p.stdout  # nothing started


class _Layer:
    def __init__(self, i: int) -> None:
        self.i, self.forward, self.backward = i, [], []

    def set_modules_to_forward_prefetch(self, modules):
        self.forward = [m.i for m in modules]

    def set_modules_to_backward_prefetch(self, modules):
        self.backward = [m.i for m in modules]


@pytest.mark.parametrize("layers", [1, 2, 4, 7])
@pytest.mark.parametrize("n", [1, 2, 3, 8])
def test_prefetch_names_the_next_layers_in_the_order_each_pass_runs_them(layers, n):
    """FSDP2's explicit prefetch (torch.distributed.fsdp.FSDPModule.set_modules_to_forward_prefetch
    and set_modules_to_backward_prefetch; torch's FSDP2 example example.py): forward runs layers
    0..L-1, backward L-1..0, so layer i prefetches i+1..i+n in forward and i-1..i-n in backward,
    none past the ends."""
    from fsdptrain.parallel import set_prefetch

    made = [_Layer(i) for i in range(layers)]
    set_prefetch(made, n)
    for layer in made:
        i = layer.i
        assert layer.forward == list(range(i + 1, min(layers, i + 1 + n)))
        assert layer.backward == list(range(i - 1, max(-1, i - 1 - n), -1))


def test_float8_converts_decoder_linears_not_the_head():
    """torchtitan keeps the output projection in high precision and float8 matmuls need dimensions
    that are multiples of 16 (torchao's module_filter_fn convention: (module, fqn) -> convert?)."""
    from torch import nn

    from fsdptrain.parallel import float8_filter

    assert float8_filter(nn.Linear(4096, 11008, bias=False), "model.layers.0.mlp.up_proj")  # 7b
    assert not float8_filter(
        nn.Linear(128, 344, bias=False), "model.layers.0.mlp.up_proj"
    )  # tiny: 344
    assert not float8_filter(nn.Linear(128, 512, bias=False), "lm_head")
    assert not float8_filter(nn.Linear(100, 128), "model.layers.0.self_attn.q_proj")
    assert not float8_filter(nn.Embedding(512, 128), "model.embed_tokens")


@pytest.mark.slow
def test_selective_checkpointing_keeps_matmuls_and_the_gradients():
    """Selective (op-level) activation checkpointing as torchtitan's `selective` op mode
    (torchtitan/distributed/activation_checkpoint.py; torch.utils.checkpoint.
    create_selective_checkpoint_contexts): backward recomputes fewer matmuls than full checkpointing
    (every second one is saved) and the gradients are those of no checkpointing. Counted with a
    TorchDispatchMode over backward."""
    import copy

    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from transformers import LlamaForCausalLM

    from fsdptrain.models import llama_config
    from fsdptrain.parallel import apply_activation_checkpointing

    class CountMM(TorchDispatchMode):
        count = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.count += func == torch.ops.aten.mm.default
            return func(*args, **(kwargs or {}))

    torch.manual_seed(0)
    config = llama_config("tiny")
    config.use_cache, config.num_hidden_layers = False, 2  # no KV cache, as the trainer builds it
    base = LlamaForCausalLM(config)
    tokens = torch.randint(0, config.vocab_size, (2, 32))

    def backward(mode: str) -> tuple[int, torch.Tensor]:
        model = copy.deepcopy(base)
        assert apply_activation_checkpointing(model, mode=mode, every=1) == (
            0 if mode == "none" else 2
        )
        loss = model(input_ids=tokens, labels=tokens).loss
        with CountMM() as counter:
            loss.backward()
        return counter.count, torch.cat([p.grad.flatten() for p in model.parameters()])

    (none, g_none), (full, g_full), (sel, g_sel) = (
        backward("none"),
        backward("full"),
        backward("selective"),
    )
    # a layer's forward has 7 matmuls (q, k, v, o, gate, up, down). Full recomputes 6 of them per
    # layer: torch's non-reentrant checkpoint stops recomputing once every saved tensor is back, and
    # down's output is saved by nothing. Selective keeps the 1st, 3rd, 5th and 7th and recomputes
    # the other 3.
    assert (full - none, sel - none) == (2 * 6, 2 * 3)
    torch.testing.assert_close(g_sel, g_none, rtol=0, atol=0)
    torch.testing.assert_close(g_full, g_none, rtol=0, atol=0)


@pytest.mark.slow
def test_cpu_levers_together_give_the_default_losses(assets):
    """One run with every lever a CPU can run (per-layer compile, fused AdamW, selective
    checkpointing, FSDP2 prefetch of 2 layers, deterministic on) against a plain run
    (FSDP_PREFETCH=0: FSDP2's implicit order), both 2 processes, fp32, 4 steps. Tolerance: rtol 1e-4
    on each loss. Prefetch, checkpointing and determinism change no arithmetic; the fused AdamW
    kernel (torch/optim/adamw.py _fused_adamw) orders its float ops differently than foreach (last
    bits), and COMPILE runs here with FSDPTRAIN_COMPILE_BACKEND=aot_eager (dynamo + AOTAutograd, the
    same aten ops; inductor compiles C++ per graph, minutes on these CPUs). On a GPU inductor's
    fused kernels and bf16 differ more: that is the GPU check's tolerance, not this one."""
    default = torchrun(assets, MAX_STEPS=4, WARMUP_STEPS=1, FSDP_PREFETCH=0)
    levers = torchrun(
        assets,
        MAX_STEPS=4,
        WARMUP_STEPS=1,
        COMPILE="true",
        FSDPTRAIN_COMPILE_BACKEND="aot_eager",
        FUSED_OPTIMIZER="on",
        ACTIVATION_CHECKPOINTING="selective",
        FSDP_PREFETCH=2,
        DETERMINISTIC="true",
    )
    assert default.rc == 0, default.stderr[-3000:]
    assert levers.rc == 0, levers.stderr[-3000:]
    assert "compiled layers, fused AdamW, deterministic, FSDP prefetch 2" in levers.stdout
    # fsdptrain.hostmem on this machine's glibc (tests/test_hostmem.py)
    assert (
        "host malloc kept between steps" in levers.stdout and "host malloc kept" in default.stdout
    )
    assert "activation checkpointing selective (4 layers)" in levers.stdout
    assert len(default.losses) == len(levers.losses) == 4
    assert levers.losses == pytest.approx(default.losses, rel=1e-4)


@pytest.mark.parametrize(
    "order", ["cudnn,flash,efficient,math", "math,flash", "flash", "efficient,cudnn"]
)
def test_sdpa_backends_is_torchs_kernel_priority_while_the_run_lasts(order):
    """SDPA_BACKENDS sets torch's kernel priority for the run (torch.nn.attention.sdpa_kernel with
    set_priority=True, as torchtitan's ScaledDotProductAttention): the named kernels first, in
    order, then the others, every one still allowed; torch's own order is back afterwards."""
    import torch
    from torch.nn.attention import SDPBackend

    from fsdptrain.models import SDPA_MEMBERS, sdpa_priority

    before = torch._C._get_sdp_priority_order()
    named = [int(getattr(SDPBackend, SDPA_MEMBERS[n])) for n in order.split(",")]
    with sdpa_priority(order):
        inside = list(torch._C._get_sdp_priority_order())
        assert inside[: len(named)] == named and sorted(inside) == sorted(before)
        assert torch.backends.cuda.flash_sdp_enabled() and torch.backends.cuda.math_sdp_enabled()
    assert torch._C._get_sdp_priority_order() == before


def test_the_attention_kernel_that_runs_is_named():
    """The start event names the kernel torch picked for the model's attention shapes, seen by a
    dispatch mode on one SDPA forward (compiled layers hide their ops, so it is asked once at
    start). On this CPU: the CPU flash kernel, and math where torch is allowed nothing else."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from fsdptrain.models import attention_kernel, llama_config

    config = llama_config("tiny")
    probe = lambda: attention_kernel(config, torch.device("cpu"), torch.float32, 2, 64)  # noqa: E731
    assert probe() == "flash (cpu)"
    with sdpa_kernel([SDPBackend.MATH]):
        assert probe() == "math"


def test_activation_bytes_come_from_the_cuda_allocator_where_there_is_one(monkeypatch):
    """On CUDA the bytes held for backward are the allocator's growth over the forward
    (torch.cuda.memory_allocated): saved-tensor hooks cannot see what checkpointing's own hooks
    keep, and eager selective and full both reported the same 927 MB on the H200 (ANALYSIS.md
    section 1). The CPU keeps counting the storages autograd saves. The allocator is stood in for
    here (no GPU in CI)."""
    import torch

    from fsdptrain.metrics import SavedActivations

    allocated = iter([1000, 1000 + 123_456])
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: next(allocated))
    with SavedActivations(torch.device("cuda", 0)) as m:
        x = torch.ones(10, requires_grad=True)
        (x * x).sum()
    assert m.measure() == 123_456
    with SavedActivations(torch.device("cpu")) as cpu:
        y = torch.ones(1000, requires_grad=True)
        z = (y * y).sum()
    assert (
        cpu.measure() == 1000 * 4
    )  # y, saved once for the product's backward (x*x saves it twice)
    z.backward()


@pytest.mark.slow
def test_float8_config_is_torchtitans_recipe_per_sharding(tmp_path):
    """torchtitan v0.2.2 Float8LinearConverter (torchtitan/components/quantization/float8.py):
    tensorwise all-gathers the weights in float8 only when they are sharded (dp_shard > 1) and then
    precomputes the scales after each optimizer step (torchao
    precompute_float8_dynamic_scale_for_fsdp); rowwise is torchao's recipe (axiswise scales),
    communicates in high precision and precomputes nothing. The conversion swaps the decoder's
    linears and leaves the head. Real torchao 0.18 (the version benchmarks/gpu_check_wheels.txt
    carries to the GPU) on the CPU: its float8 kernels need a GPU, the config and the module swap do
    not. It is installed from PyPI into a folder of this test's own, not the project's venv:
    transformers imports torchao whenever it is installed (quantizer_torchao), which would cost
    every trainer start here."""
    site = tmp_path / "torchao"
    pip = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "-q",
        "--no-deps",
        "--target",
        str(site),
        "torchao==0.18.0",
    ]
    installed = subprocess.run(pip, capture_output=True, text=True, timeout=300)
    assert installed.returncode == 0, installed.stderr[-2000:]
    code = """
from fsdptrain.parallel import apply_float8, float8_after_step, float8_config
from fsdptrain.models import llama_config
from transformers import LlamaForCausalLM
assert float8_config("tensorwise", 8).enable_fsdp_float8_all_gather
assert not float8_config("tensorwise", 1).enable_fsdp_float8_all_gather
rowwise = float8_config("rowwise", 8)
assert not rowwise.enable_fsdp_float8_all_gather
assert str(rowwise.cast_config_weight.scaling_granularity).endswith("AXISWISE")
assert float8_after_step("tensorwise", 8).__name__ == "precompute_float8_dynamic_scale_for_fsdp"
assert float8_after_step("tensorwise", 1) is None and float8_after_step("rowwise", 8) is None
config = llama_config("tiny")
config.hidden_size, config.intermediate_size, config.num_attention_heads = 128, 256, 4
model = LlamaForCausalLM(config)
swapped = apply_float8(model, recipe="tensorwise", shards=2)
assert swapped == 7 * config.num_hidden_layers, swapped
assert type(model.lm_head).__name__ == "Linear"
print("ok")
"""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]),
    }
    p = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=180, env=env
    )
    assert p.returncode == 0 and p.stdout.strip().endswith("ok"), p.stderr[-3000:]

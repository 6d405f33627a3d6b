"""How the speed settings resolve on this machine, and why: COMPILE=auto, FLOAT8 without compile,
selective checkpointing without compile, Python's garbage collector and the attention kernel order;
DETERMINISTIC and FUSED_OPTIMIZER per device, and FLOAT8's refusal without float8 tensor cores.

The rules are pure (tests/test_levers.py proves each on the CPU); every decision carries a one-line
reason that the banner and the `start` event repeat, so a run says what it chose instead of leaving
it to be guessed. The measurements quoted come from the first H200 run (shared/gpu/2026-12-04:
gpu_check.md, ANALYSIS.md; BENCHMARKS.md "GPU"): Llama-2-7B's layer x 8, seq 4096, bf16, one GPU,
medians.
"""

from __future__ import annotations

import gc
import os
import shutil
import sysconfig
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

# eager FLOAT8 ran at 15,468 tok/s against 29,913 for eager bf16 (-48%); compiled float8 at 37,537
# (+9% over compiled bf16): torchao's per-tensor scaling adds ~500 memory-bound ops per layer that
# only compile fuses
FLOAT8_EAGER_NOTE = "float8 without compile ran at 0.52x of bf16 on an H200 (15.5k vs 29.9k tok/s)"
# torchtitan v0.2.x's default "selective" is layer-level: full checkpointing of every 2nd block
# (torchtitan/config/job_config.py ActivationCheckpoint.selective_ac_option = "2")
LAYER_SELECTIVE_EVERY = 2
SDPA_BACKENDS = ("cudnn", "flash", "efficient", "math")
# torchtitan's priority (torchtitan/models/attention.py ScaledDotProductAttention: cuDNN, flash,
# math); the memory-efficient kernel, which torchtitan disables, stays as a fallback ahead of math
SDPA_DEFAULT = "cudnn,flash,efficient,math"


@dataclass(frozen=True)
class Choice:
    """A resolved lever: whether it is on, and the reason in one line."""

    on: bool
    why: str


def triton_compiler(environ: Mapping[str, str] | None = None) -> str:
    """The C compiler Triton would build its kernel launchers with, '' when it would find none: CC,
    else gcc, else clang (triton/runtime/build.py `_build`), and Python's headers, which the
    launcher includes."""
    environ = os.environ if environ is None else environ
    cc = environ.get("CC") or shutil.which("gcc") or shutil.which("clang") or ""
    if cc and not shutil.which(cc):
        return ""
    scheme = sysconfig.get_default_scheme()
    # Debian's 'posix_local' puts include under /usr/local; Triton reads posix_prefix's, as here
    scheme = "posix_prefix" if scheme == "posix_local" else scheme
    headers = Path(sysconfig.get_paths(scheme=scheme)["include"]) / "Python.h"
    return cc if headers.is_file() else ""


def resolve_compile(setting: str, device_type: str, compiler: str) -> Choice:
    """COMPILE: true/false as set; auto is on with CUDA where Triton can build (a C compiler and
    Python's headers: `compiler`) and off elsewhere (inductor's CPU code is C++ built per graph:
    minutes on small CPUs for no gain at the tiny model). On the H200 compile cut the step by 13%
    (34,545 vs 29,913 tok/s)."""
    if setting in ("true", "false"):
        return Choice(setting == "true", f"COMPILE={setting}")
    if device_type != "cuda":
        return Choice(False, f"COMPILE=auto: off on {device_type}")
    if not compiler:
        return Choice(
            False,
            "COMPILE=auto: off, Triton finds no C compiler (CC, gcc, clang) or no Python headers "
            "(Python.h): install gcc and python3-dev, or set COMPILE=false to silence this",
        )
    return Choice(True, f"COMPILE=auto: on with CUDA (Triton builds with {compiler})")


def float8_warning(float8: bool, compiled: bool) -> str:
    """FLOAT8 runs without compile only when asked to (COMPILE=false, or no compiler): it is useful
    for numerics, not for speed, so it runs with this warning instead of being refused."""
    if not float8 or compiled:
        return ""
    return (
        f"FLOAT8=true without compile: {FLOAT8_EAGER_NOTE}; leave COMPILE=auto (or true) for speed"
    )


@dataclass(frozen=True)
class Checkpointing:
    """ACTIVATION_CHECKPOINTING as it will be applied: the mode, its every-k, and why it differs
    from the setting ('' when it does not)."""

    mode: str
    every: int
    note: str = ""


def resolve_activation_checkpointing(mode: str, every: int, compiled: bool) -> Checkpointing:
    """Op-level selective checkpointing runs its policy in Python on every aten op (~100 per Llama
    layer): compiled, the policy is applied once at tracing (+6% over no checkpointing on the H200);
    eager, the step became host-bound and lost to full checkpointing (23,547 vs 25,121 tok/s). So
    without compile `selective` falls back to layer-level: every 2nd layer fully checkpointed,
    torchtitan v0.2's default."""
    if mode == "selective" and not compiled:
        return Checkpointing(
            "every-k",
            LAYER_SELECTIVE_EVERY,
            "ACTIVATION_CHECKPOINTING=selective without compile: every 2nd layer checkpointed "
            "(layer-level); op-level selective runs compiled only (eager it lost to full: 23.5k vs "
            "25.1k tok/s on an H200)",
        )
    return Checkpointing(mode, every)


def sdpa_problem(value: str) -> str:
    """SDPA_BACKENDS: a comma-separated order of kernel names, each once; '' when valid."""
    names = [n.strip() for n in value.split(",")]
    unknown = [n for n in names if n not in SDPA_BACKENDS]
    if unknown or not value.strip():
        return (
            f"SDPA_BACKENDS={value!r} is not allowed: give an order of {', '.join(SDPA_BACKENDS)} "
            f"separated by commas, e.g. {SDPA_DEFAULT}"
        )
    if len(set(names)) != len(names):
        return f"SDPA_BACKENDS={value!r} names a kernel twice: give each once, e.g. {SDPA_DEFAULT}"
    return ""


class GarbageCollection:
    """GC_INTERVAL=N: Python's automatic collector off for the run, one generation-1 collection
    every N steps (torchtitan/tools/utils.py `GarbageCollection`, gc_freq=50): an automatic
    collection can fire inside any step, on any rank at a different moment, and every other rank
    waits for it at the next collective. 0 leaves Python's own collector alone. `close()` turns it
    back on."""

    def __init__(self, interval: int, log: Callable[[str], None] = lambda _: None) -> None:
        self.interval, self.log = interval, log
        self.was_enabled = gc.isenabled()
        if interval:
            gc.disable()
            gc.collect(1)

    def step(self, step: int) -> None:
        if self.interval and step > 1 and step % self.interval == 0:
            t0 = time.perf_counter()
            gc.collect(1)
            took = time.perf_counter() - t0
            if took > 0.05:  # worth a line: a collection that shows in the step time
                self.log(f"gc: collection at step {step} took {took * 1000:.0f} ms")

    def close(self) -> None:
        if self.interval and self.was_enabled:
            gc.enable()

    @property
    def policy(self) -> str:
        return f"gc every {self.interval} steps" if self.interval else "gc automatic"


def resolve_deterministic(setting: str, device_type: str) -> bool:
    """DETERMINISTIC: auto is on for CPU (the tests compare losses bit for bit) and off with CUDA,
    whose deterministic kernels are slower (torch's reproducibility notes; torchtitan leaves them
    off too)."""
    return setting == "true" or (setting == "auto" and device_type != "cuda")


def resolve_fused_optimizer(setting: str, device_type: str) -> bool:
    """FUSED_OPTIMIZER: auto takes AdamW's fused kernel with CUDA (one kernel for all parameters,
    torch's fastest implementation there) and foreach elsewhere."""
    return setting == "on" or (setting == "auto" and device_type == "cuda")


FLOAT8_MIN_CAPABILITY = (8, 9)  # float8 tensor cores: Ada (8.9) and Hopper (9.0) onwards


def float8_refusal(device: str, capability: tuple[int, int] | None) -> str | None:
    """FLOAT8=true's one-line refusal on a machine without float8 tensor cores; None where it can
    run. `device` names what this process trains on, `capability` is its CUDA compute capability
    (None: no GPU)."""
    if capability is not None and capability >= FLOAT8_MIN_CAPABILITY:
        return None
    has = (
        device
        if capability is None
        else f"{device} (compute capability {capability[0]}.{capability[1]})"
    )
    return (
        "FLOAT8=true needs a CUDA GPU of compute capability 8.9 or newer (H100, H200, L40S) and "
        f"this process has {has}: unset FLOAT8 or run on such a GPU"
    )

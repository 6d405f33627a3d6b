"""torchtitan 0.2.2 as the side-by-side peer of benchmarks/gpu_check.py, on the trainer's 7b-8l shape.

    torchrun --standalone --nproc-per-node 1 benchmarks/peers/torchtitan_peer.py --model.name llama3 \\
        --model.flavor 7b-8l --model.hf_assets_path ASSETS/tokenizer --training.dataset c4_test \\
        --training.dataset_path DATA ...        # torchtitan's own flags (gpu_check.py `torchtitan_flags`)

Registers the flavor "7b-8l" (Llama-2-7B's layer: dim 4096, 32 heads without GQA, FFN 11008, vocab 32000,
RoPE theta 10000, 8 layers) in torchtitan's llama3 model table, then runs torchtitan's own `main(Trainer)`
(torchtitan/train.py). FFN: torchtitan sizes it 256 * ceil(int(2 * 4 * 4096 / 3) / 256) = 11008, as Llama-2.
torchtitan 0.3.0 cannot import on torch 2.11 (shared/gpu/2026-12-04/ANALYSIS.md section 5a); 0.2.2 can.

GPU_CHECK_REHEARSE=cpu (tests/test_gpu_check.py) runs it on the CPU build: torchtitan picks "cuda" when no
accelerator is present (torchtitan/tools/utils.py get_device_info), so the rehearsal points its device at the
CPU and its memory monitor at nothing; every flag, the dataset and tokenizer path and the model build are
torchtitan's own.
"""

from __future__ import annotations

import os
import sys

# Llama-2-7B's layer x 8: the rows of gpu_check.py use the same shape (SHAPE_ARGS there)
FLAVOR = "7b-8l"
REHEARSAL_FLAVOR = "rehearsal"  # gpu_check's CPU shape: hidden 64, 2 layers, 4 heads, vocab 32000


def register() -> None:
    import torchtitan.models.llama3 as llama3

    llama3.llama3_args[FLAVOR] = llama3.TransformerModelArgs(
        dim=4096,
        n_layers=8,
        n_heads=32,
        n_kv_heads=32,
        vocab_size=32000,
        multiple_of=256,
        rope_theta=10000,
    )
    llama3.llama3_args[REHEARSAL_FLAVOR] = llama3.TransformerModelArgs(
        dim=64,
        n_layers=2,
        n_heads=4,
        n_kv_heads=4,
        vocab_size=32000,
        multiple_of=32,
        rope_theta=10000,
    )


def _without_triton() -> None:
    """The CPU build has no Triton, which torchtitan's MoE kernels module (torchtitan/models/moe/kernels.py)
    imports at module level although a dense Llama never runs it: that one module is replaced by a stand-in
    whose functions refuse to run. Only in the rehearsal, and only where Triton is missing."""
    import importlib.util
    import types

    if importlib.util.find_spec("triton") is not None:
        return

    def refuse(*_: object, **__: object) -> None:
        raise RuntimeError("MoE kernels need Triton (not on the CPU build)")

    kernels = types.ModuleType("torchtitan.models.moe.kernels")
    kernels.generate_permute_indices = kernels.fill_indices_wrapper = refuse  # type: ignore[attr-defined]
    sys.modules[kernels.__name__] = kernels


def on_cpu() -> None:
    """The CPU rehearsal only: torchtitan's device is the CPU (gloo), its GPU memory monitor reads zeros."""
    _without_triton()
    import torch
    from torchtitan.components import metrics
    from torchtitan.tools import utils

    utils.device_type, utils.device_module = "cpu", _Cpu()

    class NoDeviceMemory(metrics.DeviceMemoryMonitor):  # torch.cpu has no allocator statistics
        def __init__(self, device: str = "cpu") -> None:
            self.device, self.device_name, self.device_capacity = torch.device(device), "cpu", 1
            self.device_capacity_gib = 1.0

        def get_peak_stats(self) -> metrics.DeviceMemStats:
            return metrics.DeviceMemStats(0.0, 0.0, 0.0, 0.0, 0, 0)

        def reset_peak_stats(self) -> None:
            pass

    metrics.DeviceMemoryMonitor = NoDeviceMemory
    metrics.device_type = "cpu"
    metrics.device_module = _Cpu()
    metrics.build_device_memory_monitor = lambda: NoDeviceMemory()


class _Cpu:
    """torch.cpu as torchtitan's device module: torch.cpu.current_device() names 'cpu', where torchtitan
    passes it as a device index (barrier's device_ids)."""

    def __getattr__(self, name: str) -> object:
        import torch

        return getattr(torch.cpu, name)

    @staticmethod
    def current_device() -> int:
        return 0


def _cpu_everywhere() -> None:
    """Modules that copied torchtitan's device globals at import (`from torchtitan.tools.utils import
    device_type`) get the CPU too."""
    for name, module in list(sys.modules.items()):
        if name.startswith("torchtitan") and getattr(module, "device_type", None) in (
            "cuda",
            "cpu",
        ):
            module.device_type = "cpu"  # type: ignore[attr-defined]
            if hasattr(module, "device_module"):
                module.device_module = _Cpu()  # type: ignore[attr-defined]


def main() -> None:
    if os.environ.get("GPU_CHECK_REHEARSE") == "cpu":
        on_cpu()
    register()
    from torchtitan.train import Trainer
    from torchtitan.train import main as titan_main

    if os.environ.get("GPU_CHECK_REHEARSE") == "cpu":
        _cpu_everywhere()
    titan_main(Trainer)


if __name__ == "__main__":
    sys.exit(main())

"""Throughput, MFU, memory and GPU telemetry: the numbers a step log line carries."""

from __future__ import annotations

import contextlib
import resource
import sys
from typing import Any

import torch
from torch import nn

from fsdptrain.shapes import PEAK_TFLOPS


def peak_tflops(device: torch.device, precision: str, override: float) -> float | None:
    if override > 0:
        return override
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for key, table in PEAK_TFLOPS.items():
        if key in name:
            return table[precision]
    return None


def local_state_bytes(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """Bytes this rank holds for parameters, gradients and optimizer state (its shards only)."""

    def nbytes(t: torch.Tensor) -> int:
        local = t.to_local() if hasattr(t, "to_local") else t
        return local.numel() * local.element_size()

    params = sum(nbytes(p) for p in model.parameters())
    grads = sum(nbytes(p.grad) for p in model.parameters() if p.grad is not None)
    optim = sum(
        nbytes(v)
        for s in optimizer.state.values()
        for v in s.values()
        if isinstance(v, torch.Tensor) and v.dim() > 0
    )
    return {"param_bytes": params, "grad_bytes": grads, "optim_bytes": optim}


def memory_stats(device: torch.device) -> dict[str, float]:
    """Peak device memory in GiB: allocated vs reserved on CUDA; the process's peak RSS on CPU."""
    gib = 1024**3
    if device.type == "cuda":
        return {
            "mem_allocated_gib": torch.cuda.max_memory_allocated(device) / gib,
            "mem_reserved_gib": torch.cuda.max_memory_reserved(device) / gib,
        }
    rss_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    scale = 1 if sys.platform == "darwin" else 1024  # macOS reports bytes, Linux KiB
    return {"mem_peak_rss_gib": rss_kib * scale / gib}


class GpuTelemetry:
    """Utilisation, temperature and power through NVML when the driver and nvidia-ml-py are
    present."""

    def __init__(self, device: torch.device):
        self.handle = None
        if device.type != "cuda":
            return
        try:
            import pynvml

            pynvml.nvmlInit()
            self.nvml = pynvml
            self.handle = pynvml.nvmlDeviceGetHandleByIndex(device.index or 0)
        except Exception:  # no NVML: telemetry is optional, training is not
            self.handle = None

    def read(self) -> dict[str, float]:
        if self.handle is None:
            return {}
        n = self.nvml
        return {
            "gpu_util_pct": n.nvmlDeviceGetUtilizationRates(self.handle).gpu,
            "gpu_temp_c": n.nvmlDeviceGetTemperature(self.handle, n.NVML_TEMPERATURE_GPU),
            "gpu_power_w": n.nvmlDeviceGetPowerUsage(self.handle) / 1000.0,
        }


class SavedActivations:
    """Bytes held for backward at the end of forward (`with` block, then `measure()`): what
    dominates memory besides the sharded state, and what `fsdpctl plan` estimates.

    On CUDA, the allocator's growth over the forward (`torch.cuda.memory_allocated` after minus
    before): it sees everything, also the tensors that checkpointing's own hooks keep (op-level
    selective checkpointing caches matmul outputs where saved-tensor hooks cannot see them). A CPU
    has no such counter: there the storages autograd's saved-tensor hooks receive are counted, read
    when forward has finished, so parameters FSDP already resharded (freed) count zero and ones it
    kept unsharded count.
    """

    def __init__(self, device: torch.device | None = None) -> None:
        self._storages: dict[int, torch.UntypedStorage] = {}
        self.bytes = 0
        self._cuda = device if device is not None and device.type == "cuda" else None
        self._before = 0

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        if not isinstance(t, nn.Parameter):
            try:
                storage = t.untyped_storage()
                self._storages.setdefault(storage.data_ptr(), storage)
            except (RuntimeError, NotImplementedError):  # tensor subclasses without one storage
                pass
        return t

    def measure(self) -> int:
        """Call after forward, before backward; drops the references so backward frees as usual."""
        if self._cuda is not None:
            self.bytes = max(0, torch.cuda.memory_allocated(self._cuda) - self._before)
        else:
            self.bytes = sum(s.nbytes() for s in self._storages.values())
        self._storages.clear()
        return self.bytes

    def __enter__(self) -> SavedActivations:
        if self._cuda is not None:  # the allocator counts: no hooks in the way of the forward
            self._hooks: Any = contextlib.nullcontext()
            self._before = torch.cuda.memory_allocated(self._cuda)
        else:
            self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._hooks.__exit__(*exc)

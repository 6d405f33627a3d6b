"""Throughput, MFU, memory and GPU telemetry: the numbers a step log line carries."""

from __future__ import annotations

import resource
import sys

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
    """Utilisation, temperature and power through NVML when the driver and nvidia-ml-py are present."""

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
    """Bytes autograd holds for backward at the end of forward (`with` block, then `measure()`).

    CPUs have no allocator counter like `torch.cuda.max_memory_allocated`; this measures what dominates
    memory besides the sharded state, and it is what `fsdpctl plan` estimates. Storages are read when
    forward has finished, so parameters FSDP already resharded (freed) count zero; ones it kept
    unsharded for backward count, as they occupy memory.
    """

    def __init__(self) -> None:
        self._storages: dict[int, torch.UntypedStorage] = {}
        self.bytes = 0

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
        self.bytes = sum(s.nbytes() for s in self._storages.values())
        self._storages.clear()
        return self.bytes

    def __enter__(self) -> SavedActivations:
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._hooks.__exit__(*exc)

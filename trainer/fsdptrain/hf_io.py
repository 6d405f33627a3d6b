"""The Hugging Face format at the run's two ends: PRETRAINED weights in (a hub id downloaded once
per node; rank 0 reads the safetensors files and broadcasts each shard) and EXPORT_DIR out (a full
state dict gathered on rank 0, written as a `from_pretrained`-ready directory that every rank waits
for). The sharded checkpoints between them are fsdptrain.checkpoint's."""

from __future__ import annotations

import os
import shutil
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    ValueType,
    get_model_state_dict,
    set_model_state_dict,
)

from fsdptrain.checkpoint import CheckpointError
from fsdptrain.runtime import Runtime


def export_hf(out_dir: Path, *, model: nn.Module, config: Any, tokenizer: Any) -> Path | None:
    """Collective. Gathers a full state dict on rank 0 and writes a `from_pretrained`-ready
    directory."""
    from safetensors.torch import save_file

    full = get_model_state_dict(
        model, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
    )
    if dist.get_rank() != 0:
        return None
    tmp = out_dir.with_name(f".{out_dir.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_file(
        {k: v.contiguous() for k, v in full.items() if isinstance(v, torch.Tensor)},  # all are
        str(tmp / "model.safetensors"),
        metadata={"format": "pt"},
    )
    config.save_pretrained(str(tmp))
    tokenizer.save_pretrained(str(tmp))
    if out_dir.exists():
        shutil.rmtree(out_dir)
    os.rename(tmp, out_dir)
    return out_dir


EXPORT_WAIT = timedelta(hours=4)  # rank 0 writing a 70B export (280 GB) to a slow volume
EXPORT_KEY = "fsdptrain/export-published"


def hold_until_published(rt: Runtime) -> None:
    """Every rank stays until rank 0 has published the export. Rank 0 writes it alone after the
    gather; a rank that exits meanwhile ends its pod with 0, and the Training Operator marks an
    elastic PyTorchJob Succeeded once any worker pod succeeded (v1.9.4
    pkg/controller.v1/pytorch/pytorchjob_controller.go, UpdateJobStatus) and then deletes the pods
    still running under cleanPodPolicy Running (pkg/controller.v1/common/job.go,
    DeletePodsAndServices): rank 0's, mid-export. The wait is on the process group's store, with its
    own deadline, not a collective under the collective timeout; the barrier after it keeps rank 0
    (the store's host) until every rank has seen the key."""
    if rt.world == 1:
        return
    store = dist.distributed_c10d._get_default_store()
    if rt.rank == 0:
        store.set(EXPORT_KEY, "1")
    else:
        store.wait([EXPORT_KEY], EXPORT_WAIT)
    dist.barrier()


def resolve_pretrained(name_or_path: str, *, local_rank: int) -> Path:
    """A local dir as is; a hub id downloaded once per node (HF_TOKEN for gated Llama-2 weights)."""
    path = Path(name_or_path)
    if path.is_dir():
        return path
    if name_or_path.startswith(("/", ".", "~")):
        raise CheckpointError(
            f"PRETRAINED={name_or_path!r} does not exist: check the path or mount"
        )
    if local_rank == 0:
        from huggingface_hub import snapshot_download

        snapshot_download(
            name_or_path,
            token=os.environ.get("HF_TOKEN") or None,
            allow_patterns=["*.safetensors", "*.json", "tokenizer*"],
        )
    dist.barrier()
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(name_or_path, local_files_only=True))


def load_pretrained(path: Path, *, model: nn.Module) -> None:
    """Collective. Rank 0 memory-maps the safetensors files and broadcasts each shard: one copy per
    job, not one per rank."""
    from safetensors.torch import load_file

    full: dict[str, ValueType] = {}
    if dist.get_rank() == 0:
        files = sorted(path.glob("*.safetensors"))
        if not files:
            raise CheckpointError(
                f"PRETRAINED={str(path)!r} has no *.safetensors files: convert or re-download"
            )
        for f in files:
            full.update(load_file(str(f)))
    set_model_state_dict(
        model, full, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    )

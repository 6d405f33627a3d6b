"""Data: Hugging Face `datasets` -> tokenizer -> packed fixed-length blocks, sharded by rank, resumable.

The position is one integer, `consumed`: how many blocks all ranks together have taken. Micro-step m of a
run gives rank r the blocks [consumed + r*B, consumed + (r+1)*B) of a seeded per-epoch permutation, so a run
resumed from a checkpoint sees exactly the data the uninterrupted run would have seen.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fsdptrain.config import ConfigError, TrainConfig

_SUFFIX_FORMAT = {
    ".txt": "text",
    ".text": "text",
    ".md": "text",
    ".json": "json",
    ".jsonl": "json",
    ".parquet": "parquet",
}


def load_tokenizer(path: str) -> Any:
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(path, token=os.environ.get("HF_TOKEN") or None)
    except OSError as e:
        raise ConfigError(
            f"TOKENIZER={path!r} could not be loaded: give a local tokenizer dir or hub id ({e})"
        ) from e
    if tok.eos_token_id is None:
        raise ConfigError(f"TOKENIZER={path!r} has no EOS token: documents could not be separated")
    return tok


def detect_format(path: str, declared: str) -> str:
    if declared != "auto":
        return declared
    p = Path(path)
    files = sorted(p.rglob("*")) if p.is_dir() else [p]
    for f in files:
        if f.suffix in _SUFFIX_FORMAT:
            return _SUFFIX_FORMAT[f.suffix]
    raise ConfigError(f"DATASET_FORMAT='auto' cannot tell the format of {path!r}: set text, json or parquet")


def _data_files(path: str) -> list[str]:
    p = Path(path)
    if p.is_file():
        return [str(p)]
    files = [str(f) for f in sorted(p.rglob("*")) if f.is_file() and f.suffix in _SUFFIX_FORMAT]
    if not files:
        raise ConfigError(f"DATASET={path!r} holds no .txt/.jsonl/.json/.parquet file")
    return files


def pack(token_lists: Iterable[Sequence[int]], eos_id: int, block: int) -> np.ndarray:
    """Concatenate documents separated by EOS and cut into [n, block] rows (the tail is dropped)."""
    flat = np.fromiter((t for ids in token_lists for t in (*ids, eos_id)), dtype=np.int64)
    n = len(flat) // block
    return flat[: n * block].reshape(n, block)


@dataclass
class PackedBlocks:
    """All blocks of a local dataset in memory (fine up to many millions of tokens per node)."""

    blocks: np.ndarray  # [n, seq_len + 1]
    seed: int

    def __len__(self) -> int:
        return len(self.blocks)

    def _perm(self, epoch: int) -> np.ndarray:
        return np.random.default_rng(self.seed + epoch).permutation(len(self.blocks))

    def take(self, start: int, count: int) -> np.ndarray:
        n = len(self.blocks)
        perms = {epoch: self._perm(epoch) for epoch in range(start // n, (start + count - 1) // n + 1)}
        return np.stack([self.blocks[perms[i // n][i % n]] for i in range(start, start + count)])


def load_local(cfg: TrainConfig, tokenizer: Any) -> PackedBlocks:
    import datasets

    fmt = detect_format(cfg.dataset, cfg.dataset_format)
    ds = datasets.load_dataset(fmt, data_files=_data_files(cfg.dataset), split="train")
    if cfg.dataset_text_field not in ds.column_names:
        raise ConfigError(
            f"DATASET_TEXT_FIELD={cfg.dataset_text_field!r} is not a column of {cfg.dataset!r}: "
            f"use one of {', '.join(ds.column_names)}"
        )
    texts = [t for t in ds[cfg.dataset_text_field] if t and t.strip()]
    ids = tokenizer(texts, add_special_tokens=False)["input_ids"]
    blocks = pack(ids, tokenizer.eos_token_id, cfg.seq_len + 1)
    if len(blocks) == 0:
        raise ConfigError(
            f"DATASET={cfg.dataset!r} has fewer than SEQ_LEN+1={cfg.seq_len + 1} tokens: "
            "add text or lower SEQ_LEN"
        )
    return PackedBlocks(blocks, cfg.seed)


class StreamingBlocks:
    """A hub data set read as a stream (clusters); resume skips the blocks already consumed. With
    HF_HUB_OFFLINE=1 the stream reads the repo's snapshot in the Hugging Face cache (fsdptrain.fetch)."""

    def __init__(self, cfg: TrainConfig, tokenizer: Any) -> None:
        self.cfg, self.tokenizer = cfg, tokenizer
        self._iter: Iterator[np.ndarray] | None = None
        self._next_index = 0

    def _blocks(self) -> Iterator[np.ndarray]:
        import datasets

        from fsdptrain.fetch import local_snapshot

        # offline (the job's pre-step fetched it): the snapshot in the cache, read as the hub repo would be
        source = local_snapshot(self.cfg.dataset, "dataset") or self.cfg.dataset
        ds = datasets.load_dataset(
            source,
            split=self.cfg.dataset_split,
            streaming=True,
            token=os.environ.get("HF_TOKEN") or None,
        )
        ds = ds.shuffle(seed=self.cfg.seed, buffer_size=10_000)
        block, buf = self.cfg.seq_len + 1, list[int]()
        for row in ds:
            buf.extend(
                self.tokenizer(row[self.cfg.dataset_text_field], add_special_tokens=False)["input_ids"]
            )
            buf.append(self.tokenizer.eos_token_id)
            while len(buf) >= block:
                yield np.asarray(buf[:block], dtype=np.int64)
                buf = buf[block:]

    def take(self, start: int, count: int) -> np.ndarray:
        if self._iter is None or start < self._next_index:
            self._iter, self._next_index = self._blocks(), 0
        while self._next_index < start:  # skip what a resumed run already trained on
            next(self._iter)
            self._next_index += 1
        rows = [next(self._iter) for _ in range(count)]
        self._next_index += count
        return np.stack(rows)


def load_blocks(cfg: TrainConfig, tokenizer: Any) -> PackedBlocks | StreamingBlocks:
    if Path(cfg.dataset).exists():
        return load_local(cfg, tokenizer)
    if cfg.dataset.startswith(("/", ".", "~")):
        raise ConfigError(f"DATASET={cfg.dataset!r} does not exist: check the path or mount")
    return StreamingBlocks(cfg, tokenizer)


class Loader:
    """Hands each rank its micro-batch and tracks the global position."""

    def __init__(
        self,
        blocks: PackedBlocks | StreamingBlocks,
        *,
        rank: int,
        world: int,
        micro_batch: int,
        consumed: int = 0,
    ) -> None:
        self.blocks, self.rank, self.world, self.micro_batch = blocks, rank, world, micro_batch
        self.consumed = consumed

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        if isinstance(self.blocks, StreamingBlocks):
            # each rank reads the same stream and keeps its own slice of every global micro-batch
            rows = self.blocks.take(self.consumed, self.micro_batch * self.world)
            rows = rows[self.rank * self.micro_batch : (self.rank + 1) * self.micro_batch]
        else:
            rows = self.blocks.take(self.consumed + self.rank * self.micro_batch, self.micro_batch)
        self.consumed += self.micro_batch * self.world
        t = torch.from_numpy(rows)
        return t[:, :-1].contiguous(), t[:, 1:].contiguous()

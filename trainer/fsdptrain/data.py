"""Data: Hugging Face `datasets` -> tokenizer -> packed fixed-length blocks, sharded by rank,
resumable.

The position is one integer, `consumed`: how many blocks all ranks together have taken. Micro-step m
of a run gives rank r the blocks [consumed + r*B, consumed + (r+1)*B) of a seeded per-epoch
permutation, so a run resumed from a checkpoint sees exactly the data the uninterrupted run would
have seen.
"""

from __future__ import annotations

import os
import queue
import threading
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
    raise ConfigError(
        f"DATASET_FORMAT='auto' cannot tell the format of {path!r}: set text, json or parquet"
    )


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
        perms = {
            epoch: self._perm(epoch) for epoch in range(start // n, (start + count - 1) // n + 1)
        }
        return np.stack([self.blocks[perms[i // n][i % n]] for i in range(start, start + count)])


def _datasets() -> Any:
    """The `datasets` package, imported only for a file or hub dataset (the builtin sample needs
    none: a GPU machine with torch and transformers alone trains on it), its progress bars off (log
    lines say it)."""
    import datasets

    datasets.disable_progress_bars()
    return datasets


def read_text_rows(files: Sequence[str]) -> list[str]:
    """The rows `datasets.load_dataset("text", ...)` gives, without `datasets` (the builtin sample
    then needs only torch and transformers, as on the GPU machine): its Text builder (datasets 5.2
    packaged_modules/text) reads each file as UTF-8 with universal newlines (CR LF and CR become LF)
    and makes one row per LF-ended line, the LF dropped; other line separators (U+2028, form feed)
    stay."""
    rows: list[str] = []
    for name in files:
        try:
            text = Path(name).read_text(encoding="utf-8")
            rows += text.removesuffix("\n").split("\n") if text else []
        except UnicodeDecodeError as e:
            where = f"DATASET file {name!r} is not UTF-8 text (byte {e.start})"
            raise ConfigError(f"{where}: save it as UTF-8") from None
    return rows


def _column(cfg: TrainConfig, fmt: str, files: list[str]) -> list[Any]:
    if fmt == "text":
        columns, rows = ["text"], read_text_rows(files) if cfg.dataset_text_field == "text" else []
    else:
        ds = _datasets().load_dataset(fmt, data_files=files, split="train")
        columns = ds.column_names
        rows = ds[cfg.dataset_text_field] if cfg.dataset_text_field in columns else []
    if cfg.dataset_text_field not in columns:
        raise ConfigError(
            f"DATASET_TEXT_FIELD={cfg.dataset_text_field!r} is not a column of {cfg.dataset!r}: "
            f"use one of {', '.join(columns)}"
        )
    return rows


def load_local(cfg: TrainConfig, tokenizer: Any) -> PackedBlocks:
    fmt = detect_format(cfg.dataset, cfg.dataset_format)
    texts = [t for t in _column(cfg, fmt, _data_files(cfg.dataset)) if t and t.strip()]
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
    HF_HUB_OFFLINE=1 the stream reads the repo's snapshot in the Hugging Face cache
    (fsdptrain.fetch)."""

    def __init__(self, cfg: TrainConfig, tokenizer: Any) -> None:
        self.cfg, self.tokenizer = cfg, tokenizer
        self._iter: Iterator[np.ndarray] | None = None
        self._next_index = 0

    def _blocks(self) -> Iterator[np.ndarray]:
        from fsdptrain.fetch import local_snapshot

        datasets = _datasets()

        # offline (the job's pre-step fetched it): the snapshot in the cache, read as the hub repo
        # would be
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
                self.tokenizer(row[self.cfg.dataset_text_field], add_special_tokens=False)[
                    "input_ids"
                ]
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
    """Hands each rank its micro-batch and tracks the global position.

    With `prefetch` > 0 a background thread builds the next batches (indexing, slicing, pinning on
    CUDA) while the main thread trains; they are the batches the synchronous loader gives, in the
    same order, and `consumed` counts only those the main thread took, so a checkpoint's position is
    unchanged. An error in the thread is raised by `next_batch`; `close` stops the thread (also on
    SIGTERM's orderly stop: the trainer closes it in a `finally`), and it is a daemon so it never
    holds up an exit.
    """

    def __init__(
        self,
        blocks: PackedBlocks | StreamingBlocks,
        *,
        rank: int,
        world: int,
        micro_batch: int,
        consumed: int = 0,
        prefetch: int = 0,
        pin_memory: bool = False,
        trace: Path | None = None,
    ) -> None:
        self.blocks, self.rank, self.world, self.micro_batch = blocks, rank, world, micro_batch
        self.trace = trace  # FSDPTRAIN_TRACE (tests only): a line per micro-batch this rank takes
        self.consumed = consumed
        self.prefetch, self.pin_memory = prefetch, pin_memory
        self._queue: queue.Queue[tuple[int, Any]] | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def batch_at(self, consumed: int) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's (inputs, labels) when `consumed` blocks have been taken by all ranks
        together."""
        if isinstance(self.blocks, StreamingBlocks):
            # each rank reads the same stream and keeps its own slice of every global micro-batch
            rows = self.blocks.take(consumed, self.micro_batch * self.world)
            rows = rows[self.rank * self.micro_batch : (self.rank + 1) * self.micro_batch]
        else:
            rows = self.blocks.take(consumed + self.rank * self.micro_batch, self.micro_batch)
        t = torch.from_numpy(rows)
        inputs, labels = t[:, :-1].contiguous(), t[:, 1:].contiguous()
        if (
            self.pin_memory
        ):  # page-locked: the copy to the GPU can then overlap compute (non_blocking)
            inputs, labels = inputs.pin_memory(), labels.pin_memory()
        return inputs, labels

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.prefetch <= 0:
            batch = self.batch_at(self.consumed)
        else:
            batch = self._take_prefetched()
        if self.trace is not None:
            self._trace()
        self.consumed += self.micro_batch * self.world
        return batch

    def _trace(self) -> None:
        """`FIRST COUNT`: the global block indices of the micro-batch this rank just took."""
        assert self.trace is not None
        with open(self.trace, "a") as f:
            f.write(f"{self.consumed + self.rank * self.micro_batch} {self.micro_batch}\n")

    def _take_prefetched(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self._thread is None:
            self._queue = queue.Queue(maxsize=self.prefetch)
            self._thread = threading.Thread(
                target=self._produce, args=(self.consumed,), name="fsdptrain-loader", daemon=True
            )
            self._thread.start()
        assert self._queue is not None
        while True:
            try:
                position, item = self._queue.get(timeout=1.0)
                break
            except queue.Empty:
                if not self._thread.is_alive():
                    raise RuntimeError("the data loading thread ended without a batch") from None
        if isinstance(item, BaseException):
            self.close()
            raise item
        if (
            position != self.consumed
        ):  # the thread and the main thread disagree on the data position
            raise RuntimeError(f"loader thread at position {position}, trainer at {self.consumed}")
        return item

    def _produce(self, position: int) -> None:
        assert self._queue is not None
        step = self.micro_batch * self.world
        while not self._stop.is_set():
            try:
                item: Any = self.batch_at(position)
            except BaseException as e:  # handed to the main thread, which raises it
                item = e
            while not self._stop.is_set():
                try:
                    self._queue.put((position, item), timeout=0.1)
                    break
                except queue.Full:
                    continue
            if isinstance(item, BaseException):
                return
            position += step

    def close(self) -> None:
        """Stop and join the background thread (if any); the position stays where the trainer is."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        self._queue = None
        self._stop = threading.Event()

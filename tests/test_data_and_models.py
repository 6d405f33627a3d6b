"""Data pipeline and model shapes, in-process (real datasets/tokenizers/transformers, no hub)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fsdptrain.config import ConfigError, TrainConfig
from fsdptrain.shapes import MODEL_CONFIGS, mesh_shape
from lazy import lazy

data = lazy("fsdptrain.data")  # imports torch
pytestmark = pytest.mark.xdist_group("torch")


def test_pack_separates_documents_with_eos_and_drops_the_tail():
    blocks = data.pack([[1, 2, 3], [4, 5]], eos_id=0, block=3)
    assert blocks.tolist() == [[1, 2, 3], [0, 4, 5]]  # the trailing EOS is dropped


def test_loader_shards_by_rank_and_resumes_at_the_same_position():
    blocks = data.PackedBlocks(np.arange(40).reshape(20, 2), seed=0)
    r0, r1 = (data.Loader(blocks, rank=r, world=2, micro_batch=3) for r in (0, 1))
    a0, a1 = r0.next_batch()[0], r1.next_batch()[0]
    assert set(a0[:, 0].tolist()).isdisjoint(a1[:, 0].tolist())  # ranks see different blocks
    expected = r0.next_batch()[0]
    resumed = data.Loader(blocks, rank=0, world=2, micro_batch=3, consumed=6)
    assert resumed.next_batch()[0].tolist() == expected.tolist()


def test_loader_wraps_into_a_new_epoch_with_a_new_order():
    blocks = data.PackedBlocks(np.arange(8).reshape(4, 2), seed=3)
    first, second = blocks.take(0, 4)[:, 0].tolist(), blocks.take(4, 4)[:, 0].tolist()
    assert sorted(first) == sorted(second) == [0, 2, 4, 6]
    assert first != second


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_local_jsonl_and_parquet(assets, tmp_path, fmt):
    corpus, tok_dir = assets
    rows = [{"content": line} for line in corpus.read_text().splitlines()[:50]]
    path = tmp_path / f"data.{fmt}"
    if fmt == "jsonl":
        path.write_text("\n".join(json.dumps(r) for r in rows))
    else:
        import datasets

        datasets.Dataset.from_list(rows).to_parquet(str(path))
    cfg = TrainConfig(
        dataset=str(path), tokenizer=str(tok_dir), dataset_text_field="content", seq_len=32
    )
    blocks = data.load_blocks(cfg, data.load_tokenizer(str(tok_dir)))
    assert blocks.blocks.shape[1] == 33 and len(blocks) > 10
    with pytest.raises(ConfigError, match="DATASET_TEXT_FIELD='text' is not a column"):
        cfg = TrainConfig(dataset=str(path), tokenizer=str(tok_dir), seq_len=32)
        data.load_blocks(cfg, data.load_tokenizer(str(tok_dir)))


def test_text_rows_without_datasets_are_the_rows_datasets_gives(tmp_path):
    """A text file (the builtin sample is one) is read without `datasets`, which the GPU machine
    lacks: generated files (CRLF, lone CR, form feeds, U+2028, empty lines, no final newline,
    several files), read by the real `datasets.load_dataset("text")` in chunks down to a few
    characters (its Text builder's `chunksize`, so lines and CR LF pairs fall across chunk ends),
    give exactly its rows; a file that is not UTF-8 is one ConfigError."""
    import random

    import datasets

    rng = random.Random(9)
    pieces = ["word", "é✓", " ", "\n", "\r\n", "\r", "\x0c", "\u2028", "\x85", "\n\n", "\t"]
    for case in range(12):
        files = []
        for i in range(rng.randrange(1, 4)):
            size = rng.randrange(0, 300)
            text = "".join(rng.choice(pieces) for _ in range(size))
            path = tmp_path / f"c{case}-{i}.txt"
            path.write_bytes(text.encode())
            files.append(str(path))
        chunk = rng.choice([1, 7, 64, 10 << 20])
        cache = str(tmp_path / "hf")
        want = datasets.load_dataset(
            "text", data_files=files, split="train", cache_dir=cache, chunksize=chunk
        )
        assert data.read_text_rows(files) == want["text"], case
    bad = tmp_path / "latin1.txt"
    bad.write_bytes("caf\xe9\n".encode("latin-1"))
    with pytest.raises(ConfigError, match=r"is not UTF-8 text \(byte 3\): save it as UTF-8"):
        data.read_text_rows([str(bad)])


@pytest.mark.parametrize(
    "name, billions",  # 70B (grouped-query attention) in `make test-fast`; ~7 s of CPU each
    [
        pytest.param("7b", 6.74, marks=pytest.mark.slow),
        pytest.param("13b", 13.02, marks=pytest.mark.slow),
        ("70b", 68.98),
    ],
)
def test_published_shapes_on_the_meta_device(name, billions):
    """Built on meta: a 70B is never materialised; the count matches the published sizes."""
    from fsdptrain.models import build_meta_model, llama_config

    model = build_meta_model(llama_config(name))
    counted = sum(p.numel() for p in model.parameters())
    assert all(p.is_meta for p in model.parameters())
    assert counted == MODEL_CONFIGS[name].num_params()
    assert counted / 1e9 == pytest.approx(billions, abs=0.01)
    if name == "70b":
        assert model.config.num_key_value_heads == 8


def test_mesh_shapes():
    assert mesh_shape("FULL_SHARD", 8, 0) == (8,)
    assert mesh_shape("NO_SHARD", 4, 0) == (4, 1)
    assert mesh_shape("HYBRID_SHARD", 16, 8) == (2, 8)
    with pytest.raises(ConfigError, match="HSDP_SHARD_SIZE=3 does not divide the world size 8"):
        mesh_shape("HYBRID_SHARD", 8, 3)

"""Offline assets for the quickstart and tests: a small English corpus and a BPE tokenizer trained
on it.

Nothing is fetched from a hub. The corpus is the documentation of Python's own standard library,
which every machine with Python has; the tokenizer is trained on it with `tokenizers` and saved in
the Hugging Face layout, so the trainer loads it with the same `AutoTokenizer.from_pretrained` it
uses on a cluster.

    python -m fsdptrain.assets OUT_DIR      # writes OUT_DIR/corpus.txt and OUT_DIR/tokenizer/
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
import tempfile
from pathlib import Path

_MODULES = (
    "argparse",
    "collections",
    "csv",
    "dataclasses",
    "datetime",
    "decimal",
    "difflib",
    "email.message",
    "fractions",
    "functools",
    "heapq",
    "http.client",
    "inspect",
    "json",
    "logging",
    "pathlib",
    "pickle",
    "random",
    "re",
    "shutil",
    "statistics",
    "string",
    "subprocess",
    "tarfile",
    "textwrap",
    "threading",
    "typing",
    "unittest",
    "urllib.parse",
    "zipfile",
)

VOCAB_SIZE = 512


def corpus_lines() -> list[str]:
    """One document per docstring, in a fixed order."""
    docs = []
    for name in _MODULES:
        mod = importlib.import_module(name)
        for _, obj in sorted(vars(mod).items()):
            doc = inspect.getdoc(obj) if (inspect.isclass(obj) or inspect.isfunction(obj)) else None
            if doc and len(doc) > 80 and getattr(obj, "__module__", "") == mod.__name__:
                docs.append(" ".join(doc.split()))
    return docs


def train_tokenizer(lines: list[str], out_dir: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=["<s>", "</s>", "<unk>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(lines, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
    fast.save_pretrained(str(out_dir))


def default_cache() -> Path:
    """$FSDPTRAIN_CACHE, else ~/.cache/fsdptrain (or the temp dir where home is read-only, as in
    some pods)."""
    if os.environ.get("FSDPTRAIN_CACHE"):
        return Path(os.environ["FSDPTRAIN_CACHE"])
    home = Path.home() / ".cache"
    base = (
        home
        if os.access(home if home.exists() else Path.home(), os.W_OK)
        else Path(tempfile.gettempdir())
    )
    return base / "fsdptrain" / "assets-v1"


def ensure_assets(root: str | os.PathLike) -> tuple[Path, Path]:
    """Create corpus + tokenizer under root once (atomically); return (corpus file, tokenizer
    dir)."""
    root = Path(root)
    corpus, tok_dir = root / "corpus.txt", root / "tokenizer"
    if corpus.exists() and (tok_dir / "tokenizer.json").exists():
        return corpus, tok_dir
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=root, prefix=".assets-"))
    lines = corpus_lines()
    (tmp / "corpus.txt").write_text("\n".join(lines) + "\n")
    train_tokenizer(lines, tmp / "tokenizer")
    for name in ("tokenizer", "corpus.txt"):
        target = root / name
        if not target.exists():
            os.replace(tmp / name, target)
    import shutil

    shutil.rmtree(tmp, ignore_errors=True)
    return corpus, tok_dir


if __name__ == "__main__":
    c, t = ensure_assets(sys.argv[1] if len(sys.argv) > 1 else "assets")
    print(f"corpus {c} ({c.stat().st_size} bytes), tokenizer {t}")

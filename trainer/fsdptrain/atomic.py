"""Writing a small file whole: a temp file beside it, then a rename (a reader sees the old file or
the new one, never half of one).

The temp file's name comes from mkstemp(3): random and made with O_EXCL (Python adds O_NOFOLLOW),
so a hard link, symbolic link or FIFO someone planted at a name guessed beforehand (the old
`.<name>.<pid>.tmp`) is never written through or waited on. On a shared volume others can write,
that guess is easy.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

MODE = 0o644  # what these files were under the usual umask: readable by the job's other users


def write_text(path: Path | str, text: str, *, fsync: bool = False, mode: int = MODE) -> None:
    """`text` into `path`, whole (see the module); `fsync`: on disk before the rename."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            os.fchmod(f.fileno(), mode)
            f.write(text)
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)

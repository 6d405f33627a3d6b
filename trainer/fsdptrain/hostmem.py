"""Host memory for CPU training: glibc's malloc kept from handing each step's buffers back to the
kernel.

A CPU step allocates and frees the same activations, all-gather buffers and gradients every time.
glibc's malloc (manual, "Malloc Tunable Parameters"; mallopt(3)) serves a block over
M_MMAP_THRESHOLD with its own mmap and unmaps it on free, and returns the heap's top to the kernel
once more than M_TRIM_THRESHOLD is free there. Both start at 128 KiB and rise only when the program
happens to free a large mmapped block, so whether a step reuses its memory or page-faults it in
again (the kernel zeroing every page) depends on what the process allocated before: measured here,
fsdptrain (which loads, tokenizes and starts a data thread first) took twice the minor faults of a
bare loop and steps 15-20% longer on the ~10M Llama, and either program flipped between the two
regimes from one run to the next (BENCHMARKS.md, "Trainer vs a bare fully_shard loop"). Fixing the
thresholds makes every run take the reusing path, as torch's CUDA caching allocator keeps what it
reserved. On CUDA the tensors are not in malloc's heap: nothing is changed there.
"""

from __future__ import annotations

import ctypes
import os

# mallopt's parameter numbers (glibc malloc.h)
M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3
# the largest mmap threshold glibc accepts on 64-bit (DEFAULT_MMAP_THRESHOLD_MAX: 4 MiB x
# sizeof(long)); a block over it is mmapped whatever is set
MMAP_THRESHOLD = 32 * 1024**2
TRIM_THRESHOLD = (
    1024**3
)  # free memory at the heap top is kept up to this (a step's peak, in practice)
TOP_PAD = 64 * 1024**2  # grow the heap in steps this large rather than page by page
# what is set: (mallopt parameter, the variable that sets it for a whole process, value)
THRESHOLDS = (
    (M_MMAP_THRESHOLD, "MALLOC_MMAP_THRESHOLD_", MMAP_THRESHOLD),
    (M_TRIM_THRESHOLD, "MALLOC_TRIM_THRESHOLD_", TRIM_THRESHOLD),
    (M_TOP_PAD, "MALLOC_TOP_PAD_", TOP_PAD),
)
# the user's own malloc settings, which win: glibc's variables, its tunables, or another allocator
USER_SETTINGS = (*(name for _, name, _ in THRESHOLDS), "MALLOC_MMAP_MAX_")


def environment() -> dict[str, str]:
    """The same thresholds as glibc's variables: for another program run under fsdptrain's
    settings."""
    return {name: str(value) for _, name, value in THRESHOLDS}


def user_choice(environ: dict[str, str] | os._Environ[str] = os.environ) -> str | None:
    """Why malloc is left as the user set it (the variable that says so), or None."""
    for name in USER_SETTINGS:
        if name in environ:
            return name
    if "glibc.malloc." in environ.get("GLIBC_TUNABLES", ""):
        return "GLIBC_TUNABLES"
    if any(a in environ.get("LD_PRELOAD", "") for a in ("jemalloc", "tcmalloc", "mimalloc")):
        return "LD_PRELOAD"
    return None


def glibc() -> ctypes.CDLL | None:
    """This process's C library when it is glibc (musl and macOS have no gnu_get_libc_version)."""
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018 (the lookup is the check)
    except (OSError, AttributeError):
        return None
    return libc


def keep_host_memory(environ: dict[str, str] | os._Environ[str] = os.environ) -> bool:
    """Fix glibc's thresholds for this process (see the module docstring); False where it is not
    glibc or the user chose their own malloc settings."""
    libc = glibc()
    if libc is None or user_choice(environ) is not None:
        return False
    return all(libc.mallopt(param, value) == 1 for param, _, value in THRESHOLDS)

"""fsdptrain.hostmem: on the CPU the trainer fixes glibc malloc's thresholds so that a step's freed
memory is reused instead of being returned to the kernel and page-faulted in again (issue 17's
per-step overhead).

Peer: this machine's real glibc, in a fresh Python process per case (the thresholds are process-wide
and glibc moves them with the process's history). What glibc does, from its manual ("Malloc Tunable
Parameters", https://www.gnu.org/software/libc/manual/html_node/Malloc-Tunable-Parameters.html, and
mallopt(3)): the heap's top is returned to the kernel once more than M_TRIM_THRESHOLD is free there;
unset, that threshold starts at 128 KiB and only rises (to at most twice DEFAULT_MMAP_THRESHOLD_MAX,
64 MiB) when a large mmapped block is freed; setting any of the thresholds, by mallopt or by its
MALLOC_*_ variable, turns that adjustment off.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys

import pytest

from fsdptrain import hostmem

pytestmark = pytest.mark.skipif(hostmem.glibc() is None, reason="glibc malloc only (Linux)")

# A step's buffers allocated and freed by a long-lived thread other than the main one, as gloo's
# worker threads and the data thread do (glibc gives such a thread its own arena, a heap it shrinks
# back to the kernel once more than M_TRIM_THRESHOLD is free at its top): ten 1 MB blocks, every
# page touched, eight times; the minor page faults of the last four repeats are the steady state.
# Plain malloc, as torch's CPU allocator calls it (c10::alloc_cpu: posix_memalign), without torch's
# import time.
STEPS = """
import ctypes, json, queue, resource, sys, threading
from fsdptrain import hostmem
kept = hostmem.keep_host_memory() if sys.argv[1] == "keep" else False
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
def step():
    held = [libc.malloc(1_000_000) for _ in range(10)]
    for p in held:
        ctypes.memset(p, 1, 1_000_000)
    for p in reversed(held):
        libc.free(p)
todo, done = queue.Queue(), queue.Queue()
def worker():
    while todo.get():
        step()
        done.put(1)
threading.Thread(target=worker, daemon=True).start()
faults = []
for _ in range(8):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    todo.put(1)
    done.get()
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps({"kept": kept, "faults": sum(faults[4:])}))
"""
PAGES = 4 * 10 * 1e6 / 4096  # the last four repeats' pages


def _steps(mode: str, env: dict[str, str] | None = None) -> dict:
    p = subprocess.run(
        [sys.executable, "-c", STEPS, mode],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
        env=env,
    )
    return json.loads(p.stdout)


def test_a_steps_freed_memory_is_reused_instead_of_faulted_in_again():
    """With glibc's moving thresholds the thread's arena gives each repeat's 10 MB back and faults
    it in again (measured here: about 90% of the pages, every repeat); with fixed ones it keeps them
    (none)."""
    default, kept = _steps("default"), _steps("keep")
    assert kept["kept"] is True and default["kept"] is False
    assert default["faults"] > 0.5 * PAGES, default
    assert kept["faults"] < 0.05 * PAGES, kept


def _user_environments(rng: random.Random) -> list[tuple[dict[str, str], str | None]]:
    """(environment, the variable that should win) for generated environments."""
    cases: list[tuple[dict[str, str], str | None]] = []
    for name in hostmem.USER_SETTINGS:
        cases.append(({name: str(rng.choice([0, 65536, 1 << 20])), "HOME": "/root"}, name))
    for tunable in (
        "glibc.malloc.trim_threshold=0",
        "glibc.malloc.arena_max=1:glibc.pthread.rseq=0",
    ):
        cases.append(({"GLIBC_TUNABLES": tunable}, "GLIBC_TUNABLES"))
    for lib in (
        "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2",
        "libtcmalloc_minimal.so.4",
        "libmimalloc.so",
    ):
        cases.append(({"LD_PRELOAD": f"/opt/x.so:{lib}"}, "LD_PRELOAD"))
    # nothing about malloc: fsdptrain sets its thresholds
    cases += [({}, None), ({"GLIBC_TUNABLES": "glibc.pthread.rseq=0"}, None)]
    cases += [({"LD_PRELOAD": "libfoo.so"}, None)]
    cases += [({"MALLOC_ARENA_MAX": "2", "PYTHONMALLOC": "malloc"}, None)]
    return cases


def test_the_users_own_malloc_choice_wins():
    """A user who set glibc's variables or tunables, or preloaded another allocator, keeps what they
    chose: the trainer sets nothing and says so (no banner words)."""
    for env, winner in _user_environments(random.Random(17)):
        assert hostmem.user_choice(env) == winner, env
        if winner is not None:
            assert hostmem.keep_host_memory(env) is False


def test_a_user_setting_reaches_glibc_instead_of_ours():
    """In a real process: MALLOC_TRIM_THRESHOLD_=0 (trim at every free) makes the repeats fault
    again, as the user asked, because the trainer's thresholds are not set over it."""
    import os

    users, ours = _steps("keep", {**os.environ, "MALLOC_TRIM_THRESHOLD_": "0"}), _steps("keep")
    assert users["kept"] is False and ours["kept"] is True
    assert users["faults"] > 0.5 * PAGES > 0.05 * PAGES > ours["faults"], (users, ours)

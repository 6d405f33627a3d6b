"""SIGTERM and SIGHUP taken as Ctrl-C while a submit runs or a job is followed (a light module of its
own: the read verbs that follow a job import it without the submit machinery)."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager


class Interrupted(KeyboardInterrupt):
    """SIGTERM or SIGHUP during a submit or while a job is followed, taken as Ctrl-C is (a submit's
    submission is found and cancelled; a followed job is stopped or left), before the command ends
    with 128 + the signal's number, as a shell reports a process that signal ended."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextmanager
def signals_interrupt() -> Iterator[None]:
    """SIGTERM and SIGHUP raise Interrupted in the block (main thread only: Python delivers signals
    there; its default for both ends the process at once, without a word), so a `job run` that CI's
    timeout or a closed terminal ends still cancels or records what it submitted, and a followed
    job is let go as Ctrl-C would. SIGKILL cannot be caught: a submit's intent stays (`settle`)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, _frame: object) -> None:
        raise Interrupted(signum)

    saved = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, old in saved.items():
            signal.signal(sig, old)

"""How long a waiter rides out an outside system that does not answer.

`job wait` (and a followed `job run`) must not take an API server restart or a slurmctld failover
for the job's end, nor wait forever on a control plane that is gone: kubectl's own `wait` fails on
the first request error; fsdpctl rides out an outage of up to OUTAGE_REQUESTS request deadlines
(REQUEST_TIMEOUT each: 5 minutes by default, longer than an EKS control-plane restart's blip), then
fails naming what did not answer.
"""

from __future__ import annotations

import time

from fsdpctl.errors import FsdpctlError

OUTAGE_REQUESTS = 10


class Outage:
    """The current run of unanswered polls: `answered()` ends it, `unanswered(what)` raises once it
    has lasted longer than OUTAGE_REQUESTS x `request_timeout`."""

    def __init__(self, request_timeout: float) -> None:
        self.limit_s = OUTAGE_REQUESTS * request_timeout
        self.since: float | None = None

    def answered(self) -> None:
        self.since = None

    def unanswered(self, what: str) -> None:
        now = time.monotonic()
        if self.since is None:
            self.since = now
        elif now - self.since > self.limit_s:
            raise FsdpctlError(
                f"no answer for {now - self.since:.0f} s, waited out no longer: {what}",
                hint=f"waits ride out {OUTAGE_REQUESTS} x REQUEST_TIMEOUT "
                f"({self.limit_s:g} s) without an answer; `fsdpctl job wait` again once it answers",
            )

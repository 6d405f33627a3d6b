"""A waiter rides out a bounded outage and no more (fsdpctl.job.outage): generated sequences of
answered and unanswered polls against a fake clock.

Peer: none needed, the rule is pure; the backends' waits meet real silent endpoints in
tests/test_silent_endpoints.py (a TCP server that never answers: `job wait` fails naming it) and a
restarting API server / slurmctld in tests/conformance/test_paths.py ("controller gone": the wait
outlives it)."""

from __future__ import annotations

import random

import pytest

from fsdpctl.errors import FsdpctlError
from fsdpctl.job import outage


@pytest.mark.parametrize("seed", range(40))
def test_only_an_unbroken_outage_longer_than_the_limit_fails(seed, monkeypatch):
    rng = random.Random(seed)
    request_timeout = rng.choice([0.3, 1.0, 30.0])
    now = [1000.0]
    monkeypatch.setattr(outage.time, "monotonic", lambda: now[0])
    away = outage.Outage(request_timeout)
    limit = outage.OUTAGE_REQUESTS * request_timeout
    since = None
    for _ in range(200):
        now[0] += rng.uniform(0, request_timeout * 3)
        if rng.random() < 0.15:
            away.answered()
            since = None
            continue
        since = now[0] if since is None else since
        if now[0] - since > limit:
            with pytest.raises(FsdpctlError) as raised:
                away.unanswered("https://api.example:443")
            assert "https://api.example:443" in str(raised.value)
            assert "REQUEST_TIMEOUT" in (raised.value.hint or "")
            return
        away.unanswered("https://api.example:443")

"""Adapter: HTTP(S) downloads of published files (the pinned upstream releases `fsdpctl deploy fetch` caches).
The caller checks what arrived (its sha256) before it uses it."""

from __future__ import annotations

import urllib.error
import urllib.request
from pathlib import Path

from fsdpctl.errors import FsdpctlError


class DownloadError(FsdpctlError):
    pass


def download(url: str, dest: Path, *, timeout: float = 60) -> Path:
    """The body of `url` written to `dest` (its folder created); DownloadError naming the URL and the reason
    when it cannot be read."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            dest.write_bytes(r.read())
    except (urllib.error.URLError, TimeoutError, OSError) as e:
        reason = (
            f"HTTP {e.code} {e.reason}" if isinstance(e, urllib.error.HTTPError) else getattr(e, "reason", e)
        )
        raise DownloadError(
            f"cannot download {url}: {reason}",
            hint="check the network (or a proxy), or fill the cache from a mirror (--from)",
        ) from e
    return dest

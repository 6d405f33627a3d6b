"""Adapter: HTTP(S) downloads of published files (the pinned upstream releases `fsdpctl deploy
fetch` caches). The caller checks what arrived (its sha256) before it uses it."""

from __future__ import annotations

import http.client
import os
import urllib.error
import urllib.request
from pathlib import Path

from fsdpctl import files
from fsdpctl.errors import FsdpctlError

NETWORK_HINT = "check the network (or a proxy), or fill the cache from a mirror (--from)"


class DownloadError(FsdpctlError):
    pass


def download(url: str, dest: Path, *, timeout: float = 60) -> Path:
    """The body of `url` written to `dest`; DownloadError naming the URL and the reason when it
    cannot be read or written. All or nothing: the body is read whole before anything is written,
    then written beside `dest` and renamed onto it, so an offline machine, a dropped connection or a
    full disk leaves neither a half file nor a folder this call made."""
    try:
        # an opener per call, not urlopen's global one: that one keeps the proxies of its first use
        with urllib.request.build_opener().open(url, timeout=timeout) as r:
            body = r.read()
    # URLError (DNS, refused, HTTP status), socket timeouts and resets (OSError), a body cut short
    # (http.client.IncompleteRead: an HTTPException, not an OSError), a URL urllib cannot parse
    # (ValueError)
    except (OSError, http.client.HTTPException, ValueError) as e:
        raise DownloadError(f"cannot download {url}: {_reason(e)}", hint=NETWORK_HINT) from e
    made = [p for p in (dest.parent, *dest.parent.parents) if not p.exists()]
    tmp: Path | None = None
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = files.temp_beside(dest, 0o644)  # a random name: nothing planted written through
        with os.fdopen(fd, "wb") as f:
            f.write(body)
        os.replace(tmp, dest)
    except OSError as e:
        if tmp is not None:
            tmp.unlink(missing_ok=True)
        for (
            folder
        ) in made:  # deepest first: only the folders this call made, and only if left empty
            try:
                folder.rmdir()
            except OSError:
                break
        raise DownloadError(
            f"cannot write {dest}: {e.strerror or e}",
            hint="free some space or fix the folder's permissions",
        ) from e
    return dest


def _reason(e: BaseException) -> str:
    if isinstance(e, urllib.error.HTTPError):
        return f"HTTP {e.code} {e.reason}"
    if isinstance(getattr(e, "reason", e), TimeoutError):  # socket.timeout: the deadline passed
        return "no answer in time (REQUEST_TIMEOUT)"
    reason = getattr(e, "reason", None) or e
    return getattr(reason, "strerror", None) or str(reason) or type(reason).__name__

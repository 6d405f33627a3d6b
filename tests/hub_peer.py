"""A Hugging Face Hub peer on 127.0.0.1: the HTTP contract huggingface_hub speaks (no hub is
reachable from these machines), served from repositories the test builds in memory.

What it answers, as huggingface.co does (huggingface_hub 2.x reads exactly these):
- `GET /api/{models,datasets}/<id>/revision/<rev>`: the repo's `sha` and `siblings`;
- `GET /api/{models,datasets}/<id>/tree/<rev>?recursive=...`: one page of `{"type": "file", "oid", "size",
  "path", "lfs"}` entries (LFS for *.safetensors and *.parquet, as the Hub stores them);
- `HEAD|GET /<id>/resolve/<rev>/<path>` (datasets under `/datasets/`): the bytes with `X-Repo-Commit`,
  `ETag` (and `X-Linked-Etag`/`X-Linked-Size` for LFS files), a `Range` request answered with 206;
- errors with the Hub's `X-Error-Code`: an unknown repo is 401 `RepoNotFound` without a token (the Hub does
  not tell a private repo from a missing one) and 404 with one; a gated repo without an accepted token is
  401 `GatedRepo` (no token) or 403 `GatedRepo` (a token without access); an unknown file is 404
  `EntryNotFound`.

Every request is recorded (`requests`), so a test counts what reached the hub; `down()` stops
answering as an unreachable hub would (the port closed)."""

from __future__ import annotations

import hashlib
import json
import re
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlparse

LFS_SUFFIXES = (".safetensors", ".parquet", ".bin")


@dataclass
class Repo:
    files: dict[str, bytes]
    gated_tokens: set[str] | None = None  # None: public; else the tokens granted access
    sha: str = ""

    def __post_init__(self) -> None:
        digest = hashlib.sha1()
        for path in sorted(self.files):
            digest.update(path.encode() + b"\0" + self.files[path])
        self.sha = self.sha or digest.hexdigest()


@dataclass
class HubPeer:
    repos: dict[tuple[str, str], Repo] = field(default_factory=dict)  # (model|dataset, id) -> repo
    requests: list[tuple[str, str]] = field(default_factory=list)  # (method, path)
    cut: set[str] = field(
        default_factory=set
    )  # file names whose GET stops half-way (a dropped connection)
    # file name -> seconds its GET takes: the body comes in ten parts with a pause before each (each
    # pause well under huggingface_hub's 10 s read timeout), so a download in progress can be
    # watched
    delay_s: dict[str, float] = field(default_factory=dict)
    server: ThreadingHTTPServer | None = None

    @property
    def endpoint(self) -> str:
        assert self.server is not None
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"

    def add(
        self, kind: str, repo_id: str, files: dict[str, bytes], gated_tokens: set[str] | None = None
    ):
        self.repos[(kind, repo_id)] = Repo(files, gated_tokens)
        return self.repos[(kind, repo_id)]

    def add_dir(
        self, kind: str, repo_id: str, directory: Path, gated_tokens: set[str] | None = None
    ):
        files = {
            str(p.relative_to(directory)): p.read_bytes()
            for p in sorted(directory.rglob("*"))
            if p.is_file()
        }
        return self.add(kind, repo_id, files, gated_tokens)

    def downloads(self, path_suffix: str = "") -> int:
        """GETs of file contents (not HEADs, not API calls) whose path ends with path_suffix."""
        return sum(
            1
            for m, p in self.requests
            if m == "GET" and "/resolve/" in p and p.endswith(path_suffix)
        )

    def down(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None


@contextmanager
def running(peer: HubPeer | None = None, host: str = "127.0.0.1") -> Iterator[HubPeer]:
    """The peer answering on `host` (another address of this machine: the Slurm peer's nodes reach
    it at their bridge's, tests/slurm_peer.py)."""
    peer = peer or HubPeer()
    handler = type("Handler", (_Handler,), {"peer": peer})
    peer.server = _Server((host, 0), handler)
    thread = threading.Thread(target=peer.server.serve_forever, daemon=True)
    thread.start()
    fresh_hub_client()
    try:
        yield peer
    finally:
        peer.down()
        thread.join(timeout=10)
        fresh_hub_client()


def fresh_hub_client() -> None:
    """huggingface_hub keeps one HTTP client per process (utils/_http.py, get_session), made with
    the proxy variables of the moment of its first request: one made under another in-process test's
    environment (the fuzzer points HTTP proxies at a closed port) sent this peer's requests there
    (ConnectError). Closed, the next request makes a new one from the environment as it is now."""
    if "huggingface_hub" in sys.modules:
        from huggingface_hub.utils import close_session

        close_session()


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(
        self, request, client_address
    ) -> None:  # a client that hung up is no server error
        if not isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            super().handle_error(request, client_address)


_API = re.compile(r"^/api/(models|datasets)/([^/]+/[^/]+)(?:/(revision|tree)/([^/]+)(/.*)?)?$")
_RESOLVE = re.compile(r"^/(datasets/)?([^/]+/[^/]+)/resolve/([^/]+)/(.+)$")


class _Handler(BaseHTTPRequestHandler):
    peer: HubPeer
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:  # quiet: the test reads `requests`
        pass

    def do_GET(self) -> None:
        self._serve(body=True)

    def do_HEAD(self) -> None:
        self._serve(body=False)

    def _serve(self, body: bool) -> None:
        url = urlparse(self.path)
        path = unquote(url.path)
        self.peer.requests.append((self.command, path))
        if m := _API.match(path):
            kind = m.group(1)[:-1]
            repo = self._repo(kind, m.group(2), m.group(4) or "main")
            if repo is None:
                return
            if m.group(3) in ("revision", None):
                data = {
                    "id": m.group(2),
                    "sha": repo.sha,
                    "siblings": [{"rfilename": f} for f in repo.files],
                }
                return self._json(200, data, body)
            recursive = parse_qs(url.query).get("recursive", ["false"])[0].lower() == "true"
            return self._json(200, _tree(repo, recursive), body)
        if m := _RESOLVE.match(path):
            repo = self._repo("dataset" if m.group(1) else "model", m.group(2), m.group(3))
            if repo is None:
                return
            return self._file(repo, m.group(4), body)
        self._error(404, "", "Not Found", body)

    def _repo(self, kind: str, repo_id: str, revision: str) -> Repo | None:
        repo = self.peer.repos.get((kind, repo_id))
        token = (self.headers.get("Authorization") or "").removeprefix("Bearer ").strip()
        if repo is None:
            self._error(404 if token else 401, "RepoNotFound", "Repository not found", True)
            return None
        if repo.gated_tokens is not None and token not in repo.gated_tokens:
            msg = f"Access to model {repo_id} is restricted. You must have access to it and be authenticated."
            self._error(403 if token else 401, "GatedRepo", msg, True)
            return None
        if revision not in ("main", repo.sha):
            self._error(404, "RevisionNotFound", "Invalid rev id", True)
            return None
        return repo

    def _file(self, repo: Repo, name: str, body: bool) -> None:
        if name not in repo.files:
            return self._error(404, "EntryNotFound", "Entry not found", body)
        data = repo.files[name]
        headers = {
            "X-Repo-Commit": repo.sha,
            "Accept-Ranges": "bytes",
            "Content-Type": "application/octet-stream",
        }
        if name.endswith(LFS_SUFFIXES):
            etag = hashlib.sha256(data).hexdigest()
            headers |= {
                "X-Linked-Etag": f'"{etag}"',
                "X-Linked-Size": str(len(data)),
                "ETag": f'"{etag}"',
            }
        else:
            headers["ETag"] = f'"{_git_oid(data)}"'
        status, chunk = 200, data
        if body and (rng := re.match(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))):
            start, end = int(rng.group(1)), int(rng.group(2) or len(data) - 1)
            status, chunk = 206, data[start : end + 1]
            headers["Content-Range"] = f"bytes {start}-{start + len(chunk) - 1}/{len(data)}"
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(chunk)))
        self.end_headers()
        if body and name in self.peer.cut:  # half the promised bytes, then the connection drops
            self.wfile.write(chunk[: len(chunk) // 2])
            self.wfile.flush()
            self.close_connection = True
            return
        if body:
            parts = 10 if name in self.peer.delay_s else 1
            step = -(-len(chunk) // parts)
            for i in range(0, len(chunk), step):
                time.sleep(self.peer.delay_s.get(name, 0) / parts)
                self.wfile.write(chunk[i : i + step])
                self.wfile.flush()

    def _json(self, status: int, data: object, body: bool) -> None:
        raw = json.dumps(data).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        if body:
            self.wfile.write(raw)

    def _error(self, status: int, code: str, message: str, body: bool) -> None:
        raw = json.dumps({"error": message}).encode()
        self.send_response(status)
        if code:
            self.send_header("X-Error-Code", code)
        self.send_header("X-Error-Message", message)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        if body and self.command != "HEAD":
            self.wfile.write(raw)


def _git_oid(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _tree(repo: Repo, recursive: bool) -> list[dict]:
    entries, folders = [], set()
    for path, data in sorted(repo.files.items()):
        parts = path.split("/")
        if len(parts) > 1 and not recursive:
            folders.add(parts[0])
            continue
        folders.update("/".join(parts[:i]) for i in range(1, len(parts)))
        entry = {"type": "file", "oid": _git_oid(data), "size": len(data), "path": path}
        if path.endswith(LFS_SUFFIXES):
            entry["lfs"] = {
                "oid": hashlib.sha256(data).hexdigest(),
                "size": len(data),
                "pointerSize": 134,
            }
        entries.append(entry)
    return [
        *(
            {"type": "directory", "oid": _git_oid(f.encode()), "size": 0, "path": f}
            for f in sorted(folders)
        ),
        *entries,
    ]

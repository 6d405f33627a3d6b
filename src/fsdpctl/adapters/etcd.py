"""Adapter: a real etcd server (Debian's etcd-server) on loopback, for torchrun's etcd
rendezvous."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from fsdpctl.adapters import shell


class EtcdError(RuntimeError):
    pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class EtcdServer:
    proc: subprocess.Popen
    client_port: int
    host: str = "127.0.0.1"

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.client_port}"

    def healthy(self) -> bool:
        import urllib.request  # (with http.client, ssl) only when etcd is asked, not to list jobs

        try:
            with urllib.request.urlopen(f"http://{self.endpoint}/health", timeout=1) as r:
                return b"true" in r.read()
        except OSError:
            return False

    def stop(self, timeout: float = 10) -> None:
        shell.end(self.proc, timeout)


def start(
    data_dir: Path,
    *,
    log_file: Path,
    timeout: float = 30,
    client_port: int | None = None,
    host: str = "127.0.0.1",
) -> EtcdServer:
    """Start etcd with the v2 API enabled (torch's etcd backends speak v2) and wait until it is
    healthy. Clients reach it on `host` (the local backend's node bridge, or loopback); peers stay
    on loopback."""
    binary = shutil.which("etcd")
    if not binary:
        raise EtcdError(
            "etcd is not installed: apt-get install etcd-server (or use RDZV_BACKEND=c10d)"
        )
    client, peer = client_port or free_port(), free_port()
    data_dir.mkdir(parents=True, exist_ok=True)
    argv = [
        binary,
        "--name",
        "fsdpctl",
        "--data-dir",
        str(data_dir),
        "--enable-v2",
        "--listen-client-urls",
        f"http://{host}:{client}",
        "--advertise-client-urls",
        f"http://{host}:{client}",
        "--listen-peer-urls",
        f"http://127.0.0.1:{peer}",
        "--initial-advertise-peer-urls",
        f"http://127.0.0.1:{peer}",
        "--initial-cluster",
        f"fsdpctl=http://127.0.0.1:{peer}",
    ]
    # same session as the caller: etcd ends with the supervisor that started it
    proc = shell.spawn(argv, env=dict(os.environ), log=log_file, new_session=False)
    server = EtcdServer(proc, client, host)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise EtcdError(f"etcd exited with code {proc.returncode}: see {log_file}")
        if server.healthy():
            return server
        time.sleep(0.2)
    server.stop()
    raise EtcdError(f"etcd did not become healthy within {timeout:.0f}s: see {log_file}")

"""Adapter: the rendezvous store an elastic local job's supervisor hosts (fsdptrain.rdzv_store says why it
is off the worker nodes): started before the launchers, stopped after them."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from fsdpctl.adapters import shell
from fsdpctl.adapters.etcd import free_port


class StoreError(RuntimeError):
    pass


@dataclass
class StoreHost:
    proc: subprocess.Popen[bytes]
    host: str
    port: int

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.port}"

    def stop(self, timeout: float = 10) -> None:
        shell.end(self.proc, timeout)


def start(host: str, *, log_file: Path, env: dict[str, str], timeout: float = 60) -> StoreHost:
    """The store on `host` (the nodes' bridge side, or loopback) at a free port, once it accepts a
    connection; its output in `log_file`."""
    port = free_port()
    argv = [sys.executable, "-m", "fsdptrain.rdzv_store", host, str(port)]
    server = StoreHost(shell.spawn(argv, env=env, log=log_file), host, port)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise StoreError(
                f"the rendezvous store exited with {server.proc.returncode}: see {log_file}"
            )
        try:
            with socket.create_connection((host, port), timeout=1):
                return server
        except OSError:
            time.sleep(0.1)  # torch's import takes seconds: nothing to wait on but the port
    server.stop()
    raise StoreError(f"the rendezvous store did not listen on {server.endpoint} in {timeout:.0f} s")

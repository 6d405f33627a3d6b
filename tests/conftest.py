"""Shared fixtures. Peers: real torchrun processes on CPU with gloo; offline assets built by fsdptrain.assets."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _shared() -> Path:
    """../shared beside the checkout (FSDPCTL_SHARED overrides). A clone made elsewhere from a local checkout
    (`git clone /work/main /tmp/x`) finds it beside the checkout it was cloned from."""
    if os.environ.get("FSDPCTL_SHARED"):
        return Path(os.environ["FSDPCTL_SHARED"])
    here = ROOT.parent / "shared"
    if here.is_dir():
        return here
    origin = subprocess.run(
        ["git", "-C", str(ROOT), "config", "--get", "remote.origin.url"], capture_output=True, text=True
    ).stdout.strip()
    if origin and Path(origin).is_dir() and (Path(origin).resolve().parent / "shared").is_dir():
        return Path(origin).resolve().parent / "shared"
    return here


SHARED = _shared()


@pytest.fixture(scope="session")
def assets(tmp_path_factory):
    from fsdptrain.assets import ensure_assets

    corpus, tok = ensure_assets(tmp_path_factory.mktemp("assets"))
    return corpus, tok


@dataclass
class Run:
    rc: int
    stdout: str
    stderr: str

    @property
    def records(self) -> list[dict]:
        return [json.loads(line) for line in self.stdout.splitlines() if line.startswith('{"event"')]

    def events(self, kind: str) -> list[dict]:
        return [r for r in self.records if r["event"] == kind]

    @property
    def summary(self) -> dict:
        found = self.events("summary")
        assert found, (
            f"no summary line; rc={self.rc}\nstdout:\n{self.stdout[-3000:]}\nstderr:\n{self.stderr[-3000:]}"
        )
        return found[0]

    @property
    def losses(self) -> list[float]:
        return [r["loss"] for r in self.events("step")]


def train_env(assets, **settings) -> dict:
    corpus, tok = assets
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FSDP", "PET_", "TORCHELASTIC"))}
    # fp32 unless a test asks for another precision: bf16 matmuls are 3-4x slower on CPUs without bf16 units
    env.update(
        DATASET=str(corpus),
        TOKENIZER=str(tok),
        MODEL="tiny",
        SEQ_LEN="64",
        MICRO_BATCH_SIZE="2",
        WARMUP_STEPS="3",
        LR="3e-3",
        PRECISION="fp32",
        PYTHONUNBUFFERED="1",
    )
    env.update({k: str(v) for k, v in settings.items()})
    return env


def torchrun_argv(nproc: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        "-m",
        "fsdptrain",
    ]


def torchrun(assets, nproc: int = 2, timeout: int = 300, **settings) -> Run:
    """A real multi-process torchrun of the trainer (CPU, gloo)."""
    p = subprocess.run(
        torchrun_argv(nproc),
        env=train_env(assets, **settings),
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )
    return Run(p.returncode, p.stdout, p.stderr)


@pytest.fixture(scope="session")
def moto_server():
    """AWS stand-in: moto in server mode on 127.0.0.1, spoken to over HTTP by real boto3 / terraform."""
    from fsdpctl.adapters.etcd import free_port

    port = free_port()
    exe = Path(sys.executable).parent / "moto_server"
    proc = subprocess.Popen(
        [str(exe), "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    url = f"http://127.0.0.1:{port}"
    for _ in range(100):
        try:
            urllib.request.urlopen(url + "/moto-api/", timeout=1)
            break
        except OSError:
            time.sleep(0.1)
    yield url
    proc.terminate()
    proc.wait(10)


@pytest.fixture
def aws_env(moto_server, monkeypatch, tmp_path):
    """A clean moto (state reset), fake credentials, and no fsdpctl settings leaking in from the environment."""
    from fsdpctl.settings import setting_keys

    urllib.request.urlopen(urllib.request.Request(moto_server + "/moto-api/reset", method="POST"))
    for key in setting_keys():
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_server)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    monkeypatch.setenv("FSDPCTL_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    return moto_server

"""`fsdpctl image build|push`. Peers: moto server for ECR (repository, GetAuthorizationToken, over
HTTP with real boto3); for the engine, a real Debian docker.io dockerd started here (no bridge, no
iptables) with a base image made by debootstrap, and Debian's docker-registry on 127.0.0.1 standing
in for ECR, its htpasswd holding the user/password of moto's ECR token. Skipped with the reason
where the engine cannot run (not root, packages missing); never faked."""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

import boto3
import pytest

import conftest
from conftest import ROOT
from fsdpctl.adapters.aws import Aws
from fsdpctl.adapters.etcd import free_port

MOTO_PASSWORD = (
    "123456789012-auth-token"  # what moto's ECR token decodes to: AWS:<account>-auth-token
)


def invoke(*args: str):
    """fsdpctl in process; every test here takes aws_env, which isolates it (conftest's `cli`
    fixture)."""
    return conftest.invoke(*args)


def said(r) -> str:
    """stderr as one line: rich wraps messages at the terminal width."""
    return " ".join(r.output.split())


def test_build_dry_run_prints_the_exact_command(aws_env):
    r = invoke(
        "--set",
        "AWS_ACCOUNT_ID=123456789012",
        "image",
        "build",
        "--dry-run",
        "--base-image",
        "base:1",
        "--build-arg",
        "INSTALL_EFA=false",
        "--network",
        "host",
    )
    assert r.exit_code == 0, r.output
    uri = "123456789012.dkr.ecr.us-east-1.amazonaws.com/fsdpctl-trainer:0.1.0"
    assert r.stdout.strip() == (
        f"docker build -f {ROOT}/docker/Dockerfile -t {uri} --build-arg INSTALL_EFA=false "
        f"--build-arg BASE_IMAGE=base:1 --network host {ROOT}"
    )


def test_registry_comes_from_sts_when_no_account_is_set(aws_env):
    r = invoke("image", "push", "--dry-run")
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    # moto's account, through sts:GetCallerIdentity
    registry = "123456789012.dkr.ecr.us-east-1.amazonaws.com"
    assert lines[1].startswith(f"docker login --username AWS --password-stdin {registry}")
    assert lines[2] == f"docker push {registry}/fsdpctl-trainer:0.1.0"


def test_bad_build_arg_and_missing_context(aws_env, tmp_path):
    r = invoke("--set", "AWS_ACCOUNT_ID=123456789012", "image", "build", "--build-arg", "NOEQUALS")
    assert r.exit_code == 2 and "--build-arg 'NOEQUALS' is not KEY=VALUE" in said(r)
    r = invoke(
        "--set",
        "AWS_ACCOUNT_ID=123456789012",
        "image",
        "build",
        "--context",
        str(tmp_path),
        "--dry-run",
    )
    assert r.exit_code == 2 and "not a fsdpctl source checkout" in said(r)


def test_ecr_repository_is_created_once_and_the_token_decodes(aws_env):
    aws = Aws("us-east-1")
    repo, created = aws.ecr_repository("fsdpctl-trainer")
    assert created and repo["repositoryName"] == "fsdpctl-trainer"
    again, created = aws.ecr_repository("fsdpctl-trainer")
    assert not created and again["repositoryArn"] == repo["repositoryArn"]
    scan = boto3.client("ecr", region_name="us-east-1").describe_repositories()["repositories"][0][
        "imageScanningConfiguration"
    ]
    assert scan == {"scanOnPush": True}
    assert aws.ecr_login() == ("AWS", MOTO_PASSWORD)


def test_no_engine_is_one_clear_line(aws_env, monkeypatch, tmp_path):
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/nothing.sock")
    r = invoke("--set", "AWS_ACCOUNT_ID=123456789012", "image", "build")
    assert r.exit_code == 1
    assert "the Docker engine is not reachable" in said(r) and "hint: start it" in said(r)
    monkeypatch.setenv("PATH", str(tmp_path))  # no docker binary at all
    r = invoke("--set", "AWS_ACCOUNT_ID=123456789012", "image", "push")
    assert (
        r.exit_code == 1
        and "docker is not installed" in said(r)
        and "apt-get install docker.io" in said(r)
    )


# --- the real engine --------------------------------------------------------------------------------------


def _skip_reason() -> str:
    if os.geteuid() != 0:
        return "dockerd needs root here"
    missing = [
        b
        for b in ("dockerd", "docker", "debootstrap", "docker-registry", "htpasswd")
        if not shutil.which(b)
    ]
    return f"missing {', '.join(missing)} (scripts/system-deps installs them)" if missing else ""


def _wait(check, seconds: float, what: str, log: Path):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.5)
    pytest.skip(f"{what} did not start within {seconds:.0f} s: {log.read_text()[-400:]}")


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    """dockerd on a private socket + a bookworm base image with python3 (debootstrap from the Debian
    mirror; the host's CA bundle is copied in so that pip inside builds trusts what the host
    trusts)."""
    if reason := _skip_reason():
        pytest.skip(reason)
    d = tmp_path_factory.mktemp("docker")
    sock, log = d / "docker.sock", d / "dockerd.log"
    proc = subprocess.Popen(
        [
            "dockerd",
            "--data-root",
            str(d / "data"),
            "--exec-root",
            str(d / "exec"),
            "-H",
            f"unix://{sock}",
            "--pidfile",
            str(d / "docker.pid"),
            "--storage-driver=overlay2",
            "--iptables=false",
            "--ip6tables=false",
            "--bridge=none",
        ],
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
    )
    env = {
        **os.environ,
        "DOCKER_HOST": f"unix://{sock}",
        "DOCKER_CONFIG": str(d / "client"),
        "DOCKER_BUILDKIT": "0",
    }

    def ping() -> bool:
        return subprocess.run(["docker", "version"], env=env, capture_output=True).returncode == 0

    _wait(ping, 60, "dockerd", log)
    rootfs = d / "rootfs"
    boot = subprocess.run(
        [
            "debootstrap",
            "--variant=minbase",
            "--include=python3,python3-venv,ca-certificates",
            "bookworm",
            str(rootfs),
            "http://deb.debian.org/debian",
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    if boot.returncode != 0:
        proc.terminate()
        pytest.skip(f"debootstrap failed (Debian mirror unreachable?): {boot.stdout[-300:]}")
    shutil.copy("/etc/ssl/certs/ca-certificates.crt", rootfs / "etc/ssl/certs/ca-certificates.crt")
    (rootfs / "etc/pip.conf").write_text("[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n")
    tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
    subprocess.run(
        ["docker", "import", "-", "fsdpctl-test-base:bookworm"],
        stdin=tar.stdout,
        env=env,
        check=True,
        capture_output=True,
    )
    tar.wait()
    yield env
    proc.terminate()
    proc.wait(60)
    for mount in reversed(
        Path("/proc/mounts").read_text().split("\n")
    ):  # dockerd leaves its netns mounted
        if len(mount.split()) > 1 and mount.split()[1].startswith(str(d)):
            subprocess.run(["umount", "-l", mount.split()[1]], capture_output=True)


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    """docker-registry (distribution 2.8) on 127.0.0.1 with htpasswd auth: user/password = moto's
    ECR token."""
    d = tmp_path_factory.mktemp("registry")
    subprocess.run(
        ["htpasswd", "-Bbc", str(d / "htpasswd"), "AWS", MOTO_PASSWORD],
        check=True,
        capture_output=True,
    )
    port = free_port()
    (d / "config.yml").write_text(
        json.dumps(
            {  # YAML is a superset of JSON
                "version": 0.1,
                "storage": {"filesystem": {"rootdirectory": str(d / "data")}},
                "http": {"addr": f"127.0.0.1:{port}"},
                "auth": {"htpasswd": {"realm": "fsdpctl-test", "path": str(d / "htpasswd")}},
            }
        )
    )
    log = d / "registry.log"
    proc = subprocess.Popen(
        ["docker-registry", "serve", str(d / "config.yml")],
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
    )

    def up() -> bool:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/", timeout=1)
        except urllib.error.HTTPError as e:
            return e.code == 401  # up, and asking for the credentials
        except OSError:
            return False
        return False

    _wait(up, 30, "docker-registry", log)
    yield f"127.0.0.1:{port}"
    proc.terminate()
    proc.wait(10)


@pytest.mark.slow
def test_build_push_and_pull_back_by_digest(aws_env, engine, registry, monkeypatch):
    for key, value in engine.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("FSDPCTL_IMAGE_REGISTRY", registry)
    monkeypatch.setenv("FSDPCTL_IMAGE_TAG", "it-1")
    uri = f"{registry}/fsdpctl-trainer:it-1"
    # the offline stand-ins: no CUDA base, no EFA download, no multi-GB torch; the trainer package
    # still installs
    r = invoke(
        "image",
        "build",
        "--base-image",
        "fsdpctl-test-base:bookworm",
        "--network",
        "host",
        "--build-arg",
        "INSTALL_EFA=false",
        "--build-arg",
        "TORCH_VERSION=",
        "--build-arg",
        "EXTRAS=",
        "--build-arg",
        "MONITORING_TOOLS=htop",  # Debian bookworm's main has no nvtop
    )
    assert r.exit_code == 0, r.output
    assert f"built {uri}" in said(r)

    r = invoke("image", "push")
    assert r.exit_code == 0, r.output
    assert "ECR repository fsdpctl-trainer created" in said(r)
    pinned = r.stdout.strip().splitlines()[-1]
    assert pinned.startswith(f"{registry}/fsdpctl-trainer@sha256:"), r.stdout
    assert (
        boto3.client("ecr", region_name="us-east-1").describe_repositories()["repositories"][0][
            "repositoryName"
        ]
        == "fsdpctl-trainer"
    )

    logs = "".join(
        p.read_text() for p in (Path(os.environ["FSDPCTL_HOME"]) / "images").glob("*.log")
    )
    for text in (r.output, logs):  # the token never leaves stdin
        assert MOTO_PASSWORD not in text
        assert base64.b64encode(f"AWS:{MOTO_PASSWORD}".encode()).decode() not in text

    r = invoke(
        "image", "push"
    )  # again: the repository exists, the registry already has every layer
    assert r.exit_code == 0 and "ECR repository fsdpctl-trainer exists" in said(r)
    assert r.stdout.strip().splitlines()[-1] == pinned

    docker = lambda *a: subprocess.run(["docker", *a], capture_output=True, text=True, timeout=300)  # noqa: E731
    assert docker("rmi", uri).returncode == 0
    assert docker("pull", pinned).returncode == 0, "pull by digest failed"
    run = docker(
        "run",
        "--rm",
        "--network",
        "none",
        pinned,
        "sh",
        "-c",
        "id -u && fsdpctl --version && python -c 'import fsdptrain.config'",
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == [
        "1000",
        "fsdpctl",
        "0.1.0",
    ]  # non-root, the CLI and the trainer installed
    # COMPILE=auto needs what Triton builds its launchers with (a C compiler and Python.h, per
    # triton/runtime/build.py) and inductor's CPU kernels need g++: a compiled function runs in the
    # image, as its own user, with this machine's CPU torch (Python 3.11 here and in the bookworm
    # base) mounted read-only, no network
    import torch

    site = Path(torch.__file__).resolve().parent.parent
    code = (
        "import torch; from fsdptrain.levers import triton_compiler; "
        "f = torch.compile(lambda x: torch.sin(x) * 2 + 1); x = torch.randn(64); "
        "assert torch.allclose(f(x), torch.sin(x) * 2 + 1); print('compiled with', triton_compiler())"
    )
    env_args = ["-e", "PYTHONPATH=/hostsite", "-e", "TORCHINDUCTOR_CACHE_DIR=/tmp/inductor"]
    compiled = docker(
        "run",
        "--rm",
        "--network",
        "none",
        "-v",
        f"{site}:/hostsite:ro",
        *env_args,
        pinned,
        "python",
        "-c",
        code,
    )
    assert compiled.returncode == 0, compiled.stderr[-3000:]
    assert compiled.stdout.strip() == "compiled with /usr/bin/gcc", compiled.stdout

    r = invoke("image", "push")
    assert (
        r.exit_code == 1 and f"no local image {uri}" in said(r) and "fsdpctl image build" in said(r)
    )

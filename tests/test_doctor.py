"""doctor against what this machine really has (no GPU: GPU checks skip, CPU checks run), and the
failure branches through real error paths: executables on PATH that fail the way a broken driver or
a pod without EFA does, real statvfs/disk_usage, the trainer's real loader on a bad data set."""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path

import pytest

from fsdpctl.cluster import doctor as D
from fsdpctl.settings import load

NO_GPU = shutil.which("nvidia-smi") is None


def executable(directory: Path, name: str, script: str) -> None:
    path = directory / name
    path.write_text("#!/bin/sh\n" + script + "\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


@pytest.fixture
def fake_bin(tmp_path, monkeypatch):
    d = tmp_path / "bin"
    d.mkdir()
    monkeypatch.setenv("PATH", f"{d}:{os.environ['PATH']}")
    return d


@pytest.mark.slow
@pytest.mark.skipif(not NO_GPU, reason="this test describes a machine without a GPU")
def test_this_machine_gpu_checks_skip_cpu_checks_run(tmp_path):
    checks = {
        c.name: c for c in D.run_checks(load(), demand_tokens_per_s=1000, checkpoint_path=tmp_path)
    }
    for name in ("nvidia-smi", "driver vs CUDA", "torch.cuda", "forward/backward", "bf16"):
        assert checks[name].status == D.SKIPPED
    assert checks["nvidia-smi"].detail.startswith("no NVIDIA driver")
    assert checks["torch"].status == D.OK and "2.13" in checks["torch"].detail
    assert (
        checks["all-reduce"].status == D.OK
        and "gloo across 2 CPU processes: bus bandwidth" in checks["all-reduce"].detail
    )
    assert checks["EFA"].status == D.SKIPPED
    assert checks["checkpoint space"].status == D.OK
    assert (
        checks["data loader"].status == D.OK
        and "tokens/s per process" in checks["data loader"].detail
    )
    shm = os.statvfs("/dev/shm")  # what this machine has decides which outcome is right
    size = shm.f_blocks * shm.f_frsize
    assert checks["shared memory"].status == (D.OK if size >= D.MIN_SHM else D.WARN)
    assert checks["shared memory"].detail.startswith(f"/dev/shm is {size / (1 << 30):.1f} GiB")


def test_a_failing_driver_fails_the_check_and_the_command(fake_bin, cli):
    executable(
        fake_bin,
        "nvidia-smi",
        'echo "NVIDIA-SMI has failed because it couldn\'t communicate with the NVIDIA driver." >&2; exit 9',
    )
    check = D.check_nvidia_smi(D.Facts())
    assert (
        check.status == D.FAIL
        and "couldn't communicate with the NVIDIA driver" in check.detail
        and check.fix
    )
    result = cli("doctor", "--no-collectives", "-o", "json")
    assert result.exit_code == 1
    doc = json.loads(result.stdout)
    assert doc["ok"] is False
    # -o json: the document alone on stdout, each check's line on stderr as it finishes (it used to be silent)
    shown = [line.split(None, 1) for line in result.stderr.splitlines()]
    assert [name for _, name in shown] == [c["name"] for c in doc["checks"]], result.stderr


def test_gpus_seen_by_the_driver_but_not_by_a_cpu_torch(fake_bin):
    executable(
        fake_bin,
        "nvidia-smi",
        """
case "$1" in
  --query-gpu*) echo "NVIDIA H100 80GB HBM3, 550.90.07, 81559 MiB"
                echo "NVIDIA H100 80GB HBM3, 550.90.07, 81559 MiB";;
  *) echo "| NVIDIA-SMI 550.90.07   Driver Version: 550.90.07   CUDA Version: 12.4 |";;
esac""",
    )
    facts = D.Facts()
    assert (
        D.check_nvidia_smi(facts).detail == "2 x NVIDIA H100 80GB HBM3, driver 550.90.07, CUDA 12.4"
    )
    D.check_torch(facts)
    mismatch = D.check_driver_vs_cuda(facts)
    assert mismatch.status == D.FAIL and "CPU build on a GPU machine" in mismatch.detail
    assert D.check_cuda_available(facts).status == D.FAIL
    assert D.check_forward_backward(facts).status == D.SKIPPED


def test_efa_outcomes(fake_bin, monkeypatch):
    monkeypatch.setenv(
        "PATH", str(fake_bin)
    )  # no fi_info but the ones written below, whatever this machine has
    eks = load(dotenv={"BACKEND": "eks"})
    assert D.check_efa(load()).status == D.SKIPPED
    missing = D.check_efa(eks)
    assert missing.status == D.WARN and "32 EFA interfaces" in missing.fix
    executable(fake_bin, "fi_info", "echo 'fi_getinfo: -61 (No data available)' >&2; exit 1")
    assert D.check_efa(eks).status == D.FAIL
    listing = "".join(f"provider: efa\\n    domain: rdmap{i}s0-rdm\\n" for i in range(4))
    executable(fake_bin, "fi_info", f"printf '{listing}'")
    assert D.check_efa(eks).status == D.WARN  # a p5 has 32
    assert (
        D.check_efa(load(dotenv={"BACKEND": "eks", "INSTANCE_TYPE": "p4de.24xlarge"})).status
        == D.OK
    )


def test_shared_memory_and_disk_outcomes(tmp_path):
    assert D.check_shm("/dev/shm", minimum=1 << 60).status == D.WARN
    assert (
        D.check_shm(str(tmp_path), minimum=1).status == D.OK
    )  # any mounted file system is over a byte
    assert D.check_shm(str(tmp_path / "nope")).status == D.FAIL
    assert D.check_disk(load(), tmp_path / "ckpt").status == D.OK
    too_big = D.check_disk(load(dotenv={"MODEL": "70b", "CHECKPOINT_KEEP": "1000"}), tmp_path)
    assert too_big.status == D.FAIL and "CHECKPOINT_KEEP" in too_big.fix


def test_a_bad_data_set_fails_through_the_trainer_loader(tmp_path):
    missing = D.check_data(load(dotenv={"DATASET": str(tmp_path / "none.txt")}), 1000)
    assert missing.status == D.FAIL and "does not exist" in missing.detail
    (tmp_path / "tiny.txt").write_text("too short\n")
    short = D.check_data(load(dotenv={"DATASET": str(tmp_path / "tiny.txt")}), 1000)
    assert short.status == D.FAIL and "fewer than SEQ_LEN+1" in short.detail
    slow = D.check_data(load(), demand_tokens_per_s=1e12)
    assert slow.status == D.WARN and "input-bound" in slow.fix


def test_a_hung_driver_or_efa_probe_is_a_failure_not_a_hang(fake_bin, monkeypatch):
    monkeypatch.setattr(D, "PROBE_TIMEOUT", 0.5)
    executable(fake_bin, "nvidia-smi", "sleep 20")
    hung = D.check_nvidia_smi(D.Facts())
    assert (
        hung.status == D.FAIL
        and hung.detail == "nvidia-smi did not answer in 0.5 s"
        and "reboot" in hung.fix
    )
    executable(fake_bin, "fi_info", "sleep 20")
    efa = D.check_efa(load(dotenv={"BACKEND": "eks"}))
    assert efa.status == D.FAIL and "fi_info did not answer" in efa.detail


def test_what_the_data_loader_must_keep_up_with_and_where_checkpoints_go(tmp_path, monkeypatch):
    from fsdpctl.plan import planner as plan
    from fsdpctl.plan.steptime import speed

    monkeypatch.setenv("FSDPCTL_HOME", str(tmp_path))
    local = load(dotenv={"JOB_NAME": "exp1"})
    assert D.targets(local) == (D.LOCAL_DEMAND, tmp_path / "jobs" / "exp1" / "checkpoints")
    eks = load(dotenv={"BACKEND": "eks", "MODEL": "13b"})
    demand, path = D.targets(eks)
    assert demand == speed(plan.job_from(eks, mfu=0.0, price=None)).tokens_per_s_per_gpu > 100
    assert path == Path("/checkpoints")

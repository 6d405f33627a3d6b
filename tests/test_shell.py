"""The shell adapter against real processes: `run` streams and logs (and with a dry run starts
nothing), `capture` reads output within a time limit, `spawn` detaches a process whose output goes
to a log."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from fsdpctl.adapters import shell
from fsdpctl.errors import FsdpctlError

PY = sys.executable


def test_run_streams_each_line_logs_it_and_returns_the_exit_code(tmp_path):
    log, seen = tmp_path / "logs" / "tool.log", []
    code = "import sys; print('one'); print('two', file=sys.stderr); sys.exit(3)"
    rc = shell.run(
        shell.Command([PY, "-c", code], {"GREETING": "hi"}), log_file=log, on_line=seen.append
    )
    assert rc == 3 and sorted(seen) == ["one", "two"]
    text = log.read_text()
    assert text.startswith(f"$ GREETING=hi {PY} -c ") and "one\n" in text and "two\n" in text


def test_run_gives_stdin_to_the_process_and_never_to_the_log(tmp_path):
    log, seen = tmp_path / "tool.log", []
    code = "import sys; print(len(sys.stdin.read()))"
    cmd = shell.Command([PY, "-c", code], {})
    assert shell.run(cmd, log_file=log, on_line=seen.append, stdin_text="s3cret") == 0
    assert seen == ["6"] and "s3cret" not in log.read_text()


def test_run_in_the_added_environment_and_working_dir(tmp_path):
    seen = []
    code = "import os; print(os.getcwd(), os.environ['ADDED'], 'PATH' in os.environ)"
    cmd = shell.Command([PY, "-c", code], {"ADDED": "yes"}, cwd=tmp_path)
    assert shell.run(cmd, log_file=tmp_path / "log", on_line=seen.append) == 0
    assert seen == [f"{tmp_path} yes True"]


def test_a_dry_run_starts_nothing_logs_nothing_and_reports_the_command_line(tmp_path):
    marker, log, seen = tmp_path / "ran", tmp_path / "tool.log", []
    cmd = shell.Command(
        ["no-such-tool-here", "touch", str(marker)], {"AWS_REGION": "us-east-1"}, cwd=tmp_path
    )
    assert shell.run(cmd, log_file=log, on_line=seen.append, dry_run=True) == 0
    assert seen == [f"cd {tmp_path} && AWS_REGION=us-east-1 no-such-tool-here touch {marker}"]
    assert not marker.exists() and not log.exists()
    real = shell.Command(["touch", str(marker)], {})
    assert shell.run(real, log_file=log, dry_run=True) == 0 and not marker.exists()
    assert shell.run(real, log_file=log) == 0 and marker.exists()


def test_a_missing_program_is_one_fsdpctl_error_with_the_install_hint(tmp_path):
    with pytest.raises(shell.ToolMissing) as e:
        shell.run(shell.Command(["eksctl", "version"], {}), log_file=tmp_path / "log")
    assert (
        isinstance(e.value, FsdpctlError)
        and str(e.value) == "eksctl is not installed or not on PATH"
    )
    assert "eksctl.io" in e.value.hint
    with pytest.raises(shell.ToolMissing, match="no-such-tool-here is not installed"):
        shell.capture(["/nowhere/no-such-tool-here"], timeout=5)
    with pytest.raises(shell.ToolMissing):
        shell.spawn(["no-such-tool-here"], env=dict(os.environ))


def test_capture_returns_code_and_both_streams():
    got = shell.capture(
        [PY, "-c", "import sys; print('out'); print('err', file=sys.stderr); sys.exit(2)"],
        timeout=30,
    )
    assert got == shell.Captured(2, "out\n", "err\n")


def test_capture_uses_the_given_environment_and_directory(tmp_path):
    code = "import os; print(os.getcwd(), sorted(k for k in os.environ if k.startswith('ONLY_')))"
    got = shell.capture([PY, "-c", code], timeout=30, env={"ONLY_THIS": "1"}, cwd=tmp_path)
    assert got.stdout.strip() == f"{tmp_path} ['ONLY_THIS']"


def test_capture_past_its_limit_is_a_clear_error_and_the_process_is_killed():
    start = time.monotonic()
    with pytest.raises(shell.ToolTimeout) as e:
        shell.capture([PY, "-c", "import time; time.sleep(30)"], timeout=0.5)
    assert time.monotonic() - start < 10
    assert "did not finish within 0.5 s" in str(e.value) and "time.sleep(30)" in str(e.value)


def test_a_timeout_also_ends_the_children_holding_the_output(tmp_path):
    """A shell whose child keeps stdout open: killing the shell alone would leave us waiting 30 s."""
    pid_file = tmp_path / "child.pid"
    start = time.monotonic()
    with pytest.raises(shell.ToolTimeout):
        shell.capture(["sh", "-c", f"sleep 30 & echo $! > {pid_file}; wait"], timeout=0.5)
    assert time.monotonic() - start < 10
    stat = Path(f"/proc/{pid_file.read_text().strip()}/stat")
    time.sleep(0.2)
    assert not stat.exists() or stat.read_text().split(") ")[1].startswith(
        "Z"
    )  # gone, or dead unreaped


def test_spawn_detaches_and_appends_its_output_to_the_log(tmp_path):
    log = tmp_path / "proc.log"
    log.write_text("before\n")
    code = "import os, sys; print(os.getsid(0) == os.getpid(), os.environ['ONLY'], sys.stdin.read() == '')"
    proc = shell.spawn([PY, "-c", code], env={"ONLY": "x"}, log=log, cwd=tmp_path)
    assert proc.wait(30) == 0
    assert log.read_text() == "before\nTrue x True\n"
    attached = shell.spawn([PY, "-c", code], env={"ONLY": "y"}, log=log, new_session=False)
    assert attached.wait(30) == 0 and log.read_text().endswith("False y True\n")


def test_spawn_without_a_log_discards_the_output(tmp_path):
    proc = shell.spawn([PY, "-c", "print('x' * 100000)"], env=dict(os.environ), cwd=Path(tmp_path))
    assert proc.wait(30) == 0 and list(tmp_path.iterdir()) == []

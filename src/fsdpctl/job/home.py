"""Where a job lives on this machine, whatever backend runs it: FSDPCTL_HOME/jobs/<job>/, named by
the job's checked name (a DNS label: no '/', '..' or NUL walks out of the home).

    jobs/<job>/state.json   the job's state (fsdpctl.job.state)
    jobs/<job>/lock         its lock (fsdpctl.job.lock)
    jobs/<job>/...          what its backend keeps here (local: the supervisor's spec, logs, node
                            disks; Slurm and EKS keep their files where their jobs run)
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from fsdpctl import files


def jobs_root() -> Path:
    return files.home() / "jobs"


def job_dir(name: str) -> Path:
    """The job's directory, from its name checked first (bad input before any path is built)."""
    return jobs_root() / files.job_name(name)


def job_dirs(skipped: Callable[[str], None]) -> list[Path]:
    """Every job directory of this home, by name; anything else under jobs/ (a stray file, a link,
    a name fsdpctl never makes) is one line to `skipped` and passed over."""
    root = jobs_root()
    found = []
    for path in sorted(root.iterdir()) if root.is_dir() else []:
        if path.is_symlink() or not path.is_dir() or not files.JOB_NAME.fullmatch(path.name):
            skipped(f"{path} is not a job directory: skipped")
            continue
        found.append(path)
    return found

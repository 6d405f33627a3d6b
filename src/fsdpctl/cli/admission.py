"""Admission, before anything is written or created: a job that cannot fit where it would run, or
whose volume lacks room for what it keeps, is refused (exit 2) unless --force."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from fsdpctl.cli.common import warn
from fsdpctl.errors import SettingsError
from fsdptrain.resume import candidates, complete_checkpoints

if TYPE_CHECKING:
    from fsdpctl.settings import Config


def admit(cfg: Config, *, force: bool, starts: bool = True) -> None:
    """Refuse, before anything is written or created, a job that cannot fit (`fit.fit_problem`) or
    be scheduled (`settings.placement_problems`) where cfg.backend would run it: exit 2, one line
    each with the fix. With `force`, each refusal becomes a warning and the command goes on. This
    machine's facts are read here, at the edge: its cores and RAM, its paths, and where the local
    backend keeps the claims. `starts`: the command starts the job (or checks that it could:
    `config validate`), so what its place refuses (Backend.refusals) is refused too; `manifest`
    only renders it."""
    from fsdpctl import backends
    from fsdpctl.backends.local.engine import shared_volume_dir
    from fsdpctl.job import policy as jobpolicy
    from fsdpctl.plan import fit, volume
    from fsdpctl.settings import annotate, placement_problems
    from fsdpctl.settings.checks import elastic_refusal

    # not a misfit --force could accept: settings nothing uses there, what the place itself refuses
    hard = [*_target_refusals(cfg), *(backends.create(cfg).refusals() if starts else [])]
    if elastic := elastic_refusal(cfg):
        hard.append(elastic)
    claims = {cfg.shared_volume_path: cfg.shared_volume, "/checkpoints": cfg.checkpoint_pvc}
    mounts = {path: str(shared_volume_dir(claim)) for path, claim in claims.items() if claim}
    problems = placement_problems(
        cfg,
        cores=os.cpu_count() or 1,
        exists=lambda p: Path(p).expanduser().exists(),
        mounts=mounts,
    )
    ram = _ram_bytes()
    misfit = fit.fit_problem(cfg, ram_bytes=ram) or fit.minimum_fit_problem(cfg, ram_bytes=ram)
    problems = [misfit, *problems] if misfit else problems
    if room := _volume_problem(cfg):
        problems.append(room)
    problems = annotate(problems, cfg)  # each value with where it came from
    if hard or (problems and not force):  # every refusal at once: one error never hides another
        raise SettingsError([*hard, *([] if force else problems)])
    for line in problems:
        warn(f"--force: going on although {line}")
    if cfg.target.gpus and (slow := volume.interval_warning(cfg, jobpolicy.step_seconds(cfg))):
        warn(slow)
    if assumed := volume.rate_warning(cfg):
        warn(assumed)


def _target_refusals(cfg: Config) -> list[str]:
    """The settings that mean nothing where the job runs, as its Target's `refusals` names them."""
    if not cfg.target.refusals:
        return []
    from fsdpctl.targets import resolve

    lines: list[str] = resolve(cfg.target.refusals)(cfg)
    return lines


def _volume_problem(cfg: Config) -> str | None:
    """What the job keeps on its shared volume against the room there: the FSX_STORAGE_GIB file
    system on the cluster; where this machine sees the volume (the local backend's directory, a
    Slurm cluster's file system) the free space of its disk plus what is already there of what the
    need counts: this job's checkpoints and the one a rerun resumes from elsewhere on the volume.
    There the need counts what really is on the volume: whether the run resumes (RESUME, and with
    auto whether the job's directory holds a complete checkpoint) and how many it holds now."""
    from fsdpctl import backends
    from fsdpctl.job import policy as jobpolicy
    from fsdpctl.plan import volume

    here = backends.create(cfg).here(cfg.shared_volume_path) if cfg.shared_volume else None
    if here is None:
        return volume.fsx_problem(cfg)
    where = Path(here)
    free = _free_bytes(where)
    if free is None:
        return None
    ours = settings_path_local(jobpolicy.checkpoint_dir(cfg, cfg.job_name), cfg, where)
    start = _resume_point(cfg, ours, where)
    counted = _bytes_under(ours)
    if start is not None and not start.is_relative_to(ours):
        counted += _bytes_under(start)  # on the volume already, and in the need
    return volume.capacity_problem(
        cfg,
        free + counted,
        f"the local volume {where} (the free space of its disk)",
        fix=f"free space there or mount a larger disk at {where}",
        kept=volume.need(cfg, resumes=start is not None, present=len(complete_checkpoints(ours))),
    )


def _resume_point(cfg: Config, ours: Path, where: Path) -> Path | None:
    """The checkpoint on the shared volume the run starts from, here, as the trainer chooses it
    (fsdptrain.resume.candidates: RESUME=auto the job directory's `latest`, else its newest complete
    one; a path that one); None for a fresh start, checkpoints on CHECKPOINT_PVC or one off the
    volume."""
    from fsdpctl.plan import volume

    resume = cfg.training.resume
    if resume == "never" or cfg.checkpoint_pvc:
        return None
    if resume == "auto":
        return next(iter(candidates(ours, resume)), None)
    path = settings_path_local(resume, cfg, where)
    return path if volume.on_volume(cfg, resume) and path.exists() else None


def settings_path_local(path: str, cfg: Config, where: Path) -> Path:
    """A pod path on the shared volume as the local backend keeps it (under `where`)."""
    return where / path.removeprefix(cfg.shared_volume_path.rstrip("/")).lstrip("/")


def _free_bytes(path: Path) -> int | None:
    """Free bytes for an unprivileged writer on the filesystem that holds `path` (or would: its
    nearest existing parent)."""
    for at in (path, *path.parents):
        try:
            st = os.statvfs(at)
        except OSError:
            continue
        return st.f_bavail * st.f_frsize
    return None


def _bytes_under(path: Path) -> int:
    total = 0
    for root, _dirs, names in os.walk(path):
        for name in names:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


def _ram_bytes() -> int:
    """This machine's physical memory (POSIX sysconf)."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")

"""Sharded checkpoints with `torch.distributed.checkpoint`, written atomically (the Hugging Face
format of PRETRAINED and EXPORT_DIR: fsdptrain.hf_io).

Layout under CHECKPOINT_DIR (must be a filesystem every node sees, e.g. FSx for Lustre on EKS):

    step-00000020/      DCP shards of model + optimizer, rng-rankNNNNN.pt per rank,
                        meta.json (written last)
    latest              name of the newest complete checkpoint
    .tmp-step-00000030/ a save in progress; never read, removed by the next save

A save is three steps: `stage` (every rank writes into the temp dir), `publish` (rank 0 renames it
into place once every rank finished, then moves `latest`) and `prune` (keep the newest
CHECKPOINT_KEEP), so a crash mid-write leaves the previous checkpoint as `latest`.
"""

from __future__ import annotations

import json
import os
import pickle
import random
import shutil
import signal
import socket
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.optim import Optimizer

from fsdptrain import atomic
from fsdptrain.config import ConfigError
from fsdptrain.resume import (
    LATEST,
    META,
    candidates,
    complete_checkpoints,
    latest_checkpoint,
    step_name,
)

__all__ = ["LATEST", "META", "complete_checkpoints", "latest_checkpoint", "step_name"]
REASON_CHARS = 300  # a cause longer than this is cut at a word, never mid-word, and says so


class CheckpointError(RuntimeError):
    pass


class DamagedCheckpoint(CheckpointError):
    """A checkpoint that is there but does not load (a shard cut short, bytes changed): `reason`
    says how."""

    def __init__(self, message: str, reason: str):
        super().__init__(message)
        self.reason = reason


def _write_atomic(path: Path, text: str) -> None:
    atomic.write_text(path, text, fsync=True)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _rng_state() -> dict[str, Any]:
    return {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
    }


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _prepare(root: Path, tmp: Path) -> str | None:
    try:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
    except OSError as e:
        why = f"is not writable ({e.strerror}): fix its permissions, space or mount"
        return f"CHECKPOINT_DIR={str(root)!r} {why}"
    return None


def _reason(e: BaseException) -> str:
    """The root cause in a few words (DCP wraps each rank's error in a CheckpointException)."""
    failures = getattr(e, "failures", None)
    if failures:
        e = next(iter(failures.values()))
        e = e[0] if isinstance(e, tuple) else e
    while e.__cause__ is not None:
        e = e.__cause__
    text = getattr(e, "strerror", None) or (str(e).splitlines()[0] if str(e) else type(e).__name__)
    if "unexpected pos" in text:  # torch's zip writer after a short write(): ENOSPC, EFBIG, quota
        text = "short write: the disk is full or a file-size limit was hit"
    return shortened(text)


def shortened(text: str, most: int = REASON_CHARS) -> str:
    """`text` whole when short; else its first sentences that fit, or its words that fit and an
    ellipsis: never cut inside a word (torch's zip reader says its cause first: "failed finding
    central directory")."""
    text = " ".join(text.split())
    if len(text) <= most:
        return text
    sentences = text.split(". ")
    kept = ""
    for s in sentences:
        if len(kept) + len(s) + 2 > most:
            break
        kept += s + ". "
    if kept:
        return kept.rstrip()
    return text[: most - 1].rsplit(" ", 1)[0] + "…"


def failpoint_step(environ: Mapping[str, str]) -> int | None:
    """FSDPTRAIN_FAILPOINT=kill-during-save:STEP: the step whose save rank 0 dies in, by SIGKILL,
    after the shards are written and before they are published, as a crash or an OOM kill would.
    Only the fault tests set it, to prove an interrupted save never becomes `latest`."""
    name, _, step = environ.get("FSDPTRAIN_FAILPOINT", "").partition(":")
    return int(step) if name == "kill-during-save" and step.isdigit() else None


def failpoint_slow_save(environ: Mapping[str, str]) -> float:
    """FSDPTRAIN_FAILPOINT=slow-save:SECONDS: every save takes that much longer on every rank,
    between the shards and their publication, as a large model on a slow volume would. Only the stop
    tests set it, to prove `job stop` leaves the trainer time to finish its stop checkpoint."""
    name, _, seconds = environ.get("FSDPTRAIN_FAILPOINT", "").partition(":")
    return float(seconds) if name == "slow-save" and seconds.replace(".", "", 1).isdigit() else 0.0


def failpoint_hold(environ: Mapping[str, str]) -> tuple[int, str] | None:
    """FSDPTRAIN_FAILPOINT=hold-until-stop:STEP: every rank waits after step STEP until its SIGTERM
    comes, so a `job stop` sent once STEP shows ends the run at step STEP+1 whatever the machine's
    speed. FSDPTRAIN_FAILPOINT=hold-until-file:STEP:PATH: the same wait, which also ends once PATH
    exists, so a test can disrupt a run at a known step (a killed node, a lost controller) and let
    the survivors and the new pods go on, which pass STEP without waiting. (STEP, PATH or ""); only
    tests set it, no real run does."""
    name, _, rest = environ.get("FSDPTRAIN_FAILPOINT", "").partition(":")
    step, _, path = rest.partition(":")
    if not step.isdigit() or name not in ("hold-until-stop", "hold-until-file"):
        return None
    if name == "hold-until-file" and not path:
        return None
    return int(step), path if name == "hold-until-file" else ""


# FSDPTRAIN_TRACE=DIR: what the elastic-resume tests count (tests/test_elastic.py): each rank's data
# positions (fsdptrain.data.Loader) and, after a resume, the whole model as loaded. Only tests set it.
TRACE_ENV = "FSDPTRAIN_TRACE"


def trace_loaded(model: nn.Module, step: int) -> None:
    """Collective, with FSDPTRAIN_TRACE only: rank 0 writes the model's full parameters as this run
    loaded them (gathered from the shards of this world), to compare with the checkpoint's."""
    trace = os.environ.get(TRACE_ENV)
    if not trace:
        return
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    full = get_model_state_dict(model, options=options)
    if dist.get_rank() == 0:
        name = f"loaded-step{step:08d}-world{dist.get_world_size()}.pt"
        torch.save(full, Path(trace) / name)


def die_on_rank0() -> None:
    if dist.get_rank() == 0:
        os.kill(os.getpid(), signal.SIGKILL)


def _paths(root: Path, step: int) -> tuple[Path, Path]:
    """(final, temp) directories of one step's checkpoint."""
    return root / step_name(step), root / f".tmp-{step_name(step)}"


def stage(root: Path, *, step: int, model: nn.Module, optimizer: Optimizer) -> None:
    """Collective: every rank writes its shards and RNG state into the step's temp dir (`publish`
    moves it). A failure on any rank raises CheckpointError on every rank; the last good checkpoint
    stays `latest`."""
    rank = dist.get_rank()
    tmp = _paths(root, step)[1]
    error = [_prepare(root, tmp) if rank == 0 else None]
    dist.broadcast_object_list(
        error, src=0
    )  # every rank fails together instead of hanging in a barrier
    if error[0]:
        raise CheckpointError(error[0])
    failure = _first_failure(_write_shards(tmp, rank, model=model, optimizer=optimizer))
    if failure:
        if rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        free = shutil.disk_usage(root).free / 2**20
        raise CheckpointError(
            f"checkpoint at step {step} failed ({failure}; {free:,.0f} MiB free); the last good "
            f"one is {latest_checkpoint(root) or 'none'}: free space on "
            f"CHECKPOINT_DIR={str(root)!r} or point it elsewhere"
        )


def _write_shards(tmp: Path, rank: int, *, model: nn.Module, optimizer: Optimizer) -> str | None:
    """This rank's part of a save; the reason it failed, or None."""
    state = {
        "model": get_model_state_dict(model),
        "optim": get_optimizer_state_dict(model, optimizer),
    }
    try:
        dcp.save(state, checkpoint_id=str(tmp))
        torch.save(_rng_state(), tmp / f"rng-rank{rank:05d}.pt")
    except (dcp.CheckpointException, OSError, RuntimeError) as e:
        return _reason(e)
    return None


def _first_failure(failure: str | None) -> str | None:
    failures: list[str | None] = [None] * dist.get_world_size()
    dist.all_gather_object(
        failures, failure
    )  # all ranks learn of any rank's failure, and all raise
    return next((f for f in failures if f), None)


def publish(root: Path, *, step: int, trainer_state: dict[str, Any]) -> Path:
    """Collective: rank 0 writes meta.json into the staged dir, renames it into place and points
    `latest` at it; every rank returns the final path once it is there."""
    final, tmp = _paths(root, step)
    if dist.get_rank() == 0:
        meta = {
            "step": step,
            "world_size": dist.get_world_size(),
            "saved_at": time.time(),
            **trainer_state,
        }
        _write_atomic(tmp / META, json.dumps(meta, indent=1, default=str))
        if (
            final.exists()
        ):  # the same step saved again after a resume: replace it whole (prune drops it)
            old = final.with_name(f".old-{final.name}")
            shutil.rmtree(old, ignore_errors=True)
            os.rename(final, old)
        os.rename(tmp, final)
        _fsync_dir(root)
        _write_atomic(root / LATEST, final.name)
    dist.barrier()
    return final


def prune(root: Path, *, keep: int, spare: Path | None = None) -> None:
    """Rank 0 removes all but the newest `keep` complete checkpoints, and what a re-save replaced;
    never `spare`, the checkpoint this run resumed from: its record names it as where the run
    started, and a rerun starts there again."""
    if dist.get_rank() != 0:
        return
    for old in [*root.glob(".old-step-*"), *complete_checkpoints(root)[:-keep]]:
        if spare is None or old != spare:
            shutil.rmtree(old, ignore_errors=True)


def choose_resume(root: Path | None, resume: str) -> Path | None:
    """Rank 0's first choice from RESUME and its view of CHECKPOINT_DIR (auto: `latest`); None:
    afresh."""
    wanted = candidates(root, resume)
    return wanted[0] if wanted else None


Check = Callable[[dict[str, Any], str], "str | None"]


def resume(
    root: Path | None,
    resume: str,
    *,
    model: nn.Module,
    optimizer: Optimizer,
    check: Check = lambda meta, where: None,
    log: Callable[[str], None] = print,
) -> tuple[Path | None, dict[str, Any] | None]:
    """Collective: restore the one checkpoint the whole job resumes, (its path, its meta.json), or
    (None, None) for a fresh start. Rank 0 names its candidates (`candidates`: with RESUME=auto
    `latest`, then each older complete one) with their meta.json; `check(meta, where)` may refuse
    one (a run with other settings, a step at MAX_STEPS: ConfigError on every rank). A candidate
    rank 0 itself cannot read whole, or one that fails to load on any rank, is damaged: RESUME=auto
    falls back to the next and says so; a checkpoint another rank does not see at all is a volume
    problem, never a fallback. An explicit RESUME path is that one or an error."""
    auto, skipped = resume == "auto", []
    for name, meta_text in _agreed(root, resume):
        path = root / name if auto and root is not None else Path(name)
        meta = _meta(meta_text)
        if meta is not None and (refusal := check(meta, str(path))):
            raise ConfigError(refusal)
        failed = _unreadable_anywhere(path, meta_text)
        if failed and not (auto and failed[0][0] == 0):
            raise CheckpointError(_unreadable_line(failed, explicit=not auto))
        if failed:
            skipped.append(f"{name} ({failed[0][1][2]})")
            continue
        try:
            loaded = load(path, model=model, optimizer=optimizer)
        except DamagedCheckpoint as e:
            if not auto:
                raise
            skipped.append(f"{name} ({e.reason})")
            continue
        if skipped:
            log(
                f"checkpoint {'; '.join(skipped)} is damaged: resumed from {name}, "
                "the newest intact one"
            )
        return path, loaded
    if skipped:
        raise CheckpointError(
            f"no intact checkpoint under CHECKPOINT_DIR={str(root)!r}: {'; '.join(skipped)}; "
            "remove the damaged ones, or RESUME=never to start afresh"
        )
    return None, None


def _meta(text: str) -> dict[str, Any] | None:
    try:
        meta = json.loads(text) if text else None
    except ValueError:
        return None
    return meta if isinstance(meta, dict) else None


def _agreed(root: Path | None, resume: str) -> list[tuple[str, str]]:
    """Rank 0's candidates, (name, meta.json text: '' when it has none), broadcast to every rank:
    one resume point for the whole job, whatever each rank's own view of CHECKPOINT_DIR."""
    listed: list[Any] = [[]]
    if dist.get_rank() == 0:
        auto = resume == "auto"
        listed = [[(p.name if auto else str(p), _text(p / META)) for p in candidates(root, resume)]]
    dist.broadcast_object_list(listed, src=0)
    return [tuple(c) for c in listed[0]]


def _text(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _unreadable_anywhere(path: Path, meta_text: str) -> list[tuple[int, tuple[str, str, str]]]:
    """Collective: (rank, (where, path, why)) of every rank that cannot read `path` whole."""
    problem = unreadable(path, expected_meta=meta_text)
    problems: list[tuple[str, str, str] | None] = [None] * dist.get_world_size()
    dist.all_gather_object(problems, (_whereabouts(), str(path), problem) if problem else None)
    return [(rank, p) for rank, p in enumerate(problems) if p]


def agree_resume(root: Path | None, resume: str) -> Path | None:
    """Collective: the checkpoint the whole job resumes, checked but not loaded (see `resume`): rank
    0 decides, every rank checks that it sees that same checkpoint whole under its own
    CHECKPOINT_DIR, and all raise together, naming a rank that does not. On per-node disks each rank
    would otherwise pick its own `latest` and the ranks would hang in DCP's collectives or load
    mismatched state."""
    auto = resume == "auto"
    for name, meta_text in _agreed(root, resume)[:1]:
        path = root / name if auto and root is not None else Path(name)
        failed = _unreadable_anywhere(path, meta_text)
        if failed:
            raise CheckpointError(_unreadable_line(failed, explicit=not auto))
        return path
    return None


def unreadable(path: Path, *, expected_meta: str) -> str | None:
    """Why this rank cannot load the checkpoint at `path` that rank 0 chose (its meta.json is
    `expected_meta`; '' when rank 0 has none), or None: the same meta.json, DCP's `.metadata` index
    and every shard file it names."""
    meta = path / META
    if not expected_meta or not meta.is_file():
        return f"no {META}"
    try:
        if meta.read_text() != expected_meta:
            return f"its {META} differs from rank 0's: another save under the same name"
        index = dcp.FileSystemReader(str(path)).read_metadata()
    except (
        OSError,
        EOFError,
        ValueError,
        pickle.UnpicklingError,
    ) as e:  # a missing or damaged index
        return f"cannot read {e.filename if isinstance(e, OSError) and e.filename else 'its index'}"
    files = sorted({info.relative_path for info in (index.storage_data or {}).values()})
    missing = [f for f in files if not (path / f).is_file()]
    return (
        f"{len(missing)} of {len(files)} shard files missing, e.g. {missing[0]}"
        if missing
        else None
    )


def _whereabouts() -> str:
    """This rank's node and host, for error lines (torchrun's GROUP_RANK is the node's rank)."""
    return f"node {os.environ.get('GROUP_RANK', '0')}, host {socket.gethostname()}"


def _unreadable_line(failed: list[tuple[int, tuple[str, str, str]]], *, explicit: bool) -> str:
    """One line for every rank to print: the first rank that cannot read the checkpoint, where, and
    why."""
    rank, (where, path, why) = failed[0]
    others = f" (and {len(failed) - 1} more ranks)" if len(failed) > 1 else ""
    if explicit and rank == 0:
        return f"RESUME={path!r} is not a complete checkpoint ({why}): pick another"
    return (
        f"rank {rank} ({where}){others} cannot read checkpoint {path!r} that rank 0 resumes from "
        f"({why}): every node must see CHECKPOINT_DIR on one shared volume "
        "(SHARED_VOLUME or CHECKPOINT_PVC)"
    )


def load(path: Path, *, model: nn.Module, optimizer: Optimizer) -> dict[str, Any]:
    """Collective. Restores model, optimizer and this rank's RNG; returns the trainer state from
    meta.json. On any world size: DCP reads into this world's shards whatever layout saved them
    (torch 2.13 torch/distributed/checkpoint/default_planner.py, create_default_local_load_plan:
    "handles resharding by issuing multiple read requests"); the RNG only on the world that saved
    it, whose ranks are these ranks (fsdptrain.elastic)."""
    meta_file = path / META
    if not meta_file.is_file():
        raise CheckpointError(
            f"RESUME={str(path)!r} is not a complete checkpoint (no {META}): pick another"
        )
    # pre-filled with the live (sharded) tensors: DCP loads in place into what it is given
    model_state, optim_state = (
        get_model_state_dict(model),
        get_optimizer_state_dict(model, optimizer),
    )
    try:
        dcp.load({"model": model_state, "optim": optim_state}, checkpoint_id=str(path))
    except dcp.CheckpointException as e:  # raised on every rank: DCP gathers each rank's outcome
        ranks = ", ".join(str(r) for r in sorted(e.failures))
        raise DamagedCheckpoint(
            f"loading checkpoint {str(path)!r} failed on rank {ranks} ({_reason(e)})", _reason(e)
        ) from e
    set_model_state_dict(model, model_state)
    set_optimizer_state_dict(model, optimizer, optim_state)
    meta: dict[str, Any] = json.loads(meta_file.read_text())
    rng_file = path / f"rng-rank{dist.get_rank():05d}.pt"
    if meta["world_size"] == dist.get_world_size() and rng_file.is_file():
        _set_rng_state(torch.load(rng_file, weights_only=False))
    return meta

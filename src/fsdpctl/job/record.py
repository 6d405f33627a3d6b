"""Run records: what made a run, written when it starts, so it can be shown, compared and started
again.

Pure: the record is a dict built from the Config and from facts the edges gathered (the code version
from git, the image, the rendered manifests, the trainer's `start` event). Its id is a short hash of
what made the run (`made`): the job and run id, where it ran, the fully resolved settings, the code
and the image reference. What is learnt or derived later is kept beside it, not hashed: where each
value came from, the manifests (rendered from the hashed part and the id), the image digest the pods
report, and the trainer's library versions and data fingerprints.

Secrets are references, never values: HF_TOKEN is recorded as where the token lives (the Kubernetes
Secret, or the environment of `job run`), and a value of any key that looks like a secret is masked
as every output masks it.

How a record reads to a user (a .env, a history row, a drift, a diff) is fsdpctl.job.record_view.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, NotRequired, Required, TypedDict, cast

from fsdpctl.files import JOB_NAME, RUN_ID
from fsdpctl.job import world
from fsdpctl.job.world import WorldChange
from fsdpctl.redact import MASK, secret_kind
from fsdpctl.settings.rules import SECRET_KEYS
from fsdpctl.targets import NAMES
from fsdptrain import events, fingerprint

if TYPE_CHECKING:
    from fsdpctl.settings import Config

KIND = "fsdpctl.io/run-record"


VERSION = 1


ID_CHARS = 12  # 48 bits: distinct for every run anyone keeps


# the parts of a record the id covers; the rest is provenance or learnt after the start
MADE = ("kind", "version", "job", "run_id", "backend", "settings", "code", "image")


# a .env value written without quotes: python-dotenv's unquoted grammar takes it as is (no '#',
# space, quote)
BARE = re.compile(r"[A-Za-z0-9_./:,=@+%-]+")


# keys that say where a run lives and starts, not how it trains: `job diff` of two runs names them
# apart (`placement`); a rerun differs from its run in these alone (its own checkpoint directory,
# its start point)
PLACEMENT = ("JOB_NAME", "BACKEND", "JOB_NAMESPACE", "KUBE_CONTEXT", "CHECKPOINT_SUBDIR", "RESUME")


class CodeVersion(TypedDict):
    """The code a run ran (fsdpctl.adapters.git.code_version has this shape): the versions, and the
    commit of the checkout with whether (and how: `git diff HEAD`, hashed) it differed; commit None
    when not a git checkout."""

    fsdpctl: str
    fsdptrain: str
    commit: str | None
    dirty: bool | None
    diff_sha256: str | None


class ImageRef(TypedDict):
    """The image a run asked for, and its digest once a pod reported it (EKS: configmap.with_digest)."""

    uri: str
    digest: str | None
    digest_from: str


class FileEntry(TypedDict):
    name: str
    size: int
    head_sha256: str | None


class Fingerprint(TypedDict, total=False):
    """An input's fingerprint (fsdptrain.fingerprint.fingerprint; checked by its `well_formed`): a
    source with no files here is named only (`local` False)."""

    source: Required[str]
    local: Required[bool]
    files: int
    bytes: int
    digest: str
    listed: list[FileEntry]


class TrainerStart(TypedDict):
    """The trainer's `start` event as a record keeps it (`with_start`: fsdptrain.events.Start less
    its `event` and `record_id`)."""

    python: str
    torch: str
    transformers: str
    cuda: str | None
    nccl: str | None
    device: str
    start_step: int
    dataset: Fingerprint
    tokenizer: Fingerprint
    time: float
    levers: dict[str, str]
    resumed_from: NotRequired[str | None]


class RunRecord(TypedDict):
    """A run record as `build` makes it and fsdpctl.job.store.read reads it back (checked by
    `problem`): the parts that made the run (MADE, hashed), then provenance and what was learnt."""

    kind: str
    version: int
    job: str
    run_id: str
    backend: str
    settings: dict[str, str]  # KEY -> its .env value, secrets left out
    code: CodeVersion | None
    image: ImageRef | None
    created: float
    sources: dict[str, str]  # KEY -> where its value came from
    secrets: dict[str, str]  # KEY -> where the secret lives, in words
    trainer: TrainerStart | None  # the trainer's `start` event, merged when read back
    manifests: str | None  # what the backend submits (Slurm: the batch script), once prepared
    hash: str
    id: str
    losses: NotRequired[dict[str, float] | None]  # step (as text) -> loss, once the run ended
    # how the run ended, learnt before its place's trace of it went (a cluster job replaced)
    outcome: NotRequired[str | None]
    worlds: NotRequired[list[WorldChange] | None]  # its world changes, once the run ended


def value_text(value: Any) -> str:
    """A setting's value as its .env string: booleans as true/false (both Settings and the trainer
    read them), everything else as str() (floats keep repr's round trip)."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def resolved_settings(cfg: Config) -> dict[str, str]:
    """Every key fsdpctl reads, fully resolved (defaults and model defaults included), as .env
    strings; the secret keys are left out (see `secret_refs`), and any other value shaped like a
    secret is masked."""
    from fsdpctl.settings import Settings, setting_keys  # the model: for a run, not a read verb

    out = {}
    train = cfg.train_env()
    for key, name in setting_keys().items():
        if key in SECRET_KEYS:
            continue
        value = value_text(getattr(cfg, name)) if name in Settings.model_fields else train[key]
        out[key] = MASK if secret_kind(value) else value
    return out


def secret_refs(cfg: Config, secret_name: str) -> dict[str, str]:
    """Where each secret of the run lives, in words: never its value. Empty when the run has
    none."""
    if not (cfg.hf_token.get_secret_value() or cfg.hf_token_file):
        return {}
    given = (
        f"HF_TOKEN_FILE={cfg.hf_token_file}"
        if not cfg.hf_token.get_secret_value()
        else f"HF_TOKEN ({cfg.sources.get('HF_TOKEN', 'env')})"
    )
    if cfg.target.kubernetes:
        return {
            "HF_TOKEN": f"<secret: Kubernetes Secret {secret_name}, key HF_TOKEN; from {given}>"
        }
    return {"HF_TOKEN": f"<secret: the environment of `job run`; from {given}>"}


def digest(rec: Mapping[str, Any]) -> str:
    """sha256 of the canonical JSON (sorted keys, no spaces) of the parts of `rec` that made the
    run."""
    made = {k: rec.get(k) for k in MADE}
    if (
        made["image"] is not None
    ):  # the reference the run asked for; the digest is learnt from its pods
        made["image"] = {"uri": made["image"].get("uri")}
    return hashlib.sha256(
        json.dumps(made, sort_keys=True, separators=(",", ":")).encode()
    ).hexdigest()


def build(
    cfg: Config,
    *,
    run_id: str,
    code: CodeVersion,
    image: ImageRef | None,
    created: float,
    secret_name: str,
) -> RunRecord:
    """The record of a run about to start (no manifests yet: they are rendered with its id)."""
    from fsdpctl.settings import setting_keys

    rec: RunRecord = {
        "kind": KIND,
        "version": VERSION,
        "job": cfg.job_name,
        "run_id": run_id,
        "backend": cfg.backend,
        "settings": resolved_settings(cfg),
        "code": code,
        "image": image,
        "created": created,
        "sources": {k: cfg.sources.get(k, "default") for k in setting_keys()},
        "secrets": secret_refs(cfg, secret_name),
        "trainer": None,  # the trainer's `start` event, merged when read back
        "manifests": None,
        "hash": "",
        "id": "",
    }
    rec["hash"] = digest(rec)  # (not of itself: `hash` and `id` are not MADE)
    rec["id"] = rec["hash"][:ID_CHARS]
    return rec


def problem(rec: Any) -> str | None:
    """Why `rec` is not a run record fsdpctl can use (wrong shape, its parts no longer match its
    hash, or a part a reader uses is not of its type: a record is read back from a file anyone may
    have changed)."""
    if (
        not isinstance(rec, dict)
        or rec.get("kind") != KIND
        or not isinstance(rec.get("settings"), dict)
    ):
        return "is not a run record"
    if rec.get("version") != VERSION:
        return f"is a version {rec.get('version')} run record; this fsdpctl reads version {VERSION}"
    if rec.get("hash") != digest(rec) or rec.get("id") != str(rec.get("hash"))[:ID_CHARS]:
        return "was changed after it was written: its hash no longer matches what it records"
    wrong = [key for key, ok in _PARTS.items() if not ok(rec.get(key))]
    return f"is not a run record fsdpctl wrote (bad: {', '.join(wrong)})" if wrong else None


def _strings(v: Any) -> bool:
    return isinstance(v, dict) and all(
        isinstance(k, str) and isinstance(x, str) for k, x in v.items()
    )


def _plain(v: Any) -> bool:
    """An object of strings, numbers, booleans and nulls (the code and image parts)."""
    scalar = (str, int, float, bool, type(None))
    return v is None or (isinstance(v, dict) and all(isinstance(x, scalar) for x in v.values()))


def _trainer(v: Any) -> bool:
    """The trainer's start event as merged (`with_start`): versions as text, the two
    fingerprints."""
    if v is None:
        return True
    if not isinstance(v, dict) or not all(
        isinstance(v.get(k), str) for k in ("python", "torch", "transformers")
    ):
        return False
    optional = all(isinstance(v.get(k), str | None) for k in ("cuda", "nccl"))
    return optional and all(fingerprint.well_formed(v.get(k)) for k in ("dataset", "tokenizer"))


def _finite_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


_PARTS: dict[str, Callable[[Any], bool]] = {
    "job": lambda v: isinstance(v, str) and bool(JOB_NAME.fullmatch(v)),
    "run_id": lambda v: isinstance(v, str) and bool(RUN_ID.fullmatch(v)) and ".." not in v,
    "backend": lambda v: v in NAMES,
    "settings": _strings,
    "sources": _strings,
    "secrets": _strings,
    "created": _finite_number,
    "code": _plain,
    "image": _plain,
    "trainer": _trainer,
    "manifests": lambda v: v is None or isinstance(v, str),
    "losses": lambda v: v is None or _losses(v),
    "outcome": lambda v: v is None or (isinstance(v, str) and len(v) < 1000),
    "worlds": lambda v: v is None or _worlds(v),
}


def _worlds(v: Any) -> bool:
    """The run's world changes as kept (`learnt`): objects of the WorldChange keys."""
    keys = set(WorldChange.__annotations__)
    return isinstance(v, list) and all(isinstance(c, dict) and set(c) == keys for c in v)


def _losses(v: Any) -> bool:
    """The run's losses as kept (`learnt`): step (as text) -> a finite number."""
    return isinstance(v, dict) and all(
        isinstance(k, str) and k.isdigit() and _finite_number(x) for k, x in v.items()
    )


def with_start(rec: RunRecord, start: Mapping[str, Any]) -> RunRecord:
    """`rec` with the trainer's `start` event (versions, data fingerprints), when the event is this
    run's."""
    if start.get("record_id") != rec["id"]:
        return rec
    # the event's line as fsdptrain.events writes it: a Start's fields
    trainer = cast(
        TrainerStart, {k: v for k, v in start.items() if k not in ("event", "record_id")}
    )
    return {**rec, "trainer": trainer}


def learnt(rec: RunRecord, log: list[str]) -> RunRecord:
    """`rec` with this run's `start` event from the leader's log, when it is there, and the losses
    the log holds once the run ended (its summary): a cluster's logs go with the run's pods (a
    rerun on EKS replaces the job), the record stays to be compared."""
    for e in events.parse(log):
        if isinstance(e, events.Start) and e.record_id == rec["id"]:
            rec = with_start(rec, events.as_record(e))
            break
    else:
        return rec
    if any(isinstance(e, events.Summary) for e in events.parse(log)):
        rec = {**rec, "losses": {str(k): v for k, v in sorted(losses(log).items())}}
        rec = {**rec, "worlds": world.changes(log)}
    return rec


def at_its_end(rec: RunRecord, outcome: str, log: list[str] | None) -> RunRecord:
    """`rec` with how its run ended, as its place said before the next run replaced it, and its
    world changes from its whole log (`log`; None: its place kept none) where it ended with no
    summary to take them from (a stop between worlds)."""
    rec = {**rec, "outcome": outcome}
    if log is not None and rec.get("worlds") is None:
        rec = {**rec, "worlds": world.changes(log)}
    return rec


def worlds_text(rec: RunRecord) -> str:
    """The run's world changes in a line ("3 → 2 nodes at step 120: node-1 lost; ..."); "-" none,
    "unknown" before its end was read."""
    found = rec.get("worlds")
    if found is None:
        return "unknown"
    return "; ".join(world.text(c) for c in found) or "-"


def kept_losses(rec: RunRecord) -> dict[int, float]:
    """The losses a record kept when its run's log was read after its end (`learnt`)."""
    return {int(k): v for k, v in (rec.get("losses") or {}).items()}


def losses(log: list[str]) -> dict[int, float]:
    """Step -> loss of a run, from its leader's log: the summary's every-step losses when it
    finished (the step lines come only every LOG_INTERVAL), else the step lines; the latest wins
    where a restart repeats a step."""
    parsed = list(events.parse(log))
    out: dict[int, float] = {}
    for e in parsed:
        if isinstance(e, events.Step):
            out[e.step] = e.loss
        elif isinstance(e, events.Summary):
            out.update({e.start_step + 1 + i: loss for i, loss in enumerate(e.losses)})
    return out

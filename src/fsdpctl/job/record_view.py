"""A run record (fsdpctl.job.record) as a user reads it: as a .env that reproduces the run, a row of
`job history`, what changed since it ran (`drift`, for a rerun), and two runs side by side
(`diff`, `job diff`). Pure: the record in, text and rows out."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NotRequired, TypedDict

from fsdpctl.job.record import (
    BARE,
    PLACEMENT,
    CodeVersion,
    Fingerprint,
    ImageRef,
    RunRecord,
    TrainerStart,
    resolved_settings,
    worlds_text,
)
from fsdptrain import fingerprint


def quoted(value: str) -> str:
    """A value as python-dotenv reads it back unchanged: bare when it can be, else single-quoted
    with its backslashes and quotes escaped (the only escapes of dotenv's single-quoted grammar:
    \\\\ and \\')."""
    if BARE.fullmatch(value):
        return value
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def env_text(rec: RunRecord) -> str:
    """The record as a .env that reproduces the run: every resolved setting with where it came from,
    the secrets as comments saying where they live (set them again where you run it)."""
    lines = [
        f"# fsdpctl run record {rec['id']}: job {rec['job']}, run {rec['run_id']}, backend {rec['backend']}",
        f"# code: {code_text(rec.get('code'))}",
    ]
    if image := rec.get("image"):
        lines.append(f"# image: {image_text(image)}")
    for key, value in rec["settings"].items():
        lines.append(f"{key}={quoted(value)}  # {rec.get('sources', {}).get(key, 'default')}")
    for key, ref in rec.get("secrets", {}).items():
        lines.append(f"# {key}={ref}")
    return "\n".join(lines) + "\n"


def not_default(
    rec: RunRecord, defaults: Mapping[str, str] | None = None
) -> dict[str, tuple[str, str]]:
    """KEY -> (value, where it came from) for every setting that did not come from its plain default
    (a rerun's `record <id>: default` is still a default, and so are a model's own defaults and a
    value derived from the others when unset, such as FSX_STORAGE_GIB), nor equals it (`defaults`:
    the record's model's: a copy of .env.example sets every key, each to its default)."""
    sources = rec.get("sources", {})
    chosen = {k: sources.get(k, "default") for k in rec["settings"]}
    automatic = ("default", "model default", "derived")
    same = defaults or {}
    return {
        k: (v, chosen[k])
        for k, v in rec["settings"].items()
        if first_source(chosen[k]) not in automatic and same.get(k) != v
    }


def defaults_of(model: str) -> dict[str, str]:
    """Every key at its default for `model` (its model defaults included), as a record keeps
    them."""
    from fsdpctl.settings import load

    found = resolved_settings(load(flags={"MODEL": model} if model else {}))
    return {**found, "MODEL": resolved_settings(load())["MODEL"]}


def first_source(source: str) -> str:
    """Where a value first came from: `record 3f9c...: .env line 3` is `.env line 3`."""
    while source.startswith("record ") and ": " in source:
        source = source.split(": ", 1)[1]
    return source


def start_text(trainer: TrainerStart, short: bool = False) -> str:
    """Where the run started, as its trainer said: afresh, or the checkpoint it resumed (`short`: by
    its name, without the directory)."""
    if resumed := trainer.get("resumed_from"):
        where = str(resumed).rstrip("/").rpartition("/")[2] if short else resumed
        return f"from checkpoint {where} (step {trainer.get('start_step')})"
    return (
        "afresh (step 0)" if not trainer.get("start_step") else f"from step {trainer['start_step']}"
    )


# a row of `job history` (`history_rows`): `started` in UTC, ISO 8601; `from`: where it started
# (a keyword, hence the functional form); `changed`: KEY -> [before, after]
HistoryRow = TypedDict(
    "HistoryRow",
    {
        "run_id": str,
        "record": str,
        "started": str,
        "from": str,
        "changed": dict[str, list[Any]],
        "outcome": str,
        "world": str,
    },
)


def history_rows(runs: Sequence[RunRecord], outcomes: Mapping[str, str]) -> list[HistoryRow]:
    """`job history`: one row per run record, oldest first: run id, record id, when it started
    (UTC), where it started, the settings (placement keys too) that differ from the run before, how
    it ended (`outcomes` by run id, else what its record learnt before its output went; neither:
    unknown)."""
    import time

    rows: list[HistoryRow] = []
    before: RunRecord | None = None
    for rec in runs:
        changed = _changed(before["settings"], rec["settings"]) if before is not None else {}
        trainer = rec.get("trainer")
        rows.append(
            {
                "run_id": rec["run_id"],
                "record": rec["id"],
                "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(rec.get("created", 0))),
                "from": start_text(trainer, short=True)
                if trainer
                else "never trained (no start line)",
                "changed": changed,
                # what its place said when the next run replaced it (its phase with its
                # logs: "Stopped at step 12") says more than its logs alone can
                "outcome": rec.get("outcome")
                or outcomes.get(rec["run_id"])
                or "unknown: its output is gone",
                "world": worlds_text(rec),
            }
        )
        before = rec
    return rows


def code_text(code: CodeVersion | None) -> str:
    if not code:
        return "unknown"
    commit = code.get("commit")
    where = (
        f"commit {commit[:12]}" + (" (dirty)" if code.get("dirty") else "")
        if commit
        else "not a git checkout"
    )
    return f"fsdpctl {code.get('fsdpctl')}, fsdptrain {code.get('fsdptrain')}, {where}"


def image_text(image: ImageRef) -> str:
    digest_ = image.get("digest")
    return f"{image.get('uri')} @ {digest_}" if digest_ else f"{image.get('uri')} (digest unknown)"


def drift(
    rec: RunRecord,
    *,
    code: CodeVersion,
    data: Mapping[str, Mapping[str, Any] | None],
    image_digest: str | None = None,
) -> list[str]:
    """Why a rerun would not run what the record ran, one line each: the code (version, commit,
    local changes), the image digest (when both are known), the data or tokenizer files (`data`: the
    fingerprints computed now, by input name). Empty when nothing that can be checked differs."""
    found = []
    was: Mapping[str, object] = rec.get("code") or {}
    now: Mapping[str, object] = code
    for key in ("fsdpctl", "fsdptrain", "commit"):
        if was.get(key) != now.get(key):
            found.append(f"code: {key} was {was.get(key)}, now {now.get(key)}")
    if was.get("commit") and was.get("commit") == now.get("commit"):
        if (was.get("dirty"), was.get("diff_sha256")) != (now.get("dirty"), now.get("diff_sha256")):
            before, after = _changes(was), _changes(code)
            found.append(f"code: uncommitted changes (git diff HEAD) were {before}, now {after}")
    image, trainer = rec.get("image"), rec.get("trainer")
    recorded = image.get("digest") if image else None
    if image and recorded and image_digest and recorded != image_digest:
        found.append(f"image: {image.get('uri')} was {recorded}, now {image_digest}")
    for name, fp_now in data.items():
        fp_then = _fingerprint(trainer, name)
        change = fingerprint.difference(fp_then, fp_now)
        if change:
            found.append(f"{name} ({fp_then.get('source') if fp_then else '?'}): {change}")
    return found


def _fingerprint(trainer: TrainerStart | None, name: str) -> Fingerprint | None:
    """The fingerprint of input `name` (dataset, tokenizer) the trainer's start line gave."""
    if trainer is None or name not in ("dataset", "tokenizer"):
        return None
    return trainer.get("dataset") if name == "dataset" else trainer.get("tokenizer")


def _changes(code: Mapping[str, object]) -> str:
    return f"sha256 {str(code.get('diff_sha256'))[:12]}" if code.get("dirty") else "none"


def versions(rec: RunRecord) -> dict[str, object]:
    """The versions a record names: fsdpctl's code, the image, and the trainer's libraries (each a
    str, whether the checkout was dirty, or None: unknown)."""
    code: Mapping[str, object] = rec.get("code") or {}
    trainer: Mapping[str, object] = rec.get("trainer") or {}
    image: Mapping[str, object] = rec.get("image") or {}
    return {
        "fsdpctl": code.get("fsdpctl"),
        "fsdptrain": code.get("fsdptrain"),
        "commit": code.get("commit"),
        "dirty": code.get("dirty"),
        "image": image.get("uri"),
        "image_digest": image.get("digest"),
        **{k: trainer.get(k) for k in ("python", "torch", "transformers", "cuda", "nccl")},
    }


def data_of(rec: RunRecord) -> dict[str, str | None]:
    """The digest of each input the trainer read (None: unknown, or no files on its machine)."""
    found = {name: _fingerprint(rec.get("trainer"), name) for name in ("dataset", "tokenizer")}
    return {name: fp.get("digest") if fp else None for name, fp in found.items()}


def _changed(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, list[Any]]:
    return {k: [a.get(k), b.get(k)] for k in sorted(a.keys() | b.keys()) if a.get(k) != b.get(k)}


class LossRow(TypedDict):
    """A step of `job diff --losses` (`side_by_side`): the loss of run A and of run B there."""

    step: int
    a: float | None
    b: float | None


class RunName(TypedDict):
    id: str
    job: str
    run_id: str


class RecordDiff(TypedDict):
    """`job diff` of two runs (`diff`): each part KEY -> [A's value, B's value], where they differ."""

    a: RunName
    b: RunName
    settings: dict[str, list[Any]]
    placement: dict[str, list[Any]]
    versions: dict[str, list[Any]]
    data: dict[str, list[Any]]
    world: dict[str, list[Any]]  # the world changes, where both runs' ends were read and differ
    losses: NotRequired[list[LossRow]]  # `job diff` adds them (`side_by_side`)


def diff(a: RunRecord, b: RunRecord) -> RecordDiff:
    """What differs between two runs, each part only where it differs: the settings that change
    training, the placement keys (job name, backend, namespace), the versions, and the data
    fingerprints."""
    settings = _changed(a["settings"], b["settings"])
    return {
        "a": {"id": a["id"], "job": a["job"], "run_id": a["run_id"]},
        "b": {"id": b["id"], "job": b["job"], "run_id": b["run_id"]},
        "settings": {k: v for k, v in settings.items() if k not in PLACEMENT},
        "placement": {k: v for k, v in settings.items() if k in PLACEMENT},
        "versions": _changed(versions(a), versions(b)),
        "data": _changed(data_of(a), data_of(b)),
        "world": _world_diff(a, b),
    }


def _world_diff(a: RunRecord, b: RunRecord) -> dict[str, list[Any]]:
    """The world changes of two runs where both runs' ends were read (before that, unknown)."""
    if a.get("worlds") is None or b.get("worlds") is None:
        return {}
    return _changed({"changes": worlds_text(a)}, {"changes": worlds_text(b)})


def side_by_side(a: Mapping[int, float], b: Mapping[int, float]) -> list[LossRow]:
    """One row per step either run logged: step, loss A, loss B (None where a run has no such
    step)."""
    return [{"step": s, "a": a.get(s), "b": b.get(s)} for s in sorted(a.keys() | b.keys())]

"""Dynamic shell completion: job names, setting keys and their values, model names.

Typer's completion (`fsdpctl --install-completion`) runs fsdpctl with
`_FSDPCTL_COMPLETE=complete_bash` (zsh, fish, powershell alike) and asks each parameter's
`autocompletion=` callback for candidates. These callbacks read only the state directory and the
settings' own declarations (no torch, no kubernetes, no network) and never fail: a broken or missing
state directory completes to nothing.
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from collections.abc import Callable
from typing import Any

SET_OPTS = ("--set", "-s")


def _quiet(fn: Callable[..., list[str]]) -> Callable[..., list[str]]:
    """Completion must never print a traceback into the user's shell: any failure offers nothing."""

    @functools.wraps(
        fn
    )  # typer reads the callback's parameters (incomplete: str) through the wrapper
    def wrapped(*args: Any, **kwargs: Any) -> list[str]:
        try:
            return fn(*args, **kwargs)
        except Exception:  # noqa: BLE001 - see above
            return []

    return wrapped


@_quiet
def job_names(incomplete: str) -> list[str]:
    """Jobs this machine knows: local job directories (jobs/NAME) and records of where a job was
    started (started/NAME.json, cluster jobs included)."""
    from fsdpctl.files import JOB_NAME, home

    root = home()
    names = (
        {p.name for p in (root / "jobs").iterdir() if p.is_dir()}
        if (root / "jobs").is_dir()
        else set()
    )
    if (root / "started").is_dir():
        names |= {p.stem for p in (root / "started").glob("*.json")}
    return sorted(n for n in names if JOB_NAME.fullmatch(n) and n.startswith(incomplete))


@_quiet
def model_names(incomplete: str) -> list[str]:
    from fsdptrain.shapes import MODEL_CONFIGS

    return [m for m in MODEL_CONFIGS if m.startswith(incomplete)]


def _choices(key: str) -> list[str]:
    """The values a setting can only take: a Literal's, a bool's, MODEL's names, a training key's
    choices."""
    from fsdpctl.settings import Settings, setting_keys
    from fsdptrain.config import TrainConfig

    name = setting_keys().get(key)
    if key == "MODEL":
        return model_names("")
    if name in Settings.model_fields:
        kind = Settings.model_fields[name].annotation
    else:
        train = {f.name: f for f in dataclasses.fields(TrainConfig)}.get(name or "")
        if train is None:
            return []
        if train.metadata.get("choices"):
            return list(train.metadata["choices"])
        kind = typing.get_type_hints(TrainConfig).get(train.name)
    if typing.get_origin(kind) is typing.Literal:
        return [str(v) for v in typing.get_args(kind)]
    return ["true", "false"] if kind is bool else []


@_quiet
def settings(incomplete: str) -> list[str]:
    """`--set` candidates: `KEY=` for the keys that start so (any case), then, after `KEY=`,
    `KEY=VALUE` for the values it can only take."""
    from fsdpctl.settings import setting_keys

    key, sep, value = incomplete.partition("=")
    if sep:
        return [f"{key}={v}" for v in _choices(key.upper()) if v.startswith(value)]
    return [f"{k}=" for k in sorted(setting_keys()) if k.startswith(incomplete.upper())]


def set_values(args: list[str], incomplete: str) -> list[str] | None:
    """Candidates when the word being completed is a `--set` value, wherever it stands on the line
    (the root group moves --set before the subcommand, so no subcommand declares it); None when it
    is not one. bash splits `KEY=VAL` at `=` (COMP_WORDBREAKS): there the word is VAL after [--set,
    KEY, =]."""
    if args and args[-1] in SET_OPTS:
        return settings(incomplete)
    if incomplete.startswith("--set="):
        return ["--set=" + c for c in settings(incomplete.removeprefix("--set="))]
    if len(args) >= 3 and args[-3] in SET_OPTS and args[-1] == "=":
        return [c.partition("=")[2] for c in settings(f"{args[-2]}={incomplete}")]
    return None


def hook_set_anywhere() -> None:
    """While completing: `--set` values are answered here before click looks for the option in the
    subcommand (click's ShellComplete.get_completions is what every shell's class calls)."""
    from typer._click.shell_completion import CompletionItem, ShellComplete

    original = ShellComplete.get_completions
    if getattr(
        original, "fsdpctl_hook", False
    ):  # once per process: a second wrapper would wrap the first
        return

    def get_completions(self: Any, args: list[str], incomplete: str) -> list[Any]:
        found = set_values(args, incomplete)
        if found is None:
            return original(self, args, incomplete)
        return [CompletionItem(v) for v in found]

    get_completions.fsdpctl_hook = True  # type: ignore[attr-defined]
    ShellComplete.get_completions = get_completions  # type: ignore[method-assign]

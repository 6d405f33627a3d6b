"""Commands built when they are first used (issue 44): what `fsdpctl.cli`'s root group and each
command group hold in `commands`, and the root's option values converted without pydantic.

click's documented pattern (click docs, "Complex Applications: Lazily Loading Subcommands"): a
group names its commands without building them and builds one when asked. Here it is a mapping, so
that whatever reads `group.commands` (click's completion, the tests' walks over the tree, the docs'
CLI reference) sees every command: naming them costs nothing, `items()` builds them all.
"""

from __future__ import annotations

import copy
import importlib
import re
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from dataclasses import dataclass
from enum import Enum
from functools import partial
from pathlib import Path
from typing import Any

import typer
import typer.main
import typer.models
from typer._click import Command as ClickCommand
from typer._coercion import RuntimeParam
from typer.core import TyperCommand


class LazyCommands(MutableMapping[str, ClickCommand]):
    """A group's `commands`: every name of `builders` is there from the start, its command built by
    its builder on first use; `built` holds those built, and any added later."""

    def __init__(
        self, built: MutableMapping[str, ClickCommand], builders: Mapping[str, Callable[[], Any]]
    ) -> None:
        self.built = dict(built)
        self.builders = builders

    def __getitem__(self, name: str) -> ClickCommand:
        if name not in self.built:
            if name not in self.builders:
                raise KeyError(name)
            self.built[name] = self.builders[name]()
        return self.built[name]

    def __setitem__(self, name: str, cmd: ClickCommand) -> None:
        self.built[name] = cmd

    def __delitem__(self, name: str) -> None:
        del self.built[name]

    def __iter__(self) -> Iterator[str]:
        yield from self.builders
        yield from (n for n in self.built if n not in self.builders)

    def __len__(self) -> int:
        return len(self.builders.keys() | self.built.keys())


def build(module: str, attr: str, name: str, root: typer.Typer) -> Any:
    """The click command `name` for `module.attr` (a typer.Typer group or a command function), as
    typer's add_typer or command would build it under `root`; a group's own commands are lazy too,
    so `job list` builds the options of `list`, not of every job verb."""
    found = getattr(importlib.import_module(module), attr)
    looks = partial(
        typer.main.get_command_from_info,
        pretty_exceptions_short=root.pretty_exceptions_short,
        rich_markup_mode=root.rich_markup_mode,
    )
    if not isinstance(found, typer.Typer):
        info = typer.models.CommandInfo(name=name, callback=found, cls=Command)
        return looks(info)
    bare = copy.copy(found)  # the group itself (its callback, help, class), its commands apart
    bare.registered_commands = []
    group = typer.main.get_group_from_info(
        typer.models.TyperInfo(bare, name=name),
        suggest_commands=root.suggest_commands,
        pretty_exceptions_short=root.pretty_exceptions_short,
        rich_markup_mode=root.rich_markup_mode,
    )
    builders = {_name_of(info): partial(looks, _plain(info)) for info in found.registered_commands}
    group.commands = LazyCommands(group.commands, builders)
    return group


def _plain(info: typer.models.CommandInfo) -> typer.models.CommandInfo:
    """A group's command built as the root's are (`Command`: its options by PlainValues), unless
    it asked for a class of its own."""
    if info.cls not in (None, TyperCommand):
        return info
    mine = copy.copy(info)
    mine.cls = Command
    return mine


def _name_of(info: typer.models.CommandInfo) -> str:
    """A command's name as typer gives it: its own, else its function's, dashed."""
    assert info.callback is not None
    return info.name or typer.main.get_command_name(info.callback.__name__)


class NotPlain(Exception):
    """A word PlainValues leaves to typer's own conversion (and its error message)."""


@dataclass(frozen=True)
class PlainValues(RuntimeParam):
    """typer (0.2x) converts every option's value through a pydantic TypeAdapter it builds on first
    use, even for a flag left unset or a default: importing pydantic and building one costs about
    0.1 s of CPU, more than `fsdpctl version` does otherwise. Options that are strings, paths (no
    checks asked of them), flags, plain decimal numbers and choices of a str Enum are converted here
    to what typer's adapter gives (a list for a repeated option; tests/test_cli_imports.py holds
    the two equal on generated values); any other word (`convert` raises NotPlain), and any other
    annotation, go through typer's."""

    convert: Callable[[Any], Any] = str

    def _coerce_value(self, value: Any, param: Any, ctx: Any) -> Any:
        many = isinstance(value, (list, tuple))
        items = value if many else [value]
        try:
            converted = [self.convert(v) for v in items]
        except NotPlain:
            from typer._coercion import build_runtime_param

            return build_runtime_param(param.type_descriptor)._coerce_value(value, param, ctx)
        return converted if many else converted[0]


def _word(value: Any) -> str:
    if not isinstance(value, str):
        raise NotPlain
    return value


def _path(value: Any) -> Path:
    word = _word(value)
    if "\x00" in word:  # typer's adapter refuses it ("embedded null byte"): its words, not ours
        raise NotPlain
    return Path(word)


def _flag(value: Any) -> bool:
    if not isinstance(value, bool):
        raise NotPlain
    return value


# a number as people write one: pydantic reads these as float() does; anything else (1e3, 1_000,
# nan, spaces) is left to it
_DECIMAL = re.compile(r"[+-]?[0-9]{1,15}(\.[0-9]{1,15})?")


def _number(value: Any) -> float:
    if isinstance(value, bool):
        raise NotPlain
    if isinstance(value, (int, float)) or (isinstance(value, str) and _DECIMAL.fullmatch(value)):
        return float(value)
    raise NotPlain


def _choice(kind: type[Enum]) -> Callable[[Any], Any]:
    """A member of the str Enum `kind` by its value (typer's adapter: the same member)."""

    def convert(value: Any) -> Any:
        if isinstance(value, kind):
            return value
        if isinstance(value, str) and value in {m.value for m in kind}:
            return kind(value)
        raise NotPlain

    return convert


# the annotations PlainValues converts, and how
PLAIN: dict[Any, Callable[[Any], Any]] = {
    bool: _flag,
    bool | None: _flag,
    str: _word,
    str | None: _word,
    float: _number,
    float | None: _number,
    list[str] | None: _word,
    list[str]: _word,
    list[Path] | None: _path,
    list[Path]: _path,
}


def plain_converter(annotation: Any) -> Callable[[Any], Any] | None:
    """How PlainValues converts a value of `annotation`; None: typer's conversion."""
    try:
        if annotation in PLAIN:
            return PLAIN[annotation]
    except TypeError:  # an annotation that cannot be hashed is not one of them
        return None
    if (
        isinstance(annotation, type)
        and issubclass(annotation, Enum)
        and issubclass(annotation, str)
    ):
        return _choice(annotation)
    return None


def convert_plainly(param: Any) -> None:
    """The root's option `param` converted by PlainValues where its annotation is one of PLAIN's and
    typer was asked no path check of it; any other stays typer's."""
    info = getattr(param, "type_descriptor", None)
    if info is None or info.file_annotation is not None:
        return  # an older typer converts with click's types, no pydantic
    # a check or a conversion of typer's own asked of the option: typer's conversion does it
    checks = ("exists", "resolve_path", "allow_dash", "writable", "parser", "click_type")
    bounds = ("min", "max")
    asked = any(getattr(info.parameter_info, k, False) for k in checks) or any(
        getattr(info.parameter_info, k, None) is not None for k in bounds
    )
    convert = plain_converter(info.annotation)
    if convert is not None and not asked:
        param._runtime_param = PlainValues(info.parameter_info, info.annotation, convert=convert)


def plainly(params: list[Any]) -> list[Any]:
    for param in params:
        convert_plainly(param)
    return params


class Command(TyperCommand):
    """A command of the root (`fsdpctl version`, `plan`, ...) or of a group (`job list`): its
    options of PLAIN's kinds, and its --help, converted by PlainValues."""

    def get_params(self, ctx: Any) -> list[Any]:
        return plainly(super().get_params(ctx))

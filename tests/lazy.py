"""Modules imported on first use. Every xdist worker imports every test module while collecting;
torch and torch.distributed.checkpoint cost about 4 s of CPU each time, so the few fast tests that
need them import them lazily and run on one worker (`xdist_group("torch")`, `--dist loadgroup` in
`make test-fast`)."""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any


class Lazy:
    """Stands for a module until an attribute is read, then imports it."""

    def __init__(self, name: str) -> None:
        self._name = name

    def _module(self) -> ModuleType:
        return importlib.import_module(self._name)

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith(
            "_"
        ):  # pytest's collection probes every module-level name (__test__, _pytest...)
            raise AttributeError(attr)
        return getattr(self._module(), attr)


def lazy(name: str) -> Any:
    return Lazy(name)

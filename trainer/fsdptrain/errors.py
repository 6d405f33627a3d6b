"""The trainer's error for a bad setting, in a module of its own below every module that raises it
(config, shapes, data, checkpoint, fetch): shapes raises it and config reads shapes' model table, so
with the class in config the two imported each other."""

from __future__ import annotations


class ConfigError(ValueError):
    """A bad setting; the message is one line naming the key, the value and what is allowed."""

"""The kubeconfig, checked before the Kubernetes client reads it (fsdpctl.adapters.kube connects
through it): a file the client would choke on (not YAML, not a mapping, entries without a name) is one
line naming it and the fix, never the client's traceback."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fsdpctl.outside import Door


KUBECONFIG_MAX = 16 * 1024 * 1024  # kubeconfigs with many clusters and embedded certificates: MBs


KUBECONFIG_ITEMS = {"clusters": "cluster", "contexts": "context", "users": "user"}


def check_kubeconfig(kubeconfig: str | None) -> None:
    """Each kubeconfig file the client would read, read first through the one door for outside
    files (fsdpctl.outside: a directory, a FIFO, a device, NUL bytes, a huge or non-UTF-8 file are
    one line naming it) and checked as the client reads it: kubernetes/config/kube_config.py
    KubeConfigMerger splits $KUBECONFIG at ':' (ENV_KUBECONFIG_PATH_SEPARATOR), expands `~`, skips
    a path that does not exist, then `yaml.safe_load(open(path))` (a YAML error escaped it, a FIFO
    hung it, a directory was an IsADirectoryError) and treats the document as a mapping whose
    clusters, contexts and users are lists of mappings with a `name` (`_merge`: anything else was a
    TypeError or KeyError)."""
    from fsdpctl.outside import Door

    given = kubeconfig is not None
    door = Door(
        what="KUBECONFIG" if given else "the kubeconfig",
        noun="a kubeconfig",
        limit=KUBECONFIG_MAX,
        hint="fix it, or point KUBECONFIG at a kubeconfig (`aws eks update-kubeconfig` writes one)",
    )
    for path in (kubeconfig or "~/.kube/config").split(":"):
        path = os.path.expanduser(path)
        if path and os.path.exists(path):  # as the client: a path that is not there is skipped
            _check_file(door, path)


def _check_file(door: Door, path: str) -> None:
    """One kubeconfig file: YAML, a mapping at its top, its lists as the client's `_merge` reads
    them."""
    import yaml

    from fsdpctl.outside import read_text

    text = read_text(door, path)
    try:
        doc = yaml.safe_load(text or "")
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise door.refuse(path, f"{where}is not YAML ({problem})") from None
    if doc is None:
        return  # the client says "file is empty" itself
    if not isinstance(doc, dict):
        raise door.refuse(
            path, f"is not a kubeconfig: YAML whose top is a {_kind(doc)}, not a mapping"
        )
    for item, body in KUBECONFIG_ITEMS.items():
        _check_entries(door, path, item, body, doc.get(item) or [])


def _check_entries(door: Door, path: str, item: str, body: str, entries: Any) -> None:
    """`clusters`, `contexts` or `users`: a list of mappings, each with a name and its body (the
    client reads each body as a mapping: `'server' in ...`)."""
    if not isinstance(entries, list) or not all(
        isinstance(e, dict) and isinstance(e.get("name"), str) for e in entries
    ):
        raise door.refuse(
            path, f"is not a kubeconfig: {item} must be a list of entries, each with a name"
        )
    for entry in entries:
        if not isinstance(entry.get(body) or {}, dict):
            raise door.refuse(
                path,
                f"is not a kubeconfig: the {body} of {item[:-1]} {entry['name']!r} is a "
                f"{_kind(entry.get(body))}, not a mapping",
            )


def _kind(doc: Any) -> str:
    return {str: "string", list: "list", int: "number", float: "number", bool: "boolean"}.get(
        type(doc), type(doc).__name__
    )

"""Which pyxis and enroot the Slurm sandbox gives its nodes (fsdpctl.sandbox.containers), over every
arrangement of a machine: pyxis installed or not, enroot on PATH or not, the tests' build
(tests/pyxis_peer.py) complete, incomplete or absent, enroot's run-time tools there or not.

Where each lives is read in the projects' own sources: pyxis v0.24.0's Makefile installs
spank_pyxis.so in $(prefix)/lib/slurm (prefix /usr/local) and plugstack.conf takes `required PLUGIN
ARGS` (spank(8); pyxis config.c reads runtime_path=); enroot v4.1.2's README "Requirements" lists
unsquashfs, jq, parallel and pigz; the build's layout is tests/pyxis_peer.py `Build`. Peer: real
files and executables in a temporary tree (the real daemons run it in test_sandbox_slurm.py)."""

from __future__ import annotations

import itertools
import stat
from pathlib import Path

import pytest

from fsdpctl.sandbox import containers
from fsdpctl.sandbox.containers import Kit


def _tool(bindir: Path, name: str) -> None:
    bindir.mkdir(parents=True, exist_ok=True)
    (bindir / name).write_text("#!/bin/sh\n")
    (bindir / name).chmod(stat.S_IRWXU)


def _machine(tmp: Path, installed: bool, on_path: bool, build: str, tools: bool) -> str:
    """A machine as arranged; its PATH."""
    bindir = tmp / "bin"
    bindir.mkdir()
    if installed:
        (tmp / "plugins").mkdir()
        (tmp / "plugins" / containers.PLUGIN).write_bytes(b"\x7fELF")
    if on_path:
        _tool(bindir, "enroot")
    if tools:
        for name in containers.RUNTIME_TOOLS:
            _tool(bindir, name)
    if build != "none":
        root = tmp / "cache" / "pyxis-enroot-0123456789abcdef"
        _tool(root / "enroot" / "bin", "enroot")
        (root / "pyxis").mkdir()
        (root / "pyxis" / containers.PLUGIN).write_bytes(b"\x7fELF")
        (root / "node-local").mkdir()
        if build == "complete":
            (root / "complete").write_text("key\n")
    return str(bindir)


ARRANGEMENTS = list(
    itertools.product(
        (False, True), (False, True), ("none", "incomplete", "complete"), (False, True)
    )
)


@pytest.mark.parametrize(("installed", "on_path", "build", "tools"), ARRANGEMENTS)
def test_the_kit_is_the_installed_one_else_the_complete_build_else_none_with_why(
    tmp_path, monkeypatch, installed, on_path, build, tools
):
    path = _machine(tmp_path, installed, on_path, build, tools)
    monkeypatch.setattr(containers, "PLUGIN_DIRS", (tmp_path / "plugins",))
    monkeypatch.setattr(containers, "BUILT", tmp_path / "cache")
    kit, why = containers.find(path)
    system = installed and on_path
    if not tools or not (system or build == "complete"):
        assert kit is None and why and "\n" not in why
        what = "enroot needs" if (system or build == "complete") else "no pyxis"
        assert why.startswith(what), why
        return
    assert why == ""
    assert kit is not None
    if system:  # installed first: its own enroot.conf, nothing bound
        assert kit == Kit(tmp_path / "plugins" / containers.PLUGIN, tmp_path / "bin")
        assert kit.plugstack() == f"required {kit.plugin}\n"
        assert containers.prepare_node(kit, tmp_path / "node0") is None
        return
    root = tmp_path / "cache" / "pyxis-enroot-0123456789abcdef"
    assert kit == Kit(
        root / "pyxis" / containers.PLUGIN, root / "enroot" / "bin", root / "node-local"
    )
    assert (
        kit.plugstack() == f"required {kit.plugin} runtime_path={root / 'node-local' / 'pyxis'}\n"
    )
    env = kit.node_env("/usr/bin")
    assert env["PATH"] == f"{kit.bin}:/usr/bin"
    assert {env[k] for k in containers.NODE_DIRS} <= {
        str(root / "node-local" / s) for s in containers.NODE_DIRS.values()
    }
    bind = containers.prepare_node(kit, tmp_path / "node0")
    assert bind == (tmp_path / "node0", root / "node-local")
    assert all((tmp_path / "node0" / s).is_dir() for s in (*containers.NODE_DIRS.values(), "pyxis"))


@pytest.mark.parametrize("local", [None, "/x/node-local"])
def test_a_kit_survives_the_state_and_a_foreign_record_is_refused(local):
    kit = Kit(Path("/x/spank_pyxis.so"), Path("/x/bin"), Path(local) if local else None)
    assert containers.of_record(kit.as_record()) == kit
    assert containers.of_record(None) is None
    for bad in ("text", {"plugin": "/x"}, ["/x", "/y"]):
        with pytest.raises(ValueError):
            containers.of_record(bad)

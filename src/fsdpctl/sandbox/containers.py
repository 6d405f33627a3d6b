"""Containers on the Slurm sandbox, where this machine has them: NVIDIA's pyxis (the SPANK plugin
behind `srun --container-image`, which SLURM_CONTAINER_IMAGE uses) and enroot (the runtime pyxis
runs), as on HyperPod and ParallelCluster.

Found, in this order:
- installed: pyxis's `make install` puts the plugin in $(prefix)/lib/slurm/spank_pyxis.so (pyxis
  v0.24.0 Makefile, prefix /usr/local; a distribution package in its Slurm's plugin directory), and
  enroot is on PATH with its own /etc/enroot/enroot.conf;
- built by the tests (tests/pyxis_peer.py, from ../shared/vendor): ~/.cache/fsdpctl-tests/
  pyxis-enroot-<key>/ once it holds `complete`; its enroot.conf keeps enroot's runtime, cache, data
  and temp directories under its `node-local` directory, which each simulated node binds a directory
  of its own over, as each real node has its own disk.

pyxis runs `enroot` by PATH, the one variable of slurmstepd's it keeps (pyxis_slurmstepd.c
slurm_clear_env): slurmd gets enroot's directory first on its PATH. enroot needs unsquashfs, jq,
parallel and pigz at run time (enroot README "Requirements"): without them, no containers.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

PLUGIN = "spank_pyxis.so"
# where pyxis's `make install` (prefix /usr/local) and Debian's slurm-wlm (its plugin directory)
# put SPANK plugins
PLUGIN_DIRS = (
    Path("/usr/local/lib/slurm"),
    Path("/usr/lib/x86_64-linux-gnu/slurm-wlm"),
    Path("/usr/lib/aarch64-linux-gnu/slurm-wlm"),
    Path("/usr/lib/slurm"),
)
# tests/pyxis_peer.py cache_root() and Build: the tests' build, kept between sessions
BUILT = Path.home() / ".cache" / "fsdpctl-tests"
RUNTIME_TOOLS = ("unsquashfs", "jq", "parallel", "pigz")
# enroot.conf's directories under a build's node-local directory (tests/pyxis_peer.py Build)
NODE_DIRS = {
    "ENROOT_RUNTIME_PATH": "run",
    "ENROOT_CACHE_PATH": "cache",
    "ENROOT_DATA_PATH": "data",
    "ENROOT_TEMP_PATH": "tmp",
    "ENROOT_CONFIG_PATH": "config",
}


@dataclass(frozen=True)
class Kit:
    """pyxis's plugin and enroot's bin directory; `node_local`: the directory a build's enroot.conf
    names, bound per node (None: an installed enroot, with its own configuration)."""

    plugin: Path
    bin: Path
    node_local: Path | None = None

    def plugstack(self) -> str:
        """plugstack.conf's line (spank(8): `required PLUGIN ARGS`; pyxis config.c runtime_path=,
        per node under a build's node-local directory; default /run/pyxis)."""
        where = f" runtime_path={self.node_local / 'pyxis'}" if self.node_local else ""
        return f"required {self.plugin}{where}\n"

    def node_env(self, path: str) -> dict[str, str]:
        """slurmd's PATH with enroot's first, and a build's ENROOT_*_PATH for an `enroot` run by
        hand on a node (what pyxis runs reads them from enroot.conf)."""
        found = {"PATH": f"{self.bin}:{path}"}
        if self.node_local is not None:
            found |= {k: str(self.node_local / sub) for k, sub in NODE_DIRS.items()}
        return found

    def as_record(self) -> dict[str, str]:
        local = {"node_local": str(self.node_local)} if self.node_local else {}
        return {"plugin": str(self.plugin), "bin": str(self.bin), **local}


def of_record(raw: object) -> Kit | None:
    """A Kit as the sandbox's state records it (None: none)."""
    if raw is None:
        return None
    if not isinstance(raw, dict) or not {"plugin", "bin"} <= raw.keys():
        raise ValueError(f"containers: {raw!r} is not a plugin and a bin directory")
    local = raw.get("node_local")
    return Kit(Path(str(raw["plugin"])), Path(str(raw["bin"])), Path(local) if local else None)


def find(path: str | None = None) -> tuple[Kit | None, str]:
    """pyxis and enroot as this machine has them, or why not, in words."""
    lacking = [t for t in RUNTIME_TOOLS if shutil.which(t, path=path) is None]
    installed, built = _installed(path), _built()
    kit = installed or built
    if kit is None:
        return None, (
            f"no pyxis ({PLUGIN} in {', '.join(map(str, PLUGIN_DIRS))}) with enroot on PATH, "
            f"and no build of tests/pyxis_peer.py in {BUILT}"
        )
    if lacking:
        return (
            None,
            f"enroot needs {', '.join(lacking)} (apt-get install squashfs-tools jq parallel pigz)",
        )
    return kit, ""


def _installed(path: str | None) -> Kit | None:
    enroot = shutil.which("enroot", path=path)
    plugin = next((d / PLUGIN for d in PLUGIN_DIRS if (d / PLUGIN).is_file()), None)
    return Kit(plugin, Path(enroot).parent) if enroot and plugin else None


def _built() -> Kit | None:
    """The newest complete build of the tests (several: another pyxis, enroot or Slurm each)."""
    done = [d for d in BUILT.glob("pyxis-enroot-*") if (d / "complete").is_file()]
    for root in sorted(done, key=lambda d: d.stat().st_mtime, reverse=True):
        kit = Kit(root / "pyxis" / PLUGIN, root / "enroot" / "bin", root / "node-local")
        if (
            kit.plugin.is_file()
            and os.access(kit.bin / "enroot", os.X_OK)
            and root.joinpath("node-local").is_dir()
        ):
            return kit
    return None


def prepare_node(kit: Kit, local: Path) -> tuple[Path, Path] | None:
    """Node-local directories for enroot and pyxis under `local`; the bind (`local` over the
    build's node-local directory) the node's boot makes, or None for an installed enroot."""
    if kit.node_local is None:
        return None
    for sub in (*NODE_DIRS.values(), "pyxis", "config/mounts.d"):
        (local / sub).mkdir(parents=True, exist_ok=True)
    return local, kit.node_local

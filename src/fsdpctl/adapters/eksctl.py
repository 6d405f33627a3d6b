"""Adapter: eksctl, through the shell adapter. fsdpctl renders the ClusterConfig
(render_clusterconfig); this writes it and builds the command lines that create or delete the
cluster it describes."""

from __future__ import annotations

from pathlib import Path

from fsdpctl.adapters.shell import Command
from fsdpctl.files import write_atomic

CONFIG_FILE = "clusterconfig.yaml"


def write_config(workdir: Path, text: str) -> Path:
    """The ClusterConfig as `workdir/clusterconfig.yaml`, written atomically."""
    path = workdir / CONFIG_FILE
    write_atomic(path, text)
    return path


def cluster_command(verb: str, config_file: Path, env: dict[str, str]) -> Command:
    """`eksctl create|delete cluster -f FILE`; delete waits until CloudFormation has removed
    everything."""
    if verb not in ("create", "delete"):
        raise ValueError(f"eksctl cluster verb {verb!r}: create or delete")
    argv = ["eksctl", verb, "cluster", "-f", str(config_file)]
    return Command(argv + (["--wait"] if verb == "delete" else []), env)

"""Adapter: terraform, through the shell adapter. Each cluster gets its own copy of fsdpctl's
terraform/ module (its state lives there between runs) with the settings as
`fsdpctl.auto.tfvars.json`; this prepares that directory and builds the init + apply/destroy command
lines that run in it."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from fsdpctl.adapters.shell import Command
from fsdpctl.files import write_atomic

VARS_FILE = "fsdpctl.auto.tfvars.json"  # terraform reads *.auto.tfvars.json by itself
STATE_FILE = (
    "terraform.tfstate"  # the local backend's state, which the module keeps (no backend block)
)
PLUGIN_DIR_ENV = "FSDPCTL_TF_PLUGIN_DIR"  # an offline provider mirror, e.g. /opt/tf-plugins


def prepare(module: Path, workdir: Path, variables: dict[str, Any]) -> tuple[Path, str]:
    """Copy `module` into `workdir` (leaving its .terraform/ and state alone) and write the
    variables there; returns the variables file and its text."""
    shutil.copytree(
        module,
        workdir,
        dirs_exist_ok=True,
        ignore=shutil.ignore_patterns(".terraform*", "*.tfstate*"),
    )
    text = json.dumps(variables, indent=2) + "\n"
    write_atomic(workdir / VARS_FILE, text)
    return workdir / VARS_FILE, text


def commands(verb: str, workdir: Path, env: dict[str, str]) -> list[Command]:
    """`terraform init` (from the offline plugin mirror when FSDPCTL_TF_PLUGIN_DIR names one), then
    `apply` or `destroy` without questions."""
    if verb not in ("apply", "destroy"):
        raise ValueError(f"terraform verb {verb!r}: apply or destroy")
    plugins = os.environ.get(PLUGIN_DIR_ENV)
    chdir = f"-chdir={workdir}"
    init = [
        "terraform",
        chdir,
        "init",
        "-input=false",
        *([f"-plugin-dir={plugins}"] if plugins else []),
    ]
    run = ["terraform", chdir, verb, "-input=false", "-auto-approve"]
    return [Command(init, env), Command(run, env)]


def state_resources(workdir: Path) -> list[str]:
    """The addresses of the managed resources terraform's local state in `workdir` holds: what
    `destroy` would delete. Empty without a state file or after a destroy (the state then lists no
    resources)."""
    path = workdir / STATE_FILE
    if not path.is_file() or not path.read_text().strip():
        return []
    state = json.loads(path.read_text())
    return [
        ".".join(p for p in (r.get("module", ""), r["type"], r["name"]) if p)
        for r in state.get("resources", [])
        if r.get("mode") == "managed" and r.get("instances")
    ]

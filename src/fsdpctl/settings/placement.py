"""Whether the job fits where it would run (pure; the readers are injected): the token file, the
nodes of the cluster, this machine's cores and paths."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fsdpctl.settings.config import Config

# A local job beyond this many processes per core spends its time switching between them: the
# collectives time out before the steps end.
LOCAL_PROCS_PER_CORE = 4


def placement_problems(
    cfg: Config, *, cores: int, exists: Callable[[str], bool], mounts: Mapping[str, str]
) -> list[str]:
    """What cannot be scheduled where the job would run, one line each with the fix (`--force` may
    run it anyway). The readers are injected, so this stays free of I/O: `cores` of this machine,
    `exists` for a path on it, `mounts` the pod mount paths the local backend maps to directories
    here (claim -> FSDPCTL_HOME/ volumes/<claim>). Paths inside a cluster's pods cannot be checked
    from here, so on EKS only the token file (read here, into the Secret) is."""
    errors = []
    if cfg.hf_token_file and not cfg.hf_token.get_secret_value() and not exists(cfg.hf_token_file):
        errors.append(
            f"HF_TOKEN_FILE={cfg.hf_token_file!r} does not exist: check the path, or set HF_TOKEN"
        )
    if cfg.target.kubernetes and cfg.job_nodes > cfg.node_count:
        errors.append(
            f"JOB_NODES={cfg.job_nodes} exceeds NODE_COUNT={cfg.node_count}, the GPU nodes of the node "
            f"group: the other pods would stay Pending; set JOB_NODES={cfg.node_count}, or NODE_COUNT="
            f"{cfg.job_nodes} and grow the node group"
        )
    if not cfg.target.on_this_machine:
        return errors
    most = LOCAL_PROCS_PER_CORE * cores
    if cfg.world_size > most:
        errors.append(
            f"JOB_NODES={cfg.job_nodes} x LOCAL_PROCS_PER_NODE={cfg.local_procs_per_node} is "
            f"{cfg.world_size} local processes for this machine's {cores} cores: use at most {most} "
            f"({LOCAL_PROCS_PER_CORE} per core), or BACKEND=eks"
        )
    t = cfg.training
    paths = (
        ("DATASET", t.dataset),
        ("TOKENIZER", t.tokenizer),
        ("PRETRAINED", t.pretrained),
        ("RESUME", t.resume),
    )
    for key, value in paths:
        if value.startswith(("/", "./", "../", "~")) and not exists(local_path(value, mounts)):
            where = _mapped(value, mounts)
            errors.append(
                f"{key}={value!r} does not exist on this machine{where}: put it there or fix {key}"
            )
    return errors


def local_path(path: str, mounts: Mapping[str, str]) -> str:
    """Where a pod path is on this machine under the local backend: below a mapped mount (the
    longest one that holds it), that mount's directory; any other path is the machine's own."""
    for mount in sorted(mounts, key=len, reverse=True):
        root = mount.rstrip("/")
        if path == root or path.startswith(root + "/"):
            return mounts[mount] + path[len(root) :]
    return path


def _mapped(path: str, mounts: Mapping[str, str]) -> str:
    here = local_path(path, mounts)
    return f" (the local backend reads it at {here})" if here != path else ""

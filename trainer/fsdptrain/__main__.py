"""`python -m fsdptrain` / `torchrun -m fsdptrain`: settings are checked before torch is even imported."""

import os
import sys

from fsdptrain.config import ConfigError, from_sources
from fsdptrain.shapes import job_mesh_shape


def main(argv: list[str] | None = None) -> int:
    try:
        cfg = from_sources(argv)
        # checked before any process group exists, so a bad group size fails fast on every rank
        job_mesh_shape(
            cfg.sharding_strategy,
            int(os.environ.get("WORLD_SIZE", "1")),
            hsdp_shard_size=cfg.hsdp_shard_size,
            procs_per_node=int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
        )
    except ConfigError as e:
        print(f"fsdptrain: error: {e}", file=sys.stderr)
        return 2
    from fsdptrain.train import run

    return run(cfg)


if __name__ == "__main__":
    sys.exit(main())

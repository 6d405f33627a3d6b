"""`python -m fsdptrain` / `torchrun -m fsdptrain`: settings are checked before torch is even
imported.

Exit codes: 0 done (also after SIGTERM, with a checkpoint), 1 failure, 2 bad setting. In a pod,
`fsdptrain.launch` runs the same checks before torchrun starts, so a bad setting ends there with 2
and is never retried; a 2 from here (a setting only a running rank can judge) is retried like any
failure.
"""

import os
import sys

from fsdptrain.config import ConfigError, from_sources, print_error
from fsdptrain.fetch import before_process_group
from fsdptrain.launch import check, check_device, finished_run, say_finished


def main(argv: list[str] | None = None) -> int:
    try:
        cfg = from_sources(argv)
        # a worker group torchrun's agent started again once the run had saved its last step (a
        # node that joined as the last step ended restarts the group: torch 2.13 agent/server/api.py
        # num_nodes_waiting): nothing is left to do, where the resume check's refusal (2) would
        # fail a job that trained to its end
        if (done := finished_run(cfg, os.environ)) is not None:
            if os.environ.get("RANK", "0") == "0":
                say_finished(done)
            return 0
        # checked before any process group exists, so a bad group size fails fast on every rank
        check(
            cfg,
            world=int(os.environ.get("WORLD_SIZE", "1")),
            procs_per_node=int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
        )
        check_device(cfg)
        # hub downloads done (or waited for) before any process group: no collective, so no timeout
        hub = {"PRETRAINED": cfg.pretrained, "TOKENIZER": cfg.tokenizer, "DATASET": cfg.dataset}
        before_process_group(hub, os.environ)
    except ConfigError as e:
        print_error(str(e))
        return 2
    from torch.distributed.elastic.multiprocessing.errors import record

    from fsdptrain.train import run

    # `record` writes an uncaught exception to the TORCHELASTIC_ERROR_FILE torchrun gives each
    # worker, so its root-cause report (and `fsdpctl job status`) names this rank's error, not
    # "error_file: <N/A>"
    return record(run)(cfg) or 0


if __name__ == "__main__":
    sys.exit(main())

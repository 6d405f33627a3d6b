"""`python -m fsdptrain.rdzv_store HOST PORT`: a TCPStore that hosts torchrun's c10d rendezvous off
every worker node, until SIGTERM.

Why a store of its own, not etcd-v2 (both are in torch 2.13's dynamic rendezvous): the c10d backend
keeps the whole rendezvous state in one key of a TCPStore, compare-and-set
(torch/distributed/elastic/rendezvous/c10d_rendezvous_backend.py, C10dRendezvousBackend.set_state),
and an agent hosts that store only where `is_host` says so or its host name matches the endpoint
(_create_tcp_store). On a worker node the store dies with the node, and torch has no failover for
it: node 0 lost is a lost rendezvous. Hosted here, by the local backend's supervisor (a process on
no worker node, as the etcd `fsdpctl deploy` runs is on no GPU node), with `is_host=false` for
every agent, losing any node, node 0 included, is the same event: the survivors' keep-alives go on
in the same state (dynamic_rendezvous.py, _should_keep_alive), the lost node's heartbeat expires
(keep_alive_interval x keep_alive_max_attempt), and they close a new round at MIN..MAX nodes. It
needs neither an etcd binary nor python-etcd in the trainer's environment, and `multi_tenant=True`
matches what each agent opens (one server per port, shared by every agent's client)."""

from __future__ import annotations

import signal
import sys
import threading
from datetime import timedelta


def main(argv: list[str]) -> int:
    from torch.distributed import TCPStore

    host, port = argv[0], int(argv[1])
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    store = TCPStore(
        host,
        port,
        is_master=True,
        multi_tenant=True,
        wait_for_workers=False,
        timeout=timedelta(seconds=60),
    )
    print(f"fsdptrain: rendezvous store on {host}:{port}", flush=True)
    done.wait()
    del store
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

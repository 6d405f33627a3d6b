"""Places to try a backend on one machine, started and torn down by `fsdpctl sandbox ...`, as `kind
create cluster` gives Kubernetes users one: `slurm` (Debian's slurm-wlm and munge, the same cluster the
tests run against, tests/slurm_peer.py)."""

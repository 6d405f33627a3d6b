"""The elastic range (MIN_NODES below JOB_NODES) in the Slurm batch script (pure): what Slurm 22.05
allows, from its own source (SchedMD/slurm tag slurm-22-05-8-1) and man pages, and what it does not.

- `--no-kill` (sbatch and srun): a failed node of a running job is removed from it instead of ending
  it (src/slurmctld/job_mgr.c kill_running_job_by_node_name: `kill_on_node_fail == 0` -> "Removing
  failed node .. from JobId", excise_node_from_job); srun's step marks the node's tasks ended and
  goes on (src/api/step_launch.c _node_fail_handler: "Node failure on NODE"). torchrun's agents on
  the other nodes re-rendezvous at MIN..MAX (`--nnodes=MIN:MAX`) on a store no trainer node hosts.
- The batch host is excised too, and the job then has no batch script while it stays RUNNING on the
  others until its time limit: slurmctld looks for a missing batch script only on a node that is
  still the job's (job_mgr.c _purge_missing_jobs: `bit_test(job_ptr->node_bitmap, node_inx)`),
  measured on the peer. `orphan_guard` ends that: a trainer task whose launcher ended finds the
  job's BatchHost outside its NodeList and requeues the job (or cancels it without requeues).
- `--nodes=MIN-MAX`: "as many nodes as possible within the range specified and without delaying the
  initiation of the job" (sbatch(1)): a requeued run starts on the nodes that are up, at least MIN.
- No growth of a running job: "Slurm supports the ability to decrease the size of jobs" only (22.05
  doc/html/faq.shtml, "Can I change my job's size after it has started running?"; scontrol(1)
  NumNodes: "a node count less than currently allocated"). The job grows back at its next
  requeue or run.
"""

from __future__ import annotations

import shlex

from fsdpctl.job import policy as jobpolicy
from fsdpctl.settings import Config

C10D_PORT = jobpolicy.C10D_PORT  # torchrun's c10d default (awsome's endpoint names no port)


def ranged(cfg: Config) -> bool:
    """An elastic range (MIN_NODES below JOB_NODES): see `elastic_options`."""
    return cfg.fewest_nodes < cfg.job_nodes


def elastic_options(cfg: Config) -> list[str]:
    """#SBATCH options of a job with an elastic range (none without one). `--nodes=MIN-MAX`: a
    requeued run starts on as many nodes as are up, at least MIN ("as many nodes as possible within
    the range specified and without delaying the initiation of the job", sbatch(1) of 22.05).
    `--no-kill`: a failed node is removed from the running job instead of ending it (slurmctld
    job_mgr.c kill_running_job_by_node_name: `kill_on_node_fail == 0` -> "Removing failed node ..
    from JobId", excise_node_from_job), so the trainers on the other nodes go on. No
    `--ntasks-per-node` then: sbatch counts MIN x that many tasks and Slurm allocates the nodes
    they need, MIN (measured on the peer: `-N 2-3 --ntasks-per-node=1` got 2 idle nodes of 3,
    `-N 2-3 --exclusive` all 3); the trainers' srun asks one task per node itself."""
    if not ranged(cfg):
        return [f"--nodes={cfg.job_nodes}", "--ntasks-per-node=1"]
    return [f"--nodes={cfg.fewest_nodes}-{cfg.job_nodes}", "--no-kill"]


def store_lines(cfg: Config, root: str) -> list[str]:
    """The c10d rendezvous store of a ranged job (fsdptrain.rdzv_store): hosted by the batch
    script on the batch host, outside the trainers' step, so that a step retry or a lost non-batch
    node leaves it in place (torch has no failover for the store host: c10d_rendezvous_backend.py
    _create_tcp_store). Losing the batch host loses the script too, and with it the run: the
    requeue path (sbatch --requeue). It ends with the script (the EXIT trap; slurmstepd kills what
    is left of the batch step at the job's end)."""
    py = shlex.quote(cfg.slurm_python)
    return [
        "# the rendezvous store of the elastic range: here, outside the trainers' step (a lost node",
        "# of the step leaves it in place); every agent connects (is_host=false)",
        f'{py} -m fsdptrain.rdzv_store "$head" {C10D_PORT} >>{shlex.quote(root)}/rdzv-store.log 2>&1 &',
        "store=$!",
        'export FSDPCTL_RDZV_HOST="$head"  # where orphan_guard asks whether the store answers',
        "trap 'kill \"$store\" 2>/dev/null || true' EXIT",
    ]


def step_nodes() -> list[str]:
    """A ranged job's node count now, for each try: the allocation shrinks when --no-kill removes a
    failed node (excise_node_from_job), which the batch environment's SLURM_JOB_NUM_NODES does not
    follow."""
    return [
        '    step_nodes="$(scontrol show job "$SLURM_JOB_ID" | grep -o "NumNodes=[0-9]*"'
        ' | cut -d= -f2 || true)"',
        '    step_nodes="${step_nodes:-$SLURM_JOB_NUM_NODES}"',
    ]


# after the launcher: a launcher that failed where the store does not answer waits (bounded: three
# SlurmdTimeouts and a minute) for slurmctld to remove the batch host from the job, then ends it
ORPHAN_CHECK = """rc=0; "$@" || rc=$?
if [ "$rc" -ne 0 ] && ! timeout 5 bash -c ": <>/dev/tcp/$FSDPCTL_RDZV_HOST/PORT" 2>/dev/null; then
  t="$(scontrol show config | grep -o "SlurmdTimeout *= *[0-9]*" | grep -o "[0-9]*$" || true)"
  deadline=$((SECONDS + 3 * ${t:-300} + 60))
  while [ "$SECONDS" -lt "$deadline" ]; do
    job="$(scontrol show job "$SLURM_JOB_ID" 2>/dev/null || true)"
    host="$(printf %s "$job" | grep -o "BatchHost=[^ ]*" | cut -d= -f2 || true)"
    nodes="$(printf %s "$job" | grep -o " NodeList=[^ ]*" | cut -d= -f2 || true)"
    if [ -n "$host" ] && [ -n "$nodes" ] && ! scontrol show hostnames "$nodes" | grep -qx "$host"; then
      echo "fsdpctl: the batch host $host is lost and the job holds $nodes without its script: END" >&2
      END_CMD
      break
    fi
    sleep 2
  done
fi
exit "$rc"
"""


def orphan_guard(cfg: Config, max_restarts: int) -> list[str]:
    """The words before a ranged job's launcher in its srun task (none without a range): a bash
    that runs the launcher and, once it ended (its store on the lost batch host gone), ends a job
    left without its batch script: `scontrol requeue` with MAX_RESTARTS (the run resumes on the
    nodes that are up, `--nodes=MIN-MAX`), `scancel` without."""
    if not ranged(cfg):
        return []
    how, cmd = (
        ("requeueing it", 'scontrol requeue "$SLURM_JOB_ID" || true')
        if max_restarts > 0
        else ("cancelling it", 'scancel "$SLURM_JOB_ID" || true')
    )
    body = ORPHAN_CHECK.replace("END_CMD", cmd).replace(": END", f": {how}")
    body = body.replace("/PORT", f"/{C10D_PORT}")
    return ["bash", "-c", shlex.quote(body), "fsdpctl-task"]

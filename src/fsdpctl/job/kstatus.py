"""What a job on Kubernetes is doing, from the objects the API returns and its leader's log lines.
Pure: the commands fetch, this reads. Works for PyTorchJob (Training Operator v1) and TrainJob
(Trainer v2)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from fsdpctl.job.reports import FINAL, Phase

MASTER_ADDR = re.compile(r"master_addr=([^\s,]+)")


# NCCL's transport choice, printed with NCCL_DEBUG=INFO: the OFI plugin over EFA, or plain sockets
NCCL_EFA = re.compile(
    r"NET/OFI Selected [Pp]rovider is efa|Using network (AWS )?Libfabric|NET/OFI.*efa", re.I
)


NCCL_SOCKET = re.compile(r"Using network Socket|NET/Socket : Using|NCCL INFO NET/Socket")


Obj = dict[str, Any]  # a Kubernetes object as the API returns it


TROUBLE_WAITING = {
    "ErrImagePull",
    "ImagePullBackOff",
    "InvalidImageName",
    "CreateContainerConfigError",
    "CrashLoopBackOff",
}


def parse_time(text: str | None) -> float | None:
    if not text:
        return None
    return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC).timestamp()


def phase(job: Obj) -> Phase:
    """From the job's conditions, the latest true one wins: Succeeded, Failed, Running, Restarting,
    Created or Pending. TrainJob says Complete for Succeeded; a job being deleted is Stopping, and
    one `job stop` asked to stop (its annotation fsdpctl.io/stop) is Stopping until it ends, then
    Stopped: its trainers exit 0 after their stop checkpoint, which the operator reads as success.
    """
    meta = job.get("metadata", {})
    if meta.get("deletionTimestamp"):
        return Phase.STOPPING
    if STOP_ANNOTATION in (meta.get("annotations") or {}):
        return Phase.STOPPED if _conditions_phase(job) in FINAL else Phase.STOPPING
    return _conditions_phase(job)


STOP_ANNOTATION = "fsdpctl.io/stop"  # fsdptrain.disruption.STOP_ANNOTATION


# the condition types of the Training Operator (v1.9.4 pkg/apis/kubeflow.org/v1 JobConditionType)
# and of a TrainJob (Complete); any other is not a phase of the job
_CONDITIONS = {
    "Complete": Phase.SUCCEEDED,
    "Succeeded": Phase.SUCCEEDED,
    "Failed": Phase.FAILED,
    "Running": Phase.RUNNING,
    "Restarting": Phase.RESTARTING,
    "Created": Phase.CREATED,
    "Suspended": Phase.SUSPENDED,
}


def _conditions_phase(job: Obj) -> Phase:
    conds = [c for c in job.get("status", {}).get("conditions") or [] if c.get("status") == "True"]
    for final in ("Succeeded", "Complete", "Failed"):
        if any(c["type"] == final for c in conds):
            return _CONDITIONS[final]
    known = [c for c in conds if c["type"] in _CONDITIONS]
    if known:
        # times have whole seconds: within one second the later in the list is the newer (the
        # operator appends a changed condition last: v1.9.4 pkg/util/status.go, setCondition)
        _, latest = max(
            enumerate(known), key=lambda ic: (ic[1].get("lastTransitionTime") or "", ic[0])
        )
        return _CONDITIONS[latest["type"]]
    if any(j.get("active") for j in job.get("status", {}).get("jobsStatus") or []):
        return Phase.RUNNING  # TrainJob: no Running condition, its child jobs say it
    return Phase.PENDING


def failure_reason(job: Obj) -> str | None:
    for c in job.get("status", {}).get("conditions") or []:
        if c.get("type") == "Failed" and c.get("status") == "True":
            reason = c.get("message") or c.get("reason")
            return str(reason) if reason else None
    return None


def pods_by_state(pods: list[Obj]) -> dict[str, int]:
    out: dict[str, int] = {}
    for pod in pods:
        state = pod.get("status", {}).get("phase", "Pending")
        out[state] = out.get(state, 0) + 1
    return out


# What torch 2.13's elastic agent logs each time it restarts its worker group, after a failure or
# for a node that joins (torch/distributed/elastic/agent/server/api.py, _invoke_run): one line per
# agent per restart.
GROUP_RESTART = "will restart worker group"
# the same line for a node that joins ("[default] Detected 1 new nodes from group_rank=0; will
# restart worker group"): logged only by the agents already in the group, so only their logs hold it
GROUP_GROWTH = "new nodes from group_rank="


def growths_logged(agent_lines: Sequence[str]) -> int:
    """The restarts for a joining node that one agent's log holds (GROUP_GROWTH)."""
    return sum(GROUP_GROWTH in line and GROUP_RESTART in line for line in agent_lines)


def restarts(pods: list[Obj], agent_lines: Sequence[str] = (), nodes: int = 0) -> int:
    """Restarts of the job, not of its pods. A coordinated restart restarts every pod's container
    once (OnFailure, as a TrainJob's pods), so the most restarted container counts them, not the
    sum; torchrun's restarts of the whole group happen inside the containers, and the leader's agent
    logs each one. A PyTorchJob's pods (restartPolicy ExitCode) are recreated, never restarted in
    place, and a pod whose launcher starts torchrun again to rejoin leaves neither: the launcher's
    ledger line (`ledger_restarts`) counts those. The larger count wins: a killed node that did not
    host the store shows in both (its new pod's start, the survivors' group restart)."""
    most = max(
        (
            cs.get("restartCount", 0)
            for pod in pods
            for cs in pod.get("status", {}).get("containerStatuses") or []
        ),
        default=0,
    )
    in_place = int(most) + sum(GROUP_RESTART in line for line in agent_lines)
    return max(in_place, ledger_restarts(agent_lines, nodes))


# fsdptrain.disruption.RESTART_LINE: a launcher's torchrun start past the run's first JOB_NODES,
# counted in the run's ledger on the shared volume (every pod's starts, whichever pod prints it)
LEDGER_START = re.compile(r"fsdptrain: torchrun start (\d+) of this run")


def ledger_restarts(lines: Sequence[str], nodes: int) -> int:
    """Restarts of the job from the highest ledger count in these lines: every restart of the job
    starts torchrun once more on each of its `nodes` (a recreated pod, the others rejoining), so
    starts past the first `nodes`, in whole or begun rounds of `nodes`."""
    most = max((int(m.group(1)) for line in lines if (m := LEDGER_START.search(line))), default=0)
    return -(-(most - nodes) // nodes) if nodes and most > nodes else 0


def on_failure(kind: str, max_restarts: int) -> str:
    """What the job does after a failure, in words for `job status`, from the sources it relies
    on."""
    group = (
        f"a failed worker restarts the whole worker group on every node (torchrun, c10d rendezvous), up to "
        f"MAX_RESTARTS={max_restarts} times"
    )
    if kind == "TrainJob":
        return (
            f"{kind}: {group}; after that, or for a bad setting (exit 2), each pod's container restarts "
            "in place (restartPolicy OnFailure, JobSet's default) until their restarts add up to the child "
            "Job's backoffLimit of 6 (batch/v1's default: a TrainJob cannot set it), then the TrainJob fails "
            "(torch-distributed has no JobSet failurePolicy)"
        )
    return (
        f"{kind}: {group}, then the job fails; a bad setting fails it at once (exit 2 before torchrun; "
        "restartPolicy ExitCode); a pod killed by a signal is recreated and rejoins"
    )


def flight_recorder_note(where: str, dumps: Sequence[str] | None) -> str:
    """For a job that hangs: the NCCL flight recorder's dumps (TORCH_NCCL_DUMP_ON_TIMEOUT=1 writes
    one per rank, `<where><rank>`, when a collective times out); `dumps` None where they cannot be
    looked for."""
    if dumps:
        return "NCCL flight recorder dumps (the last collectives of each rank): " + ", ".join(dumps)
    seen = "" if dumps is None else "none yet; "
    return (
        f"NCCL flight recorder: {seen}a collective that times out leaves one dump per rank at "
        f"{where}<rank>"
    )


def rank0_index(pod: Obj) -> int:
    """The replica index the operators label pods with (v1: replica-index; v2, via JobSet:
    completion index)."""
    labels = pod.get("metadata", {}).get("labels", {})
    for key in (
        "training.kubeflow.org/replica-index",
        "batch.kubernetes.io/job-completion-index",
        "jobset.sigs.k8s.io/job-index",
    ):
        if key in labels:
            return int(labels[key])
    return 10**6


def leader(pods: list[Obj], agent_lines: Sequence[str] = ()) -> Obj | None:
    """The pod that hosts rank 0: the one the elastic agent names as master_addr, else replica index
    0."""
    if not pods:
        return None
    for line in agent_lines:
        if m := MASTER_ADDR.search(line):
            addr = m.group(1).split(".")[0]
            for pod in pods:
                names = {
                    pod["metadata"]["name"],
                    pod.get("status", {}).get("podIP"),
                    pod.get("spec", {}).get("hostname"),
                }
                if addr in names:
                    return pod
    return min(pods, key=lambda p: (rank0_index(p), p["metadata"]["name"]))


# The device plugin that advertises each extended resource a job pod requests (`fsdpctl deploy
# plugins`).
PLUGIN_OF = {
    "nvidia.com/gpu": "the NVIDIA device plugin (kube-system/nvidia-device-plugin-daemonset)",
    "vpc.amazonaws.com/efa": "the EFA device plugin (kube-system/aws-efa-k8s-device-plugin)",
}


def _missing_plugin(message: str) -> str:
    """The scheduler says `Insufficient <resource>` both when the GPUs are busy and when no node
    advertises them at all, which is what a device plugin that is not running on the GPU nodes looks
    like."""
    named = [p for r, p in PLUGIN_OF.items() if f"Insufficient {r}" in message]
    if not named:
        return ""
    return (
        f" (if no GPU node offers it, {' and '.join(named)} is not running there: `fsdpctl deploy plugins`, "
        "`fsdpctl deploy status`)"
    )


def scheduling_problems(pods: list[Obj], events: dict[str, list[Obj]]) -> list[str]:
    """Why pods are not running, in the scheduler's and kubelet's own words (Insufficient
    nvidia.com/gpu, vpc.amazonaws.com/efa, image pull errors)."""
    out = []
    for pod in pods:
        name, status = pod["metadata"]["name"], pod.get("status", {})
        for cs in status.get("containerStatuses") or []:
            waiting = cs.get("state", {}).get("waiting") or {}
            if waiting.get("reason") in TROUBLE_WAITING:
                out.append(
                    f"{name}: {waiting['reason']}: {waiting.get('message', '')}".rstrip(": ")
                )
        if status.get("phase") != "Pending":
            continue
        for cond in status.get("conditions") or []:
            if (
                cond.get("type") == "PodScheduled"
                and cond.get("status") == "False"
                and cond.get("message")
            ):
                reason = cond.get("reason", "Unschedulable")
                out.append(f"{name}: {reason}: {cond['message']}{_missing_plugin(cond['message'])}")
                break
        else:
            for ev in events.get(name, []):
                if ev.get("reason") in ("FailedScheduling", "Failed", "FailedMount") and ev.get(
                    "message"
                ):
                    out.append(
                        f"{name}: {ev['reason']}: {ev['message']}{_missing_plugin(ev['message'])}"
                    )
                    break
    return out


def network_path(lines: Sequence[str], efa_expected: bool) -> tuple[str, str | None]:
    """('efa' | 'socket' | 'unknown', warning). NCCL on sockets where EFA was asked for
    (`Config.uses_efa`) is the silent slowdown."""
    efa = any(NCCL_EFA.search(line) for line in lines)
    sock = any(NCCL_SOCKET.search(line) for line in lines)
    if efa:
        return "efa", None
    if sock:
        warning = (
            "NCCL fell back to TCP sockets (NET/Socket) although this instance type has EFA: collectives "
            "will be many times slower. Check that pods request vpc.amazonaws.com/efa, that the EFA device "
            "plugin runs on the node, and that the image has aws-ofi-nccl (FI_PROVIDER=efa)"
            if efa_expected
            else None
        )
        return "socket", warning
    return "unknown", None


def age(obj: Obj, now: float) -> float:
    created = parse_time(obj.get("metadata", {}).get("creationTimestamp"))
    return now - created if created else 0.0


# --- restarts of the whole job, from every node's agent -------------------------------------------

# torch 2.13's agent logs each rendezvous round it takes part in
# (torch/distributed/elastic/agent/server/ api.py, `_rendezvous`): "Rendezvous complete for workers.
# Result:" and then restart_count, master_addr, master_port, ... one per line. Every node of a round
# logs the same master_addr and master_port (the round's rank-0 store, a fresh port per round), so
# the pair names a round of the whole job.
ROUND_DONE = "Rendezvous complete for workers"


MASTER_PORT = re.compile(r"master_port=(\d+)")


def rounds(lines: Sequence[str]) -> list[tuple[str, str]]:
    """The rendezvous rounds one node's agent took part in, in order, each as (master_addr,
    master_port)."""
    out: list[tuple[str, str]] = []
    addr, inside = "", False
    for line in lines:
        if ROUND_DONE in line:
            addr, inside = "", True
        elif inside and (m := MASTER_ADDR.search(line)):
            addr = m.group(1)
        elif inside and (m := MASTER_PORT.search(line)):
            out.append((addr, m.group(1)))
            inside = False
    return out


def job_restarts(node_logs: Sequence[Sequence[str]]) -> int:
    """Restarts of the job: its worker group's rendezvous rounds after the first, from every node's
    agent log. A restart of a 2-node job is one new round both nodes join, counted once, not once
    per node; a recreated node's new agent joins the round the others re-open, counted once too.
    Where rounds share a store address (an agent store reused across rounds), the node that took
    part in most rounds counts."""
    per_node = [rounds(lines) for lines in node_logs]
    distinct = {r for rs in per_node for r in rs}
    return max([len(distinct), *(len(rs) for rs in per_node), 1]) - 1

"""What a job on Kubernetes is doing, from the objects the API returns and its leader's log lines.
Pure: the commands fetch, this reads. Works for PyTorchJob (Training Operator v1) and TrainJob
(Trainer v2)."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from fsdpctl.reports import FINAL, Phase, RankFailure

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
        latest = max(known, key=lambda c: c.get("lastTransitionTime") or "")
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


def restarts(pods: list[Obj], agent_lines: Sequence[str] = ()) -> int:
    """Restarts of the job, not of its pods. A coordinated restart restarts every pod's container
    once (OnFailure, as a TrainJob's pods), so the most restarted container counts them, not the
    sum; torchrun's restarts of the whole group happen inside the containers, and the leader's agent
    logs each one. A PyTorchJob's pods (restartPolicy ExitCode) are recreated, never restarted in
    place."""
    most = max(
        (
            cs.get("restartCount", 0)
            for pod in pods
            for cs in pod.get("status", {}).get("containerStatuses") or []
        ),
        default=0,
    )
    return int(most) + sum(GROUP_RESTART in line for line in agent_lines)


def on_failure(kind: str, max_restarts: int) -> str:
    """What the job does after a failure, in words for `job status`, from the sources it relies on."""
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


# --- what the job's GPU nodes offer -------------------------------------------------------------------------


def _quantity(value: Any) -> int:
    """An extended resource's count: the API serves it as an integer quantity ("8"); anything else
    is 0."""
    text = str(value or "0")
    return int(text) if text.isdigit() else 0


def device_requests(pods: list[Obj]) -> dict[str, int]:
    """What one job pod asks of the resources only a device plugin advertises (nvidia.com/gpu,
    vpc.amazonaws.com/efa): the most any container of any pod asks. Extended resources are limits,
    and a request, where given, must equal its limit, so either says it."""
    wants: dict[str, int] = {}
    for pod in pods:
        for c in pod.get("spec", {}).get("containers") or []:
            res = c.get("resources") or {}
            for part in (res.get("limits") or {}, res.get("requests") or {}):
                for name in PLUGIN_OF:
                    if name in part:
                        wants[name] = max(wants.get(name, 0), _quantity(part[name]))
    return wants


def _selects(selector: dict[str, str], node: Obj) -> bool:
    labels = node.get("metadata", {}).get("labels") or {}
    return all(labels.get(k) == v for k, v in selector.items())


def job_nodes(nodes: list[Obj], pods: list[Obj], selector: dict[str, str]) -> list[Obj]:
    """The nodes the job's pods run on (spec.nodeName) or wait for: for a pod not bound yet, every
    node its nodeSelector matches (all pairs, as the scheduler's NodeAffinity filter); `selector`,
    the job's own, while no pod exists yet."""
    bound = {p.get("spec", {}).get("nodeName") for p in pods} - {None, ""}
    waiting = [
        p.get("spec", {}).get("nodeSelector") or {}
        for p in pods
        if not p.get("spec", {}).get("nodeName")
    ]
    if not pods:
        waiting = [selector]
    return [
        n
        for n in nodes
        if n["metadata"]["name"] in bound or any(sel and _selects(sel, n) for sel in waiting)
    ]


def gpu_node_fit(
    rows: list[Obj], nodes: list[Obj], wants: dict[str, int], pods: list[Obj]
) -> list[Obj]:
    """Per GPU node of the job (`rows` from deploy.node_rows, which picks the GPU nodes and says
    what the plugins made allocatable), whether it offers as many of each device as one of the job's
    pods asks for (at least one where the pods ask for none), the resources it falls short of, and
    the job's pods on it."""
    by_name = {n["metadata"]["name"]: n for n in nodes}
    out = []
    for row in rows:
        name = row["object"].partition("/")[2]
        allocatable = (by_name[name].get("status") or {}).get("allocatable") or {}
        have = {r: _quantity(allocatable.get(r)) for r in wants}
        short = [r for r, n in wants.items() if have[r] < max(n, 1)]
        on_it = [p["metadata"]["name"] for p in pods if p.get("spec", {}).get("nodeName") == name]
        out.append(
            {
                "node": name,
                "allocatable": have,
                "wants": dict(wants),
                "ready": bool(row["ready"]) and not short,
                "short": short,
                "pods": sorted(on_it),
            }
        )
    return out


def node_problems(fit: list[Obj], selector: dict[str, str]) -> list[str]:
    """A line per device a GPU node of the job lacks, naming the plugin that advertises it; or one
    line saying that no GPU node matches the job's selector."""
    if not fit:
        wanted = ",".join(f"{k}={v}" for k, v in selector.items())
        return [
            f"no GPU node matches the job's nodeSelector {wanted}: the node group has no node yet (scaled "
            "to zero, or still joining), or NODE_SELECTOR/INSTANCE_TYPE name another (`fsdpctl cluster "
            "status`)"
        ]
    return [
        f"node {node['node']}: {r}={node['allocatable'][r]} allocatable, a job pod asks for "
        f"{node['wants'][r]}: {PLUGIN_OF[r]} has not advertised it there (`fsdpctl deploy plugins`, "
        "`fsdpctl deploy status`)"
        for node in fit
        for r in node["short"]
    ]


def describe_node(node: Obj) -> str:
    """One line of `job status`: what the node offers against what a pod asks, and the job's pods on
    it."""
    have = " ".join(f"{r} {n}/{node['wants'][r]}" for r, n in node["allocatable"].items())
    verdict = "ok" if node["ready"] else "lacks " + ", ".join(node["short"])
    pods = f"; pods {', '.join(node['pods'])}" if node["pods"] else ""
    return f"{node['node']}: {have} allocatable/asked ({verdict}){pods}"


# --- restarts of the whole job, from every node's agent -----------------------------------------------------

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


# --- why a worker failed, in torchrun's and the rank's own words --------------------------------------------

# What torchrun prints when its agent gives up
# (torch/distributed/elastic/multiprocessing/errors/__init__.py, _MSG_FORMAT_TEMPLATE and
# _FAILURE_FORMAT_TEMPLATE, raised as ChildFailedError by torch/distributed/launcher/ api.py,
# launch_agent): the rank that failed first, its exit code and its error file, the
# TORCHELASTIC_ERROR_FILE the agent gave that worker (<log_dir>/<run>/attempt_<n>/<local
# rank>/error.json, multiprocessing/api.py), which a worker whose main is wrapped in `record` fills
# with its exception; "<N/A>" where none was written.
ROOT_CAUSE = "Root Cause (first observed failure):"
ROOT_FIELD = re.compile(r"^  (time|host|rank|exitcode|error_file|traceback)\s*: ?(.*)$")
NO_ERROR_FILE = "<N/A>"
NO_TRACEBACK = (
    "To enable traceback see"  # torchrun's placeholder when the worker wrote no error file
)
CHILD_FAILED = "torch.distributed.elastic.multiprocessing.errors.ChildFailedError"
# After init_process_group torch prefixes each line of a rank's uncaught traceback with "[rank<N>]:
# " (torch/distributed/distributed_c10d.py, _distributed_excepthook); before it, lines come
# unprefixed.
RANK_LINE = re.compile(r"^\[rank(\d+)\]: ?(.*)$")
OWN_ERROR = "fsdptrain: error: "  # the trainer's and its pre-launch check's one-line errors


def root_cause(lines: Sequence[str]) -> dict[str, Any] | None:
    """The last root cause torchrun printed in this log: rank, local_rank, exitcode, error_file
    (None for <N/A>) and message (the traceback it read from the error file, or why there is none).
    """
    starts = [i for i, line in enumerate(lines) if line.strip() == ROOT_CAUSE]
    if not starts:
        return None
    fields: dict[str, str] = {}
    key = ""
    for line in lines[starts[-1] + 1 :]:
        if line.startswith("===="):
            break
        if m := ROOT_FIELD.match(line):
            key, fields[key] = m.group(1), m.group(2).rstrip()
        elif key == "traceback" and line.startswith("  "):
            fields[key] += "\n" + line[2:]
    rank = re.match(r"(\d+) \(local_rank: (\d+)\)", fields.get("rank", ""))
    code = re.match(r"(-?\d+)", fields.get("exitcode", ""))
    error_file = fields.get("error_file", NO_ERROR_FILE)
    return {
        "rank": int(rank.group(1)) if rank else None,
        "local_rank": int(rank.group(2)) if rank else None,
        "exitcode": int(code.group(1)) if code else None,
        "error_file": None if error_file == NO_ERROR_FILE else error_file,
        "message": fields.get("traceback", ""),
    }


def error_file_message(text: str) -> str | None:
    """The exception an error file records ({"message": {"message": "<Type>: <text>", "extraInfo":
    ...}}, torch's ErrorHandler.record_exception), or None for anything else."""
    import json

    try:
        data = json.loads(text)
    except ValueError:
        return None
    message = data.get("message") if isinstance(data, dict) else None
    if isinstance(message, dict):
        message = message.get("message")
    return str(message).strip().splitlines()[0] if message else None


def first_error(lines: Sequence[str], rank: int | None = None) -> tuple[int, str] | None:
    """(index, text) of the first line that says what went wrong: the trainer's own one-line error,
    or the exception line under a Python traceback (the first one of a chain is the cause the others
    grew from). Lines another rank prefixed are skipped when `rank` is known; torchrun's own
    ChildFailedError, which only reports the ranks', is never the answer."""
    in_traceback = False
    for i, raw in enumerate(lines):
        prefixed = RANK_LINE.match(raw)
        if prefixed and rank is not None and int(prefixed.group(1)) != rank:
            continue
        text = prefixed.group(2) if prefixed else raw
        if text.startswith(OWN_ERROR):
            return i, text
        if text.startswith("Traceback (most recent call last):"):
            in_traceback = True
        elif in_traceback and text.strip() and not text[0].isspace():
            in_traceback = False
            if not text.startswith(CHILD_FAILED):
                return i, text
    return None


def failure(lines: Sequence[str], read: Callable[[str], str | None]) -> RankFailure:
    """Why a node's launcher failed, from its log: torchrun's root cause (the failing rank, and
    through `read` its error file), that rank's first error line wherever it is in the log (its
    index), and the message that ended the rank when it says more than that line."""
    cause = root_cause(lines) or {}
    rank = cause.get("rank")
    found = first_error(lines, rank) or (first_error(lines) if rank is not None else None)
    raised = None
    if cause.get("error_file"):
        text = read(cause["error_file"])
        raised = error_file_message(text) if text else None
    message = cause.get("message") or ""
    if raised is None and message and not message.startswith(NO_TRACEBACK):
        raised = message.strip().splitlines()[
            -1
        ]  # a signal ("Signal 9 (SIGKILL) received by PID ...")
    return {
        "rank": rank,
        "exitcode": cause.get("exitcode"),
        "error_file": cause.get("error_file"),
        "error": found[1] if found else raised,
        "line": found[0] + 1 if found else None,
        "raised": raised,
    }


# --- how a launcher ended, from what it printed (its supervisor died and took its exit code along) ----------

# torchrun's agent, torch/distributed/elastic/agent/server/api.py (_invoke_run): on SUCCEEDED it
# logs this and waits at the exit barrier, then run.py's main returns (exit 0); when it gives up it
# raises ChildFailedError, whose root cause block (ROOT_CAUSE) the launcher prints before exiting 1;
# on SIGTERM its handler (multiprocessing/api.py, _terminate_process_handler) raises
# SignalException, which ends the launcher.
AGENT_SUCCEEDED = "worker group successfully finished"
AGENT_SIGNALLED = re.compile(r"SignalException: Process \d+ got signal: (\d+)")
NOT_RETRIED = "(checked before torchrun: not retried)"  # fsdptrain.launch's one line, exit 2


def launcher_outcome(lines: Sequence[str]) -> str | None:
    """'succeeded', 'failed' or 'signalled' from one node's launcher output; None when it ended
    without saying (a SIGKILL, an OOM kill, a node gone) or has not ended."""
    for line in reversed(lines):
        if AGENT_SUCCEEDED in line:
            return "succeeded"
        if line.strip() == ROOT_CAUSE or (line.startswith(OWN_ERROR) and NOT_RETRIED in line):
            return "failed"
        if AGENT_SIGNALLED.search(line):
            return "signalled"
    return None


@dataclass(frozen=True)
class Ended:
    """How a job ended: its phase, why in words, and the node whose failure decided it (None: no
    node did)."""

    phase: Phase
    reason: str | None
    failed_node: int | None = None


def ended(outcomes: Sequence[str | None], stopped: bool | None, stop_requested: bool) -> Ended:
    """How a job whose processes all ended with nobody left to judge their exit codes, from what
    they printed: each launcher's `launcher_outcome` (by node), and the trainer's summary
    (`stopped`: True after SIGTERM, False when it trained to the end, None without one). A failure
    wins; then a stop; then the end of training; anything else ended without saying how."""
    failed = [n for n, o in enumerate(outcomes) if o == "failed"]
    if failed:
        why = f"node {failed[0]} exited with code 1 (torchrun gave up; read from its log)"
        return Ended(Phase.FAILED, why, failed[0])
    if stopped or (stop_requested and stopped is None and "signalled" in outcomes):
        return Ended(Phase.STOPPED, "stopped (read from the trainer's log)")
    if stopped is False or (outcomes and all(o == "succeeded" for o in outcomes)):
        return Ended(Phase.SUCCEEDED, "trained to the end (read from the trainer's log)")
    silent = [n for n, o in enumerate(outcomes) if o is None]
    who = f"node {silent[0]}" if silent else "the job"
    why = f"{who} ended without saying how (killed by a signal?), with no supervisor to see it"
    return Ended(Phase.FAILED, why)


def budget_spent(phase: str | None, restarts: int, max_restarts: int, gave_up: bool) -> str | None:
    """What a failed job's reason says first when torchrun's agent gave up (`gave_up`: its root
    cause block is in the log) after using every restart: the restarts ran out, not just the last
    failure. The agent restarts the group while `_remaining_restarts > 0` and then stops
    (torch/distributed/elastic/agent/ server/api.py, _invoke_run), so that is MAX_RESTARTS restarts,
    MAX_RESTARTS + 1 failed attempts."""
    if phase != "Failed" or not gave_up or max_restarts <= 0 or restarts < max_restarts:
        return None
    return (
        f"MAX_RESTARTS={max_restarts} spent: {max_restarts + 1} attempts failed, {max_restarts} restarts "
        "used; the last failure is below"
    )


# torch's Python log records as its default handler formats them, glog style
# (torch/_logging/_internal.py, TorchLogsFormatter.format: `[rank<N>]:` when a group exists, level
# letter, MMDD HH:MM:SS.micro, pid, path:line]) and c10's C++ ones (c10/util/Logging.cpp: `[W1204
# 18:47:57.241436884 socket.cpp:207] ...`): torchrun's agent, the rendezvous and c10d talking, not
# the trainer
TORCH_LOG = re.compile(r"^(\[rank\d+\]:)?[A-Z]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ \S+:\d+\]")
C10_LOG = re.compile(r"^\[[A-Z]\d{4} \d\d:\d\d:\d\d\.\d+ \S+:\d+\]")


def from_torch(text: str) -> bool:
    """Whether a log line is torch's or torchrun's own logging (`job logs --trainer-only` leaves it
    out): the trainer's lines, its errors and every traceback stay."""
    return bool(TORCH_LOG.match(text) or C10_LOG.match(text))

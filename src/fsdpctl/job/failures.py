"""Why a job failed, from its logs (pure): torchrun's root cause, the failing rank's own first error
and error file, how a launcher ended when nobody saw its exit code, and which lines are torch's
own."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypedDict

from fsdpctl.job.reports import Phase, RankFailure

# --- why a worker failed, in torchrun's and the rank's own words ----------------------------------

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


class RootCause(TypedDict):
    """torchrun's root cause of a failed launcher (`root_cause`)."""

    rank: int | None
    local_rank: int | None
    exitcode: int | None
    error_file: str | None  # None for <N/A>
    message: str  # the traceback it read from the error file, or why there is none


def root_cause(lines: Sequence[str]) -> RootCause | None:
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
    from fsdpctl import files

    try:  # depth-limited: a file a failing process left is no proof of its shape
        data = files.loads(text.encode("utf-8", "surrogateescape"))
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
    cause = root_cause(lines)
    rank = cause["rank"] if cause else None
    error_file = cause["error_file"] if cause else None
    found = first_error(lines, rank) or (first_error(lines) if rank is not None else None)
    raised = None
    if error_file:
        text = read(error_file)
        raised = error_file_message(text) if text else None
    message = (cause["message"] if cause else "") or ""
    if raised is None and message and not message.startswith(NO_TRACEBACK):
        raised = message.strip().splitlines()[
            -1
        ]  # a signal ("Signal 9 (SIGKILL) received by PID ...")
    return {
        "rank": rank,
        "exitcode": cause["exitcode"] if cause else None,
        "error_file": error_file,
        "error": found[1] if found else raised,
        "line": found[0] + 1 if found else None,
        "raised": raised,
    }


# --- a full disk, in the words of each layer that meets it ----------------------------------------

# What a write onto a full (or over-quota) file system says: the kernel's strerror for ENOSPC and
# EDQUOT (errno(3)) as Python prints an OSError, torch's zip writer after a short write
# (caffe2/serialize/inline_container.cc: "unexpected pos N vs M"), and the trainer's own line for
# either (fsdptrain.checkpoint._reason: "the disk is full").
DISK_FULL = re.compile(
    r"No space left on device|\[Errno 28\]|\bENOSPC\b|Disk quota exceeded|\[Errno 122\]|\bEDQUOT\b"
    r"|unexpected pos \d+ vs \d+|the disk is full"
)


def says_disk_full(texts: Sequence[str | None]) -> bool:
    """Whether any of these lines says a write met a full disk (DISK_FULL)."""
    return any(t and DISK_FULL.search(t) for t in texts)


# --- how a launcher ended, from what it printed (its supervisor died and took its exit code along)

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

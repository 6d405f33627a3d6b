"""A scripted Slurm for the generated ownership and submit cells (tests/test_ownership_slurm.py):
sbatch, squeue, scontrol and scancel as one small program over a JSON file of jobs, answering in
the shapes Debian's slurm-client 22.05 answers (the real peer, tests/slurm_peer.py, checks those
shapes in the slow lane):

- `sbatch --parsable SCRIPT` queues the script's --job-name and --comment as this user and prints
  `<id>` (sbatch(1) --parsable); its MODE file makes it lie after queuing: another user's id,
  garbage, bytes that are not UTF-8, an error, a hang (a timeout, or a signal's moment).
- `squeue --me -h -o '%i %k'`: this user's pending and running jobs, a job without a comment as
  `(null)` (squeue(1): --me, %k "Comment associated with the job").
- `scontrol -o show job ID`: one line `JobId=.. JobName=.. UserId=name(uid) .. JobState=..
  Restarts=0 Comment=..` (Comment= only when set, as slurm_sprint_job_info in src/api/job_info.c
  prints it), or "slurm_load_jobs error: Invalid job id specified", exit 1.
- `scancel [--signal=SIG] ID`: another user's job is refused ("Access/permission denied", exit 1,
  as slurmctld refuses a non-operator); a signal ends this fake's job as the trainers' stop
  checkpoint does (COMPLETED), a cancel CANCELLED. Every call is logged to CALLS, one JSON line.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import sys
import time
from pathlib import Path

ME = os.getuid()
LIVE = ("PENDING", "RUNNING")


def _db() -> Path:
    return Path(os.environ["FAKE_SLURM"])


def load() -> dict:
    return json.loads((_db() / "jobs.json").read_text())


def save(data: dict) -> None:
    tmp = _db() / "jobs.json.tmp"
    tmp.write_text(json.dumps(data))
    os.replace(tmp, _db() / "jobs.json")


def _record(job_id: str, j: dict) -> str:
    user = f"{j.get('user', 'me')}({j['uid']})"
    parts = [f"JobId={job_id}", f"JobName={j['name']}", f"UserId={user}", "GroupId=g(0)"]
    parts += [f"JobState={j['state']}", "Reason=None", "Restarts=0", "NodeList=(null)"]
    if j.get("comment"):
        parts.append(f"Comment={j['comment']}")
    return " ".join(parts)


def sbatch(argv: list[str]) -> int:
    text = Path(argv[-1]).read_text()
    opt = dict(re.findall(r"^#SBATCH --([a-z-]+)=(\S+)$", text, re.M))
    mode = (_db() / "mode").read_text().strip() if (_db() / "mode").exists() else "ok"
    if mode == "fail-before":
        print("sbatch: error: Batch job submission failed: Invalid partition", file=sys.stderr)
        return 1
    data = load()
    job_id = str(data["next"])
    data["next"] += 1
    data["jobs"][job_id] = {
        "name": opt["job-name"],
        "uid": ME,
        "comment": opt.get("comment", ""),
        "state": "PENDING",
    }
    save(data)
    (_db() / "queued").write_text(job_id)
    if mode == "ok":
        print(job_id)
    elif mode == "other-id":
        print(data["other"])
    elif mode == "garbage":
        print("Submitted batch job")
    elif mode == "non-utf8":
        sys.stdout.buffer.write(b"\xff\xfe" + job_id.encode() + b"\n")
    elif mode == "fail-after":
        print("sbatch: error: Batch job submission failed: Socket timed out", file=sys.stderr)
        return 1
    elif mode == "hang":  # a timeout, or the moment a signal reaches `job run`
        (_db() / "sbatch.pid").write_text(str(os.getpid()))  # for the test that must end it
        time.sleep(60)
    return 0


def squeue(argv: list[str]) -> int:
    assert argv[:4] == ["--me", "-h", "-o", "%i %k"], argv
    for job_id, j in load()["jobs"].items():
        if j["uid"] == ME and j["state"] in LIVE:
            print(f"{job_id} {j.get('comment') or '(null)'}")
    return 0


def scontrol(argv: list[str]) -> int:
    assert argv[:3] == ["-o", "show", "job"], argv
    j = load()["jobs"].get(argv[3])
    if j is None or j.get("forgotten"):
        print("slurm_load_jobs error: Invalid job id specified", file=sys.stderr)
        return 1
    print(_record(argv[3], j))
    return 0


def scancel(argv: list[str]) -> int:
    job_id = argv[-1]
    data = load()
    j = data["jobs"].get(job_id)
    if j is None:
        print(f"scancel: error: Kill job error on job id {job_id}: Invalid job id", file=sys.stderr)
        return 1
    if j["uid"] != ME:
        print(f"scancel: error: Kill job error on job id {job_id}: Access/permission denied")
        return 1
    j["state"] = "COMPLETED" if argv[0].startswith("--signal") else "CANCELLED"
    save(data)
    return 0


TOOLS = {"sbatch": sbatch, "squeue": squeue, "scontrol": scontrol, "scancel": scancel}


def install(where: Path, jobs: dict | None = None) -> dict[str, str]:
    """The four programs in `where`/bin over `where`'s jobs; the environment that puts them first
    on PATH. `jobs`: jobs the cluster already holds (id -> name, uid, user, comment, state)."""
    (where / "bin").mkdir(parents=True, exist_ok=True)
    for tool in TOOLS:
        exe = where / "bin" / tool
        exe.write_text(f'#!/bin/sh\nexec {sys.executable} -I -S {__file__} {tool} "$@"\n')
        exe.chmod(0o755)
    save_to(where, {"next": 100, "other": "", "jobs": jobs or {}})
    return {"FAKE_SLURM": str(where), "PATH": f"{where / 'bin'}:{os.environ['PATH']}"}


def save_to(where: Path, data: dict) -> None:
    (where / "jobs.json").write_text(json.dumps(data))


def calls(where: Path) -> list[list[str]]:
    path = where / "calls.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def main() -> int:
    tool = sys.argv[1]
    with open(_db() / "lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        with open(_db() / "calls.jsonl", "a") as log:
            log.write(json.dumps([tool, *sys.argv[2:]]) + "\n")
    # the lock is not held while sbatch hangs: the test's own look at the jobs must not wait on it
    return TOOLS[tool](sys.argv[2:])


if __name__ == "__main__":
    sys.exit(main())

"""Does torchft's per-step recovery work with our torch on CPU (gloo)? The check behind docs/reliability.md
"Per-step recovery (torchft)" (issue 43's stretch).

    python -m venv /tmp/tft-venv && /tmp/tft-venv/bin/pip install torch==2.13.0 torchft==0.2.0
    /tmp/tft-venv/bin/python benchmarks/torchft_check.py                        # ~2 min, loopback only
    TORCHFT_CHECK_WRAP=ddp /tmp/tft-venv/bin/python benchmarks/torchft_check.py     # exits 1: ddp.py's assert

Starts torchft's Rust lighthouse on 127.0.0.1 and two replica groups of one process each (torchft's Manager
and ProcessGroupGloo; TORCHFT_CHECK_WRAP=manual, the default, allreduces each gradient with Manager.allreduce;
ddp uses its DistributedDataParallel wrapper as torchft's train_ddp.py does). Two scenarios, each
with its own lighthouse: group 1 SIGKILLed between steps, and group 1 SIGKILLing itself inside a backward
(after the quorum formed with it). Each checks group 0 commits steps alone without a restart, then restarts
group 1 and checks it heals from group 0: back in the quorum, same weights at every common step after.
Prints one JSON line with the timings; exit 0 when every check held, 1 when one failed, 0 with "skipped"
when torchft is not installed (CI does not install it). Every wait is bounded and every process it starts
is killed on the way out.
"""

import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

# two cores shared: pace the steps instead of spinning; 0 makes a kill more likely to land mid-allreduce
STEP_SLEEP_S = float(os.environ.get("TORCHFT_CHECK_STEP_SLEEP", "0.05"))
# "ddp": torchft's DistributedDataParallel (its comm hook); "manual": Manager.allreduce per gradient after the
# backward, the path an FSDP2 all-reduce hook (FSDPModule.set_all_reduce_hook) would take
WRAP = os.environ.get("TORCHFT_CHECK_WRAP", "manual")
WORKER_LIFETIME_S = 120  # a worker the orchestrator lost still exits on its own


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ---------------------------------------------------------------------------------------------------- worker
def worker(group: int, lighthouse: str, die_at: int) -> None:
    """One replica group of one process: torchft's README loop on a tiny model, one line per step. With
    die_at > 0 it SIGKILLs itself inside the backward of its die_at-th step (its own count: it may join at
    any global step): after the quorum formed with the peer,
    while the gradient allreduce is under way (the failure that costs the survivor a step)."""
    import signal

    import torch
    from torch.distributed import TCPStore
    from torchft import DistributedDataParallel, Manager, Optimizer, ProcessGroupGloo

    torch.manual_seed(0)  # same init in every group: a healed group must end up equal anyway
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    inner = torch.optim.SGD(model.parameters(), lr=0.01)
    # torchrun's agent hosts this store in torchft's examples; one process per group here, so we host it
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    manager = Manager(
        pg=ProcessGroupGloo(timeout=timedelta(seconds=5)),
        min_replica_size=1,
        load_state_dict=lambda sd: (
            model.load_state_dict(sd["model"]),
            inner.load_state_dict(sd["optim"]),
        ),
        state_dict=lambda: {"model": model.state_dict(), "optim": inner.state_dict()},
        replica_id=f"check_{group}",
        store_addr="127.0.0.1",
        store_port=store.port,
        rank=0,
        world_size=1,
        lighthouse_addr=lighthouse,
        hostname="127.0.0.1",
        timeout=timedelta(seconds=10),
    )
    # torchft's DDP wrapper (a comm hook through the manager) only in ddp mode: manual calls the model itself
    forward = DistributedDataParallel(manager, model) if WRAP == "ddp" else model
    backwards: list[int] = []
    if die_at > 0:

        def die(grad: torch.Tensor) -> torch.Tensor:
            backwards.append(1)
            if len(backwards) >= die_at:
                os.kill(os.getpid(), signal.SIGKILL)
            return grad

        first: Any = model[0]  # Sequential's __getitem__ is typed as returning a Module
        first.weight.register_hook(
            die
        )  # the first layer's grad comes last: other buckets already sent
    opt = Optimizer(manager, inner)
    gen = torch.Generator().manual_seed(
        1000 + group
    )  # each group its own data, as a sharded sampler
    deadline = time.monotonic() + WORKER_LIFETIME_S
    while time.monotonic() < deadline:
        opt.zero_grad()  # starts the quorum (async, overlaps the forward)
        x = torch.randn(32, 64, generator=gen)
        loss = forward(x).pow(2).mean()
        loss.backward()  # ddp: gradient allreduce across the groups in the quorum, overlapping the backward
        if WRAP == "manual":
            for work in [
                manager.allreduce(p.grad) for p in model.parameters() if p.grad is not None
            ]:
                work.wait()  # an error is reported to the manager: should_commit() then says no
        opt.step()  # commits only if every group's allreduce succeeded
        digest = sum(float(p.detach().double().sum()) for p in model.parameters())
        line = {"step": manager.current_step(), "n": manager.num_participants(), "digest": digest}
        print(json.dumps(line), flush=True)
        time.sleep(STEP_SLEEP_S)


# ---------------------------------------------------------------------------------------------- orchestrator
class Group:
    """A replica group's process and the step lines it printed (read on a thread, so waits see them live)."""

    def __init__(self, group: int, lighthouse: str, log: Path, die_at: int = 0) -> None:
        cmd = [sys.executable, __file__, "--worker", str(group), lighthouse, str(die_at)]
        self.log = log.open("ab")
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=self.log, env=os.environ | {"PYTHONUNBUFFERED": "1"}
        )
        self.lines: list[dict[str, Any]] = []
        self.cond = threading.Condition()
        self.done = False  # the process closed its stdout (exited): no more lines will come
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            self.log.write(raw)
            try:
                line = json.loads(raw)
            except ValueError:
                continue
            line["t"] = time.monotonic()
            with self.cond:
                self.lines.append(line)
                self.cond.notify_all()
        with self.cond:
            self.done = True
            self.cond.notify_all()

    def wait_for(
        self, pred: Callable[[dict[str, Any]], bool], timeout: float
    ) -> dict[str, Any] | None:
        """The first line (already printed or to come) for which pred holds, or None after timeout."""
        end = time.monotonic() + timeout
        with self.cond:
            while True:
                hit = next((ln for ln in self.lines if pred(ln)), None)
                if hit is not None or self.done:
                    return hit
                left = end - time.monotonic()
                if left <= 0:
                    return None
                self.cond.wait(min(left, 1.0))

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)


DIE_AT_STEP = 8  # mid-backward scenario: group 1 dies in its 8th backward, after training together


def run_check(workdir: Path, *, mid_backward: bool) -> dict[str, Any]:
    """One scenario with its own lighthouse: group 1 SIGKILLed between steps or inside a backward."""
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    lighthouse_bin = shutil.which("torchft_lighthouse", path=str(Path(sys.executable).parent))
    assert lighthouse_bin, "torchft_lighthouse not found next to this python"
    lh_log = (workdir / "lighthouse.log").open("ab")
    lighthouse = subprocess.Popen(
        [
            lighthouse_bin,
            "--bind",
            f"127.0.0.1:{port}",
            "--min_replicas",
            "1",
            "--join_timeout_ms",
            "1000",
        ],
        stdout=lh_log,
        stderr=subprocess.STDOUT,
    )
    addr = f"http://127.0.0.1:{port}"
    groups: list[Group] = []
    try:
        return _scenario(addr, workdir, groups, die_at=DIE_AT_STEP if mid_backward else 0)
    finally:
        for g in groups:
            g.kill()
        lighthouse.kill()
        lighthouse.wait(timeout=10)


def _scenario(addr: str, workdir: Path, groups: list[Group], *, die_at: int) -> dict[str, Any]:
    res: dict[str, Any] = {"ok": False}
    g0 = Group(0, addr, workdir / "group0.log")
    groups.append(g0)
    g1 = Group(1, addr, workdir / "group1.log", die_at=die_at)
    groups.append(g1)
    both = g0.wait_for(lambda ln: ln["n"] == 2 and ln["step"] >= 5, 60)
    if both is None:
        return res | {
            "failed": "the two groups never trained together for 5 steps (see group*.log)"
        }
    if die_at:
        g1.proc.wait(timeout=60)  # it SIGKILLs itself in a backward
    else:
        g1.kill()
    killed_at, t_kill = max(ln["step"] for ln in g0.lines), time.monotonic()
    alone = g0.wait_for(lambda ln: ln["t"] > t_kill and ln["n"] == 1 and ln["step"] > killed_at, 60)
    if alone is None:
        rc = g0.proc.poll()  # torchft's DDP wrapper: the survivor crashes (docs/reliability.md)
        why = f"exited {rc} (see group0.log)" if rc is not None else "committed no step alone"
        return res | {"failed": f"after group 1 was killed, group 0 {why}"}
    res |= {
        "killed_at_step": killed_at,
        "survivor_next_step": alone["step"],
        "survivor_gap_s": round(alone["t"] - t_kill, 2),
    }
    g0.wait_for(lambda ln: ln["step"] >= alone["step"] + 5, 30)  # it goes on, not just one step
    g1b = Group(1, addr, workdir / "group1.log")
    groups.append(g1b)
    t_restart = time.monotonic()
    healed = g1b.wait_for(lambda ln: ln["n"] == 2 and ln["step"] > killed_at, 90)
    if healed is None:
        return res | {"failed": "restarted group 1 did not rejoin the quorum (see group1.log)"}
    g0.wait_for(lambda ln: ln["step"] >= healed["step"] + 2, 30)
    g1b.wait_for(lambda ln: ln["step"] >= healed["step"] + 2, 30)
    same = _same_weights(g0.lines, g1b.lines, after=healed["step"])
    res |= {
        "rejoined_at_step": healed["step"],
        "heal_s": round(healed["t"] - t_restart, 2),
        "weights_equal_after_heal": same,
    }
    res["survivor_restarted"] = g0.proc.poll() is not None
    # a step whose allreduce failed is not committed (torchft Manager.should_commit) and is run again
    res["survivor_uncommitted_steps"] = (
        (workdir / "group0.log").read_text().count("should_commit completed should_commit=false")
    )
    res["ok"] = bool(same) and not res["survivor_restarted"]
    return res


def _same_weights(a: list[dict[str, Any]], b: list[dict[str, Any]], *, after: int) -> bool:
    """Both groups' weight digests agree at every step both printed after the heal (and there is one)."""
    da = {ln["step"]: ln["digest"] for ln in a if ln["step"] > after}
    db = {ln["step"]: ln["digest"] for ln in b if ln["step"] > after}
    common = sorted(set(da) & set(db))
    return bool(common) and all(abs(da[s] - db[s]) <= 1e-9 * max(1.0, abs(da[s])) for s in common)


def main() -> int:
    if WRAP not in ("ddp", "manual"):
        print(
            f"TORCHFT_CHECK_WRAP={WRAP!r} is not a gradient path: use manual (the default) or ddp",
            file=sys.stderr,
        )
        return 2
    if len(sys.argv) == 5 and sys.argv[1] == "--worker":
        worker(int(sys.argv[2]), sys.argv[3], int(sys.argv[4]))
        return 0
    if (
        importlib.util.find_spec("torchft") is None
    ):  # asked before importing torch: the skip is instant
        print(
            json.dumps(
                {
                    "skipped": "torchft not installed (no module named 'torchft'); see this file's docstring"
                }
            )
        )
        return 0
    from importlib.metadata import version

    import torch

    workdir = Path(os.environ.get("TORCHFT_CHECK_DIR", "/tmp/torchft_check"))
    t0 = time.monotonic()
    res: dict[str, Any] = {
        "torch": torch.__version__,
        "torchft": version("torchft"),
        "wrap": WRAP,
        "logs": str(workdir),
    }
    for name, mid in (("between_steps", False), ("mid_backward", True)):
        res[name] = run_check(workdir / name, mid_backward=mid)
    res["ok"] = all(res[name]["ok"] for name in ("between_steps", "mid_backward"))
    res["wall_s"] = round(time.monotonic() - t0, 1)
    print(json.dumps(res))
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())

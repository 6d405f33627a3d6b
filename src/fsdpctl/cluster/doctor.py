"""Preflight checks for a workstation, a GPU node or a pod (`kubectl exec ... fsdpctl doctor`).

Each check reports ok / warn / fail / skipped with the fix in one line. The probes are the real
ones: the `nvidia-smi` and `fi_info` binaries on PATH, torch, NCCL (gloo on CPUs) between local
processes, /dev/shm, the configured data set through the trainer's own loader.
"""

from __future__ import annotations

import os
import re
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fsdpctl.adapters import shell
from fsdpctl.cluster.checks import FAIL, OK, SKIPPED, WARN, Check
from fsdpctl.settings import Config

__all__ = ["FAIL", "OK", "SKIPPED", "WARN", "Check", "Facts", "run_checks", "targets"]

MIN_SHM = 1 << 30  # NCCL needs more than the 64 MB a pod gets by default (NVIDIA/nccl#525)
LOCAL_DEMAND = (
    1_000.0  # tokens/s per process of a tiny model on one CPU core (what the quickstart measures)
)
PROBE_TIMEOUT = 30.0  # seconds for nvidia-smi / fi_info: longer means a hung driver


@dataclass
class Facts:
    """What earlier checks found, for the later ones."""

    gpus: int = 0
    driver_cuda: str | None = None
    torch: Any = None  # the module, once imported
    cuda: bool = False


def targets(cfg: Config) -> tuple[float, Path]:
    """What the data loader must keep up with (tokens/s per process) and where checkpoints will be
    written: on EKS the planned step and the pod's checkpoint mount; locally the quickstart's rate
    and the job's dir."""
    if cfg.target.gpus:
        from fsdpctl.job import policy as jobpolicy
        from fsdpctl.plan import planner as plan
        from fsdpctl.plan.steptime import speed

        demand = speed(plan.job_from(cfg, mfu=0.0, price=None)).tokens_per_s_per_gpu
        return demand, Path(cfg.training.checkpoint_dir or jobpolicy.POD_CHECKPOINT_ROOT)
    from fsdpctl.job.home import job_dir

    return LOCAL_DEMAND, job_dir(cfg.job_name) / "checkpoints"


def check_nvidia_smi(facts: Facts) -> Check:
    if not shutil.which("nvidia-smi"):
        return Check(
            "nvidia-smi",
            SKIPPED,
            "no NVIDIA driver (nvidia-smi not on PATH)",
            "on a GPU node: use the EKS GPU-optimized AMI; in a pod: request nvidia.com/gpu",
        )
    query = ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"]
    try:
        p = shell.capture(query, timeout=PROBE_TIMEOUT)
        header = shell.capture(["nvidia-smi"], timeout=PROBE_TIMEOUT).stdout if p.rc == 0 else ""
    except shell.ToolTimeout:
        return Check(
            "nvidia-smi",
            FAIL,
            f"nvidia-smi did not answer in {PROBE_TIMEOUT:g} s",
            "the driver is hung: reboot the node",
        )
    if p.rc != 0:
        first = (p.stderr or p.stdout).strip().splitlines()[:1] or [f"exit code {p.rc}"]
        return Check(
            "nvidia-smi",
            FAIL,
            f"nvidia-smi failed: {first[0]}",
            "reinstall or reload the NVIDIA driver (on EKS: replace the node)",
        )
    gpus = [line.split(",") for line in p.stdout.strip().splitlines() if line.strip()]
    facts.gpus = len(gpus)
    m = re.search(r"CUDA Version:\s*([\d.]+)", header)
    facts.driver_cuda = m.group(1) if m else None
    name, driver = gpus[0][0].strip(), gpus[0][1].strip()
    return Check(
        "nvidia-smi", OK, f"{len(gpus)} x {name}, driver {driver}, CUDA {facts.driver_cuda or '?'}"
    )


def check_torch(facts: Facts) -> Check:
    try:
        import torch
    except ImportError:
        return Check(
            "torch",
            FAIL,
            "torch is not installed",
            "pip install 'fsdpctl[train]' (or use the trainer image)",
        )
    facts.torch = torch
    build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "CPU build"
    return Check(
        "torch", OK, f"torch {torch.__version__} ({build}), {torch.get_num_threads()} CPU threads"
    )


def _version(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in v.split(".")[:2])


def check_driver_vs_cuda(facts: Facts) -> Check:
    name = "driver vs CUDA"
    if not facts.gpus:
        return Check(name, SKIPPED, "no NVIDIA driver")
    if facts.torch is None:
        return Check(name, SKIPPED, "torch missing")
    built = facts.torch.version.cuda
    if not built:
        return Check(
            name,
            FAIL,
            f"torch {facts.torch.__version__} is a CPU build on a GPU machine",
            "install the CUDA wheel of torch (the trainer image has it)",
        )
    if facts.driver_cuda and _version(facts.driver_cuda) < _version(built):
        return Check(
            name,
            FAIL,
            f"driver supports CUDA {facts.driver_cuda}, torch needs {built}",
            "upgrade the NVIDIA driver, or use a torch built for the driver's CUDA",
        )
    return Check(name, OK, f"driver CUDA {facts.driver_cuda} >= torch CUDA {built}")


def check_cuda_available(facts: Facts) -> Check:
    name = "torch.cuda"
    if not facts.gpus or facts.torch is None:
        return Check(name, SKIPPED, "no NVIDIA driver" if not facts.gpus else "torch missing")
    if not facts.torch.cuda.is_available():
        return Check(
            name,
            FAIL,
            "torch.cuda.is_available() is False although nvidia-smi sees GPUs",
            "check CUDA_VISIBLE_DEVICES and that the container has the GPU devices",
        )
    facts.cuda = True
    return Check(name, OK, f"{facts.torch.cuda.device_count()} devices visible to torch")


def check_forward_backward(facts: Facts) -> Check:
    name = "forward/backward"
    if not facts.cuda:
        return Check(name, SKIPPED, "no CUDA device")
    torch = facts.torch
    from transformers import LlamaForCausalLM

    from fsdptrain.models import llama_config

    try:
        torch.cuda.reset_peak_memory_stats()
        model: Any = LlamaForCausalLM(
            llama_config("tiny")
        )  # transformers' .cuda() stub confuses mypy
        model = model.cuda()
        ids = torch.randint(0, 512, (4, 256), device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.cuda.synchronize()
    except RuntimeError as e:
        return Check(
            name,
            FAIL,
            f"tiny model failed on cuda: {str(e).splitlines()[0]}",
            "see the error; `nvidia-smi -q` for ECC/Xid errors",
        )
    gib = 1024**3
    return Check(
        name,
        OK,
        f"tiny Llama step ok, memory {torch.cuda.max_memory_allocated() / gib:.2f} GiB allocated / "
        f"{torch.cuda.max_memory_reserved() / gib:.2f} GiB reserved",
    )


def check_bf16(facts: Facts) -> Check:
    if not facts.cuda:
        return Check("bf16", SKIPPED, "no CUDA device")
    if facts.torch.cuda.is_bf16_supported():
        return Check("bf16", OK, "supported")
    return Check("bf16", FAIL, "this GPU has no bf16", "PRECISION=fp16 (or an A100/H100 node)")


def _allreduce_worker(
    rank: int, world: int, port: int, backend: str, size: int, iters: int, out: Any
) -> None:
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    if backend == "nccl":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, rank=rank, world_size=world)
    t = torch.ones(size // 4, dtype=torch.float32, device=device)
    dist.all_reduce(t)  # warm-up builds the communicator
    if backend == "nccl":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(t)
    if backend == "nccl":
        torch.cuda.synchronize()
    elapsed = (time.perf_counter() - start) / iters
    if rank == 0:
        out.put((elapsed, float(t[0].item())))
    dist.destroy_process_group()


def allreduce_busbw(world: int, backend: str, size: int, iters: int) -> tuple[float, bool]:
    """(bus bandwidth in GB/s, result correct) of an all-reduce across `world` local processes."""
    import torch.multiprocessing as mp

    from fsdpctl.adapters.etcd import free_port

    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    mp.start_processes(
        _allreduce_worker,
        args=(world, free_port(), backend, size, iters, out),
        nprocs=world,
        start_method="spawn",
    )
    elapsed, value = out.get(timeout=60)
    expected = float(world ** (iters + 1))
    return 2 * (world - 1) / world * size / elapsed / 1e9, abs(value - expected) < 1e-3 * expected


def check_collectives(facts: Facts) -> Check:
    if facts.torch is None:
        return Check("all-reduce", SKIPPED, "torch missing")
    if facts.cuda and facts.gpus >= 2:
        backend, world, size, what = "nccl", facts.gpus, 256 << 20, f"NCCL across {facts.gpus} GPUs"
    elif facts.cuda:
        return Check("all-reduce", SKIPPED, "1 GPU: no NCCL peer on this node")
    else:
        backend, world, size, what = "gloo", 2, 16 << 20, "gloo across 2 CPU processes"
    try:
        busbw, correct = allreduce_busbw(world, backend, size, iters=5)
    except Exception as e:  # a broken collective is the finding, whatever raised
        return Check(
            "all-reduce",
            FAIL,
            f"{what} failed: {str(e).splitlines()[0] if str(e) else type(e).__name__}",
            "NCCL_DEBUG=INFO shows why; check NCCL_SOCKET_IFNAME and /dev/shm",
        )
    if not correct:
        return Check(
            "all-reduce",
            FAIL,
            f"{what}: wrong result",
            "faulty GPU or link: `nvidia-smi -q`, dcgmi diag",
        )
    return Check("all-reduce", OK, f"{what}: bus bandwidth {busbw:.2f} GB/s")


def check_efa(cfg: Config) -> Check:
    expected = cfg.uses_efa
    if not shutil.which("fi_info"):
        if expected:
            return Check(
                "EFA",
                WARN,
                "fi_info not found: cannot see EFA devices here",
                f"run doctor in the trainer image on a {cfg.instance_type} node (expects "
                f"{cfg.efa_per_node} EFA interfaces)",
            )
        return Check("EFA", SKIPPED, "EFA not expected here (BACKEND=local or EFA_ENABLED=false)")
    try:
        p = shell.capture(["fi_info", "-p", "efa", "-t", "FI_EP_RDM"], timeout=PROBE_TIMEOUT)
    except shell.ToolTimeout:
        return Check(
            "EFA",
            FAIL,
            f"fi_info did not answer in {PROBE_TIMEOUT:g} s",
            "check the EFA driver (dmesg)",
        )
    if p.rc != 0:
        return Check(
            "EFA",
            FAIL if expected else WARN,
            "fi_info finds no EFA provider",
            "request vpc.amazonaws.com/efa in the pod and install the EFA device plugin",
        )
    devices = len(set(re.findall(r"domain:\s*(\S+)", p.stdout)))
    if expected and devices < cfg.efa_per_node:
        return Check(
            "EFA",
            WARN,
            f"{devices} EFA devices, {cfg.instance_type} has {cfg.efa_per_node}",
            "request all interfaces (vpc.amazonaws.com/efa) or NCCL runs at a fraction of the bandwidth",
        )
    return Check("EFA", OK, f"{devices} EFA devices")


def check_shm(path: str = "/dev/shm", minimum: int = MIN_SHM) -> Check:
    try:
        st = os.statvfs(path)
    except OSError as e:
        return Check(
            "shared memory",
            FAIL,
            f"{path}: {e.strerror}",
            "mount an in-memory emptyDir at /dev/shm",
        )
    size = st.f_blocks * st.f_frsize
    detail = f"{path} is {size / (1 << 30):.1f} GiB"
    if size < minimum:
        return Check(
            "shared memory",
            WARN,
            detail + f" (< {minimum / (1 << 30):.1f} GiB)",
            "NCCL fails with 'No space left on device': mount an in-memory emptyDir at /dev/shm "
            "(fsdpctl's manifests do)",
        )
    return Check("shared memory", OK, detail)


def check_disk(cfg: Config, path: Path) -> Check:
    from fsdptrain.shapes import MODEL_CONFIGS

    path = path if path.exists() else next((p for p in path.parents if p.exists()), Path("/"))
    free = shutil.disk_usage(path).free
    # a checkpoint holds the fp32 parameters and the two AdamW moments
    need = 12 * MODEL_CONFIGS[cfg.training.model].num_params() * cfg.training.checkpoint_keep
    detail = (
        f"{free / (1 << 30):.1f} GiB free at {path}, {cfg.training.checkpoint_keep} checkpoints need "
        f"{need / (1 << 30):.2f} GiB"
    )
    if free < need:
        return Check(
            "checkpoint space",
            FAIL,
            detail,
            "free space, lower CHECKPOINT_KEEP or use a bigger volume",
        )
    return Check("checkpoint space", OK, detail)


def _trainer_config(cfg: Config) -> Any:
    """The trainer's validated config, the built-in corpus and tokenizer made (offline) where asked
    for."""
    from dataclasses import replace

    from fsdptrain.config import BUILTIN

    tcfg = cfg.training.validate()
    if BUILTIN not in (tcfg.dataset, tcfg.tokenizer_path):
        return tcfg
    from fsdptrain.assets import default_cache, ensure_assets

    corpus, tok = ensure_assets(default_cache())
    return replace(
        tcfg,
        dataset=str(corpus) if tcfg.dataset == BUILTIN else tcfg.dataset,
        tokenizer=str(tok) if tcfg.tokenizer_path == BUILTIN else tcfg.tokenizer,
    )


def _loader_rate(cfg: Config) -> tuple[float, float]:
    """(tokens/s the trainer's loader yields in one process, seconds it took to prepare the
    data)."""
    from fsdptrain.data import Loader, load_blocks, load_tokenizer

    tcfg = _trainer_config(cfg)
    start = time.perf_counter()
    blocks = load_blocks(tcfg, load_tokenizer(tcfg.tokenizer_path))
    prepare = time.perf_counter() - start
    loader = Loader(blocks, rank=0, world=1, micro_batch=cfg.training.micro_batch_size)
    start, tokens = time.perf_counter(), 0
    while time.perf_counter() - start < 1.0:
        inputs, _ = loader.next_batch()
        tokens += inputs.numel()
    return tokens / (time.perf_counter() - start), prepare


def check_data(cfg: Config, demand_tokens_per_s: float) -> Check:
    """Builds the configured data set with the trainer's loader, times batches against the step's
    demand."""
    from fsdptrain.config import ConfigError

    try:
        rate, prepare = _loader_rate(cfg)
    except (ConfigError, OSError, StopIteration) as e:
        return Check(
            "data loader",
            FAIL,
            f"DATASET={cfg.training.dataset!r}: {e}",
            "fix DATASET / TOKENIZER (see the message)",
        )
    detail = (
        f"{rate:,.0f} tokens/s per process (prepared in {prepare:.1f} s), "
        f"the step needs {demand_tokens_per_s:,.0f}"
    )
    if rate < 2 * demand_tokens_per_s:
        return Check(
            "data loader",
            WARN,
            detail,
            "input-bound: pre-tokenize the data set or raise SEQ_LEN/batch",
        )
    return Check("data loader", OK, detail)


def run_checks(
    cfg: Config,
    *,
    demand_tokens_per_s: float,
    checkpoint_path: Path,
    collectives: bool = True,
    on_check: Callable[[Check], None] | None = None,
) -> list[Check]:
    facts = Facts()
    steps = [
        lambda: check_nvidia_smi(facts),
        lambda: check_torch(facts),
        lambda: check_driver_vs_cuda(facts),
        lambda: check_cuda_available(facts),
        lambda: check_forward_backward(facts),
        lambda: check_bf16(facts),
    ]
    if collectives:
        steps.append(lambda: check_collectives(facts))
    steps += [
        lambda: check_efa(cfg),
        lambda: check_shm(),
        lambda: check_disk(cfg, checkpoint_path),
        lambda: check_data(cfg, demand_tokens_per_s),
    ]
    results = []
    for step in steps:
        result = step()
        results.append(result)
        if on_check:
            on_check(result)
    return results

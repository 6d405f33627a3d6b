"""Training settings: one field per knob, each readable from a flag or an environment variable.

Precedence: command-line flag > environment variable > default. The environment names are the same
keys that `fsdpctl` writes into `.env` and into the PyTorchJob, so one vocabulary runs from laptop
to cluster. The named Llama-2 models (7b, 13b, 70b) have defaults of their own for the keys in
`MODEL_DEFAULTS`; a key the user set always wins. `fsdpctl` applies the same table
(`with_model_defaults`), so a pod, `fsdpctl plan` and `python -m fsdptrain --model 7b` agree.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# re-exported: its old home, where fsdpctl and the tests import it from
from fsdptrain.errors import ConfigError as ConfigError
from fsdptrain.levers import sdpa_problem

STRATEGIES = ("FULL_SHARD", "SHARD_GRAD_OP", "HYBRID_SHARD", "NO_SHARD")
PRECISIONS = ("bf16", "fp16", "fp32")
AC_MODES = ("none", "full", "every-k", "selective")
AUTO_ON_OFF = ("auto", "on", "off")
DETERMINISTIC_MODES = ("auto", "true", "false")
COMPILE_MODES = ("auto", "true", "false")
FLOAT8_RECIPES = ("tensorwise", "rowwise")
# COMPILE was a true/false switch: the words a boolean took still mean what they meant
BOOL_WORDS = {"1": "true", "yes": "true", "on": "true", "true": "true"}
BOOL_WORDS |= {"0": "false", "no": "false", "off": "false", "false": "false"}
DATASET_FORMATS = ("auto", "text", "json", "parquet")
WANDB_MODES = ("online", "offline", "disabled")
# what each optional key needs installed, and the extra that brings it
OPTIONAL_PACKAGES = {
    "TENSORBOARD_DIR": ("tensorboard", "trackers"),
    "WANDB_PROJECT": ("wandb", "trackers"),
    "FLOAT8": ("torchao", "float8"),
}
BUILTIN = "builtin"  # the offline corpus + tokenizer of fsdptrain.assets


# pipe(7): a write(2) of at most PIPE_BUF bytes to a pipe is atomic, never interleaved with
# another's; the ranks of a node share their launcher's stderr pipe, so each error line is one write
# below that size
PIPE_BUF = 4096


def print_error(message: str, suffix: str = "") -> None:
    """`fsdptrain: error: MESSAGE` on stderr in one write(2): print() writes the text and its
    newline apart, and two ranks failing together glued their lines into one. A message too long for
    one atomic write is cut at a word, marked with an ellipsis."""
    import sys

    line = " ".join(f"fsdptrain: error: {message}{suffix}".split())
    data = line.encode("utf-8", "replace")
    if len(data) >= PIPE_BUF:
        data = data[: PIPE_BUF - 8].rsplit(b" ", 1)[0] + " …".encode()
    sys.stderr.flush()
    try:
        fd = sys.stderr.fileno()
    except (
        AttributeError,
        OSError,
        ValueError,
    ):  # a stream with no descriptor (captured): its own write
        sys.stderr.write(data.decode() + "\n")
        return
    os.write(fd, data + b"\n")


def _f(
    env: str,
    default: Any,
    help: str,
    *,
    choices: Sequence[str] = (),
    minimum: float | None = None,
    maximum: float | None = None,
    aliases: Mapping[str, str] | None = None,
) -> Any:  # Any: the field's declared type is the one that counts
    meta: dict[str, Any] = {"env": env, "help": help, "choices": tuple(choices), "min": minimum}
    meta.update(max=maximum, aliases=dict(aliases or {}))
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class TrainConfig:
    # model
    model: str = _f("MODEL", "tiny", "named model config: 7b, 13b, 70b, tiny, tiny-gqa")
    pretrained: str = _f(
        "PRETRAINED",
        "",
        "fine-tune from this HF checkpoint (local dir or hub id); empty: from scratch",
    )
    tokenizer: str = _f(
        "TOKENIZER", "", "tokenizer path or hub id (default: PRETRAINED's, else builtin)"
    )
    # data
    dataset: str = _f(
        "DATASET",
        BUILTIN,
        "builtin (offline sample), local file/dir (text, jsonl, parquet) or hub id",
    )
    dataset_format: str = _f(
        "DATASET_FORMAT", "auto", "file format of a local dataset", choices=DATASET_FORMATS
    )
    dataset_split: str = _f("DATASET_SPLIT", "train", "split to read")
    dataset_text_field: str = _f("DATASET_TEXT_FIELD", "text", "column holding the text")
    # parallelism and precision
    sharding_strategy: str = _f(
        "SHARDING_STRATEGY", "FULL_SHARD", "FSDP strategy", choices=STRATEGIES
    )
    hsdp_shard_size: int = _f(
        "HSDP_SHARD_SIZE", 0, "HYBRID_SHARD group size (0: the processes of one node)", minimum=0
    )
    precision: str = _f("PRECISION", "bf16", "parameter/compute dtype", choices=PRECISIONS)
    activation_checkpointing: str = _f(
        "ACTIVATION_CHECKPOINTING",
        "none",
        "recompute activations: full (every layer), every-k, selective (compiled: every layer, "
        "keeping matmul outputs; without compile: every 2nd layer)",
        choices=AC_MODES,
    )
    ac_every: int = _f(
        "AC_EVERY", 2, "with every-k: checkpoint every k-th decoder layer", minimum=1
    )
    fsdp_prefetch: int = _f(
        "FSDP_PREFETCH",
        1,
        "all-gather the next N decoder layers ahead in forward and backward "
        "(0: FSDP2's implicit order)",
        minimum=0,
    )
    compile: str = _f(
        "COMPILE",
        "auto",
        "torch.compile each decoder layer: auto (on with CUDA where Triton finds a C compiler and "
        "Python's headers, off elsewhere), true, false",
        choices=COMPILE_MODES,
        aliases=BOOL_WORDS,
    )
    float8: bool = _f(
        "FLOAT8",
        False,
        "float8 training of the decoder's linear layers through torchao (needs fsdpctl[float8] "
        "and a GPU of compute capability 8.9+: H100/H200/L40S; runs compiled unless "
        "COMPILE=false)",
    )
    float8_recipe: str = _f(
        "FLOAT8_RECIPE",
        "tensorwise",
        "float8 scaling: tensorwise (one scale per tensor: torchao's fastest; on several GPUs "
        "FSDP all-gathers the weights in float8) or rowwise (a scale per row: more accurate, "
        "all-gathers in bf16)",
        choices=FLOAT8_RECIPES,
    )
    sdpa_backends: str = _f(
        "SDPA_BACKENDS",
        "cudnn,flash,efficient,math",
        "attention kernels in priority order (torchtitan's: cuDNN first); "
        "the one that runs is logged",
    )
    gc_interval: int = _f(
        "GC_INTERVAL",
        50,
        "Python's automatic garbage collection off, one collection every N steps "
        "(torchtitan's gc_freq); 0: Python's own",
        minimum=0,
    )
    collective_timeout: int = _f(
        "COLLECTIVE_TIMEOUT",
        0,
        "seconds a collective waits for the slowest rank before the job fails (0: torch's default, "
        "10 min with NCCL, 30 min with gloo)",
        minimum=0,
    )
    # optimisation
    micro_batch_size: int = _f(
        "MICRO_BATCH_SIZE", 2, "sequences per process per micro-step", minimum=1
    )
    grad_accum_steps: int = _f("GRAD_ACCUM_STEPS", 1, "micro-steps per optimizer step", minimum=1)
    seq_len: int = _f("SEQ_LEN", 128, "tokens per sequence", minimum=8)
    max_steps: int = _f("MAX_STEPS", 30, "optimizer steps to run", minimum=1)
    lr: float = _f("LR", 3e-3, "peak learning rate", minimum=0.0)
    min_lr_ratio: float = _f(  # above 1 the "decay" would climb past the peak
        "MIN_LR_RATIO", 0.1, "cosine floor as a fraction of LR (0 to 1)", minimum=0.0, maximum=1.0
    )
    warmup_steps: int = _f("WARMUP_STEPS", 5, "linear warmup steps", minimum=0)
    weight_decay: float = _f("WEIGHT_DECAY", 0.1, "AdamW weight decay", minimum=0.0)
    fused_optimizer: str = _f(
        "FUSED_OPTIMIZER",
        "auto",
        "fused AdamW kernel: auto (on with CUDA, foreach elsewhere), on, off (foreach)",
        choices=AUTO_ON_OFF,
    )
    grad_clip: float = _f("GRAD_CLIP", 1.0, "max global grad norm (0: off)", minimum=0.0)
    seed: int = _f("SEED", 1234, "seed for init, data order and RNG", minimum=0)
    # checkpoints
    checkpoint_dir: str = _f("CHECKPOINT_DIR", "", "where sharded checkpoints go (empty: none)")
    checkpoint_interval: int = _f(
        "CHECKPOINT_INTERVAL", 0, "save every N steps (0: only at the end)", minimum=0
    )
    checkpoint_keep: int = _f("CHECKPOINT_KEEP", 2, "keep the last K checkpoints", minimum=1)
    resume: str = _f(
        "RESUME", "auto", "auto: resume from the latest checkpoint; never; or a checkpoint path"
    )
    allow_setting_changes: bool = _f(
        "ALLOW_SETTING_CHANGES",
        False,
        "resume a checkpoint saved with other settings that change the math (precision, model, "
        "sharding, LR schedule, MAX_STEPS, sequence length, batch); refused otherwise",
    )
    export_dir: str = _f(
        "EXPORT_DIR", "", "write a consolidated HF safetensors model here at the end"
    )
    # telemetry
    log_interval: int = _f("LOG_INTERVAL", 1, "log every N steps", minimum=1)
    peak_tflops: float = _f(
        "PEAK_TFLOPS", 0.0, "peak TFLOP/s per device for MFU (0: from the GPU table)", minimum=0.0
    )
    metrics_file: str = _f(
        "METRICS_FILE", "", "also append the JSON metric lines to this file (rank 0)"
    )
    metrics_port: int = _f(
        "METRICS_PORT",
        0,
        "serve Prometheus metrics (tokens/s, loss, MFU) on this port from rank 0 (0: off)",
        minimum=0,
    )
    tensorboard_dir: str = _f(
        "TENSORBOARD_DIR",
        "",
        "write TensorBoard scalars of each logged step under DIR/<run id> "
        "(rank 0; needs fsdpctl[trackers]; empty: off)",
    )
    wandb_project: str = _f(
        "WANDB_PROJECT",
        "",
        "log each logged step to this Weights & Biases project "
        "(rank 0; needs fsdpctl[trackers]; empty: off)",
    )
    wandb_mode: str = _f(
        "WANDB_MODE",
        "online",
        "W&B mode: online, offline (files under WANDB_DIR, `wandb sync` later) or disabled",
        choices=WANDB_MODES,
    )
    deterministic: str = _f(
        "DETERMINISTIC",
        "auto",
        "torch deterministic algorithms: auto (on for CPU, off with CUDA, where they slow "
        "kernels), true, false",
        choices=DETERMINISTIC_MODES,
    )

    def validate(self, *, check_paths: bool = True) -> TrainConfig:
        """Raise on the first problem; `check_paths` also checks local paths
        (off when validating for a pod)."""
        found = self.problems(check_paths=check_paths)
        if found:
            raise ConfigError(found[0])
        return self

    def problems(self, *, check_paths: bool = True) -> list[str]:
        """Every problem, one line each naming the key, the value and what is allowed."""
        from fsdptrain.shapes import MODEL_CONFIGS

        found = []
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            env, choices, minimum, maximum = (
                f.metadata[k] for k in ("env", "choices", "min", "max")
            )
            if choices and value not in choices:
                found.append(f"{env}={value!r} is not allowed: use one of {', '.join(choices)}")
            elif minimum is not None and value < minimum:
                found.append(f"{env}={value!r} is too small: use at least {minimum:g}")
            elif maximum is not None and value > maximum:
                found.append(f"{env}={value!r} is too large: use at most {maximum:g}")
        if self.model not in MODEL_CONFIGS:
            found.append(f"MODEL={self.model!r} is unknown: use one of {', '.join(MODEL_CONFIGS)}")
        if self.warmup_steps > self.max_steps and not any(
            line.startswith(("MAX_STEPS=", "WARMUP_STEPS=")) for line in found
        ):
            found.append(
                f"WARMUP_STEPS={self.warmup_steps} exceeds MAX_STEPS={self.max_steps}: lower it"
            )
        if problem := sdpa_problem(self.sdpa_backends):
            found.append(problem)
        if not self.dataset:
            found.append(
                "DATASET='' is empty: use 'builtin', a text/jsonl/parquet file or a hub dataset id"
            )
        for key, value in (
            ("DATASET", self.dataset),
            ("TOKENIZER", self.tokenizer),
            ("PRETRAINED", self.pretrained),
        ):
            local = value.startswith(("/", "./", "../", "~"))
            if check_paths and local and not os.path.exists(os.path.expanduser(value)):
                found.append(f"{key}={value!r} does not exist: check the path or mount")
        if (
            check_paths
        ):  # this machine runs the trainer: what the keys set need must be installed here
            # FLOAT8's package is judged after its GPU (fsdptrain.launch.check_device, where torch
            # may be imported): installing torchao would not help a machine that cannot run float8
            found += [line for line in missing_packages(self) if not line.startswith("FLOAT8=")]
        return found

    @property
    def tokenizer_path(self) -> str:
        return self.tokenizer or self.pretrained or BUILTIN


@dataclass(frozen=True)
class ModelDefaults:
    """What a named model trains with unless the user says otherwise (see MODEL_DEFAULTS for the
    sources)."""

    seq_len: int
    micro_batch_size: int
    activation_checkpointing: str
    lr: float  # peak, training from scratch
    finetune_lr: float  # peak, with PRETRAINED
    # from scratch; capped at a tenth of MAX_STEPS so a short run still reaches the peak
    warmup_steps: int


# The tiny models keep the field defaults above (the quickstart and the tests depend on them).
# Sources:
# - LR and warmup from scratch: the Llama 2 paper (Touvron et al. 2023, section 2.2 and table 1):
#   AdamW with a peak of 3e-4 for 7B and 13B and 1.5e-4 for 34B and 70B, 2000 warmup steps, cosine
#   decay to 10% of the peak (MIN_LR_RATIO 0.1), weight decay 0.1, gradient clipping 1.0 (the field
#   defaults already).
# - LR when fine-tuning (PRETRAINED set): 1e-4, the default of the FSDP Llama-2 case of
#   aws-samples/awsome-distributed-training (src/model_utils/arguments.py), 30x below the tiny
#   model's 3e-3; 70B gets half, as the paper halves 70B's pretraining peak. Its warmup: that case's
#   0.32% of the steps.
# - SEQ_LEN: the models' 4096-token context (fsdptrain.shapes.MODEL_CONFIGS). MICRO_BATCH_SIZE and
#   ACTIVATION_CHECKPOINTING: IBM/Meta's fms-fsdp runs of these shapes (its README: 7B batch 2 and
#   13B batch 1 without checkpointing) and awsome-distributed-training's 70B
#   (models/llama2_70b.txt: batch 1 with activation checkpointing), the configurations the
#   published FSDP throughput comes from.
MODEL_DEFAULTS: dict[str, ModelDefaults] = {
    "7b": ModelDefaults(4096, 2, "none", 3e-4, 1e-4, 2000),
    "13b": ModelDefaults(4096, 1, "none", 3e-4, 1e-4, 2000),
    "70b": ModelDefaults(4096, 1, "full", 1.5e-4, 5e-5, 2000),
}
FINETUNE_WARMUP_FRACTION = 0.0032
MODEL_DEFAULT_KEYS = (
    "seq_len",
    "micro_batch_size",
    "activation_checkpointing",
    "lr",
    "warmup_steps",
)


def model_defaults(model: str, *, pretrained: str = "", max_steps: int = 30) -> dict[str, Any]:
    """The named model's defaults (field name -> value); {} for the tiny models and unknown
    names."""
    d = MODEL_DEFAULTS.get(model)
    if d is None:
        return {}
    if pretrained:
        lr, warmup = d.finetune_lr, max(1, round(FINETUNE_WARMUP_FRACTION * max_steps))
    else:
        lr, warmup = d.lr, min(d.warmup_steps, max_steps // 10)
    return {
        "seq_len": d.seq_len,
        "micro_batch_size": d.micro_batch_size,
        "activation_checkpointing": d.activation_checkpointing,
        "lr": lr,
        "warmup_steps": warmup,
    }


def with_model_defaults(values: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """`values` (field name -> parsed value, only what the user set) completed with the model's
    defaults for the keys the user left unset; also returns the names that took a model default. The
    warmup a user left unset is at most MAX_STEPS (`MAX_STEPS=3` just works), as the named models
    cap theirs at a tenth."""
    defaults = TrainConfig()
    max_steps = values.get("max_steps", defaults.max_steps)
    max_steps = max_steps if isinstance(max_steps, int) else defaults.max_steps
    found = model_defaults(
        str(values.get("model", defaults.model)),
        pretrained=str(values.get("pretrained", defaults.pretrained)),
        max_steps=max_steps,
    )
    if "warmup_steps" not in found and defaults.warmup_steps > max_steps >= 0:
        found["warmup_steps"] = max_steps
    added = [name for name in found if name not in values]
    return {**values, **{name: found[name] for name in added}}, added


def _parse_value(f: dataclasses.Field[Any], raw: str) -> Any:
    kind: type[Any] = type(f.default)
    env = f.metadata["env"]
    raw = f.metadata["aliases"].get(raw.strip().lower(), raw)
    try:
        if kind is bool:
            lowered = raw.strip().lower()
            if lowered in ("1", "true", "yes", "on"):
                return True
            if lowered in ("0", "false", "no", "off"):
                return False
            raise ValueError(raw)
        return kind(raw)
    except ValueError:
        what = {
            int: "a whole number, e.g. 2",
            float: "a number, e.g. 0.001",
            bool: "true or false",
        }[kind]
        raise ConfigError(f"{env}={raw!r} is not valid: give {what}") from None


def parse_value(name: str, raw: str) -> Any:
    """Parse one setting from its string form (as found in the environment or a .env file)."""
    return _parse_value(_FIELDS[name], raw)


def from_sources(
    argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None
) -> TrainConfig:
    """Build and validate the config from flags and environment (flags win)."""
    environ = os.environ if environ is None else environ
    parser = argparse.ArgumentParser(
        prog="python -m fsdptrain",
        description=__doc__,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    fields = dataclasses.fields(TrainConfig)
    for f in fields:
        per_model = "; 7b/13b/70b: their own" if f.name in MODEL_DEFAULT_KEYS else ""
        parser.add_argument(
            "--" + f.name.replace("_", "-"),
            dest=f.name,
            default=None,
            metavar=f.metadata["env"],
            help=f"{f.metadata['help']} "
            f"(env {f.metadata['env']}, default {f.default!r}{per_model})",
        )
    args = vars(parser.parse_args(argv))
    values = {}
    for f in fields:
        raw = args[f.name] if args[f.name] is not None else environ.get(f.metadata["env"])
        if raw is not None:
            values[f.name] = _parse_value(f, raw)
    return TrainConfig(**with_model_defaults(values)[0]).validate()


def missing_packages(cfg: TrainConfig) -> list[str]:
    """One line per optional key (trackers, FLOAT8) that is set while its package is not installed
    (checked without importing it): the run is refused before it starts instead of failing at its
    first step."""
    import importlib.util

    found = []
    for key, (package, extra) in OPTIONAL_PACKAGES.items():
        value = getattr(cfg, _BY_ENV[key].name)
        if value and importlib.util.find_spec(package) is None:
            found.append(
                f"{key}={value!r} needs the {package} package, which is not installed: "
                f"pip install 'fsdpctl[{extra}]' (or unset {key})"
            )
    return found


_FIELDS = {f.name: f for f in dataclasses.fields(TrainConfig)}
_BY_ENV = {f.metadata["env"]: f for f in dataclasses.fields(TrainConfig)}

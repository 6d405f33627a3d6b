"""Regenerate BENCHMARKS.md's "Planner against published numbers" from fsdpctl.plan.published
(no GPU, no network).

python benchmarks/published.py          # rewrites the section between its markers in BENCHMARKS.md
python benchmarks/published.py --check  # exit 1 when the section is stale (CI-friendly)
"""

from __future__ import annotations

import sys
from pathlib import Path

from fsdpctl.plan.published import CLUSTERS, POINTS, Prediction, predictions
from fsdpctl.plan.steptime import HBM_BYTES_PER_S, SPEED_MODEL

BENCHMARKS = Path(__file__).resolve().parent.parent / "BENCHMARKS.md"
BEGIN = "<!-- published:begin (benchmarks/published.py writes this section) -->"
END = "<!-- published:end -->"


def _value(metric: str, x: float) -> str:
    return f"{100 * x:.1f}%" if metric == "scaling" else f"{x:,.0f}"


def _config(p: Prediction) -> str:
    pt = p.point
    inst = CLUSTERS[pt.cluster].inst
    gpus = pt.nodes * inst.gpus
    what = "scaling 16 vs 1 node" if pt.metric == "scaling" else "tok/s/GPU"
    return (
        f"Llama 2 {pt.model.upper()}, {gpus} x {inst.gpu} ({pt.nodes} nodes, {inst.network_gbps} Gbps), "
        f"seq {pt.seq_len}, batch {pt.micro_batch}, AC {pt.ac}, {pt.strategy}, bf16, {pt.reduce_dtype} "
        f"reduce; {what}"
    )


def section() -> str:
    m = SPEED_MODEL
    lines = [
        BEGIN,
        "## Planner against published numbers",
        "",
        "`fsdpctl plan`'s speed model (`src/fsdpctl/plan/steptime.py`) predicts every published row "
        "below from the row's configuration and ONE set of global parameters; "
        "`tests/test_published.py` holds each "
        "within 10% (a known miss is listed with its reason). Regenerate with "
        "`python benchmarks/published.py`.",
        "",
        "| row | source | configuration | published | predicted | error |",
        "|---|---|---|---|---|---|",
    ]
    for p in predictions():
        pt = p.point
        err = f"{100 * p.error:+.1f}%" + (" (known miss)" if pt.known_miss else "")
        lines.append(
            f"| {pt.key} | {pt.source} | {_config(p)} | {_value(pt.metric, pt.published)} | "
            f"{_value(pt.metric, p.predicted)} | {err} |"
        )
    eff = ", ".join(f"{g} {v:.2f}" for g, v in m.matmul_efficiency.items())
    hbm = ", ".join(f"{g} {v / 1e12:.2f} TB/s" for g, v in HBM_BYTES_PER_S.items())
    lines += [
        "",
        "Global parameters (`plan.SPEED_MODEL`; the docstring of `SpeedModel` says where each comes from):",
        "",
        f"- matmul efficiency (share of dense bf16 peak a large GEMM reaches): {eff}",
        f"- memory-bound weight k = {m.membound_k} (efficiency = matmul efficiency / (1 + k x peak/HBM "
        f"bandwidth / hidden); HBM: {hbm})",
        f"- collective efficiency (bus bandwidth / line rate, NVLink and EFA) = {m.link_efficiency}",
        f"- straggler sigma = {m.straggler_sigma} (compute over n nodes takes 1 + sigma sqrt(2 ln n) of "
        "one node's)",
        f"- selective checkpointing recomputes {m.selective_share:.0%} of a layer's forward",
        "",
        "The model's form, the same for every row (`plan.speed`): overlap per phase as IBM/Meta's blog "
        'describes it (appendix "Communication computation overlap"): the forward hides the all-gathers '
        "but the first layer's, the backward hides the next all-gathers and the gradient reduction but the "
        "last layer's; the straggler factor scales the compute inside each phase, not the collectives; "
        "gradients are reduced in each row's reduce dtype (IBM/Meta: bf16, fms-fsdp's bfSixteen; torchtitan: "
        "fp32, its MixedPrecisionPolicy; fsdptrain and `fsdpctl plan`: fp32).",
        "",
        "Which rows set which parameter: the matmul efficiencies follow from the 70B rows, k from the "
        "7B-to-70B trend, sigma from the AWS scaling row (its only witness: that row is matched by "
        "construction), the selective share from torchtitan's per-op and per-layer SAC. The other rows "
        "are predictions.",
        "",
        "Notes and assumptions per row:",
        "",
    ]
    lines += [
        f"- {p.key}: {p.note}" + (f". Known miss: {p.known_miss}" if p.known_miss else "")
        for p in POINTS
    ]
    lines += [
        "",
        "Left out: IBM/Meta's 34B rows and torchtitan's Llama 3 rows (fsdptrain has no such shape).",
        END,
    ]
    return "\n".join(lines) + "\n"


def render(text: str) -> str:
    new = section()
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        return head + new.rstrip("\n") + rest.split(END, 1)[1]
    return text.rstrip("\n") + "\n\n" + new


def main(argv: list[str]) -> int:
    text = BENCHMARKS.read_text()
    out = render(text)
    if "--check" in argv:
        return 0 if out == text else 1
    BENCHMARKS.write_text(out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

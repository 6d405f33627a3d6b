"""Facts about the GPU instance types fsdpctl targets (AWS data sheets; see REFERENCE in the
README).

The one table: settings, plan, the pods' resource requests and terraform (through
fsdpctl.auto.tfvars.json, `render.terraform_vars`) all read it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class InstanceType:
    name: str
    gpu: str  # key into the trainer's peak-TFLOP/s table
    gpus: int
    gpu_memory_gib: float
    efa_interfaces: int  # EFA network cards; the nodes list them all and each pod requests them all
    network_gbps: int
    vcpus: int
    memory_gib: int
    # intra-node GPU-to-GPU bandwidth per GPU (NVLink, GB/s one direction)
    nvlink_gbps: float


INSTANCE_TYPES: dict[str, InstanceType] = {
    "p4de.24xlarge": InstanceType("p4de.24xlarge", "A100", 8, 80, 4, 400, 96, 1152, 300),
    "p5.48xlarge": InstanceType("p5.48xlarge", "H100", 8, 80, 32, 3200, 192, 2048, 450),
    "p5e.48xlarge": InstanceType("p5e.48xlarge", "H200", 8, 141, 32, 3200, 192, 2048, 450),
}

"""Kubernetes objects fsdpctl reads field by field, as types (pure: no client here; the planner
and the cluster code read them alike).

Each TypedDict is the part fsdpctl reads or writes of the Kubernetes API type of the same name
(k8s.io/api core/v1 and apps/v1 types.go; the API reference, e.g.
https://kubernetes.io/docs/reference/kubernetes-api/cluster-resources/node-v1/), as the OpenAPI of
the Kubernetes version fsdpctl targets (fsdpctl.job.validate.KUBERNETES_VERSION) defines it. The
API server leaves out what is unset, so what it answers is total=False and read with `.get`.

Whole manifests of any kind (the upstream release files `deploy` applies, rendered jobs) stay
plain parsed JSON: these types are for the objects fsdpctl reads by field.

No `from __future__ import annotations` here: a TypedDict's NotRequired is read when the class is
made, and a string annotation hides it from __required_keys__ (tests/test_kube_shapes.py reads it).
"""

from typing import NotRequired, TypedDict


class ObjectMeta(TypedDict, total=False):
    """meta/v1 `ObjectMeta`."""

    name: str
    namespace: str
    labels: dict[str, str]
    annotations: dict[str, str]


class NodeSelectorRequirement(TypedDict):
    """core/v1 `NodeSelectorRequirement` (key and operator required)."""

    key: str
    operator: str  # In, NotIn, Exists, DoesNotExist, Gt, Lt
    values: NotRequired[list[str]]


class NodeSelectorTerm(TypedDict, total=False):
    """core/v1 `NodeSelectorTerm`: its requirements are ANDed."""

    matchExpressions: list[NodeSelectorRequirement]


class NodeSelector(TypedDict):
    """core/v1 `NodeSelector`: its terms are ORed (nodeSelectorTerms required)."""

    nodeSelectorTerms: list[NodeSelectorTerm]


class NodeAffinity(TypedDict, total=False):
    """core/v1 `NodeAffinity`."""

    requiredDuringSchedulingIgnoredDuringExecution: NodeSelector


class Affinity(TypedDict, total=False):
    """core/v1 `Affinity`."""

    nodeAffinity: NodeAffinity


class Toleration(TypedDict, total=False):
    """core/v1 `Toleration`."""

    key: str
    operator: str  # Exists, Equal
    effect: str  # NoSchedule, PreferNoSchedule, NoExecute


class Container(TypedDict, total=False):
    """core/v1 `Container`."""

    name: str
    image: str


class PodSpec(TypedDict, total=False):
    """core/v1 `PodSpec`."""

    containers: list[Container]
    tolerations: list[Toleration]
    affinity: Affinity


class PodTemplateSpec(TypedDict, total=False):
    """core/v1 `PodTemplateSpec`."""

    metadata: ObjectMeta
    spec: PodSpec


class WorkloadCondition(TypedDict):
    """apps/v1 `DeploymentCondition` and `DaemonSetCondition` (type and status required)."""

    type: str
    status: str  # "True", "False", "Unknown"


class WorkloadSpec(TypedDict, total=False):
    """apps/v1 `DeploymentSpec` and `DaemonSetSpec` (replicas: a Deployment's only)."""

    replicas: int
    template: PodTemplateSpec


class WorkloadStatus(TypedDict, total=False):
    """apps/v1 `DeploymentStatus` (availableReplicas) and `DaemonSetStatus` (desiredNumberScheduled,
    numberReady)."""

    availableReplicas: int
    desiredNumberScheduled: int
    numberReady: int
    conditions: list[WorkloadCondition]


class Workload(TypedDict, total=False):
    """apps/v1 `Deployment` or `DaemonSet`: what `deploy` waits on and `deploy status` shows."""

    apiVersion: str
    kind: str
    metadata: ObjectMeta
    spec: WorkloadSpec
    status: WorkloadStatus


class NodeStatus(TypedDict, total=False):
    """core/v1 `NodeStatus`: allocatable quantities (the API server writes each as a string)."""

    allocatable: dict[str, str]


class Node(TypedDict, total=False):
    """core/v1 `Node`."""

    apiVersion: str
    kind: str
    metadata: ObjectMeta
    status: NodeStatus


class JobCondition(TypedDict):
    """batch/v1 `JobCondition` (type and status required)."""

    type: str  # Complete, Failed, SuccessCriteriaMet, FailureTarget, Suspended
    status: str  # "True", "False", "Unknown"
    reason: NotRequired[str]
    message: NotRequired[str]


class JobStatus(TypedDict, total=False):
    """batch/v1 `JobStatus`."""

    active: int
    conditions: list[JobCondition]


class BatchJob(TypedDict, total=False):
    """batch/v1 `Job` (the pre-step's download)."""

    apiVersion: str
    kind: str
    metadata: ObjectMeta
    status: JobStatus

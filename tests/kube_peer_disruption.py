"""What the Kubernetes test peer does with an eviction, as pure rules after their sources (issue 36,
S5): the eviction subresource of a pod, and the disruption controller's status of the
PodDisruptionBudget it consults.

- the disruption controller (kubernetes v1.33 pkg/controller/disruption/disruption.go): the pods a
  budget selects in its namespace; with an integer `minAvailable` (and no `maxUnavailable`)
  `desiredHealthy` is that number and the expected count the pods found (getExpectedPodCount: no
  controller's scale is read); with a percentage or `maxUnavailable` it must read the scale of the
  pods' controllers, which not every job's pods have (a TrainJob's belong to batch Jobs, which have
  no scale subresource), so the status is left unobserved here (the real controller fails that sync
  and records a warning); `currentHealthy` counts the pods that are Ready and not being deleted
  (countHealthyPods); `disruptionsAllowed` is currentHealthy - desiredHealthy, never below 0, and 0
  without expected pods (updatePdbStatus). The peer computes it at each eviction, as a controller
  that had just synced would.
- the eviction subresource (pkg/registry/core/pod/storage/eviction.go, EvictionREST.Create): a pod
  that is Succeeded, Failed or Pending, or already being deleted, is deleted without a look at any
  budget (canIgnorePDB); more than one budget selecting the pod is a 500; none, a plain delete; a pod
  that is not Ready goes under `unhealthyPodEvictionPolicy: AlwaysAllow`, or under the default
  IfHealthyBudget when the budget is met (currentHealthy >= desiredHealthy > 0); otherwise
  checkAndDecrement: a status not yet observed is a 429 "still being processed", no disruption
  allowed is a 429 "Cannot evict pod as it would violate the pod's disruption budget." with a
  DisruptionBudget cause. An evicted pod gets the DisruptionTarget condition (reason
  EvictionByEvictionAPI: PodDisruptionConditions, GA in 1.31) before its deletion.
"""

from __future__ import annotations

from dataclasses import dataclass

TOO_MANY = "Cannot evict pod as it would violate the pod's disruption budget."
MANY_BUDGETS = (
    "This pod has more than one PodDisruptionBudget, which the eviction subresource does not "
    "support."
)


@dataclass(frozen=True)
class Refusal:
    """The API error an eviction gets (metav1.Status: code, reason, message, details.causes)."""

    code: int
    reason: str
    message: str
    causes: tuple[dict, ...] = ()


def ready(pod: dict) -> bool:
    """podutil.IsPodReady: the Ready condition is True."""
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _expression(expr: dict, labels: dict[str, str]) -> bool:
    key, op, values = expr["key"], expr["operator"], expr.get("values") or []
    if op == "In":
        return labels.get(key) in values
    if op == "NotIn":
        return labels.get(key) not in values
    return (key in labels) == (op == "Exists")  # Exists, DoesNotExist


def selects(budget: dict, pod: dict) -> bool:
    """The budget's label selector (metav1.LabelSelectorAsSelector) over the pod, same namespace;
    an empty selector in policy/v1 selects every pod of the namespace."""
    if budget["metadata"].get("namespace") != pod["metadata"].get("namespace"):
        return False
    selector = budget["spec"].get("selector") or {}
    labels = pod["metadata"].get("labels") or {}
    return all(labels.get(k) == v for k, v in (selector.get("matchLabels") or {}).items()) and all(
        _expression(e, labels) for e in selector.get("matchExpressions") or []
    )


def status(budget: dict, pods: list[dict]) -> dict | None:
    """The disruption controller's status of `budget` over the namespace's `pods`; None when it
    cannot compute one without a controller's scale (a percentage, or maxUnavailable)."""
    spec = budget["spec"]
    chosen = [p for p in pods if selects(budget, p)]
    if "maxUnavailable" in spec or not isinstance(spec.get("minAvailable"), int):
        return None
    desired, expected = spec["minAvailable"], len(chosen)
    healthy = sum(1 for p in chosen if ready(p) and not p["metadata"].get("deletionTimestamp"))
    allowed = healthy - desired if expected > 0 else 0
    return {
        "observedGeneration": budget["metadata"].get("generation", 1),
        "currentHealthy": healthy,
        "desiredHealthy": desired,
        "expectedPods": expected,
        "disruptionsAllowed": max(0, allowed),
    }


def can_ignore_budgets(pod: dict) -> bool:
    """canIgnorePDB: a finished or unscheduled pod, or one already being deleted."""
    phase = (pod.get("status") or {}).get("phase")
    return phase in ("Succeeded", "Failed", "Pending") or bool(
        pod["metadata"].get("deletionTimestamp")
    )


def eviction(pod: dict, budgets: list[dict], pods: list[dict]) -> Refusal | None:
    """None: the pod is evicted (deleted, with the DisruptionTarget condition); else why not."""
    if can_ignore_budgets(pod):
        return None
    mine = [b for b in budgets if selects(b, pod)]
    if len(mine) > 1:
        return Refusal(500, "InternalError", MANY_BUDGETS)
    if not mine:
        return None
    [budget] = mine
    now = status(budget, pods)
    name = budget["metadata"]["name"]
    if not ready(pod):
        if budget["spec"].get("unhealthyPodEvictionPolicy") == "AlwaysAllow":
            return None
        if now and now["currentHealthy"] >= now["desiredHealthy"] > 0:
            return None
    if now is None:
        cause = {
            "type": "DisruptionBudget",
            "message": f"The disruption budget {name} is still being processed by the server.",
        }
        return Refusal(429, "TooManyRequests", TOO_MANY, (cause,))
    if now["disruptionsAllowed"] == 0:
        cause = {
            "type": "DisruptionBudget",
            "message": f"The disruption budget {name} needs {now['desiredHealthy']} healthy pods and has "
            f"{now['currentHealthy']} currently",
        }
        return Refusal(429, "TooManyRequests", TOO_MANY, (cause,))
    return None


def evicted(pod: dict) -> dict:
    """The pod as addConditionAndDeletePod leaves it before the delete: a DisruptionTarget
    condition."""
    status_ = pod.setdefault("status", {})
    conditions = [c for c in status_.get("conditions") or [] if c.get("type") != "DisruptionTarget"]
    conditions.append(
        {
            "type": "DisruptionTarget",
            "status": "True",
            "reason": "EvictionByEvictionAPI",
            "message": "Eviction API: evicting",
        }
    )
    status_["conditions"] = conditions
    return pod

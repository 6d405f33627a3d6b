"""What the Kubernetes test peer has no process for, as pure rules after their sources (issue 27):
the kubelet's part of a stop request, and what the controllers make of the way a job's pods end, so
that a test can judge a sequence of pod exits as the real controllers would, without torchrun.

- the kubelet: a pod annotated `fsdpctl.io/stop` gets the annotation in its downward API file at its next
  sync; the trainer then saves and ends, and the pod's launcher exits as fsdptrain.disruption.pod_exit says
  (the trainer's own rule, imported, not restated);
- the Training Operator v1.9.4 (`pytorchjob`): workers under restartPolicy ExitCode (pods `Never`,
  pkg/core/pod.go SetRestartPolicy); a pod that exits 128-255 is deleted and recreated, 1-127 fails the job
  (pkg/controller.v1/common/pod.go, ReconcilePods; pkg/util/train/train_util.go, IsRetryableExitCode); with
  an elasticPolicy the job is Succeeded as soon as any worker succeeded (pkg/controller.v1/pytorch/
  pytorchjob_controller.go, UpdateJobStatus), and a finished job's still running pods are deleted under
  cleanPodPolicy Running (pkg/controller.v1/common/job.go, DeletePodsAndServices); backoffLimit counts the
  restarts of running containers only (pkg/core/job.go, PastBackoffLimit), none under ExitCode;
- Kubeflow Trainer v2.3.0 (`trainjob`): a JobSet whose one replicated Job runs the nodes as an Indexed batch
  Job with restartPolicy OnFailure (JobSet v0.12.0 pkg/webhooks/jobset_webhook.go defaults both) and the
  Job's default backoffLimit of 6. The Job fails once its failed pods exceed the limit, or the restarts of its
  running containers reach it (kubernetes pkg/controller/job/job_controller.go: `failed > *BackoffLimit`,
  pastBackoffLimitOnFailure); it completes when every index succeeded. The JobSet, with no failurePolicy
  (torch-distributed sets none), fails with its first failed Job (pkg/controllers/failure_policy.go,
  executeFailurePolicy) and completes when its Job does (successPolicy All).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from dataclasses import dataclass

from fsdptrain import disruption

STOP = disruption.STOP_ANNOTATION
JOB_BACKOFF_LIMIT = 6  # batch/v1 Job's default (k8s.io/api batch/v1 JobSpec.BackoffLimit)


# ---- the kubelet's part of a stop request ----------------------------------------------------------------


def stop_requested(pod: dict) -> bool:
    """A running pod carrying the stop annotation (its trainer has yet to act on it)."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    return STOP in annotations and (pod.get("status") or {}).get("phase") == "Running"


def after_stop_request(pod: dict) -> dict:
    """The pod once its trainer saw the request: its container terminated with the launcher's exit
    code."""
    code = disruption.pod_exit(0, signalled=False, note=None, stopping=True)
    done = copy.deepcopy(pod)
    status = done.setdefault("status", {})
    status["phase"] = "Succeeded" if code == 0 else "Failed"
    statuses = status.get("containerStatuses") or [{"name": "pytorch", "restartCount": 0}]
    for c in statuses:
        c["state"] = {
            "terminated": {"exitCode": code, "reason": "Completed" if code == 0 else "Error"}
        }
    status["containerStatuses"] = statuses
    return done


# ---- the controllers -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class End:
    """One container of node `node` ended with `code`; `evicted`: its pod was evicted (deleted), so
    it is not restarted in place whatever the restart policy."""

    node: int
    code: int
    evicted: bool = False


@dataclass(frozen=True)
class Outcome:
    phase: str  # Running (not decided yet), Succeeded or Failed
    reason: str  # the controller's condition message, one line
    recreated: int = (
        0  # pods the controller made again (PyTorchJob) / failed pods counted (TrainJob)
    )


def pytorchjob(ends: Iterable[End], nodes: int, *, elastic: bool = True) -> Outcome:
    """The Training Operator's verdict on a PyTorchJob of `nodes` Workers (restartPolicy ExitCode)
    after these container ends, in order."""
    succeeded, recreated = set(), 0
    for end in ends:
        if end.code == 0:
            succeeded.add(end.node)
            if (
                elastic or len(succeeded) == nodes
            ):  # UpdateJobStatus: any worker, with an elasticPolicy
                why = f"PyTorchJob successfully completed (worker {end.node} exited 0)"
                return Outcome("Succeeded", why, recreated)
        elif end.code >= 128:  # IsRetryableExitCode: the pod is deleted and made again
            recreated += 1
        else:
            return Outcome(
                "Failed",
                f"worker {end.node} exited {end.code}: a non-retryable exit code fails the job",
                recreated,
            )
    return Outcome("Running", "", recreated)


def trainjob(ends: Iterable[End], nodes: int, *, backoff_limit: int = JOB_BACKOFF_LIMIT) -> Outcome:
    """The batch Job's (and so the JobSet's and the TrainJob's) verdict after these container ends,
    in order: a container that fails restarts in place (OnFailure) and counts one restart, an
    evicted pod counts one failed pod and is made again."""
    done, failed_pods, restarts = set(), 0, 0
    for end in ends:
        if end.code == 0 and not end.evicted:
            done.add(end.node)
            if len(done) == nodes:
                return Outcome(
                    "Succeeded", "TrainJob complete: every node's index succeeded", failed_pods
                )
            continue
        if end.evicted:
            failed_pods += 1
        else:
            restarts += 1
        if failed_pods > backoff_limit or (
            restarts >= backoff_limit if backoff_limit else restarts > 0
        ):
            return Outcome(
                "Failed",
                f"BackoffLimitExceeded: {failed_pods} failed pods and {restarts} container restarts against "
                f"backoffLimit {backoff_limit} (the JobSet fails with its child Job)",
                failed_pods,
            )
    return Outcome("Running", "", failed_pods)

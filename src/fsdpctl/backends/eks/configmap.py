"""The run record as the cluster keeps it (BACKEND=eks): the job's record-hash annotation, the
ConfigMap <job>-record owned by the job, and the image digest its pods report, merged back into
it."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, cast

from fsdpctl.job import validate
from fsdpctl.job.record import RunRecord
from fsdpctl.job.record_view import env_text

# ---- on a cluster: the job's annotation and the ConfigMap <job>-record ---------------------------

ANNOTATION = "fsdpctl.io/record-hash"


# "The data stored in a ConfigMap cannot exceed 1 MiB"
# (kubernetes.io/docs/concepts/configuration/configmap): the manifests, the largest part, are left
# out of a record that would not fit, and the ConfigMap says so
CONFIG_MAP_MAX_BYTES = 1024 * 1024


METADATA_ROOM = 16 * 1024  # labels, annotations, ownerReferences: the rest of the object


def config_map_name(job: str) -> str:
    return f"{job}-record"


def annotated(job: dict[str, Any], rec: RunRecord) -> dict[str, Any]:
    """The job object carrying its record's hash (what `job describe` checks the ConfigMap
    against)."""
    meta = job["metadata"]
    return {
        **job,
        "metadata": {
            **meta,
            "annotations": {**meta.get("annotations", {}), ANNOTATION: rec["hash"]},
        },
    }


def config_map(rec: RunRecord, namespace: str) -> dict[str, Any]:
    """The ConfigMap holding `rec`: record.json (without the manifests), settings.env,
    manifests.yaml."""
    body = {k: v for k, v in rec.items() if k != "manifests"}
    data = {
        "record.json": json.dumps(body, indent=1, sort_keys=True, default=str),
        "settings.env": env_text(rec),
        "manifests.yaml": rec.get("manifests") or "",
    }
    size = sum(len(k) + len(v.encode()) for k, v in data.items())
    if size > CONFIG_MAP_MAX_BYTES - METADATA_ROOM:
        del data["manifests.yaml"]
        data["manifests.note"] = (
            f"left out: the record with its manifests is {size} bytes, over a ConfigMap's 1 MiB; "
            "`fsdpctl job describe` on the machine that started the run shows them"
        )
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": config_map_name(rec["job"]),
            "namespace": namespace,
            "labels": {
                "app.kubernetes.io/managed-by": "fsdpctl",
                "fsdpctl.io/record-of": rec["job"],
                "fsdpctl.io/run-id": validate.label_value(rec["run_id"]),
            },
            "annotations": {ANNOTATION: rec["hash"]},
        },
        "data": data,
    }


def from_config_map(cm: Mapping[str, Any]) -> RunRecord:
    """The record a ConfigMap holds (ValueError when it holds none). Not checked here: its reader
    (observe.record_of) names what record.problem finds wrong with it."""
    data = cm.get("data") or {}
    rec = json.loads(data.get("record.json", "null"))
    if not isinstance(rec, dict):
        raise ValueError("no record.json")
    return cast(RunRecord, {**rec, "manifests": data.get("manifests.yaml")})


# ---- what a run's log and pods add ---------------------------------------------------------------

DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


def image_digest(pods: Sequence[Mapping[str, Any]], container: str) -> tuple[str, str] | None:
    """(digest, pod) from the first pod whose `container` reports one: the kubelet's
    status.containerStatuses[].imageID is the image the runtime actually pulled (e.g.
    `<registry>/<repo>@sha256:...`, or `docker-pullable://...@sha256:...` under dockershim),
    whatever tag the pod spec named."""
    for pod in pods:
        for status in pod.get("status", {}).get("containerStatuses") or []:
            found = DIGEST.search(str(status.get("imageID") or ""))
            if status.get("name") == container and found:
                return found.group(0), pod["metadata"]["name"]
    return None


def with_digest(rec: RunRecord, found: tuple[str, str] | None) -> RunRecord:
    image = rec.get("image")
    if found is None or image is None or image.get("digest"):
        return rec
    digest_, pod = found
    return {**rec, "image": {**image, "digest": digest_, "digest_from": f"pod {pod} status"}}

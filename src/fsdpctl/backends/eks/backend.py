"""The EKS backend: PyTorchJob or TrainJob on the cluster of the kubeconfig, through `engine` and
the Kubernetes adapter. Connects on first use, so building one costs nothing."""

from __future__ import annotations

import shlex
import shutil
import time
from collections.abc import Callable, Iterator
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from fsdpctl.backends import PLACEMENT_KEYS, KeptRecord, LogLine, Started, Submitted, placement_ok
from fsdpctl.backends.eks import api, configmap, engine, observe, owned
from fsdpctl.cluster import deploy_status
from fsdpctl.errors import ExitCode, FsdpctlError
from fsdpctl.job import home, kstatus, listing, lock, owner, record, render, state
from fsdpctl.job import spec as jobspec
from fsdpctl.job import store as record_store
from fsdpctl.job.hf_token import secret_env
from fsdpctl.job.outage import Outage
from fsdpctl.job.owner import Owner
from fsdpctl.job.progress import run_outcome
from fsdpctl.job.protocol import refuse
from fsdpctl.job.record import RunRecord
from fsdpctl.job.reports import FINAL, TIMEOUT, GpuNode, Report, Waited
from fsdpctl.job.state import Keys
from fsdpctl.plan import nodefit
from fsdpctl.settings import Config
from fsdptrain import events

if TYPE_CHECKING:
    from fsdpctl.job.kube_shapes import Node


def _placement_value(key: str) -> Callable[[Any], bool]:
    """A placement setting as the settings take it (it goes into API paths and kubeconfig
    lookups)."""
    return lambda v: isinstance(v, str) and placement_ok({"backend": EksBackend.name, key: v})


# what a cluster job's state records besides the core's keys: where on the cluster it lives
STATE = Keys(optional={k: _placement_value(k) for k in PLACEMENT_KEYS})


class EksBackend:
    name = "eks"
    poll_s = 2.0
    keeps_state = False  # the cluster keeps its jobs; `list` shows those started from anywhere
    supervised = False

    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.notes: list[str] = []  # what cleanup kept of this home's records of cluster jobs

    @cached_property
    def kube(self) -> Any:
        return api.connect(self.cfg)

    def refusals(self) -> list[str]:
        """An image with no registry (a bare name is pulled from Docker Hub, where the trainer
        image is not: ImagePullBackOff), a token file that is not one token."""
        cfg, lines = self.cfg, []
        if not cfg.registry:
            lines.append(
                f"the job's image {cfg.image_uri!r} has no registry: its pods would look for it on "
                "Docker Hub and stay in ImagePullBackOff; set AWS_ACCOUNT_ID (its ECR in AWS_REGION, "
                "where `fsdpctl image push` puts it) or IMAGE_REGISTRY"
            )
        try:  # its contents (whether it exists is the settings' own check)
            if Path(cfg.hf_token_file).expanduser().is_file():
                secret_env(cfg)
        except FsdpctlError as e:
            lines.append(str(e))
        return lines

    def dry_run(self, *, run_id: str, server: bool) -> Started:
        """Client: what would be sent, the cluster not contacted. Server: every object sent with
        dryRun=All, which the API server admits or refuses as it would, storing nothing."""
        cfg = self.cfg
        refuse(self.refusals())
        objs = [*render.render_job(cfg, run_id), render.render_secret(cfg, "", run_id)]
        if not server:
            lines = [f"{o['kind']}/{o['metadata']['name']}" for o in objs]
            return Started(cfg.job_name, run_id, f"{len(lines)} objects would be sent", lines, objs)
        token = secret_env(cfg).get("HF_TOKEN", "")
        started = engine.run(
            self.kube, cfg, run_id=run_id, replace=False, token=token, server_dry_run=True
        )
        lines = [*started["objects"], f"Secret/{render.secret_name(cfg)}"]
        unchecked = self.kube.unchecked
        where = f"the API server accepted {len(lines) - len(unchecked)} objects" + (
            f" ({len(unchecked)} not checkable before their namespace exists: {', '.join(unchecked)})"
            if unchecked
            else ""
        )
        return Started(cfg.job_name, started["run_id"], where, lines, objs)

    def prepare(self, record: RunRecord) -> RunRecord:
        refuse(self.refusals())
        return record

    def submit(self, *, run_id: str, record: RunRecord, replace: bool) -> Submitted:
        """Namespace, Secret, the job and what it owns (the pre-step, the budget, the ConfigMap of
        its record). The record as the cluster got it comes back (with its manifests)."""
        cfg = self.cfg
        token = secret_env(cfg).get("HF_TOKEN", "")
        started = engine.run(
            self.kube, cfg, run_id=run_id, replace=replace, token=token, record=record
        )
        what = f"{cfg.job_kind} {cfg.job_namespace}/{cfg.job_name}"
        return Submitted(
            state={},
            record=started["record"],
            where=f"{cfg.job_kind} in namespace {cfg.job_namespace} on {self.kube.server}",
            outside=what,
            cancel_command=f"kubectl -n {cfg.job_namespace} delete {cfg.job_kind} {cfg.job_name}",
        )

    def find_submitted(self, mine: Owner) -> Submitted | None:
        """The job object that carries the run's submit token (fsdpctl.io/submit, selected by the
        API server) and this run's home, whatever the submit said. A submit killed between the job
        and its Secret left a job whose pods would find no token: the Secret is made now, owned by
        it."""
        cfg = self.cfg
        api_version, kind = render.job_api(cfg)
        with api.calls(cfg, f"looking for run {mine.run_id} of job {mine.job}"):
            found = [
                j
                for j in self._jobs_with(api_version, kind, {owner.TOKEN_LABEL: mine.token})
                if owner.why_not_ours(owned.mark(j), mine.home, mine.job, mine.token) is None
                and j["metadata"]["name"] == mine.job
            ]
            if not found:
                return None
            if self.kube.get("v1", "Secret", render.secret_name(cfg), cfg.job_namespace) is None:
                token = secret_env(cfg).get("HF_TOKEN", "")
                secret = owned.stamped(render.render_secret(cfg, token, mine.run_id), mine)
                self.kube.apply(api.owned_by(secret, {**found[0], "kind": kind}))
        return Submitted(
            state={},
            record=record_store.new(cfg, mine.run_id),
            where=f"{kind} in namespace {cfg.job_namespace} on {self.kube.server}",
            outside=f"{kind} {cfg.job_namespace}/{mine.job}",
            cancel_command=f"kubectl -n {cfg.job_namespace} delete {cfg.job_kind} {mine.job}",
        )

    def _jobs_with(self, api_version: str, kind: str, labels: dict[str, str]) -> list[render.Obj]:
        """The job objects with these labels; none where the cluster serves no such kind (its CRD
        is missing: no job of it can exist), an error for any other failure."""
        from fsdpctl.adapters.kube import KubeError

        try:
            return self.kube.list(api_version, kind, self.cfg.job_namespace, labels)
        except KubeError as e:
            if e.status == 404 and "namespace" not in e.message.lower():
                return []
            raise

    def cancel(self, submitted: Submitted) -> None:
        """The job deleted with its pods first (foreground): it never got to train unrecorded. Only
        this home's job (found by its labels), by its UID."""
        engine.cancel(self.kube, self.cfg, self.cfg.job_name)

    def report(self, name: str, stall_after: float = float("inf")) -> Report:
        try:
            r = observe.report(self.kube, self.cfg, name, stall_after)
        except FsdpctlError as e:  # a job `job stop` deleted is Stopped, as on every backend
            if e.code == ExitCode.JOB_NOT_FOUND and (st := self._stopped_here(name)) is not None:
                return listing.stopped_report(st, self.cfg.job_nodes)
            raise
        if r["phase"] not in FINAL:  # an ended job's pods hold no devices; its nodes may be gone
            r["gpu_nodes"] = self.gpu_nodes(name)
            if r["gpu_nodes"] is not None:
                selector = render.node_selector(self.cfg)
                r["problems"] += nodefit.node_problems(r["gpu_nodes"], selector)
        return r

    def gpu_nodes(self, name: str) -> list[GpuNode] | None:
        """The GPU nodes the job's pods run on or wait for, each with whether the device plugins
        made the GPUs and EFA interfaces a pod asks for allocatable (deploy status's per-node rows,
        narrowed to the job). None where this identity may not list nodes (they are cluster-scoped:
        RBAC often says no)."""
        from fsdpctl.adapters.kube import KubeError

        pods = observe.pods_of(self.kube, self.cfg, name)
        try:
            # the API server's Node list, parsed JSON: the fields read from it are Node's
            nodes = cast("list[Node]", self.kube.list("v1", "Node"))
        except KubeError as e:
            if e.status in (401, 403):
                return None
            with api.calls(self.cfg, "listing nodes"):
                raise
        mine = nodefit.job_nodes(nodes, pods, render.node_selector(self.cfg))
        limits = render.pod_resources(jobspec.resources(self.cfg))[1]
        wants = nodefit.device_requests(pods) or {
            r: int(n) for r, n in limits.items() if r in kstatus.PLUGIN_OF
        }
        rows = deploy_status.node_rows(mine, efa="vpc.amazonaws.com/efa" in wants)
        return nodefit.gpu_node_fit(rows, mine, wants, pods)

    def logs(
        self,
        name: str,
        *,
        follow: bool,
        all_: bool,
        node: int | None,
        pod: str | None,
        tail: int | None = None,
        since_s: float | None = None,
        keep: Callable[[LogLine], bool] | None = None,
    ) -> Iterator[LogLine]:
        if node is not None:
            pod = f"{name}-worker-{node}" if self.cfg.job_kind == "pytorchjob" else None
            if pod is None:
                raise FsdpctlError(
                    "--node applies to PyTorchJob pods", hint="use --pod NAME (see job status)"
                )
        return observe.logs(
            self.kube,
            self.cfg,
            name,
            follow=follow,
            pod=pod,
            all_pods=all_,
            tail=tail,
            since_s=since_s,
            keep=keep,
        )

    def tail(self, name: str, lines: int) -> list[str]:
        leader = self.report(name).get("leader")
        return observe.log_lines(self.kube, self.cfg, leader, tail=lines) if leader else []

    def history(self, name: str) -> list[events.Event]:
        return observe.leader_events(self.kube, self.cfg, name)

    def outcomes(self, name: str) -> dict[str, str]:
        """The current run's only: the pods of earlier runs went with their jobs."""
        r = self.report(name)
        return {r["run_id"]: run_outcome(self.history(name), r["phase"])}

    def tensorboard_dir(self, name: str) -> str | None:
        """As the job on the cluster has it (its pods' TENSORBOARD_DIR), whatever the settings say
        now."""
        env = observe.container_env(api.require_job(self.kube, self.cfg, name))
        return env.get("TENSORBOARD_DIR") or None

    def tensorboard_elsewhere(self, name: str, argv: list[str]) -> list[str] | None:
        """The event files live on the claim the pods mount; this machine has no view of it. The
        honest way there: TensorBoard in a pod that mounts the claim, reached through a
        port-forward."""
        cfg, port = self.cfg, argv[-1]
        return [
            f"# the events are on PersistentVolumeClaim {cfg.shared_volume or '-'} (mounted at "
            f"{cfg.shared_volume_path} in the job's pods); serve them from a pod that mounts it, e.g. the "
            "job's image:",
            f"#   in that pod: {shlex.join([*argv, '--bind_all'])}",
            f"kubectl -n {cfg.job_namespace} port-forward pod/<that pod> {port}:{port}",
            f"# then open http://localhost:{port}/ (or copy the directory off the volume and run "
            "`tensorboard --logdir` here)",
        ]

    def run_lines(self, job: str, run_id: str) -> list[str] | None:
        """The leader pod's log when the cluster's job is that run: its pods keep their logs for as
        long as they exist (the kubelet serves pods/log; cleanPodPolicy Running keeps the finished
        ones), and an earlier run's went with its job. None otherwise, or when the cluster does not
        answer."""
        try:
            with api.calls(self.cfg, f"reading the leader's log of {job}"):
                found = api.get_job(self.kube, self.cfg, job)
                labels = (found or {}).get("metadata", {}).get("labels") or {}
                if found is None or labels.get("fsdpctl.io/run-id") != run_id:
                    return None
                pods = observe.pods_of(self.kube, self.cfg, job)
                lead, _ = observe.find_leader(self.kube, self.cfg, pods)
                if lead is None:
                    return None
                return observe.log_lines(self.kube, self.cfg, lead["metadata"]["name"], tail=None)
        except FsdpctlError:
            return None

    def here(self, path: str) -> str | None:
        return None  # on the claims only pods mount

    def kept_record(self, job: str) -> KeptRecord | None:
        rec, lines, problems = observe.record_of(self.kube, self.cfg, job)
        if rec is None:
            return None
        where = f"ConfigMap {self.cfg.job_namespace}/{configmap.config_map_name(job)} on {self.kube.server}"
        return KeptRecord(rec, lines, where, problems)

    def stop(
        self, name: str, *, wait: bool, dry_run: bool, say: Callable[[str], None] | None = None
    ) -> str:
        job = api.get_job(self.kube, self.cfg, name)
        if job is None:
            return f"no job {name} in {self.cfg.job_namespace}; nothing to stop"
        with api.calls(self.cfg, f"stopping job {name}"):
            owned.check(job, self.cfg, name)  # a foreign job is refused, nothing changed
        if (phase := kstatus.phase(job)) in FINAL:
            # how it ended is the user's record: the object and its outcome stay as they are
            return f"job {name} is not running ({phase}); nothing to stop"
        if dry_run:
            return f"dry run: would delete {job['kind']} {name} (pods get SIGTERM and checkpoint)"
        if wait and say is not None:
            say(
                f"deleting {job['kind']} {name}: waiting for its pods to checkpoint and end (foreground)"
            )
        run_id = (job["metadata"].get("labels") or {}).get("fsdpctl.io/run-id")
        engine.stop(
            self.kube,
            self.cfg,
            name,
            wait=wait,
            uid=job["metadata"]["uid"],
            before_delete=(lambda: self._keep_its_end(name, run_id)) if run_id else None,
        )
        return f"job {name}: {'stopped and deleted' if wait else 'stopping'}"

    def _keep_its_end(self, name: str, run_id: str) -> None:
        """The stopped run's record learns what only its pods' logs hold (its trainer's start line,
        its losses, its world changes) and that it ended Stopped, before the delete takes the logs:
        else `job history` could only say "unknown: its output is gone" (a stop between worlds
        logs no summary either). A run this home did not record, or logs the cluster does not
        serve, leave the record as it is: the stop goes on."""
        where = record_store.path(name, run_id)
        lines = self.run_lines(name, run_id)
        if lines is None or not where.exists():
            return
        try:
            rec = record_store.read(where)
        except FsdpctlError:  # a damaged record is named by the verbs that read it
            return
        now = record.learnt(rec, lines)
        if not now.get("outcome"):
            now = record.at_its_end(now, run_outcome(list(events.parse(lines)), "Stopped"), lines)
        if now != rec:
            try:
                record_store.keep(now)
            except (FsdpctlError, OSError):  # a full or read-only home: the stop goes on
                return

    def interrupt(self, name: str) -> Report | None:
        """Ctrl-C while following a cluster job detaches: the job is the cluster's, it keeps
        running."""
        return None

    def list_jobs(self) -> list[Report]:
        rows = observe.list_jobs(self.kube, self.cfg)
        return [{**r, "labels": {**r["labels"], "fsdpctl.io/backend": "eks"}} for r in rows]

    def wait(
        self, name: str, timeout: float | None, say: Callable[[str], None] | None = None
    ) -> Waited:
        """Until the job ends or `timeout` passes. An API server that does not answer, or answers
        with an error (restarting, behind a proxy), is waited out for a bounded outage (job.outage):
        that is not the job's end. A job that is gone is not found (exit 4)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        said = ""
        away = Outage(self.cfg.request_timeout)
        while True:
            left = None if deadline is None else max(0.01, deadline - time.monotonic())
            began = time.monotonic()
            try:
                return engine.wait(self.kube, self.cfg, name, left)
            except FsdpctlError as e:
                if e.code == ExitCode.JOB_NOT_FOUND:
                    raise
                # a watch that streamed for longer than a few requests' deadlines had answers
                if time.monotonic() - began > 3 * self.cfg.request_timeout:
                    away.answered()
                away.unanswered(str(e))
                if say is not None and str(e) != said:
                    said = str(e)
                    say(f"no answer about job {name}, still waiting: {said}")
            if deadline is not None and time.monotonic() >= deadline:
                return TIMEOUT
            time.sleep(self.poll_s)

    def cleanup(
        self, *, checkpoints: bool, dry_run: bool, job: str | None = None, force: bool = False
    ) -> list[str]:
        """The cluster's ended jobs and what they left (engine.cleanup), then their state in this
        home (its directory, derived from the job's name). `force` changes nothing here: the
        cluster answers whether a job ended (an unanswered one is kept)."""
        done = engine.cleanup(
            self.kube, self.cfg, checkpoints=checkpoints, dry_run=dry_run, only=job
        )
        _, kind = render.job_api(self.cfg)
        # each line: "Kind/name (owner: ...)"
        for name in [d.partition("/")[2].split(" ")[0] for d in done if d.startswith(f"{kind}/")]:
            done += self._forget(name, dry_run=dry_run)
        return done

    def _stopped_here(self, name: str) -> state.JobState | None:
        """This home's state of job `name` when it is this backend's and fsdpctl stopped it."""
        try:
            st = state.read(home.job_dir(name))
        except state.Damaged:
            return None
        if st is None or state.backend_of(st) != self.name or not st.get("stop_requested"):
            return None
        return st

    def _forget(self, name: str, *, dry_run: bool) -> list[str]:
        """An ended cluster job's state in this home, when it is one of this backend's (the
        directory is derived from the name; another backend's job of that name is left alone)."""
        jdir = home.job_dir(name)
        try:
            st = state.read(jdir)
            if st is None or state.backend_of(st) != self.name:
                return []
            with lock.held(jdir, wait_s=0, create=False):
                if not dry_run:
                    shutil.rmtree(jdir)
        except (state.Damaged, lock.Busy, lock.CorruptLock) as e:
            self.notes.append(f"{e}: kept")
            return []
        return [str(jdir)]

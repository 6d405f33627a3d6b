"""fsdpctl deploy etcd|operator|plugins|storage|monitoring|all|status|fetch: what the cluster needs
before a job runs (the components, the diff, the readiness wait and the cache are
`fsdpctl.cluster.deploy`'s)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NotRequired, TypedDict

import typer

from fsdpctl.cli.common import (
    DryRunOpt,
    Output,
    OutputOpt,
    ServerDryRunOpt,
    command_group,
    dry_run_mode,
    emit,
    err,
    finite,
    ok,
    out,
    state,
    warn,
)
from fsdpctl.cli.tables import PlainTable, styled
from fsdpctl.errors import BadInput

if TYPE_CHECKING:
    from fsdpctl.adapters.kube import Kube
    from fsdpctl.cluster.deploy import ApplyCounts, Component

app = command_group(
    "Install etcd, the job operator (PyTorchJob v1 or TrainJob v2), the device plugins, the FSx CSI driver "
    "and monitoring on the cluster."
)

FromOpt = Annotated[
    Path | None,
    typer.Option(
        "--from", envvar="FSDPCTL_MANIFESTS", help="mirror directory of the pinned upstream files"
    ),
]
TimeoutOpt = Annotated[
    float,
    typer.Option("--timeout", help="seconds to wait until everything is ready", callback=finite()),
]


def sources(mirror: Path | None) -> list[Path]:
    """Where the pinned upstream files are looked for: --from (FSDPCTL_MANIFESTS), which must be a
    directory (a typo would otherwise read as "the file is not in it"), then FSDPCTL_HOME/manifests
    (`deploy fetch` fills it)."""
    from fsdpctl.files import home, kind_of

    if mirror is not None and not mirror.is_dir():
        what = kind_of(mirror)
        raise BadInput(
            f"--from {mirror} "
            + ("does not exist" if what == "missing" else f"is {what}, not a directory"),
            hint="name the mirror directory (FSDPCTL_MANIFESTS), or drop --from to use what "
            "`fsdpctl deploy fetch` put in FSDPCTL_HOME/manifests",
        )
    return [p for p in (mirror, home() / "manifests") if p is not None]


def _deploy(
    ctx: typer.Context,
    which: str,
    dry_run: str,
    mirror: Path | None,
    timeout: float,
    output: Output,
) -> None:
    """`dry_run`: '' (apply, wait), 'client' (print the objects) or 'server' (the API server checks
    them). With -o json/yaml stdout gets one document (docs/reference/output.md), the messages stay
    on stderr."""
    from fsdpctl.backends.eks import api
    from fsdpctl.cluster import deploy, deploy_status
    from fsdpctl.job import render

    cfg = state(ctx).config()
    comps = deploy.components(cfg, which, sources(mirror))
    report: list[DeployRow] = []
    mode = dry_run or "none"  # kubectl's --dry-run values: none, client, server
    if dry_run == "client":
        objs = [o for c in comps for o in c.objects]
        rows: list[DeployRow] = [{**_row(c), "objects": c.objects} for c in comps]
        if not emit(_document(mode, rows), output):
            out.print(render.to_yaml(objs), markup=False, end="")
        ok(f"dry run (client): {len(objs)} objects; nothing sent")
        return
    kube = api.connect(cfg)
    for comp in comps:
        with api.calls(cfg, f"deploying {comp.name}"), err.status(f"applying {comp.name} ..."):
            counts = deploy.apply(kube, comp, server_dry_run=dry_run == "server")
        if dry_run == "server":
            ok(
                f"{comp.name} ({comp.version}): {_dry_run_verdict(len(comp.objects), kube.unchecked)}"
            )
            report.append({**_row(comp, counts), "unchecked": list(kube.unchecked)})
            kube.unchecked.clear()
            continue
        ok(f"{comp.name} ({comp.version}): {deploy.summary(counts)}")
        _wait_ready(kube, comp, comp.ready, timeout)
        missing, present = deploy_status.requirements(kube, comp)
        for req in missing:
            warn(deploy_status.missing_message(comp, req))
        if present:
            _wait_ready(kube, comp, present, timeout)
        missing_messages = [deploy_status.missing_message(comp, r) for r in missing]
        report.append({**_row(comp, counts), "ready": True, "missing": missing_messages})
    emit(_document(mode, report), output)


class DeployRow(TypedDict):
    """A component in the document of `deploy <component> -o json|yaml` (`components`): the
    client dry run gives its objects, the server dry run what the API server would do and which
    objects it could not check, a real deploy what it did and what is missing."""

    component: str
    version: str
    # the component's manifests as the pinned upstream files hold them (CRDs, Deployments, RBAC,
    # ...: any kind), parsed and passed through
    objects: NotRequired[list[dict[str, Any]]]
    created: NotRequired[int]
    configured: NotRequired[int]
    unchanged: NotRequired[int]
    unchecked: NotRequired[list[str]]  # server dry run: Kind/name of objects not checkable yet
    ready: NotRequired[bool]
    missing: NotRequired[list[str]]  # what must be installed by other means


class DeployDocument(TypedDict):
    """`deploy <component> -o json|yaml`."""

    dry_run: str  # none | client | server
    components: list[DeployRow]


def _row(comp: Component, counts: ApplyCounts | None = None) -> DeployRow:
    """The component's name and version, then what the apply counted (in ApplyCounts' order)."""
    row: DeployRow = {"component": comp.name, "version": comp.version}
    return {**row, **counts} if counts is not None else row


def _document(dry_run: str, components: list[DeployRow]) -> DeployDocument:
    return {"dry_run": dry_run, "components": components}


def _dry_run_verdict(total: int, unchecked: list[str]) -> str:
    """What a server dry run proved: objects whose namespace or CRD the same dry run 'created' were
    not checked (the server creates nothing in a dry run, kubernetes/kubernetes#83562)."""
    checked = f"{total - len(unchecked)} objects accepted by the API server (dry run)"
    if not unchecked:
        return checked
    later = ", ".join(unchecked)
    return (
        f"{checked}; {len(unchecked)} not checkable before their namespace or CRD exists: {later}"
    )


def _wait_ready(kube: Kube, comp: Component, refs: list[dict], timeout: float) -> None:
    from fsdpctl.cluster import deploy

    with err.status(f"waiting for {comp.name} to be ready ...") as spinner:
        deploy.wait_ready(
            kube,
            comp.name,
            refs,
            timeout,
            on_wait=lambda n: spinner.update(f"waiting for {comp.name}: {n} not ready yet"),
        )
    ok(f"{comp.name} ready")


HELP = {
    "etcd": "etcd (pinned v3.5, v2 API on) in JOB_NAMESPACE for RDZV_BACKEND=etcd|etcd-v2.\n\n"
    "Example: fsdpctl deploy etcd",
    "operator": "The job operator: Training Operator v1.9.4 (JOB_KIND=pytorchjob) or Trainer v2.3.0 CRDs + "
    "runtimes (JOB_KIND=trainjob), from the pinned, sha256-checked release files.\n\n"
    "Example: fsdpctl deploy operator --from ./mirror",
    "plugins": "The NVIDIA and EFA device plugins (eksctl v0.230.0's manifests, sha256-checked), tolerating "
    "the GPU taint; on eksctl clusters they patch eksctl's own DaemonSets, on terraform clusters they create "
    "them.\n\n"
    "Example: fsdpctl deploy plugins --from ./mirror",
    "storage": "The FSx for Lustre CSI driver v1.9.0 (aws-fsx-csi-driver chart 1.17.0's kustomize base, "
    "sha256-checked) and, when FSX_FILE_SYSTEM_ID is set, a static PersistentVolume of that file system "
    "(FSX_DNS_NAME, FSX_MOUNT_NAME) and the SHARED_VOLUME claim in JOB_NAMESPACE bound to it.\n\n"
    "Example: fsdpctl deploy storage --from ./mirror",
    "monitoring": "DCGM exporter, Prometheus, Grafana (with fsdpctl's dashboard), htop and nvtop.\n\n"
    "Example: fsdpctl deploy monitoring --dry-run=server",
    "all": "etcd, the operator, the device plugins, storage and monitoring, in that order.\n\n"
    "Example: fsdpctl deploy all --timeout 900",
}
DRY_RUN_NOTE = (
    "\n\n--dry-run prints the objects and sends nothing; --dry-run=server has the API server validate and "
    "admit them, storing nothing."
)


def _component_command(which: str) -> Any:
    def command(
        ctx: typer.Context,
        dry_run: DryRunOpt = False,
        server_dry_run: ServerDryRunOpt = False,
        mirror: FromOpt = None,
        timeout: TimeoutOpt = 600,
        output: Output = OutputOpt,
    ) -> None:
        _deploy(ctx, which, dry_run_mode(dry_run, server_dry_run), mirror, timeout, output)

    summary, example = HELP[which].split("\n\n")
    command.__doc__ = summary + DRY_RUN_NOTE + "\n\n" + example
    return command


for _which in HELP:
    app.command(_which)(_component_command(_which))


@app.command()
def status(ctx: typer.Context, output: Output = OutputOpt) -> None:
    """What is installed, at which version, and whether it is ready.

    Example: fsdpctl deploy status -o json
    """
    from fsdpctl.backends.eks import api
    from fsdpctl.cluster import deploy_status

    cfg = state(ctx).config()
    kube = api.connect(cfg)
    with api.calls(cfg, "reading what is deployed"):
        rows = deploy_status.status(kube, cfg)
    if emit(rows, output):
        return
    t = PlainTable("component", "object", "namespace", "installed", "version", "ready")
    for r in rows:
        installed = "yes" if r["installed"] else styled("no", "red")
        ready = styled("yes", "green") if r["ready"] else styled("no", "yellow")
        t.add_row(r["component"], r["object"], r["namespace"], installed, r["version"], ready)
    out.print(t)


@app.command()
def fetch(ctx: typer.Context, dry_run: DryRunOpt = False, output: Output = OutputOpt) -> None:
    """Download the pinned release files that upstream publishes as single files into the cache,
    checking each sha256; the others are named with the command that renders them. --dry-run: what
    is cached and what would be downloaded, nothing fetched.

    Example: fsdpctl deploy fetch
    """
    from fsdpctl.cluster import deploy
    from fsdpctl.files import home

    files: list[dict[str, str]] = []

    def said(path: str, outcome: str) -> None:
        files.append({"path": path, "outcome": outcome})
        if outcome == deploy.UNPUBLISHED:
            warn(
                f"{path}: upstream has no single file; render it into a mirror (templates/releases.yaml)"
            )
        else:
            word = {deploy.CACHED: "cached", deploy.WOULD_FETCH: "would be fetched"}
            ok(f"{path}: {word.get(outcome, 'fetched and verified')}")

    deploy.fetch(home() / "manifests", said, dry_run=dry_run)
    emit({"dry_run": "client" if dry_run else "none", "files": files}, output)

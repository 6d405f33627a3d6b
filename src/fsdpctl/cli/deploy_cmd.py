"""fsdpctl deploy etcd|operator|monitoring|all|status|fetch: what the cluster needs before a job runs."""

from __future__ import annotations

import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from fsdpctl.cli.common import Output, OutputOpt, emit, err, ok, out, state, warn
from fsdpctl.errors import BadInput, FsdpctlError

app = typer.Typer(
    no_args_is_help=True,
    rich_markup_mode=None,
    help="Install etcd, the job operator (PyTorchJob v1 or TrainJob v2) and monitoring on the cluster.",
)

DryRunOpt = Annotated[
    str | None,
    typer.Option(
        "--dry-run", help="client: print the objects; server: the API validates them, nothing is stored"
    ),
]
FromOpt = Annotated[
    Path | None,
    typer.Option("--from", envvar="FSDPCTL_MANIFESTS", help="mirror directory of the pinned upstream files"),
]
TimeoutOpt = Annotated[float, typer.Option("--timeout", help="seconds to wait until everything is ready")]


def sources(mirror: Path | None) -> list[Path]:
    from fsdpctl.adapters.local import home

    return [p for p in (mirror, home() / "manifests") if p is not None]


def _deploy(ctx: typer.Context, which: str, dry_run: str | None, mirror: Path | None, timeout: float) -> None:
    from fsdpctl import deploy, kjobs, render

    if dry_run not in (None, "client", "server"):
        raise BadInput(f"--dry-run={dry_run!r}: use client or server")
    cfg = state(ctx).config()
    comps = deploy.components(cfg, which, sources(mirror))
    if dry_run == "client":
        out.print(render.to_yaml([o for c in comps for o in c.objects]), markup=False, end="")
        ok(f"dry run (client): {sum(len(c.objects) for c in comps)} objects; nothing sent")
        return
    kube = kjobs.connect(cfg)
    for comp in comps:
        counts = _apply_all(kube, cfg, comp, server_dry_run=dry_run == "server")
        summary = ", ".join(f"{n} {k}" for k, n in counts.items() if n)
        if dry_run == "server":
            ok(
                f"{comp.name} ({comp.version}): {len(comp.objects)} objects accepted by the API server (dry run)"
            )
            continue
        ok(f"{comp.name} ({comp.version}): {summary}")
        _wait_ready(kube, comp, timeout)
        _check_required(kube, comp, timeout)


def _check_required(kube, comp, timeout: float) -> None:
    """What the component needs but fsdpctl does not install: waited for when present, else named."""
    missing = [r for r in comp.requires if kube.get("apps/v1", r["kind"], r["name"], r["namespace"]) is None]
    for r in missing:
        warn(
            f"{comp.name}: {r['kind']}/{r['name']} in {r['namespace']} is not installed; jobs will stay "
            f"pending until it is: {r['install']}"
        )
    present = [r for r in comp.requires if r not in missing]
    if present:
        _wait_ready(kube, replace(comp, ready=present), timeout)


def _apply_all(kube, cfg, comp, server_dry_run: bool) -> dict[str, int]:
    """Server-side apply of each object unless the cluster already holds exactly it (so a rerun changes
    nothing and says so)."""
    from fsdpctl import kjobs

    counts = {"created": 0, "configured": 0, "unchanged": 0}
    with kjobs.calls(cfg, f"deploying {comp.name}"), err.status(f"applying {comp.name} ..."):
        for obj in comp.objects:
            meta = obj["metadata"]
            current = kube.get(obj["apiVersion"], obj["kind"], meta["name"], meta.get("namespace"))
            if current is not None and _contains(current, obj):
                counts["unchanged"] += 1
                continue
            kube.apply(obj, dry_run=server_dry_run)
            counts["configured" if current is not None else "created"] += 1
    return counts


def _contains(have, want) -> bool:
    """Every field fsdpctl sets has that value on the server (the server adds its own; those do not count)."""
    if isinstance(want, dict):
        return isinstance(have, dict) and all(k in have and _contains(have[k], v) for k, v in want.items())
    if isinstance(want, list):
        return isinstance(have, list) and len(have) == len(want) and all(map(_contains, have, want))
    return have == want


def _wait_ready(kube, comp, timeout: float) -> None:
    from fsdpctl.deploy import is_ready

    deadline = time.monotonic() + timeout
    pending = list(comp.ready)
    with err.status(f"waiting for {comp.name} to be ready ...") as spinner:
        while pending:
            pending = [
                r for r in pending if not is_ready(kube.get("apps/v1", r["kind"], r["name"], r["namespace"]))
            ]
            if not pending:
                break
            if time.monotonic() > deadline:
                names = ", ".join(f"{r['kind']}/{r['name']} in {r['namespace']}" for r in pending)
                raise FsdpctlError(
                    f"{comp.name}: not ready after {timeout:.0f} s: {names}",
                    hint="kubectl describe the pods (image pulls, node capacity); rerun to keep waiting",
                )
            spinner.update(f"waiting for {comp.name}: {len(pending)} not ready yet")
            time.sleep(1)
    ok(f"{comp.name} ready")


def _component_command(which: str):
    def command(
        ctx: typer.Context, dry_run: DryRunOpt = None, mirror: FromOpt = None, timeout: TimeoutOpt = 600
    ) -> None:
        _deploy(ctx, which, dry_run, mirror, timeout)

    command.__doc__ = {
        "etcd": "etcd (pinned v3.5, v2 API on) in JOB_NAMESPACE for RDZV_BACKEND=etcd|etcd-v2.\n\nExample: fsdpctl deploy etcd",
        "operator": "The job operator: Training Operator v1.9.4 (JOB_KIND=pytorchjob) or Trainer v2.3.0 CRDs + "
        "runtimes (JOB_KIND=trainjob), from the pinned, sha256-checked release files.\n\n"
        "Example: fsdpctl deploy operator --from ./mirror",
        "monitoring": "DCGM exporter, Prometheus, Grafana (with fsdpctl's dashboard), htop and nvtop.\n\n"
        "Example: fsdpctl deploy monitoring --dry-run server",
        "all": "etcd, the operator and monitoring, in that order.\n\nExample: fsdpctl deploy all --timeout 900",
    }[which]
    return command


for _which in ("etcd", "operator", "monitoring", "all"):
    app.command(_which)(_component_command(_which))


@app.command()
def status(ctx: typer.Context, output: Output = OutputOpt) -> None:
    """What is installed, at which version, and whether it is ready.

    Example: fsdpctl deploy status -o json
    """
    from fsdpctl import deploy, kjobs, render

    cfg = state(ctx).config()
    kube = kjobs.connect(cfg)
    rows = []
    with kjobs.calls(cfg, "reading what is deployed"):
        for comp in _installed_probes(cfg):
            obj = kube.get("apps/v1", comp["kind"], comp["name"], comp["namespace"])
            version = "-"
            if obj is not None:
                labels = obj["metadata"].get("labels", {})
                image = obj["spec"]["template"]["spec"]["containers"][0]["image"]
                version = labels.get(deploy.VERSION_LABEL) or image.rsplit(":", 1)[-1]
            rows.append(
                {
                    "component": comp["component"],
                    "object": f"{comp['kind']}/{comp['name']}",
                    "namespace": comp["namespace"],
                    "installed": obj is not None,
                    "version": version,
                    "ready": deploy.is_ready(obj),
                }
            )
        api, kind = render.job_api(cfg)
        crd = kube.get(
            "apiextensions.k8s.io/v1", "CustomResourceDefinition", f"{kind.lower()}s.{api.split('/')[0]}"
        )
        rows.append(
            {
                "component": "operator",
                "object": f"CRD {kind.lower()}s.{api.split('/')[0]}",
                "namespace": "-",
                "installed": crd is not None,
                "version": api.split("/")[1],
                "ready": crd is not None,
            }
        )
    if emit(rows, output):
        return
    t = Table("component", "object", "namespace", "installed", "version", "ready")
    for r in rows:
        t.add_row(
            r["component"],
            r["object"],
            r["namespace"],
            "yes" if r["installed"] else "[red]no[/]",
            r["version"],
            "[green]yes[/]" if r["ready"] else "[yellow]no[/]",
        )
    out.print(t)


def _installed_probes(cfg) -> list[dict]:
    from fsdpctl import deploy

    rel = deploy.releases()[cfg.job_kind]
    probes = [{"component": "etcd", "kind": "Deployment", "namespace": cfg.job_namespace, "name": "etcd"}]
    probes += [
        {"component": "operator", "kind": r["kind"], "namespace": r["namespace"], "name": r["name"]}
        for r in rel.get("ready", []) + rel.get("requires", [])
    ]
    probes += [
        {"component": "monitoring", "kind": k, "namespace": cfg.monitoring_namespace, "name": n}
        for k, n in (("Deployment", "prometheus"), ("Deployment", "grafana"), ("DaemonSet", "dcgm-exporter"))
    ]
    return probes


@app.command()
def fetch(ctx: typer.Context) -> None:
    """Download the pinned release files that upstream publishes as single files into the cache, checking
    each sha256; the others are named with the command that renders them.

    Example: fsdpctl deploy fetch
    """
    import urllib.request

    from fsdpctl import deploy
    from fsdpctl.adapters.local import home

    cache = home() / "manifests"
    for kind, rel in deploy.releases().items():
        for entry in rel["files"]:
            target = cache / entry["path"]
            if target.is_file() and deploy.sha256(target) == entry["sha256"]:
                ok(f"{entry['path']}: cached")
                continue
            if not entry.get("url"):
                warn(
                    f"{entry['path']}: upstream has no single file; render it into a mirror (templates/releases.yaml)"
                )
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_suffix(".part")
            with urllib.request.urlopen(entry["url"], timeout=60) as r:
                tmp.write_bytes(r.read())
            if deploy.sha256(tmp) != entry["sha256"]:
                tmp.unlink()
                raise FsdpctlError(
                    f"{entry['url']} does not match the pinned sha256",
                    hint="report it: the pin is wrong or the download was altered",
                )
            os.replace(tmp, target)
            ok(f"{entry['path']}: fetched and verified")

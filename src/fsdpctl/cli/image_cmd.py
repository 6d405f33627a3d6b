"""fsdpctl image build|push: the trainer image from docker/Dockerfile, pushed to ECR (over
`fsdpctl.cluster.image` and the Docker adapter)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from fsdpctl.cli.common import (
    DryRunOpt,
    Output,
    OutputOpt,
    command_group,
    emit,
    ok,
    out,
    parse_sets,
    state,
)
from fsdpctl.cli.tools import run_tool

if TYPE_CHECKING:
    from fsdpctl.settings import Config

app = command_group("The trainer image: build it from docker/Dockerfile, push it to ECR.")


@app.command()
def build(
    ctx: typer.Context,
    base_image: Annotated[
        str | None,
        typer.Option(
            "--base-image", help="FROM image (default: the Dockerfile's pinned CUDA base)"
        ),
    ] = None,
    build_arg: Annotated[
        list[str] | None,
        typer.Option(
            "--build-arg", metavar="KEY=VALUE", help="Dockerfile argument, e.g. INSTALL_EFA=false"
        ),
    ] = None,
    network: Annotated[
        str, typer.Option("--network", help="network for RUN steps (e.g. host)")
    ] = "",
    context: Annotated[
        Path | None, typer.Option("--context", help="fsdpctl checkout to build from")
    ] = None,
    dry_run: DryRunOpt = False,
    output: Output = OutputOpt,
) -> None:
    """Build the trainer image and tag it with the URI the manifests use (registry/repo:tag).

    Example: fsdpctl image build --build-arg EFA_INSTALLER_VERSION=1.43.2
    """
    from fsdpctl.adapters import docker
    from fsdpctl.cluster import image

    cfg = state(ctx).config()
    args = parse_sets(build_arg or [], "--build-arg", "INSTALL_EFA=false")
    if base_image:
        args["BASE_IMAGE"] = base_image
    uri = image.uri(cfg)
    cmd = docker.build_command(uri, image.source_root(context), args, network)
    if not dry_run:
        ok(f"Docker engine {docker.engine_version()}")
    shown: list[str] | None = None if output == Output.table else []
    run_tool(cmd, image.log("build"), dry_run=dry_run, failed="docker build", shown=shown)
    emit({"dry_run": "client" if dry_run else "none", "image": uri, "commands": shown}, output)
    if not dry_run:
        ok(f"built {uri}; next: fsdpctl image push")


@app.command()
def push(ctx: typer.Context, dry_run: DryRunOpt = False, output: Output = OutputOpt) -> None:
    """Push the built image: the ECR repository is created if missing, docker logs in with a token
    from ecr:GetAuthorizationToken (on stdin, never on the command line). Prints the pushed digest.

    Example: fsdpctl image push
    """
    from fsdpctl.adapters import docker
    from fsdpctl.cluster import image
    from fsdpctl.errors import FsdpctlError

    cfg = state(ctx).config()
    uri = image.uri(cfg)
    if not dry_run:
        docker.engine_version()
        if not docker.image_exists(uri):
            raise FsdpctlError(f"no local image {uri}", hint="build it first: fsdpctl image build")
    shown: list[str] | None = None if output == Output.table else []
    if cfg.image_login == "ecr":
        _ecr_login(cfg, image.registry_of(uri), dry_run, shown)
    digests: list[str] = []
    run_tool(
        docker.push_command(uri),
        image.log("push"),
        dry_run=dry_run,
        on_line=lambda line: digests.append(docker.pushed_digest(line)),
        failed=f"docker push {uri}",
        hint="check `docker login` to the registry (IMAGE_LOGIN) and the repository name",
        shown=shown,
    )
    pinned = "" if dry_run else image.pinned(uri, next((d for d in reversed(digests) if d), ""))
    if not emit(
        {
            "dry_run": "client" if dry_run else "none",
            "image": uri,
            "pinned": pinned,
            "commands": shown,
        },
        output,
    ):
        if not dry_run:
            out.print(pinned, markup=False)
    if not dry_run:
        ok(f"pushed {uri}")


def _ecr_login(cfg: Config, registry: str, dry_run: bool, shown: list[str] | None) -> None:
    from fsdpctl.adapters import docker
    from fsdpctl.cluster import image

    if dry_run:
        note = (
            f"# ECR repository {cfg.image_repo} in {cfg.aws_region}: created if missing; docker login reads "
            "a token from ecr:GetAuthorizationToken on stdin"
        )
        if shown is None:
            out.print(note, markup=False)
        else:
            shown.append(note)
        user, password = "AWS", ""
    else:
        created, user, password = image.ecr_login(cfg)
        ok(f"ECR repository {cfg.image_repo} {'created' if created else 'exists'}")
    run_tool(
        docker.login_command(registry, user),
        image.log("login"),
        dry_run=dry_run,
        stdin_text=password,
        failed=f"docker login {registry}",
        hint="IMAGE_REGISTRY must be the ECR registry of the account the credentials belong to",
        shown=shown,
    )

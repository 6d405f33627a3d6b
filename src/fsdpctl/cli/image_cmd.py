"""fsdpctl image build|push: the trainer image from docker/Dockerfile, pushed to ECR."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from fsdpctl.cli.common import ok, out, parse_sets, run_tool, state
from fsdpctl.errors import BadInput, FsdpctlError

app = typer.Typer(
    no_args_is_help=True,
    rich_markup_mode=None,
    help="The trainer image: build it from docker/Dockerfile, push it to ECR.",
)

DryRun = Annotated[bool, typer.Option("--dry-run", help="print the commands, run nothing")]


def source_root(context: Path | None) -> Path:
    """The build context: a fsdpctl checkout (the Dockerfile installs the trainer from its sources)."""
    from fsdpctl.render import data_dir

    root = context
    if root is None:
        try:
            root = data_dir("docker").parent
        except FileNotFoundError:
            root = Path(".")
    if not (root / "docker" / "Dockerfile").is_file() or not (root / "pyproject.toml").is_file():
        raise BadInput(
            f"{root.resolve()} is not a fsdpctl source checkout (no docker/Dockerfile + pyproject.toml)",
            hint="git clone the fsdpctl repository and pass --context PATH_TO_IT",
        )
    return root


def _aws(cfg):
    from fsdpctl.cli.cluster_cmd import _aws as make

    return make(cfg)


def image_uri(cfg) -> str:
    """IMAGE_REGISTRY, else the account's ECR (AWS_ACCOUNT_ID, else asked of STS)."""
    if cfg.registry:
        return cfg.image_uri
    from fsdpctl.adapters.aws import AwsError

    try:
        account = _aws(cfg).identity()["Account"]
    except AwsError as e:
        raise FsdpctlError(
            f"cannot tell the ECR registry: {e}",
            hint="set AWS_ACCOUNT_ID (or IMAGE_REGISTRY), or fix the credentials",
        ) from e
    return f"{account}.dkr.ecr.{cfg.aws_region}.amazonaws.com/{cfg.image_repo}:{cfg.image_tag}"


def _engine() -> str:
    from fsdpctl.adapters import docker, shell

    try:
        return docker.engine_version()
    except shell.ToolMissing as e:
        raise FsdpctlError(str(e), hint=e.hint) from e
    except docker.EngineDown as e:
        raise FsdpctlError(
            str(e), hint="start it (`sudo systemctl start docker`) or point DOCKER_HOST at one"
        ) from e


def _log(name: str) -> Path:
    from fsdpctl.adapters.local import home

    return home() / "images" / f"{name}.log"


@app.command()
def build(
    ctx: typer.Context,
    base_image: Annotated[
        str | None,
        typer.Option("--base-image", help="FROM image (default: the Dockerfile's pinned CUDA base)"),
    ] = None,
    build_arg: Annotated[
        list[str] | None,
        typer.Option("--build-arg", metavar="KEY=VALUE", help="Dockerfile argument, e.g. INSTALL_EFA=false"),
    ] = None,
    network: Annotated[str, typer.Option("--network", help="network for RUN steps (e.g. host)")] = "",
    context: Annotated[Path | None, typer.Option("--context", help="fsdpctl checkout to build from")] = None,
    dry_run: DryRun = False,
) -> None:
    """Build the trainer image and tag it with the URI the manifests use (registry/repo:tag).

    Example: fsdpctl image build --build-arg EFA_INSTALLER_VERSION=1.43.2
    """
    from fsdpctl.adapters import docker

    cfg = state(ctx).config()
    args = parse_sets(build_arg or [], "--build-arg", "INSTALL_EFA=false")
    if base_image:
        args["BASE_IMAGE"] = base_image
    uri = image_uri(cfg)
    cmd = docker.build_command(uri, source_root(context), args, network)
    if dry_run:
        out.print(cmd.shell_line(), markup=False)
        return
    ok(f"Docker engine {_engine()}")
    log = _log("build")
    run_tool(cmd, log, failed="docker build")
    ok(f"built {uri}; next: fsdpctl image push")


@app.command()
def push(ctx: typer.Context, dry_run: DryRun = False) -> None:
    """Push the built image: the ECR repository is created if missing, docker logs in with a token from
    ecr:GetAuthorizationToken (on stdin, never on the command line). Prints the pushed digest.

    Example: fsdpctl image push
    """
    from fsdpctl.adapters import docker

    cfg = state(ctx).config()
    uri = image_uri(cfg)
    registry = uri.split("/", 1)[0]
    ecr = cfg.image_login == "ecr"
    if dry_run:
        if ecr:
            out.print(
                f"# ECR repository {cfg.image_repo} in {cfg.aws_region}: created if missing", markup=False
            )
            out.print(
                docker.login_command(registry, "AWS").shell_line()
                + "  # token from ecr:GetAuthorizationToken",
                markup=False,
            )
        out.print(docker.push_command(uri).shell_line(), markup=False)
        return
    _engine()
    if not docker.image_exists(uri):
        raise FsdpctlError(f"no local image {uri}", hint="build it first: fsdpctl image build")
    if ecr:
        _ecr_login(cfg, registry)
    digest = ""

    def seen(line: str) -> None:
        nonlocal digest
        digest = docker.pushed_digest(line) or digest

    log = _log("push")
    run_tool(
        docker.push_command(uri),
        log,
        on_line=seen,
        failed=f"docker push {uri}",
        hint="check `docker login` to the registry (IMAGE_LOGIN) and the repository name",
    )
    ok(f"pushed {uri}")
    out.print(f"{uri.rsplit(':', 1)[0]}@{digest}" if digest else uri, markup=False)


def _ecr_login(cfg, registry: str) -> None:
    from fsdpctl.adapters import docker
    from fsdpctl.adapters.aws import AwsError

    aws = _aws(cfg)
    try:
        _, created = aws.ecr_repository(cfg.image_repo)
        ok(f"ECR repository {cfg.image_repo} {'created' if created else 'exists'}")
        user, password = aws.ecr_login()
    except AwsError as e:
        raise FsdpctlError(str(e), hint="check credentials and AWS_REGION (`fsdpctl cluster check`)") from e
    log = _log("login")
    run_tool(
        docker.login_command(registry, user),
        log,
        stdin_text=password,
        failed=f"docker login {registry}",
        hint="IMAGE_REGISTRY must be the ECR registry of the account the credentials belong to",
    )

"""The trainer image: where it is built from, the URI it is tagged and pushed as, and the ECR side
of a push (the repository, created when missing, and a login token). Docker runs through
`adapters.docker`."""

from __future__ import annotations

from pathlib import Path

from fsdpctl.errors import BadInput, FsdpctlError
from fsdpctl.files import home
from fsdpctl.settings import Config


def source_root(context: Path | None) -> Path:
    """The build context: a fsdpctl checkout (the Dockerfile installs the trainer from its
    sources)."""
    from fsdpctl.job.render import data_dir

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


def uri(cfg: Config) -> str:
    """IMAGE_REGISTRY, else the account's ECR: AWS_ACCOUNT_ID, else the account STS says the
    credentials belong to."""
    if cfg.registry:
        return cfg.image_uri
    from fsdpctl.adapters.aws import Aws, AwsError

    try:
        account = Aws(cfg.aws_region, cfg.aws_profile, cfg.request_timeout).identity()["Account"]
    except AwsError as e:
        raise FsdpctlError(
            f"cannot tell the ECR registry: {e}",
            hint="set AWS_ACCOUNT_ID (or IMAGE_REGISTRY), or fix the credentials",
        ) from e
    return cfg.image_uri_in(cfg.ecr_registry(account))


def registry_of(image_uri: str) -> str:
    return image_uri.split("/", 1)[0]


def pinned(image_uri: str, digest: str) -> str:
    """repo@sha256:... once the push named its digest, else the tagged URI."""
    return f"{image_uri.rsplit(':', 1)[0]}@{digest}" if digest else image_uri


def ecr_login(cfg: Config) -> tuple[bool, str, str]:
    """(repository created by this call, user, password) for `docker login`: IMAGE_REPO is created
    in ECR when missing, the password is an ecr:GetAuthorizationToken token (valid 12 hours)."""
    from fsdpctl.adapters.aws import Aws

    aws = Aws(cfg.aws_region, cfg.aws_profile, cfg.request_timeout)
    _, created = aws.ecr_repository(cfg.image_repo)
    user, password = aws.ecr_login()
    return created, user, password


def log(name: str) -> Path:
    return home() / "images" / f"{name}.log"

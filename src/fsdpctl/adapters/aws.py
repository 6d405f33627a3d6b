"""Adapter: AWS through boto3. Every call goes through here; botocore errors become AwsError with
the service's own code and message. `AWS_ENDPOINT_URL` (read by boto3 itself) points it at an
emulator."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from fsdpctl.adapters import shell
from fsdpctl.adapters.aws_shapes import (
    AuthorizeSecurityGroupIngressRequest,
    Cluster,
    CreateFileSystemRequest,
    CreateKeyRequest,
    CreateSecurityGroupRequest,
    FileSystem,
    LaunchTemplateSpecification,
    Nodegroup,
    SecurityGroup,
    Subnet,
)
from fsdpctl.errors import BadInput, FsdpctlError

CREDENTIALS_HINT = "check credentials and AWS_REGION (`fsdpctl cluster check`)"


SILENT_HINT = "check the network and AWS_ENDPOINT_URL, or give it longer (REQUEST_TIMEOUT)"


class AwsError(FsdpctlError):
    def __init__(self, code: str, message: str, hint: str = CREDENTIALS_HINT):
        super().__init__(f"{code}: {message}", hint=hint)
        self.aws_code = code  # the service's error code (`code` is fsdpctl's exit code)


# Service Quotas code of "Running On-Demand P instances" (vCPUs), the quota p4de/p5 count against
P_INSTANCES_QUOTA = ("ec2", "L-417A185B")


def _call(fn: Callable[..., Any], **kwargs: Any) -> Any:
    """botocore's parsed answer: plain dicts and lists (Any). The methods of Aws below are the
    boundary: each returns its part as the model's shape (fsdpctl.adapters.aws_shapes)."""
    from botocore.exceptions import (
        BotoCoreError,
        ClientError,
        ConnectTimeoutError,
        ReadTimeoutError,
    )
    from botocore.parsers import ResponseParserError

    try:
        return fn(**kwargs)
    except ClientError as e:
        err = e.response.get("Error", {})
        raise AwsError(err.get("Code", "ClientError"), err.get("Message", str(e))) from e
    except (
        ConnectTimeoutError,
        ReadTimeoutError,
    ) as e:  # names the endpoint URL that did not answer
        raise AwsError(
            type(e).__name__, f"{e} (no answer within REQUEST_TIMEOUT)", SILENT_HINT
        ) from e
    except (
        BotoCoreError,
        ResponseParserError,
    ) as e:  # the latter: an HTML error page (proxy, emulator)
        raise AwsError(type(e).__name__, str(e)) from e
    except shell.Overdue as e:  # the profile's credential_process
        raise AwsError("CredentialRetrievalError", f"{e} (REQUEST_TIMEOUT)") from None
    except OSError as e:  # the profile's credential_process cannot be started (Popen)
        if not e.filename:
            raise
        raise BadInput(
            f"the AWS profile's credential_process {e.filename} cannot be run: {e.strerror}",
            hint="fix credential_process in the AWS config file (`aws configure list` shows the "
            "profile)",
        ) from None


# botocore's errors that say its configuration is wrong, not AWS (botocore/exceptions.py): with
# every Invalid...Error (InvalidRetryModeError for AWS_RETRY_MODE=x, InvalidDefaultsMode, ...),
# refused as bad input
CONFIG_ERRORS = ("ConfigParseError", "PartialCredentialsError", "UnknownCredentialError")


# botocore's own default is 60 s to connect and 60 s per read, each retried up to 4 times (legacy
# mode): a silent endpoint held a command for ten minutes. With a deadline of its own a request is
# tried twice.
RETRIES = {"total_max_attempts": 2, "mode": "standard"}


@dataclass
class Aws:
    region: str
    profile: str = ""
    timeout: float = (
        30  # REQUEST_TIMEOUT: each connect, each read, the profile's credential_process
    )
    _clients: dict[str, Any] = field(default_factory=dict, repr=False)
    _silent: set[str] = field(default_factory=set, repr=False)  # endpoints that did not answer once

    def __post_init__(self) -> None:
        try:
            import boto3
            import botocore.session
        except ImportError as e:
            raise FsdpctlError("boto3 is not installed", hint="pip install 'fsdpctl[aws]'") from e
        from botocore.exceptions import ProfileNotFound

        from fsdpctl.adapters import aws_config

        aws_config.check_files(os.environ)  # before botocore reads them, in its own way
        try:
            self.botocore = botocore.session.Session(profile=self.profile or None)
            self.session = boto3.Session(region_name=self.region, botocore_session=self.botocore)
            self.botocore.get_scoped_config()  # the profile is looked up here, as boto3.Session did
            aws_config.check_values(self.botocore, self.profile, os.environ)
            _bound_credential_process(self.botocore, self.timeout, self.profile or "default")
            self.botocore.register("after-call-error", self._note_silence)
            self.botocore.register("before-send", self._fail_fast)
        except (
            ProfileNotFound
        ) as e:  # boto3 looks the profile up at once, in ~/.aws/config and credentials
            raise BadInput(
                f"AWS_PROFILE={self.profile!r} is not a profile in the AWS config or credentials file",
                hint="`aws configure list-profiles` lists them; set one, or unset AWS_PROFILE",
            ) from e

    def client(self, service: str) -> Any:
        """A client whose every request has a deadline: `connect_timeout` and `read_timeout`
        (botocore's Config, "the time in seconds till a timeout exception is thrown when attempting
        to make a connection / read from a connection"), retried as RETRIES says unless the user set
        AWS_MAX_ATTEMPTS or AWS_RETRY_MODE (environment or profile), which win."""
        from botocore.config import Config

        if service not in self._clients:
            user_set = any(
                self.botocore.get_config_variable(v) for v in ("max_attempts", "retry_mode")
            )
            config = Config(
                connect_timeout=self.timeout,
                read_timeout=self.timeout,
                **({} if user_set else {"retries": RETRIES}),
            )
            # credentials are resolved here (the profile's credential_process runs): errors as
            # _call's; a setting botocore checks only now is one line naming it
            try:
                self._clients[service] = _call(
                    self.session.client, service_name=service, config=config
                )
            except ValueError as e:
                if str(e).startswith("Invalid endpoint"):  # endpoint.py create_endpoint
                    raise BadInput(
                        f"the AWS endpoint for {service} is not valid: {e}",
                        hint="fix AWS_ENDPOINT_URL (or the profile's endpoint_url): "
                        "scheme://host[:port]",
                    ) from None
                # credentials.py ProcessProvider: json.loads of what the credential_process printed
                raise AwsError(
                    "CredentialRetrievalError",
                    f"the credentials of AWS profile {self.profile or 'default'!r} could not be read: "
                    f"{e}",
                    hint="its credential_process must print JSON credentials (Version, AccessKeyId, "
                    "SecretAccessKey): run it by hand",
                ) from None
            except AwsError as e:
                if e.aws_code.startswith("Invalid") or e.aws_code in CONFIG_ERRORS:
                    raise BadInput(
                        f"the AWS configuration: {e}",
                        hint="fix that setting in the environment or the AWS config file "
                        "(`aws configure list` shows where each comes from)",
                    ) from None
                raise
        return self._clients[service]

    def _note_silence(self, exception: BaseException | None = None, **_: Any) -> None:
        """botocore's after-call-error event (client.py _make_request): an endpoint that did not
        answer."""
        from botocore.exceptions import ConnectTimeoutError, ReadTimeoutError

        if isinstance(exception, ConnectTimeoutError | ReadTimeoutError):
            self._silent.add(urlsplit(str(exception.kwargs.get("endpoint_url", ""))).netloc)

    def _fail_fast(self, request: Any = None, **_: Any) -> None:
        """botocore's before-send event (endpoint.py): a request to an endpoint that already did not
        answer in this command fails at once with the same error, rather than after another deadline
        (`cluster check` asks five things of one endpoint)."""
        from botocore.exceptions import ReadTimeoutError

        if request is not None and urlsplit(request.url).netloc in self._silent:
            raise ReadTimeoutError(endpoint_url=request.url)

    def identity(self) -> dict:
        return _call(self.client("sts").get_caller_identity)

    def instance_type_zones(self, instance_type: str) -> list[str]:
        r = _call(
            self.client("ec2").describe_instance_type_offerings,
            LocationType="availability-zone",
            Filters=[{"Name": "instance-type", "Values": [instance_type]}],
        )
        return sorted(o["Location"] for o in r["InstanceTypeOfferings"])

    def vcpus(self, instance_type: str) -> int:
        r = _call(self.client("ec2").describe_instance_types, InstanceTypes=[instance_type])
        return r["InstanceTypes"][0]["VCpuInfo"]["DefaultVCpus"]

    def p_instance_quota(self) -> float:
        service, code = P_INSTANCES_QUOTA
        r = _call(
            self.client("service-quotas").get_service_quota, ServiceCode=service, QuotaCode=code
        )
        return r["Quota"]["Value"]

    def capacity_reservation(self, reservation_id: str) -> dict:
        r = _call(
            self.client("ec2").describe_capacity_reservations,
            CapacityReservationIds=[reservation_id],
        )
        return r["CapacityReservations"][0]

    def zones(self) -> list[str]:
        """The region's available AZs (no Local or Wavelength Zones), by name."""
        r = _call(
            self.client("ec2").describe_availability_zones,
            Filters=[{"Name": "zone-type", "Values": ["availability-zone"]}],
        )
        return sorted(
            z["ZoneName"]
            for z in r["AvailabilityZones"]
            if z.get("State", "available") == "available"
        )

    def cluster(self, name: str) -> Cluster | None:
        try:
            return _call(self.client("eks").describe_cluster, name=name)["cluster"]
        except AwsError as e:
            if e.aws_code == "ResourceNotFoundException":
                return None
            raise

    def nodegroups(self, cluster: str) -> list[Nodegroup]:
        eks = self.client("eks")
        names = _call(eks.list_nodegroups, clusterName=cluster)["nodegroups"]
        return [
            _call(eks.describe_nodegroup, clusterName=cluster, nodegroupName=n)["nodegroup"]
            for n in names
        ]

    def ecr_repository(self, name: str) -> tuple[dict, bool]:
        """The repository, created (scan on push, AES256) when missing; True when this call created
        it."""
        ecr = self.client("ecr")
        try:
            return _call(ecr.describe_repositories, repositoryNames=[name])["repositories"][
                0
            ], False
        except AwsError as e:
            if e.aws_code != "RepositoryNotFoundException":
                raise
        try:
            repo = _call(
                ecr.create_repository,
                repositoryName=name,
                imageScanningConfiguration={"scanOnPush": True},
                encryptionConfiguration={"encryptionType": "AES256"},
            )["repository"]
            return repo, True
        except AwsError as e:  # created by someone else in between: theirs is ours
            if e.aws_code != "RepositoryAlreadyExistsException":
                raise
            return _call(ecr.describe_repositories, repositoryNames=[name])["repositories"][
                0
            ], False

    def ecr_login(self) -> tuple[str, str]:
        """(user, password) for `docker login`, from ecr:GetAuthorizationToken (valid 12 hours)."""
        import base64

        data = _call(self.client("ecr").get_authorization_token)["authorizationData"][0]
        user, _, password = base64.b64decode(data["authorizationToken"]).decode().partition(":")
        return user, password

    # ---- the shared FSx for Lustre file system of an eksctl cluster (fsdpctl.cluster.fsx plans them)

    def nodegroup(self, cluster: str, name: str) -> Nodegroup | None:
        try:
            return _call(
                self.client("eks").describe_nodegroup, clusterName=cluster, nodegroupName=name
            )["nodegroup"]
        except AwsError as e:
            if e.aws_code == "ResourceNotFoundException":
                return None
            raise

    def subnets(self, ids: list[str]) -> list[Subnet]:
        return _call(self.client("ec2").describe_subnets, SubnetIds=ids)["Subnets"] if ids else []

    def launch_template_groups(self, template: LaunchTemplateSpecification) -> list[str]:
        """The security groups a node group's launch template gives its nodes (eksctl: the shared
        node group, EFA's; on the primary interface when EFA interfaces are listed)."""
        version = str(template.get("version") or "$Default")
        r = _call(
            self.client("ec2").describe_launch_template_versions,
            LaunchTemplateId=template["id"],
            Versions=[version],
        )
        data = r["LaunchTemplateVersions"][0]["LaunchTemplateData"]
        groups = list(data.get("SecurityGroupIds", []))
        for nic in data.get("NetworkInterfaces", []):
            groups += nic.get("Groups", [])
        return groups

    def lustre_file_systems(self) -> list[FileSystem]:
        fsx = self.client("fsx")
        found: list[FileSystem] = []
        token: dict[str, str] = {}
        while True:
            r = _call(fsx.describe_file_systems, **token)
            found += [f for f in r["FileSystems"] if f.get("FileSystemType") == "LUSTRE"]
            if not r.get("NextToken"):
                return found
            token = {"NextToken": r["NextToken"]}

    def file_system(self, fs_id: str) -> FileSystem | None:
        """None once it is gone (FSx answers FileSystemNotFound)."""
        try:
            found = _call(self.client("fsx").describe_file_systems, FileSystemIds=[fs_id])[
                "FileSystems"
            ]
        except AwsError as e:
            if e.aws_code == "FileSystemNotFound":
                return None
            raise
        return found[0] if found else None

    def create_file_system(self, request: CreateFileSystemRequest) -> FileSystem:
        return _call(self.client("fsx").create_file_system, **request)["FileSystem"]

    def delete_file_system(self, fs_id: str) -> None:
        try:
            _call(self.client("fsx").delete_file_system, FileSystemId=fs_id)
        except AwsError as e:
            if e.aws_code != "FileSystemNotFound":
                raise

    def security_group(self, vpc_id: str, name: str) -> str | None:
        r = _call(
            self.client("ec2").describe_security_groups,
            Filters=[
                {"Name": "vpc-id", "Values": [vpc_id]},
                {"Name": "group-name", "Values": [name]},
            ],
        )
        return r["SecurityGroups"][0]["GroupId"] if r["SecurityGroups"] else None

    def tagged_security_groups(self, key: str, value: str) -> list[SecurityGroup]:
        r = _call(
            self.client("ec2").describe_security_groups,
            Filters=[{"Name": f"tag:{key}", "Values": [value]}],
        )
        return r["SecurityGroups"]

    def create_security_group(
        self,
        request: CreateSecurityGroupRequest,
        ingress: Callable[[str], AuthorizeSecurityGroupIngressRequest],
    ) -> str:
        """The group with its ingress rules; rules already there (a rerun) are kept."""
        group_id = _call(self.client("ec2").create_security_group, **request)["GroupId"]
        self.authorize_ingress(ingress(group_id))
        return group_id

    def authorize_ingress(self, request: AuthorizeSecurityGroupIngressRequest) -> None:
        try:
            _call(self.client("ec2").authorize_security_group_ingress, **request)
        except AwsError as e:
            if e.aws_code != "InvalidPermission.Duplicate":
                raise

    def delete_security_group(self, group_id: str) -> None:
        try:
            _call(self.client("ec2").delete_security_group, GroupId=group_id)
        except AwsError as e:
            if e.aws_code != "InvalidGroup.NotFound":
                raise

    def kms_key(self, alias: str) -> str | None:
        """The ARN of the key behind `alias`; None without one or when it is scheduled for
        deletion."""
        meta = self._key(alias)
        return meta["Arn"] if meta else None

    def _key(self, alias: str) -> dict | None:
        try:
            meta = _call(self.client("kms").describe_key, KeyId=alias)["KeyMetadata"]
        except AwsError as e:
            if e.aws_code == "NotFoundException":
                return None
            raise
        return None if meta.get("KeyState") == "PendingDeletion" else meta

    def create_kms_key(self, request: CreateKeyRequest, alias: str) -> str:
        """A symmetric key with yearly rotation, named by `alias` (how a rerun finds it)."""
        kms = self.client("kms")
        meta = _call(kms.create_key, **request)["KeyMetadata"]
        _call(kms.enable_key_rotation, KeyId=meta["KeyId"])
        _call(kms.create_alias, AliasName=alias, TargetKeyId=meta["KeyId"])
        return meta["Arn"]

    def schedule_key_deletion(self, alias: str, days: int) -> str | None:
        """Schedules the key behind `alias` for deletion and removes the alias; None when there is
        none."""
        meta = self._key(alias)
        if meta is None:
            return None
        kms = self.client("kms")
        _call(kms.schedule_key_deletion, KeyId=meta["KeyId"], PendingWindowInDays=days)
        _call(kms.delete_alias, AliasName=alias)
        return meta["Arn"]


def _bound_credential_process(session: Any, timeout: float, profile: str) -> None:
    """botocore runs a profile's `credential_process` and waits for it with no timeout
    (credentials.py, ProcessProvider._retrieve_credentials_using: `p.communicate()`); a helper that
    never returns (a login prompt nobody answers, a hung SSO helper) held every AWS command. Its
    Popen is given a deadline (the provider takes the Popen it uses as `popen`)."""
    provider = session.get_component("credential_provider").get_provider("custom-process")
    if provider is not None:
        what = f"the credential_process of AWS profile {profile!r}"
        provider._popen = shell.bounded_popen(timeout, what)

"""The AWS configuration botocore reads, checked before botocore reads it: the config and
credentials files through the one door for outside files (fsdpctl.outside), parsed as botocore
parses them, and the settings botocore converts or checks only when a client is made. Each problem
is one line naming the file (and line) or the variable, and the fix (exit 2), where botocore would
raise a ValueError or a ConfigParseError from deep inside a request (an internal error), or ignore
the file in silence.

What botocore does (botocore 1.44, read in its sources):
- configloader.raw_config_parse: `os.path.isfile` or the file is skipped as absent (a directory or a
  FIFO is ignored in silence); then configparser.RawConfigParser().read (strict: a section or an
  option twice is an error; a line before any section, or one that is no `key = value`, is an
  error), ConfigParseError for configparser.Error and UnicodeDecodeError; an option whose value
  starts on the next line is a nested block of `key = value` lines (_parse_nested: ValueError
  otherwise);
- configprovider.BOTOCORE_DEFAUT_SESSION_VARIABLES: each setting's config-file name, environment
  variable and conversion (`int` for max_attempts, AWS_MAX_ATTEMPTS; metadata_service_timeout ...),
  applied when the setting is read: `int('abc')` raises ValueError there;
- endpoint.EndpointCreator.create_endpoint: `ValueError("Invalid endpoint: ...")` unless
  utils.is_valid_endpoint_url or is_valid_ipv6_endpoint_url takes the URL (AWS_ENDPOINT_URL,
  AWS_ENDPOINT_URL_<SERVICE>, a profile's or a services section's endpoint_url:
  configprovider.EndpointResolverBuiltins / ConfiguredEndpointProvider)."""

from __future__ import annotations

import configparser
import os
import re
from collections.abc import Mapping
from typing import Any

from fsdpctl.errors import BadInput
from fsdpctl.outside import Door, read_text

AWS_FILE_MAX = 1024 * 1024  # an AWS config is a few KB of profiles
FIX = "fix it, or point {var} at another file"


def _door(var: str) -> Door:
    return Door(
        what=f"the AWS {'credentials' if 'CREDENTIALS' in var else 'config'} file ({var})",
        noun="an AWS config file",
        limit=AWS_FILE_MAX,
        hint=FIX.format(var=var),
    )


def files(environ: Mapping[str, str]) -> dict[str, str]:
    """The variable naming each file -> its path, as botocore finds them (expandvars, then
    expanduser: configloader.raw_config_parse)."""
    found = {}
    for var, default in (
        ("AWS_CONFIG_FILE", "~/.aws/config"),
        ("AWS_SHARED_CREDENTIALS_FILE", "~/.aws/credentials"),
    ):
        found[var] = os.path.expanduser(os.path.expandvars(environ.get(var) or default))
    return found


def check_files(environ: Mapping[str, str]) -> dict[str, str]:
    """Each file that exists read through the door and parsed as botocore parses it; their texts by
    variable. A missing file is no error (botocore reads none)."""
    texts = {}
    for var, path in files(environ).items():
        text = read_text(_door(var), path, missing_ok=True)
        if text is None:
            continue
        _parse(_door(var), path, text)
        texts[var] = text
    return texts


def _parse(door: Door, path: str, text: str) -> None:
    parser = configparser.RawConfigParser()
    try:
        parser.read_string(text, source=path)
    # the lines themselves are not quoted: they may hold a secret access key
    except configparser.MissingSectionHeaderError as e:
        raise door.refuse(path, f"line {e.lineno} comes before any [profile] section") from None
    except configparser.ParsingError as e:
        raise door.refuse(path, f"line {e.errors[0][0]} is not `key = value`") from None
    except (configparser.DuplicateSectionError, configparser.DuplicateOptionError) as e:
        what = (
            f"[{e.section}] twice"
            if isinstance(e, configparser.DuplicateSectionError)
            else f"{e.option} twice in [{e.section}]"
        )
        raise door.refuse(path, f"line {e.lineno}: {what}") from None
    except configparser.Error as e:
        raise door.refuse(path, f"cannot be parsed ({type(e).__name__})") from None
    for section in parser.sections():
        for option, value in parser.items(section, raw=True):
            nested = value.startswith("\n") and any(
                line.strip() and "=" not in line for line in value.splitlines()
            )
            if nested:
                raise door.refuse(
                    path,
                    f"line {_line_of(text, section, option)}: [{section}] {option}: each line of "
                    "its nested block must be `key = value`",
                )


def _line_of(text: str, section: str, option: str) -> int | None:
    """The line of `option` in `[section]`, as a person looks for it."""
    in_section = False
    for n, line in enumerate(text.splitlines(), 1):
        head = re.match(r"\s*\[(.*)\]\s*$", line)
        if head:
            in_section = head.group(1).strip() == section
        elif in_section and re.match(rf"\s*{re.escape(option)}\s*[=:]", line, re.IGNORECASE):
            return n
    return None


def check_values(session: Any, profile: str, environ: Mapping[str, str]) -> None:
    """The settings botocore converts (`int` and friends) read once, and every configured endpoint
    URL checked as botocore checks it: one line naming the variable or the file's key."""
    for name, (config_name, env_vars, _, convert) in session.session_var_map.items():
        if convert is None:
            continue
        try:
            session.get_config_variable(name)
        except (ValueError, TypeError):
            raise _bad_value(session, profile, environ, config_name, env_vars, convert) from None
    _check_endpoints(session, profile, environ)
    _check_ca_bundle(session, profile, environ)


def _check_ca_bundle(session: Any, profile: str, environ: Mapping[str, str]) -> None:
    """AWS_CA_BUNDLE (or the profile's ca_bundle) names the certificates every https request is
    verified against: urllib3 loads it at the first connection (ssl load_verify_locations), where a
    missing one failed deep inside the request."""
    bundle = session.get_config_variable("ca_bundle")
    if not bundle or os.path.isfile(bundle) or os.path.isdir(bundle):
        return
    if environ.get("AWS_CA_BUNDLE"):
        raise BadInput(
            f"AWS_CA_BUNDLE={bundle!r} (environment) is not a file",
            hint="name the PEM file of the CA certificates, or unset AWS_CA_BUNDLE",
        )
    raise BadInput(
        f"{_where(profile, 'ca_bundle')}: ca_bundle = {bundle!r} is not a file",
        hint="name the PEM file of the CA certificates in that profile",
    )


def _bad_value(
    session: Any,
    profile: str,
    environ: Mapping[str, str],
    config_name: Any,
    env_vars: Any,
    convert: Any,
) -> BadInput:
    kind = "a whole number, e.g. 3" if convert is int else "a value of its kind"
    for var in [env_vars] if isinstance(env_vars, str) else list(env_vars or []):
        if var in environ:
            return BadInput(
                f"{var}={environ[var]!r} (environment) is not {kind}",
                hint=f"give {kind.split(',')[0]}, or unset {var}",
            )
    value = (session.get_scoped_config() or {}).get(config_name, "")
    return BadInput(
        f"{_where(profile, config_name)}: {config_name} = {value!r} is not {kind}",
        hint=f"fix {config_name} in that profile",
    )


def _where(profile: str, key: str) -> str:
    path = files(os.environ)["AWS_CONFIG_FILE"]
    section = "default" if profile in ("", "default") else f"profile {profile}"
    try:
        with open(path, encoding="utf-8") as f:
            line = _line_of(f.read(), section, key)
    except OSError:
        line = None
    return f"the AWS config file {path}" + (f" line {line}" if line else "") + f" [{section}]"


def _check_endpoints(session: Any, profile: str, environ: Mapping[str, str]) -> None:
    from botocore.utils import is_valid_endpoint_url, is_valid_ipv6_endpoint_url

    def ok(url: str) -> bool:
        return bool(is_valid_endpoint_url(url) or is_valid_ipv6_endpoint_url(url))

    fix = "give scheme://host[:port], e.g. https://ec2.us-west-2.amazonaws.com"
    for var in sorted(environ):
        if (var == "AWS_ENDPOINT_URL" or var.startswith("AWS_ENDPOINT_URL_")) and environ[var]:
            if not ok(environ[var]):
                raise BadInput(
                    f"{var}={environ[var]!r} (environment) is not a URL botocore takes",
                    hint=f"{fix}, or unset {var}",
                )
    scoped = session.get_scoped_config() or {}
    url = scoped.get("endpoint_url")
    if isinstance(url, str) and url and not ok(url):
        raise BadInput(
            f"{_where(profile, 'endpoint_url')}: endpoint_url = {url!r} is not a URL botocore takes",
            hint=fix,
        )

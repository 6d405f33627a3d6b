"""Secrets never reach a terminal or a file. One function, `redact`, masks them in whatever fsdpctl
prints (both consoles, click's usage errors, `--debug` tracebacks) and writes (manifests, tool logs,
state files): the values of the known secret variables, the secrets the loaded settings hold
(`add_secrets`), and anything shaped like a token, whichever key it was pasted into.

The shapes are the issuers' own formats: Hugging Face user access tokens are `hf_` and 34 letters
and digits (huggingface_hub's docs, "User access tokens"); AWS access key ids are `AKIA` (long-term)
or `ASIA` (temporary) and 16 upper-case letters and digits (IAM user guide, "Understanding unique ID
prefixes"), their secret keys 40 base64 characters, matched only beside an AWS key name so a sha256
pin or an image digest is never masked; GitHub tokens are `ghp_`/`gho_`/`ghu_`/`ghs_`/`ghr_` and 36
characters, or `github_pat_...` (GitHub docs, "About authentication to GitHub", token formats).
Generic high-entropy strings are not matched: the manifests fsdpctl writes are full of sha256
digests that are not secret."""

from __future__ import annotations

import os
import re
from typing import Any

SECRET_ENV = (
    "HF_TOKEN",
    "FSDPCTL_HF_TOKEN",  # the setting under fsdpctl's environment prefix (settings.ENV_PREFIX)
    "HUGGING_FACE_HUB_TOKEN",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_ACCESS_KEY_ID",
    "AWS_SESSION_TOKEN",
)
# what each shape is called in the warning about a secret pasted into a key that is not secret
KINDS = {
    "a Hugging Face token": re.compile(r"hf_[A-Za-z0-9]{20,}"),
    "an AWS access key id": re.compile(r"(?<![A-Z0-9])(?:AKIA|ASIA)[0-9A-Z]{16}(?![A-Z0-9])"),
    "a GitHub token": re.compile(r"(?:gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{22,})"),
}
# an AWS secret access key: 40 base64 characters after a name that says so (aws_secret_access_key =
# ..., "SecretAccessKey": "...", AWS_SECRET_ACCESS_KEY=...), within a few characters of it
AWS_SECRET = re.compile(
    r"(?i)(aws.{0,24}?secret.{0,24}?|secret.?access.?key.{0,8}?)([=:\s'\"]+)([A-Za-z0-9/+]{40})(?![A-Za-z0-9/+=])"
)
SHAPES = tuple(KINDS.values())
MASK = "***"
# A password in a URL's userinfo (RFC 3986 section 3.2.1, `scheme://user:password@host`; the RFC
# itself calls the form deprecated because the password shows wherever the URL does):
# DATASET=https://u:p@host/..., an AWS_ENDPOINT_URL or HF_ENDPOINT with credentials, and
# RESUME=s3://KEY:SECRET@bucket/..., whose secret access key may hold `/` and `+` (a userinfo that
# is not percent-encoded: taken up to the `@`, unless it is a port and a path). The user and host
# stay.
URL_PASSWORD = re.compile(
    r"(?i)\b([a-z][a-z0-9+.\-]*://[^/\s:@'\"<>]*):((?!\d{1,5}(?:/|$))[^\s@'\"<>]+)@"
)
# The same without a scheme, where a registry or a host is written bare:
# IMAGE_REGISTRY=user:pass@host (`docker login`'s user and password pasted into it). Not an image
# reference's tag and digest (`repo:1.0@sha256:...`, the OCI distribution spec's digest form).
HOST_PASSWORD = re.compile(
    r"(?<![\w.+%/:-])([A-Za-z0-9._%+-]+):([^\s/@:'\"<>]+)@(?!sha\d+:)(?=[A-Za-z0-9\[])"
)
# A secret named by its key wherever it is written `KEY=value`, `KEY: value` or `KEY:value` (a .env
# line or a --set pasted wrong, a log line, an error quoting its input): the value, whatever its
# shape, when it is a token's length (16 or more characters: fsdpctl's own words after the name,
# `environment HF_TOKEN` in config show's sources, are shorter). A value that starts with `<`, `*`
# or `$` is a reference or already masked (the run record's `<secret: ...>`).
NAMED_SECRET = re.compile(
    r"(?<![A-Za-z0-9_])((?:FSDPCTL_)?(?:HF_TOKEN|HUGGING_FACE_HUB_TOKEN|AWS_SECRET_ACCESS_KEY|AWS_SESSION_TOKEN))"
    r"(['\"]?\s*[:=]+\s*['\"]?)([^\s'\"<*$][^\s'\"]{15,})"
)
# A key whose name says it holds a secret, as other tools name theirs (WANDB_API_KEY, GITHUB_TOKEN,
# OPENAI_API_KEY, DB_PASSWORD, CLIENT_SECRET): the name ends in the word. Not a file or a path
# holding one (HF_TOKEN_FILE), nor a count (MAX_TOKENS).
SECRET_NAME = re.compile(
    r"(?:^|_)(?:TOKEN|SECRET|PASSWORD|PASSWD|PASSPHRASE|API_?KEY|ACCESS_?KEY|SECRET_?KEY|PRIVATE_?KEY"
    r"|AUTH|CREDENTIALS?)$"
)
# ...and its value where it is written KEY=value or KEY: value, of a token's length as for
# NAMED_SECRET (a shorter value from .env or the environment is masked as the value it is:
# settings.secrets_by_place)
NAMED_BY_KIND = re.compile(
    r"(?<![A-Za-z0-9_])([A-Z][A-Z0-9_]*(?:TOKEN|SECRET|PASSWORD|PASSWD|PASSPHRASE|API_?KEY|ACCESS_?KEY"
    r"|PRIVATE_?KEY|AUTH|CREDENTIALS?))(?![A-Za-z0-9_])(['\"]?\s*[:=]\s*['\"]?)([^\s'\"<*$][^\s'\"]{15,})"
)


def secret_name(name: str) -> bool:
    """Whether a variable's name says its value is a secret (SECRET_NAME)."""
    return bool(SECRET_NAME.search(name.upper()))


# A token pasted where a path belongs (HF_TOKEN_FILE=<the token itself>): one word with no `/`, `.`
# or `~` a path would have, either of 20 or more letters and digits mixing capitals, small letters
# and digits (API tokens: Hugging Face's, GitHub's, OpenAI's), or of 32 or more letters and digits
# alone (hex keys: Weights & Biases'). A file name is rarely either: `token`, `hf.txt`,
# `hf-token-2024-personal`.
TOKEN_SHAPED = re.compile(
    r"(?=[\w-]*[0-9])(?=[\w-]*[a-z])(?=[\w-]*[A-Z])[A-Za-z0-9_\-]{20,}|[A-Za-z0-9]{32,}"
)


def token_shaped(value: str) -> bool:
    """Whether `value` looks like a token rather than a path (TOKEN_SHAPED)."""
    return bool(TOKEN_SHAPED.fullmatch(value.strip()))


# secrets fsdpctl learned from its settings (HF_TOKEN from .env or --set, the HF_TOKEN_FILE content)
_added: set[str] = set()
SHORTEST = 8  # a shorter value would mask ordinary words ("true", a port) all over the output


def add_secrets(*values: str) -> None:
    """Mask these values from now on, wherever they appear (secrets that came from a file or a
    flag)."""
    _added.update(v.strip() for v in values if v and len(v.strip()) >= SHORTEST)


def forget() -> None:
    """Forget the remembered secrets: a new run of fsdpctl in the same process (the tests'
    in-process runner) starts as a fresh process does, masking only what its own settings hold."""
    _added.clear()


def redact(text: str, extra: tuple[str, ...] = ()) -> str:
    """`text` with every known secret and every secret-shaped value replaced by ***."""
    known = {*extra, *_added, *(os.environ.get(k, "") for k in SECRET_ENV)}
    for value in sorted((v for v in known if v and len(v) >= SHORTEST), key=len, reverse=True):
        text = text.replace(value, MASK)
    for shape in SHAPES:
        text = shape.sub(MASK, text)
    for userinfo in (URL_PASSWORD, HOST_PASSWORD):
        text = userinfo.sub(
            lambda m: f"{m.group(1)}:{MASK}@" if m.group(2) != MASK else m.group(0), text
        )
    text = NAMED_SECRET.sub(lambda m: m.group(1) + m.group(2) + MASK, text)
    text = NAMED_BY_KIND.sub(lambda m: m.group(1) + m.group(2) + MASK, text)
    return AWS_SECRET.sub(lambda m: m.group(1) + m.group(2) + MASK, text)


def secret_kind(value: str) -> str | None:
    """What kind of secret `value` holds or looks like ('a Hugging Face token'), or None."""
    for kind, shape in KINDS.items():
        if shape.search(value):
            return kind
    if AWS_SECRET.search(value):
        return "an AWS secret access key"
    if any(
        m.group(2) != MASK for m in (*URL_PASSWORD.finditer(value), *HOST_PASSWORD.finditer(value))
    ):
        return "a URL with a password"
    return None


def leaks(text: str) -> list[str]:
    """The secret-shaped values still in `text` (what tests grep every output and file for): tokens,
    and passwords in URLs that are not masked."""
    found = [m.group(0) for shape in SHAPES for m in shape.finditer(text)]
    userinfo = (*URL_PASSWORD.finditer(text), *HOST_PASSWORD.finditer(text))
    return found + [m.group(2) for m in userinfo if m.group(2) != MASK]


def redact_obj(obj: Any) -> Any:
    """`obj` (a manifest, a -o json/yaml document) with every string masked, keys too: mask before
    serialising, since a bare *** in YAML text would read as an alias."""
    if isinstance(obj, str):
        return redact(obj)
    if isinstance(obj, dict):
        return {redact_obj(k): redact_obj(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [redact_obj(v) for v in obj]
    return obj

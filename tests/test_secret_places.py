"""Secrets are found by shape and by place, not only after `=` (issue 29): a generated secret in
every setting, written in every syntax python-dotenv's parser accepts and in those it refuses,
through .env, --set and the environment, and in URLs (`scheme://user:password@host`: DATASET,
TOKENIZER, RESUME, AWS_ENDPOINT_URL, HF_ENDPOINT, `s3://KEY:SECRET@bucket`); every output and every
file the commands write is grepped for it.

What counts as a secret, and why (fsdpctl.redact): a value shaped like an issuer's token wherever it
is (the HF, AWS and GitHub formats); whatever follows a secret's own name (HF_TOKEN,
AWS_SECRET_ACCESS_KEY, ...) however it is separated, `HF_TOKEN=x`, `HF_TOKEN x`, `HF_TOKEN:x`; and
the password of a URL's userinfo (RFC 3986 section 3.2.1: "Use of the format "user:password" in the
userinfo field is deprecated", because the password then shows wherever the URL does).
python-dotenv's grammar (dotenv/parser.py): `KEY=value`, `export KEY=value`, single and double
quotes, spaces around `=`, a ` #` comment; `KEY value` is an error, and `KEY:value` is read as a key
with no value."""

from __future__ import annotations

import os
import string
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from conftest import invoke
from fsdpctl.redact import leaks
from invariants import snapshot, written

# ---- the secrets ------------------------------------------------------------------------------------------

ALNUM = string.ascii_letters + string.digits


def mixed(letters: str, digits: str, size: int) -> st.SearchStrategy[str]:
    """`size` characters, every other one a digit: no 12-character piece of it is also a word of the
    output (hypothesis found `AKIA` + `PYTHONUNBUFFERED` and a password `pytorchReplicaSpecs`, both
    in every manifest for their own reasons)."""
    half = size // 2
    return st.tuples(
        st.text(letters, min_size=size - half, max_size=size - half),
        st.text(digits, min_size=half, max_size=half),
    ).map(lambda t: "".join(c + d for c, d in zip(t[0], t[1] + " ", strict=False)).strip())


TOKENS = st.one_of(
    mixed(ALNUM, string.digits, 34).map(lambda s: "hf_" + s),
    mixed("ABCDEFGHIJKLMNOPQRSTUVWXYZ234567", "234567", 16).map(lambda s: "AKIA" + s),
    mixed(ALNUM, string.digits, 36).map(lambda s: "ghp_" + s),
)
# a password: no issuer's shape, only its place says it is one
PASSWORDS = st.integers(16, 32).flatmap(lambda n: mixed(ALNUM + "!%+-._~", string.digits, n))


@st.composite
def urls(draw) -> tuple[str, str]:
    """(a URL whose userinfo holds a password, the password)."""
    password = draw(PASSWORDS.filter(lambda s: "@" not in s))
    scheme = draw(st.sampled_from(["https", "http", "s3", "hf", "postgres"]))
    user = draw(st.sampled_from(["user", "AKIAIOSFODNN7EXAMPL3", "trainer", ""]))
    host = draw(st.sampled_from(["example.com", "bucket", "mirror.internal:8443"]))
    return f"{scheme}://{user}:{password}@{host}/data", password


def _keys() -> list[str]:
    from fsdpctl.settings import setting_keys

    return sorted(setting_keys())


KEYS = _keys()
SECRET_KEYS = ["HF_TOKEN"]
URL_KEYS = ["DATASET", "TOKENIZER", "RESUME", "PRETRAINED", "EXPORT_DIR", "HF_TOKEN"]

# every way a line can hold KEY and VALUE: python-dotenv reads the first group as KEY=VALUE, refuses
# or misreads the second (the issue's `HF_TOKEN <token>`, `HF_TOKEN:<token>`)
ACCEPTED = [
    "{k}={v}",
    '{k}="{v}"',
    "{k}='{v}'",
    "export {k}={v}",
    "{k} = {v}",
    "{k}={v} # a comment",
]
REFUSED = ["{k} {v}", "{k}:{v}", "{k}: {v}", '{k}="{v}', "export {k} {v}", "{k} == {v}"]
SET_FORMS = ["{k}={v}", "{k} {v}", "{k}:{v}", "{k}: {v}"]

COMMANDS = [
    ("config", "show"),
    ("config", "show", "-o", "json"),
    ("config", "show", "-o", "yaml"),
    ("config", "validate"),
    ("manifest", "--force"),
    ("manifest", "--force", "-o", "json", "--out-dir", "out"),
    ("--set", "BACKEND=eks", "manifest", "--force", "-o", "yaml"),
    ("job", "run", "--dry-run", "--force"),
    ("--debug", "--set", "JOB_NODES=nan", "config", "validate"),
]


@st.composite
def cases(draw):
    """(the secret, what it must never be seen as, how it is given: dotenv text, --set args,
    environment)."""
    what = draw(st.sampled_from(["token", "password in a secret key", "url"]))
    if what == "token":
        key, value = draw(st.sampled_from(KEYS)), draw(TOKENS)
        hidden = value
    elif what == "password in a secret key":
        key, value = draw(st.sampled_from(SECRET_KEYS)), draw(PASSWORDS)
        hidden = value
    else:
        key = draw(st.sampled_from(URL_KEYS))
        value, hidden = draw(urls())
    way = draw(st.sampled_from(["dotenv", "set", "environment"]))
    dotenv, sets, environ = "", [], {}
    if way == "dotenv":
        form = draw(st.sampled_from(ACCEPTED + REFUSED))
        dotenv = form.format(k=key, v=value) + "\n"
    elif way == "set":
        sets = ["--set", draw(st.sampled_from(SET_FORMS)).format(k=key, v=value)]
    else:
        environ = {
            draw(st.sampled_from([f"FSDPCTL_{key}", *([key] if key == "HF_TOKEN" else [])])): value
        }
    commands = draw(st.lists(st.sampled_from(COMMANDS), min_size=2, max_size=3, unique=True))
    return hidden, dotenv, sets, environ, commands


def _seen(hidden: str, text: str) -> list[str]:
    """Where `hidden` shows in `text`: whole, a 12-character piece (a cut quote), or any secret's
    shape."""
    pieces = [hidden] + [hidden[i : i + 12] for i in range(0, max(1, len(hidden) - 11), 4)]
    return [p for p in pieces if len(p) >= 12 and p in text] + leaks(text)


def one_case(case, root: Path, monkeypatch) -> None:
    hidden, dotenv, sets, environ, commands = case
    (root / ".env").write_text(dotenv)
    for var, value in environ.items():
        monkeypatch.setenv(var, value)
    try:
        for args in commands:
            before = snapshot(root)
            result = invoke(*sets, *args, catch_exceptions=True)
            said = f"{sets} {args} .env={dotenv!r} env={list(environ)}"
            assert result.exit_code in (0, 2), (
                f"{said}: rc={result.exit_code}\n{result.stderr[-1500:]}"
            )
            assert "internal error" not in result.stderr, f"{said}\n{result.stderr[-1500:]}"
            found = _seen(hidden, result.stdout + result.stderr)
            assert not found, (
                f"{said}: {found[:2]} shown\n{result.stderr[-800:]}\n{result.stdout[-800:]}"
            )
            for path in written(before, snapshot(root)):
                if path.is_file():
                    text = path.read_bytes().decode("utf-8", "replace")
                    assert not _seen(hidden, text), f"{said}: written to {path}"
    finally:
        for var in environ:
            monkeypatch.delenv(var, raising=False)


def _run(cli, tmp_path, monkeypatch, examples: int) -> None:
    monkeypatch.delenv("HF_TOKEN", raising=False)

    @settings(
        max_examples=examples,
        derandomize=True,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
        phases=[Phase.generate],
    )
    @given(cases())
    def each(case):
        one_case(case, tmp_path, monkeypatch)

    each()


def test_generated_secrets_in_every_place_are_never_shown_or_written(cli, tmp_path, monkeypatch):
    """The fast lane's share of generated cases (the slow lane runs more)."""
    _run(cli, tmp_path, monkeypatch, 12)


@pytest.mark.slow
def test_generated_secrets_many(cli, tmp_path, monkeypatch):
    _run(cli, tmp_path, monkeypatch, int(os.environ.get("FSDPCTL_TEST_SECRET_EXAMPLES", "120")))


# ---- the issue's own cases, named ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "line", ["HF_TOKEN plain-secret-value-0042", "HF_TOKEN:plain-secret-value-0042"]
)
def test_a_token_written_without_equals_is_not_printed(cli, tmp_path, line):
    """`HF_TOKEN <token>` and `HF_TOKEN:<token>` in .env or --set printed the token (in the parse
    error's quote, in the unknown-key warning): now masked by its place, after the secret's own
    name."""
    (tmp_path / ".env").write_text(line + "\n")
    shown = cli("config", "show")
    given = cli("--set", line, "config", "show")
    for result in (shown, given):
        assert "plain-secret-value-0042" not in result.stdout + result.stderr, result.stderr
    assert given.exit_code == 2 and "--set 'HF_TOKEN ***' is not KEY=VALUE" in given.stderr


@pytest.mark.parametrize("key", ["DATASET", "TOKENIZER", "RESUME"])
def test_a_password_in_a_url_is_masked_and_the_key_named(cli, key):
    """`config show`, `manifest` and `job run --dry-run` printed `https://user:pass@host`; now
    `https://user:***@host`, and a warning names the key (the job gets the masked URL: credentials
    go to it another way)."""
    url = "https://trainer:Pa55w0rd-not-shown@example.com/data"
    for args in (
        ["config", "show"],
        ["manifest", "--force"],
        ["job", "run", "--dry-run", "--force"],
    ):
        result = cli("--set", f"{key}={url}", *args)
        said = result.stdout + result.stderr
        assert "Pa55w0rd-not-shown" not in said, (args, said[-1500:])
        if args == ["config", "show"]:
            assert "https://trainer:***@example.com/data" in said
            assert f"warning: {key} (--set) looks like a URL with a password" in result.stderr


def test_endpoint_urls_with_passwords_are_masked_in_errors(cli, monkeypatch):
    """AWS_ENDPOINT_URL and HF_ENDPOINT are the SDKs' own variables; an error that names the
    endpoint (nothing listens on this port) names it masked."""
    from fsdpctl.adapters.etcd import free_port

    port = free_port()
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://admin:Aws-Pa55word-x1@127.0.0.1:{port}")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    monkeypatch.setenv("HF_ENDPOINT", f"http://admin:Hub-Pa55word-x1@127.0.0.1:{port}")
    for args in (["cluster", "status"], ["model", "fetch", "org/model", "--to", "hf", "--dry-run"]):
        result = cli("--set", "REQUEST_TIMEOUT=2", *args)
        assert result.exit_code == 1, result.stderr
        assert (
            "Pa55word" not in result.stdout + result.stderr and f"127.0.0.1:{port}" in result.stderr
        )


def test_hf_token_file_and_hf_token_both_set_says_which_wins(cli, tmp_path):
    """A bad HF_TOKEN_FILE was silently ignored when HF_TOKEN was set too: now one warning says the
    file is not read and HF_TOKEN wins, naming where each came from."""
    (tmp_path / ".env").write_text("HF_TOKEN_FILE=/nowhere/token\n")
    result = cli("--set", "HF_TOKEN=hf_aBcDeFgHiJkLmNoPqRsTuVwXyZ01234567", "config", "show")
    assert result.exit_code == 0
    assert (
        "warning: HF_TOKEN_FILE (.env line 1) is not read: HF_TOKEN (--set) is set too, and wins"
        in result.stderr
    )

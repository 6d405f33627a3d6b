"""Values carry the shape their destination needs, keys are read as they look, secrets are kept by
shape and by place, and volume stays bounded (issue 37). Each class is generated, and checked
through the CLI in process (tests/conftest.py), as `config validate` and as `job run --dry-run`
read it: one loader, one answer.

The destinations' own rules, as their sources and docs state them:
- srun and sbatch read every word that starts with '-' as one of their options (srun(1), getopt);
  SLURM_PYTHON is the program srun starts, so `--export` there became an srun option.
- An AWS profile is a section of the AWS config file, `[profile NAME]`, read by configparser
  (botocore/configloader.py raw_config_parse): one line, no brackets; a kubeconfig context is a
  name in a YAML list (`kubectl config get-contexts -o name`): one printable line.
- FSx for Lustre, SSD deployment types (SCRATCH_2, PERSISTENT_1, PERSISTENT_2): "the valid values
  are 1200 GiB, 2400 GiB, and increments of 2400 GiB" (FSx API Reference, CreateFileSystem,
  StorageCapacity, an Integer).
- Lookalikes: Unicode TR39 confusables.txt maps Cyrillic and Greek letters to the Latin letters they
  look like; NFKC folds fullwidth forms (UAX #15); zero-width and bidi characters are format
  characters, category Cf (UnicodeData.txt).
- python-dotenv 1.2's grammar (dotenv/parser.py) is what fsdpctl's one-pass reader reads: the two
  are held equal on generated text.
"""

from __future__ import annotations

import io
import json
import re
import unicodedata

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import invoke
from invariants import error_lines, snapshot, written

GIVEN = dict(
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
READERS = (("config", "validate"), ("job", "run", "--dry-run"))


def refused(key: str, value: str, reader: tuple[str, ...], says: str) -> None:
    r = invoke("--set", f"{key}={value}", *reader)
    assert r.exit_code == 2, (value, r.output)
    lines = error_lines(r.stderr)
    assert len(lines) == 1 and lines[0].startswith(f"error: {key}=") and says in lines[0], r.stderr


# ---- shapes -----------------------------------------------------------------------------------------------


@settings(max_examples=15, **GIVEN)
@given(
    value=st.text("abcdefxyz-/._+0123456789", min_size=0, max_size=12).map(lambda s: "-" + s),
    reader=st.sampled_from(READERS),
)
def test_a_program_path_never_starts_with_a_dash(cli, value, reader):
    """Generated options where SLURM_PYTHON's program goes: refused by both readers, before any
    srun line is written."""
    refused("SLURM_PYTHON", value, reader, "starts with '-'")


NAME_CHARS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.@:/+="
BAD_IN_A_NAME = st.sampled_from(["\n", "\r", "\t", "\x1b", "\x07", "\x00", "\x7f", "\u0085"])


@settings(max_examples=15, **GIVEN)
@given(
    key=st.sampled_from(["AWS_PROFILE", "KUBE_CONTEXT"]),
    head=st.text(NAME_CHARS, min_size=1, max_size=8),
    bad=BAD_IN_A_NAME,
    tail=st.text(NAME_CHARS, max_size=8),
    reader=st.sampled_from(READERS),
)
def test_a_name_with_a_control_character_is_refused(cli, key, head, bad, tail, reader):
    value = head + bad + tail
    if "\x00" in value:
        r = invoke("--set", f"{key}={value}", *reader)
        assert r.exit_code == 2 and "NUL" in r.stderr, r.output
        return
    refused(key, value, reader, "is not a")


@settings(max_examples=15, **GIVEN)
@given(key=st.sampled_from(["AWS_PROFILE", "KUBE_CONTEXT"]), value=st.text(NAME_CHARS, max_size=30))
def test_a_printable_name_is_taken(cli, key, value):
    """The other side: the names people have (`dev`, `AdministratorAccess-123456789012`,
    `arn:aws:eks:us-west-2:1:cluster/x`, `admin@kind`) are taken as they are."""
    r = invoke("--set", f"{key}={value}", "config", "show", "-o", "json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["settings"][key] == value


@settings(max_examples=40, **GIVEN)
@given(
    size=st.one_of(
        st.integers(1, 100_000),
        st.integers(1, 1000).map(lambda n: n * 2400),
        st.just(1200),
        st.integers(2**31 - 2400, 2**63 - 1),
    )
)
def test_fsx_sizes_are_the_ones_fsx_takes(cli, size):
    ok = size == 1200 or (size % 2400 == 0 and size <= 2**31 - 1)
    r = invoke("--set", f"FSX_STORAGE_GIB={size}", "config", "validate")
    assert (r.exit_code == 0) == ok, (size, r.output)
    if not ok:
        [line] = error_lines(r.stderr)
        assert line.startswith(f"error: FSX_STORAGE_GIB='{size}'")
        assert "1200, 2400 or a multiple of 2400" in line or "too large" in line, line


def test_the_token_itself_in_hf_token_file_is_refused_and_never_shown(cli):
    token = "Xq7" + "a1B2c3D4e5F6g7H8i9J0k"
    for reader in READERS:
        r = invoke("--set", f"HF_TOKEN_FILE={token}", *reader)
        assert r.exit_code == 2 and "looks like the token itself" in r.stderr, r.output
        assert token not in r.output
    r = invoke("--set", "HF_TOKEN_FILE=hf-token-2024-personal", "config", "validate")
    assert "looks like the token itself" not in r.stderr  # a file name, not a token


# ---- lookalike keys -----------------------------------------------------------------------------------

CYRILLIC = {
    "A": "А",
    "B": "В",
    "E": "Е",
    "K": "К",
    "M": "М",
    "H": "Н",
    "O": "О",
    "P": "Р",
    "C": "С",
    "T": "Т",
    "X": "Х",
}
GREEK = {
    "A": "Α",
    "B": "Β",
    "E": "Ε",
    "Z": "Ζ",
    "H": "Η",
    "I": "Ι",
    "K": "Κ",
    "M": "Μ",
    "N": "Ν",
    "O": "Ο",
    "P": "Ρ",
    "T": "Τ",
    "Y": "Υ",
    "X": "Χ",
}
INVISIBLE = ["\u200b", "\u200c", "\u200d", "\u2060", "\ufeff", "\u00ad", "\u202e"]


@st.composite
def lookalikes(draw) -> tuple[str, str]:
    """(a known key, the same key with lookalike or invisible characters)."""
    from fsdpctl.settings import setting_keys

    key = draw(st.sampled_from(sorted(k for k in setting_keys() if len(k) > 3)))
    chars = list(key)
    how = draw(st.sampled_from(["cyrillic", "greek", "invisible", "fullwidth", "mixed"]))
    positions = draw(st.lists(st.integers(0, len(chars) - 1), min_size=1, max_size=3, unique=True))
    for i in positions:
        c = chars[i]
        if how in ("cyrillic", "mixed") and c in CYRILLIC:
            chars[i] = CYRILLIC[c]
        elif how == "greek" and c in GREEK:
            chars[i] = GREEK[c]
        elif how == "fullwidth" and c.isalnum():
            chars[i] = chr(ord(c) + 0xFEE0)
        elif how in ("invisible", "mixed"):
            chars[i] = c + draw(st.sampled_from(INVISIBLE))
    odd = "".join(chars)
    if odd == key:
        odd = key[:1] + "\u200b" + key[1:]
    return key, odd


@settings(max_examples=20, **GIVEN)
@given(pair=lookalikes(), channel=st.sampled_from(["dotenv", "set", "environment"]))
def test_a_lookalike_key_gets_did_you_mean(cli, monkeypatch, pair, channel):
    """Generated keys that look like a setting but hold Cyrillic, Greek, fullwidth or invisible
    characters: the .env warning, the --set error and the environment warning name the key they
    look like, as an ASCII typo's do, and show the odd key escaped (never raw)."""
    key, odd = pair
    with monkeypatch.context() as m:
        if channel == "dotenv":
            (cli.cwd / ".env").write_text(f"{odd}=1\n", encoding="utf-8")
        elif channel == "environment":
            m.setenv(f"FSDPCTL_{odd}", "1")
        r = invoke(*(("--set", f"{odd}=1") if channel == "set" else ()), "config", "show")
        (cli.cwd / ".env").unlink(missing_ok=True)
    said = [line for line in r.stderr.splitlines() if "unknown" in line]
    assert len(said) == 1, r.stderr
    meant = f"FSDPCTL_{key}" if channel == "environment" else key
    assert f"did you mean {meant}?" in said[0], said[0]
    from fsdpctl.settings.dotenv import escaped

    assert escaped(odd) in said[0], said[0]  # the key as it is, every odd character escaped
    assert not any(unicodedata.category(c) == "Cf" for c in said[0]), said[0]


def test_the_named_lookalikes():
    """The issue's instances: a Cyrillic М, a zero-width space, fullwidth letters."""
    from fsdpctl.settings import setting_keys
    from fsdpctl.settings.dotenv import suggest, unknown_hint

    keys = setting_keys()
    assert suggest("МODEL", keys) == "MODEL" and suggest("MODEL\u200b", keys) == "MODEL"
    assert suggest("ＭＯＤＥＬ", keys) == "MODEL" and suggest("SEQ_LEM", keys) == "SEQ_LEN"
    assert "a Cyrillic 'М' (U+041C)" in unknown_hint("МODEL", keys)
    assert "an invisible U+200B (ZERO WIDTH SPACE)" in unknown_hint("MODEL\u200b", keys)


# ---- volume ---------------------------------------------------------------------------------------------


@settings(max_examples=10, **GIVEN)
@given(n=st.integers(0, 120))
def test_unknown_key_warnings_are_bounded(cli, n):
    (cli.cwd / ".env").write_text("".join(f"NOT_A_KEY_{i}=1\n" for i in range(n)))
    r = invoke("config", "validate")
    assert r.exit_code == 0, r.output
    warned = [line for line in r.stderr.splitlines() if line.startswith("warning:")]
    assert len(warned) == min(n, 20) + (n > 20), r.stderr
    if n > 20:
        assert warned[-1] == f"warning: .env: {n - 20} more unknown keys not shown"


def test_fifty_thousand_unknown_keys_are_read_and_counted(cli):
    """The issue's volume: 50,000 unknown keys in .env (628 KB) are 21 lines (its time is measured
    by benchmarks/settings_volume.py, not here)."""
    (cli.cwd / ".env").write_text("".join(f"K{i}={i}\n" for i in range(50_000)))
    r = invoke("config", "validate")
    assert r.exit_code == 0, r.output
    assert len(r.stderr.splitlines()) == 22, r.stderr  # 20 warnings, the count, the ✓ line


DOTENV_TEXT = st.lists(
    st.sampled_from(
        ["A", "b", "_", "=", "'", '"', "\\", "#", " ", "\t", "\n", "\r", "x", "é", "$", "{", "}"]
        + ["export ", "KEY=", "\\n", "\\'", '\\"']
    ),
    max_size=40,
).map("".join)


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(text=DOTENV_TEXT)
def test_the_one_pass_reader_reads_what_python_dotenv_reads(text):
    """fsdpctl.settings.dotenv.bindings against python-dotenv's parse_stream on generated text:
    the same keys, values, errors and original text, binding for binding."""
    from dotenv.parser import parse_stream

    from fsdpctl.settings.dotenv import bindings

    theirs = [(b.key, b.value, b.original.string, b.error) for b in parse_stream(io.StringIO(text))]
    ours = [(k, v, original, error) for k, v, _, original, error in bindings(text)]
    assert ours == theirs


def test_the_reader_names_each_keys_line():
    from fsdpctl.settings import parse_dotenv

    d = parse_dotenv("\n\nA=1\n# c\r\nB='x\ny'\r\rC=3\n", "f.env")
    assert d.lines == {"A": 3, "B": 5, "C": 8}


# ---- secrets by shape and place ---------------------------------------------------------------------------

ALNUM = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
B64 = ALNUM + "/+"


@st.composite
def secret_cases(draw) -> tuple[str, str, str]:
    """(the .env text, the secret that must never show, what it is)."""
    password = draw(st.text(ALNUM, min_size=10, max_size=24))
    kind = draw(st.sampled_from(["unclosed", "registry", "url", "s3", "token-file", "named"]))
    if kind == "unclosed":
        name = draw(st.sampled_from(["WANDB_API_KEY", "GITHUB_TOKEN", "DB_PASSWORD", "HF_TOKEN"]))
        quote = draw(st.sampled_from(['"', "'"]))
        return f"MODEL=tiny\n{name}={quote}{password}\n", password, kind
    if kind == "registry":
        user = draw(st.text("abcdefgh", min_size=1, max_size=6))
        return f"IMAGE_REGISTRY={user}:{password}@registry.example.com\n", password, kind
    if kind == "url":
        return f"DATASET=https://me:{password}@data.example.com/x.jsonl\n", password, kind
    if kind == "s3":
        secret = draw(st.text(B64, min_size=40, max_size=40))
        key_id = "AKIA" + draw(
            st.text("ABCDEFGHIJKLMNOPQRSTUVWXYZ234567", min_size=16, max_size=16)
        )
        return f"RESUME=s3://{key_id}:{secret}@bucket/ckpt\n", secret, kind
    if kind == "token-file":
        token = "T0k" + draw(st.text(ALNUM, min_size=20, max_size=30)) + "zZ9"
        return f"HF_TOKEN_FILE={token}\n", token, kind
    name = draw(st.sampled_from(["OPENAI_API_KEY", "MY_SECRET", "SERVICE_ACCESS_KEY"]))
    return f"{name}={password}\n", password, kind


@settings(max_examples=30, **GIVEN)
@given(
    case=secret_cases(),
    args=st.sampled_from(
        [
            ("config", "show"),
            ("config", "show", "-o", "json"),
            ("--debug", "config", "validate"),
            ("manifest", "--out-dir", "out"),
            ("job", "run", "--dry-run"),
        ]
    ),
)
def test_no_secret_by_shape_or_place_shows_or_is_written(cli, case, args):
    """Generated secrets where users put them: a secret-named key with its quote unclosed, a
    registry's user:password@host, a URL with a password, an s3:// URL holding a secret access key
    (with '/' and '+'), the token pasted into HF_TOKEN_FILE, an unknown secret-named key. Not in
    stdout, not in stderr (--debug's traceback included), not in any file written."""
    text, secret, kind = case
    (cli.cwd / ".env").write_text(text)
    before = snapshot(cli.cwd)
    r = invoke(*args)
    assert "internal error" not in r.stderr, r.output
    assert secret not in r.stdout and secret not in r.stderr, (kind, r.output)
    for path in written(before, snapshot(cli.cwd)):
        if path.is_file():
            assert secret not in path.read_text(errors="replace"), (kind, path)
    (cli.cwd / ".env").unlink()


def test_the_named_secret_instances():
    from fsdpctl.redact import redact

    assert redact('WANDB_API_KEY="0123456789abcdef0123') == 'WANDB_API_KEY="***'
    assert (
        redact("IMAGE_REGISTRY=user:hunter2hunter@registry") == "IMAGE_REGISTRY=user:***@registry"
    )
    s3 = "s3://AKIAABCDEFGHIJKLMNOP:wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY@bucket/ckpt"
    assert redact(s3) == "s3://***:***@bucket/ckpt"
    # and what is not a secret stays: a port and a path, an image digest, a token file's path
    for plain in (
        "https://host:8080/users/a@b.com",
        "repo:1.0@sha256:abcdef",
        "HF_TOKEN_FILE=/run/secrets/hf",
        "MAX_TOKENS=1234567890123456789",
    ):
        assert redact(plain) == plain
    assert re.fullmatch(r"\*\*\*", redact("hf_" + "a" * 34))

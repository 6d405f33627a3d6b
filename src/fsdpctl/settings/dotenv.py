"""Where values come from (pure): .env parsing, the FSDPCTL_ prefix of the environment, and the
warnings about a key that is none or a secret in a plain one."""

from __future__ import annotations

import difflib
import re
import unicodedata
from collections.abc import Collection, Iterator, Mapping
from typing import Any

from fsdpctl.errors import SettingsError
from fsdpctl.redact import MASK, SECRET_ENV, redact, secret_kind, secret_name, token_shaped
from fsdpctl.settings.rules import (
    ENV_PREFIX,
    OWN_ENV,
    OWN_ENV_PREFIXES,
    PATH_KEYS,
    SECRET_KEYS,
    SHARED_ENV,
)


class Dotenv(dict[str, str]):
    """A .env file's KEY -> value, with the line each key was last set on (`lines`) and, when
    several files were read, the file (`origins`): errors name them."""

    def __init__(
        self,
        values: Mapping[str, str] | None = None,
        lines: Mapping[str, int] | None = None,
        origins: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(values or {})
        self.lines = dict(lines or {})
        self.origins = dict(origins or {})

    def where(self, key: str, default: str) -> str:
        """`<file> line N` for a key read from a file."""
        name = self.origins.get(key, default)
        return f"{name} line {self.lines[key]}" if key in self.lines else name


def merged(files: list[Dotenv]) -> Dotenv:
    """Several settings files in the order given: a key set in a later one wins over an earlier
    one's (docker's repeated --env-file, `docker run` reference), each value keeping its file and
    line."""
    out = Dotenv()
    for d in files:
        for key, value in d.items():
            out.pop(key, None)  # the order of keys is the order of their last setting
            out[key] = value
            out.lines[key] = d.lines[key]
            if key in d.origins:
                out.origins[key] = d.origins[key]
    return out


def parse_dotenv(text: str, origin: str = ".env") -> Dotenv:
    """KEY=VALUE lines (python-dotenv's grammar, `bindings`); a line it cannot parse is an error,
    not a silent skip."""
    values, bad = Dotenv(), []
    for key, value, line, original, error in bindings(text):
        if error:
            shown = _masked_line(original.strip())  # masked, then cut: no part of a secret
            bad.append(f"{origin} line {line}: cannot parse {shown[:40]!r}: write KEY=VALUE")
        elif key:
            values.pop(key, None)
            values[key] = value or ""
            values.lines[key] = line
            values.origins[key] = origin
    if bad:
        raise SettingsError(
            bad[:MAX_SHOWN] + _more(len(bad), "lines that cannot be parsed", origin)
        )
    return values


# python-dotenv 1.2's grammar (dotenv/parser.py: its regular expressions, parse_binding,
# parse_value), read in one pass: python-dotenv counts the lines of every piece it reads with
# re.findall and spends about 110 us a line (50,000 lines: 5.6 s); this reads the same bindings from
# the same text (tests/test_edges.py holds the two equal on generated text) in a few us a line.
_multiline_whitespace = re.compile(r"\s*", re.MULTILINE)
_whitespace = re.compile(r"[^\S\r\n]*")
_export = re.compile(r"(?:export[^\S\r\n]+)?")
_single_quoted_key = re.compile(r"'([^']+)'")
_unquoted_key = re.compile(r"([^=\#\s]+)")
_equal_sign = re.compile(r"(=[^\S\r\n]*)")
_single_quoted_value = re.compile(r"'((?:\\.|[^'\\])*)'", re.DOTALL)
_double_quoted_value = re.compile(r'"((?:\\.|[^"\\])*)"', re.DOTALL)
_unquoted_value = re.compile(r"([^\r\n]*)")
_comment = re.compile(r"(?:[^\S\r\n]*#[^\r\n]*)?")
_end_of_line = re.compile(r"[^\S\r\n]*(?:\r\n|\n|\r|$)")
_rest_of_line = re.compile(r"[^\r\n]*(?:\r|\n|\r\n)?")
_double_quote_escapes = re.compile(r"\\[\\'\"abfnrtv]")
_single_quote_escapes = re.compile(r"\\[\\']")
_inline_comment = re.compile(r"\s+#.*")
# the common line, `KEY=value` with no space, quote or comment: what the rules above make of it,
# read in one match
_simple = re.compile(r"([^=\#\s'][^=\#\s]*)=([^\s'\"#]\S*)?(\r\n|\n|\r|$)")


class _NoMatch(Exception):
    pass


def _newlines(s: str) -> int:
    """Line ends in `s` as python-dotenv counts them: CRLF, LF and CR, each one."""
    return s.count("\n") + s.count("\r") - s.count("\r\n")


def _decode(regex: re.Pattern[str], value: str) -> str:
    import codecs

    return regex.sub(lambda m: codecs.decode(m.group(0), "unicode-escape"), value)


def bindings(text: str) -> Iterator[tuple[str | None, str | None, int, str, bool]]:
    """(key, value, line of the key, the binding's text, error) for each binding of `text`, as
    python-dotenv's parse_stream reads them; a comment or blank tail is a binding with no key."""
    text = text.removeprefix("\ufeff")
    pos, line, end = 0, 1, len(text)

    def read(regex: re.Pattern[str]) -> re.Match[str]:
        nonlocal pos, line
        m = regex.match(text, pos)
        if m is None:
            raise _NoMatch
        line += _newlines(m.group(0))
        pos = m.end()
        return m

    while pos < end:
        mark, mark_line = pos, line
        try:
            read(_multiline_whitespace)
            key_line = line
            if pos >= end:
                yield None, None, mark_line, text[mark:pos], False
                break
            if simple := _simple.match(text, pos):
                line, pos = line + _newlines(simple.group(3)), simple.end()
                yield simple.group(1), simple.group(2) or "", key_line, text[mark:pos], False
                continue
            read(_export)
            key = _key(text, pos, read)
            read(_whitespace)
            value = None
            if text.startswith("=", pos):
                equal = read(_equal_sign).group(1)
                # `KEY= # comment`: empty, the rest a comment; `KEY=#x`: the value is #x
                value = (
                    "" if len(equal) > 1 and text.startswith("#", pos) else _value(text, pos, read)
                )
            read(_comment)
            read(_end_of_line)
            yield key, value, key_line, text[mark:pos], False
        except _NoMatch:
            read(_rest_of_line)
            original = text[mark:pos]
            skipped = original[: len(original) - len(original.lstrip())]
            yield None, None, mark_line + _newlines(skipped), original, True


def _key(text: str, pos: int, read: Any) -> str | None:
    char = text[pos : pos + 1]
    if char == "#":
        return None
    m = read(_single_quoted_key if char == "'" else _unquoted_key)
    return str(m.group(1))


def _value(text: str, pos: int, read: Any) -> str:
    char = text[pos : pos + 1]
    if char == "'":
        return _decode(_single_quote_escapes, read(_single_quoted_value).group(1))
    if char == '"':
        return _decode(_double_quote_escapes, read(_double_quoted_value).group(1))
    if char in ("", "\n", "\r"):
        return ""
    return _inline_comment.sub("", read(_unquoted_value).group(1)).rstrip()


# the name a line (or a --set) starts with, however what follows is written: KEY=, KEY:, KEY value
_LEADING_KEY = re.compile(r"\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)")


def _masked_line(line: str) -> str:
    """A .env line (or --set) as an error may quote it: secret-shaped values masked, and everything
    after a secret's own name, whatever separates them (HF_TOKEN="abc... with its quote unclosed,
    `HF_TOKEN abc`, `HF_TOKEN:abc`: the value has no shape to recognise, its place says it)."""
    m = _LEADING_KEY.match(line)
    if m and secret_key(m.group(1)) and line[m.end() :].strip():
        return f"{line[: m.end()]} {MASK}"
    return redact(line)


def secret_key(name: str) -> bool:
    """Whether a key's name says its value is a secret: fsdpctl's own (HF_TOKEN) and the ones other
    tools read (WANDB_API_KEY, GITHUB_TOKEN, DB_PASSWORD: redact.SECRET_NAME)."""
    return name.removeprefix(ENV_PREFIX) in (*SECRET_ENV, *SECRET_KEYS) or secret_name(name)


def masked_line(line: str) -> str:
    return _masked_line(line)


def _shown_key(key: str) -> str:
    """A .env key as a warning may name it: python-dotenv takes `HF_TOKEN:abc` (no `=`) as a key
    with no value, so a key that is not a name shows only up to where it stops being one. A name
    with lookalike or invisible characters (`looks_like`) is shown whole, each such character
    escaped (`\\u041cODEL`)."""
    if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.\-]*", key):
        return key
    if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.\-]*", looks_like(key)):
        return escaped(key)
    m = _LEADING_KEY.match(key)
    head = m.group(1) if m else ""
    return f"{head}... ({len(key) - len(head)} more characters, not a name)"


def escaped(text: str) -> str:
    """`text` with every character outside printable ASCII escaped as Python writes it."""
    return "".join(c if " " <= c <= "~" else ascii(c)[1:-1] for c in text)


# Letters of other scripts that look like Latin capitals and small letters (Unicode Technical
# Standard #39, confusables.txt: the Cyrillic and Greek entries whose prototype is one Latin
# letter). A key typed on a Cyrillic or Greek layout, or pasted from a document, is the key it looks
# like.
CONFUSABLES = str.maketrans(
    "АВЕЅІЈКМНОРСТХУԚԜаеіјоѕрсхуһԁԛԝӏӀΑΒΕΖΗΙΚΜΝΟΡΤΥΧοιν",
    "ABESIJKMHOPCTXYQWaeijospcxyhdqwlIABEZHIKMNOPTYXoiv",
)


def looks_like(key: str) -> str:
    """The name `key` looks like: compatibility forms folded (NFKC: fullwidth ＭＯＤＥＬ is MODEL), the
    Cyrillic and Greek lookalikes of Latin letters read as those letters (CONFUSABLES), and
    invisible characters (format characters, Unicode category Cf: a zero-width space, a BOM, a bidi
    mark) and spaces dropped."""
    folded = unicodedata.normalize("NFKC", key).translate(CONFUSABLES)
    return "".join(c for c in folded if unicodedata.category(c) != "Cf" and not c.isspace())


def _odd(key: str) -> str:
    """What in `key` is not what it looks like, in words: `a Cyrillic 'М' (U+041C)`, `an invisible
    U+200B (ZERO WIDTH SPACE)`."""
    found = []
    for c in dict.fromkeys(key):
        if " " <= c <= "~":
            continue
        name = unicodedata.name(c, "")
        if unicodedata.category(c) == "Cf" or not c.isprintable():
            found.append(f"an invisible U+{ord(c):04X}" + (f" ({name})" if name else ""))
        else:
            script = name.split(" ")[0].title() if name else "non-ASCII"
            found.append(f"a {script} '{c}' (U+{ord(c):04X})")
    return ", ".join(found[:3])


def suggest(key: str, known: Collection[str]) -> str | None:
    """The known key `key` was likely meant to be: its lookalike (`looks_like`), in any case, else
    the closest by spelling (difflib, as for an ASCII typo); None when nothing is close."""
    plain = looks_like(key)
    for candidate in (plain, plain.upper()):
        if candidate in known and candidate != key:
            return candidate
    close = difflib.get_close_matches(plain.upper(), known, n=1)
    return close[0] if close else None


def unknown_hint(key: str, known: Collection[str]) -> str:
    """`: did you mean MODEL? (it holds a Cyrillic 'М' (U+041C))`, or `: it is ignored`."""
    meant = suggest(key, known)
    if meant is None:
        return ": it is ignored"
    odd = _odd(key)
    return f": did you mean {meant}?" + (f" (it holds {odd})" if odd else "")


# Warnings about unknown keys name the first few; a file of thousands is a file of something else
MAX_SHOWN = 20


def _more(count: int, what: str, where: str) -> list[str]:
    return [f"{where}: {count - MAX_SHOWN} more {what} not shown"] if count > MAX_SHOWN else []


def secrets_by_place(
    dotenv: Mapping[str, str], environ: Mapping[str, str], flags: Mapping[str, str]
) -> list[str]:
    """The values that are secrets by where they were put, whatever their shape, to be masked in
    everything fsdpctl prints or writes (redact.add_secrets): a key whose name says it is one
    (WANDB_API_KEY in .env, GITHUB_TOKEN in the environment: secret_key), and one token-shaped word
    where the path of a secret's file goes (HF_TOKEN_FILE=<the token itself>: PATH_KEYS)."""
    found = []
    for layer in (dotenv, environ, flags):
        for key, value in layer.items():
            plain = key.removeprefix(ENV_PREFIX)
            if secret_key(key) or (plain in PATH_KEYS and token_shaped(value)):
                found.append(value)
    return found


def secret_warnings(raw: Mapping[str, str], sources: Mapping[str, str]) -> list[str]:
    """A token pasted into a key that is not secret (TOKENIZER, IMAGE_TAG, DATASET_SPLIT), or a URL
    with a password (DATASET=https://user:pass@host/...), would reach the manifests and the pods'
    environment in clear: every output masks it, and this warning names the key. HF_TOKEN and
    HF_TOKEN_FILE both set: the file is never read, and this says so (which one wins)."""
    found = []
    if raw.get("HF_TOKEN") and raw.get("HF_TOKEN_FILE"):
        found.append(
            f"HF_TOKEN_FILE ({sources.get('HF_TOKEN_FILE', 'default')}) is not read: HF_TOKEN "
            f"({sources.get('HF_TOKEN', 'default')}) is set too, and wins; unset one of them"
        )
    for key, value in raw.items():
        kind = None if key in SECRET_KEYS else secret_kind(value)
        fix = (
            "so the job gets *** for the password too: give the job its credentials another way"
            if kind == "a URL with a password"
            else "so the job gets ***; put secrets in HF_TOKEN or HF_TOKEN_FILE"
        )
        if kind:
            found.append(
                f"{key} ({sources.get(key, 'default')}) looks like {kind}: masked in every output, {fix}"
            )
    return found


def dotenv_warnings(dotenv: Mapping[str, str], keys: Mapping[str, str], name: str) -> list[str]:
    """A key of .env that is no setting: named with its line and the key it was likely meant to be
    (the plain name, for a FSDPCTL_<KEY> copied from the environment's spelling; the key a lookalike
    spells). The first MAX_SHOWN, then how many more."""
    unknown = [key for key in dotenv if key not in keys]
    where = getattr(dotenv, "where", lambda key, default: default)
    warnings = [
        _unknown_dotenv_key(key, keys, where(key, name), name) for key in unknown[:MAX_SHOWN]
    ]
    return warnings + _more(len(unknown), "unknown keys", name)


def _unknown_dotenv_key(key: str, keys: Mapping[str, str], where: str, name: str) -> str:
    plain = key.removeprefix(ENV_PREFIX)
    if _shown_key(key) != key and "..." in _shown_key(key):
        # `HF_TOKEN:value`, `HF_TOKEN value`: the value must not be echoed
        head = _shown_key(key).split("...")[0]
        hint = (
            f": write {head}=VALUE" if head.removeprefix(ENV_PREFIX) in keys else ": it is ignored"
        )
        return f"{where}: unknown key {_shown_key(key)}{hint}"
    if key != plain and plain in keys:
        hint = (
            f": did you mean {plain}? ({name} takes the plain names; FSDPCTL_ is the environment's)"
        )
    else:
        hint = unknown_hint(plain if plain != key and plain in keys else key, keys)
    return f"{where}: unknown key {_shown_key(key)}{hint}"


def environment_settings(
    environ: Mapping[str, str], keys: Mapping[str, str]
) -> tuple[dict[str, str], dict[str, str], list[str]]:
    """The settings the process environment gives: KEY -> value and KEY -> source (`environment
    VAR`), read from FSDPCTL_<KEY> and, for SHARED_ENV, the plain name (FSDPCTL_<KEY> wins); and a
    warning for each FSDPCTL_ variable that is neither a setting nor fsdpctl's own (OWN_ENV), with
    the name it may mean (the first MAX_SHOWN, then how many more)."""
    values, sources, unknown = {}, {}, []
    for key in SHARED_ENV:
        if key in environ:
            values[key], sources[key] = environ[key], f"environment {key}"
    known = [ENV_PREFIX + key for key in keys] + list(OWN_ENV)
    for var in sorted(environ):
        if not looks_like(var).upper().startswith(ENV_PREFIX):
            continue
        key = var.removeprefix(ENV_PREFIX)
        if var.startswith(ENV_PREFIX) and key in keys:
            values[key], sources[key] = environ[var], f"environment {var}"
        elif var not in OWN_ENV and not var.startswith(OWN_ENV_PREFIXES):
            unknown.append(var)
    warnings = [
        f"environment: unknown variable {_shown_key(var)}{unknown_hint(var, known)}"
        for var in unknown[:MAX_SHOWN]
    ]
    return values, sources, warnings + _more(len(unknown), "unknown variables", "environment")

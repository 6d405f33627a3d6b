"""The one checker of what any fsdpctl command may do with any input, shared by
tests/test_bad_input.py and the CLI fuzzer. Take a `snapshot` of every directory the command could
write (FSDPCTL_HOME, the output directory, the working directory) before and after, then
`check_outcome`:

- the exit code is a documented one (fsdpctl.errors.ExitCode; by default 0, 1, 2, 4 or 130);
- no Python traceback without --debug, and no exception escaped the CLI;
- every error is one line, `error: ...` (the format of fsdpctl.cli._Group), optionally followed by one
  `  hint: ...` line; with `names`, the error line names one of them (the key, the path);
- no secret (the given values, or anything shaped like one: fsdpctl.redact.SHAPES) in stdout, stderr or any
  file the command wrote;
- a failed command writes nothing: no new or changed file, no new directory; and no command leaves a temp
  file, an empty new directory or a zero-byte new file behind.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fsdpctl.errors import ExitCode
from fsdpctl.redact import SHAPES

# what a command that is not `job wait` may exit with (docs/reference/output.md "Exit codes")
DOCUMENTED = frozenset(
    {ExitCode.OK, ExitCode.FAILURE, ExitCode.BAD_INPUT, ExitCode.JOB_NOT_FOUND, 130}
)
JOB_WAIT = DOCUMENTED | {ExitCode.JOB_FAILED, ExitCode.JOB_TIMED_OUT, ExitCode.JOB_STOPPED}
TRACEBACK = "Traceback (most recent call last)"
# names an atomic write leaves only when it failed half-way (files.atomic_write writes `.NAME.tmp*`)
TEMP_MARKS = (".tmp", ".part", ".partial", "~", ".swp")


@dataclass(frozen=True)
class Entry:
    kind: str  # "dir", "file", "link", "other"
    size: int
    mtime_ns: int


Snapshot = dict[Path, Entry]


def snapshot(*roots: Path | str) -> Snapshot:
    """Every path under each root (the roots included, when they exist), without following links."""
    found: Snapshot = {}
    for root in map(Path, roots):
        if not os.path.lexists(root):
            continue
        found[root] = _entry(root)
        if found[root].kind != "dir":
            continue
        for dirpath, dirnames, filenames in os.walk(root, onerror=lambda e: None):
            for name in (*dirnames, *filenames):
                path = Path(dirpath, name)
                try:
                    found[path] = _entry(path)
                except OSError:  # vanished between the listing and the stat
                    continue
    return found


def _entry(path: Path) -> Entry:
    st = os.lstat(path)
    kind = (
        "dir"
        if stat.S_ISDIR(st.st_mode)
        else "file"
        if stat.S_ISREG(st.st_mode)
        else "link"
        if stat.S_ISLNK(st.st_mode)
        else "other"
    )
    return Entry(kind, st.st_size, st.st_mtime_ns)


def written(before: Snapshot, after: Snapshot) -> list[Path]:
    """Paths new in `after`, or changed since `before` (a file: kind, size or mtime; a directory:
    only its kind, as a temp entry made and removed again changes its mtime, not what it holds);
    sorted."""
    return sorted(p for p, e in after.items() if not _same(before.get(p), e))


def _same(old: Entry | None, new: Entry) -> bool:
    if old is None or old.kind != new.kind:
        return False
    return new.kind == "dir" or old == new


def error_lines(stderr: str) -> list[str]:
    """fsdpctl's own error lines (`error: ...`) and click's usage errors (`Error: ...`)."""
    return [line for line in stderr.splitlines() if line.startswith(("error:", "Error:"))]


def check_outcome(
    result: Any,
    *,
    written_before: Snapshot,
    written_after: Snapshot,
    secrets: Iterable[str] = (),
    allowed_codes: Iterable[int] = DOCUMENTED,
    names: Iterable[str] = (),
    debug: bool = False,
) -> None:
    """Assert every invariant above on one finished command. `result` has exit_code, stdout, stderr
    and, for an in-process run, exception (tests/conftest.CliResult). `names`: the key or path a
    failure must name in its error line (any one of them). Raises AssertionError saying which
    invariant broke and showing the output."""
    rc, stdout, stderr = result.exit_code, result.stdout or "", result.stderr or ""
    shown = f"rc={rc}\n--- stdout\n{stdout[-3000:]}\n--- stderr\n{stderr[-3000:]}"
    allowed = {int(c) for c in allowed_codes}
    assert rc in allowed, f"exit code {rc} is not one of {sorted(allowed)}\n{shown}"
    exc = getattr(result, "exception", None)
    assert exc is None or isinstance(exc, SystemExit), (
        f"exception escaped the CLI: {exc!r}\n{shown}"
    )
    if not debug:
        assert TRACEBACK not in stdout + stderr, f"traceback without --debug\n{shown}"
    _check_errors(rc, stderr, tuple(names), shown)
    changed = written(written_before, written_after)
    _check_secrets(stdout, stderr, changed, tuple(s for s in secrets if s), shown)
    _check_written(rc, written_before, written_after, changed, shown)


def _check_errors(rc: int, stderr: str, names: tuple[str, ...], shown: str) -> None:
    lines = stderr.splitlines()
    errors = error_lines(stderr)
    if rc in (ExitCode.BAD_INPUT, ExitCode.JOB_NOT_FOUND):
        assert errors, f"exit {rc} without an error line\n{shown}"
    for i, line in enumerate(lines):
        if not line.startswith("error:"):
            continue
        assert line[len("error:") :].strip(), f"empty error line\n{shown}"
        # a continuation (an error wrapped or spread over lines) is anything but a hint, the next
        # error or a warning: `error: X` must stand alone
        nxt = lines[i + 1] if i + 1 < len(lines) else ""
        ok_next = nxt == "" or nxt.startswith(("error:", "warning:", "  hint: "))
        assert ok_next, f"error spread over more than one line: {line!r} then {nxt!r}\n{shown}"
        if nxt.startswith("  hint: "):
            after = lines[i + 2] if i + 2 < len(lines) else ""
            assert after == "" or after.startswith(("error:", "warning:")), (
                f"hint spread over more than one line: {nxt!r} then {after!r}\n{shown}"
            )
    if names and rc != ExitCode.OK:
        assert any(n in line for line in errors for n in names), (
            f"no error line names any of {list(names)}\n{shown}"
        )


def _check_secrets(
    stdout: str, stderr: str, changed: list[Path], secrets: tuple[str, ...], shown: str
) -> None:
    def leaks(text: str) -> list[str]:
        found = [s for s in secrets if s in text]
        return found + [m.group(0) for shape in SHAPES for m in shape.finditer(text)]

    for where, text in (("stdout", stdout), ("stderr", stderr)):
        assert not leaks(text), f"secret-shaped value in {where}: {leaks(text)[:3]}\n{shown}"
    for path in changed:
        if path.is_file() and not path.is_symlink():
            try:
                text = path.read_bytes().decode("utf-8", "replace")
            except OSError:
                continue
            assert not leaks(text), (
                f"secret-shaped value written to {path}: {leaks(text)[:3]}\n{shown}"
            )


def _check_written(
    rc: int, before: Snapshot, after: Snapshot, changed: list[Path], shown: str
) -> None:
    if rc != ExitCode.OK:
        assert not changed, (
            f"failed command (exit {rc}) wrote {[str(p) for p in changed[:10]]}\n{shown}"
        )
    for path in changed:
        entry = after[path]
        assert not any(path.name.endswith(m) or f"{m}." in path.name for m in TEMP_MARKS), (
            f"temp file left behind: {path}\n{shown}"
        )
        if path in before:
            continue
        if entry.kind == "file":
            assert entry.size > 0, f"zero-byte file written: {path}\n{shown}"
        if entry.kind == "dir":
            assert any(p.parent == path for p in after), (
                f"empty directory left behind: {path}\n{shown}"
            )

"""The size rule (STYLE.md "Size and shape", issue 44): no module under src/ or trainer/ over 500
lines, no function over 50 (def line to last line, decorators aside; ast). What is over today is
listed below with its size: an entry may only shrink; one back under the limit must leave the list
(the test says so), so the list only gets shorter."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODULE_MAX, FUNCTION_MAX = 500, 50

# "path" (a module) or "path:function" -> its size today; each to be cut below the limit
ALLOWED = {
    "trainer/fsdptrain/config.py": 507,
}


def sizes() -> dict[str, int]:
    """Every module's line count and every function's (nested and methods too) under src/ and
    trainer/, keyed as ALLOWED is."""
    found = {}
    for top in ("src", "trainer"):
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            text = path.read_text(encoding="utf-8")
            found[rel] = len(text.splitlines())
            for node in ast.walk(ast.parse(text)):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    assert node.end_lineno is not None
                    key = f"{rel}:{node.name}"
                    found[key] = max(found.get(key, 0), node.end_lineno - node.lineno + 1)
    return found


def over(found: dict[str, int]) -> dict[str, int]:
    return {k: n for k, n in found.items() if n > (FUNCTION_MAX if ":" in k else MODULE_MAX)}


def test_no_module_over_500_lines_and_no_function_over_50():
    found = sizes()
    grown = {k: (n, ALLOWED.get(k)) for k, n in over(found).items() if n > ALLOWED.get(k, 0)}
    assert not grown, f"over the limit (size, allowed): {grown}: cut them into smaller pieces"
    stale = sorted(k for k in ALLOWED if k not in over(found))
    assert not stale, f"back under the limit or gone: take them off ALLOWED: {stale}"


def test_the_measure_counts_what_it_claims(tmp_path):
    """The rule's measure on generated code: a function of n lines counts n, a module of m lines m,
    whatever the nesting."""
    for n in (2, 3, 50, 51, 120):
        body = "".join(f"    x{i} = {i}\n" for i in range(n - 1))
        nested = "class C:\n" + "".join(
            "    " + line + "\n" for line in f"def f():\n{body}".splitlines()
        )
        for text in (f"def f():\n{body}", nested):
            counted = max(
                node.end_lineno - node.lineno + 1
                for node in ast.walk(ast.parse(text))
                if isinstance(node, ast.FunctionDef) and node.end_lineno is not None
            )
            assert counted == n
            assert bool(over({"m.py:f": counted})) == (n > FUNCTION_MAX)
        assert bool(over({"m.py": n * 5})) == (n * 5 > MODULE_MAX)

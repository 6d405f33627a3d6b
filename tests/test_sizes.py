"""The size rule (STYLE.md "Size and shape", issue 44): no module under src/ or trainer/ over 500
lines, no function over 50 (def line to last line, decorators aside; ast). Nothing is exempt: what
grows past a limit is cut into named pieces."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODULE_MAX, FUNCTION_MAX = 500, 50


def sizes() -> dict[str, int]:
    """Every module's line count ("path") and every function's ("path:function"; nested and methods
    too, the longest of a name) under src/ and trainer/."""
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
    found = over(sizes())
    assert not found, f"over the limit (lines): {found}: cut them into smaller pieces"


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

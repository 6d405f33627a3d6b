"""One check result, shared by `fsdpctl doctor` (this machine) and `fsdpctl cluster check` (AWS): a
name, a status, what was found and the fix in one line (pure)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

OK, WARN, FAIL, SKIPPED = "ok", "warn", "fail", "skipped"


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # OK | WARN | FAIL | SKIPPED
    detail: str
    fix: str = ""

    def as_dict(self) -> dict[str, str]:
        return asdict(self)


def any_failed(checks: list[Check]) -> bool:
    return any(c.status == FAIL for c in checks)

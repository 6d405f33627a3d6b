"""What outside programs answer, checked for the shape fsdpctl needs before it is used (pure).

A scheduler's or an API's output is outside input like a user's: an id that is negative, longer than
the id type, or not a number at all would otherwise be handed back to the scheduler as an option
(`scontrol show job -1`) or shown as fact. Each check returns the value or raises Unshaped, one line
naming the command and the value.
"""

from __future__ import annotations

import re

from fsdpctl.errors import FsdpctlError

# Slurm's job ids are uint32_t (slurm.h: job_id); NO_VAL (0xfffffffe) and INFINITE (0xffffffff) are
# its sentinels, never a job's id, and 0 is no job.
SLURM_ID_MAX = 0xFFFFFFFD
COUNT_MAX = 2**31 - 1
_DIGITS = re.compile(r"[0-9]{1,10}")


class Unshaped(FsdpctlError):
    """An outside answer that is not the shape it must have, named with the command that gave it."""

    def __init__(self, command: str, field: str, value: str, want: str):
        shown = value if len(value) <= 60 else value[:57] + "..."
        super().__init__(
            f"`{command}` answered {field}={shown!r}, not {want}",
            hint="the scheduler's answer was not used; run the command by hand to see what it says",
        )
        self.command, self.field, self.value = command, field, value


def slurm_id(text: str, command: str, field: str = "job id") -> int:
    """A Slurm job id: decimal digits, 1 to SLURM_ID_MAX."""
    text = text.strip()
    if not _DIGITS.fullmatch(text) or not 1 <= int(text) <= SLURM_ID_MAX:
        raise Unshaped(command, field, text, f"a Slurm job id (1 to {SLURM_ID_MAX})")
    return int(text)


def count(text: str, command: str, field: str) -> int:
    """A non-negative count (restarts, nodes): decimal digits within int32."""
    text = text.strip()
    if not _DIGITS.fullmatch(text) or int(text) > COUNT_MAX:
        raise Unshaped(command, field, text, "a count (0 or more)")
    return int(text)


def is_slurm_id(value: object) -> bool:
    """Whether a recorded value is a Slurm job id (a state's, read back)."""
    return isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= SLURM_ID_MAX

"""The tables fsdpctl prints: plain text in every cell (never rich markup), no box off a terminal,
`key: value` lines on a terminal too narrow for the columns."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from fsdpctl.cli.common import out
from fsdpctl.cli.streams import escape_controls

# A column narrower than this (or than its widest cell, when that is less) shows nothing a reader
# can use: a table that cannot give each column that much is shown as `key: value` lines instead.
NARROWEST_COLUMN = 8


class PlainTable(Table):
    """A table whose text cells are shown as they are. rich reads a str cell as markup: a log line,
    a path or a setting holding `[...]` (gloo's `[/__w/...]`, `[rank0]:`) would vanish in part or
    raise MarkupError. Here a str is plain text by construction (its control characters escaped); a
    cell styled on purpose is passed as a `Text`. Off a terminal (a pipe, a file) it has no box:
    plain columns for grep and awk. On a terminal too narrow to give every column room
    (NARROWEST_COLUMN), each row is shown as `key: value` lines (a table without a header: its
    first column is the key)."""

    def __init__(self, *headers: Any, **kwargs: Any) -> None:
        if not out.is_terminal:
            kwargs["box"] = None
            kwargs.setdefault("pad_edge", False)
        super().__init__(*headers, **kwargs)
        self.plain_rows: list[list[Text]] = []

    def add_row(self, *cells: Any, **kwargs: Any) -> None:
        shown = [Text(escape_controls(c, value=True)) if isinstance(c, str) else c for c in cells]
        self.plain_rows.append([c if isinstance(c, Text) else Text(str(c or "")) for c in shown])
        super().add_row(*shown, **kwargs)

    def __rich_console__(self, console: Console, options: Any) -> Any:
        if self._fits(options.max_width):
            yield from super().__rich_console__(console, options)
            return
        yield from self._as_lines()

    def _fits(self, width: int) -> bool:
        """Whether every column can have NARROWEST_COLUMN cells (or all its widest cell needs)."""
        need = 0
        for i, column in enumerate(self.columns):
            header = Text.from_markup(column.header) if isinstance(column.header, str) else None
            cells = [row[i].cell_len for row in self.plain_rows if i < len(row)]
            widest = max([header.cell_len if header else 0, *cells, 1])
            need += min(widest, NARROWEST_COLUMN) + self.padding[1] + self.padding[3]
        edges = 0 if self.box is None else len(self.columns) + 1
        return not self.columns or width >= need + edges

    def _as_lines(self) -> Any:
        if self.title:
            yield Text(str(self.title))
        heads = [str(c.header) for c in self.columns]
        for n, row in enumerate(self.plain_rows):
            if self.show_header:
                if n:
                    yield Text("")
                for head, cell in zip(heads, row, strict=False):
                    yield Text(f"{head}: ").append_text(cell)
            elif row:
                key = row[0].plain
                rest = Text(" ").join(row[1:])
                yield (Text(f"{key}: ") if key else Text("  ")).append_text(rest)


def styled(text: str, style: str) -> Text:
    """A cell in a style of its own (a phase in its colour), its text still plain."""
    return Text(text, style=style)

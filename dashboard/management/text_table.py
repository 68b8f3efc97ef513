"""A plain-text table for the commands' ``list`` (aligned columns, no trailing spaces)."""

from __future__ import annotations

from collections.abc import Sequence


def text_table(columns: Sequence[str], cells: Sequence[Sequence[object]]) -> str:
    lines = [columns, *cells]
    widths = [max(len(str(line[i])) for line in lines) for i in range(len(columns))]
    return "\n".join(
        "  ".join(str(v).ljust(w) for v, w in zip(line, widths, strict=True)).rstrip()
        for line in lines
    )

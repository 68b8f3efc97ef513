"""The delivery report's repeated markup, built in Python (bench/scale.py).

The chart's bars and the aggregate table's rows are a few thousand values for a
month by day; Django's template engine spent most of the page's time on them
(≈ 30 µs per variable, 60 of the page's 90 ms at a million attempts). So did a
page of discrepancy rows later (5 of its 7 ms of rendering). The same markup is
written here with every value escaped (``html.escape`` escapes the same five
characters as the template's autoescape; a time is the ``when`` tag's own
markup), then marked safe.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import tzinfo
from html import escape
from typing import Any

from django.urls import reverse
from django.utils.safestring import SafeString, mark_safe

from dashboard.templatetags.ui import time_html


def _e(value: Any) -> str:
    return escape(str(value))


def _plural(count: int) -> str:
    return "" if count == 1 else "s"  # Django's ``pluralize``


def _bar(label: str, bar: Sequence[Any], y: int, text_y: int, title: str, height: int) -> str:
    parts = []
    for s in bar:
        words = title.format(_e(s.words))
        parts.append(
            f'<rect class="seg" x="{_e(s.x)}" y="{y}" width="{_e(s.width)}" height="{height}" '
            f'fill="url(#rp-{_e(s.kind)})"><title>{label}: {_e(s.count)} run{_plural(s.count)}'
            f"{words}</title></rect>"
        )
        if s.label:
            parts.append(
                f'<text class="seg-count" x="{_e(s.middle)}" y="{text_y}" text-anchor="middle" '
                f'aria-hidden="true">{_e(s.count)}</text>'
            )
    return "".join(parts)


def chart_rows(rows: Iterable[Any], bar_height: int) -> SafeString:
    """One ``<g>`` per group: its label, the outcome bar above, the evidence bar below."""
    groups = []
    for row in rows:
        label = _e(row.label)
        flagged = f" · {_e(row.flagged)} with discrepancies" if row.flagged else ""
        groups.append(
            f'<g transform="translate(0 {_e(row.y)})">\n      <text class="row-label" x="0" '
            f'y="14">{label}<tspan class="row-meta"> · {_e(row.runs)} run{_plural(row.runs)}'
            f"{flagged}</tspan></text>\n      "
            + _bar(label, row.outcome_bar, 22, 36, " settled {}", bar_height)
            + "\n      "
            + _bar(label, row.evidence_bar, 46, 60, ", client evidence: {}", bar_height)
            + "\n    </g>"
        )
    return mark_safe("\n    ".join(groups))  # every value escaped above


def chart_description(rows: Iterable[Any]) -> SafeString:
    """The chart's words for screen readers: every group's counts."""
    parts = []
    for row in rows:
        outcomes = "".join(f", {_e(s.count)} {_e(s.words)}" for s in row.outcome_bar)
        evidence = "".join(f", {_e(s.count)} {_e(s.words)}" for s in row.evidence_bar)
        parts.append(
            f"{_e(row.label)}: {_e(row.runs)} run{_plural(row.runs)}{outcomes}; "
            f"client evidence{evidence}. "
        )
    return mark_safe("".join(parts))  # every value escaped above


def aggregate_row(cells: Sequence[str], cost_cells: Sequence[str], *, by_outcome: bool) -> str:
    """One ``<tr>``'s cells of the aggregate table: the group, its counts (zeros muted,
    the discrepancy count flagged when not 0), then its three cost cells."""
    first, *middle, last = (_e(cell) for cell in cells)
    head = f'<span class="state {first}">{first}</span>' if by_outcome else first
    counts = "".join(f'<td class="num{" zero" if c == "0" else ""}">{c}</td>' for c in middle)
    costs = "".join(
        f'<td class="num c-cost{" zero" if c in ("0", "—") else ""}">{c}</td>'
        for c in (_e(cell) for cell in cost_cells)
    )
    flagged = " flagged" if last != "0" else ""
    return f'<th scope="row">{head}</th>{counts}<td class="num{flagged}">{last}</td>{costs}'


def aggregate_rows(
    rows: Iterable[tuple[Sequence[str], Sequence[str]]], *, by_outcome: bool
) -> SafeString:
    return mark_safe(  # every value escaped in aggregate_row
        "".join(
            f"\n        <tr>{aggregate_row(cells, cost, by_outcome=by_outcome)}</tr>"
            for cells, cost in rows
        )
    )


def discrepancy_rows(rows: Iterable[tuple[Any, Sequence[str]]], zone: tzinfo) -> SafeString:
    """One ``<tr>`` per discrepancy of the page: (row, its CSV cells) — the run (its
    first 8 characters, linked), when it settled, provider, outcome, chunks, callback,
    the code with its title, and what the facts say."""
    lines = []
    for row, cells in rows:
        c = [_e(cell) for cell in cells]
        run = row.run
        lines.append(
            "\n        <tr>"
            f'\n          <td class="c-run" data-label="Run" data-csv="{c[0]}"><a class="mono" '
            f'href="{_e(reverse("run", args=[run.run_id]))}" title="Run {c[0]}">'
            f"{_e(cells[0][:8])}</a></td>"
            f'\n          <td class="c-settled" data-label="Settled" data-csv="{c[1]}">'
            f"{time_html(run.settled_at, zone) if run.settled_at else '—'}</td>"
            f'\n          <td class="c-provider" data-label="Provider">{c[2]}</td>'
            f'\n          <td class="c-outcome"><span class="state {c[3]}">{c[3]}</span></td>'
            f'\n          <td class="num" data-label="Committed">{c[4]}</td>'
            f'\n          <td class="num" data-label="Sent">{c[5]}</td>'
            f'\n          <td class="num" data-label="Observed">{c[6]}</td>'
            f'\n          <td class="c-callback" data-label="Callback" title="'
            f'{_e(run.callback.note)}">{c[7]}</td>'
            f'\n          <td class="c-code" data-csv="{c[8]}"><strong>{_e(row.title)}</strong>'
            f'<br><span class="mono muted">{c[8]}</span></td>'
            f'\n          <td class="c-text">{c[9]}</td>'
            "\n        </tr>"
        )
    return mark_safe("".join(lines))  # every value escaped above

"""The run page's repeated markup, built in Python (bench/scale.py).

A run's provider attempts are a table of ten cells a row; at a hundred attempts
Django's template engine spent ≈ 9 of the page's 13 ms of rendering on them
(``bench/scale.py``: the run page at a million attempts). The same markup is written
here with every value escaped (``html.escape`` escapes the same five characters as
the template's autoescape; a ``Moment`` writes its own safe HTML), then marked safe,
like the delivery report's rows (``dashboard/pages/report_html.py``).
"""

from __future__ import annotations

from collections.abc import Iterable
from html import escape
from typing import Any

from django.utils.html import conditional_escape
from django.utils.safestring import SafeString, mark_safe

from governance.models import ProviderAttempt


def _e(value: Any) -> str:
    return escape(str(value))


def _or_dash(value: Any) -> str:
    return _e(value) if value else "—"  # the template's ``default:"—"``


KIND_WORDS = dict(ProviderAttempt.Kind.choices)  # get_kind_display's words


def attempt_rows(attempts: Iterable[Any]) -> SafeString:
    """One ``<tr>`` per provider attempt: when (from the run's start), provider and
    model, kind, result, failure class, refusal category, HTTP status, latency, stage
    and cost (``costs.loaded_costs`` set ``cost_words``)."""
    rows = []
    for a in attempts:
        result = _e(a.result)
        rows.append(
            "\n      <tr>"
            f"\n        <td>{conditional_escape(a.started)}</td>"
            f'\n        <td>{_e(a.provider.provider_id)} <div class="muted small">{_e(a.model)}'
            "</div></td>"
            f"\n        <td>{_e(KIND_WORDS.get(a.kind, a.kind) or a.kind)}</td>"
            f'\n        <td><span class="state {result}">{result}</span></td>'
            f"\n        <td>{_or_dash(a.failure_class)}</td>"
            f"\n        <td>{_or_dash(a.refusal_category)}</td>"
            f'\n        <td class="num">{_or_dash(a.status_code)}</td>'
            f'\n        <td class="num">{_e(a.latency_ms)} ms</td>'
            f'\n        <td class="num">{_e(a.stage.seq)}</td>'
            f'\n        <td class="num c-cost">{_e(a.cost_words)}</td>'
            "\n      </tr>"
        )
    return mark_safe("".join(rows))  # every value escaped above

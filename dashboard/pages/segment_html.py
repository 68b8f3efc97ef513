"""The segment page's repeated timeline entries, built in Python (bench/scale.py).

A page of the timeline is fifty entries, nearly all provider requests and stages;
Django's template engine spent ≈ 7 of the page's 9 ms of rendering on them at a
million attempts (``bench/scale.py``: the long-lived segment). Those two kinds are
written here, every value escaped (``html.escape`` escapes the same five characters
as the template's autoescape; the time is the ``when`` tag's own markup), then
marked safe, like the run page's attempts (``dashboard/pages/run_html.py``). The rarer
entries — fallback cards, notifications, the segment's opening and closing — stay
in ``templates/segments/detail.html``.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import tzinfo
from html import escape
from typing import Any

from django.urls import reverse
from django.utils.safestring import mark_safe

from dashboard.templatetags.ui import time_html

# An attempt's result as the colour of a state the page already draws.
RESULT_STATE = {"accepted": "completed", "refused": "frozen"}


def _e(value: Any) -> str:
    return escape(str(value))


def _attempt(item: Any, run_url: str, zone: tzinfo) -> str:
    a = item.obj
    state = RESULT_STATE.get(a.result, "failed")
    extra = "".join(
        f'\n        <span class="muted">{word}</span> {_e(value)}'
        for word, value in (
            ("category", a.refusal_category),
            ("failure", a.failure_class),
            ("HTTP", a.status_code),
        )
        if value
    )
    planned = item.card.get("planned")
    if planned is not None:  # a numbered re-probe: its plan beside what happened (R8.1)
        late = round((a.started_at - planned).total_seconds() / 60)
        planned_at = time_html(planned, zone, "clock", beside=False)
        sent_at = time_html(a.started_at, zone, "clock", beside=False)
        extra += (
            f'\n        <span class="muted">planned</span> {planned_at}'
            f'<span class="muted">, sent</span> {sent_at}'
            + (f' <span class="muted">({late:+d} min)</span>' if late else "")
        )
    return (
        '\n        <span class="tl-kind">Request</span>'
        f'\n        <span class="mono">{_e(a.provider.provider_id)}</span> · '
        f"<strong>{_e(item.label)}</strong>"
        f'\n        <span class="state {state}">{_e(a.result)}</span>'
        f"{extra}"
        f'\n        <span class="muted">{_e(a.latency_ms)} ms · model <span class="mono">'
        f'{_e(a.model)}</span> · <a href="{run_url}">run</a> stage {_e(a.stage.seq)}</span>'
    )


def _stage(item: Any, run_url: str, _zone: tzinfo) -> str:
    s = item.obj
    finished = item.card.get("state") == "finished"
    outcome = f": <strong>{_e(s.outcome)}</strong>" if finished and s.outcome else ""
    timeout = (
        f' <span class="state failed">{_e(s.timeout_name)}</span>'
        if finished and s.timeout_name
        else ""
    )
    return (
        '\n        <span class="tl-kind">Stage</span>'
        f"\n        {_e(s.seq)} · {_e(item.label)}{outcome}{timeout}"
        f'\n        <span class="muted">· <a href="{run_url}">run</a></span>'
    )


_BODIES = {"attempt": _attempt, "stage": _stage}


def add_entries(items: Iterable[Any], zone: tzinfo) -> None:
    """Give each request and stage of the timeline its ``html``: its whole ``<li>``,
    its times in ``zone``."""
    urls: dict[Any, str] = {}
    for item in items:
        body = _BODIES.get(item.kind)
        if body is None:
            continue
        run_id = item.obj.run_id
        if run_id not in urls:
            urls[run_id] = _e(reverse("run", args=[run_id]))
        at, inner = time_html(item.at, zone), body(item, urls[run_id], zone)
        item.html = mark_safe(  # every value escaped above
            f'<li class="tl tl-{item.kind}">\n      <span class="tl-when">{at}</span>'
            f'\n      <div class="tl-body">{inner}\n      </div>\n    </li>'
        )

"""Small template helpers shared by every page: times people can read at 3 a.m."""

from __future__ import annotations

from datetime import datetime

from django import template
from django.utils.html import format_html

from governance import time_source

register = template.Library()


def relative(moment: datetime, now: datetime) -> str:
    """'in 12 min', '3 h ago', 'just now' — rounded the way people say it."""
    seconds = (moment - now).total_seconds()
    future = seconds > 0
    seconds = abs(seconds)
    if seconds < 45:
        return "just now" if not future else "in a few seconds"
    for size, unit in ((86400, "d"), (3600, "h"), (60, "min")):
        if seconds >= size:
            amount = round(seconds / size)
            return f"in {amount} {unit}" if future else f"{amount} {unit} ago"
    return "just now"


@register.simple_tag
def when(moment: datetime | None, empty: str = "—"):
    """A <time> element: relative words, the absolute UTC time on hover; the
    page script rewrites the title into the viewer's own time zone."""
    if moment is None:
        return empty
    iso = moment.isoformat()
    return format_html(
        '<time datetime="{}" title="{}">{}</time>',
        iso,
        moment.strftime("%Y-%m-%d %H:%M:%S UTC"),
        relative(moment, time_source.now()),
    )


@register.simple_tag
def at_clock(moment: datetime | None):
    """'14:32' (viewer's zone after the page script runs), for 'cooling until 14:32'."""
    if moment is None:
        return "—"
    return format_html(
        '<time datetime="{}" data-format="clock" title="{}">{}</time>',
        moment.isoformat(),
        moment.strftime("%Y-%m-%d %H:%M:%S UTC"),
        moment.strftime("%H:%M UTC"),
    )


@register.simple_tag
def moment(moment: datetime | None):
    """An absolute time with its zone, the relative words beside it:
    '2026-12-05 03:54 UTC (3 min ago)'. The page script shows the absolute
    time in the viewer's zone, labelled with that zone."""
    if moment is None:
        return "—"
    return format_html(
        '<time datetime="{}" data-format="stamp" title="{}">{}</time>'
        ' <span class="relative">({})</span>',
        moment.isoformat(),
        moment.strftime("%Y-%m-%d %H:%M:%S UTC"),
        moment.strftime("%Y-%m-%d %H:%M UTC"),
        relative(moment, time_source.now()),
    )


@register.simple_tag(takes_context=True)
def query_with(context, **changes):
    """The current query string with some parameters replaced (filters, pages)."""
    params = context["request"].GET.copy()
    for key, value in changes.items():
        if value in (None, ""):
            params.pop(key, None)
        else:
            params[key] = value
    encoded = params.urlencode()
    return f"?{encoded}" if encoded else "?"


@register.filter
def words(value) -> str:
    """'half_open' → 'half open', 'model_turn' → 'model turn'."""
    return str(value).replace("_", " ")

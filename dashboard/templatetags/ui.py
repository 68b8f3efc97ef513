"""Small template helpers shared by every page: times people can read at 3 a.m."""

from __future__ import annotations

from datetime import datetime, tzinfo

from django import template
from django.utils.html import format_html
from django.utils.safestring import SafeString

from dashboard.site.time_zones import zone_for
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


def time_html(
    moment: datetime, zone: tzinfo, fmt: str = "short", *, beside: bool = True
) -> SafeString:
    """<time> with the absolute time in ``zone`` (labelled) and the relative
    words beside it; the page script rewrites the absolute part into the
    viewer's chosen zone, or the browser's when none was chosen. ``fmt``:
    "clock" ('14:32 UTC'), "short" ('Dec 05 14:32 UTC'), "stamp" (with the year).
    ``beside=False`` leaves the relative words out, where a neighbour already says them."""
    local = moment.astimezone(zone)
    element = format_html(
        '<time datetime="{}" data-format="{}" title="{}">{}</time>',
        moment.isoformat(),
        fmt,
        local.strftime("%Y-%m-%d %H:%M:%S %Z"),
        local.strftime(SHOWN[fmt]),
    )
    if not beside:
        return element
    return format_html(
        '{} <span class="relative">({})</span>', element, relative(moment, time_source.now())
    )


SHOWN = {"clock": "%H:%M %Z", "short": "%b %d %H:%M %Z", "stamp": "%Y-%m-%d %H:%M %Z"}


@register.simple_tag(takes_context=True)
def when(context, moment: datetime | None, empty: str = "—"):
    """'Dec 05 03:54 UTC (3 min ago)': the day and time with its zone, the
    relative words beside it."""
    if moment is None:
        return empty
    return time_html(moment, zone_for(context.get("request")), "short")


@register.simple_tag(takes_context=True)
def at_clock(context, moment: datetime | None):
    """'14:32 UTC (in 12 min)', for 'cooling until 14:32': the clock with its
    zone, the relative words beside it."""
    if moment is None:
        return "—"
    return time_html(moment, zone_for(context.get("request")), "clock")


@register.simple_tag(takes_context=True)
def moment(context, moment: datetime | None):
    """'2026-12-05 03:54 UTC (3 min ago)': the full date, for a record's facts."""
    if moment is None:
        return "—"
    return time_html(moment, zone_for(context.get("request")), "stamp")


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

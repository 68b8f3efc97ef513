"""Inline SVG bars: no chart library, no CDN, readable without colour."""

from __future__ import annotations

from django import template

register = template.Library()


@register.filter
def share(value, scale) -> float:
    """``value`` as a percentage of ``scale`` (0–100), for bar widths."""
    try:
        return round(min(100.0, max(0.0, 100.0 * float(value) / float(scale))), 1)
    except (TypeError, ValueError, ZeroDivisionError):
        return 0.0


@register.filter
def ms(value) -> str:
    """Milliseconds the way people read them: 840 ms, 12.5 s, 5.8 min."""
    if value is None:
        return "—"
    value = int(value)
    if value < 1000:
        return f"{value} ms"
    if value < 120_000:
        return f"{value / 1000:.1f} s"
    return f"{value / 60_000:.1f} min"

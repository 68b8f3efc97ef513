"""The zone a page shows its times in: the viewer's choice, else the browser's.

The choice lives in the database (``ViewerPreference``) and is copied into the
session at login (or on first use, for a session older than the choice's
column), so a page pays no query for it. The server writes times
in the chosen zone, or in UTC when the browser's zone is wanted; the page
script (static/js/time.js) then rewrites them into the same chosen zone, or
into the browser's, always labelled with the zone.
"""

from __future__ import annotations

from zoneinfo import ZoneInfo

from django.http import HttpRequest

from governance.services.preferences import time_zone_of

SESSION_KEY = "viewer_time_zone"


def chosen_time_zone(request: HttpRequest | None) -> str:
    """The viewer's chosen IANA zone, or "" for the browser's own."""
    if request is None:
        return ""
    cached = getattr(request, "_viewer_time_zone", None)
    if cached is not None:
        return cached
    name = ""
    user = getattr(request, "user", None)
    if user is not None and user.is_authenticated and hasattr(request, "session"):
        name = request.session.get(SESSION_KEY)
        if name is None:
            name = time_zone_of(user)
            request.session[SESSION_KEY] = name
    request._viewer_time_zone = name
    return name


def copy_on_login(sender, request: HttpRequest | None, user, **kwargs) -> None:
    """``user_logged_in``: this session shows the user's chosen zone."""
    if request is not None and hasattr(request, "session"):
        remember_time_zone(request, time_zone_of(user))


def remember_time_zone(request: HttpRequest, name: str) -> None:
    """After the viewer changed their choice: this session shows it at once."""
    request.session[SESSION_KEY] = name
    request._viewer_time_zone = name


def zone_for(request: HttpRequest | None) -> ZoneInfo:
    """Where the server writes a page's times: the chosen zone, else UTC."""
    return ZoneInfo(chosen_time_zone(request) or "UTC")


def time_zone_context(request: HttpRequest) -> dict:
    """Template context: ``viewer_time_zone`` ("" = the browser's)."""
    return {"viewer_time_zone": chosen_time_zone(request)}

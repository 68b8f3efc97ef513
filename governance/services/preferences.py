"""What a dashboard user chose for their own view: their time zone.

A zone is an IANA name the server knows (``zoneinfo``), or nothing for the
browser's own zone. Personal, so not audited: it changes how times are shown,
never what happened.
"""

from __future__ import annotations

import zoneinfo
from functools import cache

from django.db import transaction

from governance.models import ViewerPreference
from governance.services.errors import ServiceError


@cache
def known_time_zones() -> tuple[str, ...]:
    """Every IANA zone name this machine knows, sorted (read once: it reads the tz database)."""
    return tuple(sorted(zoneinfo.available_timezones()))


def time_zone_of(user) -> str:
    """The user's chosen zone, or "" for the browser's."""
    row = ViewerPreference.objects.filter(user=user).values_list("time_zone", flat=True).first()
    return row or ""


def set_time_zone(user, time_zone: str) -> str:
    """Keep ``time_zone`` ("" = the browser's) as the user's; returns what was kept."""
    time_zone = (time_zone or "").strip()
    if time_zone and time_zone not in known_time_zones():
        raise ServiceError(
            "time_zone",
            f"{time_zone[:64]!r} is not a time zone this server knows (e.g. Europe/Berlin)",
        )
    with transaction.atomic():
        ViewerPreference.objects.update_or_create(user=user, defaults={"time_zone": time_zone})
    return time_zone

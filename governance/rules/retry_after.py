"""R2.2: ``Retry-After``, the one reading of the header.

A provider's answer (R2.2's ``rate_limited`` waits until it), an alert
channel's and a callback receiver's (``rules.redelivery``'s backoff) are read
by ``parse_retry_after``: delay-seconds or an HTTP-date (RFC 9110 §5.6.7),
against ``now`` given as a parameter.
"""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime

from governance.rules._checks import require_aware

__all__ = ["parse_retry_after"]


_MONTHS = {
    name: number
    for number, name in enumerate(
        ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"),
        start=1,
    )
}
_IMF_FIXDATE = re.compile(
    r"^[A-Za-z]{3},\s+(\d{1,2})\s+([A-Za-z]{3})\s+(\d{4})\s+(\d{2}):(\d{2}):(\d{2})\s+GMT$",
    re.IGNORECASE,
)
_RFC850_DATE = re.compile(
    r"^[A-Za-z]+,\s+(\d{1,2})-([A-Za-z]{3})-(\d{2})\s+(\d{2}):(\d{2}):(\d{2})\s+GMT$",
    re.IGNORECASE,
)
_ASCTIME_DATE = re.compile(
    r"^[A-Za-z]{3}\s+([A-Za-z]{3})\s+(\d{1,2})\s+(\d{2}):(\d{2}):(\d{2})\s+(\d{4})$",
    re.IGNORECASE,
)
_DELAY_SECONDS = re.compile(r"^\d+(\.\d+)?$")


def _http_date(text: str, now: datetime) -> datetime | None:
    """Parse the three HTTP-date forms of RFC 9110 §5.6.7; None if unparseable.

    Written by hand rather than with email.utils/strptime: those pull in
    os/socket/time and depend on the process locale.
    """
    if match := _IMF_FIXDATE.match(text):
        day, month, year, hour, minute, second = match.groups()
    elif match := _RFC850_DATE.match(text):
        day, month, short_year, hour, minute, second = match.groups()
        # RFC 9110: a two-digit year more than 50 years in the future is in the past.
        year_number = now.year - now.year % 100 + int(short_year)
        if year_number > now.year + 50:
            year_number -= 100
        year = str(year_number)
    elif match := _ASCTIME_DATE.match(text):
        month, day, hour, minute, second, year = match.groups()
    else:
        return None
    month_number = _MONTHS.get(month.lower())
    if month_number is None:
        return None
    try:
        return datetime(
            int(year),
            month_number,
            int(day),
            int(hour),
            int(minute),
            min(int(second), 59),  # a leap second is still "that minute"
            tzinfo=UTC,
        )
    except ValueError:
        return None


def parse_retry_after(raw: str | float | None, now: datetime) -> float | None:
    """Seconds to wait from a raw ``Retry-After`` value (R2.2), or None.

    Accepts delay-seconds (``"120"``, ``"1.5"``, a number) and an HTTP-date
    (a date in the past means "now": 0). The header comes from the provider,
    so an unparseable, negative or non-finite value is treated as absent
    rather than raised; a value of the wrong *type* is a caller bug and raises.
    """
    now = require_aware(now, "now")
    if raw is None:
        return None
    if isinstance(raw, bool) or not isinstance(raw, str | int | float):
        raise ValueError(f"retry_after must be str or number, got {type(raw).__name__}")
    if isinstance(raw, int | float):
        seconds = float(raw)
        return seconds if math.isfinite(seconds) and seconds >= 0 else None
    text = raw.strip()
    if _DELAY_SECONDS.match(text):
        seconds = float(text)
        return seconds if math.isfinite(seconds) else None
    moment = _http_date(text, now)
    if moment is None:
        return None
    return max(0.0, (moment - now).total_seconds())

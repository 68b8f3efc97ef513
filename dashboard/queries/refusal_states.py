"""R3.2's state of each open segment's refusal rows, as the database can count
and filter them: what GET /metrics and the overview read, whatever the rows.

The verdict stays R3.2's own (``rules.refusal.refusal_verdict``): for each
(count, schedule) the rows hold — one small query — the rule is asked about a
refusal of that count made now. Its ``next_probe_at`` gives the time such a
refusal cools for, and ``cooling_from`` the earliest ``refused_at`` still
cooling now: exactly the rule's ``now < next_probe_at``, read in its whole
milliseconds. A row with an unknown time, a legacy count or a used-up schedule
is frozen, as the rule says (R3.4).
"""

from __future__ import annotations

from datetime import datetime

from django.db.models import Case, CharField, Q, QuerySet, Value, When

from governance.models import SegmentRefusal
from governance.rules.refusal import (
    ProviderRefusal,
    cooling_from,
    delays_from_seconds,
    refusal_verdict,
)
from governance.services.refusals import reprobe_delays

STATES = ("eligible", "cooling", "frozen")


def open_refusals() -> QuerySet[SegmentRefusal]:
    """The refusal rows of open segments (closed ones are history, R1.4)."""
    return SegmentRefusal.objects.filter(segment__closed_at__isnull=True).order_by()


def with_state(rows: QuerySet[SegmentRefusal], now: datetime) -> QuerySet[SegmentRefusal]:
    """``rows`` annotated with ``refusal_state`` (eligible, cooling or frozen) at ``now``."""
    default = reprobe_delays()
    cases = []
    for count, delays_s in rows.order_by().values_list("refusals", "delays_s").distinct():
        same = Q(refusals=count) if count is not None else Q(refusals__isnull=True)
        same &= Q(delays_s=delays_s) if delays_s is not None else Q(delays_s__isnull=True)
        made_now = ProviderRefusal(
            "", refusals=count, refused_at=now, delays=delays_from_seconds(delays_s)
        )
        verdict = refusal_verdict(made_now, now, default)
        if verdict.state == "cooling":
            since = cooling_from(now, verdict.next_probe_at - now)
            cases.append(When(same & Q(refused_at__gte=since), then=Value("cooling")))
            # Refused long enough ago: due; an unknown time reads as frozen (R3.4).
            cases.append(When(same & Q(refused_at__isnull=False), then=Value("eligible")))
            cases.append(When(same, then=Value("frozen")))
        else:
            cases.append(When(same, then=Value(verdict.state)))
    if not cases:  # no rows: nothing to judge
        return rows.annotate(refusal_state=Value("eligible", output_field=CharField()))
    return rows.annotate(
        refusal_state=Case(*cases, default=Value("frozen"), output_field=CharField())
    )

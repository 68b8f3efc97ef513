"""Stage holders: who this process is, whether another holder's process still
exists, and the heartbeat's lease renewal (R6.6; the verdict is
``governance.rules.claims``)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterable
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Q

from governance.models import Stage
from governance.rules import claims as claim_rules


def lease() -> timedelta:
    return timedelta(seconds=settings.GOVERNANCE_STAGE_LEASE_SECONDS)


def _pid_namespace() -> str:
    try:
        return os.readlink("/proc/self/ns/pid")  # e.g. "pid:[4026531836]"
    except OSError:
        return "pid:?"


def _identity() -> tuple[str, str, int]:
    # Read per call: a prefork child has its parent's module state but its own pid.
    return settings.GOVERNANCE_HOST_NAME, _pid_namespace(), os.getpid()


def new_holder() -> str:
    """A fresh claim's identity: this process, and a token of its own."""
    host, namespace, pid = _identity()
    return str(claim_rules.HolderId(host, namespace, pid, uuid.uuid4().hex[:12]))


def lost_process(pid: int, at: datetime) -> claim_rules.LostProcess:
    """A process of this host and pid namespace seen dying at ``at`` (a worker's
    parent speaking of its pool process)."""
    host, namespace, _pid = _identity()
    return claim_rules.LostProcess(claim_rules.HolderId(host, namespace, pid, "").process, at)


def holder_gone(holder: str) -> bool:
    """True only when the holder's process provably no longer exists: same
    host, same pid namespace, and no such pid. Anything unknowable is "alive"
    (the lease then decides)."""
    parsed = claim_rules.parse_holder(holder)
    host, namespace, _pid = _identity()
    if parsed is None or not claim_rules.may_probe_process(
        parsed, host=host, pid_namespace=namespace
    ):
        return False
    try:
        os.kill(parsed.pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # exists but not ours to signal
        return False
    return False


def renew_leases(holders: Iterable[str], now: datetime) -> set[str]:
    """The heartbeat: extend the leases these holders still hold; returns them
    (a holder missing from the answer was taken over or finished)."""
    holders = [h for h in holders if h]
    if not holders:
        return set()
    until = now + lease()
    held = Q(holder__in=holders, finished_at__isnull=True)
    Stage.objects.filter(held).update(lease_until=until)
    return set(Stage.objects.filter(held).values_list("holder", flat=True))

"""API tokens: made for a user, shown once, stored as a digest, listed and revoked.

A token may carry scopes — permission codenames that narrow what its user's
role allows (``dashboard/site/permissions.py``); it can never widen it.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Sequence
from datetime import datetime

from django.db import transaction

from governance.models import ApiToken
from governance.roles import ACTIONS
from governance.services.audit import audit
from governance.services.errors import ServiceError

# The permissions a token can be limited to (codenames of the governance app).
TOKEN_SCOPES = tuple(ACTIONS)


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def create_token(
    user, *, name: str, scopes: Sequence[str] = (), by: str, now: datetime
) -> tuple[ApiToken, str]:
    """A new token for ``user``: the row, and the secret (shown once, never stored)."""
    name = (name or "").strip()
    if not name or len(name) > 100 or "\x00" in name:
        raise ServiceError("name", "say what the token is for (1-100 characters)")
    unknown = sorted(set(scopes) - set(TOKEN_SCOPES))
    if unknown:
        raise ServiceError(
            "scopes", f"unknown scope(s) {', '.join(unknown)}; use {', '.join(TOKEN_SCOPES)}"
        )
    ungranted = [s for s in scopes if not user.has_perm(f"governance.{s}")]
    if ungranted:
        # A scope only narrows the role: granting it here would widen nothing, silently.
        raise ServiceError(
            "scopes", f"{user.get_username()}'s role does not allow {', '.join(ungranted)}"
        )
    secret = secrets.token_urlsafe(32)
    with transaction.atomic():
        row = ApiToken.objects.create(
            user=user, name=name, key_digest=token_digest(secret), scopes=sorted(set(scopes))
        )
        audit(
            actor=by, action="token.create", target_type="token", target_id=str(row.id),
            reason=name, detail={"user": user.get_username(), "scopes": row.scopes}, now=now,
        )  # fmt: skip
    return row, secret


def revoke_token(row: ApiToken, *, by: str, now: datetime) -> bool:
    """Revoked at once and for good; False when it already was."""
    with transaction.atomic():
        changed = ApiToken.objects.filter(id=row.id, revoked_at__isnull=True).update(revoked_at=now)
        if changed:
            row.revoked_at = now
            audit(
                actor=by, action="token.revoke", target_type="token", target_id=str(row.id),
                reason=row.name, detail={"user": row.user.get_username()}, now=now,
            )  # fmt: skip
    return bool(changed)

"""Reaching the broker by task name, so governance never imports the execution
layer. A task registered in this process is applied through its own object,
which honours Celery's eager mode (the demo, tests); otherwise it is sent.

Work is separated by kind (R6.7): stages go to ``turns`` or ``tools`` by
their kind, other tasks by Celery's routes (``CELERY_TASK_ROUTES``). Every
message carries the time it was sent, so a queue's oldest message tells how
long the queue has kept work waiting (``queue_states``).

Each queue has two lanes (R6.6): work sent again after a worker died under it
or the broker lost it (``ahead``) is taken before any new work, so it never
waits behind a backlog. The broker is a prompt, not the record: when it may
have lost messages (``broker_lost_messages``), the stages whose messages it
no longer holds (``queued_stage_ids``) are sent again from their rows.
"""

from __future__ import annotations

import base64
import importlib
import json
import logging
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db import transaction

from governance import time_source

if TYPE_CHECKING:
    from governance.models import Stage

log = logging.getLogger(__name__)

SENT_AT_HEADER = "governance_sent_at"
# Model turns and the finalization wait behind each other; tool calls and
# verifications are short and must not wait behind a turn backlog.
STAGE_QUEUES = {
    "model_turn": "turns",
    "finalization": "turns",
    "tool_call": "tools",
    "verify_effect": "tools",
}


def stage_queue(kind: str) -> str:
    return STAGE_QUEUES.get(kind, settings.CELERY_TASK_DEFAULT_QUEUE)


def send_by_name(
    name: str,
    args: list[Any],
    *,
    countdown: float | None = None,
    queue: str | None = None,
    ahead: bool = False,
    kwargs: dict[str, Any] | None = None,
) -> None:
    """Send a task by name; ``ahead``: in its queue's first lane, before new work."""
    from celery import current_app

    task = current_app.tasks.get(name)
    if task is None:
        # Nothing imported the app's task modules yet (a management command).
        # Imported by name: Celery's import_default_modules would also run
        # django.setup() again through its Django fixup, resetting logging.
        for module in current_app.conf.include:
            importlib.import_module(module)
        task = current_app.tasks.get(name)
    options: dict[str, Any] = {
        "countdown": countdown or None,
        "headers": {SENT_AT_HEADER: time_source.now().timestamp()},
        "priority": settings.GOVERNANCE_RECOVERY_PRIORITY
        if ahead
        else settings.CELERY_TASK_DEFAULT_PRIORITY,
    }
    if queue:
        options["queue"] = queue
    if task is not None:
        task.apply_async(args=args, kwargs=kwargs, **options)
    else:
        current_app.send_task(name, args=args, kwargs=kwargs, **options)


STAGE_TASK = "tasks.stages.execute_stage"


def publish(
    stages: Sequence[Stage | tuple[int, str]],
    countdowns: Mapping[int, float] | None = None,
    *,
    ahead: bool = False,
) -> None:
    """Send stages to the broker once the transaction that created them commits,
    each to its kind's queue (``stage_queue``: turns, or tools); ``ahead``: in
    the queue's first lane, before new work (a stage sent again, R6.6).

    The broker is not part of the commit: a failed send is logged and the
    stage stays queued in the database, where the watchdog finds it once the
    broker is back. The task is reached by name, so governance never imports
    the execution layer.
    """
    for ref in stages:
        stage_id, kind = ref if isinstance(ref, tuple) else (ref.id, ref.kind)
        delay = (countdowns or {}).get(stage_id, 0.0)
        queue = stage_queue(kind)
        transaction.on_commit(
            lambda sid=stage_id, d=delay, q=queue: send_by_name(
                STAGE_TASK, [sid], countdown=d, queue=q, ahead=ahead
            ),
            robust=True,
        )


@dataclass(frozen=True)
class QueueState:
    """One queue as the broker holds it now (``None``: this broker cannot tell)."""

    name: str
    depth: int | None
    oldest_age_s: float | None


def queue_states(names: Sequence[str] | None = None) -> list[QueueState]:
    """Depth and the age of the oldest message of each queue (all of them, or
    ``names``), both lanes, read from Redis in one round trip (the file-system
    broker of the embedded defaults cannot tell: ``None``)."""
    names = tuple(settings.GOVERNANCE_QUEUES if names is None else names)
    client = _redis()
    if client is None:
        return [QueueState(name, None, None) for name in names]
    now_ts = time_source.now().timestamp()
    lanes = {name: lane_keys(name) for name in names}
    with client.pipeline(transaction=False) as pipe:
        for name in names:
            for key in lanes[name]:
                pipe.llen(key)
                pipe.lindex(key, -1)  # kombu pushes on the left and takes from the right
        answers = iter(pipe.execute())
    states = []
    for name in names:
        depth, sent = 0, []
        for _key in lanes[name]:
            depth += int(next(answers))
            sent.append(_sent_at(next(answers)))
        known = [value for value in sent if value is not None]
        age = max(0.0, now_ts - min(known)) if known else None
        states.append(QueueState(name, depth, age if depth else 0.0))
    return states


def lane_keys(queue: str) -> list[str]:
    """The Redis lists of a queue's lanes, taken first to last (kombu's
    priority steps: the first is named like the queue)."""
    options = settings.CELERY_BROKER_TRANSPORT_OPTIONS
    steps = options.get("priority_steps", [0])
    sep = options.get("sep", "\x06\x16")
    return [queue if not step else f"{queue}{sep}{step}" for step in steps]


def _sent_at(raw: bytes | None) -> float | None:
    if not raw:
        return None
    try:
        value = json.loads(raw)["headers"].get(SENT_AT_HEADER)
    except (ValueError, KeyError, TypeError, AttributeError):
        return None  # a message from elsewhere (beat sends without the header)
    return float(value) if isinstance(value, int | float) else None


# Set in the broker's own database without an expiry: a broker that comes
# back without it lost everything it held (restarted without persistence,
# flushed), the messages with it.
BROKER_EPOCH_KEY = "governance:broker-epoch"


def broker_lost_messages() -> bool | None:
    """R6.6: whether the broker lost the messages it held since this was last
    asked (or ever: the first answer is yes). ``None``: it cannot tell (not
    Redis) or cannot be reached; ask again on the next pass."""
    client = _redis()
    if client is None:
        return None
    try:
        return bool(client.set(BROKER_EPOCH_KEY, uuid.uuid4().hex, nx=True))
    except Exception as exc:  # the broker is down: nothing is known yet
        log.warning("broker: cannot tell whether it lost messages: %s", exc)
        return None


def queued_stage_ids() -> set[int] | None:
    """The stages whose messages wait in the broker's stage queues now (both
    lanes), or ``None`` when the broker cannot tell (not Redis, unreachable).
    A message a worker has taken is no longer here: it is claimed, or about to
    be (or lost with that worker)."""
    client = _redis()
    if client is None:
        return None
    keys = [key for queue in sorted(set(STAGE_QUEUES.values())) for key in lane_keys(queue)]
    try:
        with client.pipeline(transaction=False) as pipe:
            for key in keys:
                pipe.lrange(key, 0, -1)
            answers = pipe.execute()
    except Exception as exc:
        log.warning("broker: cannot read the stage queues: %s", exc)
        return None
    found = set()
    for raw in (message for messages in answers for message in messages):
        stage_id = _stage_of(raw)
        if stage_id is not None:
            found.add(stage_id)
    return found


def _stage_of(raw: bytes) -> int | None:
    """The stage id a stage message carries (Celery's message protocol 2: the
    body is ``[args, kwargs, embed]``, base64-encoded), else None."""
    try:
        message = json.loads(raw)
        if message["headers"].get("task") != STAGE_TASK:
            return None
        args = json.loads(base64.b64decode(message["body"]))[0]
        return int(args[0])
    except (ValueError, KeyError, TypeError, IndexError, AttributeError):
        return None


_client: Any = None


def _redis():
    """One Redis client per process for the broker's queues, or None when the
    broker is not Redis."""
    global _client
    url = settings.CELERY_BROKER_URL
    if not url.startswith(("redis://", "rediss://", "unix://")):
        return None
    if _client is None:
        import redis

        _client = redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)
    return _client

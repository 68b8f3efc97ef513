"""The Celery app: broker and behaviour come from Django settings (CELERY_*).

Stages are acknowledged late and rejected when a worker dies, so a stage may
run more than once; every task must be idempotent on redelivery.
"""

from __future__ import annotations

import logging
import os

from celery import Celery, bootsteps
from celery.signals import (
    beat_init,
    task_postrun,
    worker_process_init,
    worker_process_shutdown,
    worker_ready,
    worker_shutdown,
)

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.site.settings")

app = Celery("governance")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.conf.include = [
    "tasks.jobs",
    "tasks.stages",
    "tasks.span_store",
    "tasks.callbacks",
    "tasks.alerts",
    "tasks.registry_tools",
]


log = logging.getLogger(__name__)


class BrokerConnected(bootsteps.StartStopStep):
    """Each time this worker's consumer connects to the broker — when it starts
    and after every outage — it asks for a pass over the stages whose messages
    the broker may have lost (R6.6; ``tasks.jobs.resend_lost_messages``), ahead
    of new work: what this worker had taken went with its old connection (or
    with its predecessor, if that one died), and sends failed while the broker
    was away. Noticing the return, not a timer, sends them again."""

    requires = ("celery.worker.consumer.tasks:Tasks",)

    def start(self, parent) -> None:
        from governance.services.broker import send_by_name
        from tasks.jobs import LOST_MESSAGES_TASK

        try:
            send_by_name(LOST_MESSAGES_TASK, [], ahead=True)
        except Exception as exc:  # the broker went again: its next return asks again
            log.warning("broker connected, but the lost-messages pass was not sent: %s", exc)


app.steps["consumer"].add(BrokerConnected)


@worker_process_init.connect
def _instrument_worker_process(**_kwargs) -> None:
    # Each forked worker process needs its own exporter threads.
    from tasks.telemetry import configure_telemetry

    configure_telemetry(component="worker")


@worker_ready.connect
def _record_worker_ready(sender=None, **_kwargs) -> None:
    import socket

    from governance.services.tool_processes import forget_dead_workers
    from tasks.jobs import record_heartbeat

    record_heartbeat("worker", getattr(sender, "hostname", None))
    # Stdio tool servers of this host's killed worker processes died with them
    # (tasks/stdio_guard.py); their rows on the Tools page go too.
    forget_dead_workers(socket.gethostname())


@worker_process_shutdown.connect
@worker_shutdown.connect
def _stop_stdio_tool_servers(**_kwargs) -> None:
    import sys

    if "tasks.mcp_stdio" in sys.modules:  # started only where a stdio tool was called
        sys.modules["tasks.mcp_stdio"].POOL.stop_all()


@beat_init.connect
def _record_scheduler_start(sender=None, **_kwargs) -> None:
    # The first scheduled heartbeat is one interval away; say "alive" now.
    from tasks.jobs import record_heartbeat

    record_heartbeat("scheduler", "beat (starting)")


@task_postrun.connect
def _return_database_connection(sender=None, **_kwargs) -> None:
    # Back to the process's pool after each task (a broken one is dropped).
    # Celery's Django fixup would close the whole pool around every task, so a
    # new PostgreSQL connection per stage; CELERY_DB_REUSE_MAX spaces that out.
    # An eager task runs inside its caller's work: its connection stays.
    if getattr(getattr(sender, "request", None), "is_eager", False):
        return
    from django.db import close_old_connections, connection

    if not connection.in_atomic_block:
        close_old_connections()

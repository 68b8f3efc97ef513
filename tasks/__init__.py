"""Execution: the Celery app, the turn runner, adapters, tools and telemetry."""

# First: the work counts' file names are set before any module makes a metric.
from tasks import metric_files  # noqa: F401
from tasks.celery import app as celery_app

__all__ = ("celery_app",)

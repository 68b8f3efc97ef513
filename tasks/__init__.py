"""Execution: the Celery app, the turn runner, adapters, tools and telemetry."""

from tasks.celery import app as celery_app

__all__ = ("celery_app",)

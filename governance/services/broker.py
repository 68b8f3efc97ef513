"""Reaching the broker by task name, so governance never imports the execution
layer. A task registered in this process is applied through its own object,
which honours Celery's eager mode (the demo, tests); otherwise it is sent."""

from __future__ import annotations

from typing import Any


def send_by_name(name: str, args: list[Any], *, countdown: float | None = None) -> None:
    from celery import current_app

    task = current_app.tasks.get(name)
    if task is None:
        # Nothing imported the app's task modules yet (a management command).
        current_app.loader.import_default_modules()
        task = current_app.tasks.get(name)
    if task is not None:
        task.apply_async(args=args, countdown=countdown or None)
    else:
        current_app.send_task(name, args=args, countdown=countdown or None)

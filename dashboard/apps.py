from django.apps import AppConfig


class DashboardConfig(AppConfig):
    name = "dashboard"
    verbose_name = "Operator dashboard"

    def ready(self) -> None:
        # Every Django process (web, manage.py commands, a shell) sends tasks
        # through the project's Celery app and its broker. Without this, a
        # process that never imported tasks/ published with Celery's default
        # app — to amqp://localhost — and its stages never reached a worker.
        import tasks.celery  # noqa: F401

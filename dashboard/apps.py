from django.apps import AppConfig


class DashboardConfig(AppConfig):
    name = "dashboard"
    verbose_name = "Operator dashboard"

    def ready(self) -> None:
        from django.contrib.auth.signals import user_logged_in

        # Every Django process (web, manage.py commands, a shell) sends tasks
        # through the project's Celery app and its broker. Without this, a
        # process that never imported tasks/ published with Celery's default
        # app — to amqp://localhost — and its stages never reached a worker.
        import tasks.celery  # noqa: F401
        from dashboard.site.time_zones import copy_on_login

        # The viewer's time zone goes into the session at login: pages then pay
        # no query for it.
        user_logged_in.connect(copy_on_login, dispatch_uid="viewer-time-zone")

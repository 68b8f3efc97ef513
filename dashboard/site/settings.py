"""Django settings, read from the environment with embedded defaults.

With nothing set the whole system runs on SQLite and a file-system broker
under ``var/`` (no servers needed). ``DATABASE_URL=postgres://…`` and
``REDIS_URL=redis://…`` switch to PostgreSQL and Redis.

Reading the settings creates nothing: the folders under ``var/`` are made
when the system starts (dashboard/site/embedded.py).
"""

from __future__ import annotations

import socket
from pathlib import Path

from csp.constants import NONE, SELF
from kombu import Queue

from dashboard.site.env import (
    database_from_url,
    env_bool,
    env_float,
    env_int,
    env_key_env_policy,
    env_list,
    env_reprobe_schedule,
    env_secret,
    env_str,
    named_secret,
)

BASE_DIR = Path(__file__).resolve().parents[2]  # the checkout: dashboard/site/settings.py
VAR_DIR = Path(env_str("GOVERNANCE_VAR_DIR") or BASE_DIR / "var")

DEBUG = env_bool("DJANGO_DEBUG", True)
# The embedded defaults keep their files in VAR_DIR (SQLite, broker, cache, beat);
# it is made when the system starts, not here (dashboard/site/embedded.py).

# No production default: with DEBUG off the key must come from the environment.
SECRET_KEY = env_secret(
    "DJANGO_SECRET_KEY",
    required=not DEBUG,
    dev_default="django-insecure-dev-only-key-do-not-use-in-production",
)

ALLOWED_HOSTS = env_list(
    "DJANGO_ALLOWED_HOSTS",
    ["localhost", "127.0.0.1", "[::1]", "testserver"] if DEBUG else [],
)
CSRF_TRUSTED_ORIGINS = env_list("DJANGO_CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    # django-csp: its system checks catch a policy written in its old (3.x) settings.
    "csp",
    "django_htmx",
    "template_partials",
    "governance",
    "dashboard",
    # The platform: its management command `up` (the supervisor).
    "dashboard.site",
]

MIDDLEWARE = [
    # First: JSON errors under /api/, whatever an inner layer answers (dashboard/site/errors.py).
    "dashboard.site.errors.ApiErrorMiddleware",
    "django.middleware.security.SecurityMiddleware",
    # The Content-Security-Policy header (django-csp; settings below).
    "dashboard.site.content_security.ContentSecurityPolicyMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    # An action after the session expired: "log in again", then back (session_expiry.py).
    "dashboard.site.session_expiry.SessionExpiryMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
]

ROOT_URLCONF = "dashboard.site.urls"
# Django's default, 2.5 MiB: a larger request body under /api/ answers 413 JSON.
DATA_UPLOAD_MAX_MEMORY_SIZE = 2_621_440
# Error pages and mails (the technical 500 page of DJANGO_DEBUG=1) hide connection strings.
DEFAULT_EXCEPTION_REPORTER_FILTER = "dashboard.site.errors.SafeReporterFilter"
WSGI_APPLICATION = "dashboard.site.wsgi.application"
ASGI_APPLICATION = "dashboard.site.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "dashboard.pages.incidents.nav_count",
                "dashboard.site.time_zones.time_zone_context",
            ],
        },
    },
]

DATABASE_URL = (
    env_str("DATABASE_URL") or f"sqlite:////{(VAR_DIR / 'db.sqlite3').as_posix().lstrip('/')}"
)
# PostgreSQL connections per process come from a pool of at most this many (0: no
# pool, one persistent connection per thread).
DATABASE_POOL_MAX_SIZE = env_int("DATABASE_POOL_MAX_SIZE", 8, minimum=0)
DATABASES = {
    "default": database_from_url(
        DATABASE_URL, base_dir=BASE_DIR, pool_max_size=DATABASE_POOL_MAX_SIZE
    )
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDIS_URL = env_str("REDIS_URL")

if REDIS_URL:
    CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": REDIS_URL,
            "KEY_PREFIX": "governance",
        }
    }
else:
    # Shared between web, worker and scheduler processes without a server.
    CACHES = {
        "default": {
            # Django's, making its folder on the first write (dashboard/site/embedded.py).
            "BACKEND": "dashboard.site.embedded.FileBasedCache",
            "LOCATION": str(VAR_DIR / "cache"),
        }
    }

# Django's model backend, with a user's permissions read in one query.
AUTHENTICATION_BACKENDS = ["dashboard.site.permissions.RolePermissionsBackend"]

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "overview"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
# collectstatic fills it when DEBUG is off; `manage.py up` makes it (WhiteNoise reads it).
STATIC_ROOT = VAR_DIR / "staticfiles"
# Serve straight from the finders in development; hashed, compressed files in production.
WHITENOISE_USE_FINDERS = DEBUG
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"
        if DEBUG
        else "whitenoise.storage.CompressedManifestStaticFilesStorage"
    },
}

# --- Security: strict when DEBUG is off (manage.py check --deploy passes) ---
SECURE_SSL_REDIRECT = env_bool("DJANGO_SECURE_SSL_REDIRECT", not DEBUG)
# Read inside the deployment over plain HTTP (the health check, Prometheus):
# a redirect to https would only break them, as the request (and /metrics'
# token) has been sent by then.
SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^metrics$"]
SESSION_COOKIE_SECURE = env_bool("DJANGO_SESSION_COOKIE_SECURE", not DEBUG)
CSRF_COOKIE_SECURE = env_bool("DJANGO_CSRF_COOKIE_SECURE", not DEBUG)
SECURE_HSTS_SECONDS = env_int("DJANGO_SECURE_HSTS_SECONDS", 0 if DEBUG else 31536000, minimum=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("DJANGO_SECURE_HSTS_INCLUDE_SUBDOMAINS", not DEBUG)
SECURE_HSTS_PRELOAD = env_bool("DJANGO_SECURE_HSTS_PRELOAD", False)
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
X_FRAME_OPTIONS = "DENY"
if env_bool("DJANGO_BEHIND_TLS_PROXY", False):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SILENCED_SYSTEM_CHECKS = ["security.W021"] if not SECURE_HSTS_PRELOAD else []
# Content-Security-Policy (django-csp 4, dashboard/site/content_security.py): the
# pages load scripts, styles and everything else from this origin only, with no
# inline script or style and no eval (htmx runs with allowEval off: templates/base.html);
# computed sizes are SVG attributes, not style attributes.
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": [SELF],
        "script-src": [SELF],
        "style-src": [SELF],
        "object-src": [NONE],
        "base-uri": [SELF],
        "frame-ancestors": [NONE],
        "form-action": [SELF],
    }
}
# Answers under /api/ (JSON, the event stream) load nothing and are never framed.
API_CONTENT_SECURITY_POLICY = {"DIRECTIVES": {"default-src": [NONE], "frame-ancestors": [NONE]}}

# --- Celery (the CELERY_ namespace is read by tasks/celery.py) ---
CELERY_BROKER_URL = env_str("CELERY_BROKER_URL") or REDIS_URL or "filesystem://"
CELERY_BROKER_TRANSPORT = None
# The lanes of every queue (the Redis transport's options below): new work, and
# work sent again after a worker or the broker lost it (R6.6).
CELERY_TASK_DEFAULT_PRIORITY = 5
GOVERNANCE_RECOVERY_PRIORITY = 0
if CELERY_BROKER_URL == "filesystem://":
    # Kombu's file-system transport, making its folders when a channel opens.
    CELERY_BROKER_TRANSPORT = "dashboard.site.embedded:FilesystemTransport"
    _broker_dir = VAR_DIR / "broker"
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(_broker_dir / "queue"),
        "data_folder_out": str(_broker_dir / "queue"),
        "control_folder": str(_broker_dir / "control"),
        "processed_folder": str(_broker_dir / "processed"),
        "store_processed": False,
    }
else:
    if CELERY_BROKER_URL.startswith(("redis://", "rediss://")):
        # Kombu's Redis transport with a guard for a broker outage (its docstring).
        CELERY_BROKER_TRANSPORT = "dashboard.site.redis_transport:Transport"
    # The broker is a prompt, not the record: every stage, callback and alert
    # is a row that a sweep sends again (R6.6, R7.3, R8.2). So kombu keeps no
    # copy of a taken message in Redis (ack emulation off): that copy cost a
    # Redis round trip before every task and one after it, and came back only
    # after its visibility timeout (an hour), long after the sweeps. A task
    # whose pool process dies is still sent again at once (the worker's parent
    # sees it die: tasks/stages/lost_process.py, else reject on worker lost),
    # and a warm shutdown still gives back what it took. Stages whose messages
    # the broker lost are found when it is seen back (tasks/stages/watchdog.py).
    # Two lanes per queue, kombu's Redis priorities (the lane of priority 0 is
    # taken first, from every queue, before the other lane of any): re-sent work
    # (GOVERNANCE_RECOVERY_PRIORITY) goes ahead of new work
    # (CELERY_TASK_DEFAULT_PRIORITY). In Redis the first lane is the list named
    # like the queue, the second the name with ":5".
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "ack_emulation": False,
        "priority_steps": [GOVERNANCE_RECOVERY_PRIORITY, CELERY_TASK_DEFAULT_PRIORITY],
        "sep": ":",
    }
CELERY_RESULT_BACKEND = env_str("CELERY_RESULT_BACKEND") or REDIS_URL or None
CELERY_TASK_IGNORE_RESULT = CELERY_RESULT_BACKEND is None
CELERY_RESULT_EXPIRES = 3600
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
# A worker takes one message per free pool process and no more (acks are late,
# so a running task holds its slot): at most one message a process has not
# started is at risk when it dies, and Celery's pool hands that one to another.
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
# Celery's Django fixup closes the worker's connection pool around each task
# unless told to reuse it: once per this many tasks instead (tasks/celery.py
# returns the connection to the pool after every task).
CELERY_DB_REUSE_MAX = env_int("CELERY_DB_REUSE_MAX", 500, minimum=1)
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_TRACK_STARTED = True
CELERY_WORKER_SEND_TASK_EVENTS = False
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_TIMEZONE = "UTC"
CELERY_TASK_ALWAYS_EAGER = False
# Work separated by kind (R6.7): a backlog of model turns never delays a
# critical alert. Stages are sent to "turns" or "tools" by their kind
# (governance.services.broker.STAGE_QUEUES); everything else by task name.
# `manage.py up` runs one worker on every queue and one on "alerts" alone.
GOVERNANCE_QUEUES = ("alerts", "turns", "tools", "callbacks", "maintenance")
CELERY_TASK_DEFAULT_QUEUE = "turns"
# Declared, so a worker started without -Q consumes all of them.
CELERY_TASK_QUEUES = [Queue(name, routing_key=name) for name in GOVERNANCE_QUEUES]
CELERY_TASK_ROUTES = {
    "tasks.alerts.*": {"queue": "alerts"},
    "tasks.callbacks.*": {"queue": "callbacks"},
    "tasks.jobs.*": {"queue": "maintenance"},
    "tasks.span_store.*": {"queue": "maintenance"},
    "tasks.registry_tools.*": {"queue": "maintenance"},
}
# Backpressure (R6.7): new runs are refused with 429 and Retry-After while
# the turns queue's oldest message has waited longer than this, or while it
# holds more messages than this (0 turns a check off).
GOVERNANCE_ADMISSION_MAX_QUEUE_AGE_SECONDS = env_int(
    "GOVERNANCE_ADMISSION_MAX_QUEUE_AGE_SECONDS", 120, minimum=0
)
GOVERNANCE_ADMISSION_MAX_QUEUED = env_int("GOVERNANCE_ADMISSION_MAX_QUEUED", 5000, minimum=0)
# This host's name in stage claims, spans and the dashboard (default: the
# machine's); unique per worker host.
GOVERNANCE_HOST_NAME = (env_str("GOVERNANCE_HOST_NAME") or socket.gethostname()).replace("/", "_")[
    :80
]
CELERY_BEAT_SCHEDULE_FILENAME = str(VAR_DIR / "celerybeat-schedule")
# Celery's PersistentScheduler, making the schedule file's folder when it opens it.
CELERY_BEAT_SCHEDULER = "dashboard.site.embedded:BeatScheduler"
HEARTBEAT_SECONDS = env_int("GOVERNANCE_HEARTBEAT_SECONDS", 30, minimum=1)
CELERY_BEAT_SCHEDULE = {
    # Proves beat → broker → worker end to end. The clock watchdog, alert
    # escalation and outbound delivery join this schedule as they land.
    "scheduler-heartbeat": {
        "task": "tasks.jobs.scheduler_heartbeat",
        "schedule": float(HEARTBEAT_SECONDS),
        "options": {"expires": max(60, 2 * HEARTBEAT_SECONDS)},
    },
    "clock-watchdog": {
        "task": "tasks.jobs.clock_watchdog",
        "schedule": float(env_int("GOVERNANCE_WATCHDOG_SECONDS", 15, minimum=1)),
        "options": {"expires": 60},
    },
    "prune-span-store": {
        "task": "tasks.span_store.prune_span_store",
        "schedule": float(env_int("SPAN_STORE_PRUNE_SECONDS", 300, minimum=10)),
        "options": {"expires": 600},
    },
    # R7.3: completion callbacks whose retry is due (or whose worker died).
    "callback-retries": {
        "task": "tasks.callbacks.resend_due_callbacks",
        "schedule": float(env_int("GOVERNANCE_CALLBACK_RETRY_SECONDS", 15, minimum=1)),
        "options": {"expires": 60},
    },
    # R8.2: outbound alerts whose retry is due (or whose publish was lost).
    "deliver-alerts": {
        "task": "tasks.alerts.deliver_due",
        "schedule": float(env_int("GOVERNANCE_ALERT_SWEEP_SECONDS", 15, minimum=1)),
        "options": {"expires": 60},
    },
    # R8.2: re-notify unacknowledged critical alerts to the next tier.
    "escalate-alerts": {
        "task": "tasks.alerts.escalate_alerts",
        "schedule": float(env_int("GOVERNANCE_ESCALATION_CHECK_SECONDS", 60, minimum=1)),
        "options": {"expires": 120},
    },
    # List the MCP servers again, for list changes announced while no
    # session of ours was open (a change is a tool-surface boundary, R1.3).
    "relist-tools": {
        "task": "tasks.registry_tools.relist_tools",
        "schedule": float(env_int("GOVERNANCE_TOOL_RELIST_SECONDS", 300, minimum=10)),
        "options": {"expires": 600},
    },
    # R7.4: judge the deliveries of runs settled or changed since the last pass,
    # so the delivery report reads judgements instead of making them.
    "judge-deliveries": {
        "task": "tasks.jobs.judge_deliveries",
        "schedule": float(env_int("GOVERNANCE_DELIVERY_JUDGE_SECONDS", 5, minimum=1)),
        "options": {"expires": 30},
    },
    # Tier the provider attempts of turns finished since the last pass, so
    # the Insights page sums kept tiers instead of replaying every refusal timeline.
    "tier-attempts": {
        "task": "tasks.jobs.tier_attempts",
        "schedule": float(env_int("GOVERNANCE_INSIGHT_TIER_SECONDS", 5, minimum=1)),
        "options": {"expires": 30},
    },
}

# --- Governance rules ---
# R3.2: the re-probe schedule; override for rehearsals (e.g. "1m,2m,5m").
GOVERNANCE_REFUSAL_REPROBE_DELAYS = env_reprobe_schedule("GOVERNANCE_REFUSAL_REPROBE_DELAYS")
# Rehearsals move the shared clock of every process (manage.py clock advance 15m).
GOVERNANCE_CLOCK_ADJUSTABLE = env_bool("GOVERNANCE_CLOCK_ADJUSTABLE", False)
# R7.3 completion callbacks: HMAC-SHA256 key (no production default), retry policy.
GOVERNANCE_CALLBACK_SECRET = env_secret(
    "GOVERNANCE_CALLBACK_SECRET",
    required=not DEBUG,
    dev_default="dev-only-callback-secret-do-not-use-in-production",
)
GOVERNANCE_CALLBACK_MAX_ATTEMPTS = env_int("GOVERNANCE_CALLBACK_MAX_ATTEMPTS", 8, minimum=1)
GOVERNANCE_CALLBACK_BACKOFF_SECONDS = env_int("GOVERNANCE_CALLBACK_BACKOFF_SECONDS", 10, minimum=1)
GOVERNANCE_CALLBACK_BACKOFF_MAX_SECONDS = env_int(
    "GOVERNANCE_CALLBACK_BACKOFF_MAX_SECONDS", 3600, minimum=1
)
GOVERNANCE_CALLBACK_TIMEOUT_SECONDS = env_int("GOVERNANCE_CALLBACK_TIMEOUT_SECONDS", 10, minimum=1)
# A callback left "sending" this long lost its worker; the next attempt may go.
GOVERNANCE_CALLBACK_LEASE_SECONDS = env_int("GOVERNANCE_CALLBACK_LEASE_SECONDS", 300, minimum=1)
# Stage execution (tasks/stages/): a stage's holder renews its lease every
# third of this while the stage runs (a heartbeat, apart from the stage's time
# budget); a holder that stops renewing is taken over once the lease ends, and
# at once when its process is known to be gone.
GOVERNANCE_STAGE_LEASE_SECONDS = env_int("GOVERNANCE_STAGE_LEASE_SECONDS", 30, minimum=3)
# The last resort (R6.6): a stage never claimed this long after it was due is
# sent again by the watchdog (ahead of new work if the broker is seen without
# its message; not at all if the message still waits there). A dead holder or
# a broker that lost its messages is noticed, and its stages sent again, at
# once; this timer is for a loss nobody could see (a send that failed while
# the broker kept everything else).
GOVERNANCE_STAGE_RESEND_AFTER_SECONDS = env_int(
    "GOVERNANCE_STAGE_RESEND_AFTER_SECONDS", 120, minimum=1
)
# An unknown webhook effect is verified this long after the turn (0: at once).
GOVERNANCE_VERIFY_DELAY_SECONDS = env_float("GOVERNANCE_VERIFY_DELAY_SECONDS", 0.0, minimum=0)
RUN_DEFAULT_DEADLINE_S = env_int("GOVERNANCE_RUN_DEADLINE_SECONDS", 1800, minimum=1)
RUN_DEFAULT_STAGE_BUDGET_S = env_int("GOVERNANCE_STAGE_BUDGET_SECONDS", 180, minimum=1)
RUN_DEFAULT_NO_PROGRESS_S = env_int("GOVERNANCE_NO_PROGRESS_SECONDS", 300, minimum=1)
RUN_DEFAULT_BUDGET = {
    "model_requests": env_int("GOVERNANCE_BUDGET_MODEL_REQUESTS", 40, minimum=1),
    "tool_calls": env_int("GOVERNANCE_BUDGET_TOOL_CALLS", 20, minimum=0),
    "web_searches": env_int("GOVERNANCE_BUDGET_WEB_SEARCHES", 10, minimum=0),
    "provider_concurrency": env_int("GOVERNANCE_BUDGET_PROVIDER_CONCURRENCY", 2, minimum=1),
    "body_revisions": env_int("GOVERNANCE_BUDGET_BODY_REVISIONS", 50, minimum=1),
    "output_reserve": env_int("GOVERNANCE_BUDGET_OUTPUT_RESERVE", 2, minimum=0),
}

# --- Prometheus (GET /metrics; dashboard/site/metrics.py) ---
# A scrape sends this bearer token, or comes from an address listed below.
GOVERNANCE_METRICS_TOKEN = env_secret("GOVERNANCE_METRICS_TOKEN", required=False)


def _metrics_allow():
    from django.core.exceptions import ImproperlyConfigured

    from governance.rules.outbound import parse_allow_list

    default = ["127.0.0.0/8", "::1"] if DEBUG else []
    try:
        return parse_allow_list(env_list("GOVERNANCE_METRICS_ALLOW", default))
    except ValueError as exc:
        raise ImproperlyConfigured(f"GOVERNANCE_METRICS_ALLOW: {exc}") from None


GOVERNANCE_METRICS_ALLOW = _metrics_allow()
# Where every process writes its work counts (prometheus_client's multiprocess
# mode); `manage.py up` sets it for its children. Unset: one process's own.
GOVERNANCE_METRICS_DIR = env_str("PROMETHEUS_MULTIPROC_DIR")

# --- Approvals of tool calls (governance/rules/approvals.py) ---
# Four eyes: nobody approves or denies a call in a run they submitted themselves.
GOVERNANCE_APPROVAL_FOUR_EYES = env_bool("GOVERNANCE_APPROVAL_FOUR_EYES", False)

# --- Alert channels (R3.6, R8.2; governance/services/alerts.py, tasks/alerts.py) ---
# An unacknowledged critical alert re-notifies the next tier this often.
GOVERNANCE_ESCALATION_MINUTES = env_int("GOVERNANCE_ESCALATION_MINUTES", 15, minimum=1)
# Transient failures (429, 5xx, network) retry with capped exponential backoff.
GOVERNANCE_ALERT_RETRY_BASE_SECONDS = env_int("GOVERNANCE_ALERT_RETRY_BASE_SECONDS", 30, minimum=1)
GOVERNANCE_ALERT_RETRY_MAX_SECONDS = env_int("GOVERNANCE_ALERT_RETRY_MAX_SECONDS", 3600, minimum=1)
GOVERNANCE_ALERT_MAX_ATTEMPTS = env_int("GOVERNANCE_ALERT_MAX_ATTEMPTS", 12, minimum=1)
# A delivery left "sending" this long belongs to a worker that died.
GOVERNANCE_ALERT_CLAIM_LEASE_SECONDS = env_int(
    "GOVERNANCE_ALERT_CLAIM_LEASE_SECONDS", 300, minimum=30
)
# Links in outbound alerts point here.
GOVERNANCE_DASHBOARD_URL = env_str("GOVERNANCE_DASHBOARD_URL") or "http://localhost:8000"
# The demo's pager (dashboard/pages/demo_pager.py): POST /demo/pager answers 200 and
# logs the page; `manage.py demo` points an alert channel at it. Off in production.
GOVERNANCE_DEMO_PAGER = env_bool("GOVERNANCE_DEMO_PAGER", DEBUG)
# An incident page shows operators (apply_boundary) an excerpt of the latest request
# of the segment (the run's input): what was refused. Off by default in production.
GOVERNANCE_INCIDENT_EXCERPT = env_bool("GOVERNANCE_INCIDENT_EXCERPT", DEBUG)

# Secrets whose variable an admin names in the database (a provider's
# api_key_env, a tool's token_env, a PagerDuty channel's routing_key_env) cannot
# be read here at start-up: governance.services.secrets calls this with the name,
# at run time, once GOVERNANCE_KEY_ENV_ALLOW (at the end of this file) allows it
# (NAME or NAME_FILE; None when unset; ImproperlyConfigured on a bad name).
GOVERNANCE_NAMED_SECRET = named_secret

# E-mail channels use Django's backend: the console in development (mail is
# printed), SMTP when configured; Django's test environment swaps in locmem.
EMAIL_BACKEND = env_str("DJANGO_EMAIL_BACKEND") or "django.core.mail.backends.console.EmailBackend"
EMAIL_HOST = env_str("DJANGO_EMAIL_HOST") or "localhost"
EMAIL_PORT = env_int("DJANGO_EMAIL_PORT", 25, minimum=1)
EMAIL_HOST_USER = env_str("DJANGO_EMAIL_HOST_USER") or ""
EMAIL_HOST_PASSWORD = env_secret("DJANGO_EMAIL_HOST_PASSWORD", required=False) or ""
EMAIL_USE_TLS = env_bool("DJANGO_EMAIL_USE_TLS", False)
EMAIL_USE_SSL = env_bool("DJANGO_EMAIL_USE_SSL", False)
EMAIL_TIMEOUT = env_int("DJANGO_EMAIL_TIMEOUT", 10, minimum=1)
DEFAULT_FROM_EMAIL = env_str("DJANGO_DEFAULT_FROM_EMAIL") or "agent-governance@localhost"

# --- OpenTelemetry (tasks/telemetry.py) ---
OTEL_SERVICE_NAME = env_str("OTEL_SERVICE_NAME") or "agent-governance"
OTEL_EXPORTER_OTLP_ENDPOINT = env_str("OTEL_EXPORTER_OTLP_ENDPOINT")
# "console" prints spans; anything else exports nowhere unless OTLP is set.
OTEL_TRACES_EXPORTER = (env_str("OTEL_TRACES_EXPORTER") or "none").lower()
# Spans that are not the run's own (Django requests, SQL statements, Celery
# tasks, HTTP client calls) exist only when an exporter is configured (OTLP or
# console) and are sampled ParentBased(TraceIdRatioBased(ratio)): the fraction
# of new traces exported, 0..1. The run, stage, attempt and tool spans are
# always recorded for the span store; in OTLP they follow their trace's
# decision. OTEL_TRACES_SAMPLER is not read: the sampler is always this one.
OTEL_TRACES_SAMPLER_ARG = env_float("OTEL_TRACES_SAMPLER_ARG", 1.0, minimum=0)
if OTEL_TRACES_SAMPLER_ARG > 1:
    from django.core.exceptions import ImproperlyConfigured

    raise ImproperlyConfigured(
        f"OTEL_TRACES_SAMPLER_ARG must be at most 1, not {OTEL_TRACES_SAMPLER_ARG}"
    )
# OpenTelemetry's GenAI conventions: "gen_ai_latest_experimental" in this
# comma-separated list gives the latest names (invoke_agent, the conversation
# id, content_filter, time to first chunk); without it the names emitted before
# stay (tasks/instrumentation.py).
OTEL_SEMCONV_STABILITY_OPT_IN = env_str("OTEL_SEMCONV_STABILITY_OPT_IN")
# Prompt and answer contents in spans: only when this standard setting says so
# (true, SPAN_ONLY or SPAN_AND_EVENT), under the latest conventions.
OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT = env_str(
    "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
)
# The embedded span store (tasks/span_store.py): the spans the run page draws.
GOVERNANCE_SPAN_STORE = env_bool("GOVERNANCE_SPAN_STORE", True)
# The cap, by age and by count: checked by the writer every
# SPAN_STORE_PRUNE_EVERY_ROWS rows it writes, and by the beat job every
# SPAN_STORE_PRUNE_SECONDS (CELERY_BEAT_SCHEDULE above); oldest deleted first.
SPAN_STORE_MAX_AGE_HOURS = env_int("SPAN_STORE_MAX_AGE_HOURS", 72, minimum=1)
SPAN_STORE_MAX_ROWS = env_int("SPAN_STORE_MAX_ROWS", 200000, minimum=1000)
SPAN_STORE_PRUNE_EVERY_ROWS = env_int("SPAN_STORE_PRUNE_EVERY_ROWS", 1000, minimum=1)
# A stage's spans are written in one INSERT this long after its execution span
# (or the run span) ends, so stages ending within it share the INSERT; a span
# no stage end carries along (a stage still running) at the latest
# SPAN_STORE_FLUSH_INTERVAL_MS after it ended.
SPAN_STORE_FLUSH_DELAY_MS = env_int("SPAN_STORE_FLUSH_DELAY_MS", 50, minimum=0)
SPAN_STORE_FLUSH_INTERVAL_MS = env_int("SPAN_STORE_FLUSH_INTERVAL_MS", 5000, minimum=10)

# LOG_LEVEL: the root level of every process (INFO when unset). `manage.py up`
# runs its web, worker and scheduler at WARNING unless LOG_LEVEL is set or
# --verbose is given, and prints a status line instead of the INFO lines.
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
LOG_LEVEL = (env_str("LOG_LEVEL") or "").strip().upper() or None
if LOG_LEVEL is not None and LOG_LEVEL not in LOG_LEVELS:
    from django.core.exceptions import ImproperlyConfigured

    raise ImproperlyConfigured(
        f"LOG_LEVEL must be one of {', '.join(LOG_LEVELS)}, not {env_str('LOG_LEVEL')!r}"
    )
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "filters": {"quiet_refusals": {"()": "dashboard.site.log_filters.QuietRefusals"}},
    "loggers": {"django.request": {"filters": ["quiet_refusals"]}},
    "root": {"handlers": ["console"], "level": LOG_LEVEL or "INFO"},
}
# `manage.py up` checks the runs in progress, the stages waiting and the last
# beat this often and prints a status line when they changed (0: never).
GOVERNANCE_UP_STATUS_SECONDS = env_int("GOVERNANCE_UP_STATUS_SECONDS", 30, minimum=0)


# --- Outbound URLs (governance/rules/outbound.py, governance/services/outbound.py,
# tasks/outbound.py) ---
# Completion callbacks (callback_url), webhook/Slack/PagerDuty alert channels and the
# webhook tool refuse loopback, link-local (incl. the cloud metadata addresses
# 169.254.169.254 and fd00:ec2::254), private (RFC 1918), CGNAT (100.64/10),
# unique-local (fc00::/7), unspecified, multicast and reserved addresses. The host is
# resolved again at send time and the request connects to an address that passed.
# GOVERNANCE_OUTBOUND_ALLOW names what may be reached anyway, comma-separated: host
# names (exact, e.g. hooks.internal), IP addresses (10.1.2.3, ::1 or [::1]) and CIDR
# networks (10.20.0.0/16, fd12::/64). Production default (DJANGO_DEBUG=0): empty.
# With DJANGO_DEBUG=1 the default is loopback only (127.0.0.0/8, ::1, localhost), so
# `make run`'s demo (a loopback webhook receiver) works; set it empty to test refusals.
# With DJANGO_DEBUG=0 plain http is refused too, unless the host (or every address it
# resolves to) is allow-listed.
def _outbound_allow():
    from django.core.exceptions import ImproperlyConfigured

    from governance.rules.outbound import parse_allow_list

    default = ["127.0.0.0/8", "::1", "localhost"] if DEBUG else []
    try:
        return parse_allow_list(env_list("GOVERNANCE_OUTBOUND_ALLOW", default))
    except ValueError as exc:
        raise ImproperlyConfigured(f"GOVERNANCE_OUTBOUND_ALLOW: {exc}") from None


GOVERNANCE_OUTBOUND_ALLOW = _outbound_allow()
GOVERNANCE_OUTBOUND_REQUIRE_HTTPS = not DEBUG


# --- Stdio tool servers (tasks/mcp_stdio.py) ---
# The commands an admin may register as a stdio MCP server (each worker process
# runs it), comma-separated, each exactly as it is registered: uvx, npx,
# /opt/mcp/bin/mcp-server-git. With DJANGO_DEBUG=0 only these, and none by default;
# with DJANGO_DEBUG=1 (`make run`) any command, unless the variable is set.
_stdio_commands = env_list("GOVERNANCE_MCP_STDIO_COMMANDS", None if DEBUG else [])
GOVERNANCE_MCP_STDIO_COMMANDS = None if _stdio_commands is None else tuple(_stdio_commands)
# How long a stdio server may take to start and answer initialize (registering
# lists its tools within this too).
GOVERNANCE_MCP_STDIO_START_SECONDS = env_float(
    "GOVERNANCE_MCP_STDIO_START_SECONDS", 15.0, minimum=0.5
)


# --- Secrets named by configuration (governance/rules/secrets.py) ---
# The environment variables a provider's api_key_env, a tool's token_env and a
# PagerDuty channel's routing_key_env may name: comma-separated glob patterns.
# Default: GOVERNANCE_KEY_* and the conventional provider names (OPENAI_API_KEY,
# ANTHROPIC_API_KEY, …: governance.rules.secrets.DEFAULT_ALLOW). Never allowed,
# whatever the patterns: a name these settings read (DJANGO_SECRET_KEY,
# DATABASE_URL, GOVERNANCE_CALLBACK_SECRET …), another variable of their
# namespaces (DJANGO_*, GOVERNANCE_* but GOVERNANCE_KEY_*, OTEL_* …) and any
# *_FILE name. Read last: every name the settings read is known by then.
GOVERNANCE_KEY_ENV_ALLOW = env_key_env_policy("GOVERNANCE_KEY_ENV_ALLOW")

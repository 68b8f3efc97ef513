"""A pytest plugin (``-p tests.worker_isolation``): each pytest-xdist worker
gets its own Redis database, so one worker's Celery workers never take
another's stage messages.

pytest-django already gives each worker its own test database
(``test_<name>_gw0``, ``_gw1``, …). Redis has no such thing, so the worker's
``REDIS_URL`` is rewritten before the settings read it: ``gw0`` keeps the
database number it was given, ``gw1`` the one below, and so on. The plugin
is loaded with ``-p`` because pytest-django imports the settings before any
conftest; a worker's environment (``PYTEST_XDIST_WORKER``) is set by then.
"""

from __future__ import annotations

import os
from urllib.parse import urlsplit, urlunsplit

REDIS_DATABASES = 16  # Redis' default `databases`


def worker_redis_url(url: str, worker: str) -> str:
    """``url`` with the database number of xdist worker ``worker`` (gwN)."""
    parts = urlsplit(url)
    base = int(parts.path.strip("/") or 0)
    number = int(worker.removeprefix("gw"))
    return urlunsplit(parts._replace(path=f"/{(base - number) % REDIS_DATABASES}"))


GIVEN_REDIS_URL = os.environ.get("REDIS_URL", "")
WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
if WORKER and GIVEN_REDIS_URL:
    os.environ["REDIS_URL"] = worker_redis_url(GIVEN_REDIS_URL, WORKER)

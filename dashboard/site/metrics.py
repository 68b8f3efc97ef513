"""``GET /metrics``: the system's facts in Prometheus's text format.

The facts are read from the database at the scrape (``dashboard.queries.
metrics``), and what the work counted comes from every process's files
(``tasks/work_metrics.py``, prometheus_client's multiprocess mode), so any
web process answers for the whole system. prometheus_client
writes the exposition format (its ``generate_latest`` and a custom
collector), not hand-written text.

Who may scrape: a request with ``Authorization: Bearer`` and
``GOVERNANCE_METRICS_TOKEN``, or one from an address
``GOVERNANCE_METRICS_ALLOW`` lists (loopback under ``DJANGO_DEBUG=1``,
nothing otherwise). Anyone else gets 401 and nothing is read.
"""

from __future__ import annotations

import hmac
import ipaddress

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.multiprocess import MultiProcessCollector

from dashboard.queries.metrics import fact_gauges
from dashboard.site import permissions
from governance import time_source
from tasks import work_metrics


class _Facts:
    """A collector of the fact gauges, read afresh at each scrape."""

    def collect(self):
        for gauge in fact_gauges(time_source.now()):
            family = GaugeMetricFamily(gauge.name, gauge.help, labels=gauge.labels)
            for labels, value in gauge.samples:
                family.add_metric(list(labels), value)
            yield family


def _allowed(request: HttpRequest) -> bool:
    token = settings.GOVERNANCE_METRICS_TOKEN
    given = request.headers.get("Authorization", "")
    if token and hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
        return True
    try:
        address = ipaddress.ip_address(request.META.get("REMOTE_ADDR", ""))
    except ValueError:
        return False
    return settings.GOVERNANCE_METRICS_ALLOW.lists_address(address)


@permissions.requires(GET=permissions.ANYONE)  # its own check: a token or an address
def metrics(request: HttpRequest) -> HttpResponse:
    if not _allowed(request):
        response = HttpResponse(
            "metrics: send Authorization: Bearer <GOVERNANCE_METRICS_TOKEN>, or scrape from "
            "an address GOVERNANCE_METRICS_ALLOW lists\n",
            status=401, content_type="text/plain; charset=utf-8",
        )  # fmt: skip
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Facts())
    if settings.GOVERNANCE_METRICS_DIR:
        # Every process's counts, from the files each wrote (tasks/work_metrics.py).
        MultiProcessCollector(registry, path=settings.GOVERNANCE_METRICS_DIR)
    else:
        for metric in work_metrics.METRICS:  # one process: its own counts
            registry.register(metric)
    # The text format every Prometheus 2.x reads (Debian 12 ships 2.42).
    response = HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_PLAIN_0_0_4)
    response["Cache-Control"] = "no-store"
    return response

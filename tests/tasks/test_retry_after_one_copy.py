"""Retry-After is read by one rule (``rules.retry_after.parse_retry_after``) for the
providers, the completion callbacks and the alert channels alike: a negative,
non-finite or unreadable value is no instruction (None, the sender's own
backoff applies), an HTTP date is read against the injected clock.

Callbacks and alerts are asked of a real loopback HTTP server that answers 503
with the header under test."""

from __future__ import annotations

import threading
from datetime import timedelta
from email.utils import format_datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from governance import time_source
from tasks import alerts
from tasks import callbacks as callback_tasks

IN_90_S = "an HTTP date 90 s after the injected clock's now"


def header_value(header: str) -> str:
    if header != IN_90_S:
        return header
    return format_datetime(time_source.now() + timedelta(seconds=90), usegmt=True)


@pytest.fixture
def busy_server():
    """Answers every POST with 503 and the Retry-After asked for in the path."""

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            value = httpx.URL(self.path).params.get("retry_after", "")
            self.send_response(503)
            self.send_header("Retry-After", value)
            self.send_header("Content-Length", "4")
            self.end_headers()
            self.wfile.write(b"busy")

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/hook"
    server.shutdown()
    server.server_close()


CASES = [("30", 30.0), ("1.5", 1.5), ("-5", None), ("inf", None), ("soon", None), (IN_90_S, 90.0)]


@pytest.mark.parametrize(("header", "seconds"), CASES)
def test_r2_2_a_callback_reads_retry_after_by_the_rule(manual_clock, busy_server, header, seconds):
    url = str(httpx.URL(busy_server, params={"retry_after": header_value(header)}))
    result = callback_tasks.post(url, b"{}", {"Content-Type": "application/json"})
    assert result.status == 503
    assert result.retry_after_s == seconds


@pytest.mark.parametrize(("header", "seconds"), CASES)
def test_r2_2_an_alert_channel_reads_retry_after_by_the_rule(
    manual_clock, busy_server, header, seconds
):
    url = str(httpx.URL(busy_server, params={"retry_after": header_value(header)}))
    with httpx.Client() as client:
        response = client.post(url, content=b"{}")
    verdict = alerts.classify_response(response)
    assert verdict.kind == verdict.TRANSIENT
    assert verdict.retry_after_s == seconds

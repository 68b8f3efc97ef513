"""Outbound URLs are safe, against real loopback HTTP(S) servers.

The finding: ``callback_url`` accepted ``http://169.254.169.254/…`` and loopback
addresses, so the worker POSTed wherever an API user pointed it. Now the three
outbound calls — completion callbacks (R7.3), webhook alert channels (R8.2)
and the webhook tool (R4.1) — are checked at input time and again at send
time against the resolved address, and connect to the address that was
checked (no DNS rebinding).

The suite's autouse fixture (tests/conftest.py) allow-lists loopback, since
every other test posts to a loopback server; these tests clear it
(``nothing_allowed``) or set their own. Resolvers are injected where a test
needs a name to resolve to a chosen address.
"""

from __future__ import annotations

import json
import ssl
import subprocess
import threading
from collections.abc import Callable
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from governance import time_source
from governance.models import AlertChannel, AuditEntry, NotificationDelivery, RunCallback
from governance.rules.outbound import AllowList, parse_allow_list
from governance.services import alerts as services_alerts
from governance.services import callbacks as cb
from governance.services import outbound as services_outbound
from governance.services.errors import ServiceError
from governance.services.outbound import check_outbound_url, require_outbound_url
from tasks import alerts, outbound, tools
from tasks import callbacks as delivery
from tests.tasks.test_alert_channels import emit, make_thread
from tests.tasks.test_callbacks import settled_run

KEY = "run-1:stage-2:0:call-1"
PUBLIC = "93.184.215.14"


# --------------------------------------------------------------------------- servers


class Server:
    """A real HTTP(S) server on 127.0.0.1 recording every request (and, for
    TLS, the server name the client asked for)."""

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        self.requests: list[dict] = []
        self.server_names: list[str | None] = []
        self._lock = threading.Lock()
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def _record(self, body: bytes) -> None:
                with recorder._lock:
                    recorder.requests.append(
                        {
                            "method": self.command,
                            "path": self.path,
                            "headers": dict(self.headers),
                            "body": body,
                        }
                    )

            def do_POST(self):
                self._record(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
                self._answer(200, {"ok": True})

            def do_GET(self):
                self._record(b"")
                self._answer(200, {"status": "processed"})

            def _answer(self, status: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        if tls is not None:

            def remember(sock, server_name, context):
                recorder.server_names.append(server_name)

            tls.sni_callback = remember
            self.server.socket = tls.wrap_socket(self.server.socket, server_side=True)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def url(self, path: str = "/hook", host: str = "127.0.0.1", scheme: str = "http") -> str:
        return f"{scheme}://{host}:{self.port}{path}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def server():
    running = Server()
    yield running
    running.close()


@pytest.fixture
def nothing_allowed(settings):
    """Production's allow-list: empty."""
    settings.GOVERNANCE_OUTBOUND_ALLOW = AllowList()
    settings.GOVERNANCE_OUTBOUND_REQUIRE_HTTPS = False
    return settings


def answers(*rounds: list[str]) -> Callable[[str, int], list[str]]:
    """A resolver that gives each round's answer in turn (the last one repeats),
    recording the questions in ``.asked``."""
    queue = list(rounds)

    def resolve(host: str, port: int) -> list[str]:
        resolve.asked.append((host, port))
        return list(queue.pop(0) if len(queue) > 1 else queue[0])

    resolve.asked = []
    return resolve


class Switch:
    """A resolver whose answer the test changes: whatever the input checks
    asked before, the send sees the answer set last."""

    def __init__(self, answer: list[str]) -> None:
        self.answer = answer
        self.asked: list[tuple[str, int]] = []

    def __call__(self, host: str, port: int) -> list[str]:
        self.asked.append((host, port))
        return list(self.answer)


def hook_args(url: str) -> dict:
    return {"url": url, "payload": {"order": 7}}


# --------------------------------------------------------------------------- input time


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("http://169.254.169.254/latest/meta-data/iam/", "metadata"),
        ("http://[fd00:ec2::254]/latest/meta-data/", "metadata"),
        ("http://[::ffff:169.254.169.254]/latest/", "carrying 169.254.169.254"),
        ("http://127.0.0.1:8000/cb", "loopback"),
        ("http://[::1]:8000/cb", "loopback"),
        ("http://[::ffff:127.0.0.1]/cb", "loopback"),
        ("http://localhost:8000/cb", "localhost resolves to 127.0.0.1"),  # real DNS
        ("http://2130706433/cb", "loopback"),  # a decimal IPv4, resolved by the system
        ("http://127.1/cb", "loopback"),
        ("http://0.0.0.0:8000/cb", "unspecified"),
        ("http://[::]/cb", "unspecified"),
        ("http://10.0.0.8/cb", "RFC 1918"),
        ("https://172.16.5.4/cb", "RFC 1918"),
        ("https://192.168.1.1/cb", "RFC 1918"),
        ("https://100.64.0.1/cb", "carrier-grade NAT"),
        ("http://[fe80::1]/cb", "link-local"),
        ("http://[fc00::1]/cb", "unique-local"),
        ("http://224.0.0.1/cb", "multicast"),
        ("ftp://files.example.com/x", "only http and https"),
    ],
)
def test_r7_3_callback_url_refused_at_input(nothing_allowed, url, words):
    """R7.3: what an API user gives as ``callback_url`` is refused with words
    when it points at the metadata service, loopback, private or reserved space
    (``require_outbound_url`` is what the API and thread creation call)."""
    problem = check_outbound_url(url)
    assert problem is not None and words in problem, problem
    with pytest.raises(ServiceError) as caught:
        require_outbound_url(url)
    assert caught.value.field == "callback_url" and caught.value.message == problem


def test_r7_3_a_name_resolving_to_a_private_address_is_refused_at_input(nothing_allowed):
    """R7.3: the name is judged by what it resolves to."""
    resolver = answers(["10.1.2.3"])
    problem = check_outbound_url("https://intranet.example.com/cb", resolver=resolver)
    assert problem is not None
    assert problem.startswith("intranet.example.com resolves to 10.1.2.3, a private (RFC 1918)")
    assert resolver.asked == [("intranet.example.com", 443)]
    public = answers([PUBLIC, "2606:4700:4700::1111"])
    assert check_outbound_url("https://hooks.example.com/cb", resolver=public) is None


def test_r7_3_a_name_that_does_not_resolve_now_is_left_to_the_send(nothing_allowed, settings):
    """R7.3: a name that does not resolve at input reaches nothing now; the
    send-time check decides. The scheme rule still applies."""
    assert check_outbound_url("https://example.test/hook") is None
    settings.GOVERNANCE_OUTBOUND_REQUIRE_HTTPS = True
    assert "https is required" in check_outbound_url("http://example.test/hook")
    assert require_outbound_url("") is None  # no callback at all is fine


def test_r7_3_https_required_when_debug_is_off(nothing_allowed, settings):
    """R7.3, R8.2: with DJANGO_DEBUG=0 plain http is refused, unless allow-listed."""
    settings.GOVERNANCE_OUTBOUND_REQUIRE_HTTPS = True
    public = answers([PUBLIC])
    problem = check_outbound_url("http://hooks.example.com/cb", resolver=public)
    assert problem is not None and problem.startswith("https is required (DJANGO_DEBUG=0)")
    assert check_outbound_url("https://hooks.example.com/cb", resolver=public) is None
    settings.GOVERNANCE_OUTBOUND_ALLOW = parse_allow_list(["hooks.example.com"])
    assert check_outbound_url("http://hooks.example.com/cb", resolver=public) is None


def test_r7_3_allow_listed_host_and_cidr_are_reached(nothing_allowed, settings):
    """R7.3, R8.2, R4.1: GOVERNANCE_OUTBOUND_ALLOW lets named hosts and networks through."""
    settings.GOVERNANCE_OUTBOUND_ALLOW = parse_allow_list(["hooks.internal", "10.20.0.0/16"])
    private = answers(["10.99.0.1"])
    assert check_outbound_url("http://hooks.internal/cb", resolver=private) is None
    assert check_outbound_url("http://10.20.7.7/cb") is None
    assert "RFC 1918" in check_outbound_url("http://10.21.7.7/cb")
    assert "metadata" in check_outbound_url("http://169.254.169.254/")


def test_r7_3_the_suite_default_allows_loopback():
    """R7.3: tests/conftest.py allow-lists loopback for the suite's receivers."""
    assert check_outbound_url("http://127.0.0.1:9/cb") is None
    assert check_outbound_url("http://localhost:9/cb") is None
    assert "metadata" in check_outbound_url("http://169.254.169.254/")


# --------------------------------------------------------------------------- send time


def test_r7_3_send_connects_to_the_checked_address_keeping_the_host(server, nothing_allowed):
    """R7.3: the POST goes to the address the check passed — the name never
    reaches the system resolver (``receiver.test`` does not resolve) — with the
    original Host header."""
    nothing_allowed.GOVERNANCE_OUTBOUND_ALLOW = parse_allow_list(["127.0.0.1"])
    resolver = answers(["127.0.0.1"])
    url = server.url(host="receiver.test")
    result = delivery.post(url, b'{"x":1}', {"Content-Type": "application/json"}, resolver=resolver)
    assert result.status == 200 and cb.classify(result) == "delivered"
    (request,) = server.requests
    assert request["headers"]["Host"] == f"receiver.test:{server.port}"
    assert request["body"] == b'{"x":1}'
    assert resolver.asked == [("receiver.test", server.port)]  # one question: ours


def test_r7_3_rebinding_between_input_and_send_is_refused_at_send(server, nothing_allowed):
    """R7.3: the name resolved to a public address when the URL was given, and
    to loopback when the callback is sent: refused at send, nothing reaches the
    loopback server, and the callback fails at once (no retry)."""
    url = server.url(host="rebind.example.com")
    resolver = answers([PUBLIC], ["127.0.0.1"])
    assert check_outbound_url(url, resolver=resolver) is None  # input: looks public
    result = delivery.post(url, b"{}", {}, resolver=resolver)  # send: now loopback
    assert result.refused and not result.request_sent and result.status is None
    assert "rebind.example.com resolves to 127.0.0.1, a loopback address" in result.error
    assert cb.classify(result) == "failed"
    assert server.requests == []


def test_r7_3_the_next_checked_address_is_tried_when_connecting_fails(server, nothing_allowed):
    """R7.3: every answer was checked; a refused connection (nothing sent)
    moves on to the next checked address, never to a fresh DNS answer."""
    nothing_allowed.GOVERNANCE_OUTBOUND_ALLOW = parse_allow_list(["127.0.0.0/8"])
    resolver = answers(["127.0.0.2", "127.0.0.1"])  # nothing listens on 127.0.0.2
    result = delivery.post(server.url(host="two.example.com"), b"{}", {}, resolver=resolver)
    assert result.status == 200
    assert len(server.requests) == 1 and len(resolver.asked) == 1


def test_r7_3_a_name_that_does_not_resolve_at_send_is_a_network_error(nothing_allowed):
    """R7.3: DNS trouble is transient (retried like a refused connection), not a refusal."""
    result = delivery.post("https://nowhere.invalid/cb", b"{}", {})
    assert not result.refused and not result.request_sent
    assert result.error.startswith("network:") and "does not resolve" in result.error
    assert cb.classify(result) == "retry"


@pytest.mark.django_db
def test_r7_3_refused_callback_fails_with_the_reason_and_is_never_retried(settings):
    """R7.3: a callback row whose URL is the metadata service (written before
    this check existed, or while the allow-list still listed it) fails on its
    first attempt with the reason; the sweep never sends it again."""
    settings.GOVERNANCE_OUTBOUND_ALLOW = parse_allow_list(["169.254.169.254"])
    callback = settled_run("http://169.254.169.254/latest/meta-data/")
    settings.GOVERNANCE_OUTBOUND_ALLOW = AllowList()
    assert delivery.deliver(callback.id) == RunCallback.State.FAILED
    callback.refresh_from_db()
    assert callback.attempts == 1 and callback.status_code is None
    assert callback.last_error.startswith("refused before sending: 169.254.169.254, a link-local")
    assert "metadata" in callback.last_error
    later = time_source.now() + timedelta(days=2)
    assert callback.id not in cb.due_ids(later)
    assert delivery.deliver(callback.id) == "not claimed"


@pytest.mark.django_db
def test_r7_3_callback_rebinding_through_deliver(server, nothing_allowed, monkeypatch):
    """R7.3: the whole delivery path resolves again at send time."""
    url = server.url("/settled", host="rebind.example.com")
    resolver = Switch([PUBLIC])
    monkeypatch.setattr(services_outbound, "resolve", resolver)
    assert check_outbound_url(url) is None
    callback = settled_run(url)
    resolver.answer = ["127.0.0.1"]  # the name's owner rebinds it
    assert delivery.deliver(callback.id) == RunCallback.State.FAILED
    callback.refresh_from_db()
    assert "rebind.example.com resolves to 127.0.0.1" in callback.last_error
    assert server.requests == []


# --------------------------------------------------------------------------- alert channels


@pytest.mark.django_db
@pytest.mark.parametrize("kind", ["webhook", "slack", "pagerduty"])
def test_r8_2_refused_channel_target_disables_the_channel(
    server, nothing_allowed, monkeypatch, kind
):
    """R8.2: a channel whose target is loopback is a permanent failure: no
    request, the delivery fails, the channel is disabled with the reason."""
    monkeypatch.setenv("GOVERNANCE_KEY_PD", "routing-key-1")
    target = server.url("/alert")
    channel = AlertChannel.objects.create(
        name=f"ops-{kind}", kind=kind, target=target, routing_key_env="GOVERNANCE_KEY_PD"
    )
    now = time_source.now()
    emit(make_thread(now).segments.get(), "critical", now)
    (row,) = NotificationDelivery.objects.all()
    assert alerts.deliver(row.id) == NotificationDelivery.State.FAILED
    row.refresh_from_db()
    channel.refresh_from_db()
    assert not channel.enabled
    assert "127.0.0.1, a loopback address" in channel.disabled_reason
    assert "bad configuration: target refused" in row.last_error
    assert AuditEntry.objects.filter(action="alert_channel.disable").count() == 1
    assert server.requests == []


@pytest.mark.django_db
def test_r8_2_channel_rebinding_is_refused_at_send(server, nothing_allowed, monkeypatch):
    """R8.2: the check at input (the admin form) saw a public address; at send
    the name points at the metadata service."""
    resolver = Switch([PUBLIC])
    monkeypatch.setattr(services_outbound, "resolve", resolver)
    target = server.url("/alert", host="alerts.example.com")
    assert services_alerts.channel_target_problem("webhook", target) is None
    channel = AlertChannel.objects.create(name="ops-hook", kind="webhook", target=target)
    now = time_source.now()
    emit(make_thread(now).segments.get(), "critical", now)
    resolver.answer = ["169.254.169.254"]
    (row,) = NotificationDelivery.objects.all()
    assert alerts.deliver(row.id) == NotificationDelivery.State.FAILED
    channel.refresh_from_db()
    assert not channel.enabled and "metadata" in channel.disabled_reason
    assert server.requests == []


@pytest.mark.django_db
def test_r8_2_allow_listed_channel_is_delivered_through_the_pin(
    server, nothing_allowed, monkeypatch
):
    """R8.2: an allow-listed address is reached, at the checked address, with its Host."""
    nothing_allowed.GOVERNANCE_OUTBOUND_ALLOW = parse_allow_list(["127.0.0.1/32"])
    monkeypatch.setattr(services_outbound, "resolve", answers(["127.0.0.1"]))
    target = server.url("/alert", host="alerts.internal")
    AlertChannel.objects.create(name="ops-hook", kind="webhook", target=target)
    now = time_source.now()
    emit(make_thread(now).segments.get(), "critical", now)
    (row,) = NotificationDelivery.objects.all()
    assert alerts.deliver(row.id) == NotificationDelivery.State.DELIVERED
    (request,) = server.requests
    assert request["headers"]["Host"] == f"alerts.internal:{server.port}"


def test_r8_2_channel_target_problem_at_input(nothing_allowed):
    """R8.2: what the admin form asks (e-mail targets are not URLs; an empty
    PagerDuty target is PagerDuty's public API)."""
    problem = services_alerts.channel_target_problem("slack", "http://169.254.169.254/x")
    assert problem is not None and "metadata" in problem
    assert services_alerts.channel_target_problem("email", "ops@example.com") is None
    assert services_alerts.channel_target_problem("pagerduty", "") is None


# --------------------------------------------------------------------------- webhook tool


@pytest.mark.parametrize(
    "url",
    [
        "http://169.254.169.254/latest/meta-data/",
        "http://[::ffff:169.254.169.254]/",
        "http://10.0.0.1/hook",
        "http://[fd00:ec2::254]/",
    ],
)
def test_r4_1_webhook_to_a_forbidden_address_is_refused(nothing_allowed, url):
    """R4.1: the tool's own "no": refused, nothing sent, nothing to verify."""
    result = tools.webhook(hook_args(url), idempotency_key=KEY)
    assert result.effect == "refused" and result.output == {"request_sent": False}
    assert "GOVERNANCE_OUTBOUND_ALLOW" in result.error
    assert tools.run_tool("webhook", hook_args(url), idempotency_key=KEY).effect == "refused"


def test_r4_1_webhook_to_a_real_loopback_server_is_refused(server, nothing_allowed):
    """R4.1: a loopback receiver that would have answered gets nothing."""
    result = tools.webhook(hook_args(server.url()), idempotency_key=KEY)
    assert result.effect == "refused" and "loopback" in result.error
    assert server.requests == []


def test_r4_1_webhook_rebinding_is_refused_at_send(server, nothing_allowed):
    """R4.1: the tool resolves once, judges, and connects to what it judged."""
    url = server.url(host="rebind.example.com")
    resolver = answers([PUBLIC], ["127.0.0.1"])
    assert check_outbound_url(url, resolver=resolver) is None
    result = tools.run_tool("webhook", hook_args(url), idempotency_key=KEY, resolver=resolver)
    assert result.effect == "refused" and "resolves to 127.0.0.1" in result.error
    assert server.requests == []


def test_r4_1_webhook_pinned_keeps_host_and_verifies_by_the_name(server, nothing_allowed):
    """R4.1, R6.4: an allow-listed receiver is reached at the checked address,
    with its Host header, and the verification GET goes the same way."""
    nothing_allowed.GOVERNANCE_OUTBOUND_ALLOW = parse_allow_list(["127.0.0.1"])
    resolver = answers(["127.0.0.1"])
    url = server.url(host="crm.internal")
    sent = tools.webhook(hook_args(url), idempotency_key=KEY, resolver=resolver)
    assert sent.effect == "succeeded", sent.error
    checked = tools.verify_webhook(hook_args(url), idempotency_key=KEY, resolver=resolver)
    assert checked.effect == "succeeded"
    post, get = server.requests
    assert post["headers"]["Host"] == get["headers"]["Host"] == f"crm.internal:{server.port}"
    assert post["headers"]["Idempotency-Key"] == KEY
    assert get["path"].startswith("/hook?idempotency_key=")


def test_r6_4_verification_of_a_refused_address_proves_nothing(server, nothing_allowed):
    """R6.4: a verification the check refuses leaves the effect unknown (never a replay)."""
    checked = tools.verify_webhook(hook_args(server.url()), idempotency_key=KEY)
    assert checked.effect == "unknown" and checked.error.startswith("cannot verify:")
    assert server.requests == []


# --------------------------------------------------------------------------- TLS


@pytest.fixture(scope="module")
def certificate(tmp_path_factory):
    """A self-signed certificate for ``hooks.test`` only (openssl)."""
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
            "-keyout", str(key), "-out", str(cert), "-subj", "/CN=hooks.test",
            "-addext", "subjectAltName=DNS:hooks.test",
        ],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return cert, key


@pytest.fixture
def tls_server(certificate):
    cert, key = certificate
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    running = Server(tls=context)
    yield running
    running.close()


def _trusting(certificate) -> httpx.HTTPTransport:
    context = ssl.create_default_context(cafile=str(certificate[0]))
    return httpx.HTTPTransport(verify=context)


def test_r4_1_https_pinned_keeps_sni_and_the_certificate_check_on_the_name(
    tls_server, certificate, nothing_allowed
):
    """R4.1: over https the connection goes to the checked IP, while the TLS
    server name and the certificate check stay the URL's host name."""
    nothing_allowed.GOVERNANCE_OUTBOUND_ALLOW = parse_allow_list(["127.0.0.1"])
    nothing_allowed.GOVERNANCE_OUTBOUND_REQUIRE_HTTPS = True
    url = tls_server.url(host="hooks.test", scheme="https")
    result = tools.webhook(
        hook_args(url),
        idempotency_key=KEY,
        transport=_trusting(certificate),
        resolver=answers(["127.0.0.1"]),
    )
    assert result.effect == "succeeded", result.error
    assert tls_server.server_names == ["hooks.test"]
    (request,) = tls_server.requests
    assert request["headers"]["Host"] == f"hooks.test:{tls_server.port}"


def test_r4_1_https_pinned_to_an_ip_still_needs_a_certificate_for_the_name(
    tls_server, certificate, nothing_allowed
):
    """R4.1: pinning does not weaken TLS: a certificate for another name fails
    (before anything is sent)."""
    nothing_allowed.GOVERNANCE_OUTBOUND_ALLOW = parse_allow_list(["127.0.0.1"])
    url = tls_server.url(host="other.test", scheme="https")
    result = tools.webhook(
        hook_args(url),
        idempotency_key=KEY,
        transport=_trusting(certificate),
        resolver=answers(["127.0.0.1"]),
    )
    assert result.effect == "failed" and result.output["request_sent"] is False
    assert "certificate" in result.error.lower() or "hostname" in result.error.lower()
    assert tls_server.requests == []


def test_r4_1_pinned_routes_name_the_checked_addresses(nothing_allowed):
    """R4.1: the routes carry the checked IPs, the Host header and the SNI name."""
    nothing_allowed.GOVERNANCE_OUTBOUND_ALLOW = parse_allow_list(["::1", "127.0.0.1"])
    routes = outbound.pinned_routes(
        "https://user:pw@Hooks.Example:8443/p?q=1", resolver=answers(["::1", "127.0.0.1"])
    )
    assert [str(url) for url, _, _ in routes] == [
        "https://user:pw@[::1]:8443/p?q=1",
        "https://user:pw@127.0.0.1:8443/p?q=1",
    ]
    assert all(h == {"Host": "hooks.example:8443"} for _, h, _ in routes)
    assert all(e == {"sni_hostname": "hooks.example"} for _, _, e in routes)
    (literal,) = outbound.pinned_routes("https://127.0.0.1/x")
    assert literal[2] == {}  # an IP literal has no server name to send

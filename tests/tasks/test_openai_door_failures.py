"""R6.5 at the door: a run that settles without answering is an error the
OpenAI SDK raises, in OpenAI's shape, with the settlement's reason and
``x-should-retry: false`` — never an empty 200. Through the real worker, the
providers real HTTP servers on loopback."""

from __future__ import annotations

import json
import threading
import time

import openai
import pytest

from governance import time_source
from governance.models import Provider, Run
from governance.services import routes as route_services
from governance.services.runs import request_cancel
from tests.tasks.openai_door import TOKEN, LoopbackProvider, sdk, serving

pytestmark = pytest.mark.django_db(transaction=True)

HI = [{"role": "user", "content": "hi"}]


class RejectingProvider(LoopbackProvider):
    """Answers every request 400: not transient, so the run's route has nothing left."""

    requests: list[dict] = []  # noqa: RUF012 (reset per test)

    def do_POST(self):
        type(self).requests.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        body = json.dumps({"error": {"message": "unknown model", "type": "invalid_request_error"}})
        self.send_response(400)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body.encode())


@pytest.fixture
def broken(door, monkeypatch):
    """The route ``broken``: one provider that rejects every request."""
    with serving(RejectingProvider) as base_url:
        monkeypatch.setenv("GOVERNANCE_KEY_BAD", "unused-key")
        Provider.objects.create(
            provider_id="bad", kind="openai", model="bad-1", base_url=base_url,
            api_key_env="GOVERNANCE_KEY_BAD",
        )  # fmt: skip
        route_services.create_route(
            name="broken", provider_chain=["bad"], by="tests", now=time_source.now()
        )
        yield


def test_a_run_whose_providers_all_failed_is_a_502_the_sdk_raises_at_once(
    live_server, worker, broken
):
    with pytest.raises(openai.InternalServerError) as raised:
        sdk(live_server).chat.completions.create(model="broken", messages=HI)
    run = Run.objects.get()
    error = raised.value
    assert error.status_code == 502
    assert error.response.headers["x-should-retry"] == "false"
    assert error.response.headers["X-Governance-Run-Id"] == str(run.id)
    whole = error.response.json()
    assert whole["error"]["type"] == "server_error"
    assert whole["error"]["code"] == run.settlement.reason_code
    assert run.settlement.outcome == "failed"
    assert whole["error"]["message"].startswith("the run did not answer: ")
    assert run.settlement.reason in whole["error"]["message"]
    assert f"/runs/{run.id}/" in whole["error"]["message"]
    assert whole["governance"]["outcome"] == "failed"
    assert RejectingProvider.requests  # it was asked, and said no


def test_under_asgi_the_status_line_waits_for_the_settlement(asgi_server, worker, broken):
    """The deployment's entry sends the status when the run has settled: a
    waited answer decides it (dashboard/site/asgi.py)."""
    client = openai.OpenAI(base_url=f"{asgi_server}/v1", api_key=TOKEN, max_retries=0, timeout=60)
    with pytest.raises(openai.InternalServerError) as raised:
        client.chat.completions.create(model="broken", messages=HI)
    assert raised.value.status_code == 502
    assert raised.value.response.headers["x-should-retry"] == "false"
    assert raised.value.response.headers["content-type"] == "application/json"
    assert raised.value.body["code"] == Run.objects.get().settlement.reason_code
    answered = client.chat.completions.with_raw_response.create(model="chat", messages=HI)
    assert answered.status_code == 200 and answered.parse().choices[0].message.content == "Echo: hi"


def test_the_sdk_with_its_default_retries_sends_the_failed_request_once(
    live_server, worker, broken
):
    """``x-should-retry: false``: the SDK's two automatic retries are not made."""
    client = sdk(live_server).with_options(max_retries=2)
    with pytest.raises(openai.InternalServerError):
        client.chat.completions.create(model="broken", messages=HI)
    assert Run.objects.count() == 1


def test_streamed_the_failure_is_the_last_event_and_the_sdk_raises_it(live_server, worker, broken):
    stream = sdk(live_server).chat.completions.create(model="broken", messages=HI, stream=True)
    with pytest.raises(openai.APIError) as raised:
        for _chunk in stream:
            pass
    run = Run.objects.get()
    assert "the run did not answer" in raised.value.message
    assert raised.value.body["code"] == run.settlement.reason_code


def test_a_run_stopped_by_an_operator_is_a_409_saying_who(live_server, worker, door):
    LoopbackProvider.gate = threading.Event()
    outcome: dict = {}

    def ask():
        try:
            sdk(live_server).chat.completions.create(
                model="chat", messages=[{"role": "user", "content": "please wait"}]
            )
        except openai.APIStatusError as exc:
            outcome["error"] = exc

    client = threading.Thread(target=ask)
    client.start()
    deadline = time.monotonic() + 30
    while not LoopbackProvider.requests:
        assert time.monotonic() < deadline, "the provider was never asked"
        time.sleep(0.05)
    request_cancel(Run.objects.get(), by="oscar-operator", now=time_source.now())
    LoopbackProvider.gate.set()
    client.join(60)
    run = Run.objects.get()
    assert run.settlement.outcome == "cancelled"
    error = outcome["error"]
    assert isinstance(error, openai.ConflictError) and error.status_code == 409
    assert error.body["code"] == "run_cancelled"
    assert error.body["message"].startswith("the run was stopped by oscar-operator: ")
    assert error.response.headers["x-should-retry"] == "false"


def test_an_answered_run_is_still_a_200(live_server, worker, door):
    raw = sdk(live_server).chat.completions.with_raw_response.create(model="chat", messages=HI)
    assert raw.status_code == 200 and "x-should-retry" not in raw.headers
    assert raw.parse().choices[0].message.content == "Echo: hi"

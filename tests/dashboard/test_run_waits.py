"""``GET /api/v1/runs/{id}?wait=S``: one request answered when the run settles.

Through the Django test client (WSGI: the request's thread polls) and through
``dashboard.site.asgi`` under a real uvicorn on PostgreSQL (the suite's database,
``make test``), where the settling
transaction's NOTIFY wakes the waiting request: the tests make every fallback
read far slower than the wait, so only the notification can answer in time.
"""

from __future__ import annotations

import re
import threading
import time

import httpx
import pytest
from django.db import connection, transaction

from dashboard.api import waits as run_waits
from governance import time_source
from governance.models import Run, Stage
from governance.models import Settlement as SettlementRow
from governance.rules.settlement import Outcome, ReasonCode, Settlement
from tests import facts as written
from tests.asgi_server import serving
from tests.dashboard.conftest import CLIENT_AUTH

pytestmark = pytest.mark.django_db(transaction=True)
AUTH = CLIENT_AUTH


def settle(run) -> None:
    written.settle(
        run, Settlement(Outcome.COMPLETED, ReasonCode.ANSWERED, "done for the test"),
        time_source.now(),
    )  # fmt: skip


def body_of(response) -> dict:
    import json

    raw = b"".join(response.streaming_content) if response.streaming else response.content
    return json.loads(raw)


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("wait=soon", "wait"),
        ("wait=-1", "wait"),
        ("wait=61", "wait"),
        ("wait=nan", "wait"),
        ("wait=inf", "wait"),
        ("wait=1&wait=2", "wait"),
        ("hold=1", "hold"),
    ],
)
def test_a_bad_wait_is_a_400_naming_the_field(client, token_user, run, query, field):
    started = time.monotonic()
    response = client.get(f"/api/v1/runs/{run.id}?{query}", headers=AUTH)
    assert response.status_code == 400, response.content
    assert response.json()["error"]["field"] == field
    assert time.monotonic() - started < 2  # refused, not waited on


def test_waiting_for_an_unknown_run_is_a_404_at_once(client, token_user, run):
    response = client.get("/api/v1/runs/00000000-0000-4000-8000-000000000000?wait=30", headers=AUTH)
    assert response.status_code == 404
    assert response.json()["error"]["message"] == "no such run"


def test_waiting_needs_a_token(client, run):
    response = client.get(f"/api/v1/runs/{run.id}?wait=30")
    assert response.status_code == 401


# --------------------------------------------------------------------------- WSGI path


def test_a_settled_run_is_answered_at_once_with_its_settlement(client, token_user, run):
    settle(run)
    started = time.monotonic()
    response = client.get(f"/api/v1/runs/{run.id}?wait=30", headers=AUTH)
    assert response.status_code == 200 and not response.streaming
    body = body_of(response)
    assert body["status"] == "settled" and body["settlement"]["outcome"] == "completed"
    assert time.monotonic() - started < 5


def test_wait_zero_is_a_plain_read(client, token_user, run):
    response = client.get(f"/api/v1/runs/{run.id}?wait=0", headers=AUTH)
    assert response.status_code == 200 and not response.streaming
    assert body_of(response)["status"] == run.status != "settled"


def test_the_answer_comes_when_the_run_settles_during_the_wait(client, token_user, run):
    def settle_soon():
        time.sleep(0.3)  # a worker elsewhere finishing the run (real time: the wait is I/O)
        settle(Run.objects.get(id=run.id))

    settler = threading.Thread(target=settle_soon)
    started = time.monotonic()
    settler.start()
    response = client.get(f"/api/v1/runs/{run.id}?wait=30", headers=AUTH)
    body = body_of(response)
    settler.join()
    assert response.status_code == 200
    assert response["Content-Type"] == "application/json"
    assert response["Cache-Control"] == "no-store"
    assert body["status"] == "settled" and body["settlement"]["reason"] == "done for the test"
    assert time.monotonic() - started < 10  # not the whole 30 s


def test_an_unsettled_run_is_answered_as_it_is_when_the_wait_ends(client, token_user, run):
    started = time.monotonic()
    response = client.get(f"/api/v1/runs/{run.id}?wait=0.2", headers=AUTH)
    body = body_of(response)
    assert response.status_code == 200
    assert body["status"] != "settled" and body["settlement"] is None
    assert 0.2 <= time.monotonic() - started < 5


def test_a_look_while_waiting_is_one_small_read(client, token_user, run):
    """Each look at an unsettled run reads whether it settled (one statement),
    not the whole answer: only the final answer reads the run's stages, attempts
    and chunks."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as captured:
        body = body_of(client.get(f"/api/v1/runs/{run.id}?wait=0.3", headers=AUTH))
    assert body["status"] != "settled"
    settlements, stages = SettlementRow._meta.db_table, Stage._meta.db_table
    reads_stages = re.compile(rf'FROM "?{stages}"?\s')
    looks = [q for q in captured if settlements in q["sql"] and stages not in q["sql"]]
    answers = [q for q in captured if reads_stages.search(q["sql"])]
    assert len(looks) >= 3  # the view's, then one per poll (every 50 ms)
    assert len(answers) == 1  # the answer after the wait, read once


# --------------------------------------------------------------------------- ASGI path


@pytest.fixture
def uvicorn_server(monkeypatch):
    """dashboard.site.asgi's application under a real uvicorn in this process; every
    fallback read of a waiting request is made slower than any wait here."""
    from dashboard.site.asgi import application

    monkeypatch.setattr(run_waits, "RECHECK_S", 120.0)
    monkeypatch.setattr(run_waits, "POLL_S", 120.0)
    monkeypatch.setattr(run_waits, "LINGER_S", 0.0)  # the LISTEN connection goes with the waiters
    with serving(application) as (base, loop):
        yield base, loop


def _listener_of(loop) -> run_waits._Listener | None:
    return run_waits._listeners.get(loop)


class Asking:
    """``GET …?wait=`` sent from a thread of its own (the test settles meanwhile)."""

    def __init__(self, base: str, run, wait_s: float) -> None:
        self.response: httpx.Response | None = None
        self.elapsed = 0.0
        self.thread = threading.Thread(target=self._ask, args=(base, run, wait_s))
        self.thread.start()

    def _ask(self, base: str, run, wait_s: float) -> None:
        started = time.monotonic()
        self.response = httpx.get(
            f"{base}/api/v1/runs/{run.id}?wait={wait_s}", headers=AUTH, timeout=wait_s + 30
        )
        self.elapsed = time.monotonic() - started

    def answer(self) -> dict:
        self.thread.join(60)
        assert self.response is not None and self.response.status_code == 200
        return self.response.json()


def _waiting(loop, run) -> None:
    """Until the listener is on LISTEN and the request waits for ``run``."""
    _until(lambda: (found := _listener_of(loop)) is not None and found.listening)
    _until(lambda: str(run.id) in _listener_of(loop).waiting)


def _until(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "not reached in time"
        time.sleep(0.01)


def test_the_settling_commit_wakes_the_waiting_request(uvicorn_server, token_user, run):
    base, loop = uvicorn_server
    asking = Asking(base, run, 60)
    _waiting(loop, run)
    settle(Run.objects.get(id=run.id))
    body = asking.answer()
    assert body["status"] == "settled" and body["settlement"]["outcome"] == "completed"
    # Every fallback read is 120 s away: only the NOTIFY could answer this soon.
    assert asking.elapsed < 30
    _until(lambda: not _listener_of(loop).waiting)


def test_a_rolled_back_settlement_wakes_nobody(uvicorn_server, token_user, run):
    base, loop = uvicorn_server
    asking = Asking(base, run, 1.5)
    _waiting(loop, run)

    class Abandon(Exception):
        pass

    with pytest.raises(Abandon), transaction.atomic():
        settle(Run.objects.get(id=run.id))
        raise Abandon
    body = asking.answer()
    assert body["status"] != "settled" and body["settlement"] is None  # answered at the wait's end


def test_a_client_that_goes_away_stops_waiting(uvicorn_server, token_user, run):
    base, loop = uvicorn_server
    with pytest.raises(httpx.ReadTimeout):
        httpx.get(f"{base}/api/v1/runs/{run.id}?wait=60", headers=AUTH, timeout=1.0)
    # The disconnect cancels the waiting body: nobody is left waiting, and
    # with LINGER_S = 0 the LISTEN connection is closed too.
    _until(lambda: (found := _listener_of(loop)) is None or not found.waiting)
    _until(lambda: _listener_of(loop) is None or _listener_of(loop).task is None)


def test_a_lost_listen_connection_is_opened_again(uvicorn_server, token_user, run):
    base, loop = uvicorn_server
    asking = Asking(base, run, 60)
    _waiting(loop, run)
    with connection.cursor() as cursor:  # the database drops the LISTEN connection
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND query LIKE %s AND pid <> pg_backend_pid()",
            ["LISTEN %"],
        )
        terminated = cursor.fetchall()
        assert terminated and all(ok for (ok,) in terminated)
    _until(lambda: not _listener_of(loop).listening)
    _until(lambda: _listener_of(loop).listening)  # connected and listening again
    settle(Run.objects.get(id=run.id))
    assert asking.answer()["status"] == "settled"


@pytest.fixture
def looks(monkeypatch):
    """Each small look (settled or not) a waiting request makes, in order."""
    from dashboard.api import runs as api

    made: list[str] = []
    from dashboard.api import waits

    # The view's first look, then the waiting answer's later ones.
    monkeypatch.setattr(api, "run_settled_and_owner", _counted(api.run_settled_and_owner, made))
    monkeypatch.setattr(waits, "run_is_settled", _counted(waits.run_is_settled, made))
    return made


def _counted(look, made: list[str]):
    def counted(run_id):
        made.append(str(run_id))
        return look(run_id)

    return counted


def _another_run(run) -> Run:
    """A second run queued on ``run``'s provider, on a thread of its own."""
    from governance import services

    thread = services.create_thread(
        provider_chain=["p"], title="t2", user=run.owner, now=time_source.now()
    )
    return services.submit_run(thread, input="and you", user=run.owner, now=time_source.now())[0]


def _listening(base: str, loop, other_run) -> Asking:
    """A request left waiting on ``other_run``, so the listener is on LISTEN."""
    keeping = Asking(base, other_run, 60)
    _waiting(loop, other_run)
    return keeping


def test_the_views_look_stands_when_the_listener_was_listening(
    uvicorn_server, token_user, run, looks
):
    base, loop = uvicorn_server
    other = _another_run(run)  # keeps the listener listening
    keeping = _listening(base, loop, other)
    looks.clear()
    asking = Asking(base, run, 60)
    _until(lambda: str(run.id) in _listener_of(loop).waiting)
    settle(Run.objects.get(id=run.id))
    assert asking.answer()["status"] == "settled"
    assert looks == [str(run.id)]  # the view's look only: the NOTIFY answered
    settle(Run.objects.get(id=other.id))
    assert keeping.answer()["status"] == "settled"


def test_a_settlement_heard_between_the_look_and_the_watch_is_answered(
    uvicorn_server, token_user, run, monkeypatch
):
    """The view looks (unsettled), the run settles and the listener hears it,
    then the request starts watching: the remembered notification answers it,
    not a recheck (120 s away here)."""
    from dashboard.api import runs as api

    base, loop = uvicorn_server
    other = _another_run(run)
    keeping = _listening(base, loop, other)
    look = api.run_settled_and_owner  # the view's first look

    def look_then_settle(run_id):
        found = look(run_id)
        if str(run_id) == str(run.id):
            settle(Run.objects.get(id=run.id))
            _until(lambda: str(run.id) in _listener_of(loop).heard)
        return found

    monkeypatch.setattr(api, "run_settled_and_owner", look_then_settle)
    asking = Asking(base, run, 60)
    body = asking.answer()
    assert body["status"] == "settled" and body["settlement"]["outcome"] == "completed"
    assert asking.elapsed < 30
    settle(Run.objects.get(id=other.id))
    assert keeping.answer()["status"] == "settled"


def test_a_look_made_before_the_listener_listened_is_made_again(uvicorn_server, token_user, run):
    """A notification before LISTEN is lost: the memory does not vouch for it."""
    base, loop = uvicorn_server
    other = _another_run(run)
    keeping = _listening(base, loop, other)
    listener = _listener_of(loop)
    assert listener.heard_after(str(run.id), listener.listening_since - 1) is None
    assert listener.heard_after(str(run.id), listener.listening_since + 1) is False
    settle(Run.objects.get(id=other.id))
    assert keeping.answer()["status"] == "settled"
    assert str(other.id) in listener.heard  # remembered (it may stop listening now: nobody waits)


def test_waiting_requests_leave_the_connection_pool_to_others(uvicorn_server, token_user, run):
    """More clients wait than the web process has pooled connections
    (``DATABASE_POOL_MAX_SIZE``, 8), and a plain read is still answered at once:
    a waiting request holds no connection while it waits."""
    from django.conf import settings

    base, loop = uvicorn_server
    pooled = settings.DATABASES["default"]["OPTIONS"]["pool"]["max_size"]
    count = pooled + 4
    asking = [Asking(base, run, 60) for _ in range(count)]
    _until(
        lambda: (
            (found := _listener_of(loop)) is not None
            and len(found.waiting.get(str(run.id), ())) == count
        )
    )
    response = httpx.get(f"{base}/api/v1/runs/{run.id}", headers=AUTH, timeout=60)
    assert response.status_code == 200, response.text  # was a 503 after the pool's 10 s
    settle(Run.objects.get(id=run.id))
    assert all(one.answer()["status"] == "settled" for one in asking)

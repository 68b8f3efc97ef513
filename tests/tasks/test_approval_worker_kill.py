"""Yes runs the recorded call once, even when the worker dies right after it
sent it (R6.4: a call whose effect may have happened is verified by its key,
never replayed).

A real ``celery -A tasks worker -P prefork`` process runs a run whose call of
an external-effect HTTP tool waits for a person; the test approves it, the
worker sends the call (the tool records it and holds its answer), and every
process of the worker is killed with SIGKILL. A second worker takes the stage
over once the watchdog sees its holder gone: the receipt was written before
the call, so the call is verified by its idempotency key (the tool says it
processed it), not sent again. One call in all, and the run completes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import psutil
import pytest
from django.contrib.auth.models import Group

from governance import time_source
from governance.models import Run, ToolApproval, ToolReceipt
from governance.roles import ensure_roles
from governance.services import approvals as approval_service
from tasks.stages.watchdog import watchdog_pass
from tests.tasks import test_engine_registry_tools as registry_engine
from tests.tasks.conftest import every_queue_key
from tests.tasks.test_engine_approvals import notify_thread
from tests.tasks.test_stdio_worker_kill import _database_url, wait_for
from tests.tool_servers import HttpToolHandler, HttpToolServer

pytestmark = pytest.mark.django_db(transaction=True)
REPO = Path(__file__).resolve().parents[2]
model = registry_engine.model  # its fixture: a tool-calling model on loopback


class HeldAnswer(HttpToolHandler):
    """``/send`` records the call, then holds its answer until released."""

    release = threading.Event()

    def do_POST(self):
        if self.path.startswith("/send"):
            key = self.headers.get("Idempotency-Key")
            type(self).processed.add(key)
            type(self).seen.append({"method": "POST", "path": "/send", "key": key})
            type(self).release.wait(60)
            self.close_connection = True
            return  # the worker is gone: nobody reads an answer
        super().do_POST()


@pytest.fixture
def held_tool():
    HeldAnswer.release = threading.Event()
    with HttpToolServer() as running:
        running.server.RequestHandlerClass = HeldAnswer
        HeldAnswer.seen, HeldAnswer.processed = running.handler.seen, running.handler.processed
        yield running
        HeldAnswer.release.set()


@pytest.fixture
def start_worker(tmp_path, settings):
    """Start real prefork workers on this test's database and broker; every
    process of each is killed at the end, whatever happened."""
    import redis

    broker = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    broker.delete(*every_queue_key(settings))
    started = []

    def start(name: str, **extra_env: str):
        log_path = tmp_path / f"{name}.log"
        env = {
            **os.environ,
            "DATABASE_URL": _database_url(),
            "CELERY_BROKER_URL": settings.CELERY_BROKER_URL,
            "GOVERNANCE_HOST_NAME": settings.GOVERNANCE_HOST_NAME,
            "GOVERNANCE_VAR_DIR": str(tmp_path / "var"),
            "GOVERNANCE_OUTBOUND_ALLOW": "127.0.0.1,::1,localhost",
            "DJANGO_DEBUG": "1",
            "LOG_LEVEL": "WARNING",
            **extra_env,
        }
        with log_path.open("w") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", "tasks", "worker", "-P", "prefork",
                 "-c", "1", "-l", "INFO", "--hostname", f"worker@{name}",
                 "--without-mingle", "--without-gossip"],
                cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
        started.append(proc)
        tail = lambda: log_path.read_text(errors="replace")[-4000:]  # noqa: E731
        wait_for(f"{name} to be ready", lambda: " ready." in tail(), 60, tail)
        return proc, tail

    yield start
    for proc in started:
        if proc.poll() is None:
            for child in psutil.Process(proc.pid).children(recursive=True):
                child.kill()
            proc.kill()
        proc.wait(30)
    broker.delete(*every_queue_key(settings))


def test_a_worker_killed_right_after_the_approved_call_was_sent_still_makes_one_call(
    start_worker, api, model, held_tool, django_user_model
):
    ensure_roles()
    thread = notify_thread(
        api, django_user_model, model, held_tool.url, approval="always", timeout_s=60
    )
    first, tail = start_worker("approval-first")
    run_id = api.post(
        f"/api/v1/threads/{thread['id']}/runs", {"input": "tell ops"}, expect=202
    ).json()["run_id"]
    request = wait_for(
        "the approval request", lambda: ToolApproval.objects.filter(run_id=run_id).first(), 60,
        tail,
    )  # fmt: skip
    approver = django_user_model.objects.create_user("olga-operator")
    approver.groups.add(Group.objects.get(name="operator"))
    approval_service.decide(
        request.id, decision="approve", reason="", user=approver, now=time_source.now()
    )

    # The worker sent the call; the tool holds its answer. Kill every process of it.
    wait_for("the call", lambda: HeldAnswer.seen, 60, tail)
    workers = [psutil.Process(first.pid), *psutil.Process(first.pid).children(recursive=True)]
    for process in workers:
        os.kill(process.pid, signal.SIGKILL)
    first.wait(30)
    HeldAnswer.release.set()

    _second, tail = start_worker("approval-second")

    def settled() -> bool:
        # The stage goes again: the new worker's own look at the broker on
        # connecting, or the watchdog seeing the dead holder (same host).
        watchdog_pass()
        return Run.objects.filter(id=run_id, status=Run.Status.SETTLED).exists()

    wait_for("the run to settle", settled, 60, tail)
    run = Run.objects.get(id=run_id)
    sends = [s for s in HeldAnswer.seen if s["method"] == "POST"]
    assert len(sends) == 1 and sends[0]["key"] == request.idempotency_key
    receipt = ToolReceipt.objects.get(run_id=run_id)
    assert receipt.effect == "succeeded" and receipt.verified_at is not None
    assert run.settlement.outcome == "completed", tail()

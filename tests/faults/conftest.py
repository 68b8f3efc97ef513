"""Fixtures of the fault tests: a whole system of real processes per module.

Each module starts its own PostgreSQL cluster and its own Redis server (never
the shared 5432 / 6379), migrates, and runs the web, a prefork worker and beat
against them. On a failure the report carries the tails of their logs; the
figures each test measured are printed at the end of the session.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

from tests.faults.harness import Receiver, System

FIGURES: list[tuple[str, dict[str, Any]]] = []


def scripts(hook_url: str) -> dict[str, dict]:
    """The providers every fault system has (tasks/adapters/scripted.py format)."""
    return {
        # A healthy model that takes a while: a worker can be killed mid-call.
        "slow": {
            "rules": [{"name": "slow answer", "delay_s": 3.0,
                       "answer": {"text": "Slow answer to: {last_user}", "chunks": 2}}]
        },
        # Asks for the webhook tool once, then answers with what it returned.
        "hooker": {
            "rules": [
                {"name": "call the webhook", "delay_s": 0.3,
                 "when": {"last_role_not": "tool", "has_tool": "webhook"},
                 "tool_call": {"name": "webhook", "arguments": {
                     "url": hook_url, "payload": {"about": "{last_user}"}}}},
                {"name": "answer", "delay_s": 0.3,
                 "answer": {"text": "The hook said: {last_message}", "chunks": 2}},
            ]
        },
        # A content refusal is not a fault: the turn falls back (R3) and the
        # first refusal of a segment is a normal alert to the channel (R3.6).
        "refuser": {"default": {"refuse": {"category": "policy", "text": "I can't help."}}},
        "backup": {
            "rules": [{"name": "backup answer", "delay_s": 0.5,
                       "answer": {"text": "Backup answer to: {last_user}"}}]
        },
    }  # fmt: skip


@contextlib.contextmanager
def running_system(name: str, *, hook_delay_s: float = 0.0, **settings: str) -> Iterator[System]:
    receiver = Receiver(hook_delay_s=hook_delay_s)
    system = System(name, settings=settings)
    system.receiver = receiver
    try:
        system.start()
        system.seed(
            {"providers": scripts(receiver.url("/hook")), "alert_url": receiver.url("/alert")}
        )
        yield system
    finally:
        system.close()
        receiver.close()


@pytest.fixture
def figures(request):
    """Measured figures of one test, printed in the session summary."""
    measured: dict[str, Any] = {}
    yield measured
    FIGURES.append((request.node.nodeid, measured))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        for value in getattr(item, "funcargs", {}).values():
            if isinstance(value, System):
                report.sections.append((f"fault system {value.name}: logs", value.logs(60)))


def pytest_terminal_summary(terminalreporter):
    if not FIGURES:
        return
    terminalreporter.section("fault tests: measured figures")
    for nodeid, measured in FIGURES:
        terminalreporter.write_line(nodeid)
        for key, value in measured.items():
            terminalreporter.write_line(f"    {key}: {value}")

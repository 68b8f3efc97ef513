"""The holder's heartbeat: while this process runs a stage, one background
thread renews the leases of every stage it holds (a third of the lease
apart), so a long provider call keeps its claim and a dead process loses it
within one lease (R6.6). The stage's time budget is a separate clock."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from django.conf import settings
from django.db import connection

from governance import time_source
from governance.services.claims import renew_leases

log = logging.getLogger(__name__)


class Heartbeat:
    def __init__(self) -> None:
        self._held: dict[str, int] = {}  # holder → stage id
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._pid = 0  # a forked child needs its own thread

    @contextmanager
    def holding(self, holder: str, stage_id: int) -> Iterator[None]:
        with self._lock:
            self._held[holder] = stage_id
            self._ensure_thread()
        try:
            yield
        finally:
            with self._lock:
                self._held.pop(holder, None)

    def held(self) -> list[str]:
        with self._lock:
            return list(self._held)

    def beat(self) -> set[str]:
        """Renew now; returns the holders that still hold their stage."""
        holders = self.held()
        if not holders:
            return set()
        try:
            kept = renew_leases(holders, time_source.now())
        finally:
            connection.close()  # this thread's own connection; do not keep it idle
        for lost in set(holders) - kept:
            log.warning("stage %s was taken over or finished meanwhile", self._held.get(lost))
        return kept

    def _ensure_thread(self) -> None:
        if self._thread is not None and self._thread.is_alive() and self._pid == os.getpid():
            return
        self._pid = os.getpid()
        self._thread = threading.Thread(target=self._loop, name="stage-heartbeat", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        interval = settings.GOVERNANCE_STAGE_LEASE_SECONDS / 3
        while not self._wake.wait(interval):
            try:
                self.beat()
            except Exception:  # the database may be restarting: the next beat tries again
                log.exception("stage heartbeat failed")


heartbeat = Heartbeat()

"""What each worker process reports of its running stdio tool servers
(``tasks.mcp_stdio``), for the Tools page: one row per server and worker
process, replaced at each report."""

from __future__ import annotations

import os
from datetime import datetime

from governance.models import ToolProcess, ToolServer


def report(
    server_name: str,
    worker: str,
    *,
    state: str,
    pid: int | None,
    started_at: datetime | None,
    restarts: int,
    next_start_at: datetime | None,
    last_error: str,
    stderr_tail: str | None,
    now: datetime,
) -> None:
    """Keep one worker process's view of a server (``stderr_tail`` None: unchanged)."""
    server_id = ToolServer.objects.filter(name=server_name).values_list("id", flat=True).first()
    if server_id is None:  # removed meanwhile
        return
    values = {
        "state": state, "pid": pid, "started_at": started_at, "restarts": restarts,
        "next_start_at": next_start_at, "last_error": last_error[:2000], "updated_at": now,
    }  # fmt: skip
    if stderr_tail is not None:
        values["stderr_tail"] = stderr_tail[-8000:]
    ToolProcess.objects.update_or_create(server_id=server_id, worker=worker, defaults=values)


def forget_dead_workers(hostname: str) -> int:
    """Drop the rows of this host's worker processes that are gone (killed,
    SIGKILL included, so they could not say so); returns how many."""
    gone = []
    for row_id, worker in ToolProcess.objects.filter(worker__startswith=f"{hostname}:").values_list(
        "id", "worker"
    ):
        pid = worker.rpartition(":")[2]
        if not pid.isdigit() or not _alive(int(pid)):
            gone.append(row_id)
    if gone:
        ToolProcess.objects.filter(id__in=gone).delete()
    return len(gone)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True

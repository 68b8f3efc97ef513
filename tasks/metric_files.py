"""The names of the files the work counts are written to (prometheus_client's
multiprocess mode, ``tasks/work_metrics.py``): the host's name and the
process id, where prometheus_client names them by the process id alone.

Processes that share ``PROMETHEUS_MULTIPROC_DIR`` must never share a file:
each writes its own at offsets only it knows, so two writers corrupt each
other's counts. Under ``manage.py up`` every process runs on one host and
their ids differ; in containers (``deploy/compose.yaml``) each container
counts its process ids from 1, so a web process and a worker process may
have the same id. A container's host name is its own (its id, under
Docker), which keeps their files apart.

Imported first by ``tasks/__init__.py``: a metric made before the names are
set would write to a file named the old way.
"""

from __future__ import annotations

import os
import socket

from prometheus_client import values

# The host's name does not change after a fork; the process id does.
# prometheus_client splits a file's name on "_", so the name holds none.
HOST = socket.gethostname().replace("_", "-") or "host"


def process_identifier() -> str:
    return f"{HOST}-{os.getpid()}"


def name_files_by_host() -> None:
    """In multiprocess mode (chosen by prometheus_client from the environment
    when it was imported), name every new value's file by host and process."""
    if getattr(values.ValueClass, "_multiprocess", False):
        values.ValueClass = values.MultiProcessValue(process_identifier)


name_files_by_host()

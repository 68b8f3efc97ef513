"""An ASGI application under a real uvicorn in this process (a thread of its
own, its own event loop), for tests that need the deployment's async entry."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def serving(application) -> Iterator[tuple[str, asyncio.AbstractEventLoop]]:
    """The server's base URL and its event loop while the block runs."""
    import uvicorn
    from django.db import connections

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(application, host="127.0.0.1", port=port, lifespan="off", log_level="error")
    )
    loop_of: dict = {}

    async def main():
        loop_of["loop"] = asyncio.get_running_loop()
        await server.serve()

    thread = threading.Thread(target=lambda: asyncio.run(main()), daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server.started
    try:
        yield f"http://127.0.0.1:{port}", loop_of["loop"]
    finally:
        server.should_exit = True
        thread.join(10)
        connections.close_all()

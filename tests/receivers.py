"""A loopback HTTP receiver that records what it is sent (alert channels,
callbacks): a real server, so the senders are tested as they run."""

from __future__ import annotations

import json
import threading
import time
from collections import defaultdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Receiver:
    """A real HTTP server on 127.0.0.1 that records every request it receives.

    ``script[path]`` is a list of status codes answered in order (then 200);
    ``delay`` holds each answer back to widen race windows."""

    def __init__(self) -> None:
        self.requests: list[dict] = []
        self.script: dict[str, list[int]] = defaultdict(list)
        self.delay = 0.0
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                with receiver._lock:
                    receiver.requests.append(
                        {
                            "path": self.path,
                            "headers": dict(self.headers),
                            "body": json.loads(raw or b"null"),
                        }
                    )
                    queue = receiver.script[self.path]
                    status = queue.pop(0) if queue else 200
                if receiver.delay:
                    time.sleep(receiver.delay)
                payload = b'{"status":"ok"}' if status < 400 else b'{"error":"scripted"}'
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}{path}"

    def at(self, path: str) -> list[dict]:
        with self._lock:
            return [r for r in self.requests if r["path"] == path]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

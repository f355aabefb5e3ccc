"""A worker's own small HTTP endpoint: `/health`, `/ready` and `/metrics`, nothing else.

A worker serves no API, but it has its own health (the container healthcheck asks `/ready`) and its own
metrics (real-time factor, audio seconds, its queue), which only it can report. Standard library server
on a daemon thread; it binds the `server.host`/`server.port` settings (127.0.0.1:7860 by default).
"""

from __future__ import annotations

import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from cosyserve.service.wire import to_json

log = logging.getLogger(__name__)


class WorkerHttp:
    """Serves `readiness()` and `metrics.render()` of a worker's service until `close()`."""

    def __init__(self, host: str, port: int, readiness: Any, metrics: Any) -> None:
        handler = _handler(readiness, metrics)
        self.server = ThreadingHTTPServer((host, port), handler)
        self.server.daemon_threads = True
        self.address = self.server.server_address
        self._thread = threading.Thread(
            target=self.server.serve_forever, name="cosyserve-worker-http", daemon=True
        )

    def start(self) -> WorkerHttp:
        self._thread.start()
        log.info("worker health and metrics on http://%s:%d (/ready, /metrics)", *self.address[:2])
        return self

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _handler(readiness: Any, metrics: Any) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "cosyserve-worker"

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/health":
                self._send(200, b'{"status":"ok"}', "application/json")
            elif path == "/ready":
                state = readiness()
                body = to_json(state)
                self._send(200 if state.get("ready") else 503, body, "application/json")
            elif path == "/metrics":
                body, content_type = metrics.render()
                self._send(200, body, content_type)
            else:
                self._send(
                    404,
                    b'{"error":{"code":"not_found","message":"a worker serves /health, /ready '
                    b'and /metrics only"}}',
                    "application/json",
                )

        def _send(self, status: int, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("worker http: " + format, *args)

    return Handler

"""Small HTTP servers on 127.0.0.1 standing in for remote endpoints that cannot run here.

`LoopbackServer` is the base: it binds a free port, serves from a daemon thread inside a `with`
block and is gone after it; `down_url()` is an address where nothing listens; `JsonHandler` reads
and sends JSON. Piston's stand-in (tests/piston_standin.py) is built on them. Import like
conftest's helpers: `from fakes import LoopbackServer`.
"""

from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self


class LoopbackServer(ThreadingHTTPServer):
    """An HTTP server on a free loopback port; `with server:` serves it from a thread, then stops it."""

    daemon_threads = True

    def __init__(self, handler: type[BaseHTTPRequestHandler]) -> None:
        super().__init__(("127.0.0.1", 0), handler)
        self.lock = threading.Lock()  # for the counters subclasses keep across handler threads

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def __enter__(self) -> Self:
        # A short poll interval: leaving the block waits for the serving loop's next poll.
        threading.Thread(target=self.serve_forever, args=(0.05,), daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
        self.server_close()


def down_url() -> str:
    """The URL of a loopback port nothing listens on (bound, then closed): an endpoint that is down."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


class JsonHandler(BaseHTTPRequestHandler):
    """Request handler for JSON APIs: quiet, with one way to read a request and send a reply."""

    def log_message(self, *args: Any) -> None:
        pass

    def read_json(self) -> Any:
        return json.loads(self.rfile.read(int(self.headers["Content-Length"])))

    def send_body(self, code: int, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def send_json(self, code: int, payload: Any) -> None:
        self.send_body(code, json.dumps(payload).encode())

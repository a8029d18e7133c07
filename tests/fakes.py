"""Small HTTP servers on 127.0.0.1 standing in for remote endpoints that cannot run here.

`LoopbackServer` is the base: it binds a free port, serves from a daemon thread inside a `with`
block and is gone after it; `down_url()` is an address where nothing listens. `FakePiston` speaks
Piston's two endpoints and really runs the (trusted, test-written) Python programs it is sent;
tests make it fail, stall or talk nonsense through its `execute` hook. Import like conftest's
helpers: `from fakes import FakePiston`.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
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


# ------------------------------------------------------------------------------------ Piston

#: Reply for one POST /api/v2/execute: (HTTP status, body bytes), given the request number
#: (1-based, over the server's life) and the request.
Behaviour = Callable[[int, dict[str, Any]], tuple[int, bytes]]

#: Two versions, so a client must pick the newest (the one `piston_run` accepts).
PISTON_RUNTIMES = [{"language": "python", "version": "3.9.4", "aliases": ["py"]},
                   {"language": "python", "version": "3.10.0", "aliases": ["py", "python3"]}]


def piston_run(request: dict[str, Any]) -> dict[str, Any]:
    """Run the program of an execute request as Piston would (within its `run_timeout`) and
    describe the run Piston's way."""
    assert request["language"] == "python" and request["version"] == "3.10.0", request
    try:
        done = subprocess.run([sys.executable, "-c", request["files"][0]["content"]],
                              input=request["stdin"], capture_output=True, text=True,
                              timeout=request["run_timeout"] / 1000)
    except subprocess.TimeoutExpired:
        run = {"stdout": "", "stderr": "", "output": "", "code": None, "signal": "SIGKILL",
               "status": "TO", "message": "Timeout"}
    else:
        run = {"stdout": done.stdout, "stderr": done.stderr, "output": done.stdout + done.stderr,
               "code": done.returncode, "signal": None,
               **({"status": "RE", "message": "Runtime error"} if done.returncode else {})}
    return {"language": "python", "version": "3.10.0", "run": run}


def piston_ok(number: int, request: dict[str, Any]) -> tuple[int, bytes]:
    """The working endpoint's `Behaviour`: run the program, reply 200."""
    return 200, json.dumps(piston_run(request)).encode()


class FakePiston(LoopbackServer):
    """Piston's API on loopback: `GET /api/v2/runtimes` replies `runtimes` (`b"503"`: HTTP 503),
    `POST /api/v2/execute` replies what `execute` decides, each after `delay_s`.

    Records every execute request's arrival (`times`), the runtimes requests, and the most
    execute requests in progress at once (`max_active`).
    """

    def __init__(self, execute: Behaviour = piston_ok, runtimes: bytes | None = None,
                 delay_s: float = 0.0) -> None:
        super().__init__(_PistonHandler)
        self.execute = execute
        self.runtimes = runtimes if runtimes is not None else json.dumps(PISTON_RUNTIMES).encode()
        self.delay_s = delay_s
        self.times: list[float] = []
        self.runtime_requests = 0
        self.active = 0
        self.max_active = 0


class _PistonHandler(JsonHandler):
    server: FakePiston

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        if self.path != "/api/v2/runtimes":
            return self.send_json(404, {"message": "not found"})
        with self.server.lock:
            self.server.runtime_requests += 1
        if self.server.runtimes == b"503":
            self.send_body(503, b'{"message": "overloaded"}')
        else:
            self.send_body(200, self.server.runtimes)

    def do_POST(self) -> None:  # noqa: N802
        request = self.read_json()
        with self.server.lock:
            self.server.times.append(time.monotonic())
            number = len(self.server.times)
            self.server.active += 1
            self.server.max_active = max(self.server.max_active, self.server.active)
        try:
            time.sleep(self.server.delay_s)
            code, body = self.server.execute(number, request)
        finally:
            with self.server.lock:  # before replying: the client may send its next call at once
                self.server.active -= 1
        self.send_body(code, body)

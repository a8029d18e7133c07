"""A stand-in for Piston's v2 API on 127.0.0.1 that behaves as Piston does, for the parts a client
meets: Piston itself cannot run here (it needs isolate on cgroup v2 and downloads its runtimes).

Ported (read, not copied) from engineer-man/piston at 0a844d0:
- `api/src/api/v2.js` `get_job`: required fields and their messages, runtime lookup by language or
  alias and version, then every `{compile,run}_{memory_limit,timeout,cpu_time}` checked against
  the runtime's configured limit in that order, with the same HTTP 400 `{"message": ...}`
  ("run_timeout cannot exceed the configured limit of 3000", "If specified, ... must be a number",
  "... must be non-negative"; a falsy value is skipped; a configured limit <= 0 is none); a
  request that is not JSON is 415; `POST /execute` replies `{language, version, compile?, run}`
  with `run` = `compile` when a compile error stopped the job.
- `api/src/index.js`: Express's JSON body parser (100 kB; a larger or malformed body is HTTP 400
  `{"stack": "PayloadTooLargeError: request entity too large ..."}`), 404 `{"message": "Not Found"}`.
- `api/src/config.js`, `api/src/runtime.js`: the default limits (`PISTON_DEFAULTS`), per-language
  overrides, `GET /runtimes` as `[{language, version, aliases, runtime?}]`.
- `api/src/job.js` `safe_call`/`execute`: stdin gets a trailing newline; a compile stage for
  compiled runtimes, a compile error being `code !== 0`; each stage is `{stdout, stderr, output,
  code, signal, message, status, cpu_time, wall_time, memory}`; more than `output_max_size` on
  stdout (stderr) kills the program with status `OL` (`EL`), keeping what came before the chunk
  that overflowed; `TO`, `OL` and `EL` report `signal: "SIGKILL"`.
- isolate's meta file as job.js reads it: status `TO` ("Time limit exceeded", "... (wall clock)")
  when the CPU time (`--time`) or the wall clock (`--wall-time`) ran out, `RE` for a non-zero
  exit, `SG` for a fatal signal; `time`/`time-wall` in ms.
- `packages/gcc/10.2.0` (c++: `g++ -std=c++17 *.cpp`, no -O2), `packages/python/3.12.0`
  (`python3.12 file`), `packages/rust/1.68.2` (`rustc -o binary`, no -O).

The programs really run, on this machine, as subprocesses under rlimits (address space standing in
for isolate's memory cgroup, CPU seconds as a backstop) with the CPU time and wall clock polled
the way isolate's keeper does; only trusted, test-written programs are sent to it. Tests make it
fail, stall or talk nonsense through its `execute` hook.
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fakes import JsonHandler, LoopbackServer

from ckpteval.checkers.python import python_interpreter
from ckpteval.checkers.rust.checker import rust_sysroot

#: api/src/config.js defaults.
PISTON_DEFAULTS = {
    "compile_timeout": 10000,
    "run_timeout": 3000,
    "compile_cpu_time": 10000,
    "run_cpu_time": 3000,
    "compile_memory_limit": -1,
    "run_memory_limit": -1,
    "output_max_size": 1024,
    "max_file_size": 10_000_000,
    "max_concurrent_jobs": 64,
}
#: body-parser's `json()` default limit ("100kb").
BODY_LIMIT = 100 * 1024
#: Node's pipe reads arrive in chunks of at most this many bytes.
CHUNK = 65536
SIGNAL_NAMES = {int(s): s.name for s in signal.Signals}


@dataclass(frozen=True)
class Runtime:
    """One installed language: `compile` (argv from the files' names, in the box) or None, `run`."""

    language: str
    version: str
    aliases: tuple[str, ...]
    run: Callable[[Sequence[str]], list[str]]
    compile: Callable[[Path, Sequence[str]], list[str]] | None = None
    runtime: str | None = None  # the package, when it provides several languages (gcc)
    limit_overrides: Mapping[str, int] = field(default_factory=dict)


def _gcc_compile(box: Path, names: Sequence[str]) -> list[str]:
    for name in names:  # `rename 's/$/\.cpp/' "$@"`
        (box / name).rename(box / f"{name}.cpp")
    return ["g++", "-std=c++17", *(f"{n}.cpp" for n in names)]


def _rust_compile(box: Path, names: Sequence[str]) -> list[str]:
    return [str(rust_sysroot() / "bin" / "rustc"), "-o", "binary", *names]


def python_runtime(version: str = "3.12.0") -> Runtime:
    return Runtime(
        "python",
        version,
        ("py", "py3", "python3", f"python{version.rsplit('.', 1)[0]}"),
        run=lambda args: [python_interpreter()[0], *args],
    )


def cpp_runtime() -> Runtime:
    return Runtime(
        "c++",
        "10.2.0",
        ("cpp", "g++"),
        run=lambda args: ["./a.out", *args[1:]],
        compile=_gcc_compile,
        runtime="gcc",
    )


def rust_runtime() -> Runtime:
    return Runtime(
        "rust", "1.68.2", ("rs",), run=lambda args: ["./binary", *args[1:]], compile=_rust_compile
    )


def default_runtimes() -> list[Runtime]:
    """Two Pythons (a client must pick the newest), gcc's C++ and Rust."""
    return [python_runtime("3.10.0"), python_runtime("3.12.0"), cpp_runtime(), rust_runtime()]


class Reject(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def _version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", version))


def _satisfies(version: str, wanted: str) -> bool:
    """semver.satisfies for what clients send: an exact version, a prefix (`3.12`) or `*`/`x`."""
    if wanted in ("*", "x", "X"):
        return True
    parts = wanted.split(".")
    have = version.split(".")
    return all(
        w in ("x", "X", "*") or (i < len(have) and have[i] == w) for i, w in enumerate(parts)
    )


class Piston:
    """Piston's job logic without HTTP: `runtimes()` and `execute(body) -> (status, payload)`."""

    def __init__(
        self, runtimes: Sequence[Runtime] | None = None, limits: Mapping[str, int] | None = None
    ) -> None:
        self.installed = list(runtimes if runtimes is not None else default_runtimes())
        self.config = {**PISTON_DEFAULTS, **(limits or {})}
        self.slots = threading.BoundedSemaphore(self.config["max_concurrent_jobs"])

    def limit(self, rt: Runtime, name: str) -> int:
        """runtime.js `compute_single_limit`: a language's override, else the configured value."""
        return rt.limit_overrides.get(name) or self.config[name]

    def runtimes(self) -> list[dict[str, Any]]:
        return [
            {
                "language": rt.language,
                "version": rt.version,
                "aliases": list(rt.aliases),
                **({"runtime": rt.runtime} if rt.runtime else {}),
            }
            for rt in self.installed
        ]

    def get_job(self, body: Any) -> tuple[Runtime, dict[str, Any]]:  # noqa: C901 - a stand-in for Piston's own request handling, mirrored as it is
        """v2.js `get_job`: the runtime and the job's limits, or `Reject` with Piston's message."""
        body = body if isinstance(body, dict) else {}
        language, version, files = body.get("language"), body.get("version"), body.get("files")
        if not language or not isinstance(language, str):
            raise Reject("language is required as a string")
        if not version or not isinstance(version, str):
            raise Reject("version is required as a string")
        if not isinstance(files, list):
            raise Reject("files is required as an array")
        for i, file in enumerate(files):
            if not isinstance(file, dict) or not isinstance(file.get("content"), str):
                raise Reject(f"files[{i}].content is required as a string")
        matching = [
            rt
            for rt in self.installed
            if (rt.language == language or language in rt.aliases)
            and _satisfies(rt.version, version)
        ]
        if not matching:
            raise Reject(f"{language}-{version} runtime is unknown")
        rt = max(matching, key=lambda r: _version_tuple(r.version))
        if not any(not f.get("encoding") or f.get("encoding") == "utf8" for f in files):
            raise Reject("files must include at least one utf8 encoded file")
        for constraint in ("memory_limit", "timeout", "cpu_time"):
            for stage in ("compile", "run"):
                name = f"{stage}_{constraint}"
                value = body.get(name)
                configured = self.limit(rt, name)
                if not value:  # JS `!value`: missing, null, 0, false, ""
                    continue
                if isinstance(value, bool) or not isinstance(value, (int, float)):
                    raise Reject(f"If specified, {name} must be a number")
                if configured <= 0:
                    continue
                if value > configured:
                    raise Reject(f"{name} cannot exceed the configured limit of {configured}")
                if value < 0:
                    raise Reject(f"{name} must be non-negative")
        job = {}
        for constraint in ("memory_limit", "timeout", "cpu_time"):
            for stage in ("compile", "run"):
                name = f"{stage}_{constraint}"
                job[name] = body[name] if body.get(name) is not None else self.limit(rt, name)
        stdin = body.get("stdin") if body.get("stdin") is not None else ""
        job.update(
            files=files,
            args=body.get("args") or [],
            stdin=stdin if str(stdin).endswith("\n") else f"{stdin}\n",
        )
        return rt, job

    def execute(self, body: Any) -> tuple[int, dict[str, Any]]:
        try:
            rt, job = self.get_job(body)
        except Reject as exc:
            return 400, {"message": exc.message}
        with self.slots, tempfile.TemporaryDirectory(prefix="piston-box-") as tmp:
            box = Path(tmp)
            names = []
            for i, file in enumerate(job["files"]):
                name = file.get("name") or f"file{i}.code"
                path = (box / name).resolve()
                if not path.is_relative_to(box.resolve()):
                    return 500, {}
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(file["content"], encoding="utf-8")
                names.append(name)
            result: dict[str, Any] = {"language": rt.language, "version": rt.version}
            if rt.compile is not None:
                compiled = self.safe_call(rt, box, rt.compile(box, names), job, "compile")
                result["compile"] = compiled
                if compiled["code"] != 0:
                    result["run"] = compiled  # v2.js: backward compatibility
                    return 200, result
            result["run"] = self.safe_call(rt, box, rt.run([names[0], *job["args"]]), job, "run")
            return 200, result

    def safe_call(  # noqa: C901 - a stand-in for Piston's own request handling, mirrored as it is
        self, rt: Runtime, box: Path, argv: list[str], job: Mapping[str, Any], stage: str
    ) -> dict[str, Any]:
        """job.js `safe_call` over isolate: run `argv` in `box` within the stage's limits."""
        wall_ms, cpu_ms = job[f"{stage}_timeout"], job[f"{stage}_cpu_time"]
        memory = job[f"{stage}_memory_limit"]
        output_max = self.limit(rt, "output_max_size")
        rlimits = [
            f"--cpu={math.ceil(cpu_ms / 1000) + 1}",
            f"--fsize={self.limit(rt, 'max_file_size')}",
        ]
        if memory >= 0:
            rlimits.append(f"--as={memory + (64 << 20)}")  # isolate's cgroup counts resident memory
        stdin_path = box.parent / f"{box.name}.stdin"
        stdin_path.write_text(job["stdin"], encoding="utf-8")
        state: dict[str, Any] = {
            "stdout": b"",
            "stderr": b"",
            "output": b"",
            "status": None,
            "message": None,
        }
        lock = threading.Lock()
        start = time.monotonic()
        with open(stdin_path, "rb") as stdin:
            proc = subprocess.Popen(
                ["prlimit", *rlimits, "--", *argv],
                cwd=box,
                stdin=stdin,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env={
                    "PATH": "/usr/local/bin:/usr/bin:/bin",
                    "HOME": "/tmp",
                    "PISTON_LANGUAGE": rt.language,
                },
                start_new_session=True,
            )

        def kill() -> None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

        def pump(stream: Any, key: str, status: str) -> None:
            while chunk := os.read(stream.fileno(), CHUNK):
                with lock:
                    if len(state[key]) + len(chunk) > output_max:
                        state["status"] = state["status"] or status
                        state["message"] = state["message"] or f"{key} length exceeded"
                        kill()
                    else:
                        state[key] += chunk
                        state["output"] += chunk

        pumps = [
            threading.Thread(target=pump, args=(proc.stdout, "stdout", "OL"), daemon=True),
            threading.Thread(target=pump, args=(proc.stderr, "stderr", "EL"), daemon=True),
        ]
        for thread in pumps:
            thread.start()
        timed_out = None
        while True:  # isolate's keeper: poll the CPU time and the wall clock
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if (time.monotonic() - start) * 1000 > wall_ms:
                timed_out = "Time limit exceeded (wall clock)"
            elif _tree_cpu_ms(proc.pid) > cpu_ms:
                timed_out = "Time limit exceeded"
            if timed_out:
                kill()
                _, status, usage = os.wait4(proc.pid, 0)
                break
            time.sleep(0.01)
        proc.returncode = os.waitstatus_to_exitcode(status)
        kill()  # isolate tears the box down: nothing the program started survives it
        for thread in pumps:
            thread.join()
        proc.stdout.close()
        proc.stderr.close()
        stdin_path.unlink()
        wall = (time.monotonic() - start) * 1000
        cpu = (usage.ru_utime + usage.ru_stime) * 1000
        code = proc.returncode if proc.returncode >= 0 else None
        sig = SIGNAL_NAMES.get(-proc.returncode) if proc.returncode < 0 else None
        if timed_out is None and cpu > cpu_ms:  # isolate checks the final times too
            timed_out = "Time limit exceeded"
        if timed_out is None and wall > wall_ms:
            timed_out = "Time limit exceeded (wall clock)"
        status_text, message = state["status"], state["message"]
        if status_text is None:
            if timed_out:
                status_text, message = "TO", timed_out
            elif sig:
                status_text, message = "SG", f"Caught fatal signal {-proc.returncode}"
            elif code:
                status_text, message = "RE", f"Exited with error status {code}"
        return {
            "stdout": state["stdout"].decode("utf-8", "replace"),
            "stderr": state["stderr"].decode("utf-8", "replace"),
            "output": state["output"].decode("utf-8", "replace"),
            "code": None if status_text == "TO" else code,
            "signal": "SIGKILL" if status_text in ("TO", "OL", "EL") else sig,
            "message": message,
            "status": status_text,
            "cpu_time": round(cpu / 1000, 3) * 1000,
            "wall_time": round(wall / 1000, 3) * 1000,
            "memory": usage.ru_maxrss * 1024,
        }


def _tree_cpu_ms(pid: int) -> float:
    """CPU time of a running process and the children it reaped (utime + stime + cutime +
    cstime), in ms; 0 once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    ticks = sum(int(x) for x in fields[11:15])
    return ticks * 1000 / os.sysconf("SC_CLK_TCK")


#: Decides one `POST /api/v2/execute` reply: (request number, body, the stand-in's own reply) ->
#: (HTTP status, body bytes). The default passes Piston's reply through.
Behaviour = Callable[[int, Any, Callable[[], tuple[int, bytes]]], tuple[int, bytes]]


def passthrough(
    number: int, request: Any, piston: Callable[[], tuple[int, bytes]]
) -> tuple[int, bytes]:
    return piston()


class PistonStandin(LoopbackServer):
    """`Piston` over HTTP on loopback. `runtimes_body` replaces the runtimes reply (`b"503"`: HTTP
    503); `execute` can replace or wrap execute replies; each execute waits `delay_s` first.

    Records every execute request (`requests`) and its arrival (`times`), the runtimes requests,
    and the most execute requests in progress at once (`max_active`)."""

    def __init__(
        self,
        execute: Behaviour = passthrough,
        *,
        runtimes: Sequence[Runtime] | None = None,
        limits: Mapping[str, int] | None = None,
        runtimes_body: bytes | None = None,
        delay_s: float = 0.0,
    ) -> None:
        super().__init__(_Handler)
        self.piston = Piston(runtimes, limits)
        self.execute = execute
        self.runtimes_body = runtimes_body
        self.delay_s = delay_s
        self.requests: list[Any] = []
        self.times: list[float] = []
        self.runtime_requests = 0
        self.active = 0
        self.max_active = 0


class _Handler(JsonHandler):
    server: PistonStandin

    def do_GET(self) -> None:
        if self.path != "/api/v2/runtimes":
            return self.send_json(404, {"message": "Not Found"})
        with self.server.lock:
            self.server.runtime_requests += 1
        body = self.server.runtimes_body
        if body == b"503":
            return self.send_body(503, b'{"message": "overloaded"}')
        self.send_body(
            200, body if body is not None else json.dumps(self.server.piston.runtimes()).encode()
        )

    def do_POST(self) -> None:
        if self.path != "/api/v2/execute":
            return self.send_json(404, {"message": "Not Found"})
        if not str(self.headers.get("Content-Type", "")).startswith("application/json"):
            return self.send_json(415, {"message": "requests must be of type application/json"})
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if len(raw) > BODY_LIMIT:
            return self.send_json(
                400,
                {
                    "stack": "PayloadTooLargeError: request entity too large\n"
                    "    at readStream (raw-body/index.js:156:17)"
                },
            )
        try:
            request = json.loads(raw)
        except ValueError as exc:
            return self.send_json(400, {"stack": f"SyntaxError: {exc}\n    at JSON.parse"})
        with self.server.lock:
            self.server.requests.append(request)
            self.server.times.append(time.monotonic())
            number = len(self.server.times)
            self.server.active += 1
            self.server.max_active = max(self.server.max_active, self.server.active)

        def piston() -> tuple[int, bytes]:
            code, payload = self.server.piston.execute(request)
            return code, json.dumps(payload).encode()

        try:
            time.sleep(self.server.delay_s)
            code, body = self.server.execute(number, request, piston)
        finally:
            with self.server.lock:  # before replying: the client may send its next call at once
                self.server.active -= 1
        self.send_body(code, body)

"""Hostile code in every language is contained, cleaned up and judged right.

The same ten attacks are written in Python (python checker), Rust (rust checker) and C++ (stdio
checker) and scored through the checkers' public API, mixed with correct "victim" samples in the
same batches. Each attack is checked from both sides:

- from inside, an attack that is meant to be silently neutralised (writing outside, reading
  secrets, sockets, background daemons, deleting another sample's files) fails the sample loudly
  (`ESCAPED ...`) if it succeeds, and otherwise answers correctly, so its verdict must be a pass;
  attacks that cannot end well (fork bomb, memory bomb, endless output, a loop that ignores
  signals, `kill -9 -1`) must get the matching error type;
- from outside, the host is inspected afterwards: every sample starts a tracer process named
  with this module's token, and none may survive; files the attacks aimed at (the repository,
  the home directory, the interpreter/toolchain, a world-writable "other sample" directory,
  host /tmp) are unchanged; loopback and abstract-socket servers on the host were never reached;
  a host process of ours survives `kill -9 -1`; the secret in our environment appears in no
  output.

tests/test_sandbox.py (the sandbox's own contract) and the checkers' tests (verdicts of ordinary
failures) cover the single mechanisms; this module covers the whole list of the reliability issue
across languages, with host-side evidence.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from conftest import processes_with

from ckpteval.checkers import Job, Verdict, get_checker
from ckpteval.checkers import python as python_checker
from ckpteval.checkers.python import python_interpreter
from ckpteval.checkers.rust import checker as rust_checker
from ckpteval.checkers.rust.checker import rust_sysroot
from ckpteval.sandbox import Command, Limits, Sandbox

#: The attacks are made in Python, Rust and C++ (the host fixture resolves the Rust toolchain).
pytestmark = [pytest.mark.slow, pytest.mark.needs("rustc", "g++")]

REPO = Path(__file__).resolve().parents[1]
TOKEN = f"ckpteval-hostile-{secrets.token_hex(6)}"
SECRET_NAME = "CKPTEVAL_HOSTILE_TEST_SECRET"
SECRET_VALUE = secrets.token_hex(16)
TIMEOUT = 3.0

#: attack -> expected error type (None: the attack must fail silently and the sample pass).
EXPECTED = {
    "fork_bomb": "timeout",
    "memory_bomb": "memory_limit",
    "endless_output": "output_limit",
    "loop_ignoring_signals": "timeout",
    "write_outside": None,
    "read_secrets": None,
    "sockets": None,
    "background_daemon": None,
    "kill_all": None,
    "delete_other_samples": None,
}


@dataclass(frozen=True)
class Host:
    """What the attacks aim at on the host, and the evidence gathered there."""

    project: Path  # a world-writable stand-in for a project tree (the repo itself is also tried)
    home: Path  # a world-readable/writable home with ~/.ssh/id_rsa holding the secret
    victim: Path  # a world-writable directory holding another sample's files
    tcp_port: int
    abstract_name: str
    connections: list[str]
    sentinel: subprocess.Popen[bytes]

    def targets(self) -> list[str]:
        """Paths an attack tries to create: none may exist afterwards."""
        return [
            str(REPO / f"{TOKEN}.txt"),
            str(self.project / f"{TOKEN}.txt"),
            str(self.home / f"{TOKEN}.txt"),
            f"/root/{TOKEN}.txt",
            f"/tmp/{TOKEN}.txt",
            str(python_interpreter()[1] / "lib" / f"{TOKEN}.py"),
            str(rust_sysroot() / "lib" / f"{TOKEN}.rlib"),
        ]


def _snapshot(*dirs: Path) -> dict[str, tuple[int, int]]:
    return {
        str(p): (p.stat().st_size, p.stat().st_mtime_ns) for d in dirs for p in [d, *d.rglob("*")]
    }


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Host]:
    root = tmp_path_factory.mktemp("hostile-host")
    project, home, victim = root / "project", root / "home", root / "victim"
    for d in (project, home / ".ssh", victim):
        d.mkdir(parents=True)
    (project / "Snakefile").write_text("# a project file\n")
    (home / ".ssh" / "id_rsa").write_text(f"-----BEGIN KEY-----\n{SECRET_VALUE}\n")
    (victim / "main.py").write_text("print('another sample')\n")
    # Permissions let anyone in: only the sandbox's mount namespace may stand in the way.
    for d in (root, project, home, home / ".ssh", victim):
        os.chmod(d, 0o777)
    for f in (project / "Snakefile", home / ".ssh" / "id_rsa", victim / "main.py"):
        os.chmod(f, 0o666)
    connections: list[str] = []
    tcp = socket.create_server(("127.0.0.1", 0))
    unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    abstract = f"{TOKEN}-unix"
    unix.bind("\0" + abstract)
    unix.listen()
    for server, kind in ((tcp, "tcp"), (unix, "abstract unix")):
        threading.Thread(target=_accept, args=(server, kind, connections), daemon=True).start()
    sentinel = subprocess.Popen(["sleep", "600"])
    rust_sysroot()  # rustup finds its toolchain through HOME: resolve (and cache) it first
    saved = {k: os.environ.get(k) for k in (SECRET_NAME, "HOME")}
    os.environ[SECRET_NAME] = SECRET_VALUE
    os.environ["HOME"] = str(home)
    host = Host(project, home, victim, tcp.getsockname()[1], abstract, connections, sentinel)
    try:
        yield host
    finally:
        for target in host.targets():  # only if an escape (already reported) created one
            with contextlib.suppress(FileNotFoundError):
                os.unlink(target)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        sentinel.kill()
        sentinel.wait()
        tcp.close()
        unix.close()


def _accept(server: socket.socket, kind: str, connections: list[str]) -> None:
    while True:
        try:
            conn, _ = server.accept()
        except OSError:
            return
        connections.append(kind)
        conn.close()


# ------------------------------------------------------------------------------------ python

PY_PROBLEM = {
    "task_id": "hostile/add",
    "test_list": ["assert add(2, 3) == 5", "assert add(-1, 1) == 0"],
    "code": "def add(a, b):\n    return a + b\n",
}
PY_ANSWER = "\ndef add(a, b):\n    return a + b\n"


def _python_attacks(host: Host) -> dict[str, str]:
    tracer = (
        "import os, signal, socket, subprocess, sys, time\n"
        f"subprocess.Popen(['/bin/sh', '-c', 'sleep 300; :', '{TOKEN}-tracer'], "
        "start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
    )
    escaped = "if escaped:\n    raise SystemExit('ESCAPED ' + repr(escaped))\n"
    return {
        name: tracer + body
        for name, body in {
            "fork_bomb": "while True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n",
            "memory_bomb": "hog = []\nwhile True:\n    hog.append(b'x' * (64 << 20))\n",
            "endless_output": "while True:\n    sys.stdout.write('x' * 65536)\n",
            "loop_ignoring_signals": (
                "for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGXCPU):\n"
                "    signal.signal(s, signal.SIG_IGN)\nwhile True:\n    pass\n"
            ),
            "write_outside": (
                f"escaped = []\nfor path in {host.targets()!r}:\n"
                "    try:\n        open(path, 'w').write('pwned')\n"
                "        if not path.startswith('/tmp/'):\n            escaped.append(path)\n"
                "    except OSError:\n        pass\n" + escaped + PY_ANSWER
            ),
            "read_secrets": (
                f"escaped = [k for k in os.environ if k == '{SECRET_NAME}']\n"
                "for pid in os.listdir('/proc'):\n    try:\n"
                f"        if b'{SECRET_NAME}' in open(f'/proc/{{pid}}/environ', 'rb').read():\n"
                "            escaped.append(pid)\n    except OSError:\n        pass\n"
                f"for path in ['{host.home}/.ssh/id_rsa', '/root/.ssh', os.path.expanduser('~/.ssh')]:\n"
                "    try:\n        escaped.append(open(path).read() if os.path.isfile(path) else os.listdir(path))\n"
                "    except OSError:\n        pass\n" + escaped + PY_ANSWER
            ),
            "sockets": (
                "escaped = []\n"
                f"for addr in [('127.0.0.1', {host.tcp_port}), ('1.1.1.1', 53), ('8.8.8.8', 443)]:\n"
                "    try:\n        socket.create_connection(addr, timeout=1)\n        escaped.append(addr)\n"
                "    except OSError:\n        pass\n"
                "try:\n    s = socket.socket(socket.AF_UNIX)\n"
                f"    s.connect('\\0{host.abstract_name}')\n    escaped.append('abstract')\n"
                "except OSError:\n    pass\n"
                "try:\n    socket.getaddrinfo('pypi.org', 443)\n    escaped.append('dns')\n"
                "except OSError:\n    pass\n" + escaped + PY_ANSWER
            ),
            "background_daemon": (
                "if os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
                "        signal.signal(signal.SIGHUP, signal.SIG_IGN)\n"
                f"        os.execv('/bin/sh', ['/bin/sh', '-c', 'sleep 300; :', '{TOKEN}-daemon'])\n"
                "    os._exit(0)\nos.wait()\n" + PY_ANSWER
            ),
            "kill_all": "os.kill(-1, signal.SIGKILL)\n" + PY_ANSWER,
            "delete_other_samples": (
                "import glob, shutil\nescaped = []\n"
                f"for path in glob.glob('../*/*') + glob.glob('{host.victim}/*') + glob.glob('/tmp/ckpteval-*'):\n"
                "    if os.path.abspath(path).startswith(os.getcwd()):\n        continue\n"
                "    try:\n        shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)\n"
                "        escaped.append(path)\n    except OSError:\n        pass\n"
                + escaped
                + PY_ANSWER
            ),
        }.items()
    }


# -------------------------------------------------------------------------------------- rust

RS_PROBLEM = {
    "task_id": "hostile/add_two",
    "entry_point": "add_two",
    "prompt": "/// Add two integers.\nfn add_two(a: i64, b: i64) -> i64 {\n",
    "canonical_solution": "    a + b\n}\n",
    "tests": "#[cfg(test)]\nmod tests {\n    use super::*;\n\n    #[test]\n    fn test_add_two() {\n"
    "        assert_eq!(add_two(2, 3), 5);\n        assert_eq!(add_two(-4, 4), 0);\n    }\n}\n",
}
RS_ANSWER = "    a + b\n}\n"


def _rust_attacks(host: Host) -> dict[str, str]:
    tracer = (
        '    extern "C" {\n        fn fork() -> i32;\n        fn kill(pid: i32, sig: i32) -> i32;\n'
        "        fn signal(sig: i32, handler: usize) -> usize;\n    }\n"
        '    let _ = std::process::Command::new("/bin/sh")'
        f'.args(["-c", "sleep 300; :", "{TOKEN}-tracer"]).spawn();\n'
    )
    escaped = '    if !escaped.is_empty() {\n        panic!("ESCAPED {:?}", escaped);\n    }\n'
    targets = ", ".join(f'"{p}"' for p in host.targets())
    return {
        name: tracer + body
        for name, body in {
            "fork_bomb": "    loop {\n        unsafe { fork(); }\n    }\n}\n",
            "memory_bomb": "    let mut hog: Vec<Vec<u8>> = Vec::new();\n"
            "    loop {\n        hog.push(vec![7u8; 64 << 20]);\n    }\n}\n",
            "endless_output": "    use std::io::Write;\n    let mut out = std::io::stdout();\n"
            "    loop {\n        let _ = out.write_all(&[b'x'; 65536]);\n    }\n}\n",
            "loop_ignoring_signals": "    unsafe {\n        for s in [1, 2, 15, 24] {\n            signal(s, 1);\n"
            "        }\n    }\n    loop {\n        std::hint::spin_loop();\n    }\n}\n",
            "write_outside": (
                "    let mut escaped = Vec::new();\n"
                f"    for path in [{targets}] {{\n"
                '        if std::fs::write(path, "pwned").is_ok() && !path.starts_with("/tmp/") {\n'
                "            escaped.push(path);\n        }\n    }\n" + escaped + RS_ANSWER
            ),
            "read_secrets": (
                "    let mut escaped: Vec<String> = Vec::new();\n"
                f'    if std::env::var_os("{SECRET_NAME}").is_some() {{\n        escaped.push("env".into());\n    }}\n'
                '    for entry in std::fs::read_dir("/proc").unwrap().flatten() {\n'
                '        let environ = std::fs::read(entry.path().join("environ")).unwrap_or_default();\n'
                f'        if String::from_utf8_lossy(&environ).contains("{SECRET_NAME}") {{\n'
                "            escaped.push(entry.path().display().to_string());\n        }\n    }\n"
                f'    for path in ["{host.home}/.ssh/id_rsa", "/root/.ssh"] {{\n'
                "        if std::fs::read(path).is_ok() || std::fs::read_dir(path).is_ok() {\n"
                "            escaped.push(path.to_string());\n        }\n    }\n"
                + escaped
                + RS_ANSWER
            ),
            "sockets": (
                "    use std::os::linux::net::SocketAddrExt;\n    let mut escaped = Vec::new();\n"
                f'    for addr in ["127.0.0.1:{host.tcp_port}", "1.1.1.1:53", "8.8.8.8:443"] {{\n'
                "        let sock: std::net::SocketAddr = addr.parse().unwrap();\n"
                "        if std::net::TcpStream::connect_timeout(&sock, std::time::Duration::from_secs(1)).is_ok() {\n"
                "            escaped.push(addr.to_string());\n        }\n    }\n"
                f'    let name = std::os::unix::net::SocketAddr::from_abstract_name("{host.abstract_name}").unwrap();\n'
                "    if std::os::unix::net::UnixStream::connect_addr(&name).is_ok() {\n"
                '        escaped.push("abstract".to_string());\n    }\n' + escaped + RS_ANSWER
            ),
            "background_daemon": (
                "    use std::os::unix::process::CommandExt;\n"
                '    let _ = std::process::Command::new("/bin/sh")'
                f'.args(["-c", "trap \'\' HUP TERM; sleep 300; :", "{TOKEN}-daemon"]).process_group(0).spawn();\n'
                + RS_ANSWER
            ),
            "kill_all": "    unsafe {\n        kill(-1, 9);\n    }\n" + RS_ANSWER,
            "delete_other_samples": (
                "    let mut escaped = Vec::new();\n"
                f'    for dir in [".", "..", "{host.victim}"] {{\n'
                "        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {\n"
                "            let path = entry.path();\n"
                "            if std::fs::remove_file(&path).is_ok() || std::fs::remove_dir_all(&path).is_ok() {\n"
                "                escaped.push(path.display().to_string());\n            }\n        }\n    }\n"
                + escaped
                + RS_ANSWER
            ),
        }.items()
    }


# --------------------------------------------------------------------------------- C++ (stdio)

CPP_PROBLEM = {
    "task_id": "hostile/aplusb",
    "tests": [{"input": "1 2\n", "output": "3\n"}, {"input": "10 -4\n", "output": "6\n"}],
    "time_limit": 1,
    "memory_limit": 128,
}
CPP_ANSWER = (
    "    long long a, b;\n    std::cin >> a >> b;\n    std::cout << a + b << std::endl;\n}\n"
)
CPP_HEADER = (
    "#include <csignal>\n#include <cstdio>\n#include <cstdlib>\n#include <cstring>\n#include <string>\n"
    "#include <iostream>\n#include <fstream>\n#include <sstream>\n#include <vector>\n#include <dirent.h>\n"
    "#include <netinet/in.h>\n#include <arpa/inet.h>\n#include <sys/socket.h>\n#include <sys/un.h>\n"
    "#include <sys/wait.h>\n#include <unistd.h>\nextern char **environ;\n"
    "static std::vector<std::string> escaped;\n"
    "static void verdict() {\n    if (!escaped.empty()) {\n"
    '        for (auto &e : escaped) std::cerr << "ESCAPED " << e << std::endl;\n        std::exit(1);\n    }\n}\n'
    "static std::string slurp(const std::string &path) {\n    std::ifstream f(path);\n"
    "    std::stringstream s;\n    s << f.rdbuf();\n    return s.str();\n}\n"
)


def _cpp_attacks(host: Host) -> dict[str, str]:
    tracer = (
        "int main() {\n    if (fork() == 0) {\n        setsid();\n"
        f'        execl("/bin/sh", "sh", "-c", "sleep 300; :", "{TOKEN}-tracer", (char *)0);\n'
        "        _exit(0);\n    }\n"
    )
    targets = ", ".join(f'"{p}"' for p in host.targets())
    bodies = {
        "fork_bomb": "    for (;;) fork();\n}\n",
        "memory_bomb": "    std::vector<std::vector<char>> hog;\n    for (;;) hog.emplace_back(64 << 20, 'x');\n}\n",
        "endless_output": "    static char line[65536];\n    std::memset(line, 'x', sizeof line);\n"
        "    for (;;) fwrite(line, 1, sizeof line, stdout);\n}\n",
        "loop_ignoring_signals": "    for (int s : {SIGTERM, SIGINT, SIGHUP, SIGXCPU}) signal(s, SIG_IGN);\n"
        "    for (volatile unsigned long i = 0;; i++) {}\n}\n",
        "write_outside": (
            f"    for (const char *path : {{{targets}}}) {{\n"
            '        FILE *f = fopen(path, "w");\n'
            '        if (f && std::strncmp(path, "/tmp/", 5) != 0) escaped.push_back(path);\n'
            "        if (f) fclose(f);\n    }\n    verdict();\n" + CPP_ANSWER
        ),
        "read_secrets": (
            f'    if (getenv("{SECRET_NAME}")) escaped.push_back("env");\n'
            "    for (char **e = environ; *e; e++)\n"
            f'        if (std::strstr(*e, "{SECRET_NAME}")) escaped.push_back("environ");\n'
            '    if (DIR *proc = opendir("/proc")) {\n'
            "        while (dirent *d = readdir(proc)) {\n"
            '            std::string text = slurp(std::string("/proc/") + d->d_name + "/environ");\n'
            f'            if (text.find("{SECRET_NAME}") != std::string::npos) escaped.push_back(d->d_name);\n'
            "        }\n        closedir(proc);\n    }\n"
            f'    for (const char *path : {{"{host.home}/.ssh/id_rsa", "/root/.ssh"}}) {{\n'
            '        if (FILE *f = fopen(path, "r")) {\n            escaped.push_back(path);\n            fclose(f);\n        }\n    }\n'
            "    verdict();\n" + CPP_ANSWER
        ),
        "sockets": (
            f'    struct {{ const char *ip; int port; }} addrs[] = {{{{"127.0.0.1", {host.tcp_port}}}, '
            '{"1.1.1.1", 53}, {"8.8.8.8", 443}};\n'
            "    for (auto &a : addrs) {\n        int s = socket(AF_INET, SOCK_STREAM, 0);\n"
            "        sockaddr_in sa{};\n        sa.sin_family = AF_INET;\n        sa.sin_port = htons(a.port);\n"
            "        inet_pton(AF_INET, a.ip, &sa.sin_addr);\n"
            "        if (s >= 0 && connect(s, (sockaddr *)&sa, sizeof sa) == 0) escaped.push_back(a.ip);\n"
            "        close(s);\n    }\n"
            "    int u = socket(AF_UNIX, SOCK_STREAM, 0);\n    sockaddr_un ua{};\n    ua.sun_family = AF_UNIX;\n"
            f'    const char name[] = "{host.abstract_name}";\n'
            "    std::memcpy(ua.sun_path + 1, name, sizeof name - 1);\n"
            '    if (connect(u, (sockaddr *)&ua, sizeof(sa_family_t) + sizeof name) == 0) escaped.push_back("abstract");\n'
            "    verdict();\n" + CPP_ANSWER
        ),
        "background_daemon": (
            "    if (fork() == 0) {\n        setsid();\n        if (fork() == 0) {\n"
            "            signal(SIGHUP, SIG_IGN);\n"
            f'            execl("/bin/sh", "sh", "-c", "sleep 300; :", "{TOKEN}-daemon", (char *)0);\n'
            "        }\n        _exit(0);\n    }\n    wait(nullptr);\n" + CPP_ANSWER
        ),
        "kill_all": "    kill(-1, SIGKILL);\n" + CPP_ANSWER,
        "delete_other_samples": (
            f'    for (std::string dir : {{".", "..", "{host.victim}"}}) {{\n'
            "        DIR *d = opendir(dir.c_str());\n        if (!d) continue;\n"
            "        while (dirent *e = readdir(d)) {\n            std::string name = e->d_name;\n"
            '            if (name == "." || name == "..") continue;\n'
            '            std::string path = dir + "/" + name;\n'
            "            if (unlink(path.c_str()) == 0 || rmdir(path.c_str()) == 0) escaped.push_back(path);\n"
            "        }\n        closedir(d);\n    }\n    verdict();\n" + CPP_ANSWER
        ),
    }
    return {name: f"```cpp\n{CPP_HEADER}{tracer}{body}```" for name, body in bodies.items()}


CPP_VICTIM = f"```cpp\n#include <iostream>\nint main() {{\n{CPP_ANSWER}```"


# ------------------------------------------------------------------------------------- runs


def _score(
    checker_name: str, problem: dict, attacks: dict[str, str], victim: str, **options: object
) -> tuple[dict[str, Verdict], list[Verdict], float]:
    """Attacks interleaved with correct samples (so each batch holds victims), two workers."""
    checker = get_checker(checker_name, sandbox="bwrap", **options)
    jobs: list[Job] = []
    for completion in attacks.values():
        jobs += [
            Job(problem["task_id"], problem, completion),
            Job(problem["task_id"], problem, victim),
        ]
    start = time.monotonic()
    try:
        verdicts = checker.check(jobs, workers=2, timeout=TIMEOUT)
    finally:
        checker.close()
    elapsed = time.monotonic() - start
    return dict(zip(attacks, verdicts[0::2])), verdicts[1::2], elapsed


LANGUAGES = {
    "python": lambda host: _score(
        "python", PY_PROBLEM, _python_attacks(host), PY_ANSWER, memory_bytes=512 << 20
    ),
    "rust": lambda host: _score(
        "rust", RS_PROBLEM, _rust_attacks(host), RS_ANSWER, memory_bytes=512 << 20
    ),
    "cpp": lambda host: _score("stdio", CPP_PROBLEM, _cpp_attacks(host), CPP_VICTIM),
}


_OUTCOMES: dict[str, dict[str, Any]] = {}


def outcome(language: str, host: Host) -> dict[str, Any]:
    """Score one language's attacks once (cached) and gather the host-side evidence right after."""
    if language not in _OUTCOMES:
        before = _snapshot(host.project, host.home, host.victim)
        before_repo = set(os.listdir(REPO))
        verdicts, victims, elapsed = LANGUAGES[language](host)
        survivors = _processes_named(TOKEN)
        after = _snapshot(host.project, host.home, host.victim)
        _OUTCOMES[language] = {
            "verdicts": verdicts,
            "victims": victims,
            "elapsed": elapsed,
            "survivors": survivors,
            "changed": {p for p in before.keys() | after.keys() if before.get(p) != after.get(p)},
            "new_in_repo": set(os.listdir(REPO)) - before_repo,
        }
    return _OUTCOMES[language]


def _processes_named(marker: str, settle_s: float = 2.0) -> list[str]:
    """Command lines containing `marker` that are still alive `settle_s` after the run."""
    deadline = time.monotonic() + settle_s
    while True:
        found = [
            pid + ": " + cmdline.replace(b"\0", b" ").decode(errors="replace")
            for pid, cmdline in processes_with(marker).items()
            if pid != str(os.getpid())
        ]
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


CASES = [
    pytest.param(language, attack, id=f"{language}-{attack}")
    for language in LANGUAGES
    for attack in EXPECTED
]


@pytest.mark.parametrize("language,attack", CASES)
def test_attack_gets_the_right_verdict(language: str, attack: str, host: Host) -> None:
    verdict = outcome(language, host)["verdicts"][attack]
    if language == "rust" and EXPECTED[attack] is None:
        # Each Rust attack declares FFI (its tracer's extern block), which a sample cannot pass
        # with (issue 23): its tests passed (a failure, ESCAPED included, would say so), and only
        # the refusal fails it.
        assert verdict.error_type == "runtime_error", verdict
        assert verdict.hack == "binary_wide_code"
        if attack == "kill_all":
            # its function runs in a child of the tests' process, which its kill(-1) ends too
            assert "ESCAPED" not in verdict.stderr_tail, verdict.stderr_tail
            return
        assert verdict.stderr_tail.startswith("ckpteval: unsafe code or FFI"), verdict
        return
    assert verdict.error_type == EXPECTED[attack], verdict.stderr_tail[-500:]
    assert "ESCAPED" not in verdict.stderr_tail, verdict.stderr_tail


@pytest.mark.parametrize("language", list(LANGUAGES))
def test_samples_beside_the_attacks_still_pass(language: str, host: Host) -> None:
    victims: list[Verdict] = outcome(language, host)["victims"]
    assert [v.error_type for v in victims] == [None] * len(EXPECTED), [
        v.stderr_tail for v in victims
    ]


@pytest.mark.parametrize("language", list(LANGUAGES))
def test_no_process_outlives_its_sample(language: str, host: Host) -> None:
    assert outcome(language, host)["survivors"] == []
    assert host.sentinel.poll() is None, "kill -9 -1 inside a sample reached a host process"


@pytest.mark.parametrize("language", list(LANGUAGES))
def test_nothing_outside_the_sample_changed(language: str, host: Host) -> None:
    result = outcome(language, host)
    assert result["changed"] == set()
    assert result["new_in_repo"] == set()
    for path in host.targets():
        assert not os.path.exists(path), path
    assert (host.victim / "main.py").read_text() == "print('another sample')\n"
    assert host.connections == []


@pytest.mark.parametrize("language", list(LANGUAGES))
def test_no_secret_reaches_any_output(language: str, host: Host) -> None:
    result = outcome(language, host)
    for verdict in [*result["verdicts"].values(), *result["victims"]]:
        assert SECRET_VALUE not in verdict.stderr_tail
        assert SECRET_VALUE not in str(verdict.extras)


# -------------------------------------------------------------------- CPU-limit classification

SPIN_IGNORING_SIGXCPU = (
    "import signal\nfor s in (signal.SIGTERM, signal.SIGXCPU):\n"
    "    signal.signal(s, signal.SIG_IGN)\nwhile True:\n    pass\n"
)


def test_endless_loop_that_ignores_sigxcpu_is_a_timeout(tmp_path: Path) -> None:
    """Deterministic form of a multi-threaded spinner (more CPU seconds than wall seconds): the
    CPU limit, not the wall clock, ends it. Whatever ends an endless loop, it is a timeout."""
    interpreter, prefix = python_interpreter()
    os.chmod(tmp_path, 0o755)
    (tmp_path / "main.py").write_text(SPIN_IGNORING_SIGXCPU)
    result = Sandbox("bwrap").run_many(
        [Command([interpreter, "-I", "-S", "main.py"], Limits(wall_s=30, cpu_s=1))],
        workdir=tmp_path,
        readable=[prefix],
    )[0]
    assert result.duration_s < 15
    assert python_checker.classify(result).error_type == "timeout"
    assert rust_checker.classify(result).error_type == "timeout"

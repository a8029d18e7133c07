"""Runs inside one bubblewrap sandbox, as its root (a few capabilities, no others), and executes
many commands one after another; `ckpteval.sandbox.Sandbox.run_many` starts it.

Standard library only: it runs under the base interpreter with `-I -S`, which cannot import
ckpteval. So the modules of this package are one program there, assembled by the host
(`program`, once per host process): each module is compiled without its imports of this package's
own modules (`from .spawn import _child`), and the sandbox executes them in the order of `MODULES`
into one namespace, where every name those imports named is already defined. The host writes the
code objects, marshalled, into the sandbox's io directory (`ckpteval.sandbox.write_driver`) and a
`-c` bootstrap loads them: a sandbox's start compiles nothing and imports nothing more than the
one file did (importing the package with `-I -S` from a read-only bind instead would read and
unmarshal one `.pyc` per module, or compile them all where no `__pycache__` can be written).
On the host the package is an ordinary one (tests import its functions); its modules import only
the standard library and each other (tests/test_sandbox_driver_package.py).

Its modules, by concern: `privileges` (libc, capabilities, root, descriptors), `isolation` (a
command's mount and IPC namespaces), `seccomp` (the kernel state a sample may not hold),
`accounting` (CPU and memory: cgroups, process accounting), `channel` (the values and exceptions
that cross between a judged run's two processes; `arrays`: numpy's and pandas's, by value),
`judge` (the tests' side), `sample` (the sample's side), `spawn` (a command's process), `judged`
(a judged run), `zygote` (warm zygotes) and `loop` (the command loop, `main`).

For each command: fork; in the child, a new session, the command's stdin, its stdout and stderr
(memfds, `_Outputs`),
mount and IPC namespaces of its own (`_isolate`: a fresh tmpfs as /tmp, the batch's work
directory covered but for the command's own `cwd`, bounded SysV IPC), `no_new_privs` and a
seccomp filter refusing the kernel state that would outlive it (`_refuse_kernel_state`:
keyrings, user namespaces), its rlimits, no groups, the sandbox uid, exec. The driver waits (a pidfd) until the command's processes
together used up their CPU budget or the wall-clock backstop passed, kills the command's process
group on overrun, then kills every other process in the pid namespace (strays that left the
group). The command's files and IPC objects go with its namespaces: the next command starts from
the same state and the driver never walks what a sample built. Commands cannot signal, trace or
overwrite the driver: it runs as another uid, and the results file lives in a directory only root
can enter.

A command's `cpu_s` is the CPU time of every process it started (`_Usage`): with the batch's
cgroup (the spec's "cgroup", made by `ckpteval.cgroups`; the driver joins it first, so every
command is born in it), the kernel's count of every thread in it while the command ran, in ns,
less the driver's own; the memory limit is the cgroup's too, set for each command (`_Cgroup`).
Without one (`_Account`), BSD process accounting (per pid namespace) records each process that
exits, even those the kernel reaps by itself (SIGCHLD ignored) that no wait4 sees, in ticks; while
the command runs, its live processes' times come from /proc.

A command with `result_channel` gets a socket as its fd 3; the driver keeps the first message the
command's own first process sent there (`_ResultChannel`), whoever else holds the descriptor.

Rootless (`"rootless"` in the spec: ckpteval is not root, bubblewrap made a user namespace whose
one uid is this driver's) a command keeps that uid and gives up root instead (`_drop_root`); the
seccomp filter also protects the driver from its signals, the driver is not dumpable, and the
spec's and the command's "hide" paths are covered in the command's mount namespace. The driver
is the pid namespace's init (bwrap `--as-pid-1`; also a child subreaper, PR_SET_CHILD_SUBREAPER),
so orphans are re-parented to it and reaped by it once the cleanup has killed them, and no other
process of the sandbox (bubblewrap's init, with the commands' uid and dumpable) offers a command
its memory, its descriptors or its root, where the hidden paths are not covered.

A command with `python_file` runs that file in a fork of this interpreter instead of exec'ing a
new one (Python start-up costs more than most tests take); the fork drops privileges first, like
any command. The driver imports the spec's `preload` modules once, before any command, so that
each fork finds them imported: the standard library's (the Python checker), or an environment's
installed packages with its `site_dirs` on the path (the reward checker: sympy, math_verify, ...
cost 0.3-1 s each to import). Only trusted code runs before the fork; a fork's changes to a
preloaded module (its globals, patched functions) die with it.

Commands with `warm` (the reward checker's samples) are forked from a warm zygote instead: see
"Warm zygotes" in `zygote`.

A command with `python_file` *and* `python_tests` is judged: see `judged`. Its
result line adds "judge": what the test runner reported.

argv: spec.json. spec: {"uid", "results", "outputs", "site_dirs": [dir, ...], "preload":
[module, ...], "claims", "commands": [{"argv", "python_file", "python_tests", "warm", "warm_s",
"cwd", "env", "stdin", "isolation", "wall_s", "claim", "rlimits": {"RLIMIT_AS": n, ...}}]}.
One JSON result line per command, whose "output" says where in the "outputs" file its stdout and
its stderr are (`_Outputs`); with "claims" (a directory), each command is first claimed
there by its "claim" name, and the driver stops at the first another worker took
(`ckpteval.sandbox.Claims`). `--judge TESTS PROGRAM REPORT` runs one judged program
without the sandbox (`sandbox: none`: same protocol, no uid split, so no protection).
"""

import marshal
import re
from pathlib import Path

#: The driver's modules in the order the sandbox executes them: each after those it imports from.
MODULES = (
    "privileges",
    "isolation",
    "seccomp",
    "accounting",
    "arrays",
    "channel",
    "judge",
    "sample",
    "spawn",
    "judged",
    "zygote",
    "loop",
)


def program() -> bytes:
    """The driver as the sandbox runs it: the code object of each of `MODULES`, compiled without
    its imports of this package (in one namespace their names are already there), marshalled as
    one tuple. Tracebacks name each module's file and line: an import's lines become blank."""
    codes = []
    for name in MODULES:
        source = Path(__file__).with_name(f"{name}.py").read_text(encoding="utf-8")
        source = _OWN_IMPORT.sub(lambda found: "\n" * found[0].count("\n"), source)
        codes.append(compile(source, f"sandbox_driver/{name}.py", "exec", dont_inherit=True))
    return marshal.dumps(tuple(codes))


#: `from .module import names` (one line, or parenthesised over several) at a module's top level:
#: an import of this package, which the sandbox cannot do. Found in the text, not in a parsed tree:
#: `ast.parse` and compiling the tree cost twice compiling the text (~60 ms more per host
#: process); tests/test_sandbox_driver_package.py checks that both give the same program.
_OWN_IMPORT = re.compile(r"^from \.\w+ import (?:\([^)]*\)|[^\n(]*)$", re.MULTILINE)

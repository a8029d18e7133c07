"""The reward-function checker: a training run's own reward function scores its samples.

A task names it as verl names its custom reward function::

    checker: {reward_function: path/to/reward.py, name: compute_score, kwargs: {...},
              pass_threshold: 1.0, trusted: false, self_test: runs, reward_range: [0, 1]}

(every option but the file optional, its default the value shown but `reward_range`'s, which is
none), or as verl's config names it, pasted: `custom_reward_function: {path, name,
reward_kwargs}` (`from_verl`; ckpteval.config moves one pasted beside `problems:` into `checker:`),
and each sample is scored as verl scores it: `name(data_source=..., solution_str=completion,
ground_truth=..., extra_info=..., **kwargs)`, by keyword. The function returns a number or a
bool (taken as a float), or a dict with a `score` key; the dict's other keys are kept on the
sample's score line (`reward_info`), and a numeric or boolean `acc` among them is also a metric
of the cell. A sample passes when its score is at least `pass_threshold`.

The function is untrusted code. Each sample runs in a process of its own, in one sandbox per
batch (`ckpteval.sandbox`: no network, rlimits, its own uid), under the per-sample timeout
(`evaluate.timeout`). Its prints go to the evaluate job's log, never into the result channel:
the runner moves the process's stdout onto stderr before it loads the file, and the result goes
back on a channel of its own. In the bwrap sandbox that channel accepts only the runner's own
process (`Command.result_channel`), the job comes on stdin from a file no sample can open (read
before the function runs), and the sandbox shows copies of the function's own modules, not the
directory beside it: a completion the function runs in another process can neither forge the
result nor read the answers. A function that raises, returns something that is not a score,
or exits fails that sample only, as `reward_error` with one line saying why; one that hangs is a
`timeout`. `trusted: true` runs it without the sandbox (it can reach the network: a
SandboxFusion URL, a reward-model server), each sample still in its own process under the
timeout.

What runs where, and what it costs. A reward function's imports (sympy, math_verify, ...) take
0.3-1 s each and its first call may cost more than scoring (math_verify builds its parser:
~140 ms). So in the bwrap sandbox both are paid once per batch: the sandbox's driver
(ckpteval.sandbox_driver), as the sandbox's root before any sample, adds this environment's
site-packages to its path and imports the installed packages the file imports
(`preload_modules`: found by reading the file, never by running it; the standard library's and
the modules beside the file are left out, and one that fails to import is skipped). It then forks
the batch's warm zygote (`Command.warm`, "Warm zygotes" in the driver), which takes the batch's
namespaces, /tmp, seccomp filter, limits and the sandbox uid, and only then runs the reward file
and calls the function on a few fixed inputs (`WARM_CALLS`, the batch's first data source,
`kwargs`): no sample's text. Those calls are made on an import of the file of their own; the
zygote then imports the file and its own modules again, uncalled (the runner's `warm`). Each
sample is a fork of it that reads its own job from its stdin and calls the function: its call
is the first of that module, as in a fresh process (generators the import seeded from the OS
reseeded, those it seeded alike set as a fresh process has them). A fork's changes (module
globals, a patched sympy, a crash, a kill of its group) die with it; what it leaves in /tmp is
emptied and its processes killed before the next; so every sample starts from the same warm
state. A zygote that cannot warm up (within `IMPORT_ALLOWANCE_S` an import, charged to no
sample), whose import leaves threads or descriptors (which no fork has) or anything else one
sample could reach the next through (a shared mapping, SysV objects, a signal handler: the
driver's `_ZygoteState`), or that dies falls back to forking each sample from the driver, which
then runs the file itself; at-fork hooks the import registers run in no fork of it.
`trusted: true` and `sandbox: none` exec a fresh interpreter per sample, imports included.
docs/evaluate.md has the figures (bench/reward.py).

The file's content and `name` are part of the cell's scoring identity: editing the function
rescores, moving the file reruns nothing (ckpteval.contract). So are the modules it imports from
its own directory (`local_modules`: found in its `import` statements, then in theirs, packages
and relative imports within them too), by their path within that directory and their content:
editing a helper module rescores, moving the whole directory reruns nothing. Modules found
elsewhere (this Python's packages) are not hashed; a new version of one is a new environment.

The self-test calls the function on the ground truths of the first problems (up to
`SELF_TEST_PROBLEMS`) as completions: `self_test: runs` (the default) asks only that it returns a
score (verl's gsm8k scores a bare `72` 0: fine), `ground_truth` that the score reaches
`pass_threshold` and that an empty completion does not; `off` (YAML's boolean false too) or
`"off: <why>"` skips it, and the cell records why. A failure is one line naming the function,
its file, the setting and the rows (`self_test_words`).
"""

from __future__ import annotations

import ast
import json
import logging
import math
import os
import shutil
import signal
import site
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ckpteval.checkers import Checker, Job, Prompting, Verdict, register, timeout_line
from ckpteval.checkers.extract import absolute_imports
from ckpteval.errors import UserError
from ckpteval.io import sha256_file, sha256_json
from ckpteval.sandbox import Command, Limits, RunResult, Sandbox
from ckpteval.scratch import scratch_dir

log = logging.getLogger(__name__)

#: Samples per sandbox, at most (`batch_size_for`: one batch per worker in a window): a batch
#: pays bubblewrap's start, the packages' import and the zygote's warm-up once (0.5-1.3 s with
#: sympy or math_verify, bench/reward.py: as much as 30-60 samples), and each of its samples is
#: a fork of the warm zygote, so a longer batch spreads that cost thinner at no cost to
#: isolation. A cell's last samples are shared among the workers in smaller batches (the
#: evaluate window reads two batches per worker ahead, `window_per_worker`, so that it sees the
#: cell end in time; `Checker._stream` sizes each batch when it starts).
BATCH_SIZE = 1024
#: How many problems' ground truths the self-test scores.
SELF_TEST_PROBLEMS = 3
#: The longest error line a score line keeps.
ERROR_LINE_CHARS = 300
#: What a sample's stderr (the function's prints) may add to the log.
LOG_CHARS = 2000

#: Run first in each sample's process (a fork of the sandbox's driver, which preloaded the
#: function's packages, or of the warm zygote): a package's global generator seeded or drawn from
#: before the fork (numpy's, torch's) would give every sample of the batch the same "random"
#: numbers, as no two fresh processes get. Python's `random` is reseeded by CPython itself at a
#: fork. In a fork of the warm zygote, `WARM` (set by its `warm`) says more: the generators the
#: file made at import from the OS's entropy, reseeded; and the global ones its import seeded with
#: a fixed seed, set back to the state that import left (what a fresh process would draw from).
RESEED_SOURCE = r"""
def reseed(warm=None):
    for name, call in (("numpy", lambda m: m.random.seed()), ("torch", lambda m: m.seed())):
        module = sys.modules.get(name)
        if module is not None:
            try:
                call(module)
            except Exception:
                pass
    warm = warm or {}
    for generator in warm.get("reseed", ()):
        fresh_seed(generator)
    if "random" in warm:
        sys.modules["random"].setstate(warm["random"])
    if "numpy" in warm:
        sys.modules["numpy"].random.set_state(warm["numpy"])


def fresh_seed(generator):
    # Reseeded from the OS's entropy, as made without a seed in a fresh process.
    try:
        if type(generator).__name__ == "Generator":
            generator.bit_generator.state = type(generator.bit_generator)().state
        else:
            generator.seed()
    except Exception:
        pass
"""

#: Seconds the warm zygote may take for each of its two imports of the file (`RUNNER_SOURCE`'s
#: `warm`), besides a sample's timeout for its warm-up calls: paid once per batch, charged to no
#: sample (`Command.warm_s`). A file that takes longer gets no zygote: each sample imports it.
IMPORT_ALLOWANCE_S = 60.0
#: (completion, ground truth) of the warm zygote's calls (`Command.warm`): fixed, no sample's.
#: More than one because what a call warms depends on its input: math_verify compares "0" with
#: "0" without sympy, and builds a sum's or a LaTeX answer's machinery on the first it meets
#: (40-90 ms each, measured), which every fork would pay again; its LaTeX lexer (ANTLR) learns
#: each character on first sight, so every digit, a decimal point and a minus sign come too,
#: and the usual answer shapes: a boxed fraction, gsm8k's `#### 72`.
_WARM_SHAPES = (
    ("0", "0"),
    ("1", "0"),
    ("1 + 1", "2"),
    ("$1 + 1$", "2"),
    ("-23.45 + 67 * 89", "0"),
    ("$-23.45 + 67 \\cdot 89$", "0"),
    ("$\\boxed{\\frac{3}{4}}$", "\\frac{3}{4}"),
    ("#### 72", "72"),
)


def _digits_plus(text: str, k: int) -> str:
    return "".join(str((int(c) + k) % 10) if c.isdigit() else c for c in text)


#: Each shape also with every digit shifted by 1-4 (`\\frac{4}{5}`, `#### 83`, ...): a call on
#: other numbers is what a sample makes, and what it finds already built (math_verify's parser
#: states, sympy's caches, the interpreter's specialised bytecode) it no longer builds in its
#: fork: a math_verify call in a fork 7.1 -> 6.7 ms, a sympy one 3.1 -> 2.5 ms, for 15-40 ms of
#: warm-up once per batch (measured on the bench's answers).
WARM_CALLS = _WARM_SHAPES + tuple(
    (_digits_plus(completion, k), _digits_plus(truth, k))
    for k in range(1, 5)
    for completion, truth in _WARM_SHAPES
)

#: verl's config block of a custom reward function, which a task's `checker:` may be as pasted.
VERL_BLOCK = "custom_reward_function"
#: verl's keys in it -> ours.
VERL_KEYS = {"path": "reward_function", "name": "name", "reward_kwargs": "kwargs"}


def from_verl(key: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """A `checker:` mapping in ckpteval's spelling: verl's `custom_reward_function: {path,
    name, reward_kwargs}` block (and a `reward_kwargs` beside it) as `reward_function`, `name`
    and `kwargs`, and `self_test: false` (what YAML makes of `off`) as "off". The same setting
    given both ways, differently, is one line naming both."""
    out = dict(options)
    block = out.pop(VERL_BLOCK, None)
    given = [(f"{VERL_BLOCK}.{theirs}", ours, value) for theirs, ours, value in _verl(key, block)]
    if "reward_kwargs" in out:
        given.append(("reward_kwargs", "kwargs", out.pop("reward_kwargs")))
    for theirs, ours, value in given:
        if ours in out and out[ours] != value:
            raise UserError(f"{key}: {theirs} and {ours} say different things; give one")
        out[ours] = value
    if out.get("self_test") is False:
        out["self_test"] = "off"
    elif out.get("self_test") is True:
        raise UserError(f"{key}.self_test: runs (the default), ground_truth, off or off: <why>")
    return out


def _verl(key: str, block: Any) -> list[tuple[str, str, Any]]:
    """(verl's key, ours, value) of a `custom_reward_function` block; [] when there is none."""
    if block is None:
        return []
    where = f"{key}.{VERL_BLOCK}"
    if not isinstance(block, Mapping):
        raise UserError(f"{where}: a mapping {{path, name, reward_kwargs}}, as in verl's config")
    unknown = sorted(set(block) - set(VERL_KEYS))
    if unknown:
        raise UserError(
            f"{where}: unknown key(s) {', '.join(unknown)}; verl's are path, name, reward_kwargs"
        )
    if not block.get("path"):
        raise UserError(f"{where}.path: the reward function's file (verl's path is empty)")
    return [
        (theirs, VERL_KEYS[theirs], block[theirs])
        for theirs in VERL_KEYS
        if block.get(theirs) is not None
    ]


RUNNER_SOURCE = (
    r"""
import builtins, ctypes, gc, importlib.util, itertools, json, math, os, pickle, random, site
import socket, stat, sys, threading, time, traceback
"""
    + RESEED_SOURCE
    + r"""

# What a result may hold (`plain`): deeper containers, longer strings, more items and ints
# beyond 64 bits are cut, each with a note in its place; a result whose JSON is still longer
# than MESSAGE_BYTES keeps its `score` and drops the rest, saying so.
DEPTH, STR_CHARS, ITEMS, MESSAGE_BYTES = 4, 2000, 100, 64 << 10


def digits(value):
    return int(abs(value).bit_length() * math.log10(2)) + 1


def cut(text):
    if len(text) <= STR_CHARS:
        return str(text)
    return f"{text[:STR_CHARS]}... (cut: {len(text)} characters)"


def plain(value, depth=0):
    if value is None or isinstance(value, (bool, float)):
        return value
    if isinstance(value, int):
        if -(1 << 63) <= value < 1 << 63:
            return int(value)
        return {"__unplain__": "int", "digits": digits(value)}
    if isinstance(value, str):
        return cut(value)
    if depth < DEPTH and isinstance(value, dict):
        keys = list(itertools.islice(value, ITEMS))
        if depth == 0 and "score" in value and "score" not in keys:
            keys.append("score")
        out = {cut(str(k)): plain(value[k], depth + 1) for k in keys}
        if len(value) > len(keys):
            out["__cut__"] = f"{len(value) - len(keys)} more keys"
        return out
    if depth < DEPTH and isinstance(value, (list, tuple)):
        out = [plain(v, depth + 1) for v in value[:ITEMS]]
        if len(value) > ITEMS:
            out.append(f"__cut__: {len(value) - ITEMS} more items")
        return out
    if depth < DEPTH and hasattr(value, "item") and callable(value.item):  # numpy / torch scalars
        try:
            return plain(value.item(), depth + 1)
        except Exception:
            pass
    return {"__unplain__": type(value).__name__}


def message(value):
    # The result as the channel's one message, at most MESSAGE_BYTES.
    data = json.dumps({"value": plain(value)}, allow_nan=True).encode()
    if len(data) <= MESSAGE_BYTES:
        return data
    if isinstance(value, dict) and "score" in value:
        note = f"the other keys were dropped: {len(data)} bytes as JSON, over {MESSAGE_BYTES}"
        kept = {"score": plain(value["score"], DEPTH), "reward_info_cut": note}
        return json.dumps({"value": kept}, allow_nan=True).encode()
    why = f"returned {len(data)} bytes as JSON, over {MESSAGE_BYTES}"
    return json.dumps({"error": why}).encode()


def describe(exc):
    # An exception's first line, at most STR_CHARS (its text may be anything: even its str()
    # may fail).
    try:
        text = str(exc)
    except BaseException:
        text = ""
    line = text.strip().splitlines()[0] if text.strip() else ""
    return cut(f"{type(exc).__name__}: {line}" if line else type(exc).__name__)


def result_channel():
    # bwrap: the sandbox's result channel, fd 3, on which only this process's messages count.
    # Otherwise (`sandbox: none`, `trusted: true`) a copy of stdout.
    try:
        is_socket = stat.S_ISSOCK(os.fstat(3).st_mode)
    except OSError:
        is_socket = False
    if is_socket:
        os.set_inheritable(3, False)
        channel = socket.socket(fileno=3)
        return channel.send
    out = os.fdopen(os.dup(1), "w")
    return lambda data: (out.write(data.decode()), out.flush())


WARM = {}
# Loaded here, not in main(): forked from the warm zygote, a sample finds it loaded.
LIBC = ctypes.CDLL(None)


def import_file(reward_file, paths):
    for path in reversed(paths):
        if path not in sys.path:
            sys.path.insert(0, path)
    spec = importlib.util.spec_from_file_location("ckpteval_reward", reward_file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load(reward_file, name, paths):
    key = (reward_file, name, tuple(paths))
    if WARM.get("key") == key:  # forked from the warm zygote: the file ran there
        return WARM["function"]
    return getattr(import_file(reward_file, paths), name)


def own_modules(module, paths):
    # The file's module and its own modules (those under `paths`) that are imported.
    roots = tuple(os.path.join(path, "") for path in paths)
    found = [module]
    for other in list(sys.modules.values()):
        where = getattr(other, "__file__", None)
        if isinstance(where, str) and where.startswith(roots):
            found.append(other)
    return found


def generators(modules):
    # (where, generator) of each random generator a module global, or an attribute of one, holds:
    # random.Random (not SystemRandom), numpy's Generator and RandomState.
    found = []
    for module in modules:
        for name, value in list(vars(module).items()):
            where = (module.__name__, name)
            if is_generator(value):
                found.append((where, value))
            elif not isinstance(value, (type, type(sys))):
                try:
                    attrs = list(vars(value).items())
                except Exception:  # no __dict__ (or one that refuses)
                    attrs = []
                found += [((*where, a), inner) for a, inner in attrs if is_generator(inner)]
    return found


def is_generator(value):
    if isinstance(value, random.Random):
        return not isinstance(value, random.SystemRandom)
    kind = type(value)
    numpy = str(getattr(kind, "__module__", "")).startswith("numpy.random")
    return numpy and kind.__name__ in ("Generator", "RandomState")


def state_of(generator):
    try:
        return pickle.dumps(generator)
    except Exception:
        return None


def global_states():
    # The state of `random`'s and numpy's global generators (numpy's if it is imported).
    states = {"random": random.getstate()}
    numpy = sys.modules.get("numpy")
    legacy = getattr(getattr(getattr(numpy, "random", None), "mtrand", None), "_rand", None)
    if legacy is not None:
        states["numpy"] = state_of(legacy)
    return states


def reseed_globals():
    random.seed()
    try:
        sys.modules["numpy"].random.seed()
    except Exception:  # not imported, or not numpy as known
        pass


def open_fds():
    fds = set()
    for name in os.listdir("/proc/self/fd"):
        try:
            os.fstat(int(name))
            fds.add(int(name))
        except OSError:
            pass
    return fds


def warm(spec):
    # The zygote's warm-up. The file is imported twice, both times after the global generators
    # were seeded afresh. The first import (`first`) is called on fixed inputs that are no
    # sample's (results and errors ignored), so that the packages' first-call costs are paid;
    # no call starts after `budget_s`. Then the file and its own modules are imported again,
    # never called: that is the module each sample calls, holding what its import made and
    # nothing the warm-up's calls left (memos, counters, a generator's draws). What the two
    # imports made differently came from the OS's entropy: such generators are reseeded in each
    # fork; a global generator both left alike (a fixed seed) is set back to that state in each
    # fork. An import that leaves threads running or descriptors open gets no zygote (a fork
    # has neither): each sample then imports the file itself. A file that fails here is run
    # again by each sample, which then fails alone.
    paths = spec["paths"]
    running = set(threading.enumerate())
    try:
        reseed_globals()
        first = import_file(spec["reward_file"], paths)
        function = getattr(first, spec["name"])
    except BaseException:
        return
    # Threads the first import started: the second may start none (a file that starts its
    # thread once per process), yet they run in the zygote. Not those the warm-up's calls start
    # (a pool's workers), which end with the first module.
    imported = set(threading.enumerate()) - running
    first_generators = {where: state_of(g) for where, g in generators(own_modules(first, paths))}
    first_globals = global_states()
    stop = time.monotonic() + spec["budget_s"]
    for call in spec["calls"]:
        if time.monotonic() > stop:
            break
        try:
            function(**call)
        except BaseException:
            pass
    called = set(threading.enumerate()) - running - imported
    roots = tuple(os.path.join(path, "") for path in paths)
    for name, other in list(sys.modules.items()):
        where = getattr(other, "__file__", None)
        if isinstance(where, str) and where.startswith(roots):
            del sys.modules[name]
    # Threads the warm-up's calls started end with the first module: a pool made at import
    # (ThreadPoolExecutor) ends its workers when it is collected, and a module is a cycle
    # (its functions' globals), collected only by a full pass, which came, or not, at whatever
    # allocation it came: the zygote was refused for "1 Python thread(s) running". Collected
    # here (40-60 ms with sympy and math_verify loaded: only when a call started a thread),
    # then given up to a second in all to end, so the verdict on the zygote does not depend on
    # timing; a thread still running after it refuses the zygote as before.
    del first, function
    if called:
        gc.collect()
        until = time.monotonic() + 1.0
        for thread in called:
            thread.join(max(0.0, until - time.monotonic()))
    threads, fds = set(threading.enumerate()), open_fds()
    try:
        reseed_globals()
        module = import_file(spec["reward_file"], paths)
        function = getattr(module, spec["name"])
    except BaseException:
        return
    started = [
        t.name
        for t in threading.enumerate()
        if (t not in threads or t in imported) and t.is_alive()
    ]
    opened = sorted(open_fds() - fds)
    if started or opened:
        what = f"threads {', '.join(started)}" if started else f"{len(opened)} descriptor(s)"
        raise SystemExit(f"the file's import leaves {what} open, which no fork has")
    WARM.update(key=(spec["reward_file"], spec["name"], tuple(paths)), function=function)
    WARM["reseed"] = [
        g
        for where, g in generators(own_modules(module, paths))
        if first_generators.get(where) != state_of(g)
    ]
    for name, state in global_states().items():
        if state is not None and state == first_globals.get(name):
            WARM[name] = random.getstate() if name == "random" else (
                sys.modules["numpy"].random.get_state()
            )


def main():
    reseed(WARM)
    if not hasattr(builtins, "exit"):  # a fork of the sandbox's driver (-S): as under `python`
        site.setquit()
    # Not dumpable: a process the function starts (same uid) can neither trace this one nor
    # open its descriptors through /proc.
    LIBC.prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE
    send = result_channel()
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    # The job (the completion, the ground truth) comes on stdin, from a file only root can
    # reach; once read, nothing the function runs can read it again.
    chunks = []
    while chunk := os.read(0, 1 << 20):
        chunks.append(chunk)
    job = json.loads(b"".join(chunks))
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    try:
        value = load(job["reward_file"], job["name"], job["paths"])(**job["call"])
        data = message(value)
    except BaseException as exc:
        traceback.print_exc()
        data = json.dumps({"error": describe(exc)}).encode()
    try:
        send(data)
    except OSError as exc:
        send(json.dumps({"error": f"the result could not be sent: {exc}"}).encode())
    os._exit(0)


if __name__ == "__main__":
    main()
elif __name__ == "__ckpteval_zygote__":
    warm(__ckpteval_warm__)  # noqa: F821 - given by the sandbox's driver
"""
)


class RewardFunctionChecker(Checker):
    """Scores samples with a user's verl-style reward function (see the module's docstring)."""

    name = "reward_function"
    #: 2: errored samples count (reward_error_rate, reward_range), reward_mean the headline,
    #: reward_extra/<key>, per data source; no accuracy. Part of a cell's scoring identity:
    #: reward cells of version 1 are rescored once (CPU only), other checkers' cells are not.
    #: 3: a mean that counts errored samples at the bottom of the range says how many
    #: (`includes_errors`), so that every errored number is worded with its own counts.
    version = "3"
    #: Each sample a fresh `python -I -B runner.py` exec'd in the sandbox, re-importing what the
    #: function imports (the path before preloading): for bench/reward.py's comparison only.
    exec_samples = False
    default_timeout = 10.0
    reads = ("evaluate.timeout", "evaluate.sandbox")
    #: Keys that name this checker in a task's `checker:` mapping besides its name: verl's
    #: block, pasted as it is (`canonical_options` translates it).
    mapping_keys = (VERL_BLOCK,)
    #: Its cells report `reward_mean` and `reward_error_rate` (ckpteval.evaluate.RewardTotals).
    scores_rewards = True
    task_options = {
        "properties": {
            "reward_function": {
                "type": "string",
                "minLength": 1,
                "x-content": True,
                "description": "the reward function's file (by content: moving it reruns nothing)",
            },
            "name": {
                "type": "string",
                "minLength": 1,
                "default": "compute_score",
                "description": "the function scored with (verl's custom_reward_function.name)",
            },
            "kwargs": {
                "type": "object",
                "default": {},
                "description": "arguments merged into every call (verl's reward_kwargs)",
            },
            "pass_threshold": {
                "type": "number",
                "default": 1.0,
                "description": "the score a pass needs",
            },
            "trusted": {
                "type": "boolean",
                "default": False,
                "description": "whether the function runs outside the sandbox",
            },
            "reward_range": {
                "type": ["array", "null"],
                "items": {"type": "number"},
                "minItems": 2,
                "maxItems": 2,
                "default": None,
                "description": "[lo, hi] of the scores: an errored sample counts at lo, and the "
                "interval reaches its mean at hi (else the mean excludes errored samples)",
            },
            "self_test": {
                "type": "string",
                "pattern": "^(runs|ground_truth|off|off: *\\S.*)$",
                "default": "runs",
                "description": "what is checked before scoring: runs (the function returns a "
                "score on the first rows), ground_truth (ground truths pass, an empty completion "
                "fails), off or off: why",
            },
        },
        "required": ["reward_function"],
    }

    @classmethod
    def canonical_options(cls, key: str, options: Mapping[str, Any]) -> dict[str, Any]:
        """verl's spelling (`custom_reward_function: {path, name, reward_kwargs}`, a
        `reward_kwargs` beside it) as ours, `self_test: false` (YAML's `off`) as "off"; then
        checked, and the defaults written out dropped (`Checker.canonical_options`)."""
        return super().canonical_options(key, from_verl(key, options))

    @classmethod
    def check_task_options(cls, key: str, options: Mapping[str, Any]) -> None:
        """Also: the file defines the function `name` (read, not run: a parse runs nothing)."""
        options = from_verl(key, options)
        super().check_task_options(key, options)
        bounds = options.get("reward_range")
        if bounds is not None and not bounds[0] < bounds[1]:
            raise UserError(f"{key}.reward_range: {bounds} is not [lo, hi] with lo < hi")
        name = options.get("name", "compute_score")
        path = Path(os.path.expanduser(os.path.expandvars(str(options["reward_function"]))))
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        except (OSError, UnicodeDecodeError, SyntaxError, ValueError) as exc:
            raise UserError(
                f"{key}.reward_function: cannot read {path} as Python ({exc})"
            ) from None
        if name not in _top_level_names(tree):
            raise UserError(f"{key}.name: {path} defines no {name!r} at its top level")

    def __init__(
        self,
        *,
        reward_function: str,
        name: str = "compute_score",
        kwargs: Mapping[str, Any] | None = None,
        pass_threshold: float = 1.0,
        trusted: bool = False,
        self_test: str | bool = "runs",
        reward_range: Sequence[float] | None = None,
        sandbox: str = "bwrap",
        batch_size: int = BATCH_SIZE,
        memory_bytes: int = 2 << 30,
    ) -> None:
        source = Path(reward_function)
        if not source.is_file():
            raise UserError(f"checker reward_function: no file {source}")
        self.function, self.kwargs = name, dict(kwargs or {})
        self.pass_threshold, self.trusted = float(pass_threshold), trusted
        self.self_test = "off" if self_test is False else str(self_test)
        if reward_range is not None and not float(reward_range[0]) < float(reward_range[1]):
            raise UserError(f"checker reward_range: {list(reward_range)} is not [lo, hi], lo < hi")
        self.reward_range = None if reward_range is None else [float(v) for v in reward_range]
        self.sandbox = Sandbox("none" if trusted else sandbox)
        self.batch_size, self.memory_bytes = batch_size, memory_bytes * (4 if trusted else 1)
        self._code = Path(tempfile.mkdtemp(prefix="ckpteval-reward-code-"))
        os.chmod(self._code, 0o755)
        shutil.copyfile(source, self._code / "reward.py")
        (self._code / "runner.py").write_text(RUNNER_SOURCE, encoding="utf-8")
        self._beside = source.resolve().parent
        self._source_name = source.name
        #: The function's own modules (`local_modules`), copied: the sandbox shows these, not the
        #: directory they came from (which may hold the problems and their answers).
        self._modules = self._code / "modules"
        self._modules.mkdir(mode=0o755)
        for rel, module in local_modules(source).items():
            (self._modules / rel).parent.mkdir(mode=0o755, parents=True, exist_ok=True)
            shutil.copyfile(module, self._modules / rel)
        #: What the sandbox's driver imports once per batch (see the module's docstring).
        self.preload = preload_modules(source.read_text(encoding="utf-8"), self._beside)
        #: Where it finds them: this environment's installed packages (trusted code).
        self.site_dirs = [Path(p) for p in site.getsitepackages() if os.path.isdir(p)]

    @classmethod
    def content_id(cls, option: str, path: os.PathLike[str] | str) -> str:
        """The function file's content, with its own modules' (`local_modules`) when it has
        any: a file that imports none keeps the id of its bytes alone."""
        modules = local_modules(Path(path))
        if not modules:
            return sha256_file(path)
        return sha256_json(
            {
                "file": sha256_file(path),
                "modules": {rel: sha256_file(module) for rel, module in modules.items()},
            }
        )

    @classmethod
    def normalise_problem(cls, row: Mapping[str, Any]) -> dict[str, Any]:
        """A native line may give its ground truth as `answer`."""
        out = dict(row)
        if "ground_truth" not in out and "answer" in out:
            out["ground_truth"] = out["answer"]
        return out

    @classmethod
    def check_problem(cls, task_id: str, problem: Mapping[str, Any]) -> None:
        if problem.get("ground_truth") is None:
            raise UserError(
                f"problem {task_id}: a reward function needs a ground truth (verl's "
                "reward_model.ground_truth, or `answer`)"
            )
        if not isinstance(problem.get("question"), str):
            raise UserError(f"problem {task_id}: no prompt (verl's `prompt`, or `question`)")

    @classmethod
    def default_prompt(
        cls, problems: Sequence[Mapping[str, Any]], language: str | None, task: str
    ) -> Prompting:
        """The row's prompt as the trainer sent it: the user's message (the system message and
        the chat template are the task's, ckpteval.tasks), or the prompt text."""
        return Prompting(lambda problem: problem["question"])

    @property
    def window_per_worker(self) -> int:  # type: ignore[override]
        """Two full batches per worker in the evaluate job's window: one running and one read
        ahead, so that 8 workers get batches of 1,024 (not 1,024 / 8 = 128), and the input's end
        is read while a batch's worth is left for each worker to share."""
        return 2 * self.batch_size

    def batch_size_for(self, n_jobs: int, workers: int) -> int:
        """One batch per worker in a window, up to `batch_size`: a batch's start costs as much
        as tens of samples, and the evaluate job's stream gives a worker its next batch as soon
        as its last one ends and shares a cell's last samples among the workers, so smaller
        batches would balance nothing (the evaluate job's window holds `window_per_worker`
        samples per worker at least)."""
        return max(1, min(self.batch_size, -(-n_jobs // max(1, workers))))

    def check_batch(self, jobs: Sequence[Job], timeout: float) -> list[Verdict]:
        """One sandbox for the batch, each sample a process of its own under its timeout."""
        with (
            scratch_dir("reward") as tmp,
            scratch_dir("reward-jobs") as jobs_dir,
        ):
            workdir = Path(tmp)
            os.chmod(workdir, 0o755)
            os.chmod(jobs_dir, 0o700)  # the jobs: readable by the sandbox's root only
            (workdir / "s").mkdir(mode=0o755)  # every sample's cwd (empty, read-only)
            warm = None if self.exec_samples else self._warm(jobs, timeout)
            commands = [
                self._command(workdir, Path(jobs_dir), i, job, timeout, warm)
                for i, job in enumerate(jobs)
            ]
            results = self.sandbox.run_many(
                commands,
                workdir=workdir,
                readable=self._readable(),
                preload=() if self.exec_samples else self.preload,
                site_dirs=self.site_dirs,
            )
        return [
            self._verdict(job, result, self._timeout_line(timeout, command.limits))
            for job, result, command in zip(jobs, results, commands)
        ]

    def _timeout_line(self, timeout: float, limits: Limits) -> str:
        return timeout_line(timeout, limits.wall_s, self.sandbox.wall_clock(limits))

    def _warm(self, jobs: Sequence[Job], timeout: float) -> dict[str, Any]:
        """What the batch's warm zygote runs (`Command.warm`): the file, and calls on fixed
        inputs (`WARM_CALLS`) that are no sample's completion and no problem's answer (with the
        batch's first data source, so that a function dispatching on it warms the right
        branch); none starts after half the shortest wall limit a sample of the batch gets (a
        job's own timeout, else `timeout`, as `_command` sets it). The zygote must be ready
        within that wall clock and `IMPORT_ALLOWANCE_S` for each of its two imports of the file
        (`Command.warm_s`), or the batch goes without it."""
        source = jobs[0].problem.get("data_source", "") if jobs else ""
        calls = [self._call(source, completion, truth, {}) for completion, truth in WARM_CALLS]
        wall_s = min((job.timeout or timeout for job in jobs), default=timeout)
        return {**self._function_spec(), "calls": calls, "budget_s": wall_s / 2}

    def _function_spec(self) -> dict[str, Any]:
        """Where the runner finds the function: the copied file, its name, its modules' dir."""
        return {
            "reward_file": str(self._code / "reward.py"),
            "name": self.function,
            "paths": [str(self._modules)],
        }

    def _call(
        self, data_source: Any, completion: str, ground_truth: Any, extra_info: Any
    ) -> dict[str, Any]:
        """The function's keyword arguments, as verl passes them, plus the task's `kwargs`."""
        return {
            "data_source": data_source,
            "solution_str": completion,
            "ground_truth": ground_truth,
            "extra_info": extra_info,
            **self.kwargs,
        }

    def _command(
        self,
        workdir: Path,
        jobs_dir: Path,
        index: int,
        job: Job,
        timeout: float,
        warm: Mapping[str, Any] | None = None,
    ) -> Command:
        """A sample's command. Its job (the completion, the ground truth) is its stdin, a file in
        `jobs_dir` that no sample can open; the runner reads it before the function runs, and
        answers on the sandbox's result channel. `warm`: fork it from the batch's warm zygote."""
        sample_dir = workdir / "s"
        call = self._call(
            job.problem.get("data_source", ""),
            job.completion,
            job.problem.get("ground_truth"),
            job.problem.get("extra_info") or {},
        )
        spec = {**self._function_spec(), "call": call}
        job_file = jobs_dir / f"{index}.json"
        job_file.write_text(json.dumps(spec, default=str), encoding="utf-8")
        runner = self._code / "runner.py"
        limits = Limits(wall_s=job.timeout or timeout, memory_bytes=self.memory_bytes)
        # The zygote's two imports, and its calls (none starts after `budget_s`, half a wall).
        warm_s = 2 * IMPORT_ALLOWANCE_S + 2 * warm["budget_s"] if warm else 0.0
        env = dict(os.environ) if self.trusted else None  # a service's URL or key, say
        return Command(
            [sys.executable, "-I", "-B", str(runner)],  # `sandbox: none`, `trusted: true`
            limits,
            cwd=sample_dir,
            env=env,
            python_file=None if self.exec_samples else runner,  # bwrap: a fork of the driver
            stdin=job_file,
            result_channel=True,
            warm=warm,
            warm_s=warm_s,
        )

    def _readable(self) -> list[Path]:
        """What the sandbox binds read-only: this Python (its environment's packages, which a
        reward function may import), the runner, the function and copies of its own modules
        (not the directory it came from)."""
        return [Path(sys.prefix).resolve(), Path(sys.base_prefix).resolve(), self._code]

    def _verdict(self, job: Job, result: RunResult, timed_out: str) -> Verdict:
        """A run's outcome as a verdict: the score, or the one line saying why there is none
        (`timed_out`: the line of a run stopped at its limits, `timeout_line`)."""
        duration = result.duration_s
        printed = result.stderr.decode("utf-8", "replace")
        if printed.strip():
            log.info("reward function output for %s:\n%s", job.task_id, printed[-LOG_CHARS:])
        if result.timed_out or result.signal == signal.SIGXCPU:
            why = f"the function {timed_out}"
            return Verdict(False, "timeout", duration_s=duration, stderr_tail=why)
        # bwrap: only what the runner's own process sent on its channel; `none`: its stdout.
        sent = result.channel if self.sandbox.mode == "bwrap" else result.stdout
        if result.forged_results:
            log.warning(
                "reward sample %s: %d result(s) sent by a process the function started were "
                "refused",
                job.task_id,
                result.forged_results,
            )
        try:
            out = json.loads((sent or b"").decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            out = None
        returned = isinstance(out, dict) and "value" in out  # a limit hit after it counts not
        if result.memory_limit and not returned:
            why = "the function was killed at its memory limit"
            return Verdict(False, "memory_limit", duration_s=duration, stderr_tail=why)
        if result.output_limit and not returned:
            cap = Limits().file_bytes >> 20  # what a file of the sample's may hold
            return _failed(f"the function printed {cap} MiB, its limit", duration)
        if not isinstance(out, dict) or ("value" not in out and "error" not in out):
            why = _last_line(printed) or f"exited ({result.exit_code}) without a result"
            return _failed(why, duration)
        if "error" in out:
            return _failed(str(out["error"]), duration)
        return self._scored(out["value"], duration)

    def _scored(self, value: Any, duration: float) -> Verdict:
        score, info = as_score(value)
        if isinstance(score, str):
            return _failed(score, duration)
        passed = score >= self.pass_threshold
        extras = {"reward": score, "reward_info": info}
        if isinstance(value.get("score") if isinstance(value, dict) else value, bool):
            extras["reward_type"] = "bool"  # its range is known: [0, 1]
        return Verdict(
            passed,
            None if passed else "wrong_answer",
            duration_s=duration,
            score=score,
            extras=extras,
        )

    def reference_jobs(self, problems: Mapping[str, Mapping[str, Any]]) -> list[Job]:
        """The first problems' ground truths as completions (`self_test: runs` or
        `ground_truth`)."""
        if self.self_test not in ("runs", "ground_truth"):
            return []
        usable = [
            (tid, p)
            for tid, p in problems.items()
            if isinstance(p.get("ground_truth"), (str, int, float))
        ]
        return [Job(tid, p, str(p["ground_truth"])) for tid, p in usable[:SELF_TEST_PROBLEMS]]

    def known_wrong_jobs(self, problems: Mapping[str, Mapping[str, Any]]) -> list[Job]:
        """An empty completion, which must fail (`self_test: ground_truth` only: a format or
        length reward may well pass it)."""
        if self.self_test != "ground_truth":
            return []
        task_id, problem = next(iter(problems.items()))
        return [Job(task_id, problem, "")]

    def self_test_accepts(self, verdict: Verdict) -> bool:
        """`runs`: the function returned a score (any: verl's gsm8k scores a bare ground truth
        0); `ground_truth`: the score reached `pass_threshold`."""
        if self.self_test == "runs":
            return verdict.error_type not in ("reward_error", "timeout", "memory_limit")
        return verdict.passed

    def self_test_words(self) -> tuple[str, str, str]:
        what = (
            f"reward function {self.function} of {self._source_name} (self_test: {self.self_test})"
        )
        if self.self_test == "runs":
            return (
                what,
                "calls on the ground truths",
                "fix the function, or set the task's checker.self_test: off",
            )
        return (
            what,
            f"ground truths as completions (pass_threshold {self.pass_threshold:g})",
            "set the task's checker.self_test: runs (the function only has to return a score) "
            "or off, or fix the function or those rows",
        )

    @property
    def self_test_off(self) -> str | None:
        """Why the self-test is off (the cell records it), or None when it runs."""
        if self.self_test == "off":
            return "off"
        if self.self_test.startswith("off:"):
            return self.self_test[len("off:") :].strip()
        return None

    def close(self) -> None:
        shutil.rmtree(self._code, ignore_errors=True)


def as_score(value: Any) -> tuple[float | str, dict[str, Any]]:
    """(score, the dict's other keys) of what a reward function returned, or (why it is not a
    score, {}): a number within ±`MAX_REWARD` or a bool, or a dict whose `score` is one (and
    whose numeric `acc`, a cell metric too, is one)."""
    info: dict[str, Any] = {}
    if isinstance(value, dict) and not _big_int(value):
        if "score" not in value:
            return f"returned a dict without a `score` key (keys: {', '.join(value)})", {}
        info = {k: v for k, v in value.items() if k != "score"}
        value = value["score"]
    acc = info.get("acc")
    if (isinstance(acc, (int, float)) or _big_int(acc)) and not _in_range(acc):
        return f"returned an `acc` of {_short(acc)}, {_RANGE}", {}
    if _in_range(value):
        return float(value), info
    if isinstance(value, (int, float)) or _big_int(value):
        return f"returned {_short(value)}, {_RANGE}", {}
    shown = value.get("__unplain__") if isinstance(value, dict) else type(value).__name__
    return " ".join(["returned", str(shown), _short(value)]).rstrip() + ", not a number", {}


def _big_int(value: Any) -> bool:
    """Whether `value` is the runner's note in place of an int beyond 64 bits (`plain`)."""
    return isinstance(value, dict) and value.get("__unplain__") == "int" and "digits" in value


#: The largest score (in magnitude) a reward function may return. Beyond it a cell's sums and
#: squares lose integer precision and then overflow (1e308 made the standard error infinite; a
#: 400-digit integer could not be made a float at all), so such a sample is a `reward_error`.
MAX_REWARD = 1e15
_RANGE = f"not a finite number within ±{MAX_REWARD:g}"


def _in_range(value: Any) -> bool:
    """Whether `value` is a bool or a number within ±`MAX_REWARD` (an int of any size is
    compared exactly, never converted: `float(10**400)` raises)."""
    if isinstance(value, bool):
        return True
    if isinstance(value, int):
        return abs(value) <= MAX_REWARD
    return isinstance(value, float) and math.isfinite(value) and abs(value) <= MAX_REWARD


def _short(value: Any) -> str:
    if _big_int(value):
        return f"an integer of about {value['digits']} digits"
    if isinstance(value, int) and abs(value) > 10**40:  # never str(): it is bounded too
        return f"an integer of about {int(abs(value).bit_length() * math.log10(2)) + 1} digits"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return repr(value[:40])
    return ""


def _failed(why: str, duration: float) -> Verdict:
    return Verdict(
        False, "reward_error", duration_s=duration, stderr_tail=why.strip()[:ERROR_LINE_CHARS]
    )


def _top_level_names(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


def preload_modules(source: str, beside: Path) -> list[str]:
    """The installed modules a reward file imports (anywhere in it, by absolute import), which
    the sandbox's driver may import once per batch instead of once per sample: not the standard
    library's (cheap, and a few do things on import), not one whose top package is a module
    beside the file (that is the user's code: it runs only in a sample's process, and shadows an
    installed one of the same name), and no private or `__main__` module (which runs a program
    on import). A file that does not parse preloads nothing (each sample fails on it alone)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    names = absolute_imports(tree)
    local = {entry.name.split(".")[0] for entry in beside.iterdir()} if beside.is_dir() else set()
    return sorted(
        name
        for name in names
        if name.split(".")[0] not in sys.stdlib_module_names
        and name.split(".")[0] not in local
        and not any(part.startswith("_") for part in name.split("."))
    )


def local_modules(reward_file: Path) -> dict[str, Path]:
    """Path within the reward file's directory -> file, of every module it imports from that
    directory, followed recursively (a package's `__init__.py` and the submodules named; the
    relative imports of a package's modules). Imports are read, not run: one in a function or
    under a condition counts too, and a module of another directory or of this Python is not
    followed."""
    root = reward_file.resolve().parent
    start = reward_file.resolve()
    found: dict[str, Path] = {}
    todo: list[tuple[Path, str | None]] = [(start, None)]
    while todo:
        file, package = todo.pop()
        for dotted in _imported_names(file, package):
            for module in _module_files(root, dotted):
                rel = module.relative_to(root).as_posix()
                if module != start and rel not in found:
                    found[rel] = module
                    todo.append((module, _package_of(root, module)))
    return dict(sorted(found.items()))


def _imported_names(file: Path, package: str | None) -> list[str]:
    """The dotted names `file`'s imports may load (a `from m import x` names `m` and `m.x`, x
    being maybe a submodule), relative ones resolved within `package`; none when it is not
    Python (it then fails as it runs, and its own bytes still count)."""
    try:
        tree = ast.parse(file.read_text(encoding="utf-8"), str(file))
    except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
        return []
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(node.module, node.level, package)
            if base is not None:
                names += [base] + [f"{base}.{alias.name}" for alias in node.names]
    return names


def _absolute(module: str | None, level: int, package: str | None) -> str | None:
    """An `from <level dots><module> import` base as an absolute dotted name, or None when
    it leaves the directory (or is relative in a top-level file)."""
    if level == 0:
        return module
    if package is None:
        return None
    parts = package.split(".")
    if level - 1 >= len(parts):
        return None
    parts = parts[: len(parts) - (level - 1)]
    return ".".join([*parts, module] if module else parts)


def _module_files(root: Path, dotted: str) -> list[Path]:
    """The files of `root` that importing `dotted` executes: each package's `__init__.py` on
    the way, then the module's file (none for a name of another directory)."""
    files: list[Path] = []
    here = root
    for part in dotted.split("."):
        here = here / part
        if (here / "__init__.py").is_file():
            files.append(here / "__init__.py")
        elif here.with_suffix(".py").is_file():
            files.append(here.with_suffix(".py"))
            break
        elif not here.is_dir():  # not here: another directory's, or this Python's
            break
    return files


def _package_of(root: Path, module: Path) -> str | None:
    """The dotted package a module of `root` belongs to (None at the top level)."""
    parts = module.relative_to(root).parent.parts
    return ".".join(parts) if parts else None


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


register("reward_function", RewardFunctionChecker)

"""A judged run's test process: the tests and `check(candidate)`, with proxies of the program's
names (`_Tests`, `_judge`); see `judged`.
"""

import ast
import json
import os
import sys

from .arrays import _is_array
from .channel import (
    _decode,
    _dump,
    _fill,
    _format_failure,
    _load,
    _next_items,
    _program_class,
    _remote_items,
    _SampleExited,
    _SampleGone,
)

_MAX_REPORT = 48 << 10  # a report fits in a pipe's buffer: the test process never blocks on it


class _Remote:
    """An object of the sample process, seen from the tests: equal only to itself; its truth,
    length, items, attributes, string forms and calls are asked of the sample (its answer is the
    sample's answer, as plain data), its comparisons never are."""

    __slots__ = ("_ckpteval_id", "_ckpteval_tests", "_ckpteval_name")

    def __init__(self, tests, ref, name):
        object.__setattr__(self, "_ckpteval_id", ref)
        object.__setattr__(self, "_ckpteval_tests", tests)
        object.__setattr__(self, "_ckpteval_name", name)

    def _ask(self, op, *args, **kwargs):
        return self._ckpteval_tests.ask(op, self._ckpteval_id, args, kwargs)

    def __call__(self, *args, **kwargs):
        return self._ask("call", *args, **kwargs)

    def __eq__(self, other):
        if other is not self:
            self._ckpteval_tests.compared = True
        return other is self

    def __ne__(self, other):
        return not self.__eq__(other)

    __hash__ = object.__hash__

    def __bool__(self):
        return bool(self._ask("bool"))

    def __len__(self):
        return int(self._ask("len"))

    def __iter__(self):
        return iter(list(self._ask("list")))

    def __getitem__(self, key):
        return self._ask("getitem", key)

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return self._ask("getattr", name)

    def __str__(self):
        return str(self._ask("str"))

    def __repr__(self):
        return f"<sample object {self._ckpteval_name}>"


class _Tests:
    """The test process's side of the channel."""

    def __init__(self, channel):
        self.channel = channel
        self.remotes = {}
        self.hacks = []
        self.compared = False
        self.mutated = ()
        self.gone = None  # the first _SampleGone: the verdict, whatever the tests caught
        self.namespace = {}  # the tests' globals: the prompt's exception classes
        self.callbacks = []  # the tests' callables and iterators the sample holds, by index
        self.callback_index = {}  # id of a callback (kept alive in `callbacks`) -> its index

    # -- what `_Outbound` and `_Inbound` ask of this side (see them)

    program_module = "__ckpteval_tests__"
    callback_type = _Remote

    def own_callback(self, value):
        return ("O", value._ckpteval_id, None)

    def refer(self, value):
        """A tests' object that is no data (a mock, what a mock returns): by reference, as a
        callable is (`_operate` says what the sample may do with it). A module never crosses: its
        functions would run here on the sample's word."""
        if isinstance(value, type(sys)):
            raise TypeError(f"a test passes a {type(value).__name__} the sample process cannot get")
        return self.callable(value)

    def enum_extra(self, value):
        return None

    def callable(self, value):
        index = self.callback_index.get(id(value))
        if index is None:  # one object, one index: the sample sees one object as one (`is`)
            self.callbacks.append(value)
            index = self.callback_index[id(value)] = len(self.callbacks) - 1
        return ("K", index)

    def iterator(self, value):
        self.callbacks.append(value)
        return ("J", len(self.callbacks) - 1)

    def program_class(self, module, qualname):
        """The tests' copy of the prompt's class (or the tests' own) named `qualname`: a plain
        class (no `__new__` of its own), never an exception or an enum."""
        if module not in ("__main__", "__ckpteval_tests__"):
            return None
        cls = _program_class(self.namespace, qualname)
        if cls is None or cls.__new__ is not object.__new__ or issubclass(cls, BaseException):
            return None
        return cls

    def program_type(self, module, qualname, ref, inbound):
        """A class of the program's: the tests' copy of the prompt's, or the sample's, opaque."""
        cls = _program_class(self.namespace, qualname) if module == "__main__" else None
        return cls if cls is not None else self.stand_in(qualname, ref, inbound)

    def stand_in(self, qualname, ref, inbound):
        if type(ref) is tuple and ref[:1] == ("O",):
            return _decode(ref, inbound)  # a class of the sample's own: its object, opaque
        raise _SampleGone(f"an instance of {qualname[:100]!r}, which the tests do not know")

    def fill(self, obj, state):
        if not isinstance(obj, _Remote):
            _fill(obj, state, True)

    def enum_member(self, module, qualname, name, extra, inbound):
        """A member of the prompt's Enum or of an already imported module's (by class and
        name); another one is the sample's object, opaque."""
        if module in ("__main__", "__ckpteval_tests__"):
            cls = _program_class(self.namespace, qualname)
        elif module.split(".")[0] in _RUNNER_MODULES or module not in sys.modules:
            cls = None
        else:
            cls = sys.modules[module]
            for part in qualname.split("."):
                cls = getattr(cls, part, None)
        enum = sys.modules["enum"]
        if isinstance(cls, type) and issubclass(cls, enum.Enum) and type(name) is str:
            member = cls.__members__.get(name)
            if member is not None:
                return member
        if type(extra) is tuple and extra[:1] == ("O",):
            return _decode(extra, inbound)
        raise _SampleGone(f"a member of {qualname[:100]!r}, which the tests do not know")

    def crossing(self, tag, index):
        if tag == "G":
            return _remote_items(self, index)
        if type(index) is not int or not 0 <= index < len(self.callbacks):
            raise _SampleGone("a malformed callback in a reply")
        return self.callbacks[index]

    def lookup(self, ref, info):
        """The remote object a reply refers to (by the sample's number for it)."""
        if type(ref) is not int:
            raise _SampleGone("a malformed reference in a reply")
        if isinstance(info, dict) and info.get("always_equal") is True:
            self._hack("always_equal_object")
        if ref not in self.remotes:
            name = info.get("type", "object") if isinstance(info, dict) else "object"
            self.remotes[ref] = _Remote(self, ref, str(name)[:100])
        return self.remotes[ref]

    def named(self, name):
        """The sample's top-level `name`, as a remote object."""
        return _Remote(self, ("name", name), name)

    def _hack(self, name):
        if name not in self.hacks:
            self.hacks.append(name)

    def ask(self, op, target, args=(), kwargs=None):
        kwargs = kwargs or {}
        request = (op, target, _dump(list(args), self), _dump(kwargs, self))
        if self.gone is not None:
            raise self.gone  # no second conversation with a sample that is gone
        try:
            self.channel.send(request)
        except OSError:  # its end of the pipe is closed: it ended
            self._gone(_SampleGone("the sample process ended while the tests ran"))
        self.mutated = ()
        value = self.answer()
        for key, tree in self.mutated if type(self.mutated) is list else ():
            self._mutate(
                args[key]
                if type(key) is int and 0 <= key < len(args)
                else kwargs.get(key)
                if type(key) is str
                else None,
                tree,
            )
        return value

    def _mutate(self, arg, tree):
        """What the call did to a list, dict, set or numpy array or an instance of the prompt's
        class the tests passed: done to the tests' own object too, as if the call had run here
        (the new contents are the sample's, as data; an instance keeps its identity, so a cycle
        back to it too; an array keeps its shape and dtype, or stays as it was)."""
        instance = type(arg).__module__ == self.program_module and hasattr(arg, "__dict__")
        try:
            new = _load(tree, self, arg if instance else None)
        except _SampleGone as exc:
            self._gone(exc)
        if type(arg) is list and type(new) is list:
            arg[:] = new
        elif type(arg) in (dict, set) and type(new) is type(arg):
            arg.clear()
            arg.update(new)
        elif (
            _is_array(arg)
            and type(new) is type(arg)
            and (new.shape, new.dtype) == (arg.shape, arg.dtype)
            and arg.flags.writeable
        ):
            arg[...] = new

    def _gone(self, exc):
        if self.gone is None:
            self.gone = exc
        raise exc

    def answer(self, ready=False):
        try:
            return self._answer(ready)
        except _SampleGone as exc:
            self._gone(exc)

    def _receive(self):
        raw = self.channel.receive_raw()
        try:
            reply = ast.literal_eval(raw.decode("utf-8", "surrogatepass"))
        except (
            ValueError,
            SyntaxError,
            TypeError,
            MemoryError,
            RecursionError,
            UnicodeDecodeError,
        ) as exc:
            raise _SampleGone(f"a malformed reply: {type(exc).__name__}", True) from None
        if type(reply) is not tuple or not reply:
            raise _SampleGone("a malformed reply", True)
        return reply

    def _answer(self, ready):
        reply = self._receive()
        while reply[0] == "cb":  # the sample calls one of the tests' callables first
            self._call_back(reply)
            reply = self._receive()
        for hack in (
            reply[2]
            if reply[0] in ("ok", "err") and len(reply) > 2 and type(reply[2]) is list
            else ()
        ):
            if hack in _HACKS:
                self._hack(hack)
        if reply[0] == "ok" and len(reply) >= 2:
            if (
                len(reply) > 3
                and type(reply[3]) is list
                and all(type(m) is tuple and len(m) == 2 for m in reply[3])
            ):
                self.mutated = reply[3]
            return _load(reply[1], self)
        if reply[0] == "err" and len(reply) >= 4 and type(reply[1]) is str:
            raise self._exception(reply)
        if reply[0] == "exit":
            if not ready:  # during the tests; at start-up it may be a __main__ block's exit
                self._hack("exit_before_tests")
            raise _SampleExited(f"the sample called exit({reply[1]!r}) while the tests ran")
        raise _SampleGone("a malformed reply")

    def _exception(self, reply):
        """The exception the sample raised (an "err" reply), as the tests' own: the first class
        of its MRO that `_exception_class` finds here, with its args and plain attributes (as
        data), and the sample's traceback as a note. What no `except Exception:` catches in one
        process (KeyboardInterrupt, GeneratorExit, ...) ends the sample's verdict instead."""
        classes = [("builtins", reply[1]), ("builtins", "Exception")]
        classes = reply[4] if len(reply) > 4 and type(reply[4]) is list else classes
        cls = None
        for entry in classes[:64]:
            if type(entry) is tuple and len(entry) == 2 and all(type(x) is str for x in entry):
                cls = _exception_class(entry[0], entry[1], self.namespace)
                if cls is not None:
                    break
        if cls is None or not issubclass(cls, Exception):
            raise _SampleGone(f"the sample raised {reply[1][:100]}, which ends the tests")
        args = _load(reply[5], self) if len(reply) > 5 else ()
        args = args if type(args) is tuple else ()
        try:
            exc = cls.__new__(cls, *args)
        except Exception:  # noqa: BLE001 - a __new__ that wants other arguments
            exc = cls.__new__(cls)
        exc.args = args
        attrs = _load(reply[6], self) if len(reply) > 6 else {}
        for name, value in attrs.items() if type(attrs) is dict else ():
            if type(name) is str and not name.startswith("__"):
                try:
                    setattr(exc, name, value)
                except Exception:  # noqa: BLE001 - a read-only attribute of the class
                    pass
        exc.add_note(f"raised by the sample:\n{str(reply[3])[-1500:]}")
        return exc

    def _call_back(self, request):
        """Do what the sample did with one of the tests' objects ("cb", op, index, args, kwargs):
        call a callable, take the next items of an iterator ("next", [n]), or use a mock
        (`_operate`): trusted code on the sample's arguments as data; the reply is its result or
        what it raised (`_raised`). A read of a mock's own record (`call_count`,
        `assert_called_once_with`, `reset_mock`...) is no library's attribute: a sample that
        tries is tampering with the tests, and fails."""
        if (
            len(request) != 5
            or request[1] not in _CALLBACK_OPS
            or type(request[2]) is not int
            or not 0 <= request[2] < len(self.callbacks)
        ):
            raise _SampleGone("a malformed callback request")
        target = self.callbacks[request[2]]
        args, kwargs = _load(request[3], self), _load(request[4], self)
        if type(args) is not list or type(kwargs) is not dict:
            raise _SampleGone("a malformed callback request")
        if request[1] == "getattr" and (len(args) != 1 or type(args[0]) is not str):
            raise _SampleGone("a malformed callback request")
        if request[1] == "getattr" and args[0] in _mock_api():
            raise _SampleGone(f"the sample read the tests' mock's {args[0][:50]!r}", True)
        try:
            message = ("ret", _dump(_operate(target, request[1], args, kwargs), self))
        except Exception as exc:  # noqa: BLE001 - the sample's to catch, as in one process
            message = self._raised(exc)
        try:
            self.channel.send(message)
        except OSError:
            raise _SampleGone("the sample process ended while the tests ran") from None

    def _raised(self, exc):
        """The reply for an exception one of the tests' objects raised (a mock's `side_effect`):
        its name and message, its classes (its MRO, by module and qualname: the sample takes the
        first its process has) and its args."""
        classes = [(str(c.__module__), str(c.__qualname__)) for c in type(exc).__mro__]
        try:
            args = _dump(tuple(exc.args), self)
        except Exception:  # noqa: BLE001 - args that cannot cross: its message alone
            args = _dump((str(exc)[:2000],), self)
        return ("raise", type(exc).__name__, str(exc)[:2000], classes[:64], args)

    def patch(self, target, attribute):
        """The tests patched `attribute` of `target` (`unittest.mock`'s patch, started): the same
        attribute of the same module or class in the sample's process becomes what the patch put
        here, by reference (the sample's calls of it run the mock here, where the tests then
        assert on it). Returns the sample's number for the patch (None: the target is no module
        or class the sample's process has, such as an object of the tests': the patch stays
        here, as before)."""
        where = _patch_target(target, self.namespace)
        if where is None:
            return None
        return self.ask("patch", None, [*where, attribute, getattr(target, attribute)])

    def patch_environ(self, values, clear):
        """`patch.dict(os.environ, values, clear=clear)` started: the same in the sample's
        process (only the values the tests give cross, never this process's environment)."""
        return self.ask("environ", None, [values, clear])

    def unpatch(self, number):
        """A patch the sample's process has (`patch`, `patch_environ`) stopped: undone there."""
        if number is not None and self.gone is None:
            self.ask("unpatch", None, [number])


#: What the sample may do with an object of the tests' (`_Tests._call_back`).
_CALLBACK_OPS = (
    "call",
    "next",
    "getattr",
    "getitem",
    "contains",
    "iter",
    "len",
    "bool",
    "str",
    "enter",
    "exit",
)


def _mock_api():
    """The names of a mock's own record and methods (`call_count`, `assert_called_with`,
    `reset_mock`, ...): none is a library's attribute that honest code reads."""
    mock = sys.modules.get("unittest.mock")
    if mock is None:
        return frozenset()
    return frozenset(n for n in dir(mock.NonCallableMock) if not n.startswith("_"))


def _operate(obj, op, args, kwargs):
    """`op` done to one of the tests' objects for the sample. Attributes only of a mock
    (`unittest.mock`'s): its attributes are children or what the tests configured, while
    another object's attributes lead anywhere (a generator's frame, its globals, `open`); a
    module-level builtin (`os.write`) never crosses. The other operations run the object's own
    code on data."""
    if op == "call":
        return obj(*args, **kwargs)
    if op == "next":
        return _next_items(obj, args)
    if op == "getattr":
        mock = sys.modules.get("unittest.mock")
        if mock is None or not isinstance(obj, mock.NonCallableMock) or args[0][:1] == "_":
            raise AttributeError(f"the tests' {type(obj).__name__} has no {args[0][:50]!r} here")
        value = getattr(obj, args[0])
        if type(value) is type(len) and isinstance(value.__self__, (type(None), type(sys))):
            raise AttributeError(args[0])
        return value
    if op == "getitem" and len(args) == 1:
        return obj[args[0]]
    if op == "contains" and len(args) == 1:
        return args[0] in obj
    if args:
        raise TypeError(f"{op} takes no arguments")
    if op == "iter":
        return iter(obj)
    if op == "len":
        return len(obj)
    if op == "bool":
        return bool(obj)
    if op == "str":
        return str(obj)
    if op == "enter":
        return type(obj).__enter__(obj)
    return type(obj).__exit__(obj, None, None, None)  # "exit"


def _patch_target(target, namespace):
    """How the sample's process finds a patch's target: ("module", name, ""), ("class",
    module, qualname), ("program", "", qualname) for a class the prompt defines or
    ("program", "", "") for the program's own names (the prompt's helper); None for anything
    else."""
    if isinstance(target, type(sys)):
        name = target.__name__
        if name == namespace.get("__name__") and target.__dict__ is namespace:
            return ("program", "", "")  # the tests' own names: the program's, there
        return ("module", name, "") if sys.modules.get(name) is target else None
    if not isinstance(target, type):
        return None
    module, qualname = target.__module__, target.__qualname__
    if module == namespace.get("__name__"):
        found = _program_class(namespace, qualname)
        return ("program", "", qualname) if found is target else None
    found = sys.modules.get(module)
    for part in qualname.split("."):
        found = getattr(found, part, None)
    return ("class", module, qualname) if found is target else None


def _forward_patches(runner):
    """Make `unittest.mock`'s patches (decorators, `with`, `start`/`stop`, `patch.object`,
    `patch.dict(os.environ)`) reach the sample's process as they reach code in one process:
    each patch, once started here, is started there (`_Tests.patch`) and stopped there when it
    stops here. Only in the tests' process, which is this sample's alone."""
    from unittest import mock

    enter, leave = mock._patch.__enter__, mock._patch.__exit__
    start_dict, stop_dict = mock._patch_dict._patch_dict, mock._patch_dict._unpatch_dict

    def forwarded_enter(patcher):
        new = enter(patcher)
        patcher.ckpteval_number = runner.patch(patcher.target, patcher.attribute)
        return new

    def forwarded_exit(patcher, *exc_info):
        number = getattr(patcher, "ckpteval_number", None)
        try:
            return leave(patcher, *exc_info)
        finally:
            runner.unpatch(number)

    def forwarded_start_dict(patcher):
        start_dict(patcher)
        patcher.ckpteval_number = None
        if patcher.in_dict is os.environ:
            values = {str(k): str(v) for k, v in dict(patcher.values).items()}
            patcher.ckpteval_number = runner.patch_environ(values, bool(patcher.clear))

    def forwarded_stop_dict(patcher):
        try:
            stop_dict(patcher)
        finally:
            runner.unpatch(getattr(patcher, "ckpteval_number", None))

    mock._patch.__enter__, mock._patch.__exit__ = forwarded_enter, forwarded_exit
    mock._patch_dict._patch_dict = forwarded_start_dict
    mock._patch_dict._unpatch_dict = forwarded_stop_dict


def _run_test_cases(namespace):
    """BigCodeBench's shape: tests that are `unittest.TestCase` classes and no `check`. Every
    class the tests define runs, as BigCodeBench's harness runs its `TestCases`; a failure or
    an error of any test fails the sample (the first one's traceback is the reason)."""
    import unittest

    cases = [
        value
        for value in list(namespace.values())
        if isinstance(value, type)
        and issubclass(value, unittest.TestCase)
        and value.__module__ == namespace["__name__"]
    ]
    loader = unittest.TestLoader()
    suite = unittest.TestSuite(loader.loadTestsFromTestCase(case) for case in cases)
    result = unittest.TestResult()
    suite.run(result)
    for test, text in result.failures + result.errors:
        raise AssertionError(f"{test.id()}: {text[-2000:]}")
    if not cases:
        raise AssertionError("the tests define no check(candidate) and no unittest.TestCase")


#: Modules whose exceptions mean something to a test runner (a skip, a test framework's own
#: failure): a sample's exception is never one of them.
_RUNNER_MODULES = ("unittest", "pytest", "_pytest", "doctest")


def _exception_class(module, qualname, namespace):
    """The class `module`.`qualname` as the tests know it, if it is an exception a sample may
    raise there: a builtin one, one of a module already imported here (by the tests, the prompt
    or the driver's preload: importing one a sample names would run code on its word), or one the
    prompt defines (the sample's `__main__`, the tests' namespace). Never a test runner's or a
    stopper of iteration (StopIteration crossing a generator means something else)."""
    import builtins

    if module == "builtins":
        cls = getattr(builtins, qualname, None)
    elif module == "__main__":
        cls = namespace.get(qualname.split(".")[0])
        for part in qualname.split(".")[1:]:
            cls = getattr(cls, part, None) if isinstance(cls, type) else None
        prompt = namespace.get("__name__")
        if not isinstance(cls, type) or cls.__module__ != prompt or cls.__qualname__ != qualname:
            return None
        return cls if issubclass(cls, BaseException) else None
    elif module.split(".")[0] in _RUNNER_MODULES or module not in sys.modules:
        return None
    else:
        cls = sys.modules[module]
        for part in qualname.split("."):
            cls = getattr(cls, part, None)
    if not isinstance(cls, type) or not issubclass(cls, BaseException):
        return None
    if issubclass(cls, (StopIteration, StopAsyncIteration)):
        return None
    if cls.__module__.split(".")[0] in _RUNNER_MODULES:
        return None
    return cls


_HACKS = (
    "exit_before_tests",
    "fake_test_report",
    "redefines_assertions",
    "tampers_with_tests",
    "reads_harness_files",
    "always_equal_object",
)


def _cache_source(name, source):
    """Let tracebacks quote `source` (compiled as `name`)."""
    import linecache

    linecache.cache[name] = (len(source), None, source.splitlines(True), name)


def _test_names(objects):
    """Every name the test code's objects (`_code_objects`) refer to."""
    return {name for current in objects for name in current.co_names}


def _code_objects(code):
    """`code` and the code objects nested in it (functions, classes, comprehensions, lambdas)."""
    found, stack = [], [code]
    while stack:
        current = stack.pop()
        found.append(current)
        stack.extend(c for c in current.co_consts if hasattr(c, "co_names"))
    return found


def _import_modules_used(source, objects, namespace, entry):
    """Bind every standard-library module the tests use as one (`math.isclose(...)`) to the real
    module, unless the tests' own code bound the name: such names are never asked of the sample,
    so a sample's `class math` or `math = types.ModuleType('math')` cannot stand in for them.

    The source is parsed (~0.8 ms of a sample's ~20) only when its compiled code (`objects`,
    `_code_objects`) names a standard-library module the namespace lacks at all: most tests name
    none (HumanEval's), and a module name only in code the compiler dropped (`if False:`) never
    runs either way."""
    import ast
    import importlib

    named = {
        name
        for current in objects
        for names in (current.co_names, current.co_varnames, current.co_cellvars)
        for name in names
    }
    if (named - set(namespace) - {entry}).isdisjoint(sys.stdlib_module_names):
        return
    used = {
        node.value.id
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
    }
    for name in sorted(used - set(namespace) - {entry}):
        if name in sys.stdlib_module_names:
            try:
                namespace[name] = importlib.import_module(name)
            except ImportError:
                pass  # not on this machine: the tests fail on the name, as they would anywhere


def _run_tests(tests, channel, report_fd):
    """Run the problem's tests against the sample process; report and return the exit status."""
    runner = _Tests(channel)
    _cache_source("<tests>", tests["test"])
    report = {"ok": False}
    try:
        _judge(tests, runner)
        report = {"ok": True}
    except BaseException as exc:  # noqa: BLE001 - any failure of the tests is the sample's
        report = _failed_tests_report(exc)
    gone = runner.gone  # the sample ended: its verdict, whatever the tests caught
    if isinstance(gone, _SampleExited):
        report = {"ok": False, "exception": "", "sample_exit": True, "traceback": str(gone)}
    elif gone is not None:
        report = {"ok": False, "exception": "", "sample_gone": True, "traceback": str(gone)}
        if gone.forged:
            runner._hack("tampers_with_tests")
    report["hacks"] = runner.hacks
    report["compared_object"] = runner.compared
    data = json.dumps(report).encode()[:_MAX_REPORT]
    try:
        os.write(report_fd, data)
    except OSError:
        return 1
    return 0 if report["ok"] else 1


def _judge(tests, runner):
    """The tests' one audited sequence: their namespace, the sample's names in it as proxies,
    their patches forwarded to the sample, the tests, `check(candidate)` (or their
    `unittest.TestCase` classes). Returns if they passed; raises whatever failed them."""
    import builtins

    namespace = _tests_namespace(tests)
    runner.namespace = namespace
    code = compile(tests["test"], "<tests>", "exec", dont_inherit=True)
    entry = tests.get("entry_point")
    objects = _code_objects(code)  # walked once for both
    _import_modules_used(tests["test"], objects, namespace, entry)
    wanted = sorted(
        n
        for n in _test_names(objects) | ({entry} if entry else set())
        if n not in namespace and not hasattr(builtins, n)
    )
    runner.answer(ready=True)  # the program has run (or failed to)
    _bind_sample_names(runner, namespace, wanted)
    if any("mock" in str(tests.get(part) or "") for part in ("prompt", "imports", "setup", "test")):
        _forward_patches(runner)  # no test can patch without naming mock
    exec(code, namespace)
    if entry and "check" not in namespace:
        _run_test_cases(namespace)
    elif entry:
        namespace["check"](runner.named(entry))


def _tests_namespace(tests):
    """The tests' globals before their own code: the prompt's helpers (its imports alone if it
    is a stub that needs its body), without the prompt's stub of the entry point; the tests'
    imports and setup. They are a module's, registered as BigCodeBench's harness registers its
    own, so that `patch(f"{__name__}.helper")` finds them (and is forwarded to the program's)."""
    import builtins

    module = type(sys)("__ckpteval_tests__")
    sys.modules[module.__name__] = module
    namespace = module.__dict__
    namespace["__builtins__"] = builtins
    if tests.get("prompt"):
        try:
            exec(compile(tests["prompt"], "<prompt>", "exec", dont_inherit=True), namespace)
        except Exception:  # noqa: BLE001 - a stub that needs its body: its imports suffice
            imports = "\n".join(
                line
                for line in tests["prompt"].splitlines()
                if line.startswith(("import ", "from "))
            )
            exec(compile(imports, "<prompt>", "exec", dont_inherit=True), namespace)
    if tests.get("entry_point"):
        namespace.pop(tests["entry_point"], None)  # the prompt's stub
    for part in ("imports", "setup"):
        if tests.get(part):
            exec(compile(tests[part], "<tests>", "exec", dont_inherit=True), namespace)
    return namespace


def _bind_sample_names(runner, namespace, wanted):
    """Bind the `wanted` names the sample's program defines: callables as proxies, standard-
    library modules it imported as the real module, plain values as the data it sent."""
    found = runner.ask("names", None, wanted)
    if type(found) is not dict:
        runner._gone(_SampleGone("a malformed reply to names"))
    for name, kind in found.items():
        if type(name) is not str or name not in wanted:
            continue
        if kind == "callable":
            namespace[name] = runner.named(name)
        elif kind == ("module", name) and name in sys.stdlib_module_names:
            namespace[name] = __import__(name)  # `import math` in the program, not in the tests
        elif type(kind) is tuple and kind[:1] == ("value",) and len(kind) == 2:
            namespace[name] = kind[1]


def _failed_tests_report(exc):
    """The report of tests that failed with `exc` (raised in the tests, or by the sample)."""
    try:
        text = _format_failure(exc)
    except BaseException:  # noqa: BLE001
        text = type(exc).__name__
    return {"ok": False, "exception": type(exc).__name__, "traceback": text[-4000:]}

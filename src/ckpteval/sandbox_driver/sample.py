"""A judged run's sample process: runs the program, then serves the tests' calls
(`_SampleServer`, `_serve_sample`); see `judged`.
"""

import ast
import os
import signal
import sys

from .arrays import _is_array
from .channel import (
    _CHUNK,
    _UNKNOWN,
    _Channel,
    _dump,
    _encode,
    _fill,
    _format_failure,
    _load,
    _PlainOnly,
    _program_class,
    _SampleGone,
)
from .privileges import _read_small

_TOOLING = (
    "linecache",
    "tokenize",
    "warnings",
    "traceback",
    "importlib",
    "codecs",
    "encodings",
    "inspect",
    "doctest",
    "unittest",
    "pydoc",
)  # read sources for honest reasons


def _serve_sample(path, env, tests_path):
    """The sample process: run the program, then answer the test process's calls, forever (the
    driver kills it once the tests ended). Nothing here is trusted by anyone."""
    import functools

    os.environ.clear()
    os.environ.update(env)
    sys.argv = [path]
    channel = _Channel(3, 4)
    server = _SampleServer(path, channel)
    sys.addaudithook(server.hook)
    reply = server.run(server.program)
    if reply[0] == "err" and reply[1] == "MemoryError":
        server.namespace.clear()
    while True:
        try:
            channel.send(reply)
        except BrokenPipeError:  # the tests ended first (e.g. on a reply the sample forged):
            _wait_for_kill()  # an exit now would count as the sample's own, a race
        except BaseException:  # noqa: BLE001 - e.g. the output cap: the tests see it end
            os._exit(1)
        try:
            op, target, args, kwargs = ast.literal_eval(channel.receive_raw().decode())
        except _SampleGone:  # the tests ended: wait for the driver's kill (an exit is the sample's)
            _wait_for_kill()
        # a partial, not a lambda: no frame of ours between the request and the sample's code
        reply = server.run(functools.partial(server.step, op, target, args, kwargs))


_PAUSE = signal.pause  # bound here: the tests may have patched `time.sleep` in this process


def _wait_for_kill():
    """The sample process, once the tests ended: it waits for the driver's kill, so that it
    ends as the driver ends it (its own exit would count as the sample's)."""
    while True:
        _PAUSE()


class _Callback:
    """An object of the tests' (a callable they pass, what a patch put in a module's place, what
    a mock returns), seen from the program: what the program does with it (a call, an
    attribute, items, iteration, `with`, `len`, truth, `str`) is asked of the tests' process,
    which does it (`_operate`) and answers with the result, as data or as another such object
    (`_SampleServer.call_back`). An attribute the program sets stays here: the tests' object is
    never changed by the sample but through its calls."""

    __slots__ = ("_server", "_index", "_local")

    def __init__(self, server, index):
        object.__setattr__(self, "_server", server)
        object.__setattr__(self, "_index", index)
        object.__setattr__(self, "_local", {})

    def _ask(self, op, *args, **kwargs):
        return self._server.call_back(op, self._index, args, kwargs)

    def __call__(self, *args, **kwargs):
        return self._ask("call", *args, **kwargs)

    def __getattr__(self, name):
        if name in _Callback.__slots__:  # unset: `copy` makes one without `__init__`
            raise AttributeError(name)
        if name in self._local:
            return self._local[name]
        if name.startswith("_"):
            raise AttributeError(name)
        return self._ask("getattr", name)

    def __setattr__(self, name, value):
        if name in _Callback.__slots__:
            object.__setattr__(self, name, value)
        else:
            self._local[name] = value

    def __getitem__(self, key):
        return self._ask("getitem", key)

    def __contains__(self, item):
        return self._ask("contains", item)

    def __iter__(self):
        return self._ask("iter")

    def __len__(self):
        return self._ask("len")

    def __bool__(self):
        return self._ask("bool")

    def __enter__(self):
        return self._ask("enter")

    def __exit__(self, *exc_info):
        return self._ask("exit")

    def __str__(self):
        return self._ask("str")

    def __repr__(self):
        return f"<tests' object {self._index}>"


#: The tests' requests about the program as a whole (the names they take from it, their
#: patches started and stopped here), and the methods that serve them.
_REQUESTS = {"names": "names", "patch": "patch", "environ": "patch_environ", "unpatch": "unpatch"}


class _SampleServer:
    """The sample process's side of the channel: the program's namespace, the objects it handed
    out (by number), and the hints of hacks its audit hook saw."""

    def __init__(self, path, channel):
        import builtins

        self.path = path
        self.channel = channel
        self.pending = {}  # the exception an iterator raised after the items it sent last
        self.stand_ins = {}
        self.hacks = []
        self.auditing = False
        self.busy = False  # the hook's own calls (sys._getframe) are not the sample's
        self.workdir = os.path.dirname(os.path.dirname(os.path.abspath(path)))
        self.objects = {}
        self.proxies = {}  # the tests' objects, by their number: one object, one proxy
        self.patches = {}  # number -> how to undo a patch of the tests' (`patch`)
        self.mutated = []
        self.namespace = {"__name__": "__main__", "__file__": path, "__builtins__": builtins}

    # -- what the audit hook flags (hints, not proof)

    def flag(self, name):
        if name not in self.hacks:
            self.hacks.append(name)

    def caused_by_sample(self, frame, direct):
        for _ in range(1 if direct else 40):
            if frame is None:
                return False
            if frame.f_code.co_filename == self.path:
                return True
            if str(frame.f_globals.get("__name__", "")).split(".")[0] in _TOOLING:
                return False
            frame = frame.f_back
        return False

    def harness_path(self, name):
        if isinstance(name, int) or name is None:
            return False
        try:
            name = os.path.abspath(os.fsdecode(name))
        except (TypeError, ValueError):
            return False
        workdir = self.workdir
        return name == workdir or name.startswith((workdir + "/", "/proc", "/dev/fd"))

    def hook(self, event, args):
        """What the program does that only a hack would (hints, not proof)."""
        if not self.auditing or self.busy:
            return
        if event in ("open", "os.listdir", "os.scandir"):
            if not (args and self.harness_path(args[0])):
                return
            kind, direct = "reads_harness_files", False
        elif event in _TAMPERING_EVENTS:
            kind, direct = "tampers_with_tests", True
        else:
            return
        self.busy = True
        try:
            if self.caused_by_sample(sys._getframe(1), direct):
                self.flag(kind)
        finally:
            self.busy = False

    # -- the program and the calls

    def refer(self, value):
        ref = len(self.objects)
        self.objects[ref] = value
        info = {"type": type(value).__name__}
        try:
            info["always_equal"] = (value == _Unequal()) is True
        except BaseException:  # noqa: BLE001
            pass
        return ("O", ref, info)

    # -- what `_Outbound` and `_Inbound` ask of this side (see them)

    program_module = "__main__"
    callback_type = _Callback

    def own_callback(self, value):
        return ("K", value._index)

    def enum_extra(self, value):
        return self.refer(value)

    callable = refer

    def iterator(self, value):
        return ("G", self.refer(value)[1])

    def program_class(self, module, qualname):
        if module not in ("__main__", "__ckpteval_tests__"):
            return None
        return _program_class(self.namespace, qualname)

    def program_type(self, module, qualname, _ref, _inbound):
        cls = self.program_class(module, qualname)
        return cls if cls is not None else type(self.stand_in(qualname, None, None))

    def stand_in(self, qualname, _ref, _inbound):
        """An instance of a class the tests define and the program does not: one of a class of
        that name with no methods, its attributes alone (what duck typing needs)."""
        if qualname not in self.stand_ins:
            name = qualname.rsplit(".", 1)[-1]
            cls = type(name, (), {"__module__": "__main__", "__qualname__": qualname})
            self.stand_ins[qualname] = cls
        return object.__new__(self.stand_ins[qualname])

    def fill(self, obj, state):
        _fill(obj, state, False)

    def enum_member(self, module, qualname, name, _extra, _inbound):
        import importlib

        if module in ("__main__", "__ckpteval_tests__"):
            cls = _program_class(self.namespace, qualname)
        else:
            cls = importlib.import_module(module)
            for part in qualname.split("."):
                cls = getattr(cls, part)
        return cls.__members__[name]

    def crossing(self, tag, index):
        if type(index) is not int:
            raise TypeError("a malformed reference")
        if tag == "K":
            if index not in self.proxies:
                self.proxies[index] = _Callback(self, index)
            return self.proxies[index]
        if tag == "J":
            return self.pull(index)
        return self.objects[index]

    def pull(self, index):
        """An iterator of the tests', seen from the program (see `_remote_items`)."""
        size = 1
        while True:
            ended, items = self.call_back("next", index, (size,), {})
            yield from items
            if ended:
                return
            size = min(size * 2, _CHUNK)

    def call_back(self, op, index, args, kwargs):
        """Call one of the tests' callables (or take items of an iterator): the tests' process
        runs it and answers; calls the tests make meanwhile are served here first."""
        import functools

        auditing = self.auditing
        self.auditing = False
        try:
            self.channel.send(("cb", op, index, _dump(list(args), self), _dump(kwargs, self)))
            while True:
                try:
                    message = ast.literal_eval(self.channel.receive_raw().decode())
                except _SampleGone:  # the tests ended (they refused this call, or failed)
                    _wait_for_kill()
                if message[0] == "ret":
                    return _load(message[1], self)
                if message[0] == "raise":
                    raise self.tests_exception(message)
                self.channel.send(self.run(functools.partial(self.step, *message)))
        finally:
            self.auditing = auditing

    def tests_exception(self, message):
        """What one of the tests' objects raised ("raise", name, text, classes, args), as an
        exception of this process: the first class of its MRO this process has (a builtin, one
        of a module imported here, one the program defines as the prompt does), made with its
        args, so that `except requests.RequestException` or `except CalledProcessError as e:
        e.returncode` see it as in one process."""
        import builtins

        classes = message[3] if len(message) > 4 else [("builtins", message[1])]
        cls = Exception
        for module, qualname in classes:
            if module == "__ckpteval_tests__":
                found = _program_class(self.namespace, qualname)
            else:
                found = builtins if module == "builtins" else sys.modules.get(module)
                for part in qualname.split("."):
                    found = getattr(found, part, None)
            if isinstance(found, type) and issubclass(found, Exception):
                cls = found
                break
        args = tuple(_load(message[4], self)) if len(message) > 4 else (message[2],)
        try:
            return cls(*args)
        except Exception:  # noqa: BLE001 - an __init__ that wants other arguments
            exc = cls.__new__(cls)
            exc.args = args
            return exc

    def patch(self, kind, module, qualname, attribute, value):
        """Start a patch of the tests' here (`_Tests.patch`): `attribute` of the module, the
        class, the program's class or the program's own names becomes `value`; returns its
        number (None: no such target here)."""
        import importlib

        if kind == "program" and not qualname:
            target = self.namespace
        elif kind == "program":
            target = _program_class(self.namespace, qualname)
        else:
            target = importlib.import_module(module)
            for part in qualname.split(".") if kind == "class" else ():
                target = getattr(target, part)
        if target is None:
            return None
        number = max(self.patches, default=-1) + 1
        if target is self.namespace:
            self.patches[number] = (target, attribute, target.get(attribute, _UNKNOWN))
            target[attribute] = value
        else:
            self.patches[number] = (target, attribute, target.__dict__.get(attribute, _UNKNOWN))
            setattr(target, attribute, value)
        return number

    def patch_environ(self, values, clear):
        number = max(self.patches, default=-1) + 1
        self.patches[number] = (os.environ, None, dict(os.environ))
        if clear:
            os.environ.clear()
        os.environ.update(values)
        return number

    def unpatch(self, number):
        target, attribute, original = self.patches.pop(number)
        if attribute is None:
            target.clear()
            target.update(original)
        elif target is self.namespace:
            if original is _UNKNOWN:
                target.pop(attribute, None)
            else:
                target[attribute] = original
        elif original is _UNKNOWN:
            delattr(target, attribute)
        else:
            setattr(target, attribute, original)

    def lookup(self, ref, _info):
        if type(ref) is tuple and len(ref) == 2 and ref[0] == "name":
            if ref[1] not in self.namespace:
                raise NameError(f"name {ref[1]!r} is not defined")
            return self.namespace[ref[1]]
        return self.objects[ref]

    def failure(self, exc):
        """The reply for an exception the program raised: its name, traceback, classes (its
        MRO, by module and qualname, for the tests to find the first they know), args and
        instance attributes (as data, objects by reference)."""
        try:
            text = _format_failure(exc)
        except BaseException:  # noqa: BLE001
            text = type(exc).__name__
        reply = ("err", type(exc).__name__, list(self.hacks), text[-3000:])
        try:
            classes = [
                (str(c.__module__), str(c.__qualname__))
                for c in type(exc).__mro__
                if issubclass(c, BaseException)
            ]
            args = _dump(tuple(exc.args), self)
            attrs = {
                k: v
                for k, v in getattr(exc, "__dict__", {}).items()
                if type(k) is str and not k.startswith("__")
            }
            attrs.update(_builtin_exception_fields(exc))
            return (*reply, classes, args, _dump(attrs, self))
        except BaseException:  # noqa: BLE001 - args the channel cannot carry: the name only
            return reply

    def run(self, step):
        """Run one step of the program's, audited; its reply."""
        self.auditing = True
        self.mutated.clear()
        try:
            value = step()
            self.auditing = False
            return ("ok", _dump(value, self), list(self.hacks), list(self.mutated))
        except SystemExit as exc:
            self.auditing = False
            return ("exit", exc.code if isinstance(exc.code, (int, str, type(None))) else 1)
        except MemoryError:
            self.auditing = False
            return ("err", "MemoryError", list(self.hacks), "MemoryError")
        except BaseException as exc:  # noqa: BLE001
            self.auditing = False
            return self.failure(exc)

    def changed(self, args, kwargs, sent_args, sent_kwargs):
        """The lists, dicts, sets and numpy arrays among the arguments that the call changed
        (plain data only), and the instances of the program's classes (as they are now), for
        the tests to see the change (a test may check an in-place sort, a shuffled array, or a
        linked list reordered)."""
        sent_args = sent_args[1] if sent_args[0] == "X" else sent_args
        sent_kwargs = sent_kwargs[1] if sent_kwargs[0] == "X" else sent_kwargs
        try:
            pairs = [(i, a, sent_args[1][i]) for i, a in enumerate(args)]
            pairs += [(k, v, sent[1]) for (k, v), sent in zip(kwargs.items(), sent_kwargs[1])]
            for key, value, before in pairs:
                if type(value) in (list, dict, set) or _is_array(value):
                    after = _encode(value, _PlainOnly())
                    if after != before:
                        self.mutated.append((key, after))
                elif type(before) is tuple and before[:1] == ("P",):
                    self.mutated.append((key, _dump(value, self)))
        except (TypeError, IndexError, RecursionError):
            pass

    def program(self):
        source = _read_small(self.path).decode("utf-8")  # compile() reads \r\n and \r as \n
        exec(compile(source, self.path, "exec", dont_inherit=True), self.namespace)

    def names(self, *wanted):
        found = {}
        for name in wanted:
            if name not in self.namespace:
                continue
            value = self.namespace[name]
            if type(value).__name__ == "module":
                found[name] = ("module", value.__name__)
            elif callable(value):
                found[name] = "callable"
            else:
                found[name] = ("value", value)
        return found

    def step(self, op, target, sent_args, sent_kwargs):
        """One request of the tests': names, or an operation on one of the program's objects."""
        args, kwargs = _load(sent_args, self), _load(sent_kwargs, self)
        if op in _REQUESTS:
            return getattr(self, _REQUESTS[op])(*args)
        obj = self.lookup(target, None)
        if op == "call":
            result = obj(*args, **kwargs)
            self.auditing = False
            self.changed(args, kwargs, sent_args, sent_kwargs)
            return result
        if op == "bool":
            return bool(obj)
        if op == "len":
            return len(obj)
        if op == "list":
            return list(obj)
        if op == "next":
            if target in self.pending:
                raise self.pending.pop(target)
            size = args[0] if len(args) == 1 and type(args[0]) is int else 1
            items = []
            try:
                while len(items) < min(max(size, 1), _CHUNK):
                    items.append(next(obj))
            except StopIteration:
                return (True, items)
            except Exception as exc:  # noqa: BLE001 - raised after some items: comes after them
                if not items:
                    raise
                self.pending[target] = exc
            return (False, items)
        if op == "getitem":
            return obj[args[0]]
        if op == "getattr":
            return getattr(obj, args[0])
        if op == "str":
            return str(obj)
        raise TypeError(f"unknown request {op!r}")


def _builtin_exception_fields(exc):
    """The fields of `exc` that built-in exception classes keep outside `__dict__` and `args`
    (OSError's `filename`, UnicodeError's `start`, SyntaxError's `lineno`, ...)."""
    fields = {}
    for cls in type(exc).__mro__:
        if cls.__module__ != "builtins" or cls is BaseException:
            continue
        for name, member in vars(cls).items():
            kind = type(member).__name__
            if kind in ("getset_descriptor", "member_descriptor") and not name.startswith("__"):
                try:
                    fields.setdefault(name, getattr(exc, name))
                except AttributeError:  # unset (OSError.characters_written)
                    pass
    return fields


#: Audit events only a program that tampers with the tests' machinery raises.
_TAMPERING_EVENTS = (
    "sys._getframe",
    "sys._current_frames",
    "gc.get_objects",
    "gc.get_referrers",
    "gc.get_referents",
    "sys.settrace",
    "sys.setprofile",
    "sys.addaudithook",
)


class _Unequal:
    """Equal to nothing but itself: what a sample's object is compared with to see whether it
    claims to equal anything."""

    __eq__ = object.__eq__
    __hash__ = object.__hash__

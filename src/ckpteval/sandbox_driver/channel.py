"""The channel between a judged run's two processes: messages, and the values and exceptions
that cross it (`_encode`/`_load`, `_Outbound`/`_Inbound`); see `judged`.
"""

import collections
import datetime
import math
import os
import sys

from .arrays import _NUMERIC_TAGS, _decode_numeric, _encode_numeric

_MAX_MESSAGE = 64 << 20  # bytes of one reply; more is a failure of the sample


_BIG_INT_BITS = 12000  # ints above this go as hex: decimal parsing is capped (and quadratic)


class _SampleGone(BaseException):
    """The sample process ended (exit, crash, kill), raised what no test may catch
    (KeyboardInterrupt...) or broke the protocol while the tests ran: the sample fails whatever
    the tests catch, as in one process, where its exit ends the tests. A BaseException, so that
    `except Exception:` in the tests lets it through; `_Tests` also keeps the first one and
    `_run_tests` fails the sample on it even if the tests caught it (`except:`).
    `forged`: what came was no reply the sample process's loop writes: someone else wrote it."""

    def __init__(self, message, forged=False):
        super().__init__(message)
        self.forged = forged


class _SampleExited(_SampleGone):
    """The sample raised SystemExit / called exit() while the tests called it."""


class _Channel:
    """Length-prefixed `repr`s of literals over a pair of pipes."""

    def __init__(self, read_fd, write_fd):
        self.read_fd, self.write_fd = read_fd, write_fd

    def send(self, message):
        data = repr(message).encode("utf-8", "surrogatepass")
        data = len(data).to_bytes(8, "big") + data
        view = memoryview(data)
        while view:
            view = view[os.write(self.write_fd, view) :]

    def receive_raw(self):
        header = self._exactly(8)
        size = int.from_bytes(header, "big")
        if size > _MAX_MESSAGE:
            raise _SampleGone(f"a reply of {size} bytes", size > 1 << 40)
        return self._exactly(size)

    def _exactly(self, size):
        chunks, got = [], 0
        while got < size:
            chunk = os.read(self.read_fd, min(size - got, 1 << 20))
            if not chunk:
                raise _SampleGone("the sample process ended while the tests ran")
            chunks.append(chunk)
            got += len(chunk)
        return b"".join(chunks)


#: How deep `_encode` nests one tree: deeper values go out of line (see `_Outbound`), so a
#: message's literal stays within what `ast.literal_eval` parses (200 nested brackets; a level
#: takes up to 3) and no structure's depth is bounded by a recursion limit.
_SPILL_DEPTH = 48
_MAX_SPILLS = 1 << 14  # so a depth of 786k levels; a list that contains itself ends here

#: Built-in types and functions that cross as themselves (`defaultdict(list)`, `key=len`).
_BUILTIN_TYPES = (
    "bool",
    "bytes",
    "complex",
    "dict",
    "float",
    "frozenset",
    "int",
    "list",
    "object",
    "set",
    "str",
    "tuple",
)
_BUILTIN_FUNCTIONS = ("abs", "len", "max", "min", "ord", "chr", "repr", "round", "sorted", "sum")


def _encode(value, out, depth=0):  # noqa: C901 - one branch per plain type the channel carries, kept flat to audit
    """Plain data as a tree of literals, exact types first (the fast path); anything else
    through `out.rich` (tagged values, program classes, opaque references: `_Outbound`)."""
    if depth > _SPILL_DEPTH:
        return out.spill(value)
    kind = type(value)
    if value is None or kind is bool or kind is str:
        return value
    if kind is int:
        return value if value.bit_length() <= _BIG_INT_BITS else ("I", format(value, "x"))
    if kind is float:
        return value if math.isfinite(value) else ("F", repr(value))
    if kind is list:
        return ("L", [_encode(item, out, depth + 1) for item in value])
    if kind is tuple:
        return ("T", [_encode(item, out, depth + 1) for item in value])
    if kind is dict:
        return (
            "D",
            [(_encode(k, out, depth + 1), _encode(v, out, depth + 1)) for k, v in value.items()],
        )
    if kind is bytes:
        return value
    if kind is set or kind is frozenset:
        return ("S" if kind is set else "Z", [_encode(item, out, depth + 1) for item in value])
    if kind is complex:
        return ("C", _encode(value.real, out), _encode(value.imag, out))
    if kind is range:
        return ("R", value.start, value.stop, value.step)
    if isinstance(value, bool):
        return bool(value)
    module = kind.__module__
    if module in ("numpy", "pandas") or module.startswith("pandas."):
        tree = _encode_numeric(value, lambda item: _encode(item, out, depth + 2))
        if tree is not None:
            return tree
    if module in _TAGGED_MODULES:
        return out.rich(value, depth)
    fields = getattr(kind, "_fields", None)
    if isinstance(value, tuple) and type(fields) is tuple and all(type(f) is str for f in fields):
        return (
            "N",
            str(kind.__name__),
            list(fields),
            [_encode(item, out, depth + 1) for item in tuple.__iter__(value)],
        )
    if isinstance(value, (list, tuple, set, frozenset)):
        tag = (
            "L"
            if isinstance(value, list)
            else "T"
            if isinstance(value, tuple)
            else "S"
            if isinstance(value, set)
            else "Z"
        )
        base = list if tag == "L" else tuple if tag == "T" else set if tag == "S" else frozenset
        return (tag, [_encode(item, out, depth + 1) for item in base.__iter__(value)])
    if isinstance(value, dict):
        return (
            "D",
            [
                (_encode(k, out, depth + 1), _encode(v, out, depth + 1))
                for k, v in dict.items(value)
            ],
        )
    enum = sys.modules.get("enum")
    if enum is not None and isinstance(value, enum.Enum):  # an IntEnum's member is an int too
        return out.rich(value, depth)
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return _encode(int.__index__(value), out)
    if isinstance(value, float):
        return _encode(float.__float__(value), out)
    if isinstance(value, bytes):
        return bytes(value)
    if module == "fractions" and kind.__name__ == "Fraction":
        return ("Q", _encode(value.numerator, out), _encode(value.denominator, out))
    if module == "decimal" and kind.__name__ == "Decimal":
        return ("M", str(value))
    return out.rich(value, depth)


def _pairs(mapping, out, depth):
    return [(_encode(k, out, depth + 1), _encode(v, out, depth + 1)) for k, v in mapping.items()]


def _encode_date(value, out, depth):
    return ("Yd", value.year, value.month, value.day)


def _encode_tz(tz):
    """A fixed-offset `datetime.timezone` as (days, seconds, microseconds, name); another
    tzinfo (its code decides its offsets) makes the value opaque."""
    if tz is None:
        return None
    if type(tz) is not datetime.timezone:
        raise TypeError("a tzinfo other than datetime.timezone")
    offset = tz.utcoffset(None)
    name = tz.tzname(None)
    name = None if tz is datetime.UTC else name
    return (offset.days, offset.seconds, offset.microseconds, name)


def _encode_datetime(value, out, depth):
    fields = (value.year, value.month, value.day, value.hour, value.minute, value.second)
    return ("Yt", *fields, value.microsecond, value.fold, _encode_tz(value.tzinfo))


def _encode_time(value, out, depth):
    fields = (value.hour, value.minute, value.second, value.microsecond, value.fold)
    return ("Yh", *fields, _encode_tz(value.tzinfo))


def _encode_timedelta(value, out, depth):
    return ("Yz", value.days, value.seconds, value.microseconds)


def _encode_deque(value, out, depth):
    items = [_encode(item, out, depth + 1) for item in value]
    return ("Cq", items, value.maxlen)


def _encode_counter(value, out, depth):
    return ("Cc", _pairs(value, out, depth))


def _encode_ordered(value, out, depth):
    return ("Co", _pairs(value, out, depth))


def _encode_defaultdict(value, out, depth):
    return ("Cd", _encode(value.default_factory, out, depth + 1), _pairs(value, out, depth))


def _encode_keys(value, out, depth):
    return ("Vk", [_encode(item, out, depth + 1) for item in value])


def _encode_values(value, out, depth):
    return ("Vv", [_encode(item, out, depth + 1) for item in value])


def _encode_items(value, out, depth):
    return ("Vi", [(_encode(k, out, depth + 1), _encode(v, out, depth + 1)) for k, v in value])


#: Standard-library value types that cross by tag, by exact type (a subclass's code is its own:
#: it stays opaque). Their state is read through the C type's own accessors.
_TAGGED = {
    datetime.date: _encode_date,
    datetime.datetime: _encode_datetime,
    datetime.time: _encode_time,
    datetime.timedelta: _encode_timedelta,
    collections.deque: _encode_deque,
    collections.Counter: _encode_counter,
    collections.OrderedDict: _encode_ordered,
    collections.defaultdict: _encode_defaultdict,
    type({}.keys()): _encode_keys,
    type({}.values()): _encode_values,
    type({}.items()): _encode_items,
    type(collections.OrderedDict().keys()): _encode_keys,
    type(collections.OrderedDict().values()): _encode_values,
    type(collections.OrderedDict().items()): _encode_items,
}
_TAGGED_MODULES = ("datetime", "collections")


class _PlainOnly:
    """An `_encode` target that takes plain data only (what `_SampleServer.changed` compares)."""

    def spill(self, value):
        raise TypeError("not plain data")

    rich = spill


class _Outbound:
    """One message being encoded by `side` (`_Tests` or `_SampleServer`). What `_encode` does not
    carry inline goes through `rich`: a standard-library value by tag (`_TAGGED`), an Enum member
    by class and name, an instance of a class the program defines (the prompt's, on both sides)
    by class and state, an iterator as a lazy reference, a callable of the tests' as a callback,
    anything else as the side's opaque reference. Instances and values deeper than
    `_SPILL_DEPTH` go out of line, into `work`: entry k is ("s", tree) for a spilled value (its
    place says ("^", k)) or ("p", module, qualname, ref, [(name, tree), ...]) for an instance
    (its places say ("P", k); `memo` gives one object one entry, so shared and cyclic references
    survive). A message with entries is ("X", tree, entries); an entry refers only to later
    entries and to instances, so `_load` decodes them last to first without recursing."""

    __slots__ = ("side", "work", "memo", "spills")

    def __init__(self, side):
        self.side = side
        self.work = []
        self.memo = {}
        self.spills = 0

    def spill(self, value):
        self.spills += 1
        if self.spills > _MAX_SPILLS:
            raise ValueError("a value nested too deeply, or a list or dict that contains itself")
        self.work.append(("s", value))
        return ("^", len(self.work) - 1)

    def rich(self, value, depth):
        kind = type(value)
        tagged = _TAGGED.get(kind)
        if tagged is not None:
            try:
                return tagged(value, self, depth)
            except TypeError:  # a tzinfo with code of its own
                return self.side.refer(value)
        side = self.side
        if kind is side.callback_type:
            return side.own_callback(value)
        enum = sys.modules.get("enum")
        if enum is not None and isinstance(value, enum.Enum):
            return ("E", kind.__module__, kind.__qualname__, value._name_, side.enum_extra(value))
        if kind is type and value.__module__ == "builtins" and value.__name__ in _BUILTIN_TYPES:
            return ("B", value.__name__)
        if kind is type(len) and value.__name__ in _BUILTIN_FUNCTIONS:
            import builtins

            if getattr(builtins, value.__name__) is value:  # `key=len`: no callback per call
                return ("B", value.__name__)
        if isinstance(value, type) and value.__module__ == side.program_module:
            return ("C", value.__module__, value.__qualname__, side.enum_extra(value))
        if (
            kind.__module__ == side.program_module
            and kind.__new__ is object.__new__
            and not isinstance(value, (type, BaseException))
            and not callable(value)
        ):
            return self.instance(value)
        mock = sys.modules.get("unittest.mock")
        if mock is not None and isinstance(value, mock.NonCallableMock):
            return side.callable(value)  # `iter(mock)` below would be a call its record shows
        if getattr(kind, "__next__", None) is not None and iter(value) is value:
            return side.iterator(value)
        if callable(value) and not isinstance(value, type):
            return side.callable(value)
        return side.refer(value)

    def instance(self, value):
        key = id(value)
        if key in self.memo:
            return ("P", self.memo[key])
        self.work.append(("p", value))
        self.memo[key] = len(self.work) - 1
        return ("P", len(self.work) - 1)

    def finish(self, tree):
        """The message with out-of-line entries: ("X", tree, entries)."""
        work = self.work
        entries = []
        for what, value in work:  # grows while it runs: entries add entries
            if what == "s":
                entries.append(("s", _encode(value, self)))
            else:
                kind = type(value)
                state = [(name, _encode(item, self, 1)) for name, item in _state(value)]
                ref = self.side.refer(value) if self.side.program_module == "__main__" else None
                entries.append(("p", kind.__module__, kind.__qualname__, ref, state))
        return ("X", tree, entries)


def _dump(value, side):
    """`value` encoded by `side`, as one message's tree."""
    out = _Outbound(side)
    tree = _encode(value, out)
    return out.finish(tree) if out.work else tree


def _state(obj):
    """An instance's attributes: its `__dict__`, then its slots that are set."""
    state = list(obj.__dict__.items()) if hasattr(obj, "__dict__") else []
    for cls in type(obj).__mro__:
        slots = cls.__dict__.get("__slots__", ())
        for name in (slots,) if type(slots) is str else slots:
            if name in ("__dict__", "__weakref__"):
                continue
            try:
                state.append((name, object.__getattribute__(obj, name)))
            except AttributeError:  # unset
                pass
    return state


class _Inbound:
    """One message being decoded for `side`: its out-of-line entries (see `_Outbound`), decoded
    so far, and the index of the entry being decoded (an entry refers only to later ones)."""

    __slots__ = ("side", "entries", "floor", "kinds")

    def __init__(self, side):
        self.side = side
        self.entries = ()
        self.kinds = ()
        self.floor = -1

    def entry(self, tag, k):
        if type(k) is not int or not 0 <= k < len(self.entries) or self.kinds[k] != tag:
            raise _SampleGone("a malformed reference in a reply")
        if tag == "s" and k <= self.floor:
            raise _SampleGone("a reply's entry refers back")
        return self.entries[k]


def _load(tree, side, root=None):
    """The value `_dump` made, decoded for `side` (untrusted: see `_decode`). `root`: an
    instance the message's first entry stands for (a call changed it: `_Tests._mutate`)."""
    kind = type(tree)
    if tree is None or kind is bool or kind is int or kind is float or kind is str:
        return tree
    inbound = _Inbound(side)
    if kind is not tuple or not tree or tree[0] != "X":
        return _decode(tree, inbound)
    if len(tree) != 3 or type(tree[2]) is not list:
        raise _SampleGone("a malformed reply")
    entries = tree[2]
    if not all(type(e) is tuple and e and e[0] in ("s", "p") for e in entries):
        raise _SampleGone("a malformed entry in a reply")
    inbound.kinds = [e[0] for e in entries]
    inbound.entries = [None] * len(entries)
    for k, entry in enumerate(entries):  # instances first: entries may refer to any of them
        if entry[0] == "p":
            inbound.entries[k] = _shell(entry, inbound)
    if root is not None and tree[1] == ("P", 0) and type(inbound.entries[0]) is type(root):
        root.__dict__.clear()
        inbound.entries[0] = root
    for k in range(len(entries) - 1, -1, -1):
        inbound.floor = k
        entry = entries[k]
        if entry[0] == "s" and len(entry) == 2:
            inbound.entries[k] = _decode(entry[1], inbound)
        elif entry[0] == "p" and type(entry[4]) is list:
            state = []
            for pair in entry[4]:
                if type(pair) is not tuple or len(pair) != 2 or type(pair[0]) is not str:
                    raise _SampleGone("a malformed instance in a reply")
                state.append((pair[0], _decode(pair[1], inbound)))
            side.fill(inbound.entries[k], state)
        else:
            raise _SampleGone("a malformed entry in a reply")
    inbound.floor = -1
    return _decode(tree[1], inbound)


def _shell(entry, inbound):
    """The instance an entry ("p", module, qualname, ref, state) becomes, still without state:
    one of the class the receiving side's program defines by that name, made without calling
    its `__init__`, or (the tests' side, no such class) the sample's object as a reference."""
    if len(entry) != 5 or type(entry[1]) is not str or type(entry[2]) is not str:
        raise _SampleGone("a malformed instance in a reply")
    cls = inbound.side.program_class(entry[1], entry[2])
    if cls is None:
        return inbound.side.stand_in(entry[2], entry[3], inbound)
    return object.__new__(cls)


def _fill(obj, state, trusted_class):
    """Set an instance's attributes as pickle does (its `__dict__`, or its slots), calling none
    of its code. A class the side trusts (the tests' copy of the prompt's) gets data only: a
    name that its class binds to a method or a descriptor (an instance attribute would shadow
    the prompt's method with the sample's callable) is a malformed reply."""
    for name, value in state:
        if not name.isidentifier() or name.startswith("__"):
            raise _SampleGone("a malformed attribute name in a reply")
        static = None
        for cls in type(obj).__mro__:
            if name in cls.__dict__:
                static = cls.__dict__[name]
                break
        if type(static).__name__ == "member_descriptor":
            object.__setattr__(obj, name, value)
        elif (
            trusted_class
            and static is not None
            and (callable(static) or hasattr(type(static), "__get__"))
        ):
            raise _SampleGone(f"a reply's instance state shadows its class's {name!r}")
        elif hasattr(obj, "__dict__"):
            obj.__dict__[name] = value
        else:
            raise _SampleGone(f"a reply's instance has no attribute {name!r}")


def _decode_tz(tz):
    if tz is None:
        return None
    if type(tz) is not tuple or len(tz) != 4 or type(tz[3]) not in (str, type(None)):
        raise TypeError("a malformed tzinfo")
    offset = datetime.timedelta(*_ints(tz[:3]))
    if tz[3] is None:
        return datetime.timezone(offset)
    return datetime.timezone(offset, tz[3])


def _decode_pairs(pairs, inbound, depth):
    if type(pairs) is not list:
        raise _SampleGone("a malformed mapping in a reply")
    result = []
    for pair in pairs:
        if type(pair) is not tuple or len(pair) != 2:
            raise _SampleGone("a malformed mapping in a reply")
        result.append((_decode(pair[0], inbound, depth + 1), _decode(pair[1], inbound, depth + 1)))
    return result


def _decode_items(items, inbound, depth):
    if type(items) is not list:
        raise _SampleGone("a malformed container in a reply")
    return [_decode(item, inbound, depth + 1) for item in items]


def _ints(values):
    if not all(type(x) is int for x in values):
        raise TypeError("fields must be ints")
    return values


def _decode_rich(tag, rest, inbound, depth):  # noqa: C901 - the mirror of `_Outbound.rich`, kept flat to audit
    """The tagged values `_Outbound.rich` made; `_UNKNOWN` for a tag it never makes."""
    side = inbound.side
    if tag == "^" and len(rest) == 1:
        return inbound.entry("s", rest[0])
    if tag == "P" and len(rest) == 1:
        return inbound.entry("p", rest[0])
    if tag == "Yd" and len(rest) == 3:
        return datetime.date(*_ints(rest))
    if tag == "Yt" and len(rest) == 9:
        return datetime.datetime(
            *_ints(rest[:7]), tzinfo=_decode_tz(rest[8]), fold=_ints(rest[7:8])[0]
        )
    if tag == "Yh" and len(rest) == 6:
        return datetime.time(*_ints(rest[:4]), tzinfo=_decode_tz(rest[5]), fold=_ints(rest[4:5])[0])
    if tag == "Yz" and len(rest) == 3:
        return datetime.timedelta(*_ints(rest))
    if tag == "Cq" and len(rest) == 2 and (rest[1] is None or type(rest[1]) is int):
        return collections.deque(_decode_items(rest[0], inbound, depth), rest[1])
    if tag == "Cc" and len(rest) == 1:
        return collections.Counter(dict(_decode_pairs(rest[0], inbound, depth)))
    if tag == "Co" and len(rest) == 1:
        return collections.OrderedDict(_decode_pairs(rest[0], inbound, depth))
    if tag == "Cd" and len(rest) == 2:
        factory = _decode(rest[0], inbound, depth + 1)
        if factory is not None and not callable(factory):
            raise TypeError("a defaultdict's factory must be callable")
        return collections.defaultdict(factory, _decode_pairs(rest[1], inbound, depth))
    if tag == "Vk" and len(rest) == 1:
        return dict.fromkeys(_decode_items(rest[0], inbound, depth)).keys()
    if tag == "Vv" and len(rest) == 1:
        return dict(enumerate(_decode_items(rest[0], inbound, depth))).values()
    if tag == "Vi" and len(rest) == 1:
        return dict(_decode_pairs(rest[0], inbound, depth)).items()
    if tag == "B" and len(rest) == 1 and rest[0] in _BUILTIN_TYPES + _BUILTIN_FUNCTIONS:
        import builtins

        return getattr(builtins, rest[0])
    if tag == "C" and len(rest) == 3 and type(rest[0]) is str and type(rest[1]) is str:
        return side.program_type(rest[0], rest[1], rest[2], inbound)
    if tag == "E" and len(rest) == 4 and type(rest[0]) is str and type(rest[1]) is str:
        return side.enum_member(rest[0], rest[1], rest[2], rest[3], inbound)
    if tag in ("G", "K", "J") and len(rest) == 1:
        return side.crossing(tag, rest[0])
    if tag in _NUMERIC_TAGS:
        try:
            return _decode_numeric(tag, rest, lambda item: _decode(item, inbound, depth + 2))
        except _SampleGone:
            raise
        except Exception as exc:  # noqa: BLE001 - numpy's or pandas's checks of the sender's data
            raise _SampleGone(f"a malformed {tag} value in a reply: {exc}"[:300]) from None
    return _UNKNOWN


_UNKNOWN = object()


def _decode(tree, inbound, depth=0):  # noqa: C901 - the mirror of _encode, kept flat to audit
    """The value `_encode` made (untrusted input: anything unexpected is a `_SampleGone`)."""
    if depth > 400:
        raise _SampleGone("a reply nested too deeply")
    kind = type(tree)
    if tree is None or kind in (bool, int, float, str, bytes):
        return tree
    if kind is not tuple or not tree or type(tree[0]) is not str:
        raise _SampleGone(f"a malformed reply ({kind.__name__})")
    tag, rest = tree[0], tree[1:]
    try:
        if tag in ("L", "T", "S", "Z") and len(rest) == 1 and type(rest[0]) is list:
            items = [_decode(item, inbound, depth + 1) for item in rest[0]]
            return {"L": list, "T": tuple, "S": set, "Z": frozenset}[tag](items)
        if tag == "D" and len(rest) == 1 and type(rest[0]) is list:
            result = {}
            for pair in rest[0]:
                if type(pair) is not tuple or len(pair) != 2:
                    raise _SampleGone("a malformed dict in a reply")
                result[_decode(pair[0], inbound, depth + 1)] = _decode(pair[1], inbound, depth + 1)
            return result
        if (
            tag == "N"
            and len(rest) == 3
            and type(rest[0]) is str
            and type(rest[1]) is list
            and type(rest[2]) is list
            and len(rest[1]) == len(rest[2]) <= 255
        ):
            return _named_tuple(rest[0], tuple(rest[1]))(
                *[_decode(item, inbound, depth + 1) for item in rest[2]]
            )
        if tag == "I" and len(rest) == 1 and type(rest[0]) is str:
            return int(rest[0], 16)
        if tag == "F" and len(rest) == 1 and rest[0] in ("inf", "-inf", "nan"):
            return float(rest[0])
        if tag == "C" and len(rest) == 2 and all(type(x) in (int, float) for x in rest):
            return complex(rest[0], rest[1])
        if tag == "R" and len(rest) == 3 and all(type(x) is int for x in rest):
            return range(*rest)
        if tag == "O" and len(rest) == 2:
            return inbound.side.lookup(rest[0], rest[1])
        if tag == "Q" and len(rest) == 2 and all(type(x) is int for x in rest) and rest[1]:
            import fractions

            return fractions.Fraction(rest[0], rest[1])
        if tag == "M" and len(rest) == 1 and type(rest[0]) is str and len(rest[0]) < 10000:
            import decimal

            return decimal.Decimal(rest[0])
        value = _decode_rich(tag, rest, inbound, depth)
        if value is not _UNKNOWN:
            return value
    except (TypeError, ValueError, OverflowError) as exc:  # an unhashable key, a bad date, ...
        raise _SampleGone(f"a malformed reply: {exc}") from None
    raise _SampleGone(f"a malformed reply (tag {tag!r})")


def _program_class(namespace, qualname):
    """The class named `qualname` that the code run in `namespace` defines, if it does."""
    parts = qualname.split(".")
    cls = namespace.get(parts[0])
    for part in parts[1:]:
        cls = getattr(cls, part, None) if isinstance(cls, type) else None
    if not isinstance(cls, type) or cls.__module__ != namespace.get("__name__"):
        return None
    return cls if cls.__qualname__ == qualname else None


def _next_items(iterator, args):
    """(ended, up to `args[0]` next items of `iterator`): one chunk of a lazy iterator."""
    if len(args) != 1 or type(args[0]) is not int or not 0 < args[0] <= _CHUNK:
        raise TypeError("a malformed request for items")
    items = []
    try:
        while len(items) < args[0]:
            items.append(next(iterator))
    except StopIteration:
        return (True, items)
    return (False, items)


#: Most items one request takes from a lazy iterator; the first takes 1, each next twice as
#: many: at most about as many items are computed ahead as were asked for.
_CHUNK = 1024


def _remote_items(tests, ref):
    """The sample's iterator, seen from the tests: a generator that asks the sample for its
    items in chunks as it is consumed (a partly consumed or endless one works as in one
    process; an exception the sample's iterator raises comes where its item would)."""
    size = 1
    while True:
        reply = tests.ask("next", ref, (size,))
        if type(reply) is not tuple or len(reply) != 2 or type(reply[1]) is not list:
            tests._gone(_SampleGone("a malformed reply to next"))
        yield from reply[1]
        if reply[0] is True:
            return
        size = min(size * 2, _CHUNK)


_NAMED_TUPLES = {}


def _named_tuple(name, fields):
    """A namedtuple class like the sample's (its fields, its name): equal to tuples like it."""
    if (name, fields) not in _NAMED_TUPLES:
        import collections

        if not all(type(f) is str for f in fields):
            raise TypeError("field names must be strings")
        _NAMED_TUPLES[name, fields] = collections.namedtuple(name, fields)
    return _NAMED_TUPLES[name, fields]


def _format_failure(exc):
    """A traceback without the harness's own frames (its modules run as `sandbox_driver/...`,
    see the package's `program`)."""
    import traceback

    frames = [
        f
        for f in traceback.extract_tb(exc.__traceback__)
        if not f.filename.startswith("sandbox_driver/")
    ]
    lines = traceback.format_list(frames) if frames else []
    head = ["Traceback (most recent call last):\n"] if lines else []
    return "".join(head + lines + traceback.format_exception_only(type(exc), exc))

"""numpy and pandas values crossing between a judged run's two processes by value (see
`channel`): in one process a test's `isinstance(result, np.ndarray)`,
`np.testing.assert_array_equal` or `pd.testing.assert_frame_equal` sees the sample's own array;
an opaque reference fails them all.

An array of a plain dtype crosses as (dtype string, shape, order, its bytes in base64: a
literal half the size of a `bytes` one, parsed twice as fast) and is rebuilt with
`np.frombuffer` after the dtype (no object fields), shape and byte length are checked: the
receiving process runs none of the sender's code and unpickles nothing. An object array crosses
element by element through `channel`'s encoder; a numpy scalar as a 0-d array's bytes; a pandas
Series, Index or DataFrame as its values, index, names and dtypes. What does not fit (a subclass,
a structured dtype, a pandas dtype that its name does not rebuild) stays an opaque reference.

numpy and pandas are never imported here at import time (the driver is standard library only):
a value's sender has them already (it holds the value), and the receiver takes them from
`sys.modules` or imports them then, from the same environment the driver runs with.
"""

import binascii
import math
import re
import sys

#: A plain dtype's string: byte order, kind (no 'O'), item size, a datetime unit.
_DTYPE = re.compile(r"[<>|][biufcmMSUV]\d{1,9}(?:\[\d{0,9}[A-Za-z]{1,3}\])?")
#: A pandas extension dtype's name that `pandas.api.types.pandas_dtype` rebuilds ("str",
#: "Int64", "boolean", "string[python]", "datetime64[ns, UTC]").
_PANDAS_DTYPE = re.compile(r"[A-Za-z][\w\[\], :/+-]{0,63}")
_MAX_DIMS = 64


def _numeric_module(name):
    """numpy or pandas, for a value that says it is one of theirs."""
    module = sys.modules.get(name)
    if module is None:
        import importlib

        try:
            module = importlib.import_module(name)
        except ImportError:
            raise ValueError(f"a {name} value, and no {name} in this process") from None
    return module


def _dtype_spec(np, dtype):
    """`dtype` as a string that rebuilds it, or None (objects inside, structured)."""
    if dtype.hasobject or dtype.fields is not None:
        return None
    spec = dtype.str
    return spec if _DTYPE.fullmatch(spec) and np.dtype(spec) == dtype else None


def _array_dtype(np, spec):
    if type(spec) is not str or not _DTYPE.fullmatch(spec):
        raise ValueError("a malformed dtype")
    dtype = np.dtype(spec)
    if dtype.hasobject or dtype.fields is not None:
        raise ValueError("a dtype with objects")
    return dtype


def _array_shape(shape):
    if (
        type(shape) is not list
        or len(shape) > _MAX_DIMS
        or not all(type(n) is int and 0 <= n < 1 << 40 for n in shape)
    ):
        raise ValueError("a malformed shape")
    return tuple(shape)


def _is_array(value):
    """Whether `value` is a numpy array (no subclass), without importing numpy."""
    kind = type(value)
    return kind.__module__ == "numpy" and kind is getattr(sys.modules.get("numpy"), "ndarray", None)


def _encode_numeric(value, encode):
    """The tree of a numpy or pandas value (`encode`: an item's tree, for object elements), or
    None: it stays a reference."""
    module = type(value).__module__
    if module == "numpy":
        return _encode_numpy(sys.modules.get("numpy"), value, encode)
    if module == "pandas" or module.startswith("pandas."):
        return _encode_pandas(sys.modules.get("pandas"), value, encode)
    return None


def _encode_numpy(np, value, encode):
    if np is None:
        return None
    kind = type(value)
    if kind is np.ndarray:
        return _encode_array(np, value, encode)
    if issubclass(kind, np.generic) and np.dtype(kind).type is kind:  # no subclass of one
        spec = _dtype_spec(np, np.asarray(value).dtype)
        return None if spec is None else ("Ns", spec, np.asarray(value).tobytes())
    return None


def _encode_array(np, value, encode):
    shape = [int(n) for n in value.shape]
    if value.dtype == np.dtype(object):
        return ("No", shape, [encode(item) for item in value.ravel().tolist()])
    spec = _dtype_spec(np, value.dtype)
    if spec is None:
        return None
    order = "F" if value.flags.f_contiguous and not value.flags.c_contiguous else "C"
    data = binascii.b2a_base64(value.tobytes(order), newline=False).decode("ascii")
    return ("Na", spec, shape, order, data)


def _decode_array(np, tree, decode):
    """An array: ("Na", dtype, shape, order, base64) or ("No", shape, element trees)."""
    if type(tree) is not tuple or not tree:
        raise ValueError("a malformed array")
    if tree[0] == "No" and len(tree) == 3:
        shape = _array_shape(tree[1])
        if type(tree[2]) is not list or len(tree[2]) != math.prod(shape):
            raise ValueError("an object array's elements do not fill its shape")
        array = np.empty(len(tree[2]), dtype=object)
        for k, item in enumerate(tree[2]):
            array[k] = decode(item)
        return array.reshape(shape)
    if tree[0] != "Na" or len(tree) != 5:
        raise ValueError("a malformed array")
    dtype, shape, order, data = _array_dtype(np, tree[1]), _array_shape(tree[2]), tree[3], tree[4]
    if order not in ("C", "F") or type(data) is not str:
        raise ValueError("a malformed array")
    data = binascii.a2b_base64(data, strict_mode=True)  # a binascii.Error is a ValueError
    if math.prod(shape) * dtype.itemsize != len(data):
        raise ValueError("an array's bytes do not fill its shape")
    if dtype.itemsize == 0:  # no buffer to read: empty strings
        if math.prod(shape) > 1 << 20:
            raise ValueError("an array of empty strings too large")
        return np.zeros(shape, dtype)
    return np.frombuffer(data, dtype).reshape(shape, order=order).copy(order="K")


def _decode_scalar(np, rest):
    dtype = _array_dtype(np, rest[0])
    if type(rest[1]) is not bytes or len(rest[1]) != dtype.itemsize:
        raise ValueError("a malformed numpy scalar")
    if dtype.itemsize == 0:
        return dtype.type()
    return np.frombuffer(rest[1], dtype)[0]


def _encode_pandas(pd, value, encode):
    """A Series, an Index (a RangeIndex by its range) or a DataFrame (columns as Series), their
    names and dtypes: numpy dtypes by value, a pandas dtype by its name and its elements."""
    if pd is None:
        return None
    if value is pd.NA or value is pd.NaT:  # a missing value of a pandas dtype's elements
        return ("Pm", value is pd.NA)
    kind = type(value)
    if kind is pd.RangeIndex:
        return ("Pr", value.start, value.stop, value.step, encode(value.name))
    if kind is pd.Index:
        values = _encode_pandas_values(pd, value, encode)
        return None if values is None else ("Pi", values, encode(value.name))
    if kind is pd.DatetimeIndex or kind is pd.TimedeltaIndex:  # `assert_frame_equal` checks freq
        values = _encode_pandas_values(pd, value, encode)
        freq = value.freqstr
        if values is None or values[0] != "n" or not (freq is None or type(freq) is str):
            return None
        return ("Pt", values, encode(value.name), freq)
    if kind is pd.Series:
        values, index = (
            _encode_pandas_values(pd, value, encode),
            _encode_pandas(pd, value.index, encode),
        )
        if values is None or index is None:
            return None
        return ("Pe", values, index, encode(value.name))
    if kind is pd.DataFrame:
        index = _encode_pandas(pd, value.index, encode)
        columns = _encode_pandas(pd, value.columns, encode)
        if index is None or columns is None or not value.columns.is_unique:
            return None
        data = [_encode_pandas_values(pd, value.iloc[:, k], encode) for k in range(value.shape[1])]
        return None if None in data else ("Pf", data, index, columns)
    return None


def _encode_pandas_values(pd, value, encode):
    """A Series's or an Index's values: ("n", array tree) for a numpy dtype, ("x", dtype name,
    elements) for a pandas dtype its name rebuilds; None for another (a category's categories)."""
    np = sys.modules.get("numpy")
    dtype = value.dtype
    if isinstance(dtype, np.dtype):
        array = _encode_array(np, value.to_numpy(), encode)
        return None if array is None else ("n", array)
    name = str(dtype)
    try:
        same = _PANDAS_DTYPE.fullmatch(name) and pd.api.types.pandas_dtype(name) == dtype
    except (TypeError, ValueError):
        same = False
    if not same:
        return None
    return ("x", name, [encode(item) for item in value.astype(object).tolist()])


def _decode_pandas_values(pd, tree, decode):
    if type(tree) is not tuple or len(tree) not in (2, 3) or tree[0] not in ("n", "x"):
        raise ValueError("malformed pandas values")
    if tree[0] == "n":
        return _decode_array(_numeric_module("numpy"), tree[1], decode)
    if (
        type(tree[1]) is not str
        or not _PANDAS_DTYPE.fullmatch(tree[1])
        or type(tree[2]) is not list
    ):
        raise ValueError("malformed pandas values")
    return pd.array([decode(item) for item in tree[2]], dtype=pd.api.types.pandas_dtype(tree[1]))


def _decode_pandas(pd, tag, rest, decode):  # noqa: C901 - the mirror of `_encode_pandas`
    if tag == "Pm" and len(rest) == 1 and type(rest[0]) is bool:
        return pd.NA if rest[0] else pd.NaT
    if tag == "Pr" and len(rest) == 4 and all(type(n) is int for n in rest[:3]):
        return pd.RangeIndex(rest[0], rest[1], rest[2], name=_pandas_name(decode(rest[3])))
    if tag == "Pi" and len(rest) == 2:
        return pd.Index(
            _decode_pandas_values(pd, rest[0], decode),
            name=_pandas_name(decode(rest[1])),
            copy=False,
        )
    if (
        tag == "Pt"
        and len(rest) == 3
        and (rest[2] is None or type(rest[2]) is str and len(rest[2]) < 64)
    ):
        values = _decode_pandas_values(pd, rest[0], decode)
        kind = pd.TimedeltaIndex if values.dtype.kind == "m" else pd.DatetimeIndex
        if values.dtype.kind not in "mM":
            raise ValueError("a malformed datetime index")
        return kind(values, freq=rest[2], name=_pandas_name(decode(rest[1])))
    if tag == "Pe" and len(rest) == 3:
        values, index = (
            _decode_pandas_values(pd, rest[0], decode),
            _decode_index(pd, rest[1], decode),
        )
        if len(values) != len(index):
            raise ValueError("a Series's index does not fit its values")
        return pd.Series(values, index=index, name=_pandas_name(decode(rest[2])), copy=False)
    if tag == "Pf" and len(rest) == 3 and type(rest[0]) is list:
        index, columns = _decode_index(pd, rest[1], decode), _decode_index(pd, rest[2], decode)
        data = [_decode_pandas_values(pd, column, decode) for column in rest[0]]
        if len(data) != len(columns) or any(len(column) != len(index) for column in data):
            raise ValueError("a DataFrame's columns do not fit its index")
        if not columns.is_unique:
            raise ValueError("a DataFrame's columns repeat")
        frame = pd.DataFrame(dict(zip(columns, data, strict=True)), index=index)
        frame.columns = columns  # its own Index (name, dtype), not one made from the dict
        return frame
    raise ValueError("a malformed pandas value")


def _decode_index(pd, tree, decode):
    if type(tree) is not tuple or tree[:1] not in (("Pr",), ("Pi",), ("Pt",)):
        raise ValueError("a malformed pandas index")
    return _decode_pandas(pd, tree[0], tree[1:], decode)


def _pandas_name(name):
    """A Series's or an Index's name: a hashable."""
    hash(name)
    return name


#: The tags of `_encode_numeric`'s trees.
_NUMERIC_TAGS = ("Na", "No", "Ns", "Pm", "Pr", "Pi", "Pt", "Pe", "Pf")


def _decode_numeric(tag, rest, decode):
    """The value `_encode_numeric` made, from its tag ("N..." numpy, "P..." pandas) and fields
    (untrusted: anything unexpected is a ValueError or a TypeError)."""
    if tag in ("Na", "No"):
        return _decode_array(_numeric_module("numpy"), (tag, *rest), decode)
    if tag == "Ns" and len(rest) == 2:
        return _decode_scalar(_numeric_module("numpy"), rest)
    return _decode_pandas(_numeric_module("pandas"), tag, rest, decode)

"""_array: what a collective needs from a buffer object: its address, element count and dtype.

Accepted: an int address (or None, a ctypes.c_void_p) with no count or dtype of its own; a torch
tensor (data_ptr, numel, dtype); an object with __cuda_array_interface__ (CuPy, Numba, torch);
one with __dlpack__ (any DLPack producer); one with the buffer protocol (memoryview, ctypes
arrays, NumPy arrays over host memory). Only the memory must be sympool's (the library checks
that on every rank and refuses other memory); the object must be contiguous.
"""

import ctypes
import operator
import re
import sys

from ._lib import as_ptr, bad_value

# sp_dtype_t names, in the header's order (include/sympool/collectives.h; tests/python/test_abi.py
# checks the two agree).
DTYPES = {"int8": 0, "uint8": 1, "int32": 2, "uint32": 3, "int64": 4, "uint64": 5,
          "float16": 6, "bfloat16": 7, "float32": 8, "float64": 9}
ITEMSIZE = {"int8": 1, "uint8": 1, "int32": 4, "uint32": 4, "int64": 8, "uint64": 8,
             "float16": 2, "bfloat16": 2, "float32": 4, "float64": 8}
# C, torch and NumPy spellings of the same types.
_ALIASES = {"half": "float16", "float": "float32", "single": "float32", "double": "float64",
            "int": "int32", "intc": "int32", "uintc": "uint32", "long": "int64",
            "longlong": "int64", "ulonglong": "uint64", "char": "int8", "byte": "int8",
            "ubyte": "uint8", "bf16": "bfloat16", "fp16": "float16", "fp32": "float32",
            "fp64": "float64"}
_KIND = {"f": "float", "i": "int", "u": "uint"}
# struct/buffer-protocol format characters (native sizes on Linux x86-64 and aarch64).
_FORMATS = {"b": "int8", "B": "uint8", "i": "int32", "I": "uint32", "l": "int64", "L": "uint64",
            "q": "int64", "Q": "uint64", "e": "float16", "f": "float32", "d": "float64",
            "c": "int8"}


# The byte-order marks (NumPy's typestr, struct's format) that say "not this machine's order":
# the library reduces native numbers, and byte-swapped ones would come out as other numbers.
_FOREIGN_ORDER = ">!" if sys.byteorder == "little" else "<"
# Python's own number types as a dtype mean what NumPy and torch make of them (np.dtype(float),
# torch.zeros(1, dtype=float)): 64 bits, not the C "float" and "int" their names spell.
_BUILTIN = {float: "float64", int: "int64"}


def _native_order(order, name, what):
    """Refuse a multi-byte type marked with the other byte order."""
    if order and order in _FOREIGN_ORDER and ITEMSIZE[name] > 1:
        raise bad_value(f"{what} is {name} in the other byte order ({order!r}): sympool reduces "
                        f"{sys.byteorder}-endian numbers only")


def dtype_name(dtype):
    """A dtype ("float32", "f4", "<f4", "double", np.float32, np.dtype, torch.float32, ...) ->
    one of DTYPES' names; ValueError (InvalidArgumentError) for a type sympool cannot reduce
    (or one in the other byte order, ">f4" on a little-endian machine)."""
    if isinstance(dtype, type) and dtype in _BUILTIN:
        return _BUILTIN[dtype]
    if isinstance(dtype, str):
        name = dtype
    elif isinstance(getattr(dtype, "name", None), str):  # numpy.dtype
        name = dtype.name
    elif isinstance(dtype, type):  # numpy.float32, the class
        name = dtype.__name__
    else:
        name = str(dtype)  # torch.float32 -> "torch.float32"
    name = name.rsplit(".", 1)[-1].strip()
    if name in _FORMATS:  # one case-sensitive character: "B" is uint8, "b" int8
        name = _FORMATS[name]
    name = name.lower()
    name = _ALIASES.get(name, name)
    m = re.fullmatch(r"([<>|=]?)([fiu])([1248])", name)  # NumPy's typestr: "<f4", "u1"
    if m:
        name = f"{_KIND[m.group(2)]}{8 * int(m.group(3))}"
    if name not in DTYPES:
        raise bad_value(f"dtype {dtype!r} is not one of {', '.join(DTYPES)} (or a NumPy/torch "
                        "spelling of one)")
    # The order a typestr spells, or a numpy.dtype's .byteorder (its .name has none: '>f4' is
    # "float32" there).
    order = m.group(1) if m else getattr(dtype, "byteorder", None)
    if isinstance(order, str):
        _native_order(order, name, f"dtype {dtype!r}")
    return name


def _contiguous(shape, strides, itemsize):
    if strides is None:
        return True
    expect = itemsize
    for n, st in zip(reversed(shape), reversed(strides)):
        if n != 1 and st != expect:
            return False
        expect *= n
    return True


def _prod(shape):
    n = 1
    for d in shape:
        n *= int(d)
    return n


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


_DL_CODES = {0: "int", 1: "uint", 2: "float", 4: "bfloat"}


def _from_dlpack(obj):
    capsule = obj.__dlpack__()
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    # DLManagedTensor starts with its DLTensor; the capsule keeps it alive while we read it and
    # calls its deleter when dropped, since nothing here consumes it.
    t = _DLTensor.from_address(get(capsule, b"dltensor"))
    kind = _DL_CODES.get(t.dtype.code)
    if kind is None or t.dtype.lanes != 1:
        raise bad_value(f"DLPack dtype code {t.dtype.code} x{t.dtype.lanes} is not reducible")
    name = f"{kind}{t.dtype.bits}"
    shape = [t.shape[i] for i in range(t.ndim)]
    strides = None if not t.strides else [t.strides[i] * (t.dtype.bits // 8)
                                          for i in range(t.ndim)]
    if not _contiguous(shape, strides, t.dtype.bits // 8):
        raise bad_value("the DLPack tensor is not contiguous")
    return (t.data or 0) + t.byte_offset, _prod(shape), name


def _from_cai(cai, what, writable):
    """(address, count, dtype) from a __cuda_array_interface__ dict (version 0 to 3), checked:
    a malformed one (no "data", a negative or non-integer extent, strides that are not one
    integer per extent) is a ValueError, not a KeyError, nor a count made of two negative
    extents, nor a layout checked on fewer dimensions than it has. One whose data is marked
    read-only ("data": (ptr, True)) is refused where the collective writes (writable)."""
    try:
        typestr, shape, data = cai["typestr"], tuple(cai["shape"]), cai["data"]
        shape = tuple(operator.index(n) for n in shape)
        addr, readonly = data[0], data[1]
        strides = cai.get("strides")
        if strides is not None:
            strides = tuple(operator.index(n) for n in strides)
    except (KeyError, TypeError, IndexError) as e:
        raise bad_value(f"{what}: malformed __cuda_array_interface__ ({type(e).__name__}: "
                        f"{e})") from None
    if any(n < 0 for n in shape):
        raise bad_value(f"{what}: __cuda_array_interface__'s shape {shape} has a negative extent")
    # _contiguous pairs strides with extents from the last: a shorter tuple would leave the
    # outer dimensions unchecked (the protocol gives one stride per extent).
    if strides is not None and len(strides) != len(shape):
        raise bad_value(f"{what}: malformed __cuda_array_interface__ (strides {strides} for "
                        f"shape {shape})")
    name = dtype_name(typestr)
    if not _contiguous(shape, strides, ITEMSIZE[name]):
        raise bad_value(f"{what} is not contiguous")
    if writable and readonly:
        raise bad_value(f"{what} is read-only (its __cuda_array_interface__ says so), and the "
                        "collective writes it")
    return as_ptr(addr, what), _prod(shape), name


class _PyBuffer(ctypes.Structure):
    """CPython's Py_buffer (the buffer protocol's view; its layout is part of the stable ABI)."""
    _fields_ = [("buf", ctypes.c_void_p), ("obj", ctypes.c_void_p), ("len", ctypes.c_ssize_t),
                ("itemsize", ctypes.c_ssize_t), ("readonly", ctypes.c_int),
                ("ndim", ctypes.c_int), ("format", ctypes.c_char_p),
                ("shape", ctypes.c_void_p), ("strides", ctypes.c_void_p),
                ("suboffsets", ctypes.c_void_p), ("internal", ctypes.c_void_p)]


def _buffer_address(view):
    """The first byte of a contiguous memoryview, read-only ones included (ctypes' from_buffer
    takes writable buffers only, and a collective's send buffer is only read)."""
    api = ctypes.pythonapi
    get, release = api.PyObject_GetBuffer, api.PyBuffer_Release
    get.restype, get.argtypes = ctypes.c_int, [ctypes.py_object, ctypes.POINTER(_PyBuffer),
                                               ctypes.c_int]
    release.restype, release.argtypes = None, [ctypes.POINTER(_PyBuffer)]
    b = _PyBuffer()
    get(view, ctypes.byref(b), 0)  # PyBUF_SIMPLE; pythonapi raises the error it sets, if any
    try:
        return b.buf
    finally:
        release(ctypes.byref(b))


def describe(obj, what, writable=True):
    """(address or None, element count or None, dtype name or None) of a buffer object.
    writable: the collective writes it (recv, or send in place), so a read-only object is
    refused; a buffer only read may be read-only."""
    if obj is None or isinstance(obj, (int, ctypes.c_void_p)):
        return as_ptr(obj, what), None, None
    if hasattr(obj, "data_ptr") and hasattr(obj, "numel") and hasattr(obj, "dtype"):  # torch
        if hasattr(obj, "is_contiguous") and not obj.is_contiguous():
            raise bad_value(f"{what} is not contiguous")
        return as_ptr(obj.data_ptr(), what), int(obj.numel()), dtype_name(obj.dtype)
    cai = getattr(obj, "__cuda_array_interface__", None)
    if cai is not None:
        return _from_cai(cai, what, writable)
    if hasattr(obj, "__dlpack__"):
        ptr, count, name = _from_dlpack(obj)
        return as_ptr(ptr, what), count, dtype_name(name)
    try:
        view = memoryview(obj)
    except TypeError:
        raise TypeError(f"{what} must be an address (int), a tensor or an object with "
                        f"__cuda_array_interface__, __dlpack__ or the buffer protocol, not "
                        f"{type(obj).__name__}") from None
    with view:
        if not view.c_contiguous:
            raise bad_value(f"{what} is not contiguous")
        fmt = view.format.lstrip("@=<>!")
        name = dtype_name(fmt) if fmt in _FORMATS else None
        if name is None or ITEMSIZE[name] != view.itemsize:
            raise bad_value(f"{what}: buffer format {view.format!r} is not a reducible dtype")
        _native_order(view.format[:1], name, f"{what} (buffer format {view.format!r})")
        if view.nbytes == 0:
            return None, 0, name
        if view.readonly and writable:
            raise bad_value(f"{what} is a read-only buffer, and the collective writes it")
        return _buffer_address(view), view.nbytes // view.itemsize, name

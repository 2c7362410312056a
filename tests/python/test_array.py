"""sympool._array: how a collective reads a buffer object's address, count and dtype. Runs
without MPI (the collectives themselves are in mpi/test_world.py)."""

import ctypes

import pytest

from sympool import _array


class CudaArray:
    def __init__(self, cai):
        self.__cuda_array_interface__ = cai


def _cai(**kw):
    d = {"shape": (4,), "typestr": "<f4", "data": (4096, False), "strides": None, "version": 3}
    d.update(kw)
    return {k: v for k, v in d.items() if v is not ...}


@pytest.mark.parametrize("cai", [
    _cai(data=...),               # no "data": was a KeyError
    _cai(shape=...),              # no "shape": a KeyError
    _cai(shape=(-2, -2)),         # two negative extents multiplied into a count of 4
    _cai(shape=(-4,)),
    _cai(shape=(2.5,)),           # a float extent cut to 2
    _cai(data=None),              # a TypeError from subscripting None
    _cai(strides=4),              # not a tuple: a TypeError from reversed()
    _cai(strides=("4",)),         # not an integer: read as "not contiguous"
    # fewer strides than extents: the row stride went unchecked, so a (2, 3) array whose rows
    # lie apart read as 6 contiguous elements
    _cai(shape=(2, 3), strides=(4,)),
    _cai(strides=(4, 4)),         # more strides than extents
], ids=["no-data", "no-shape", "two-negative", "negative", "float", "data-none", "strides-int",
        "strides-str", "strides-short", "strides-long"])
def test_a_malformed_cuda_array_interface_is_a_value_error(cai):
    with pytest.raises(ValueError, match="__cuda_array_interface__"):
        _array.describe(CudaArray(cai), "send")


@pytest.mark.parametrize("obj", [
    (ctypes.c_float.__ctype_be__ * 4)(), (ctypes.c_int64.__ctype_be__ * 2)(),
    CudaArray(_cai(typestr=">f4")), CudaArray(_cai(typestr=">i8"))])
def test_the_other_byte_order_is_refused(obj):
    with pytest.raises(ValueError, match="byte order"):
        _array.describe(obj, "send")


def test_native_orders_and_well_formed_objects_are_taken():
    assert _array.describe(CudaArray(_cai(shape=(2, 3))), "send") == (4096, 6, "float32")
    assert _array.describe(CudaArray(_cai(shape=(0,), data=(0, False))), "send") == \
        (None, 0, "float32")
    assert _array.describe((ctypes.c_float.__ctype_le__ * 4)(), "send")[1:] == (4, "float32")
    assert _array.describe(CudaArray(_cai(typestr=">u1")), "send")[1:] == (4, "uint8")
    assert _array.describe(CudaArray(_cai(typestr="|i1")), "send")[1:] == (4, "int8")
    assert [_array.dtype_name(t) for t in ("<f4", "=f8", "f2", "|u1", ">u1")] == \
        ["float32", "float64", "float16", "uint8", "uint8"]
    with pytest.raises(ValueError, match="byte order"):
        _array.dtype_name(">f8")


class NumpyDtype:
    """What numpy.dtype(">f4") shows: .name has no byte order, .byteorder has it."""

    def __init__(self, name, byteorder):
        self.name, self.byteorder = name, byteorder


def test_a_numpy_dtype_in_the_other_byte_order_is_refused():
    with pytest.raises(ValueError, match="byte order"):
        _array.dtype_name(NumpyDtype("float32", ">"))
    assert _array.dtype_name(NumpyDtype("float32", "=")) == "float32"
    assert _array.dtype_name(NumpyDtype("uint8", "|")) == "uint8"


def test_python_number_types_are_64_bits_as_in_numpy_and_torch():
    # np.dtype(float) is float64 and torch.zeros(1, dtype=float) a float64 tensor: the class's
    # __name__ ("float", "int") read as C's float and int gave float32 and int32.
    assert _array.dtype_name(float) == "float64"
    assert _array.dtype_name(int) == "int64"
    assert _array.dtype_name("float") == "float32"  # the C and torch spelling stays C's
    with pytest.raises(ValueError):
        _array.dtype_name(bool)

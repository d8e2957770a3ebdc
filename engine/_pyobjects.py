"""A list of `bytes` read by a compiled kernel, for engine/_input.py.

Most callers hold keys and values as a Python list of `bytes`. Joining them in
Python (`b"".join` plus a pass of `len()` over the items to learn each one's size)
visits every object twice through the interpreter; the objects lie scattered over
the heap, one cache miss each, and the passes cannot overlap those misses. The
kernels here read the list as CPython lays it out in memory, in one compiled pass
that prefetches the objects a few items ahead:

    list:  [refcnt][type][size: n][ob_item: PyObject **] ...
    bytes: [refcnt][type][size: length][hash][the bytes ...]

Only objects whose type is exactly `bytes` are read; any other item (a bytearray, a
memoryview, a str, a bytes subclass) makes the kernel stop and name its index, and
the caller takes the general path, which also words the errors. The kernels run
holding the GIL (never `nogil`), so no other thread can change the list or free an
item while they read it; the caller holds a reference to the list.

The layout is CPython's (3.11 to 3.13, not free-threaded builds: their object
header is larger); `available()` checks the interpreter and then proves the
offsets on sample lists, byte for byte against `b"".join`, before the fast path is
used at all. Elsewhere (PyPy, another layout) everything takes the general path.
"""

from __future__ import annotations

import functools
import sys
import sysconfig

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.core.errors import TypingError
from numba.extending import intrinsic

from shmcache.ipc import jitcache

jitcache.install()  # before this module's kernels are decorated: it may be the first of the package imported

_SIZE = 16  # PyVarObject.ob_size
_ITEMS = 24  # PyListObject.ob_item
_TYPE = 8  # PyObject.ob_type
_BYTES = 32  # PyBytesObject.ob_sval
# Items prefetched ahead of the one being read. Keys (two lines an object) and values (three)
# take different distances, chosen on 1024 items from a pool of 1M scattered objects
# (bench/README.md "Keys as a list of bytes")
AHEAD_FIXED = 64
AHEAD_VAR = 32
AHEAD_PAIRS = 32  # keys and values read together (gather_pairs)
_VALUE_SPAN = 144  # bytes of a value prefetched from its start: txmeta's longest (141) and more


def _pointer(builder, addr):
    return builder.inttoptr(addr, ir.IntType(8).as_pointer())


@intrinsic
def _peek(typingctx, addr):
    """The int64 at address addr (a word of a live Python object)."""
    if not isinstance(addr, types.Integer):
        raise TypingError("_peek: addr must be an integer")
    sig = types.int64(addr)

    def codegen(context, builder, sig, args):
        p = builder.bitcast(_pointer(builder, args[0]), ir.IntType(64).as_pointer())
        return builder.load(p, align=8)

    return sig, codegen


@intrinsic
def _prefetch_at(typingctx, addr):
    """A read prefetch of the line at address addr (never faults)."""
    sig = types.void(addr)

    def codegen(context, builder, sig, args):
        i8p = ir.IntType(8).as_pointer()
        i32 = ir.IntType(32)
        fnty = ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0")
        builder.call(fn, [_pointer(builder, args[0]), i32(0), i32(3), i32(1)])
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def _copy_from(typingctx, dst, d, addr, n):
    """dst[d:d + n] = the n bytes at address addr (dst a writable 1-d uint8 array; the
    caller checks the bounds)."""
    if not (isinstance(dst, types.Array) and dst.ndim == 1 and dst.dtype == types.uint8 and dst.mutable):
        raise TypingError(f"_copy_from: expected a writable 1-d uint8 array, got {dst}")
    sig = types.void(dst, d, addr, n)

    def codegen(context, builder, sig, args):
        ary = context.make_array(sig.args[0])(context, builder, args[0])
        i = context.cast(builder, args[1], sig.args[1], types.intp)
        i8p = ir.IntType(8).as_pointer()
        pd = builder.bitcast(cgutils.get_item_pointer(context, builder, sig.args[0], ary, [i], wraparound=False), i8p)
        size = context.cast(builder, args[3], sig.args[3], types.int64)
        fnty = ir.FunctionType(ir.VoidType(), [i8p, i8p, ir.IntType(64), ir.IntType(1)])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.memcpy.p0.p0.i64")
        builder.call(fn, [pd, _pointer(builder, args[2]), size, ir.IntType(1)(0)])
        return context.get_dummy_value()

    return sig, codegen


@njit(inline="always")
def _prefetch_key(items, j, size):
    """Prefetch item j's object as a key: its header and its data's end, on the next line 3
    times in 4 for 32-byte keys."""
    obj = _peek(items + 8 * j)
    _prefetch_at(obj)
    _prefetch_at(obj + _BYTES + size - 1)


@njit(inline="always")
def _prefetch_value(items, j):
    """Prefetch item j's object as a value: every line from its header to its data's byte
    _VALUE_SPAN - 1 (its length is not known before the header arrives). An object is
    16-aligned, not 64: three lines from its start reach 112-160 bytes of data, and a txmeta
    value (61-141 B) would end on a fourth, unfetched line for ~1 in 8 values, a demand miss
    each."""
    obj = _peek(items + 8 * j)
    _prefetch_at(obj)
    _prefetch_at(obj + 64)
    _prefetch_at(obj + 128)
    _prefetch_at(obj + _BYTES + _VALUE_SPAN - 1)  # for half of the objects, the line of obj + 128 again


@njit(inline="always")
def _key_at(items, i, bytes_type, size, out, o):
    """Copy item i, if it is a bytes object of `size` bytes, to out[o:o + size] (True);
    else False, nothing copied."""
    obj = _peek(items + 8 * i)
    if _peek(obj + _TYPE) != bytes_type or _peek(obj + _SIZE) != size:
        return False
    _copy_from(out, o, obj + _BYTES, size)
    return True


@njit(inline="always")
def _value_at(items, i, bytes_type, lens, out, p):
    """Copy item i, a bytes object, to out from p and set lens[i] to its length: returns
    the end of the copy; -1 if it is not a bytes object (lens[i] = -1) or does not fit in
    out (lens[i] = its length, nothing copied)."""
    obj = _peek(items + 8 * i)
    if _peek(obj + _TYPE) != bytes_type:
        lens[i] = -1
        return -1
    ln = _peek(obj + _SIZE)
    lens[i] = ln
    if ln > out.shape[0] - p:
        return -1
    _copy_from(out, p, obj + _BYTES, ln)
    return p + ln


@njit(cache=True, _nrt=False)  # holds the GIL: the list cannot change under it
def gather_fixed(list_addr, n, bytes_type, size, stride, out):
    """Copy item i of the list at list_addr (n items, each exactly `bytes` of `size`
    bytes) to out[i * stride:][:size]. Returns -1, or the index of the first item that
    is not a bytes object of that size (out is then partly written)."""
    if _peek(list_addr + _SIZE) != n or out.shape[0] < n * stride:
        return 0
    items = _peek(list_addr + _ITEMS)
    for j in range(min(n, AHEAD_FIXED)):
        _prefetch_key(items, j, size)
    for i in range(n):
        if i + AHEAD_FIXED < n:
            _prefetch_key(items, i + AHEAD_FIXED, size)
        if not _key_at(items, i, bytes_type, size, out, i * stride):
            return i
    return -1


@njit(cache=True, _nrt=False)
def gather_var(list_addr, n, bytes_type, start, lens, out, p):
    """Copy items start.. of the list at list_addr (n items, each exactly `bytes`) back to
    back into out from p, lens[i] = each one's length, in one pass that prefetches the
    objects' first lines ahead. Returns (the index of the first item not copied, the end
    of what was copied): n when all were; an index below n is an item that is not a bytes
    object (lens[i] = -1) or that does not fit in out (lens[i] = its length: the caller
    grows out and calls again from there)."""
    if _peek(list_addr + _SIZE) != n or lens.shape[0] < n:
        return start, p
    items = _peek(list_addr + _ITEMS)
    for j in range(start, min(n, start + AHEAD_VAR)):
        _prefetch_value(items, j)
    for i in range(start, n):
        if i + AHEAD_VAR < n:
            _prefetch_value(items, i + AHEAD_VAR)
        q = _value_at(items, i, bytes_type, lens, out, p)
        if q < 0:
            return i, p
        p = q
    return n, p


@njit(cache=True, _nrt=False)
def gather_pairs(keys_addr, values_addr, n, bytes_type, size, keys_out, start, starts, lens, out, p):
    """gather_fixed of the key list and gather_var of the value list (n items each) in one
    pass from item start, both lists' objects prefetched AHEAD_PAIRS items ahead: a
    set_many of two lists waits on their misses once, not twice. Key i goes to
    keys_out[i * size:], value i to out from starts[i] = the end of value i - 1.
    Returns (the index of the first pair not copied, the end of what was copied, the
    longest value copied): n when all were; -1 if the lists or arrays are not of n items;
    else a key that is not a bytes object of `size` bytes or a value that is
    not bytes (lens[i] = -1), or a value that does not fit in out (lens[i] = its length:
    the caller grows out and calls again from there)."""
    if (_peek(keys_addr + _SIZE) != n or _peek(values_addr + _SIZE) != n or lens.shape[0] < n
            or starts.shape[0] < n or keys_out.shape[0] < n * size):
        return -1, p, 0
    keys = _peek(keys_addr + _ITEMS)
    values = _peek(values_addr + _ITEMS)
    for j in range(start, min(n, start + AHEAD_PAIRS)):
        _prefetch_key(keys, j, size)
        _prefetch_value(values, j)
    longest = 0
    for i in range(start, n):
        if i + AHEAD_PAIRS < n:
            _prefetch_key(keys, i + AHEAD_PAIRS, size)
            _prefetch_value(values, i + AHEAD_PAIRS)
        if not _key_at(keys, i, bytes_type, size, keys_out, i * size):
            lens[i] = -1
            return i, p, longest
        q = _value_at(values, i, bytes_type, lens, out, p)
        if q < 0:
            return i, p, longest
        starts[i] = p
        longest = max(longest, q - p)
        p = q
    return n, p, longest


@functools.lru_cache(maxsize=1)
def available() -> bool:
    """True if this interpreter lays lists and bytes out as the kernels read them: CPython
    3.11-3.13 with the GIL, proven on sample lists against b"".join before first use."""
    if sys.implementation.name != "cpython" or not (3, 11) <= sys.version_info[:2] <= (3, 13):
        return False
    if sysconfig.get_config_var("Py_GIL_DISABLED"):  # a free-threaded build: another object header
        return False
    try:
        fixed = [bytes([i]) * 32 for i in range(40)]
        out = np.zeros(40 * 40, np.uint8)
        if gather_fixed(id(fixed), 40, id(bytes), 32, 40, out) != -1:
            return False
        if out.reshape(40, 40)[:, :32].tobytes() != b"".join(fixed) or out.reshape(40, 40)[:, 32:].any():
            return False
        short = fixed + [b"x" * 31]  # bound to a name: id() of a temporary is a freed object's address
        if gather_fixed(id(short), 41, id(bytes), 32, 40, np.zeros(41 * 40, np.uint8)) != 40:
            return False
        var = [bytes([i]) * (i * 7 % 50) for i in range(40)] + [b""]
        lens = np.zeros(len(var), np.int64)
        got = np.zeros(sum(map(len, var)), np.uint8)
        stop, end = gather_var(id(var), len(var), id(bytes), 0, lens, got[:100], 0)  # stops where out is full
        if not 0 < stop < len(var) or end > 100 or got[:end].tobytes() != b"".join(var[:stop]):
            return False
        if gather_var(id(var), len(var), id(bytes), stop, lens, got, end) != (len(var), len(got)):
            return False
        if lens.tolist() != [len(v) for v in var] or got.tobytes() != b"".join(var):
            return False
        mixed = [b"a", bytearray(b"b")]
        if gather_var(id(mixed), 2, id(bytes), 0, np.zeros(2, np.int64), np.zeros(8, np.uint8), 0) != (1, 1):
            return False
        return _pairs_proven(fixed, var[:40])
    except Exception:  # a build numba cannot compile this for: the general path is always there
        return False


def _pairs_proven(keys: list, values: list) -> bool:
    """gather_pairs gives what b"".join gives, stops where its buffer is full and goes on
    from there, and stops at a key of another size."""
    n = len(keys)
    got_keys = np.zeros(n * 32, np.uint8)
    starts, lens = np.zeros(n, np.int64), np.zeros(n, np.int64)
    got = np.zeros(sum(map(len, values)), np.uint8)
    stop, end, first = gather_pairs(id(keys), id(values), n, id(bytes), 32, got_keys, 0, starts, lens, got[:100], 0)
    if not 0 < stop < n or end > 100 or lens[stop] != len(values[stop]):
        return False
    rest = gather_pairs(id(keys), id(values), n, id(bytes), 32, got_keys, stop, starts, lens, got, end)
    if rest[:2] != (n, len(got)) or max(first, rest[2]) != max(map(len, values)):
        return False
    if got_keys.tobytes() != b"".join(keys) or got.tobytes() != b"".join(values):
        return False
    if lens.tolist() != [len(v) for v in values] or starts.tolist() != (np.cumsum(lens) - lens).tolist():
        return False
    odd, four = keys[:3] + [b"k" * 31], values[:4]  # bound to names: id() of a temporary is a freed object's
    return gather_pairs(id(odd), id(four), 4, id(bytes), 32, got_keys, 0, starts, lens, got, 0)[0] == 3

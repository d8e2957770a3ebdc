"""The two LLVM intrinsics the kernels call that numba does not offer: a software
prefetch and a byte copy between numpy arrays.

prefetch: a lookup is a chain of dependent cache misses (bucket meta -> index slot ->
ring record); one key at a time the CPU waits for each. The kernels first walk the whole
batch issuing prefetches, so the misses of 1024 keys overlap, then do the real work on
warm lines. A prefetch never faults, so a stale hint is harmless.

copy_bytes: a lookup copies each value it finds (61-141 bytes for txmeta) into one
output buffer, a writer each key and value into its record. An explicit loop vectorises
only from 128 bytes (four 32-byte vectors, with a runtime overlap check): shorter spans
go a byte at a time. llvm.memcpy becomes libc's memcpy, a few vector moves. The caller
bounds-checks: nothing here does (memcpy of overlapping ranges is not allowed either).

The addresses come from the typed arrays (never raw integers, see ipc/atomics.py and
docs/design.md "Atomics from numba"), so numba keeps their types and lifetimes; a
destination must be writable, refused at typing time otherwise.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.core.errors import TypingError
from numba.extending import intrinsic


@intrinsic
def prefetch(typingctx, arr, idx, for_write):
    """Hint that arr[idx] will be read (for_write=0) or written (1) soon."""
    if not (isinstance(arr, types.Array) and arr.ndim == 1):
        raise TypingError(f"prefetch: expected a 1-d array, got {arr}")
    if not isinstance(for_write, types.IntegerLiteral):
        raise TypingError("prefetch: for_write must be a literal 0 or 1")
    rw = for_write.literal_value
    sig = types.void(arr, idx, for_write)

    def codegen(context, builder, sig, args):
        ary = context.make_array(sig.args[0])(context, builder, args[0])
        i = context.cast(builder, args[1], sig.args[1], types.intp)
        ptr = cgutils.get_item_pointer(context, builder, sig.args[0], ary, [i], wraparound=False)
        i8p = ir.IntType(8).as_pointer()
        i32 = ir.IntType(32)
        fnty = ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0")
        # locality 3: keep in all cache levels; cache type 1: data
        builder.call(fn, [builder.bitcast(ptr, i8p), i32(rw), i32(3), i32(1)])
        return context.get_dummy_value()

    return sig, codegen


def _check(arr, who: str) -> None:
    if not (isinstance(arr, types.Array) and arr.ndim == 1 and arr.dtype == types.uint8 and arr.layout == "C"):
        raise TypingError(f"copy_bytes: expected a contiguous 1-d uint8 array for {who}, got {arr}")


@intrinsic
def copy_bytes(typingctx, dst, d, src, s, n):
    """dst[d:d + n] = src[s:s + n] for 1-d uint8 arrays (no bounds checks, no overlap)."""
    _check(dst, "dst")
    _check(src, "src")
    if not dst.mutable:
        raise TypingError("copy_bytes: the destination array is read-only")
    sig = types.void(dst, d, src, s, n)

    def codegen(context, builder, sig, args):
        def pointer(arrty, arr, idxty, idx):
            ary = context.make_array(arrty)(context, builder, arr)
            i = context.cast(builder, idx, idxty, types.intp)
            return cgutils.get_item_pointer(context, builder, arrty, ary, [i], wraparound=False)

        i8p = ir.IntType(8).as_pointer()
        pd = builder.bitcast(pointer(sig.args[0], args[0], sig.args[1], args[1]), i8p)
        ps = builder.bitcast(pointer(sig.args[2], args[2], sig.args[3], args[3]), i8p)
        size = context.cast(builder, args[4], sig.args[4], types.int64)
        fnty = ir.FunctionType(ir.VoidType(), [i8p, i8p, ir.IntType(64), ir.IntType(1)])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.memcpy.p0.p0.i64")
        builder.call(fn, [pd, ps, size, ir.IntType(1)(0)])  # not volatile
        return context.get_dummy_value()

    return sig, codegen

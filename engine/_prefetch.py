"""A software prefetch of an array element, as a numba intrinsic.

A lookup is a chain of dependent cache misses (bucket meta -> index slot -> ring
record); one key at a time the CPU waits for each. The kernels first walk the
whole batch issuing prefetches, so the misses of 1024 keys overlap, then do the
real work on warm lines. A prefetch never faults, so a stale hint is harmless.
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

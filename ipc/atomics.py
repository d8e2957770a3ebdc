"""Cross-process atomics on numpy arrays, as numba intrinsics.

These are the only primitives the lock and seqlock kernels use to touch shared
words (docs/design.md, "Atomics from numba", says what was verified). On x86-64 the CAS
and fetch-add become `lock cmpxchg` / `lock xadd`; acquire loads, release stores
and acquire/release fences are plain moves plus compiler barriers. They are still
required: with plain loads and stores LLVM removes or reorders the seqlock's
odd-version store and readers accept torn values.

Every intrinsic takes a 1-d int64 array and an element index, and takes the
element's address from the typed array (never from a raw integer), so numba keeps
the type, the lifetime and the read-only flag. Writing intrinsics refuse a
read-only array at typing time: a CAS on a PROT_READ mapping would be a SIGSEGV.
"""

from __future__ import annotations

import threading

import numpy as np
from numba import njit, types
from numba.core import cgutils
from numba.core.errors import TypingError
from numba.extending import intrinsic

from shmcache.ipc import jitcache

jitcache.install()  # before this module's kernels are decorated: it may be the first of the package imported


def _check_array(arr, *, writable: bool, who: str) -> None:
    if not (isinstance(arr, types.Array) and arr.ndim == 1 and arr.dtype == types.int64):
        raise TypingError(f"{who}: expected a 1-d int64 array, got {arr}")
    if writable and not arr.mutable:
        raise TypingError(f"{who}: the array is read-only (a reader's mapping cannot be written)")


def _element_pointer(context, builder, arrty, arr, idxty, idx):
    ary = context.make_array(arrty)(context, builder, arr)
    i = context.cast(builder, idx, idxty, types.intp)
    return cgutils.get_item_pointer(context, builder, arrty, ary, [i], wraparound=False)


def _on_element(who: str, arr, idx, returns, operands: int, emit, *, writable: bool = True):
    """The typing of an intrinsic `who(arr, idx, *operands)` on arr[idx]: the array checked
    (_check_array), the operands int64, the result of type `returns`; its code is
    `emit(context, builder, ptr, *operands)` on the element's address."""
    _check_array(arr, writable=writable, who=who)
    sig = returns(arr, idx, *[types.int64] * operands)

    def codegen(context, builder, sig, args):
        ptr = _element_pointer(context, builder, sig.args[0], args[0], sig.args[1], args[1])
        return emit(context, builder, ptr, *args[2:])

    return sig, codegen


@intrinsic
def cas(typingctx, arr, idx, expected, desired):
    """Compare-and-swap arr[idx]: returns the value seen (== expected on success)."""
    def emit(context, builder, ptr, expected, desired):
        return builder.extract_value(builder.cmpxchg(ptr, expected, desired, "seq_cst", "seq_cst"), 0)

    return _on_element("cas", arr, idx, types.int64, 2, emit)


@intrinsic
def fetch_add(typingctx, arr, idx, delta):
    """Atomically add delta to arr[idx]; returns the previous value."""
    def emit(context, builder, ptr, delta):
        return builder.atomic_rmw("add", ptr, delta, "seq_cst")

    return _on_element("fetch_add", arr, idx, types.int64, 1, emit)


@intrinsic
def load_acquire(typingctx, arr, idx):
    """arr[idx] with acquire ordering: later loads cannot move before it."""
    def emit(context, builder, ptr):
        return builder.load_atomic(ptr, "acquire", 8)

    return _on_element("load_acquire", arr, idx, types.int64, 0, emit, writable=False)


@intrinsic
def store_release(typingctx, arr, idx, value):
    """arr[idx] = value with release ordering: earlier stores cannot move after it."""
    def emit(context, builder, ptr, value):
        builder.store_atomic(value, ptr, "release", 8)
        return context.get_dummy_value()

    return _on_element("store_release", arr, idx, types.void, 1, emit)


def _fence(ordering: str, name: str, doc: str):
    """A fence intrinsic of this LLVM ordering, under its own name."""
    def fence(typingctx):
        def codegen(context, builder, sig, args):
            builder.fence(ordering)
            return context.get_dummy_value()

        return types.void(), codegen

    fence.__name__ = fence.__qualname__ = name
    fence.__doc__ = doc
    return intrinsic(fence)


fence_acquire = _fence("acquire", "fence_acquire",
                       "Loads before the fence complete before loads after it (seqlock reader).")
fence_release = _fence("release", "fence_release",
                       "Stores before the fence become visible before stores after it (seqlock writer).")


@njit(nogil=True, cache=True)
def cas_word(arr, idx, expected, desired):
    """Python-callable CAS for slow paths (slot claims, lock takeover)."""
    return cas(arr, idx, expected, desired)


@njit(nogil=True, cache=True)
def load_word(arr, idx):
    """Python-callable acquire load."""
    return load_acquire(arr, idx)


@njit(nogil=True, cache=True)
def store_word(arr, idx, value):
    """Python-callable release store."""
    store_release(arr, idx, value)


def load_beside():
    """Have numba load the three word kernels above (and, in a fresh process, set itself up)
    in a thread, for a caller about to wait on something that drops the GIL, such as a new
    segment's pages (ipc/segment.py). The thread, or None when they are loaded already; a
    later call in the caller's thread waits for the load either way."""
    if store_word.signatures and load_word.signatures and cas_word.signatures:
        return None

    def load():
        words = np.zeros(2, np.int64)  # the type of every segment view the callers pass
        store_word(words, 0, 1)
        load_word(words, 0)
        cas_word(words, 0, 1, 2)

    t = threading.Thread(target=load, name="shmcache-load-atomics", daemon=True)
    t.start()
    return t


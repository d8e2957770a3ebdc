"""Mappings of shared files at 2 MiB-aligned addresses, guarded against the file being
cut short (ipc/sigbus.py), and the creator's requests for 2 MiB pages.

Huge pages: a lookup touches an index slot and a record at random in hundreds of
MiB, and with 4 KiB pages each touch is a TLB miss and a page walk (a nested
one under a hypervisor), which cost more than the cache misses themselves. So
every mapping is placed at a 2 MiB-aligned address (libc mmap with MAP_FIXED
into an aligned reservation; Python's mmap cannot choose the address), and the
creator asks the kernel to back the file with 2 MiB pages (MADV_COLLAPSE, Linux
6.1+, honoured for tmpfs even when /sys/.../shmem_enabled is "never"). Every
process that then maps the file aligned gets 2 MiB mappings. Where the kernel
refuses, everything works on 4 KiB pages, only slower: `Segment.huge` says which.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import weakref

from shmcache.ipc import sigbus

HUGE_PAGE = 2 << 20
COLLAPSE_CHUNK = 64 * HUGE_PAGE  # the piece of a new segment one thread asks 2 MiB pages for
_MADV_COLLAPSE = 25  # linux/mman.h; Python's mmap module does not define it
_MADV_POPULATE_WRITE = 23
_MAP_FIXED = 0x10
_MAP_FAILED = ctypes.c_void_p(-1).value

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]


def map_aligned(fd: int, size: int, writable: bool, populate: bool = True) -> tuple[memoryview, int, int]:
    """Map fd at a HUGE_PAGE-aligned address; the memoryview (read-only unless writable)
    keeps the mapping alive, and the mapping goes when the last view of it does.
    populate=False leaves the page tables empty (the creator fills them after its collapse).
    The mapping is guarded against the file being cut short (ipc/sigbus.py): the third
    item is its token there."""
    # Reserve size + one huge page of address space, then map the file over its
    # aligned part and give back the unused head and tail.
    base = _libc.mmap(None, size + HUGE_PAGE, 0,  # PROT_NONE
                      mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_NORESERVE", 0), -1, 0)
    if base in (None, _MAP_FAILED):
        raise OSError(ctypes.get_errno(), f"mmap reserve: {os.strerror(ctypes.get_errno())}")
    addr = (base + HUGE_PAGE - 1) // HUGE_PAGE * HUGE_PAGE
    prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
    # MAP_POPULATE: fault every page table entry in now, not one page at a time
    # during the first lookups or writes (once per process).
    populate_flag = getattr(mmap, "MAP_POPULATE", 0) if populate else 0
    got = _libc.mmap(addr, size, prot, mmap.MAP_SHARED | _MAP_FIXED | populate_flag, fd, 0)
    if got != addr:
        err = ctypes.get_errno()
        _libc.munmap(base, size + HUGE_PAGE)
        raise OSError(err, f"mmap: {os.strerror(err)}")
    if addr > base:
        _libc.munmap(base, addr - base)
    end = base + size + HUGE_PAGE
    if end > addr + size:
        _libc.munmap(addr + size, end - (addr + size))
    token = sigbus.guard(addr, size, prot)
    buf = (ctypes.c_uint8 * size).from_address(addr)
    # munmap when the ctypes array is collected: every numpy view holds the memoryview,
    # which holds the array, so no view can outlive the mapping.
    weakref.finalize(buf, unmap, addr, size, token).atexit = False
    view = memoryview(buf).cast("B")  # plain bytes: ctypes exports "<B", which memoryview cannot slice-assign
    return (view if writable else view.toreadonly()), addr, token


def unmap(addr: int, size: int, token: int) -> None:
    sigbus.unguard(token)  # first: once unmapped, the addresses may hold anything
    _libc.munmap(addr, size)


def populate_write(addr: int, size: int) -> None:
    """Fill the page tables of a writable mapping now, as MAP_POPULATE does for attachers
    (MADV_POPULATE_WRITE, Linux 5.14+; before, pages are mapped at first touch)."""
    _libc.madvise(addr, size, _MADV_POPULATE_WRITE)


def collapse(addr: int, size: int) -> bool:
    """Ask for 2 MiB pages under the mapping at addr (a hint: refused on older kernels or
    under memory pressure), in COLLAPSE_CHUNK pieces over one thread per CPU: the call spends
    its time allocating and zeroing pages (in a VM, the host faulting them in), which the
    CPUs do side by side. True if every whole 2 MiB range got one."""
    n = size // HUGE_PAGE * HUGE_PAGE
    if n == 0:
        return False
    spans = [(addr + a, min(COLLAPSE_CHUNK, n - a)) for a in range(0, n, COLLAPSE_CHUNK)]
    threads = min(len(spans), os.cpu_count() or 1, 8)
    if threads == 1:
        return all(_collapse_span(a, s) for a, s in spans)
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(threads, thread_name_prefix="shmcache-collapse") as pool:
        return all(pool.map(lambda span: _collapse_span(*span), spans))  # ctypes drops the GIL


def _collapse_span(addr: int, size: int) -> bool:
    if _libc.madvise(addr, size, _MADV_COLLAPSE) == 0:
        return True
    # a transient miss on some 2 MiB ranges (a page briefly locked or mapped elsewhere):
    # the kernel went on with the rest, so a second pass only redoes those
    return ctypes.get_errno() == errno.EAGAIN and _libc.madvise(addr, size, _MADV_COLLAPSE) == 0

"""No process of ours dies by SIGBUS when a file it maps is cut short under it.

A shared mapping of a file faults with SIGBUS wherever the file no longer reaches, and
anyone who may write the file can shrink it (`truncate`, `> file`): the owner of a
segment, or any member of a reader group for the readers' companion, which they write
by design. Every process mapping it then dies at its next touch of the lost pages: a
reader in the middle of a lookup, a writer, a supervisor reading the counters. No check
before a call closes the race; only the fault itself can be caught.

So each process installs, at its first guarded mapping, a SIGBUS handler. A fault inside
a guarded mapping replaces that whole mapping with zero pages (an anonymous mapping at
the same address, MAP_FIXED) and flags it lost; the faulting load or store then runs
again on zeros, which every kernel reads as empty buckets (misses), and the handle that
owns the mapping turns the flag into an error once its call returns (`lost`). A fault
anywhere else goes on to the handler that was there before (faulthandler's, say), or,
if there was none, to the default action: the process dies as it would have.

The handler runs inside a signal: no Python, no allocation, no lock. It is a few lines
of LLVM IR compiled once per process by llvmlite (numba's compiler, loaded anyway with
the kernels), with the addresses of the table of guarded ranges, of the
previous handler and of libc's mmap, sigaction and raise as constants: nothing is
looked up inside the signal. It assumes 64-bit Linux with glibc: si_code at byte 8 and
si_addr at byte 16 of siginfo_t, and glibc's struct sigaction (handler, 128-byte mask,
flags). Up to MAX_RANGES mappings are guarded at once; past that a mapping goes
unguarded (and faults as before).
"""

from __future__ import annotations

import ctypes
import signal
import threading

MAX_RANGES = 1024
_WORDS = 4  # per range: start, end, prot, lost (start 0: a free entry)
_START, _END, _PROT, _LOST = range(_WORDS)
_SA_SIGINFO = 4
_SA_ONSTACK = 0x08000000
_MAP_PRIVATE_FIXED_ANON = 0x02 | 0x10 | 0x20


class _Sigaction(ctypes.Structure):  # glibc's struct sigaction on 64-bit Linux
    _fields_ = [("handler", ctypes.c_void_p), ("mask", ctypes.c_uint64 * 16), ("flags", ctypes.c_int),
                ("restorer", ctypes.c_void_p)]


_table = (ctypes.c_int64 * (MAX_RANGES * _WORDS))()
_previous = _Sigaction()  # the handler ours goes on to for a fault that is not in a guarded range
_libc = ctypes.CDLL(None, use_errno=True)
_libc.sigaction.argtypes = [ctypes.c_int, ctypes.POINTER(_Sigaction), ctypes.POINTER(_Sigaction)]
_lock = threading.Lock()
_installed = False
_engine = None  # keeps the handler's machine code alive for the life of the process


def _address(fn) -> int:
    return ctypes.cast(fn, ctypes.c_void_p).value


_IR = """
define void @shmcache_sigbus(i32 %sig, ptr %info, ptr %ctx) {{
entry:
  %codep = getelementptr inbounds i8, ptr %info, i64 8
  %code = load volatile i32, ptr %codep
  %addrp = getelementptr inbounds i8, ptr %info, i64 16
  %addr = load volatile i64, ptr %addrp
  %byfault = icmp sgt i32 %code, 0                ; raised by a fault (not kill(2) or raise(3))
  br i1 %byfault, label %loop, label %chain

loop:                                             ; is the faulting address in a guarded range?
  %i = phi i64 [ 0, %entry ], [ %inext, %next ]
  %more = icmp ult i64 %i, {n}
  br i1 %more, label %look, label %chain

look:
  %w = mul i64 %i, {words}
  %sp = getelementptr i64, ptr inttoptr (i64 {table} to ptr), i64 %w
  %start = load volatile i64, ptr %sp
  %ep = getelementptr i64, ptr %sp, i64 1
  %end = load volatile i64, ptr %ep
  %used = icmp ne i64 %start, 0
  %ge = icmp uge i64 %addr, %start
  %lt = icmp ult i64 %addr, %end
  %in0 = and i1 %used, %ge
  %in = and i1 %in0, %lt
  br i1 %in, label %ours, label %next

next:
  %inext = add i64 %i, 1
  br label %loop

ours:                                             ; zero pages over the whole range, then flag it lost
  %pp = getelementptr i64, ptr %sp, i64 2
  %prot = load volatile i64, ptr %pp
  %prot32 = trunc i64 %prot to i32
  %len = sub i64 %end, %start
  %at = inttoptr i64 %start to ptr
  %got = call ptr inttoptr (i64 {mmap} to ptr)(ptr %at, i64 %len, i32 %prot32, i32 {flags}, i32 -1, i64 0)
  %ok = icmp eq ptr %got, %at
  br i1 %ok, label %flag, label %chain

flag:
  %lp = getelementptr i64, ptr %sp, i64 3
  store volatile i64 1, ptr %lp
  ret void

chain:                                            ; not ours: what was there before
  %old = load volatile i64, ptr inttoptr (i64 {previous} to ptr)
  %deflt = icmp ule i64 %old, 1                   ; SIG_DFL or SIG_IGN: put it back, raise again
  br i1 %deflt, label %restore, label %call

restore:
  %r1 = call i32 inttoptr (i64 {sigaction} to ptr)(i32 %sig, ptr inttoptr (i64 {previous} to ptr), ptr null)
  %r2 = call i32 inttoptr (i64 {raise_} to ptr)(i32 %sig)
  ret void

call:
  %flagsp = getelementptr inbounds i8, ptr inttoptr (i64 {previous} to ptr), i64 136
  %oflags = load volatile i32, ptr %flagsp
  %si = and i32 %oflags, {sa_siginfo}
  %withinfo = icmp ne i32 %si, 0
  %fn = inttoptr i64 %old to ptr
  br i1 %withinfo, label %call3, label %call1

call3:
  call void %fn(i32 %sig, ptr %info, ptr %ctx)
  ret void

call1:
  call void %fn(i32 %sig)
  ret void
}}
"""


def _compile() -> int:
    """The handler's machine code (kept alive in _engine); its address."""
    global _engine
    import llvmlite.binding as llvm

    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    ir = _IR.format(n=MAX_RANGES, words=_WORDS, table=ctypes.addressof(_table), flags=_MAP_PRIVATE_FIXED_ANON,
                    mmap=_address(_libc.mmap), sigaction=_address(_libc.sigaction), raise_=_address(_libc["raise"]),
                    previous=ctypes.addressof(_previous), sa_siginfo=_SA_SIGINFO)
    module = llvm.parse_assembly(ir)
    module.verify()
    _engine = llvm.create_mcjit_compiler(module, llvm.Target.from_default_triple().create_target_machine())
    _engine.finalize_object()
    return _engine.get_function_address("shmcache_sigbus")


def _install() -> None:
    global _installed
    ours = _Sigaction()
    ours.handler = _compile()
    ours.flags = _SA_SIGINFO | _SA_ONSTACK  # the mask stays empty: SIGBUS itself is held while it runs
    if _libc.sigaction(signal.SIGBUS, ctypes.byref(ours), ctypes.byref(_previous)) != 0:
        raise OSError(ctypes.get_errno(), "sigaction(SIGBUS)")
    _installed = True


def guard(addr: int, size: int, prot: int) -> int:
    """Guard the mapping [addr, addr + size) mapped with `prot`; a token for lost() and
    unguard(), or -1 when every entry is taken (the mapping then goes unguarded)."""
    with _lock:
        if not _installed:
            _install()
        for i in range(MAX_RANGES):
            w = i * _WORDS
            if _table[w + _START] == 0:
                _table[w + _END] = addr + size
                _table[w + _PROT] = prot
                _table[w + _LOST] = 0
                _table[w + _START] = addr  # last: the handler never sees half an entry
                return i
    return -1


def unguard(token: int) -> None:
    """Before the mapping is unmapped (its addresses may then hold anything)."""
    if token >= 0:
        _table[token * _WORDS + _START] = 0


def lost(token: int) -> bool:
    """The file behind the mapping was cut short and the mapping now holds zero pages."""
    return token >= 0 and _table[token * _WORDS + _LOST] != 0

"""The lowest layer: what every process of a cache shares with the kernel and with each
other, and nothing of a cache's content. Named shared-memory segments opened safely
(segment.py) and mapped at 2 MiB-aligned addresses, guarded against a file cut short
(mapping.py, sigbus.py); atomic words for numba kernels (atomics.py); owner words and
stops by pid (liveness.py); this machine's name (machine.py); numba's kernel cache
stamped with the sources each kernel imports (jitcache.py); the C heap a process freed,
handed back (heap.py)."""

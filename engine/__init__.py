"""The table: the segment layout contract, compiled kernels and the Reader/Writer handles."""

from shmcache.ipc import jitcache

jitcache.install()  # before any kernel is decorated: numba's cache stamped with the sources each kernel imports

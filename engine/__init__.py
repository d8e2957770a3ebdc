"""The table: the segment layout contract, compiled kernels and the Reader/Writer handles."""

from shmcache.engine._jitcache import ensure_fresh as _ensure_fresh

_ensure_fresh()

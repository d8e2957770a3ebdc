"""Lookup results as whole-batch buffers (Reader.get_many_packed): a found mask, value
offsets and one data buffer, with no per-key object until one is asked for."""

from __future__ import annotations

import numpy as np


class Packed:
    """Lookup results without per-key objects: value i is data[offsets[i]:offsets[i + 1]]
    where found[i]; offsets has len(found) + 1 entries (int64)."""

    __slots__ = ("found", "offsets", "data")  # a plain class: built once per batch, cheaply

    def __init__(self, found: np.ndarray, offsets: np.ndarray, data: np.ndarray):
        self.found = found
        self.offsets = offsets
        self.data = data

    def __repr__(self) -> str:
        return f"Packed({len(self.found)} keys, {int(self.found.sum())} found, {len(self.data)} value bytes)"

    def __len__(self) -> int:
        return len(self.found)

    def to_list(self) -> list[bytes | None]:
        buf = self.data.tobytes()
        o = self.offsets.tolist()
        return [buf[o[i]:o[i + 1]] if f else None for i, f in enumerate(self.found.tolist())]

    def to_arrow(self, large: bool = False):
        """A pyarrow BinaryArray (nulls where not found), built from these buffers without per-row work."""
        try:
            import pyarrow as pa
        except ImportError:  # optional dependency
            raise ImportError("to_arrow() needs pyarrow: pip install 'shmcache[arrow]'") from None
        n = len(self.found)
        valid = pa.py_buffer(np.packbits(self.found, bitorder="little"))
        if large or self.offsets[-1] > np.iinfo(np.int32).max:
            return pa.Array.from_buffers(pa.large_binary(), n, [valid, pa.py_buffer(self.offsets), pa.py_buffer(self.data)])
        offs = self.offsets.astype(np.int32)
        return pa.Array.from_buffers(pa.binary(), n, [valid, pa.py_buffer(offs), pa.py_buffer(self.data)])

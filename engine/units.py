"""Sizes in bytes as people write them: '256MiB' in, '256.0 MiB' out."""

from __future__ import annotations

import re
from fractions import Fraction

_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "kib": 2**10, "m": 10**6, "mb": 10**6,
          "mib": 2**20, "g": 10**9, "gb": 10**9, "gib": 2**30, "t": 10**12, "tb": 10**12,
          "tib": 2**40}


def parse_bytes(value: int | str, *, what: str = "memory") -> int:
    """'256MiB', '1.5GiB', '500MB', 1048576 -> bytes (a fraction of a byte rounded down);
    a clear ValueError otherwise. Exact arithmetic: no float rounding or overflow."""
    if isinstance(value, bool):
        raise ValueError(f"{what}={value!r} is not a size")
    if isinstance(value, int):
        n = value
    else:
        m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*", str(value), re.ASCII)
        unit = m.group(2).lower() if m else None
        if not m or unit not in _UNITS:
            raise ValueError(f"{what}={value!r} is not a size (examples: 256MiB, 1GiB, 500MB)")
        n = int(Fraction(m.group(1)) * _UNITS[unit])
    if n <= 0:
        raise ValueError(f"{what}={value!r} must be positive")
    if n >= 1 << 63:  # a segment's size is an int64 header word
        raise ValueError(f"{what}={value!r} is more than any machine holds (the limit is 2**63-1 bytes)")
    return n


def format_bytes(n: float) -> str:
    """Bytes in the largest binary unit that keeps the figure under 1024 (TiB at most): '512 B', '1.5 KiB'."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")

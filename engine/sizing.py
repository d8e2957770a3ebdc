"""How much memory a cache needs for N entries: the sizing rule of docs/operators.md.

A key lives in one of NBUCKETS buckets (its hash's low bits), and each bucket is a ring of
its own: when a bucket's ring or index is full, its oldest record is evicted, whatever
room the others have. So what must fit is the *fullest* bucket, not the average one, plus
room for the records an update or a DELETE left dead in the ring until its tail passes
them (the headroom).

- entries a bucket: the hash spreads N keys over the buckets, a count of mean
  lam = N / NBUCKETS in each, whose upper tail is at most a Poisson(lam)'s. The fullest
  of the NBUCKETS buckets stays at or below the smallest k with
  P(Poisson(lam) > k) <= MISS / NBUCKETS, at least 1 - MISS of the time (a union bound
  over the buckets): the tail summed exactly, from far above the mean down.
- ring bytes a bucket: that many records of record_size(key_size, value_bytes) (the
  header, the key and the value, rounded up to 16 bytes), over 1 - headroom.
- index slots a bucket: the index is full at MAX_LOAD (3/4) of its slots.
- memory: the smallest whole MiB for which Geometry.plan (the layout's own split of a
  segment into index and rings, the very one `create` and `run` use) gives both.

value_bytes is the mean value's size: a bucket holds tens to thousands of records, so
its bytes follow the mean closely; give the largest value size where values are few a
bucket or their sizes far apart.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from shmcache.engine import layout as L
from shmcache.engine.units import format_bytes

MISS = 0.01  # the fullest bucket exceeds the bound at most 1 time in 100
DEFAULT_HEADROOM = 0.25  # of each ring, for records dead (replaced, deleted) until its tail passes
MIB = 1 << 20


@dataclass(frozen=True)
class Plan:
    """What a cache for `entries` entries of `value_bytes` needs (memory_for)."""

    entries: int
    value_bytes: int
    key_size: int
    max_value: int
    headroom: float
    record_bytes: int  # ring bytes of one record
    mean_per_bucket: float
    fullest_bucket: int  # entries in the fullest bucket, 1 - MISS of the time
    memory: int  # the --memory to give: whole MiB
    geometry: L.Geometry  # what that memory is split into

    def as_dict(self) -> dict:
        g = self.geometry
        return {"entries": self.entries, "value_bytes": self.value_bytes, "key_size": self.key_size,
                "max_value": self.max_value, "headroom": self.headroom, "record_bytes": self.record_bytes,
                "mean_per_bucket": round(self.mean_per_bucket, 2), "fullest_bucket": self.fullest_bucket,
                "memory": self.memory, "segment_bytes": g.size, "ring_bytes": g.ring, "slots": g.slots,
                "max_live_per_bucket": g.max_live, "live_bytes": self.entries * self.record_bytes,
                "buckets": L.NBUCKETS}

    def summary(self) -> str:
        g = self.geometry
        return (f"--memory {self.memory // MIB}MiB ({format_bytes(self.memory)}) for {self.entries:,} entries of "
                f"{self.value_bytes} B values and {self.key_size} B keys ({self.record_bytes} B a record): "
                f"{self.mean_per_bucket:,.1f} entries in a bucket on average, at most {self.fullest_bucket:,} in the "
                f"fullest ({100 - 100 * MISS:.0f} times in 100), each ring {format_bytes(g.ring)} with "
                f"{self.headroom:.0%} of it for dead records, {g.slots:,} index slots a bucket "
                f"(full at {g.max_live:,}); {format_bytes(self.entries * self.record_bytes)} of live records in a "
                f"{format_bytes(g.size)} segment")


def fullest_bucket(entries: int, miss: float = MISS) -> int:
    """Entries in the fullest of the NBUCKETS buckets, at least 1 - miss of the time: the
    smallest k whose Poisson tail P(X > k) is at most miss / NBUCKETS."""
    if entries <= 0:
        return 0
    lam = entries / L.NBUCKETS
    limit = miss / L.NBUCKETS
    k = math.ceil(lam + 20 * math.sqrt(lam) + 60)  # a tail far below any limit here
    tail = 0.0  # P(X > k)
    while k > 0:
        pk = math.exp(k * math.log(lam) - lam - math.lgamma(k + 1))  # P(X = k)
        if tail + pk > limit:  # P(X > k - 1) too much: k is the bound
            return k
        tail += pk
        k -= 1
    return 1


def memory_for(entries: int, value_bytes: int, *, key_size: int = L.DEFAULT_KEY_SIZE,
               max_value: int = L.DEFAULT_MAX_VALUE, headroom: float = DEFAULT_HEADROOM) -> Plan:
    """The smallest --memory (whole MiB) whose fullest bucket holds its entries with
    `headroom` of its ring to spare; ValueError naming the argument that cannot be."""
    if isinstance(entries, bool) or not isinstance(entries, int) or entries < 1:
        raise ValueError(f"entries={entries!r}: a positive number of entries")
    if not 1 <= key_size <= L.MAX_KEY_SIZE:
        raise ValueError(f"key_size={key_size!r}: from 1 to {L.MAX_KEY_SIZE}")
    if not 0 <= value_bytes <= max_value:
        raise ValueError(f"value_bytes={value_bytes!r}: from 0 to max_value ({max_value})")
    if not 0 <= headroom < 1:
        raise ValueError(f"headroom={headroom!r}: a fraction of each ring from 0 up to (not including) 1")
    record = L.record_size(key_size, value_bytes)
    fullest = fullest_bucket(entries)
    ring = max(math.ceil(fullest * record / (1 - headroom)), L.record_size(key_size, max_value))
    slots = max(L.MIN_SLOTS, math.ceil(fullest * L.MAX_LOAD_DEN / L.MAX_LOAD_NUM))
    need = L.FIXED_BYTES + L.PAGE + L.NBUCKETS * (ring + slots * L.WORD)
    memory = -(-need // MIB) * MIB
    while True:  # plan's index takes a power of two of slots, so a little more may be needed
        g = L.Geometry.plan(memory, key_size, max_value)
        if g.ring >= ring and g.max_live >= fullest:
            break
        memory += MIB
    return Plan(entries=entries, value_bytes=value_bytes, key_size=key_size, max_value=max_value,
                headroom=headroom, record_bytes=record, mean_per_bucket=entries / L.NBUCKETS,
                fullest_bucket=fullest, memory=memory, geometry=g)

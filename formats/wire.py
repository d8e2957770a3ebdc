"""The Kafka wire format of the txmeta topic: the contract between producers and us.

Producers: Teranode's validator (services/validator), our load generator and tests.
Consumers: our workers (this module's `decode`), Teranode's subtree validator and
legacy netsync. Byte-compatible with Teranode's `stores/txmetacache/wire.go`.

v1 (legacy)::

    +-----------------+
    | count   u32 LE  |  4 B
    +-----------------+--------------+-------------+---------------+
    | tx hash   32 B  | action  u8   | len  u32 LE | content len B |  x count
    +-----------------+--------------+-------------+---------------+

v2 (partition-aware)::

    +------+------+-----------+-----------------+
    | 0xFF | 0x02 | 0x00 0x00 | count   u32 LE  |  8 B
    +------+------+-----------+-----------------+-------------+-------------+-----------+
    | xxh64(tx hash) u64 LE   | tx hash  32 B   | action  u8  | len  u32 LE | content   |  x count
    +-------------------------+-----------------+-------------+-------------+-----------+

action 0 = ADD (content = Teranode MetaBytes), 1 = DELETE (len 0). A v2 producer
sends each entry to partition `(xxh64 % 8192) // (8192 // P)`, so a partition owns a
contiguous range of the table's buckets (see `partitioners.v2_partition`).

What a receiver MUST check (and `decode` does):
1. v2 only if the WHOLE v2 parse holds: all four header bytes match, `count * 45 <=
   len - 8`, every entry is intact, the entries end exactly at the message's end, and
   every entry's sent xxh64 equals xxh64(its hash). Otherwise the message is parsed
   as v1. The header alone is not enough: a v1 count of 255, 511, 767, ... also starts
   0xFF, and a v1 message of 767 entries starts exactly FF 02 00 00; the count check
   alone is not enough either (its first hash's first four bytes, read as a v2 count,
   pass it with odds of about len/45 in 2**32, and the entries then decode as garbage).
   Teranode's receivers stop at the header check; we go further because applying a
   misread message loses its real entries, DELETEs included.
2. Nothing is sized from the count: it can claim 4 billion entries in 10 bytes.
   (Teranode's receivers drop a message whose count cannot fit; we keep its intact
   entries, sizing arrays from what the scan found, and report the count.)
3. Before each entry, the fixed entry header fits; then `len <= max_value`; then the
   content fits. The first failure is the damage: entries before it are kept,
   nothing from it on is.
4. Unknown actions are skipped by their `len` and counted, never applied.
5. v2: the sent xxh64 is not trusted to place a key; it is recomputed, and a
   mismatch means the message is not v2 (rule 1). The verified hashes come back in
   `Batch.hashes`, and the worker hands them to the writer's apply (hashes=), so the
   engine does not hash those keys again: every v2 key is hashed once, here.

Choices where the format is silent:
- A DELETE with len > 0: its content is skipped by its len (as Teranode's receivers
  skip any entry's content) and the entry is applied as a DELETE (deleting from a
  cache is always safe: a miss falls through to the store); counted in
  `Batch.delete_payloads`.
- A content longer than `max_value` is damage even for a DELETE or an unknown
  action: a length no record can have means the framing is not to be trusted.
- v1: bytes after the declared entries are reported as an error, all entries kept;
  other damage keeps the entries before it.
- A message with the v2 header that holds neither as v2 nor as v1 keeps nothing: the
  layout itself is in doubt, and applying misaligned bytes as entries is worse than a
  miss. So a damaged v2 message (truncated, trailing bytes, one wrong xxh64) yields
  nothing, where a damaged v1 message keeps its intact prefix.

Not guaranteed: a message that parses cleanly both ways is read as v2. That needs a
v1 message of 767 + 256k entries whose bytes also form a valid v2 message with every
xxh64 matching: 64 bits of chance per entry, never in practice.

Also here: the plain key/value mode (`decode_kv`) and the encoders producers and tests
use. The two partitioners (`v2_partition`, and Kafka's own `murmur2_partition`) are in
formats/partitioners.py. The upstream format of Teranode's releases before v1 (`proto`:
one protobuf KafkaTxMetaTopicMessage per transaction, its txHash raw or hex, the hex
reversed into the v1 key) is formats/proto.py; it decodes into this module's Batch.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

import numpy as np

from shmcache.engine import layout
from shmcache.engine.xxh64 import xxh64_rows  # the engine's bucketing hash: the v2 hash must be that very hash
from shmcache.formats import _wire_kernels as _k

# -- the contract ---------------------------------------------------------------
KEY_SIZE = 32  # a tx hash (chainhash.Hash): both versions carry 32-byte keys
COUNT_SIZE = 4  # u32 LE entry count
ACTION_SIZE = 1  # u8 action
LEN_SIZE = 4  # u32 LE content length
HASH_SIZE = 8  # u64 LE xxh64(tx hash, seed 0), v2 only

ADD = layout.ADD  # content is the cache value for the key
DELETE = layout.DELETE  # remove the key; len is 0

V1_HEADER = COUNT_SIZE
V1_ENTRY_HEADER = KEY_SIZE + ACTION_SIZE + LEN_SIZE  # 32 + 1 + 4 = 37

V2_MAGIC = b"\xff\x02\x00\x00"  # magic 0xFF, version 0x02, two reserved zero bytes
V2_HEADER = len(V2_MAGIC) + COUNT_SIZE  # 4 + 4 = 8
V2_ENTRY_HEADER = HASH_SIZE + KEY_SIZE + ACTION_SIZE + LEN_SIZE  # 8 + 32 + 1 + 4 = 45

# v2 partitions by bucket range: the engine's buckets, so a partition's entries land in
# whole buckets (a topic's partition count divides it). Producers depend on it.
V2_BUCKETS = layout.NBUCKETS

MAX_VALUE = layout.DEFAULT_MAX_VALUE  # "records up to 4 KiB must fit" (docs/design.md); longer is damage
_MAX_VALUE_LIMIT = 2**31 - 1  # value_lens is int32
_U32 = 0xFFFFFFFF  # the largest u32 LE length

@dataclass(frozen=True, eq=False, repr=False)
class Batch:
    """The entries of one Kafka message, in wire order, as arrays.

    Value i is `data[value_starts[i] : value_starts[i] + value_lens[i]]`. `data` is
    a read-only view of the message buffer (not a copy) for wire messages, so the
    batch keeps that buffer alive; in kv mode it is the kept values concatenated.
    """

    keys: np.ndarray  # (n, key_size) uint8, C-contiguous, a gathered copy
    actions: np.ndarray  # (n,) uint8, ADD or DELETE only (unknown actions dropped)
    value_starts: np.ndarray  # (n,) int64, start of each value within `data`
    value_lens: np.ndarray  # (n,) int32, 0 for deletes
    data: np.ndarray  # uint8, the bytes the values point into
    version: int  # 1, 2, or 0 for a message per entry (the key/value mode, and proto: formats/proto.py)
    declared: int  # the count the header declared (version 0: the number of messages)
    unknown_actions: int  # entries skipped for an action other than ADD/DELETE
    error: str | None  # None if clean, else a short reason for the first damage
    error_at: int  # byte of the damage (kv: index of the first skipped message); -1 if clean
    hashes: np.ndarray | None = None  # (n,) uint64 xxh64(key) for v2, each one verified
    delete_payloads: int = 0  # DELETEs that carried content (skipped, still deleted)
    skipped: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    # ^ version 0: indices of the messages skipped as bad, for topic/partition/offset logs

    def __len__(self) -> int:
        return int(self.actions.shape[0])

    def __repr__(self) -> str:  # short enough for a log line
        return (f"Batch(v{self.version}, {len(self)} of {self.declared} declared, "
                f"unknown={self.unknown_actions}, error={self.error!r})")

    def value(self, i: int) -> bytes:
        """Value i as bytes (a copy; for tests and logs, not the hot path)."""
        s = int(self.value_starts[i])
        return self.data[s : s + int(self.value_lens[i])].tobytes()


# -- decoding --------------------------------------------------------------------
def decode(buf, *, key_size: int = KEY_SIZE, max_value: int = MAX_VALUE) -> Batch:
    """Decode one txmeta message (v1 or v2, rule 1). Never raises on malformed bytes:
    `error`/`error_at` say what is wrong, and the entries before the first damage
    come back for v1 (none for a message with the v2 header, see the choices above).

    `buf` is bytes, bytearray, memoryview or a 1-d uint8 array; a wrong type or a
    bad argument raises (that is a bug in the caller, not bad input).
    """
    if key_size != KEY_SIZE:
        raise ValueError(
            f"key_size must be {KEY_SIZE} for the txmeta wire format, got {key_size!r} "
            "(use decode_kv for other key sizes)")
    check_max_value(max_value)
    data = _as_u8(buf)
    n = data.shape[0]
    if n < V1_HEADER:
        return _nothing(data, 1, 0, f"message of {n} bytes is shorter than the "
                        f"{V1_HEADER}-byte count", 0)

    head8 = data[:V2_HEADER].tobytes()
    count1 = int.from_bytes(head8[:COUNT_SIZE], "little")
    if head8[: len(V2_MAGIC)] != V2_MAGIC or n < V2_HEADER:
        return _decode_as(data, 1, count1, max_value)  # damage keeps the intact prefix
    # Rule 1: the v2 header alone is no proof (a v1 count of 767 is FF 02 00 00).
    count2 = int.from_bytes(head8[len(V2_MAGIC):], "little")
    if count2 * V2_ENTRY_HEADER <= n - V2_HEADER:
        as_v2 = _decode_as(data, 2, count2, max_value)
        if as_v2.error is None:
            return as_v2
        not_v2 = as_v2.error
    else:
        not_v2 = f"count {count2} cannot fit"
    as_v1 = _decode_as(data, 1, count1, max_value)
    if as_v1.error is None:
        return as_v1
    # Neither layout holds: which one it was is in doubt, so nothing is applied.
    return _nothing(data, 1, count1, f"v2 magic, but not v2 ({not_v2}) and damaged as v1: {as_v1.error}", 0)


def _decode_as(data: np.ndarray, version: int, count: int, max_value: int) -> Batch:
    """Parse `data` as `version` with the header's `count`. v1 keeps the entries before
    any damage; v2 is all or nothing (its entries must end exactly at the message's end
    and every sent xxh64 must match its key), since a failed v2 parse means the message
    may not be v2 at all."""
    n = data.shape[0]
    pos = V2_HEADER if version == 2 else V1_HEADER
    hash_size = HASH_SIZE if version == 2 else 0
    entry_header = hash_size + KEY_SIZE + ACTION_SIZE + LEN_SIZE
    # Rule 2: arrays are sized from what the scan finds, never from the count.
    walked, kept, unknown, delete_payloads, _end, err, err_at, err_len = _k.scan(
        data, pos, count, hash_size, KEY_SIZE, max_value)
    error = None
    if err != _k.OK:
        error = _describe(err, walked, err_at, err_len, n, count, entry_header, max_value)
        fits = (n - pos) // entry_header
        if count > fits:
            error = f"count {count} exceeds the buffer (at most {fits} entries fit); {error}"
        if version == 2:
            return _nothing(data, 2, count, error, int(err_at))
    keys = np.empty((kept, KEY_SIZE), np.uint8)
    actions = np.empty(kept, np.uint8)
    starts = np.empty(kept, np.int64)
    lens = np.empty(kept, np.int32)
    hashes = np.empty(kept if version == 2 else 0, np.uint64)
    _k.gather(data, pos, walked, hash_size, KEY_SIZE, keys, actions, starts, lens, hashes)
    if version == 2:
        # Rule 5. Entries of an unknown action are not gathered, so their hashes go
        # unchecked; the framing and every kept entry's hash must still hold.
        wrong = np.flatnonzero(xxh64_keys(keys) != hashes)
        if wrong.size:
            return _nothing(data, 2, count, f"{wrong.size} of {kept} entries carry a wrong xxh64 "
                            f"(first: entry {int(wrong[0])})", V2_HEADER)
    return Batch(keys, actions, starts, lens, data, version, count, int(unknown),
                 error, int(err_at) if error else -1,
                 hashes=hashes if version == 2 else None, delete_payloads=int(delete_payloads))


def decode_kv(keys, values, *, key_size: int = KEY_SIZE,
              max_value: int = MAX_VALUE) -> Batch:
    """The plain key/value mode, for any (e.g. compacted) topic: one Kafka message
    per entry, Kafka key = cache key, value = cache value, a None value (tombstone)
    = DELETE. `keys` and `values` are the messages' keys and values in offset order.

    A message whose key is missing or not `key_size` bytes long, or whose value is
    longer than `max_value`, is skipped; its index is in `Batch.skipped` (so the
    caller can log its topic/partition/offset) and the first reason in `error`.
    """
    if not isinstance(key_size, int) or key_size <= 0:
        raise ValueError(f"key_size must be a positive int, got {key_size!r}")
    check_max_value(max_value)
    if len(keys) != len(values):
        raise ValueError(f"values has {len(values)} items but keys has {len(keys)}")
    good_keys, good_values, actions, skipped = [], [], [], []
    error = None
    for i, (k, v) in enumerate(zip(keys, values)):
        if k is None or len(k) != key_size:
            reason = "no key" if k is None else f"key of {len(k)} bytes, want {key_size}"
        elif v is not None and len(v) > max_value:
            reason = f"value of {len(v)} bytes exceeds max_value {max_value}"
        else:
            good_keys.append(k)
            good_values.append(b"" if v is None else v)
            actions.append(ADD if v is not None else DELETE)
            continue
        skipped.append(i)
        if error is None:
            error = f"message {i}: {reason}"
    m = len(good_keys)
    lens = np.fromiter(map(len, good_values), np.int64, m)
    starts = np.zeros(m, np.int64)
    np.cumsum(lens[:-1], out=starts[1:])
    return Batch(
        keys=np.frombuffer(b"".join(good_keys), np.uint8).reshape(m, key_size).copy(),
        actions=np.array(actions, np.uint8), value_starts=starts,
        value_lens=lens.astype(np.int32), data=np.frombuffer(b"".join(good_values), np.uint8),
        version=0, declared=len(keys), unknown_actions=0, error=error,
        error_at=skipped[0] if skipped else -1, skipped=np.array(skipped, np.int64))


def _describe(err, i, at, length, n, count, entry_header, max_value) -> str:
    if err == _k.TRUNCATED_HEADER:
        return (f"truncated entry {i} at byte {at}: {n - at} bytes left, "
                f"an entry header needs {entry_header}")
    if err == _k.TRUNCATED_CONTENT:
        return f"truncated entry {i} at byte {at}: content of {length} bytes runs past byte {n}"
    if err == _k.OVER_MAX_VALUE:
        return f"entry {i} at byte {at}: content of {length} bytes exceeds max_value {max_value}"
    return f"{n - at} trailing bytes at byte {at}, after the {count} declared entries"


def _nothing(data, version, declared, error, error_at) -> Batch:
    """A batch with no entries: the damage is in the header."""
    return Batch(np.empty((0, KEY_SIZE), np.uint8), np.empty(0, np.uint8),
                 np.empty(0, np.int64), np.empty(0, np.int32), data, version, declared,
                 0, error, error_at, hashes=np.empty(0, np.uint64) if version == 2 else None)


def _as_u8(buf) -> np.ndarray:
    """A read-only, C-contiguous uint8 view of buf (a copy only if it is not
    contiguous). Read-only so the kernels compile once, and nobody writes the
    message through a batch."""
    if isinstance(buf, np.ndarray):
        if buf.dtype != np.uint8 or buf.ndim != 1:
            raise TypeError(f"buf must be a 1-d uint8 array, got {buf.dtype} {buf.shape}")
        arr = np.ascontiguousarray(buf)
    else:
        try:
            mv = memoryview(buf)
        except TypeError:
            raise TypeError(f"buf must be bytes-like, got {type(buf).__name__}") from None
        arr = np.frombuffer(mv if mv.c_contiguous else mv.tobytes(), np.uint8)
    if arr.flags.writeable:
        arr = arr.view()
        arr.flags.writeable = False
    return arr


def check_max_value(max_value) -> None:
    if not isinstance(max_value, int) or not 0 <= max_value <= _MAX_VALUE_LIMIT:
        raise ValueError(f"max_value must be an int in 0..{_MAX_VALUE_LIMIT}, got {max_value!r}")


# -- encoding (producers, the load generator, tests) ------------------------------
def encode_v1(keys, actions, values) -> bytes:
    """A v1 message. `keys`: (n, 32) uint8 array or n 32-byte bytes; `actions`: n
    ints 0..255 (anything, so tests can send unknown actions); `values`: n bytes
    (None = empty) or `(offsets, data)` with value i = data[offsets[i]:offsets[i+1]].
    Values are not checked against max_value, so damaged messages can be built."""
    k, a, offsets, data = _encoder_inputs(keys, actions, values)
    return _encode(V1_HEADER, 0, k, a, offsets, data, None)


def encode_v2(keys, actions, values) -> bytes:
    """A v2 message (same arguments as encode_v1); each entry carries xxh64(key)."""
    k, a, offsets, data = _encoder_inputs(keys, actions, values)
    return _encode(V2_HEADER, HASH_SIZE, k, a, offsets, data, xxh64_keys(k))


def xxh64_keys(keys) -> np.ndarray:
    """xxh64(key, seed 0) of each row of a (n, key_size) uint8 array, as uint64;
    equal to `xxhash.xxh64_intdigest(row)`."""
    keys = np.ascontiguousarray(keys, dtype=np.uint8)
    if keys.ndim != 2:
        raise ValueError(f"keys must be a 2-d uint8 array, got shape {keys.shape}")
    return xxh64_rows(keys)


def _encode(header, hash_size, keys, actions, offsets, data, hashes) -> bytes:
    n = keys.shape[0]
    entry_header = hash_size + KEY_SIZE + ACTION_SIZE + LEN_SIZE
    out = np.empty(header + n * entry_header + int(offsets[-1] - offsets[0]), np.uint8)
    out[:header] = np.frombuffer(
        (V2_MAGIC if hash_size else b"") + struct.pack("<I", n), np.uint8)
    if hashes is None:
        hashes = np.empty(0, np.uint64)
    end = _k.encode(out, header, hash_size, keys, actions, offsets, data, hashes)
    assert end == out.shape[0]
    return out.tobytes()


def _encoder_inputs(keys, actions, values):
    if isinstance(keys, np.ndarray):
        k = np.ascontiguousarray(keys, dtype=np.uint8)
    else:
        keys = list(keys)
        if any(len(x) != KEY_SIZE for x in keys):
            raise ValueError(f"keys: every key must be {KEY_SIZE} bytes")
        k = np.frombuffer(b"".join(keys), np.uint8).reshape(len(keys), KEY_SIZE)
    if k.ndim != 2 or k.shape[1] != KEY_SIZE:
        raise ValueError(f"keys must be (n, {KEY_SIZE}) uint8, got shape {k.shape}")
    n = k.shape[0]
    a = np.asarray(actions, dtype=np.uint8)
    if a.shape != (n,):
        raise ValueError(f"actions must have shape ({n},), got {a.shape}")
    if isinstance(values, tuple):
        offsets = np.asarray(values[0], dtype=np.int64)
        data = np.frombuffer(values[1], np.uint8) if not isinstance(values[1], np.ndarray) \
            else np.ascontiguousarray(values[1], dtype=np.uint8)
        if offsets.shape != (n + 1,) or (n and (offsets[0] < 0 or offsets[-1] > data.size)):
            raise ValueError(f"values: offsets must have shape ({n + 1},) and lie in data")
    else:
        vals = [b"" if v is None else v for v in values]
        if len(vals) != n:
            raise ValueError(f"values has {len(vals)} items but keys has {n}")
        offsets = np.zeros(n + 1, np.int64)
        np.cumsum(np.fromiter(map(len, vals), np.int64, n), out=offsets[1:])
        data = np.frombuffer(b"".join(vals), np.uint8)
    lens = np.diff(offsets)
    if n and (lens.min() < 0 or lens.max() > _U32):  # the kernel trusts these
        raise ValueError("values: each length must be in 0..2**32-1")
    return k, a, offsets, data

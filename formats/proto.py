"""The upstream Teranode txmeta topic (`--format proto`): one protobuf message per transaction.

Producers: Teranode's validator in the releases before the v1/v2 batch formats
(formats/wire.py), our load generator and tests. Consumers: our workers (this module's
`decode_many`), those releases' subtree validation. The message, as Teranode defines it
in `util/kafka/kafka_message/kafka_messages.proto` (proto3, package `kafkamessage`)::

    enum KafkaTxMetaActionType { ADD = 0; DELETE = 1; }
    message KafkaTxMetaTopicMessage {
      string txHash = 1;                 // some releases: bytes
      KafkaTxMetaActionType action = 2;
      bytes content = 3;                 // Teranode MetaBytes (formats/txmeta.py); empty for DELETE
    }

Releases differ in `txHash`: a `string`, the hex of the hash in chainhash's display order
(the validator sends `txHash.String()`, bytes reversed), or `bytes`, the 32 raw bytes
(`txHash.CloneBytes()`). Both are protobuf's length-delimited wire type, so the message
is declared here with `bytes txHash = 1`: it reads either without the UTF-8 check a
`string` field makes, and the length tells the forms apart. The descriptor is built at
import time from descriptor_pb2 into a pool of its own (`message_class`), so there is no
generated code to keep current and no clash with another `kafkamessage` package a
process may load; tests/formats/test_proto.py checks its names, numbers and types, and
golden bytes written from the protobuf encoding rules.

The key (what the cache stores under):
- a 32-byte txHash is the key as it is;
- a 64-character hex txHash (either case, as Go's hex decoder takes) is the hash in
  chainhash's display order: the key is its bytes reversed, the same key a v1 message
  carries for that transaction.

What a receiver MUST check (and `decode_many` does), each failure counted as a
malformed message and skipped, its neighbours applied:
1. The bytes parse as the message (protobuf's own parser; a Kafka value of None reads
   as an empty message). Unknown fields are ignored, as protobuf's contract says, so
   a later release may add fields.
2. txHash is 32 bytes, or 64 hex characters. Anything else (empty, 31 or 33 bytes,
   63 or 65 characters, a non-hex character) is malformed: chainhash's own parser pads
   a short string with zeros, which would store the entry under another key.
3. content is at most the cache's max_value, whatever the action (as in wire.py: a
   length no record can have is damage).
4. action ADD (0) or DELETE (1). Any other value (proto3 enums are open: it parses) is
   skipped and counted as an unknown action, not as malformed.

Choices where the format is silent: an absent action is ADD (proto3's default, as in
Teranode); an ADD with no content stores an empty value (as a v1 entry of length 0);
a DELETE that carries content is applied as a DELETE and counted in
`Batch.delete_payloads`, its content ignored.

Speed: the parse is a protobuf call per message, in C (upb); everything after it is
done over the whole batch in numpy: the hex keys decoded and reversed together, the
checks, the values laid back to back in one buffer, and one apply by the worker.
"""

from __future__ import annotations

import functools
from itertools import compress

import numpy as np

from shmcache.formats import wire

PACKAGE = "kafkamessage"
MESSAGE = f"{PACKAGE}.KafkaTxMetaTopicMessage"
ACTION_ENUM = f"{PACKAGE}.KafkaTxMetaActionType"
FIELD_TX_HASH, FIELD_ACTION, FIELD_CONTENT = 1, 2, 3
HASH_FORMS = ("raw", "hex")  # how a producer writes txHash: 32 raw bytes, or hex of the reversed bytes
RAW_SIZE = wire.KEY_SIZE  # 32
HEX_SIZE = 2 * wire.KEY_SIZE  # 64 characters: two per byte
ADD, DELETE = wire.ADD, wire.DELETE  # the enum's values are the wire formats' action bytes

_INVALID = 0xFF
_NIBBLE = np.full(256, _INVALID, np.uint8)  # ASCII byte -> its hex digit's value, or _INVALID
_NIBBLE[np.frombuffer(b"0123456789", np.uint8)] = np.arange(10)
_NIBBLE[np.frombuffer(b"abcdef", np.uint8)] = np.arange(10, 16)
_NIBBLE[np.frombuffer(b"ABCDEF", np.uint8)] = np.arange(10, 16)
_HEX_DIGITS = np.frombuffer(b"0123456789abcdef", np.uint8)


@functools.cache
def message_class():
    """The KafkaTxMetaTopicMessage class, from a descriptor built here (see the docstring).
    ImportError saying what to install if the protobuf package is missing."""
    try:
        from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
    except ImportError:
        raise ImportError("the proto wire format needs the protobuf package: "
                          "pip install 'shmcache[kafka]' (or protobuf>=5.26)") from None
    F = descriptor_pb2.FieldDescriptorProto
    f = descriptor_pb2.FileDescriptorProto(name="shmcache/kafka_messages.proto", package=PACKAGE, syntax="proto3")
    enum = f.enum_type.add(name=ACTION_ENUM.rpartition(".")[2])
    enum.value.add(name="ADD", number=ADD)
    enum.value.add(name="DELETE", number=DELETE)
    m = f.message_type.add(name=MESSAGE.rpartition(".")[2])
    m.field.add(name="txHash", json_name="txHash", number=FIELD_TX_HASH, label=F.LABEL_OPTIONAL, type=F.TYPE_BYTES)
    m.field.add(name="action", json_name="action", number=FIELD_ACTION, label=F.LABEL_OPTIONAL, type=F.TYPE_ENUM,
                type_name=f".{ACTION_ENUM}")
    m.field.add(name="content", json_name="content", number=FIELD_CONTENT, label=F.LABEL_OPTIONAL,
                type=F.TYPE_BYTES)
    pool = descriptor_pool.DescriptorPool()  # its own: never the default pool another kafkamessage may be in
    pool.Add(f)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(MESSAGE))


def available() -> bool:
    """Whether the protobuf package is installed (the proto format needs it)."""
    try:
        message_class()
    except ImportError:
        return False
    return True


# -- decoding --------------------------------------------------------------------------------
def decode_many(values, *, max_value: int = wire.MAX_VALUE) -> tuple[wire.Batch, list[str]]:
    """The entries of the messages `values` (bytes each, or None), in order, as one Batch
    shaped as the key/value mode's (version 0, a message per entry: `declared` the number
    of messages, `skipped` the indices of the malformed ones), and a reason for each
    skipped message, in the same order. Never raises on bad bytes (the module's rules).

    The Batch's arrays have the dtypes and flags of wire.decode_kv's, so the writer's
    apply runs the kernel compiled for kv batches."""
    wire.check_max_value(max_value)
    parse = message_class().FromString  # first: without protobuf, the ImportError that says what to install
    from google.protobuf.message import DecodeError

    problems: list[tuple[int, str]] = []  # (message index, what is wrong), in index order
    try:  # the common case, every message whole: protobuf's parse mapped over the batch, no loop of ours
        messages, parsed = list(map(parse, values)), None  # parsed None: message j is values[j]
    except (DecodeError, TypeError):  # one is not the message (or is None): one at a time, to say which
        messages, parsed = [], []
        for i, v in enumerate(values):
            try:
                messages.append(parse(b"" if v is None else v))
            except DecodeError:
                problems.append((i, f"not a protobuf {MESSAGE.rpartition('.')[2]} ({0 if v is None else len(v)} "
                                    "bytes)"))
                continue
            parsed.append(i)
    hashes = [m.txHash for m in messages]
    actions = [m.action for m in messages]
    contents = [m.content for m in messages]
    n = len(messages)
    hash_lens = np.fromiter(map(len, hashes), np.int64, n)
    content_lens = np.fromiter(map(len, contents), np.int64, n)
    action = np.fromiter(actions, np.int64, n)
    keys, key_ok = _keys(hashes, hash_lens)
    too_long = content_lens > max_value
    bad = ~key_ok | too_long
    if bad.any():
        for j in np.flatnonzero(bad).tolist():
            at = j if parsed is None else parsed[j]
            problems.append((at, _why(hashes[j], bool(key_ok[j]), int(content_lens[j]), max_value)))
        problems.sort()
    known = (action == ADD) | (action == DELETE)
    keep = ~bad & known
    ends = np.cumsum(content_lens)
    starts = ends - content_lens
    kept_actions = action[keep].astype(np.uint8)
    lens = np.where(kept_actions == ADD, content_lens[keep], 0).astype(np.int32)
    error = problems[0][1] if problems else None
    return wire.Batch(
        keys=keys[keep], actions=kept_actions, value_starts=starts[keep], value_lens=lens,
        data=np.frombuffer(b"".join(contents), np.uint8), version=0, declared=len(values),
        unknown_actions=int(np.count_nonzero(~bad & ~known)), error=error,
        error_at=problems[0][0] if problems else -1,
        delete_payloads=int(np.count_nonzero(keep & (action == DELETE) & (content_lens > 0))),
        skipped=np.array([i for i, _ in problems], np.int64)), [why for _, why in problems]


def _keys(hashes: list, lens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The (n, 32) keys of n txHash values and whether each is well formed (rule 2): raw
    ones as they are, hex ones decoded and reversed, all rows at once."""
    n = lens.shape[0]
    raw, hexed = lens == RAW_SIZE, lens == HEX_SIZE
    if raw.all():  # one release's topic is all one form: no masks
        return np.frombuffer(b"".join(hashes), np.uint8).reshape(n, RAW_SIZE).copy(), raw
    if hexed.all():
        return keys_from_hex(np.frombuffer(b"".join(hashes), np.uint8).reshape(n, HEX_SIZE))
    keys = np.zeros((n, RAW_SIZE), np.uint8)
    ok = raw.copy()
    if raw.any():
        keys[raw] = np.frombuffer(b"".join(compress(hashes, raw.tolist())), np.uint8).reshape(-1, RAW_SIZE)
    if hexed.any():
        text = np.frombuffer(b"".join(compress(hashes, hexed.tolist())), np.uint8).reshape(-1, HEX_SIZE)
        key, digits = keys_from_hex(text)
        keys[hexed] = key
        ok[hexed] = digits
    return keys, ok


def keys_from_hex(text: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Keys from (n, 64) uint8 rows of hex text in chainhash's display order: the decoded
    bytes reversed, (n, 32) uint8; and per row whether every character is a hex digit
    (a row that is not has an undefined key)."""
    nibbles = _NIBBLE[text]
    ok = (nibbles != _INVALID).all(axis=1)
    key = (nibbles[:, 0::2] << 4) | (nibbles[:, 1::2] & 0x0F)
    return np.ascontiguousarray(key[:, ::-1]), ok


def _why(tx_hash: bytes, key_ok: bool, content_len: int, max_value: int) -> str:
    """What is wrong with a parsed message: its txHash first (rule 2), then its content (rule 3)."""
    if key_ok:
        return f"content of {content_len} bytes exceeds max_value {max_value}"
    if len(tx_hash) == HEX_SIZE:
        return f"txHash of {HEX_SIZE} characters is not hex: {tx_hash.decode('ascii', 'replace')!r}"
    return f"txHash of {len(tx_hash)} bytes, want {RAW_SIZE} raw bytes or {HEX_SIZE} hex characters"


# -- encoding (the load generator, tests) ----------------------------------------------------
def hash_fields(keys, form: str = "raw") -> np.ndarray:
    """The txHash field of each key as a producer writes it: (n, 32) raw bytes, or (n, 64)
    ASCII hex of the key's bytes reversed (chainhash's String()). Also the Kafka key the
    load generator gives each message, so a DELETE goes where its ADD went."""
    if form not in HASH_FORMS:
        raise ValueError(f"form={form!r}: expected one of {', '.join(HASH_FORMS)}")
    keys = np.ascontiguousarray(keys, np.uint8)
    if keys.ndim != 2 or keys.shape[1] != RAW_SIZE:
        raise ValueError(f"keys must be (n, {RAW_SIZE}) uint8, got shape {keys.shape}")
    if form == "raw":
        return keys
    shown = keys[:, ::-1]
    out = np.empty((keys.shape[0], HEX_SIZE), np.uint8)
    out[:, 0::2] = _HEX_DIGITS[shown >> 4]
    out[:, 1::2] = _HEX_DIGITS[shown & 0x0F]
    return out


def encode(keys, actions, values, *, form: str = "raw") -> list[bytes]:
    """One serialized KafkaTxMetaTopicMessage per entry, by the protobuf library. `keys`:
    (n, 32) uint8; `actions`: n ints (any, so tests can send unknown ones); `values` as for
    wire.encode_v1 (a DELETE's value is sent if given). Not checked against max_value."""
    k, a, offsets, data = wire._encoder_inputs(keys, actions, values)
    fields = hash_fields(k, form)
    cls = message_class()
    buf, o, width = data.tobytes(), offsets.tolist(), fields.shape[1]
    flat = fields.tobytes()
    return [cls(txHash=flat[i * width:(i + 1) * width], action=act, content=buf[o[i]:o[i + 1]]).SerializeToString()
            for i, act in enumerate(a.tolist())]

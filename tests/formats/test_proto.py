"""The upstream Teranode topic format (formats/proto.py), without a broker: the message's
definition against Teranode's, golden bytes written from protobuf's encoding rules, how a
txHash becomes a key (raw as it is; hex reversed, as the v1 key of the same transaction),
what is malformed, unknown or damage, and the batched decode against a reference that
takes one message at a time.
"""

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shmcache.engine import table
from shmcache.formats import proto, wire

ADD, DELETE = wire.ADD, wire.DELETE
# The coinbase of Bitcoin's genesis block: its txid as chainhash's String() shows it, and its
# bytes as a block's merkle root (and Teranode's chainhash.Hash, and a v1 message) hold them.
GENESIS_TXID = "4a5e1e4baab89f3a32518a88c31bc87f618f76673e2cc77ab2127b7afdeda33b"
GENESIS_KEY = bytes.fromhex("3ba3edfd7a7b12b27ac72c3e67768f617fc81bc3888a51323a9fb8aa4b1e5e4a")


def _len(n: int) -> bytes:
    """A protobuf varint (the length of a length-delimited field)."""
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    return bytes(out + bytes([n]))


def _field_bytes(number: int, data: bytes) -> bytes:  # wire type 2, length-delimited
    return bytes([number << 3 | 2]) + _len(len(data)) + data


def _field_varint(number: int, value: int) -> bytes:  # wire type 0
    return bytes([number << 3]) + _len(value)


def _decode(values, max_value=wire.MAX_VALUE):
    return proto.decode_many(values, max_value=max_value)


# -- the definition -----------------------------------------------------------------------------

def test_the_message_is_teranodes_kafka_tx_meta_topic_message():
    """Names and numbers as in Teranode's util/kafka/kafka_message/kafka_messages.proto; txHash
    declared bytes, which reads the string releases' hex too (same wire type)."""
    from google.protobuf.descriptor import FieldDescriptor as F

    d = proto.message_class().DESCRIPTOR
    assert (d.full_name, d.file.package) == ("kafkamessage.KafkaTxMetaTopicMessage", "kafkamessage")
    fields = {f.name: (f.number, f.type) for f in d.fields}
    assert fields == {"txHash": (1, F.TYPE_BYTES), "action": (2, F.TYPE_ENUM), "content": (3, F.TYPE_BYTES)}
    enum = d.fields_by_name["action"].enum_type
    assert enum.full_name == "kafkamessage.KafkaTxMetaActionType"
    assert {v.name: v.number for v in enum.values} == {"ADD": ADD, "DELETE": DELETE}
    assert not enum.is_closed  # proto3: an unknown action parses (and is counted), it is not a parse error


def test_the_descriptor_is_not_in_protobufs_default_pool():
    """Our pool is our own: a process that also loads Teranode's generated code (the same
    package and names) must not get a duplicate-symbol error from either."""
    from google.protobuf import descriptor_pool

    with pytest.raises(KeyError):
        descriptor_pool.Default().FindMessageTypeByName(proto.MESSAGE)


# -- golden bytes ---------------------------------------------------------------------------------

def test_golden_raw_add():
    key, content = bytes(range(32)), b"meta-bytes"
    msg = _field_bytes(1, key) + _field_bytes(3, content)  # action ADD = 0: proto3 leaves it out
    b, why = _decode([msg])
    assert why == [] and b.error is None
    assert (len(b), b.keys[0].tobytes(), int(b.actions[0]), b.value(0)) == (1, key, ADD, content)
    assert proto.encode([key], [ADD], [content]) == [msg]  # the library writes the same bytes


def test_golden_hex_is_chainhash_order_reversed():
    """The string releases send chainhash's String(): the key is its bytes reversed."""
    msg = _field_bytes(1, GENESIS_TXID.encode()) + _field_varint(2, ADD) + _field_bytes(3, b"v")
    b, why = _decode([msg, msg.replace(GENESIS_TXID.encode(), GENESIS_TXID.upper().encode())])
    assert why == [] and len(b) == 2
    assert b.keys[0].tobytes() == b.keys[1].tobytes() == GENESIS_KEY  # Go's hex decoder takes both cases
    assert proto.encode([GENESIS_KEY], [ADD], [b"v"], form="hex") == \
        [_field_bytes(1, GENESIS_TXID.encode()) + _field_bytes(3, b"v")]


def test_golden_delete_field_order_and_unknown_fields():
    """Fields in any order, unknown fields (a later release's) ignored: protobuf's contract."""
    msg = (_field_varint(2, DELETE) + _field_varint(9, 12345) + _field_bytes(1, GENESIS_TXID.encode())
           + _field_bytes(15, b"a field of a later release"))
    b, why = _decode([msg])
    assert why == [] and (len(b), b.keys[0].tobytes(), int(b.actions[0]), int(b.value_lens[0])) == \
        (1, GENESIS_KEY, DELETE, 0)


def test_a_hex_txhash_gives_the_key_a_v1_message_carries():
    rng = np.random.default_rng(5)
    keys = rng.integers(0, 256, (50, 32), np.uint8)
    values = [rng.bytes(int(n)) for n in rng.integers(61, 142, 50)]
    v1 = wire.decode(wire.encode_v1(keys, [ADD] * 50, values))
    shown = [_field_bytes(1, bytes(k[::-1]).hex().encode()) + _field_bytes(3, v) for k, v in zip(keys, values)]
    raw = [_field_bytes(1, k.tobytes()) + _field_bytes(3, v) for k, v in zip(keys, values)]
    for msgs in (shown, raw):
        b, why = _decode(msgs)
        assert why == [] and np.array_equal(b.keys, v1.keys)
        assert [b.value(i) for i in range(50)] == [v1.value(i) for i in range(50)]


# -- malformed, unknown, damage ---------------------------------------------------------------------

BAD_HASHES = [b"", b"\x01", bytes(31), bytes(33), b"a" * 63, b"a" * 65, b"g" + b"0" * 63, b" " + b"0" * 63,
              b"0x" + b"0" * 62, b"0" * 63 + b"\xff", b"0" * 128]


@pytest.mark.parametrize("tx_hash", BAD_HASHES, ids=lambda h: f"{len(h)}B-{h[:3].hex()}")
def test_a_txhash_neither_32_bytes_nor_64_hex_characters_is_malformed(tx_hash):
    good = _field_bytes(1, bytes(32)) + _field_bytes(3, b"ok")
    b, why = _decode([good, _field_bytes(1, tx_hash) + _field_bytes(3, b"x"), good])
    assert len(b) == 2 and b.skipped.tolist() == [1] and len(why) == 1 and "txHash" in why[0]
    assert b.error == why[0] and b.error_at == 1


@pytest.mark.parametrize("junk", [b"\xff\xff\xff", b"\x0a\x20" + bytes(10), b"\x0a", b"\x1a\x05abc",
                                  b"\x08\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff", b"\x07"],
                         ids=["bad-tag", "truncated-hash", "no-length", "truncated-content", "long-varint",
                              "wire-type-7"])
def test_bytes_that_are_not_the_message_are_malformed_and_the_rest_is_kept(junk):
    good = [_field_bytes(1, bytes([i]) * 32) + _field_bytes(3, b"v%d" % i) for i in range(2)]
    b, why = _decode([good[0], junk, good[1]])
    assert [k[0] for k in b.keys.tolist()] == [0, 1] and b.skipped.tolist() == [1]
    assert "not a protobuf KafkaTxMetaTopicMessage" in why[0]


def test_an_empty_or_missing_value_has_no_txhash():
    b, why = _decode([b"", None])
    assert len(b) == 0 and b.skipped.tolist() == [0, 1] and all("txHash of 0 bytes" in w for w in why)


def test_content_over_max_value_is_damage_whatever_the_action():
    msgs = [_field_bytes(1, bytes([i]) * 32) + _field_varint(2, a) + _field_bytes(3, b"x" * 101)
            for i, a in enumerate((ADD, DELETE, 7))]
    b, why = _decode(msgs + [_field_bytes(1, bytes(32)) + _field_bytes(3, b"x" * 100)], max_value=100)
    assert b.skipped.tolist() == [0, 1, 2] and all("exceeds max_value 100" in w for w in why)
    assert len(b) == 1 and b.unknown_actions == 0


@pytest.mark.parametrize("action", [2, 7, 255, 1 << 20, -1])
def test_an_unknown_action_is_skipped_and_counted_not_malformed(action):
    msgs = [_field_bytes(1, bytes([1]) * 32) + _field_bytes(3, b"a"),
            proto.message_class()(txHash=bytes([2]) * 32, action=action, content=b"b").SerializeToString(),
            _field_bytes(1, bytes([3]) * 32) + _field_varint(2, DELETE)]
    b, why = _decode(msgs)
    assert why == [] and b.error is None and b.unknown_actions == 1
    assert [k[0] for k in b.keys.tolist()] == [1, 3] and b.actions.tolist() == [ADD, DELETE]


def test_a_delete_with_content_is_a_delete_and_counted():
    b, why = _decode([_field_bytes(1, bytes(32)) + _field_varint(2, DELETE) + _field_bytes(3, b"stray")])
    assert why == [] and b.actions.tolist() == [DELETE] and b.value_lens.tolist() == [0] and b.delete_payloads == 1


def test_an_add_without_content_stores_an_empty_value():
    b, why = _decode([_field_bytes(1, bytes(32))])
    assert why == [] and b.actions.tolist() == [ADD] and b.value(0) == b""


def test_batches_have_kv_batches_array_types():
    """The writer's apply is compiled per array type (numba): the supervisor warms it for kv
    batches, and proto batches must be of the same types to use it without compiling."""
    kv = wire.decode_kv([b"k" * 32], [b"v"])
    b, _ = _decode([_field_bytes(1, b"k" * 32) + _field_bytes(3, b"v")])
    for name in ("keys", "actions", "value_starts", "value_lens", "data"):
        x, y = getattr(kv, name), getattr(b, name)
        assert (x.dtype, x.ndim, x.flags.c_contiguous, x.flags.writeable) == \
               (y.dtype, y.ndim, y.flags.c_contiguous, y.flags.writeable), name


# -- against a reference, message by message ---------------------------------------------------------

def _reference(values, max_value):
    """What each message must give, decided one message at a time with plain Python."""
    from google.protobuf.message import DecodeError

    entries, skipped, unknown = [], [], 0
    for i, v in enumerate(values):
        try:
            m = proto.message_class().FromString(v)
        except DecodeError:
            skipped.append(i)
            continue
        h = m.txHash
        if len(h) == 32:
            key = h
        elif len(h) == 64 and all(c in b"0123456789abcdefABCDEF" for c in h):
            key = bytes.fromhex(h.decode())[::-1]
        else:
            skipped.append(i)
            continue
        if len(m.content) > max_value:
            skipped.append(i)
        elif m.action not in (ADD, DELETE):
            unknown += 1
        else:
            entries.append((key, m.action, m.content if m.action == ADD else b""))
    return entries, skipped, unknown


_message = st.builds(
    lambda key, form, action, content, damage: (key, form, action, content, damage),
    st.binary(min_size=32, max_size=32), st.sampled_from(["raw", "hex", "HEX"]),
    st.sampled_from([ADD, ADD, DELETE, 3, -2]), st.binary(max_size=40),
    st.sampled_from([None] * 6 + ["cut", "junk", "short", "nonhex"]))


def _wire_of(key, form, action, content, damage, rng_bytes):
    h = key if form == "raw" else bytes(key[::-1]).hex().encode()
    if form == "HEX":
        h = h.upper()
    if damage == "short":
        h = h[:-1]
    elif damage == "nonhex":
        h = b"z" + bytes(key[::-1]).hex().encode()[1:]
    msg = proto.message_class()(txHash=h, action=action, content=content).SerializeToString()
    if damage == "cut":
        msg = msg[:len(msg) // 2] if len(msg) > 34 else msg[:1]
    elif damage == "junk":
        msg = b"\xff" + rng_bytes
    return msg


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_message, max_size=40), st.integers(0, 48), st.binary(max_size=30))
def test_decode_many_equals_the_reference(messages, max_value, junk):
    values = [_wire_of(*m, junk) for m in messages]
    b, why = _decode(values, max_value)
    entries, skipped, unknown = _reference(values, max_value)
    assert [(b.keys[i].tobytes(), int(b.actions[i]), b.value(i)) for i in range(len(b))] == entries
    assert b.skipped.tolist() == skipped and len(why) == len(skipped)
    assert (b.unknown_actions, b.declared) == (unknown, len(values))
    assert b.error == (why[0] if why else None) and b.error_at == (skipped[0] if skipped else -1)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.none(), st.binary(max_size=120)), max_size=20))
def test_any_bytes_decode_without_raising(values):
    b, why = _decode(values, 64)
    assert len(b) + len(why) + b.unknown_actions == len(values)


# -- encoding, and into a real cache -------------------------------------------------------------------

def test_hash_fields_hex_is_chainhash_string():
    keys = np.frombuffer(GENESIS_KEY + bytes(range(32)), np.uint8).reshape(2, 32)
    text = proto.hash_fields(keys, "hex")
    assert [r.tobytes().decode() for r in text] == [GENESIS_TXID, bytes(range(32))[::-1].hex()]
    assert proto.hash_fields(keys, "raw").tobytes() == keys.tobytes()
    with pytest.raises(ValueError, match="form='base64'"):
        proto.hash_fields(keys, "base64")


def test_a_decoded_batch_applies_to_a_cache():
    rng = np.random.default_rng(2)
    keys = rng.integers(0, 256, (300, 32), np.uint8)
    values = [rng.bytes(int(n)) for n in rng.integers(61, 142, 300)]
    actions = [DELETE if i % 10 == 9 else ADD for i in range(300)]
    later = [b"" if a == DELETE else v[::-1] for a, v in zip(actions, values)]  # re-ADDs with new values, DELETEs
    msgs = proto.encode(keys, [ADD] * 300, values, form="hex") + proto.encode(keys, actions, later)
    b, why = _decode(msgs)
    assert why == [] and len(b) == 600
    name = f"t-proto-apply-{os.getpid()}"
    with table.create(name, memory="64MiB") as w:
        try:
            w.apply(b.keys, b.actions, (b.value_starts, b.value_lens, b.data))
            got = w.get_many([k.tobytes() for k in keys])
        finally:
            table.destroy(name)
    assert got == [None if a == DELETE else v for a, v in zip(actions, later)]


def test_without_the_protobuf_package_the_format_says_what_to_install():
    """protobuf is in the kafka extra: a run of the proto format without it fails at its start,
    in one line naming the package, not in every worker as it dies."""
    import subprocess
    import sys

    code = ("import sys; sys.modules['google.protobuf'] = None\n"
            "from shmcache.consumer.config import RunConfig\n"
            "from shmcache.formats import proto\n"
            "RunConfig(name='t', bootstrap='127.0.0.1:1', topic='t', format='v1')\n"
            "try:\n    proto.decode_many([b''])\nexcept ImportError as e:\n    print('decode:', e)\n"
            "try:\n    RunConfig(name='t', bootstrap='127.0.0.1:1', topic='t', format='proto')\n"
            "except ValueError as e:\n    print('run:', e)\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "decode: the proto wire format needs the protobuf package: pip install 'shmcache[kafka]'" in p.stdout
    assert "run: format='proto': the protobuf package is not installed (pip install 'shmcache[kafka]')" in p.stdout

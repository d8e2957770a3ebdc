"""The one registry of wire formats (formats/registry.py): every format there goes through
its own encoder and back through its own decoder whole, says its bytes on the wire truly,
places entries where its partitioner says, and is what every `--format` offers; a name not
there is refused with the names that are, at each place that takes one."""

from __future__ import annotations

import numpy as np
import pytest

from shmcache import cli
from shmcache.consumer.config import RunConfig
from shmcache.engine.control.layout import WIRE_FORMATS
from shmcache.formats import registry, wire, wire_batch
from shmcache.produce import loadgen

FORMATS = list(registry.FORMATS.values())


def _entries(n: int, seed: int, deletes: bool = True):
    rng = np.random.default_rng(seed)
    keys = rng.integers(0, 256, (n, 32), np.uint8)
    actions = np.where(rng.random(n) < 0.3, wire.DELETE, wire.ADD).astype(np.uint8) if deletes else \
        np.full(n, wire.ADD, np.uint8)
    lens = np.where(actions == wire.ADD, rng.integers(128, 142, n), 0)  # proto's 2-byte length: 128 B and up
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(lens, out=offsets[1:])
    return keys, actions, offsets, rng.integers(0, 256, int(offsets[-1]), np.uint8)


def test_the_names_are_the_segments_codes_in_order():
    assert registry.NAMES == WIRE_FORMATS
    assert [f.code for f in FORMATS] == list(range(1, len(FORMATS) + 1))


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_what_a_format_encodes_its_decoder_gives_back_whole(fmt):
    keys, actions, offsets, data = _entries(300, 1)
    messages = fmt.encode(keys, actions, offsets, data, 4, "raw")
    d = fmt.decode([m.value for m in messages], [m.key for m in messages], key_size=32, max_value=wire.MAX_VALUE,
                   scratch=wire_batch.Scratch())
    assert d.malformed == []
    got = [(b.keys[i].tobytes(), int(b.actions[i]), b.value(i) if b.actions[i] == wire.ADD else None)
           for b in d.batches for i in range(len(b))]
    # v2 sends a message a partition: an entry's order is kept within its partition
    sent = [(keys[i].tobytes(), int(actions[i]), data[offsets[i]:offsets[i + 1]].tobytes()
             if actions[i] == wire.ADD else None) for i in range(len(keys))]
    assert sorted(got) == sorted(sent)


@pytest.mark.parametrize(("fmt", "form"), [(f, "raw") for f in FORMATS] + [(registry.get("proto"), "hex")],
                         ids=lambda x: getattr(x, "name", x))
def test_a_formats_bytes_on_the_wire_are_its_overhead_and_headers_and_values(fmt, form):
    keys, actions, offsets, data = _entries(200, 2, deletes=False)
    messages = fmt.encode(keys, actions, offsets, data, 4, form)
    on_wire = sum(len(m.value) for m in messages) + (0 if fmt.by_message else sum(len(m.key or b"") for m in messages))
    assert on_wire == len(messages) * fmt.header + len(keys) * fmt.overhead(form) + len(data)


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_each_message_goes_where_the_formats_partitions_say(fmt):
    keys, actions, offsets, data = _entries(500, 3)
    messages = fmt.encode(keys, actions, offsets, data, 8, "raw")
    placed = fmt.partitions_of(keys, 8, "raw")
    if fmt.by_message:  # one message, keyed by its first key
        assert len(messages) == 1 and (placed == messages[0].expect).all()
        return
    told = [m.partition if m.partition is not None else m.expect for m in messages]
    if fmt.batched:  # a message a partition, its entries' partition
        assert sorted(told) == sorted(set(placed.tolist()))
    else:  # a message an entry, in order
        assert told == placed.tolist()


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_a_formats_empty_batches_apply_as_nothing(fmt):
    for b in fmt.warm(wire_batch.Scratch()):
        assert len(b) == 0


def test_an_unknown_format_is_refused_with_the_names_there_are_at_every_place():
    names = ", ".join(registry.NAMES)
    with pytest.raises(ValueError, match=f"format='v3': expected one of {names}$"):
        registry.get("v3")
    with pytest.raises(ValueError, match=f"format='v3': expected one of {names}$"):
        RunConfig(name="c", bootstrap="x:1", topic="t", format="v3").validate()
    with pytest.raises(ValueError, match=f"format='v3': expected one of {names}$"):
        loadgen.LoadConfig(bootstrap="x:1", topic="t", format="v3").validate()
    with pytest.raises(ValueError, match=f"format='v3': expected one of {names}$"):
        loadgen.Generator("v3", 4, 0.1, np.random.default_rng(0))
    with pytest.raises(ValueError, match="format='kv': Spark writes v1, v2"):
        registry.get_spark("kv")


def test_a_format_of_fixed_keys_refuses_another_key_size():
    with pytest.raises(ValueError, match="key_size=16: format 'v1' carries 32-byte keys; use a format of any key "
                                         "size \\(kv\\)"):
        RunConfig(name="c", bootstrap="x:1", topic="t", format="v1", key_size=16).validate()
    RunConfig(name="c", bootstrap="x:1", topic="t", format="kv", key_size=16).validate()


def _choices(argv: list[str]) -> tuple:
    """The --format choices of the command `argv` (its subparsers walked by name)."""
    p = cli.parser()
    for word in argv:
        sub = next(a for a in p._actions if a.__class__.__name__ == "_SubParsersAction")
        p = sub.choices[word]
    return tuple(next(a for a in p._actions if "--format" in a.option_strings).choices)


def test_every_format_option_offers_the_registrys():
    assert _choices(["run"]) == registry.NAMES
    assert _choices(["produce"]) == registry.NAMES
    assert _choices(["demo"]) == registry.SPARK
    assert _choices(["spark", "publish"]) == registry.SPARK

"""The golden cases (tests/lib/shmtest/golden_segments.py makes the base segment): the base itself,
the states a dead or stopped writer leaves, damaged buckets and records, and damaged
headers. `build()` returns {case: (segment bytes, expectation)}; `write_all()` writes
them to golden/."""

from __future__ import annotations

import json

from shmtest.golden_segments import (CREATED_NS, CREATION_ID, DEAD_OWNER, GOLDEN, MAX_VALUE, Keys, Segment, _make_segment,
                     _script, parts, write_cases)

from shmcache.engine import layout as L


def _expect_keys(exp: dict, why: dict, override: dict | None = None) -> list[dict]:
    """Expected answers in a stable order; override {key: (value, corrupt, why)}."""
    out = []
    for k, v in exp.items():
        val, corrupt, note = (override or {}).get(k, (v, False, why[k]))
        out.append({"key": k.hex(), "value": None if val is None else val.hex(), "corrupt": corrupt, "why": note})
    return out


def build() -> dict[str, tuple[bytes, dict]]:
    ops, exp, why, buckets, ring_keys, full_keys = _script(Keys())
    base = _make_segment(ops)
    seg = Segment(base)
    seg.set(L.H_CREATION_ID * L.WORD, CREATION_ID)
    seg.set(L.H_CREATED_NS * L.WORD, CREATED_NS)
    live = sum(seg.word(seg.meta(b, L.M_LIVE)) for b in range(L.NBUCKETS))
    assert live == sum(v is not None for v in exp.values()), "the writer kept other entries than the script says"
    assert seg.word(seg.meta(buckets["full"], L.M_LIVE)) == seg.geo.max_live
    assert seg.word(seg.meta(buckets["fifo"], L.M_HEAD)) > 3 * seg.geo.ring  # wrapped three times
    cases: dict[str, tuple[bytes, dict]] = {"base": (bytes(base), {"entries": live, "keys": _expect_keys(exp, why)})}

    def variant(name, patch, keys_override=None, note="", **extra):
        s = Segment(bytearray(base))
        patch(s)
        cases[name] = (bytes(s.data), {"about": note, "keys": _expect_keys(exp, why, keys_override), **extra})

    fb = buckets["full"]
    full_live = [k for k in full_keys if exp[k] is not None]
    half_deleted = full_live[0]

    def dead_writer(s):  # killed mid-delete: the record is DEAD, its slot not yet removed
        s.set(s.meta(fb, L.M_LOCK), DEAD_OWNER)
        s.set(s.meta(fb, L.M_VERSION), s.word(s.meta(fb, L.M_VERSION)) + 1)
        rec = s.record(half_deleted)
        s.set(rec + 8, L.F_DEAD << 32 | (s.word(rec + 8) & 0xFFFFFFFF))
    variant("dead_writer", dead_writer, {half_deleted: (None, False, "a dead writer's half-done delete")},
            "the full bucket's version is odd and its lock held by a dead process (pid 2^31-1): read as it "
            "stands, nothing counted")

    def odd_free(s):
        s.set(s.meta(fb, L.M_VERSION), s.word(s.meta(fb, L.M_VERSION)) + 1)
    variant("odd_unlocked", odd_free, {k: (exp[k], True, "odd version, no lock holder: damage, read as it "
                                           "stands, one corruption per call") for k in full_keys},
            "the full bucket's version is odd with its lock free")

    lock_off = writer_off = None

    def live_holder(s):
        nonlocal lock_off, writer_off
        lock_off = s.meta(fb, L.M_LOCK)
        writer_off = s.geo.writers_off + L.W_OWNER * L.WORD  # writer row 0
        s.set(lock_off, DEAD_OWNER)
        s.set(s.meta(fb, L.M_VERSION), s.word(s.meta(fb, L.M_VERSION)) + 1)
    variant("live_holder", live_holder,
            {k: (None, True, "held mid-write by a live process: given up after the bound, a miss") for k in full_keys},
            "the full bucket's version is odd and its lock held: fill the words at live_holder_offset (the "
            "bucket's lock) and live_writer_offset (writer row 0) with a live process's owner word, and hold the "
            "owner lock of the latter (section 13), before attaching (a reader's own word is alive without both)")
    cases["live_holder"][1]["live_holder_offset"] = lock_off
    cases["live_holder"][1]["live_writer_offset"] = writer_off

    variant("locked_even", lambda s: s.set(s.meta(fb, L.M_LOCK), DEAD_OWNER), None,
            "the full bucket's lock is held (by a dead process) with an even version: a reader ignores the lock")

    victims = iter([k for k, v in exp.items() if v is not None and parts(k)[1] not in buckets.values()])
    damage = {}

    def slot_patch(fn, note):
        k = next(victims)
        damage[k] = note
        return lambda s: fn(s, k, *s.slot_of(k))

    def outside(s, k, off, pos):
        s.set(off, (parts(k)[3] << L.POS_BITS) | (s.geo.ring + 1))
    variant("slot_outside_ring", slot_patch(outside, "its slot points past the ring's end"),
            {k: (None, True, n) for k, n in damage.items()}, "an index slot points outside its ring")
    damage.clear()

    def unaligned(s, k, off, pos):
        s.set(off, (parts(k)[3] << L.POS_BITS) | (pos + 8 + 1))
    variant("slot_unaligned", slot_patch(unaligned, "its slot's offset is not 16-aligned"),
            {k: (None, True, n) for k, n in damage.items()}, "an index slot's offset is not a record's")
    damage.clear()

    def too_long(s, k, off, pos):
        s.set(s.record(k) + 8, L.F_LIVE << 32 | (MAX_VALUE + 1))
    variant("length_over_max", slot_patch(too_long, "its record's length is max_value + 1"),
            {k: (None, True, n) for k, n in damage.items()}, "a record's length is over max_value")
    damage.clear()

    late = next(k for k in ring_keys if exp[k] is not None and Segment(base).slot_of(k)[1] + 48 + MAX_VALUE > 320)

    def past_end(s):
        s.set(s.record(late) + 8, L.F_LIVE << 32 | MAX_VALUE)
    variant("length_past_ring", past_end, {late: (None, True, "its record's value would run past the ring's end")},
            "a record's length (<= max_value) runs past its ring's end")

    def dead_flag(s, k, off, pos):
        rec = s.record(k)
        s.set(rec + 8, L.F_DEAD << 32 | (s.word(rec + 8) & 0xFFFFFFFF))
    variant("record_dead_flagged", slot_patch(dead_flag, "its slot points at its record flagged DEAD"),
            {k: (None, True, n) for k, n in damage.items()}, "a live key's record is flagged DEAD, even version")
    damage.clear()

    def hash_word(s, k, off, pos):
        s.set(s.record(k), s.word(s.record(k)) ^ 1)
    variant("record_hash_changed", slot_patch(hash_word, "its record's hash word is another key's: not its record"),
            {k: (None, False, n) for k, n in damage.items()}, "a record's hash word changed: a plain miss")
    damage.clear()

    def bucket_words(s):
        for w, v in ((L.M_HEAD, -16), (L.M_TAIL, 7), (L.M_LIVE, 1 << 40), (L.M_LIVE_BYTES, -1)):
            s.set(s.meta(fb, w), v)
    variant("bucket_words", bucket_words, None,
            "the full bucket's head, tail and counts are impossible: a lookup does not read them")

    for field, word, value, kind in (
            ("magic", L.H_MAGIC, 0, "not_a_cache"), ("magic", L.H_MAGIC, 0x1234, "not_a_cache"),
            ("version", L.H_VERSION, 2, "version"), ("nbuckets", L.H_NBUCKETS, 4096, "corrupt"),
            ("key_size", L.H_KEY_SIZE, 0, "corrupt"), ("key_size", L.H_KEY_SIZE, L.MAX_KEY_SIZE + 1, "corrupt"),
            ("max_value", L.H_MAX_VALUE, -1, "corrupt"), ("slots", L.H_SLOTS, 12, "corrupt"),
            ("slots", L.H_SLOTS, 4, "corrupt"), ("slots", L.H_SLOTS, 1 << 50, "corrupt"), ("ring", L.H_RING, 328, "corrupt"),
            ("ring", L.H_RING, 144, "corrupt"), ("size", L.H_SIZE, len(base) + L.PAGE, "corrupt"),
            ("topic_len", L.H_TOPIC_LEN, L.TOPIC_MAX + 1, "corrupt"),
            ("partitions", L.H_PARTITIONS, L.MAX_PARTITIONS + 1, "corrupt")):
        name = f"header_{field}_{value & 0xFFFFFFFFFFFFFFFF:x}"
        s = Segment(bytearray(base))
        s.set(word * L.WORD, value)
        cases[name] = (bytes(s.data), {"attach_error": kind, "field": field if kind == "corrupt" else None})
    s = Segment(bytearray(base))  # slots 2^46 pass their own check: the size derived from them is the error
    s.set(L.H_SLOTS * L.WORD, 1 << 46)
    cases["header_slots_400000000000"] = (bytes(s.data), {"attach_error": "corrupt", "field": "size"})
    cases["truncated"] = (bytes(base[:-L.PAGE]), {"attach_error": "corrupt", "field": "size"})
    cases["truncated_below_a_page"] = (bytes(base[:100]), {"attach_error": "not_a_cache", "field": None})
    return cases


def expectations(cases) -> str:
    doc = {"format": "docs/segment-format.md, layout version %d" % L.LAYOUT_VERSION,
           "key_size": 32, "max_value": MAX_VALUE,
           "cases": {name: {"file": f"{name}.shm.gz", **exp} for name, (_, exp) in sorted(cases.items())}}
    return json.dumps(doc, indent=1, sort_keys=True) + "\n"


def write_all() -> None:
    """golden/*.shm.gz and expect.json, and the control areas built on the base (golden/control/)."""
    from shmtest.golden_control import write_all as write_control

    cases = build()
    write_cases(GOLDEN, cases, expectations(cases))
    write_control(cases["base"][0])

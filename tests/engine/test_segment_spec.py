"""docs/segment-format.md is the contract other readers (go/, the JVM reader) are written
from: every constant its tables give must be the engine's own (engine/layout.py and
engine/control/layout.py, and the few named by module: reader.SPIN_LIMIT, reader_stats.MAGIC, ...), and every constant a
reader needs must be in a table. A change to the layout that the document does not
follow fails here."""

from __future__ import annotations

import re
from pathlib import Path

from shmcache.engine import layout, reader, reader_stats
from shmcache.engine.control import layout as control_layout
from shmcache.engine.control import status as control_status

DOC = Path(__file__).resolve().parents[2] / "docs" / "segment-format.md"
ROW = re.compile(r"^\| `((?:[a-z_]+\.)?[A-Z][A-Z0-9_]*)` \| ([^|]+) \|", re.M)  # a constant: upper case
# The document's prefixes name the module a constant is in (the Go and Java readers' tests
# read the same names from the document, so they stay as written when a module moves):
# control_status is engine/control/status.py.
MODULES = {"reader": reader, "reader_stats": reader_stats, "control_status": control_status}

# What a reader cannot work without: each must be in a table of the document.
NEEDED = [
    "MAGIC", "LAYOUT_VERSION", "PAGE", "WORD", "ROW_WORDS", "BUCKET_BITS", "NBUCKETS", "MAX_WRITERS",
    "MAX_WORKERS", "MAX_PARTITIONS", "FIXED_BYTES", "H_MAGIC", "H_VERSION", "H_KEY_SIZE", "H_MAX_VALUE",
    "H_NBUCKETS", "H_SLOTS", "H_RING", "H_SIZE", "H_CREATION_ID", "H_TOPIC_LEN", "H_PARTITIONS", "TOPIC_MAX",
    "MAX_KEY_SIZE", "MIN_SLOTS", "M_LOCK", "M_VERSION", "M_LIVE", "M_LIVE_BYTES", "M_EVICTIONS", "M_TAKEOVERS",
    "TAG_SHIFT", "POS_BITS", "POS_MASK", "RECORD_ALIGN", "RECORD_HEADER", "F_LIVE", "F_DEAD", "F_PAD",
    "H_SUPERVISOR", "H_SUPERVISOR_HEARTBEAT", "H_AGE_CLOCK", "AGE_CLOCK_MONOTONIC", "H_REBALANCES",
    "H_ASSIGNING", "H_ACCEPT_GAPS", "H_WORKER_STALE_NS", "H_BROKER_STATE", "BROKER_WAITING",
    "H_WORKER_HANDLES", "H_GAP_BITS", "P_APPLIED", "P_HIGH_WATERMARK", "P_OWNER", "P_CAUGHT_UP",
    "P_ASSIGNED", "K_OWNER", "K_HEARTBEAT", "K_STARTS", "W_OWNER", "W_WAIT", "W_SETS", "W_DELETES",
    "W_CORRUPTIONS", "reader.SPIN_LIMIT", "reader.STUCK_GIVE_UP", "reader_stats.MAGIC",
    "reader_stats.VERSION", "reader_stats.H_CREATION_ID", "reader_stats.MAX_READERS",
    "reader_stats.R_OWNER", "reader_stats.R_HITS", "reader_stats.R_MISSES", "reader_stats.R_BATCHES",
    "reader_stats.R_RETRIES", "reader_stats.R_CORRUPTIONS", "control_status.STALE_HEARTBEAT_S",
    "H_BROKER_SINCE", "BROKER_UNKNOWN", "BROKER_UP", "H_GROUP_MEMBERS", "H_GROUP_CHECKED", "H_GROUP_TEXT_LEN",
    "H_GROUP_TEXT", "GROUP_TEXT_MAX", "H_LOOKUP_FAILING_SINCE", "H_LOOKUP_TEXT_LEN", "H_LOOKUP_TEXT",
    "LOOKUP_TEXT_MAX", "WORKER_STATES", "H_ELSEWHERE", "H_GAP_OFFSETS", "P_LATEST", "H_OWNER_LOCKS",
    "reader_stats.LOCKS_SINCE",
]


def _tables() -> dict[str, str]:
    rows: dict[str, str] = {}
    for name, value in ROW.findall(DOC.read_text()):
        assert name not in rows or rows[name] == value.strip(), f"{name} is given twice, differently"
        rows[name] = value.strip()
    return rows


def _engine_value(name: str):
    module, _, attr = name.rpartition(".")
    if module:
        return getattr(MODULES[module], attr)
    return getattr(layout, attr) if hasattr(layout, attr) else getattr(control_layout, attr)


def test_every_table_constant_is_the_engines():
    rows = _tables()
    assert len(rows) >= len(NEEDED)
    for name, text in rows.items():
        want = _engine_value(name)
        if isinstance(want, tuple):  # a list of names, in order
            got = tuple(text.strip("`").split(", "))
        else:
            got = float(text) if isinstance(want, float) else int(text, 0)
        assert got == want, f"docs/segment-format.md gives {name} = {text}; the engine has {want!r}"


def test_every_constant_a_reader_needs_is_in_a_table():
    missing = [n for n in NEEDED if n not in _tables()]
    assert not missing, f"docs/segment-format.md has no table row for {missing}"


def test_derived_figures_in_the_text():
    """The figures the prose derives (section offsets, the size formula) hold for a planned geometry."""
    text = DOC.read_text()
    geo = layout.Geometry.plan(64 << 20, 32, 4096)
    assert f"`meta_off` = {geo.meta_off}" in text
    assert f"`index_off` = {geo.index_off}" in text
    assert geo.index_off == layout.FIXED_BYTES
    assert geo.size == layout.align(layout.FIXED_BYTES + layout.NBUCKETS * geo.slots * layout.WORD,
                                    layout.PAGE) + layout.NBUCKETS * geo.ring
    assert layout.POS_MASK == (1 << layout.POS_BITS) - 1 and layout.NBUCKETS == 1 << layout.BUCKET_BITS
    assert layout.record_size(32, 0) == 48 and layout.record_size(32, 17) == 80

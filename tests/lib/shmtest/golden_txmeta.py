"""The golden txmeta values (golden/txmeta/cases.json): Teranode's MetaBytes value with the
decode every reader must give, shared by the Python (formats/txmeta.py), Go (go/txmeta)
and Java (jvm/.../spark/TxMeta.java) decoders' tests, so the three cannot drift.

    .venv/bin/python -m shmtest.golden_txmeta      # rewrite golden/txmeta/cases.json

The layout (formats/txmeta.py, the reference)::

    fee u64 LE | size u64 LE | flags u8 | parentCount u32 LE      8 + 8 + 1 + 4 = 21 B
    parentCount x 32 B parent tx hashes
    per parent: voutCount u32 LE, voutCount x u32 LE vout
    [block height u32 BE]                                         present iff 4 bytes remain

A value is valid iff it parses exactly so, with 0 or 4 bytes after the last vout list;
anything else is malformed (`{"valid": false}`), never an error.

Every case is built, deterministically (sha256 of a counter, no library's random stream),
from the fields it is meant to carry; its expected decode comes from how it was built. Each
is checked against `layout_decode`, the layout above read in plain Python integers (which
do not overflow), and the generator fails if the two disagree: a case that does not say what
its name claims is the generator's bug, never a golden. `layout_decode` is not the
reference decoder; formats/txmeta.py is, and the tests hold it to these files.

Each case: `name` (family/what), `value` (hex), `expect`: `{"fee", "size", "flags",
"parents": [hex...], "parent_vouts": [[...]...], "block_height": N or null}` (the object
`get --decode txmeta` prints), or `{"valid": false}`.
"""

from __future__ import annotations

import hashlib
import json
import struct
import sys

from shmtest import REPO

PATH = REPO / "golden" / "txmeta" / "cases.json"
HASH = 32
FIXED = 8 + 8 + 1 + 4  # fee + size + flags + parentCount
HEIGHT = 4
U32, U64 = 2**32 - 1, 2**64 - 1
INVALID = {"valid": False}


class Draw:
    """Deterministic numbers from sha256 of (seed, counter): stable across Python versions."""

    def __init__(self, seed: str):
        self.seed, self.n = seed, 0

    def bits(self, k: int) -> int:
        self.n += 1
        return int.from_bytes(hashlib.sha256(f"{self.seed}:{self.n}".encode()).digest(), "little") % (1 << k)

    def below(self, n: int) -> int:
        return self.bits(64) % n

    def between(self, a: int, b: int) -> int:  # a..b inclusive
        return a + self.below(b - a + 1)

    def bytes(self, n: int) -> bytes:
        out = b""
        while len(out) < n:
            self.n += 1
            out += hashlib.sha256(f"{self.seed}:bytes:{self.n}".encode()).digest()
        return out[:n]


def parent(i: int) -> bytes:
    return hashlib.sha256(b"txmeta golden parent %d" % i).digest()


def expect_of(fee: int, size: int, flags: int, parents: list[bytes], vouts: list[list[int]],
              height: int | None) -> dict:
    return {"fee": fee, "size": size, "flags": flags, "parents": [p.hex() for p in parents],
            "parent_vouts": [list(v) for v in vouts], "block_height": height}


def encode(e: dict) -> bytes:
    """The value of an expected decode: the layout, written with struct."""
    b = struct.pack("<QQBI", e["fee"], e["size"], e["flags"], len(e["parents"]))
    b += b"".join(bytes.fromhex(p) for p in e["parents"])
    for vs in e["parent_vouts"]:
        b += struct.pack(f"<I{len(vs)}I", len(vs), *vs)
    if e["block_height"] is not None:
        b += struct.pack(">I", e["block_height"])
    return b


def layout_decode(v: bytes) -> dict:
    """The layout read in plain integers: fields, or INVALID unless it parses exactly."""
    if len(v) < FIXED:
        return INVALID
    fee, size, flags, pc = struct.unpack_from("<QQBI", v)
    p = FIXED
    if p + pc * HASH > len(v):
        return INVALID
    parents = [v[p + i * HASH:p + (i + 1) * HASH] for i in range(pc)]
    p += pc * HASH
    vouts = []
    for _ in range(pc):
        if p + 4 > len(v):
            return INVALID
        (vc,) = struct.unpack_from("<I", v, p)
        p += 4
        if p + 4 * vc > len(v):
            return INVALID
        vouts.append(list(struct.unpack_from(f"<{vc}I", v, p)))
        p += 4 * vc
    rest = len(v) - p
    if rest not in (0, HEIGHT):
        return INVALID
    return expect_of(fee, size, flags, parents, vouts, struct.unpack_from(">I", v, p)[0] if rest else None)


class Cases:
    def __init__(self):
        self.rows: list[tuple[str, bytes, dict]] = []
        self.names: set[str] = set()

    def add(self, name: str, value: bytes, expect: dict) -> None:
        if name in self.names:
            raise ValueError(f"two golden txmeta cases named {name!r}")
        got = layout_decode(value)
        if got != expect:
            raise AssertionError(f"golden txmeta case {name!r} was built to decode as {expect}, "
                                 f"but its bytes read {got}: fix the generator")
        self.names.add(name)
        self.rows.append((name, value, expect))

    def valid(self, name: str, e: dict) -> dict:
        self.add(name, encode(e), e)
        return e


def _rec(fee=1234, size=250, flags=0, nparents=1, vouts=None, height=None, first=0) -> dict:
    vouts = [[j % 4] for j in range(nparents)] if vouts is None else vouts
    return expect_of(fee, size, flags, [parent(first + j) for j in range(len(vouts))], vouts, height)


def valid_cases(c: Cases, d: Draw) -> None:
    for n in (0, 1, 2, 3, 5, 16, 48, 49, 100):  # 49: one past where Teranode warns of a big value
        vouts = [list(range(j % 3 + 1)) for j in range(n)]
        for h in (None, 850_000 + n):
            c.valid(f"valid/parents-{n}/{'height' if h is not None else 'no-height'}",
                    _rec(nparents=n, vouts=vouts, height=h, first=n * 1000))
    for n in (0, 1, 2, 3, 4, 7, 8, 15, 16, 255, 256, 1000):
        for h in (None, 123_456):
            c.valid(f"valid/vouts-{n}/{'height' if h is not None else 'no-height'}",
                    _rec(vouts=[[(k * 7) % 97 for k in range(n)]], height=h))
    for i, lists in enumerate(([0, 1, 0, 5], [3, 0, 0, 0], [0, 0, 0, 2], [0, 0], [1, 0, 2, 0, 3, 0])):
        c.valid(f"valid/vout-lengths-mixed-{i}", _rec(vouts=[list(range(n)) for n in lists], height=None if i % 2 else 7))
    extremes = (0, 1, 2**32 - 1, 2**32, 2**63 - 1, 2**63, U64)
    for x in extremes:
        c.valid(f"valid/fee-{x}", _rec(fee=x, height=900_001))
        c.valid(f"valid/size-{x}", _rec(size=x))
    c.valid("valid/fee-and-size-max/no-parents", _rec(fee=U64, size=U64, vouts=[], height=U32))
    for f in (0, 1, 2, 3, 4, 8, 15, 16, 0x7F, 0x80, 0xFE, 0xFF):
        c.valid(f"valid/flags-{f}", _rec(flags=f, height=800_000 if f % 2 else None))
    for h in (0, 1, 255, 256, 2**16, 2**24, 2**31 - 1, 2**31, U32 - 1, U32):
        c.valid(f"valid/height-{h}", _rec(height=h))
    c.valid("valid/vout-values-extreme", _rec(vouts=[[0, 1, 2**31 - 1, 2**31, U32]], height=U32))
    for i in range(60):  # as the load generator makes them: 1-3 parents, 1-3 vouts, a height on half
        np_ = d.between(1, 3)
        e = expect_of(d.between(200, 49_999), d.between(150, 999), int(d.below(100) == 0),
                      [d.bytes(HASH) for _ in range(np_)], [[d.below(8) for _ in range(d.between(1, 3))]
                                                          for _ in range(np_)],
                      d.between(800_000, 899_999) if d.below(2) else None)
        c.valid(f"valid/loadgen-{i}", e)


BASES = {  # the values the malformed families damage
    "no-parents-height": _rec(vouts=[], height=850_000),
    "no-parents": _rec(vouts=[], flags=1),
    "one-parent": _rec(),
    "one-parent-height": _rec(height=850_123),
    "three-parents-height": _rec(vouts=[[1], [2, 3], []], height=812_345, first=10),
    "two-parents": _rec(vouts=[[0, 1, 2], [7]], fee=2**63, first=20),
}


def malformed_cases(c: Cases, d: Draw) -> None:
    c.add("malformed/empty", b"", INVALID)
    for name, e in BASES.items():
        v = encode(e)
        has_height = e["block_height"] is not None
        for cut in range(len(v)):
            if has_height and cut == len(v) - HEIGHT:  # the height cut off: the same record without it
                c.add(f"valid/{name}/height-cut-off", v[:cut], {**e, "block_height": None})
            else:
                c.add(f"malformed/truncated/{name}/at-{cut}", v[:cut], INVALID)
        for k in (1, 2, 3, 4, 5, 6, 7, 8, 9, 31, 32, 35, 36, 37):
            junk = d.bytes(k)
            if k == HEIGHT and not has_height:  # 4 more bytes are a height: valid
                c.add(f"valid/{name}/4-bytes-more-are-a-height", v + junk,
                      {**e, "block_height": int.from_bytes(junk, "big")})
            else:  # k or 4 + k bytes after the last list: neither 0 nor 4
                c.add(f"malformed/trailing/{name}/plus-{k}", v + junk, INVALID)

    # parent counts that cannot fit: each parent needs 32 + 4 bytes (some wrap 32-bit products)
    for name in ("one-parent", "three-parents-height", "no-parents"):
        v = encode(BASES[name])
        fits = (len(v) - FIXED) // (HASH + 4)
        for pc in sorted({fits + 1, fits + 2, 2**16, 0x08000000, 119_304_648, 0x71C71C72, 2**31 - 1, 2**31,
                          2**31 + 1, U32}):
            c.add(f"malformed/parent-count/{name}/{pc}", v[:17] + struct.pack("<I", pc) + v[FIXED:], INVALID)
    # counts that fit the first check, lists that do not: the parents' lists run out
    hashes2 = parent(1) + parent(2)
    for name, tail in (("second-list-missing", struct.pack("<II", 1, 9)),
                       ("second-count-cut", struct.pack("<II", 1, 9) + b"\xff\xff"),
                       ("second-list-short", struct.pack("<II", 0, 3) + struct.pack("<II", 1, 2)),
                       ("first-list-over", struct.pack("<II", 5, 1) + b"\xff" * 12)):
        c.add(f"malformed/lists-run-out/{name}", struct.pack("<QQBI", 5, 6, 0, 2) + hashes2 + tail, INVALID)

    # vout counts: hostile ones, and ones that re-read the bytes after them
    e = BASES["three-parents-height"]
    v = encode(e)
    at = [FIXED + 3 * HASH]  # the offset of each list's count
    for vs in e["parent_vouts"][:-1]:
        at.append(at[-1] + 4 + 4 * len(vs))
    for j, off in enumerate(at):
        n = len(e["parent_vouts"][j])
        for vc in sorted({n + 2, n + 3, 2**30, 2**30 + n, 2**31, U32}):  # 2**30 + n: vc * 4 wraps to 4n
            c.add(f"malformed/vout-count/list-{j}/{vc}", v[:off] + struct.pack("<I", vc) + v[off + 4:], INVALID)
    last = at[-1]
    as_vout = int.from_bytes(e["block_height"].to_bytes(4, "big"), "little")  # its big-endian bytes, read little
    swallowed = {**e, "parent_vouts": [*e["parent_vouts"][:-1], [as_vout]], "block_height": None}
    c.add("valid/reread/last-vout-count-plus-1-reads-the-height-as-a-vout",
          v[:last] + struct.pack("<I", 1) + v[last + 4:], swallowed)
    e2 = BASES["two-parents"]
    v2 = encode(e2)
    last2 = FIXED + 2 * HASH + 4 + 4 * 3
    c.add("valid/reread/last-vout-count-minus-1-leaves-the-vout-as-a-height",
          v2[:last2] + struct.pack("<I", 0) + v2[last2 + 4:],
          {**e2, "parent_vouts": [e2["parent_vouts"][0], []],
           "block_height": int.from_bytes(e2["parent_vouts"][1][0].to_bytes(4, "little"), "big")})
    c.add("valid/reread/first-vout-count-minus-1-reads-its-last-vout-as-the-next-count",
          v2[:FIXED + 2 * HASH] + struct.pack("<I", 2) + v2[FIXED + 2 * HASH + 4:],
          {**e2, "parent_vouts": [[0, 1], [1, 7]]})  # [0, 1], then 2 is a count of [1 (the old count), 7]

    # no parents and bytes after the fixed part that are neither 0 nor 4
    for k in [*range(1, 4), *range(5, 41)]:
        c.add(f"malformed/no-parents-plus/{k}", encode(BASES["no-parents"]) + b"\x00" * k, INVALID)

    # random bytes, and random bytes with a small parent count planted: what they decode to is the layout's
    for i in range(60):
        blob = d.bytes(d.below(200))
        c.add(f"random/bytes-{i}", blob, layout_decode(blob))
    for i in range(60):
        blob = bytearray(d.bytes(FIXED + d.below(160)))
        blob[17:21] = struct.pack("<I", d.below(4))
        for j in range(FIXED + HASH * blob[17], len(blob) - 3, 4):  # small vout counts, so some parse
            if d.below(3) == 0:
                blob[j:j + 4] = struct.pack("<I", d.below(3))
        c.add(f"random/planted-{i}", bytes(blob), layout_decode(bytes(blob)))


def build() -> list[tuple[str, bytes, dict]]:
    c, d = Cases(), Draw("shmcache txmeta golden 46")
    valid_cases(c, d)
    malformed_cases(c, d)
    return c.rows


def render(rows: list[tuple[str, bytes, dict]]) -> str:
    """The file's text: one case a line, so a diff points at the case."""
    lines = [json.dumps({"name": n, "value": v.hex(), "expect": e}, separators=(", ", ": ")) for n, v, e in rows]
    head = json.dumps({"about": "Teranode's txmeta value (MetaBytes) and its decode; made by tests/lib/shmtest/golden_txmeta.py, "
                                "see its docstring", "valid": sum(e != INVALID for _, _, e in rows),
                       "malformed": sum(e == INVALID for _, _, e in rows)})
    return head[:-1] + ', "cases": [\n' + ",\n".join(lines) + "\n]}\n"


if __name__ == "__main__":
    rows = build()
    PATH.parent.mkdir(parents=True, exist_ok=True)
    PATH.write_text(render(rows))
    print(f"{PATH}: {len(rows)} cases ({sum(e == INVALID for _, _, e in rows)} malformed)", file=sys.stderr)

"""The engine's kernels with one part taken away, each imported as a module of its own
(bench/test_lookup_bounds.py, bench/test_instructions.py and its child): what each part of a
lookup or an apply costs. A variant whose edit no longer matches the kernel's source fails."""

from __future__ import annotations

from shmtest import REPO
from shmtest.bench import peers as P

# The lookup kernel (engine/_lookup.py lookup) with one part taken away.
VARIANTS = {
    "no prefetch": [("    for j in range(start, min(n, start + _AHEAD_BUCKET)):", "    for j in range(0):"),
                    ("    for j in range(start, min(n, start + _AHEAD_RECORD)):", "    for j in range(0):"),
                    ("        if i + _AHEAD_BUCKET < n:", "        if False:"),
                    ("        if i + _AHEAD_RECORD < n:", "        if False:")],
    "hashes given": [("        hash_keys(keys8, keys64, kst, ks, hashes, 0)", "        pass")],
    "no value copy": [("copy_bytes(out, out_pos, ring8, hit, vlen)", "out[out_pos] = ring8[hit]")],
    "one version line": [("load_acquire(meta, mb + M_VERSION)", "load_acquire(meta, (mb & 7) + M_VERSION)")],
    "half as far ahead": [("_AHEAD_BUCKET = 32\n_AHEAD_RECORD = 16", "_AHEAD_BUCKET = 16\n_AHEAD_RECORD = 8")],
    "index only": [("if ring64[np.uint64(w)] == h:", "if w >= 0:"),
                   ("word = ring64[np.uint64(w + 1)]", "word = (np.int64(F_LIVE) << 32) | 100"),
                   ("elif _key_eq(ring8, ring64, rbase + off + RECORD_HEADER, keys8, keys64, koff, ks):", "else:"),
                   ("copy_bytes(out, out_pos, ring8, hit, vlen)", "out[out_pos] = 1"),
                   ("        if i + _AHEAD_RECORD < n:", "        if False:"),
                   ("    for j in range(start, min(n, start + _AHEAD_RECORD)):", "    for j in range(0):")],
}


def lookup_variant(label: str):
    """engine/_lookup.py with VARIANTS[label]'s edits, imported as a module of its own."""
    return _edited("_lookup", VARIANTS[label], label, "shmcache-bench-lookup-bounds")


def _edited(module: str, edits: list, label: str, folder: str):
    """The engine module `module` (engine/_lookup.py, engine/_kernels.py) with `edits` ((old, new)
    pairs) made, imported as a module of its own;
    an edit whose old text is no longer there fails, naming it."""
    src = (REPO / "engine" / f"{module}.py").read_text().replace("from __future__ import annotations", "")
    for old, new in edits:
        assert old in src, f"variant {label!r}: {old!r} is no longer in engine/{module}.py"
        src = src.replace(old, new)
    return P.import_source(src, f"{module}_" + label.replace(" ", "_"), folder)


# The apply kernel (engine/_kernels.py apply_entries) with one part taken away, as
# VARIANTS do for the lookup: what each part costs in instructions.
ADD_VARIANTS = {
    "no bucket prefetch": [("        if i + _AHEAD_BUCKET < n:\n", "        if False:\n"),
                           ("    for j in range(start, min(n, start + _AHEAD_BUCKET)):", "    for j in range(0):")],
    "no record prefetch": [("        if i + _AHEAD_RECORD < n:\n", "        if False:\n"),
                           ("    for j in range(start, min(n, start + _AHEAD_RECORD)):", "    for j in range(0):")],
    "no eviction stages": [("    staged = NBUCKETS * ring > _STAGED_FROM\n", "    staged = False\n")],
    "no bucket check": [("        if v & 1 or not _bucket_ok(meta, mb, ring, max_live):", "        if v & 1:")],
}


def add_variant(label: str):
    """engine/_kernels.py with ADD_VARIANTS[label]'s edits, imported as a module of its own."""
    return _edited("_kernels", ADD_VARIANTS[label], label, "shmcache-bench-add-variants")

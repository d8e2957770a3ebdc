"""Instructions per key, counted by callgrind: a measure of the kernels that the machine's
noise does not move (two runs of the same kernel agree to a few instructions in a million),
for changes too small to see in CPU time on a shared host.

    SHMCACHE_BENCH_N=20000 .venv/bin/python -m pytest bench/test_instructions.py -p no:cacheprovider -s   # ~5 min

Counted: a lookup hit (today's kernel and each of bench/test_lookup_bounds.py's variants,
50 batches of 1024 hits in a table of N entries), and a fresh ADD (hashes given, 20
batches of 20,000 into an empty 512 MiB cache; today's apply kernel and each of
shmtest.bench.kernel_variants). Each runs in tests/lib/shmtest/bench/instructions_child.py,
natively first (numba compiles into a cache of this run's own), then under
`valgrind --tool=callgrind --collect-atstart=no`, counting only between the two calls
of a 3-line C helper around the measured kernel calls: not Python, not the set-up.

The kernels are compiled for this host's CPU without AVX-512 (valgrind does not run it):
the same code as natively on a host without it, like the AMD EPYC (Zen 3) of
2026-11-24; on a host with AVX-512 the vectorised xxh64 counts many more instructions
here than it runs natively. Needs valgrind (with its headers) and a C compiler; skipped
without them and under CI=true (several minutes of CPU under valgrind).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from shmtest.bench import kernel_variants
from shmtest.bench import peers as P

HERE = Path(__file__).resolve().parent
CHILD = ["-P", "-m", "shmtest.bench.instructions_child"]  # tests/lib/shmtest/bench/instructions_child.py
TOGGLE_C = "#include <valgrind/callgrind.h>\nvoid cg_toggle(void) { CALLGRIND_TOGGLE_COLLECT; }\n"
LOOKUP_BATCHES, ADD_N, ADD_BATCHES = 50, 20_000, 20
def _cpu_env(cache_dir: str) -> dict:
    """This host's CPU and features for numba, AVX-512 removed, and a numba cache of our own."""
    import llvmlite.binding as llvm

    features = [f if "avx512" not in f else "-" + f[1:] for f in llvm.get_host_cpu_features().flatten().split(",")]
    return {**os.environ, "NUMBA_CPU_NAME": llvm.get_host_cpu_name(), "NUMBA_CPU_FEATURES": ",".join(features),
            "NUMBA_CACHE_DIR": cache_dir, "PYTHONHASHSEED": "0"}


def _count(env: dict, toggle: str, *args) -> tuple[int, int]:
    """(instructions counted, keys measured) of one child."""
    cmd = [sys.executable, *CHILD, *map(str, args), toggle]
    native = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    assert native.returncode == 0, native.stderr[-2000:]
    vg = subprocess.run(["valgrind", "--tool=callgrind", "--collect-atstart=no", "--callgrind-out-file=/dev/null",
                         *cmd], env=env, capture_output=True, text=True, timeout=3600)
    assert vg.returncode == 0, vg.stderr[-2000:]
    got = re.search(r"Collected : (\d+)", vg.stderr)
    assert got, f"no callgrind total in: {vg.stderr[-2000:]}"
    return int(got.group(1)), int(vg.stdout.split()[-1])


def _rows(lines: list, env: dict, toggle: str, kind: str, what: str, variants: dict, n: int, batches: int) -> float:
    """Count today's kernel of `kind` and each of its variants, a line each into lines (with
    the difference from today's); returns today's count per key."""
    today = 0.0
    for label in ["today", *variants]:
        total, keys = _count(env, toggle, kind, label, n, batches)
        per = total / keys
        today = today or per
        lines.append(f"  {what}, {label:18s} {per:7.1f}" + (f"  ({per - today:+.1f})" if label != "today" else ""))
    return today


def test_instructions_per_key():
    if os.environ.get("CI") == "true":
        pytest.skip("instruction counts are taken on demand (see bench/README.md), not in CI")
    if not (shutil.which("valgrind") and shutil.which("cc") and Path("/usr/include/valgrind/callgrind.h").exists()):
        pytest.skip("needs valgrind, its headers and a C compiler")

    n = P.bench_n()
    lines = [f"instructions per key (callgrind, kernel calls only); lookups: {LOOKUP_BATCHES} batches of 1024 "
             f"hits, N={n}; adds: {ADD_BATCHES} batches of {ADD_N:,} fresh keys, hashes given"]
    with tempfile.TemporaryDirectory(prefix="shmcache-bench-instructions-") as tmp:
        toggle = os.path.join(tmp, "cgtoggle.so")
        src = os.path.join(tmp, "cgtoggle.c")
        Path(src).write_text(TOGGLE_C)
        subprocess.run(["cc", "-shared", "-fPIC", "-O2", "-o", toggle, src], check=True)
        env = _cpu_env(os.path.join(tmp, "numba"))
        today = _rows(lines, env, toggle, "lookup", "lookup hit", kernel_variants.VARIANTS, n, LOOKUP_BATCHES)
        _rows(lines, env, toggle, "add", "fresh ADD", kernel_variants.ADD_VARIANTS, ADD_N, ADD_BATCHES)
    print("\n" + "\n".join(lines), file=sys.stderr)
    assert today and today > 0


@pytest.mark.parametrize("label", sorted(kernel_variants.ADD_VARIANTS))
def test_each_add_variant_still_applies_to_todays_kernel(label):
    """As bench/test_lookup_bounds.py's variants: held to today's engine/_kernels.py in every run."""
    assert kernel_variants.add_variant(label).apply_entries is not None

"""Segments are mapped 2 MiB-aligned and, where the kernel allows, backed by 2 MiB pages,
in the creator and in every process that attaches (see ipc/segment.py)."""

import subprocess
import sys
import textwrap
import uuid

import pytest

import shmcache
from shmcache.ipc.segment import HUGE_PAGE

SMAPS_PMD = ("ShmemPmdMapped:", "FilePmdMapped:")


def pmd_mapped_kib(addr: int, pid: str = "self") -> int:
    """kB of the mapping starting at `addr` that this process maps with 2 MiB entries."""
    inside = False
    total = 0
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                inside = int(head.split("-")[0], 16) == addr
            elif inside and head in SMAPS_PMD:
                total += int(line.split()[1])
    return total


@pytest.fixture
def big_cache():
    name = f"t-huge-{uuid.uuid4().hex[:10]}"
    w = shmcache.create(name, memory="128MiB")
    try:
        yield w
    finally:
        w.close()
        shmcache.destroy(name)


def test_mappings_are_aligned_and_huge(big_cache):
    w = big_cache
    seg = w._seg
    assert seg.addr % HUGE_PAGE == 0
    if not seg.huge:
        pytest.skip("this kernel refused MADV_COLLAPSE on tmpfs (needs Linux 6.1+): 4 KiB pages only")
    whole = seg.size // HUGE_PAGE * HUGE_PAGE // 1024
    assert pmd_mapped_kib(seg.addr) == whole
    with shmcache.attach(w.name) as r:  # a second mapping in this process
        assert r._seg.addr % HUGE_PAGE == 0
        assert pmd_mapped_kib(r._seg.addr) == whole


def test_a_reader_process_gets_huge_mappings_without_asking(big_cache):
    if not big_cache._seg.huge:
        pytest.skip("this kernel refused MADV_COLLAPSE on tmpfs: 4 KiB pages only")
    code = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(__import__("pathlib").Path(__file__).parent)!r})
        import shmcache
        from test_hugepages import pmd_mapped_kib
        r = shmcache.attach({big_cache.name!r})
        print(r._seg.addr % (2 << 20), pmd_mapped_kib(r._seg.addr), r._seg.huge)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    misalign, kib, asked = out.stdout.split()
    assert misalign == "0" and asked == "False"  # a reader never collapses: the creator did
    assert int(kib) == big_cache._seg.size // HUGE_PAGE * HUGE_PAGE // 1024

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


def test_attaching_while_the_creator_works_waits_and_gets_huge_mappings():
    """A reader that finds the file before the creator has sized, collapsed and initialised
    it waits, then maps it whole on 2 MiB pages (a mapping made mid-collapse would keep
    4 KiB entries, and one made before the sizing would see 0 bytes)."""
    name = f"t-huge-{uuid.uuid4().hex[:10]}"
    code = textwrap.dedent(f"""
        import os, sys, time
        sys.path.insert(0, {str(__import__("pathlib").Path(__file__).parent)!r})
        import shmcache
        from test_hugepages import pmd_mapped_kib
        path = "/dev/shm/" + {name!r}
        print("ready", flush=True)
        deadline = time.monotonic() + 60
        while not os.path.exists(path) and time.monotonic() < deadline:
            time.sleep(0.0002)
        fd = os.open(path, os.O_RDONLY)
        early = os.fstat(fd).st_size == 0 or os.pread(fd, 8, 0) == bytes(8)  # caught the creator at work
        os.close(fd)
        with shmcache.attach({name!r}) as r:
            print(early, pmd_mapped_kib(r._seg.addr), r.stats()["capacity_bytes"] > 0, flush=True)
    """)
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready", child.stderr.read()
        w = shmcache.create(name, memory="512MiB")
        try:
            out, err = child.communicate(timeout=120)
            assert child.returncode == 0, err
            early, kib, sane = out.split()
            assert early == "True" and sane == "True", out
            if w._seg.huge:
                assert int(kib) == w._seg.size // HUGE_PAGE * HUGE_PAGE // 1024
        finally:
            w.close()
            shmcache.destroy(name)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()

"""Segments are mapped 2 MiB-aligned and, where the kernel allows, backed by 2 MiB pages,
in the creator and in every process that attaches (see ipc/mapping.py)."""

import subprocess
import sys
import textwrap
import uuid

import pytest

import shmcache
from shmcache.ipc.mapping import HUGE_PAGE
from shmtest.pages import pmd_mapped_kib



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
        import shmcache
        from shmtest.pages import pmd_mapped_kib
        from shmcache.engine import layout as L
        r = shmcache.attach({big_cache.name!r})
        print(r._seg.addr % (2 << 20), pmd_mapped_kib(r._seg.addr), r._seg.huge)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    misalign, kib, asked = out.stdout.split()
    assert misalign == "0" and asked == "False"  # a reader never collapses: the creator did
    assert int(kib) == big_cache._seg.size // HUGE_PAGE * HUGE_PAGE // 1024


def test_a_cache_is_whole_and_huge_the_moment_its_name_appears():
    """A reader polling for the name maps the cache whole on 2 MiB pages the moment the
    name appears: the creator sizes, collapses and initialises an unnamed file and names
    it last (a mapping made mid-collapse would keep 4 KiB entries, one made before the
    sizing would see 0 bytes, one made before the header would find no magic)."""
    name = f"t-huge-{uuid.uuid4().hex[:10]}"
    code = textwrap.dedent(f"""
        import os, sys, time
        import shmcache
        from shmtest.pages import pmd_mapped_kib
        from shmcache.engine import layout as L
        path = "/dev/shm/" + {name!r}
        print("ready", flush=True)
        deadline = time.monotonic() + 60
        while not os.path.exists(path) and time.monotonic() < deadline:
            time.sleep(0.0002)
        fd = os.open(path, os.O_RDONLY)
        whole = os.fstat(fd).st_size > 0 and os.pread(fd, 8, L.H_MAGIC * L.WORD) != bytes(8)  # at first sight
        os.close(fd)
        with shmcache.attach({name!r}) as r:
            print(whole, pmd_mapped_kib(r._seg.addr), r.stats()["capacity_bytes"] > 0, flush=True)
    """)
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready", child.stderr.read()
        w = shmcache.create(name, memory="512MiB")
        try:
            out, err = child.communicate(timeout=120)
            assert child.returncode == 0, err
            whole, kib, sane = out.split()
            assert whole == "True" and sane == "True", out
            if w._seg.huge:
                assert int(kib) == w._seg.size // HUGE_PAGE * HUGE_PAGE // 1024
        finally:
            w.close()
            shmcache.destroy(name)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()

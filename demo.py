"""`shmcache demo`: create a cache, fill it from one process, read it from others.

Every process regenerates the same dataset from a seed, so readers can check each
value they read against what the writer wrote, without shipping it between them.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time

import numpy as np
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

import shmcache
from shmcache.engine.layout import format_bytes

BATCH = 1024


def dataset(n: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """n 32-byte keys and values of 61-141 bytes (the size of Teranode txmeta records)."""
    rng = np.random.default_rng(seed)
    keys = rng.integers(0, 256, (n, 32), dtype=np.uint8)
    lens = rng.integers(61, 142, n)
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(lens, out=offsets[1:])
    return keys, offsets, rng.integers(0, 256, int(offsets[-1]), dtype=np.uint8)


def _writer(name: str, n: int, seed: int, results) -> None:
    keys, offsets, data = dataset(n, seed)
    with shmcache.open(name) as w:
        t = time.perf_counter()
        for s in range(0, n, BATCH):
            e = min(n, s + BATCH)
            w.set_many(keys[s:e], (offsets[s:e + 1] - offsets[s], data[offsets[s]:offsets[e]]))
        results.put(("writer", os.getpid(), n, time.perf_counter() - t, n))


def _reader(name: str, n: int, seed: int, rounds: int, results) -> None:
    keys, offsets, data = dataset(n, seed)
    order = np.random.default_rng(os.getpid()).permutation(n)  # random order: no locality help
    with shmcache.attach(name) as r:
        hits = wrong = 0
        t = time.perf_counter()
        for _ in range(rounds):
            for s in range(0, n, BATCH):
                idx = order[s:s + BATCH]
                p = r.get_many_packed(keys[idx])
                hits += int(p.found.sum())
                # check a sample of values byte for byte against the writer's dataset
                for j in range(0, len(idx), 97):
                    if p.found[j]:
                        i = idx[j]
                        wrong += p.data[p.offsets[j]:p.offsets[j + 1]].tobytes() != data[offsets[i]:offsets[i + 1]].tobytes()
        results.put(("reader", os.getpid(), n * rounds, time.perf_counter() - t, hits, wrong))


def run(entries: int = 1_000_000, readers: int = 2, memory: str = "512MiB", name: str | None = None,
        keep: bool = False, seed: int = 1) -> int:
    console = Console()
    name = name or f"shmcache-demo-{os.getpid()}"
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    w = shmcache.create(name, memory=memory)
    g = w.geometry
    console.print(f"created cache [bold]{name}[/] at /dev/shm/{name}: {format_bytes(g.size)}, "
                  f"8192 buckets x ({g.slots} index slots + {format_bytes(g.ring)} ring)")
    procs = []
    try:
        writer = ctx.Process(target=_writer, args=(name, entries, seed, results), name="writer")
        writer.start()
        procs.append(writer)
        with Progress(TextColumn("filling from writer pid {task.fields[pid]}"), BarColumn(),
                      TextColumn("{task.completed:,}/{task.total:,}"), TimeElapsedColumn(),
                      console=console, transient=not console.is_terminal) as bar:
            task = bar.add_task("fill", total=entries, pid=writer.pid)
            while writer.is_alive():
                bar.update(task, completed=w.stats()["sets"])
                time.sleep(0.1)
            bar.update(task, completed=w.stats()["sets"])
        writer.join()
        if writer.exitcode != 0:
            console.print(f"[red]writer exited with {writer.exitcode}[/]")
            return 1
        readers_p = [ctx.Process(target=_reader, args=(name, entries, seed, 2, results), name=f"reader-{i}")
                     for i in range(readers)]
        for p in readers_p:
            p.start()
            procs.append(p)
        for p in readers_p:
            p.join()
        rows = [results.get(timeout=5) for _ in range(1 + readers)]
        table = Table(title=f"shmcache demo: {entries:,} entries, values 61-141 B, batches of {BATCH}")
        for col in ("process", "pid", "keys", "seconds", "keys/s", "hits", "wrong values"):
            table.add_column(col, justify="right")
        failed = False
        for row in rows:
            kind, pid, n, secs = row[:4]
            hits = row[4]
            wrong = row[5] if kind == "reader" else 0
            failed |= kind == "reader" and (hits != n or wrong)
            table.add_row(kind, str(pid), f"{n:,}", f"{secs:.2f}", f"{n / secs:,.0f}",
                          f"{hits:,}" if kind == "reader" else "-", str(wrong) if kind == "reader" else "-")
        console.print(table)
        s = w.stats()
        console.print(f"table: {s['entries']:,} entries, {format_bytes(s['bytes_used'])} of "
                      f"{format_bytes(s['capacity_bytes'])} ring space used, {s['evictions']:,} evictions, "
                      f"{s['lock_takeovers']} lock takeovers")
        console.print("[green]every lookup hit and every checked value matched[/]" if not failed
                      else "[red]some lookups missed or returned wrong values[/]")
        return 1 if failed else 0
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
            p.join()
        w.close()
        if keep:
            console.print(f"kept /dev/shm/{name}; remove it with: shmcache destroy {name}")
        else:
            shmcache.destroy(name)
            console.print(f"destroyed cache {name}")

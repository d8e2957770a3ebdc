"""The memory a cgroup still lets this process take: a container's memory limit.

A page of tmpfs (/dev/shm) is charged to the memory cgroup of the process that first
touches it, and stays charged after that process exits. A creator that reserves a segment
larger than its cgroup still allows is not refused by fallocate(2): the kernel's
out-of-memory killer kills it (SIGKILL, exit 137) partway. So a creator asks first.

`room()` walks this process's memory cgroup and its ancestors (cgroup v2's memory.max, or
v1's memory.limit_in_bytes) and returns the smallest room left under a limit: the limit
less what cannot be reclaimed there (anonymous memory and tmpfs already charged; page
cache is reclaimed before anything is killed). None when no limit applies.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

_UNLIMITED = 1 << 62  # v1 writes "no limit" as a page-rounded 2**63 - 1


@dataclass(frozen=True)
class Room:
    bytes: int  # what may still be charged
    limit: int  # the limit that leaves the least
    in_use: int  # what is charged there and cannot be reclaimed
    where: str  # the cgroup directory that sets that limit


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def _stat(directory: str, keys: tuple[str, ...]) -> int:
    text = _read(os.path.join(directory, "memory.stat")) or ""
    values = dict(line.split()[:2] for line in text.splitlines() if len(line.split()) >= 2)
    return sum(int(values.get(k, 0)) for k in keys)


def _mount_of(controller: str | None) -> str | None:
    """Where the v2 hierarchy (controller None) or v1's `controller` hierarchy is mounted."""
    text = _read("/proc/self/mountinfo") or ""
    for line in text.splitlines():
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 3:
            continue
        if controller is None and tail[0] == "cgroup2":
            return fields[4]
        if controller is not None and tail[0] == "cgroup" and controller in tail[2].split(","):
            return fields[4]
    return None


def _levels() -> list[tuple[str, str, str, tuple[str, ...]]]:
    """(directory, limit file, usage file, unreclaimable stat keys) of this process's memory
    cgroup and each ancestor's, nearest first."""
    text = _read("/proc/self/cgroup") or ""
    for line in text.splitlines():
        hid, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):  # v1
            mount, files = _mount_of("memory"), ("memory.limit_in_bytes", "memory.usage_in_bytes",
                                                  ("total_rss", "total_shmem"))
            break
    else:
        path = next((line.split(":", 2)[2] for line in text.splitlines() if line.startswith("0::")), None)
        mount, files = _mount_of(None), ("memory.max", "memory.current", ("anon", "shmem"))
        if path is None:
            return []
    if mount is None:
        return []
    out = []
    rel = path.strip("/")
    while True:
        d = os.path.join(mount, rel) if rel else mount
        out.append((d, files[0], files[1], files[2]))
        if not rel:
            return out
        rel = os.path.dirname(rel)


def room() -> Room | None:
    """The least room any limit over this process leaves; None when none limits it (or
    the cgroups cannot be read)."""
    best: Room | None = None
    for d, limit_file, _, keys in _levels():
        raw = (_read(os.path.join(d, limit_file)) or "").strip()
        if not raw or raw == "max":
            continue
        try:
            limit = int(raw)
        except ValueError:
            continue
        if limit >= _UNLIMITED:
            continue
        in_use = _stat(d, keys)
        r = Room(max(0, limit - in_use), limit, in_use, d)
        if best is None or r.bytes < best.bytes:
            best = r
    return best

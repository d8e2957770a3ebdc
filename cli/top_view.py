"""`shmcache top NAME`: a live view of one cache, read from shared memory.

What it shows, refreshed every `--interval` seconds: entries/s applied by
action (and messages, malformed messages), per-partition applied offset, lag,
committed offset and caught-up flag, the table's entries, memory used and
evictions, every reader process's hits and misses, the workers' pids, restarts
and heartbeats, and the supervisor's commits and rebalances (and its heartbeat's
age, when it is stale: engine/control/area.py STALE_HEARTBEAT_S). Rates are the
difference of the shared counters between two refreshes, divided by the time
between them; it keeps no counters of its own and is invisible to the cache
(it looks nothing up, so it adds no reader hits or misses).

On a terminal it is a rich Live view. When stdout is not a terminal (a pipe, a
log file, CI) it prints one plain rendering per refresh instead, without cursor
movement or colour codes; `--once` prints one rendering (rates over one
interval, at most a second) and exits.

Not guaranteed: each rendering is a snapshot taken without locks; a rate spans
a supervisor restart as 0 (the worker counters restart from zero).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from rich.columns import Columns
from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from shmcache.consumer.supervisor import snapshot_policy
from shmcache.engine.units import format_bytes

MAX_PARTITION_ROWS = 32  # more partitions are summed up in one line
WORKER_STATE_STYLE = {"up": "green", "starting": "yellow", "stopping": "yellow", "backing-off": "red",
                      "stopped": "red"}


@dataclass
class Snapshot:
    """Everything one rendering needs, read at `t` (time.monotonic())."""

    t: float
    stats: dict
    status: dict

    @classmethod
    def read(cls, reader) -> "Snapshot":
        return cls(time.monotonic(), reader.stats(), reader.status())

    def totals(self) -> dict:
        """The counters rates are computed from."""
        ws = self.status["workers"]
        return {
            "add": sum(w["adds"] for w in ws),
            "delete": sum(w["deletes"] for w in ws),
            "messages": sum(w["messages"] for w in ws),
            "malformed": sum(w["malformed"] for w in ws),
            "unknown": sum(w["unknown_actions"] for w in ws),
            "hits": self.stats["reader_hits"],
            "misses": self.stats["reader_misses"],
            "evictions": self.stats["evictions"],
        }


def rates(cur: Snapshot, prev: Snapshot | None) -> dict:
    """Per-second rate of each counter between two snapshots (0 without a previous one,
    and 0 where a counter went down: a restarted supervisor zeroes the worker rows)."""
    now = cur.totals()
    if prev is None or cur.t <= prev.t:
        return {k: 0.0 for k in now}
    before = prev.totals()
    dt = cur.t - prev.t
    return {k: max(0, now[k] - before[k]) / dt for k in now}


def _duration(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def _header(name: str, st: dict) -> Text:
    if st["supervisor_pid"] is None:
        sup = "no supervisor"
    else:
        up = f", up {_duration(time.time() - st['supervisor_started_s'])}" if st["supervisor_started_s"] else ""
        sup = f"supervisor pid {st['supervisor_pid']}" + (up if st["supervisor_alive"] else " (not running)")
        if st["supervisor_stale"]:  # alive, but not going round its loop
            sup += f", heartbeat {st['supervisor_heartbeat_age_s']:.0f} s ago (stale)"
    topic = f"topic {st['topic']!r}, {st['partitions']} partitions" if st["topic"] else "no topic"
    t = Text.assemble(("cache ", ""), (name, "bold"), f": {topic}, {sup}, ")
    t.append("ready" if st["ready"] else "not ready", style="green" if st["ready"] else "yellow")
    if st.get("broker") == "waiting for the broker":
        t.append(f", waiting for the broker ({st['broker_waiting_s']:.0f} s)", style="bold red")
    if st["metrics_port"]:
        t.append(f", metrics on port {st['metrics_port']}")
    return t


def _kv_table(title: str, rows: list[tuple[str, str, str]]) -> Table:
    t = Table(title=title, title_justify="left", show_header=True)
    t.add_column("", justify="left")
    t.add_column("total", justify="right")
    t.add_column("per second", justify="right")
    for r in rows:
        t.add_row(*r)
    return t


def render(name: str, cur: Snapshot, prev: Snapshot | None = None) -> Group:
    """One rendering of the view (a rich renderable)."""
    s, st = cur.stats, cur.status
    tot, rate = cur.totals(), rates(cur, prev)

    def per_s(k: str) -> str:
        return f"{rate[k]:,.0f}" if prev is not None else "-"

    applied = _kv_table("applied", [
        ("ADD entries", f"{tot['add']:,}", per_s("add")),
        ("DELETE entries", f"{tot['delete']:,}", per_s("delete")),
        ("messages", f"{tot['messages']:,}", per_s("messages")),
        ("malformed messages", f"{tot['malformed']:,}", per_s("malformed")),
        ("unknown actions", f"{tot['unknown']:,}", per_s("unknown")),
    ])
    used = s["bytes_used"] / s["capacity_bytes"] if s["capacity_bytes"] else 0.0
    table = _kv_table("table", [
        ("entries", f"{s['entries']:,}", ""),
        ("memory used", f"{format_bytes(s['bytes_used'])} ({used:.1%})", ""),
        ("capacity", format_bytes(s["capacity_bytes"]), ""),
        ("segment", format_bytes(s["memory"]), ""),
        ("evictions", f"{s['evictions']:,}", per_s("evictions")),
        ("lock takeovers", f"{s['lock_takeovers']:,}", ""),
    ])
    looked = s["reader_hits"] + s["reader_misses"]
    readers = _kv_table("readers", [
        ("attached", f"{s['readers']:,}", ""),
        ("hits", f"{s['reader_hits']:,}", per_s("hits")),
        ("misses", f"{s['reader_misses']:,}", per_s("misses")),
        ("hit rate", f"{s['reader_hits'] / looked:.2%}" if looked else "-", ""),
    ])
    supervisor = _kv_table("supervisor", [
        ("commits", f"{st['commits']:,}", ""),
        ("commit failures", f"{st['commit_failures']:,}", ""),
        ("commits deferred", f"{st['commits_deferred']:,}", ""),
        ("group members", "-" if st["group_members"] is None else f"{st['group_members']:,}", ""),
        ("rebalances", f"{st['rebalances']:,}", ""),
        ("partitions lost", f"{st['partitions_lost']:,}", ""),
        *snapshot_policy.summary_rows(st),
    ])
    from shmcache.cli.status import backoff_text, behind_text, group_lines, heartbeat_text

    parts = Table(title="partitions", title_justify="left")
    for col in ("partition", "worker", "applied", "latest", "lag", "behind", "committed", "caught up"):
        parts.add_column(col, justify="right")
    for p in st["assigned"][:MAX_PARTITION_ROWS]:
        parts.add_row(str(p["partition"]), "-" if p["worker"] is None else str(p["worker"]), f"{p['applied']:,}",
                      f"{p['latest']:,}", "-" if p["lag"] is None else f"{p['lag']:,}", behind_text(p),
                      f"{p['committed']:,}",
                      Text("yes", "green") if p["caught_up"] else Text("no", "yellow"))
    more = st["assigned"][MAX_PARTITION_ROWS:]
    if more:
        lag = sum(p["lag"] or 0 for p in more)
        known = [p["behind_s"] for p in more if p.get("behind_s") is not None]
        parts.add_row(f"+{len(more)}", "", "", "", f"{lag:,}", f"{max(known):,.0f} s" if known else "-", "",
                      f"{sum(p['caught_up'] for p in more)} yes")
    workers = Table(title="workers", title_justify="left")
    for col in ("worker", "pid", "state", "heartbeat", "restarts", "backoff", "ADD", "DELETE", "messages"):
        workers.add_column(col, justify="right")

    for w in st["workers"]:
        workers.add_row(str(w["worker"]), str(w["pid"] or "-"),
                        Text(w["state"], WORKER_STATE_STYLE[w["state"]]),
                        Text(heartbeat_text(w), "bold red" if w.get("stale") else ""),
                        str(max(0, w["starts"] - 1)), backoff_text(w), f"{w['adds']:,}", f"{w['deletes']:,}",
                        f"{w['messages']:,}")

    body = [_header(name, st), *(Text(line, style="bold red") for line in group_lines(st)),
            Columns([applied, table, readers, supervisor])]
    if st["assigned"]:
        body.append(parts)
    if st["workers"]:
        body.append(workers)
    return Group(*body)


def command(a) -> int:
    """`shmcache top NAME [--interval S] [--once] [--count N]`."""
    import shmcache
    from rich.live import Live

    if a.interval <= 0:
        raise ValueError(f"--interval {a.interval}: must be positive")
    console = Console()
    with shmcache.attach(a.name, owner=a.owner) as r:
        if a.once:
            prev = Snapshot.read(r)
            time.sleep(min(a.interval, 1.0))
            console.print(render(a.name, Snapshot.read(r), prev))
            return 0
        prev = cur = Snapshot.read(r)
        shown = 0
        try:
            if console.is_terminal:
                with Live(render(a.name, cur), console=console, auto_refresh=False, screen=False) as live:
                    while not a.count or shown < a.count:
                        time.sleep(a.interval)
                        prev, cur = cur, Snapshot.read(r)
                        live.update(render(a.name, cur, prev), refresh=True)
                        shown += 1
            else:  # no cursor movement: one plain rendering per interval
                while not a.count or shown < a.count:
                    time.sleep(a.interval)
                    prev, cur = cur, Snapshot.read(r)
                    console.print(render(a.name, cur, prev))
                    console.print()
                    shown += 1
        except KeyboardInterrupt:
            pass
    return 0

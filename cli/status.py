"""`shmcache status NAME [--json]`: per-partition progress and readiness of a cache.

Also the lines status and `shmcache top` share (group_lines, backoff_text).

Every text that comes from outside (the topic, other group members' client ids, hosts and
instance ids, file names) is printed as text, never read as rich markup: a client id such
as `evil[/]` would otherwise raise, and `[link=...]` would be rendered."""

from __future__ import annotations

import json
import time

from rich.console import Console
from rich.table import Table
from rich.text import Text

from shmcache.cli.args import attach, cache_arguments

HELP = "per-partition progress and readiness of a cache"
SLOW_COMMIT_S = 5.0  # a commit in flight longer than this is shown


def add_arguments(su) -> None:
    cache_arguments(su, json=True)


def run(a) -> int:
    from shmcache.engine.control.status import why  # the engine's, when run: parsing the line needs none of it

    with attach(a) as r:
        st = r.status()
    if a.json:
        print(json.dumps(st))
        return 0
    console = Console(highlight=False)
    sup = f"pid {st['supervisor_pid']}" + ("" if st["supervisor_alive"] else " (not running)") if st["supervisor_pid"] else "none"
    head = Text.assemble("cache ", (a.name, "bold"), f": topic {st['topic']!r}, {st['partitions']} partitions, "
                         f"supervisor {sup}, ", ("ready", "green") if st["ready"] else ("not ready", "yellow"))
    if st.get("broker") == "waiting for the broker":
        head.append_text(Text.assemble(", ", ("waiting for the broker", "red"), f" ({st['broker_waiting_s']:.0f} s)"))
    if (st.get("commit_pending_s") or 0) >= SLOW_COMMIT_S:
        head.append(f", a commit has waited {st['commit_pending_s']:.0f} s for Kafka", style="yellow")
    console.print(head)
    if not st["ready"]:
        console.print(Text(f"not ready: {why(st)}"))
    t = Table()
    for col in ("partition", "worker", "pid", "applied", "high watermark", "lag", "behind", "committed", "caught up"):
        t.add_column(col, justify="right")
    for p in st["assigned"]:
        t.add_row(str(p["partition"]), str(p["worker"]), str(p["worker_pid"]), f"{p['applied']:,}",
                  f"{p['high_watermark']:,}", "-" if p["lag"] is None else f"{p['lag']:,}", behind_text(p),
                  f"{p['committed']:,}",
                  "yes" if p["caught_up"] else f"no (worker {p['worker_down']})" if p.get("worker_down") else "no")
    console.print(t)
    from shmcache.consumer.supervisor import snapshot_policy  # the snapshots' kernels: when run, not when parsed

    for what, value, _ in snapshot_policy.summary_rows(st):
        console.print(Text(f"{what}: {value}"))
    for line in group_lines(st):
        console.print(Text(line, style="bold red"))
    if st["workers"]:
        t = Table()
        for col in ("worker", "pid", "state", "restarts", "backoff", "heartbeat", "ADD", "DELETE", "messages",
                    "malformed"):
            t.add_column(col, justify="right")
        for w in st["workers"]:
            t.add_row(str(w["worker"]), str(w["pid"] or "-"), w["state"], str(max(0, w["starts"] - 1)), backoff_text(w),
                      heartbeat_text(w),
                      f"{w['adds']:,}", f"{w['deletes']:,}", f"{w['messages']:,}", f"{w['malformed']:,}")
        console.print(t)
    return 0


def heartbeat_text(w: dict) -> str:
    """A worker's heartbeat for the workers table: its age, marked when over the supervisor's bound,
    and the bucket lock it waits for, if a live process holds one it needs."""
    if w["heartbeat_age_s"] is None:
        return "-"
    text = f"{w['heartbeat_age_s']:.1f} s ago" + (" (stale)" if w.get("stale") else "")
    if w.get("waiting_for_bucket") is not None:
        text += f", waiting for bucket {w['waiting_for_bucket']}'s lock"
    return text


def backoff_text(w: dict) -> str:
    """A worker's restart backoff for the workers table: deaths in a row and the restart due."""
    if not w.get("restart_failures"):
        return "-"
    text = f"{w['restart_failures']} in a row"
    if w.get("next_restart_s") is not None:
        text += f", restart in {max(0.0, w['next_restart_s'] - time.time()):.1f} s"
    return text


def behind_text(p: dict) -> str:
    """A partition's behind_s for a table: `12 s`, `-` when not known."""
    return "-" if p.get("behind_s") is None else f"{p['behind_s']:,.0f} s"


def group_lines(st: dict) -> list[str]:
    """What status and top say when the cache does not hold the whole topic."""
    out = []
    if st.get("shared_group"):
        n = st["group_members"]
        out.append(f"consumer group shared with {n - 1 if n else 'another'} other member(s): this cache holds only "
                   "the partitions assigned to it (not ready); give each cache a group of its own")
        for o in st["group_others"]:
            inst = f", instance {o['instance_id']}" if o["instance_id"] else ""
            out.append(f"  {o['client_id']} on {o['host']}{inst}: partitions {o['partitions']}")
    if st["supervisor_alive"] and st["unassigned"] and not st["assigning"]:
        out.append(f"partitions not assigned to this cache: {st['unassigned'][:32]}"
                   + (f" (+{len(st['unassigned']) - 32})" if len(st["unassigned"]) > 32 else ""))
    if st.get("damaged"):
        out.append("damaged control words: " + "; ".join(st["damaged"]))
    from shmcache.consumer.supervisor import snapshot_policy

    return out + snapshot_policy.warning_lines(st)

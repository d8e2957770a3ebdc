"""A partition's log replaced under a running worker (consumer/worker/loop.py): the topic was
deleted and re-created (or its log truncated) between two of the worker's fetches; and
(jumps, note_gaps) its log's start moved past the worker by retention while it fell
behind, which librdkafka's auto.offset.reset skips without a word.

The worker fetches at an offset past the new log's end; the broker says it is out of
range and librdkafka resets to the log's start (auto.offset.reset) and delivers the new
log's messages, but its position() stays at the old offset until the new log passes it
(librdkafka 2.16). The applied offset would then stay that of the old log: the cache
said caught up without the new messages, and commits of the old offsets landed on the
new topic. The supervisor's group consumer does not see a topic re-created between two
of its metadata refreshes; one that sees the topic gone gets it back through a new
assignment, which consumer/supervisor/rebalance.py checks against the new watermarks.

What shows it here: a message below the offset the partition was at (librdkafka never
delivers one below its fetch position otherwise). The worker then drops that message
and the rest of the partition's batch, logs one error line, starts the partition over
at the new log's low watermark (a new assignment of its own, which resets position()),
and publishes it as not caught up until it reaches the new log's high watermark. A
re-created topic is seen at its first message: an empty one is not.
"""

from __future__ import annotations

import logging

log = logging.getLogger("shmcache.worker")


def split(msgs, next_offsets: dict[int, int]) -> tuple[list, dict[int, int]]:
    """The messages to apply, and {partition: offset} of each partition whose log was
    replaced (the first message below its next offset); a partition not in `next_offsets`
    (not owned) has none applied. `next_offsets` advances past every message kept."""
    good, replaced = [], {}
    for m in msgs:
        p = m.partition()
        if p not in next_offsets or p in replaced:
            continue
        if m.offset() < next_offsets[p]:
            replaced[p] = m.offset()
            continue
        next_offsets[p] = m.offset() + 1
        good.append(m)
    return good, replaced


def jumps(msgs, next_offsets: dict[int, int]) -> dict[int, list[tuple[int, int]]]:
    """{partition: [(offset expected, offset that came), ...]} of each forward jump in the
    batch's offsets (read before split moves next_offsets on). A jump is normal where offsets
    carry no message (a transaction's marker, a compacted topic); it is a retention gap where
    the log's start passed the offset expected (gap_offsets)."""
    out: dict[int, list[tuple[int, int]]] = {}
    at = dict(next_offsets)
    for m in msgs:
        p, o = m.partition(), m.offset()
        if p in at and o >= at[p]:
            if o > at[p]:
                out.setdefault(p, []).append((at[p], o))
            at[p] = o + 1
    return out


def gap_offsets(found: list[tuple[int, int]], log_start: int) -> int:
    """Offsets of a partition's jumps that retention deleted before they were fetched: those
    below `log_start` (the low watermark of the last fetch; librdkafka moved the fetch there by
    auto.offset.reset when it found the offset out of range, without a word)."""
    return sum(max(0, min(came, log_start) - expected) for expected, came in found)


def note_gaps(consumer, cache, topic: str, found: dict[int, list[tuple[int, int]]], current, index: int) -> None:
    """Flag the retention gaps among a batch's jumps (see jumps) as the supervisor flags one at
    assignment (consumer/supervisor/snapshot_policy.py note_start), before the batch is applied and published:
    a reader never sees the partition caught up without the gap. `current(p)`: the partition
    is still this worker's."""
    from confluent_kafka import KafkaException, TopicPartition

    for p, jumped in found.items():
        try:
            lo, _ = consumer.get_watermark_offsets(TopicPartition(topic, p), cached=True)
        except KafkaException:
            continue
        n = gap_offsets(jumped, lo)
        if n <= 0 or not current(p):
            continue
        cache.control.flag_gap(p, n, again=True)
        log.warning("worker %d: topic %r partition %d: offsets %s were deleted by the topic's retention before this "
                    "worker fetched them (its log starts at %d now): the table lacks what they held (a gap); the "
                    "cache is not ready unless the supervisor runs with --accept-gaps", index, topic, p,
                    ", ".join(f"{e}..{min(c, lo) - 1}" for e, c in jumped if min(c, lo) > e), lo)


def start_over(consumer, topic: str, rows, p: int, offset: int, was: int, current: bool, paused: bool,
               index: int) -> int:
    """Start partition `p` over at the new log's low watermark (`offset`, the first message
    seen from it, if the watermark is unknown); its row in `rows` (the cache's
    engine/control/rows.py PartitionRows) says so when `current` (still this worker's
    generation). Returns the offset it starts at."""
    from confluent_kafka import KafkaException, TopicPartition

    tp = TopicPartition(topic, p)
    try:
        lo, hi = consumer.get_watermark_offsets(tp, cached=True)  # the fetch that brought the message's
    except KafkaException:
        lo, hi = -1, -1
    start = lo if 0 <= lo <= offset else offset
    hi = max(hi, start)
    log.error("worker %d: topic %r partition %d: offset %d came where %d was next: the partition's log was replaced "
              "(the topic deleted and re-created, or its log truncated); starting it over at offset %d, not caught "
              "up until it reaches %d; the cache keeps the entries it applied from the old log (DELETEs in the new "
              "one still apply)", index, topic, p, offset, was, start, hi)
    if current:
        rows.start_over(p, start, hi)  # readers see it lagging before they see the lower offset
    consumer.resume([tp])  # a pause flag must not outlive the assignment (consumer/worker/loop.py)
    consumer.incremental_unassign([tp])
    consumer.incremental_assign([TopicPartition(topic, p, start)])
    if paused:
        consumer.pause([tp])
    return start

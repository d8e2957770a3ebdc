"""Where an assignment's partitions start: the broker's word (the topic's id, the group's
committed offsets, the partitions' watermarks), asked in one look-up with one bound
(consumer/supervisor/rebalance.py hands out what it finds).

The whole look-up is bounded by one deadline, however many partitions it asks about: the
watermarks of all are asked at once (AdminClient.list_offsets, earliest and latest), where
one request a partition, each bounded, would cost N bounds, the supervisor's loop doing
nothing else. The bound starts at LOOKUP_TIMEOUT_S; a look-up that times out while the
broker's metadata answers (a slow broker, not a stopped one) doubles it for the next, up to
LOOKUP_TIMEOUT_MAX_S, and the longer bound is kept: a slow broker takes two request times
for the two ListOffsets of one connection (earliest, then latest), and under a fixed bound
shorter than that its partitions would never be handed out. The supervisor's loop waits for
the look-up, beating each second while it waits for every answer. The committed offsets are
the AdminClient's too (list_consumer_group_offsets, a future like the watermarks'): the
consumer's committed() blocks the loop without a beat for up to the bound (long enough for
the supervisor to be shown as stale), and asked from a thread while the loop sits in the
rebalance callback it never returns, its timeout or not.

librdkafka 2.16 gives a ListOffsets that timed out as offsets -1001, not as an error, so
watermarks that are not 0 <= low <= high fail the look-up. The AdminClient is dropped after a
failed look-up: one made before a broker restart can time out for ever (kafka/admin_poll.py).
"""

from __future__ import annotations

import time

from shmcache.kafka import client as kafka_client

LOOKUP_TIMEOUT_S = 5.0  # the first bound of a whole look-up
LOOKUP_TIMEOUT_MAX_S = 20.0  # the most it grows to against a slow broker
ROLE = "look-up"  # the look-ups' AdminClient is named <the supervisor's client.id>/look-up
# an admin request's own timeout ends this much before the look-up's deadline: librdkafka then
# finishes it (an answer, or its timeout) before the look-up gives up, so no request is left
# outstanding when the client is dropped, and what a timed-out request gives is always judged
REQUEST_EARLY_S = 0.5


def request_timeout(deadline: float) -> float:
    """An admin request's timeout within a look-up ending at `deadline` (see REQUEST_EARLY_S)."""
    return max(deadline - time.monotonic() - REQUEST_EARLY_S, 0.1)


class LookUp:
    """The supervisor's look-ups: `run()` one, `failed()` after one that raised."""

    def __init__(self, cfg, control, identity):
        self.cfg = cfg  # consumer/config.py RunConfig
        self.control = control  # the cache's ControlArea: beaten while the loop waits here
        self.identity = identity  # consumer/supervisor/topic_id.py TopicIdentity
        self.admin = None  # made at the first look-up, dropped after a failed one
        self.bound = LOOKUP_TIMEOUT_S  # the next look-up's: grows against a slow broker, kept

    def run(self, pending) -> tuple[list[int], dict[int, tuple[int, int, int]]]:
        """The topic's id first (re-created, every partition is pending, from the new log's
        start), then where `pending()`'s partitions start, all by one deadline: (partitions,
        offsets as `offsets` gives them); KafkaException if the broker does not answer in time."""
        deadline = time.monotonic() + self.bound
        self.identity.check(self.client(), deadline, request_timeout(deadline))
        parts = pending()
        return parts, self.offsets(parts, deadline)

    def failed(self, e: BaseException, broker_answers: bool) -> str:
        """After a look-up that raised `e` (a KafkaException): the client is dropped; one that
        timed out while the broker answers doubles the bound. What the failure's text adds
        ("; the next look-up waits up to N s"), or ""."""
        from confluent_kafka import KafkaError

        self.admin = None
        timed_out = kafka_client.error_code(e) == KafkaError._TIMED_OUT
        if not (broker_answers and timed_out and self.bound < LOOKUP_TIMEOUT_MAX_S):
            return ""
        self.bound = min(self.bound * 2, LOOKUP_TIMEOUT_MAX_S)
        return f"; the next look-up waits up to {self.bound:g} s"

    def client(self):
        """The look-ups' AdminClient (kafka/client.py admin_client)."""
        if self.admin is None:
            self.admin = kafka_client.admin_client(self.cfg, ROLE)
        return self.admin

    def offsets(self, parts, deadline: float) -> dict[int, tuple[int, int, int]]:
        """partition -> (low watermark, high watermark, committed offset or negative), from the
        broker, the whole by `deadline` (monotonic) however many partitions there are; else
        KafkaException. The watermarks of all partitions are asked at once (earliest and
        latest, at the consumers' isolation level: what get_watermark_offsets gives each), and
        the group's committed offsets (stable ones under read_committed, as the consumer's
        committed() asks them), the loop beating while it waits for all three answers."""
        from concurrent.futures import wait

        from confluent_kafka import ConsumerGroupTopicPartitions, IsolationLevel, KafkaError, KafkaException, \
            TopicPartition
        from confluent_kafka.admin import OffsetSpec

        tps = [TopicPartition(self.cfg.topic, p) for p in parts]
        self.control.beat()
        level, left = kafka_client.isolation_level(self.cfg), request_timeout(deadline)
        ends = [self.client().list_offsets({tp: spec for tp in tps}, isolation_level=level, request_timeout=left)
                for spec in (OffsetSpec.earliest(), OffsetSpec.latest())]  # partition -> future, each
        asked = self.client().list_consumer_group_offsets(
            [ConsumerGroupTopicPartitions(self.cfg.group, tps)], require_stable=level == IsolationLevel.READ_COMMITTED,
            request_timeout=left)[self.cfg.group]
        futures = [f for end in ends for f in end.values()] + [asked]
        while True:  # beating: the loop waits here
            self.control.beat()
            left = deadline - time.monotonic()
            if not wait(futures, timeout=min(max(left, 0), 1.0)).not_done:
                break
            if left <= 1.0:
                what = "committed offsets" if not asked.done() else "watermarks"
                raise KafkaException(KafkaError(KafkaError._TIMED_OUT, f"no {what} within {self.bound:g} s"))
        lo, hi = ({tp.partition: f.result().offset for tp, f in end.items()} for end in ends)
        # a ListOffsets that timed out is no exception in librdkafka 2.16: each partition's result
        # says offset -1001 (seen: a frozen broker's partitions "assigned" from -1001)
        bad = [p for p in parts if not 0 <= lo[p] <= hi[p]]
        if bad:
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT, f"no watermarks for partitions {bad} (the broker's "
                                            f"answer: low {[lo[p] for p in bad]}, high {[hi[p] for p in bad]})"))
        committed = {tp.partition: tp for tp in asked.result().topic_partitions}
        for tp in committed.values():
            if tp.error is not None:
                raise KafkaException(tp.error)
        return {p: (lo[p], hi[p], committed[p].offset) for p in parts}

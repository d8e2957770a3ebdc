"""Who else is in the supervisor's consumer group (DESIGN invariant 10).

Each machine runs one supervisor per cache with a consumer group of its own, so the
group should have exactly one member: this supervisor. A second member (another
`shmcache run` given the same --group, or one started with the same name after a
destroy) takes some of the topic's partitions, and this cache then holds only the
rest. `GroupWatch` asks the broker (AdminClient.describe_consumer_groups) who the
members are and what each holds, every few seconds and soon after each rebalance,
without blocking the supervisor's loop (kafka/admin_poll.py: the answer is a
future, looked at on a later tick). It publishes them in the segment
(engine/control/area.py set_group: status, `top`, `shmcache status`, the metrics) and logs
a warning when another member appears, changes or stays (once a minute), and a line
when the group is this supervisor's alone again.
"""

from __future__ import annotations

import logging
import time

from shmcache.kafka.admin_poll import AdminLook
from shmcache.consumer.config import RunConfig

log = logging.getLogger("shmcache.supervisor")

CHECK_S = 5.0  # between two looks at the group
SOON_S = 1.0  # after a rebalance: look again this soon
REMIND_S = 60.0  # a warning this often while the group is shared
TIMEOUT_S = 10.0


class GroupWatch:
    def __init__(self, cfg: RunConfig, cache, consumer, on_fenced=None):
        self.cfg = cfg
        self.on_fenced = on_fenced  # called with a reason when another consumer took our instance id
        self.cache = cache
        self.consumer = consumer
        self.look = AdminLook(cfg, TIMEOUT_S)
        self.asked_as = None  # our member id when the pending question was asked
        self.shown: tuple | None = None  # the other members last logged
        self.warned = 0.0

    def soon(self) -> None:
        """A rebalance completed: look again shortly (the broker answers for the new generation)."""
        self.look.soon(SOON_S)

    def tick(self) -> None:
        failed = f"describing group {self.cfg.group!r} failed"
        if self.look.out:
            answers = self.look.answers()
            if answers:
                with self.look.failing(failed):  # a broker hiccup: the next look tries again
                    self._publish(answers[self.cfg.group].result())
            return
        if self.look.due(CHECK_S):
            self.look.ask(self._describe, failed)

    def _describe(self, admin, timeout: float) -> dict:
        """Ask `admin` who the group's members are: {group: future}."""
        self.asked_as = self.consumer.memberid()
        return admin.describe_consumer_groups([self.cfg.group], request_timeout=timeout)

    def _publish(self, desc) -> None:
        me = self.consumer.memberid()
        if not me:
            return  # not joined yet: nothing to compare with
        members = list(desc.members or [])
        if not any(m.member_id == me for m in members):
            # asked after this member joined, and another consumer holds our static instance id:
            # it fenced us (librdkafka reports that as a fatal error, not through poll())
            twin = [m for m in members if self.cfg.static and m.group_instance_id == self.cfg.instance_id]
            if twin and self.asked_as == me and self.on_fenced is not None:
                self.on_fenced(f"another consumer (on {(twin[0].host or '').lstrip('/') or '?'}) joined group {self.cfg.group!r} with this supervisor's instance id "
                               f"{self.cfg.instance_id!r} and fenced it out")
            return  # else an answer from before this member joined (or a generation ago)
        others, elsewhere = [], {}
        for m in members:
            if m.member_id == me:
                continue
            held = sorted(tp.partition for tp in (m.assignment.topic_partitions if m.assignment else [])
                          if tp.topic == self.cfg.topic)
            for p in held:
                elsewhere[p] = len(others)
            others.append({"client_id": m.client_id or "", "host": (m.host or "").lstrip("/"),
                           "instance_id": m.group_instance_id or "", "partitions": held})
        self.cache.control.set_group(len(members),
                                     [{k: o[k] for k in ("client_id", "host", "instance_id")} for o in others],
                                     elsewhere)
        shown = tuple((o["client_id"], o["host"], o["instance_id"], tuple(o["partitions"])) for o in others)
        now = time.monotonic()
        if others and (shown != self.shown or now - self.warned >= REMIND_S):
            who = "; ".join(f"{o['client_id']} on {o['host']}"
                            + (f" (instance {o['instance_id']})" if o["instance_id"] else "")
                            + f" holds partitions {o['partitions']}" for o in others)
            log.warning("consumer group %r is shared with %d other member(s): %s. This cache holds only the "
                        "partitions assigned here and is NOT ready; give each cache a group of its own "
                        "(--group) on each machine", self.cfg.group, len(others), who)
            self.warned = now
        elif not others and self.shown:
            log.info("consumer group %r is this supervisor's alone again", self.cfg.group)
        self.shown = shown

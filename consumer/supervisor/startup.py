"""The supervisor's start-up (consumer/supervisor/policy.py runs it): the cache, then the broker.

The cache: create it or open the one there (refused while another supervisor is
alive), wait for a killed supervisor's workers to exit (ORPHAN_WAIT_S; the ones
that stay are killed: two writers on one partition could apply it out of
order), clear what a dead supervisor published, and note the identity of
/dev/shm/NAME (st_dev, st_ino) so the running supervisor sees it removed or
replaced.

The broker may be down when it starts: it then keeps serving status ("waiting
for the broker", kafka/broker.py), retries with backoff and one log line per
retry, and gives up with BrokerUnavailableError past `broker_wait`. A topic the
broker does not know is a user's mistake: ShmcacheError at once. A run that
never got going (no broker within the bound, a missing topic, a stop while
waiting) removes the cache if it created it (remove_created); a cache that
existed stays.

While it runs, check_broker probes the broker when librdkafka says it is down.

Every wait here takes `stopped`, a callable that is true once a stop was asked
for, and returns at once when it is.
"""

from __future__ import annotations

import logging
import os
import signal
import time

from shmcache.kafka import client as kafka_client
from shmcache.kafka import broker as broker_mod
from shmcache.engine.control import layout as C
from shmcache.engine import layout as L
from shmcache.engine import owners
from shmcache.engine import units
from shmcache.errors import BrokerUnavailableError, ShmcacheError
from shmcache.ipc import liveness

log = logging.getLogger("shmcache.supervisor")

ORPHAN_WAIT_S = 10.0  # how long a starting supervisor waits for a dead one's workers to exit


# -- the cache ---------------------------------------------------------------------------------


def forget_resize(name: str, cache) -> None:
    """What a resize whose supervisor was killed before its swap left (consumer/supervisor/resizing.py):
    the new segment's half at its hidden name, removed; the ask it had taken, answered as
    refused (the command that asked sees it). The cache at the name is whole either way."""
    from shmcache.engine import resizing

    if resizing.remove_leftover(name):
        log.warning("cache %r: removed %s, the new segment of a resize whose supervisor stopped before it was put "
                    "at the name; the cache is as it was before that resize", name, resizing.path_beside(name))
    if cache.control.word(C.H_RESIZE_ASK) < 0:
        cache.control.resize_refused("the supervisor doing the resize stopped before it was done; the cache is as "
                                     "it was: ask again")


def open_cache(cfg):
    """Create or open the cache and make this process its supervisor.

    A cache that is there keeps its geometry (table.create with exist_ok): cfg.memory
    is for creating one (`shmcache create` may have made it smaller than `run` could);
    its key size, and its max_value when cfg gives one, must match.
    Returns (cache, segment identity): the identity is (st_dev, st_ino) of
    /dev/shm/NAME, for the supervisor's periodic check."""
    from shmcache.engine import table

    mode, gid = cfg.file_mode, cfg.reader_gid  # a group that does not exist stops the start before anything
    cache = table.create(cfg.name, memory=cfg.create_memory, key_size=cfg.key_size,
                            max_value=cfg.max_value, mode=0o600 if mode is None else mode, exist_ok=True,
                            group=gid)  # a new cache has its readers' group before its name
    # first, by compare-and-swap: of two supervisors started at once one holds the word, the
    # other stops here (a look, then a store after the orphans' wait, let both through)
    other = cache.control.claim_supervisor()
    if other:
        cache.close()
        raise ShmcacheError(f"cache {cfg.name!r} already has a live supervisor, {owners.pid_text(other)}")
    # at once: nothing the last one assigned counts under this process's live word (DESIGN invariant 10)
    cache.control.disown_partitions()
    forget_resize(cfg.name, cache)
    if mode is not None or gid is not None:  # created, restored or found: who may read it is the run's say
        from shmcache.engine.lifecycle import set_access

        try:
            set_access(cfg.name, cache_mode(cfg.name) if mode is None else mode, gid)
        except BaseException:
            made = cache.created
            cache.close()
            if made:  # this run's, and no one may read it as asked: not kept
                table.destroy(cfg.name)
            raise
    wait_for_orphans(cache)
    # (its topic and applied offsets change only once the topic is known to exist: adopt_topic)
    cache.control.clear_workers()
    cache.control.reset_supervisor(accept_gaps=cfg.accept_gaps, worker_stale_s=cfg.worker_heartbeat_timeout)
    segment_id = identify_segment(cfg.name, cache)
    repaired = cache.repair_dead_locks()
    if repaired:
        log.warning("repaired %d buckets left locked by dead writers", repaired)
    s = cache.stats()
    log.info("cache %r: %d entries, %s; topic %r, group %r, %s", cfg.name, s["entries"],
             units.format_bytes(s["memory"]), cfg.topic, cfg.group,
             f"static member {cfg.instance_id!r}" if cfg.static else "dynamic membership")
    return cache, segment_id


def cache_mode(name: str) -> int:
    """The permission bits of the cache's file now."""
    from shmcache.ipc.segment import path_of

    return os.stat(path_of(name), follow_symlinks=False).st_mode & 0o777


def wait_for_orphans(cache) -> None:
    """Workers of a supervisor that was killed exit on their own once they notice (a
    tenth of a second, or the end of the batch they are applying). Two writers on one
    partition could apply it out of order, so wait for them; kill the ones that stay."""
    control = cache.control
    left = {i: int(control.workers[i, C.K_OWNER]) for i in range(L.MAX_WORKERS) if control.worker_alive(i)}
    if not left:
        return
    pids = [liveness.word_pid(w) for w in left.values()]
    log.warning("waiting for %d workers of the previous supervisor to exit (pids %s)", len(left), pids)
    deadline = time.monotonic() + ORPHAN_WAIT_S
    while time.monotonic() < deadline and any(control.worker_alive(i) for i in left):
        time.sleep(0.05)
    for i, w in left.items():
        # the owner word names this very process (pid and start time), in this PID namespace:
        # the previous supervisor ran in this one, or the row's lock would not be held
        if control.worker_alive(i) and liveness.is_alive(w):
            log.warning("worker pid %d of the previous supervisor did not exit; killing it", liveness.word_pid(w))
            try:
                os.kill(liveness.word_pid(w), signal.SIGKILL)
            except OSError:
                pass


def identify_segment(name: str, cache):
    """(st_dev, st_ino) of /dev/shm/NAME, checked to hold the segment this process mapped."""
    from shmcache.ipc.segment import path_of

    path = path_of(name)
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        cid = int.from_bytes(os.pread(fd, L.WORD, L.H_CREATION_ID * L.WORD), "little", signed=True)
    finally:
        os.close(fd)
    if cid != cache.creation_id:
        raise ShmcacheError(f"cache {name!r}: {path} was replaced while the supervisor opened it")
    return st.st_dev, st.st_ino


def remove_created(name: str, creation_id: int) -> None:
    """The run never got going: remove the cache it created (and only that one)."""
    from shmcache.engine import table

    try:
        with table.attach(name) as r:
            same = r.creation_id == creation_id
    except (OSError, ShmcacheError):
        return
    if same:
        table.destroy(name)
        log.info("removed cache %r: this run created it and never joined the group", name)


def serve_metrics(cfg, control):
    """The Prometheus endpoint when `metrics_port` is set (else None); its port goes in the header."""
    if not cfg.metrics_port:
        return None
    from shmcache.consumer.supervisor.metrics import MetricsServer

    metrics = MetricsServer(cfg.name, cfg.metrics_port, cfg.metrics_host, owner=os.geteuid())  # its own cache's user
    control.set_metrics_port(metrics.port)
    log.info("metrics on http://%s:%d/metrics", metrics.host, metrics.port)
    return metrics


# -- the broker and the topic ------------------------------------------------------------------


def topic_metadata(cfg, control, consumer, broker, stopped):
    """The topic's metadata once the broker answers (None if a stop came first).

    While the broker does not answer: status says so, one log line per retry, and
    BrokerUnavailableError past `broker_wait`. A topic the broker does not know is
    a user's mistake: ShmcacheError at once."""
    from confluent_kafka import KafkaError, KafkaException

    while not stopped():
        control.beat()
        try:
            meta = consumer.list_topics(cfg.topic, timeout=broker_mod.PROBE_TIMEOUT_S)
        except KafkaException as e:
            _broker_failed(cfg, control, broker, stopped, kafka_client.error_text(e))
            continue
        broker.answered()
        tmeta = meta.topics.get(cfg.topic)
        err = tmeta.error if tmeta is not None else None
        if tmeta is None or (err is not None and err.code() == KafkaError.UNKNOWN_TOPIC_OR_PART):
            raise ShmcacheError(f"cache {cfg.name!r}: topic {cfg.topic!r} does not exist on {cfg.bootstrap} "
                                f"(create it first, or give the right --topic)")
        if err is None and tmeta.partitions:
            return tmeta
        log.info("topic %r is not usable yet (%s); retrying", cfg.topic, err or "no partitions")
        _sleep(control, broker_mod.RETRY_FIRST_S, stopped)
    return None


def adopt_topic(cfg, cache) -> None:
    """The topic exists (topic_metadata): make it the cache's, before anything is fetched.
    A cache of no topic, or of another that it holds no progress of, takes it (its partition
    rows start over). One that holds applied offsets of another topic is refused with a
    ShmcacheError naming both, and nothing in it changes: the other topic's entries are in
    its table, and a mistyped --topic must not cost the right one its progress (the next,
    correct run would replay from the log's start, and flag a gap where retention moved it)."""
    ctl = cache.control
    have = ctl.topic
    if have == cfg.topic:
        return
    held = [p for p in range(L.MAX_PARTITIONS) if int(ctl.partitions[p, C.P_APPLIED]) > 0]
    if have and held:
        raise ShmcacheError(f"cache {cfg.name!r} holds entries of topic {have!r} (applied offsets of partitions "
                            f"{held[:8]}{' ...' if len(held) > 8 else ''}); refusing to fill it from topic "
                            f"{cfg.topic!r}: give --topic {have!r}, or destroy the cache to start it anew")
    ctl.reset_partitions()  # progress on another topic (none held) means nothing here
    ctl.disown_partitions()  # the generation moves past any a dead supervisor's orphan held


def _broker_failed(cfg, control, broker, stopped, why: str) -> None:
    """A metadata request found no broker: note it, wait for the next try, give up past the bound."""
    broker.failed(why)
    _sleep(control, broker.pause_s(), stopped)
    if broker.over_limit():
        raise BrokerUnavailableError(
            f"cache {cfg.name!r}: no Kafka broker answered at {cfg.bootstrap} "
            f"within {cfg.broker_wait:g} s (broker_wait)")


def _sleep(control, seconds: float, stopped) -> None:
    """Wait, but return at once on a stop request (the supervisor's heartbeat goes on)."""
    end = time.monotonic() + max(0.0, seconds)
    while not stopped() and time.monotonic() < end:
        control.beat()
        time.sleep(max(0.0, min(0.1, end - time.monotonic())))


def check_broker(cfg, consumer, broker) -> None:
    """While running: when librdkafka said all brokers are down, probe at the retry
    interval until one answers (the supervisor's poll loop goes on: status stays current)."""
    from confluent_kafka import KafkaException

    if not broker.due():
        return
    try:
        consumer.list_topics(cfg.topic, timeout=broker_mod.PROBE_TIMEOUT_S)
    except KafkaException as e:
        broker.failed(kafka_client.error_text(e))
        if broker.over_limit():
            raise BrokerUnavailableError(
                f"cache {cfg.name!r}: the Kafka broker at {cfg.bootstrap} has not answered "
                f"for {broker.waited():.0f} s (broker_wait {cfg.broker_wait:g} s)") from None
        return
    broker.answered()

"""Helpers for the end-to-end pipeline tests (real broker, real `shmcache run` processes).

- `Harness` (fixture `harness`): starts supervisors as real processes, attaches
  readers, and at teardown (even on failure) stops every process it started by pid
  (SIGTERM, then SIGKILL; the supervisor's worker children too), closes readers and
  destroys every segment it named.
- `Model`: makes txmeta batches (ADD, re-ADD, DELETE, the same key twice in a batch)
  and keeps the table they must produce. For v1 every batch is built from keys of one
  partition only (murmur2 of each key = the partition), so its first key, which the
  producer keys the message by, sends it to that partition, and every message that
  touches a key lands in that key's partition: per-key order, hence the final table,
  is well defined. v2 and kv route by key in the producer.
- `StreamProducer`: a thread that keeps producing Model batches until stopped.
- Kafka probes (end offsets, a group's committed offsets) and table checks.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import defaultdict
from pathlib import Path

import numpy as np
import psutil
import pytest

import shmcache
from shmcache.consumer import forkserver, partitioners, wire
from shmcache.consumer.procs import SupervisorProcess
from shmcache.consumer.producer import TxmetaProducer
from shmcache.engine import layout as L
from shmcache.ipc import liveness

REPO = Path(__file__).resolve().parents[2]
ADD, DELETE = wire.ADD, wire.DELETE


def poll_until(cond, timeout: float, what: str, interval: float = 0.05):
    """Call cond() until it returns something truthy; fail with `what` after `timeout` s."""
    deadline = time.monotonic() + timeout
    last = None
    while True:
        last = cond()
        if last:
            return last
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what() if callable(what) else what}")
        time.sleep(interval)


# -- processes ---------------------------------------------------------------------------------


def running(p: psutil.Process) -> bool:
    """Still running: not gone, not a zombie (what liveness.is_alive counts as alive)."""
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def threads_stopped(pid: int) -> bool:
    """Every thread of `pid` is stopped (SIGSTOP delivered, not only sent)."""
    tasks = Path(f"/proc/{pid}/task")
    return all((t / "stat").read_text().rsplit(")", 1)[1].split()[0] == "T" for t in tasks.iterdir())


def wait_gone(procs: list[psutil.Process], what: str = "every process of the supervisor") -> None:
    """Until none of `procs` runs (running())."""
    poll_until(lambda: not [p for p in procs if running(p)], 30,
               lambda: f"{what} to be gone: {[p for p in procs if running(p)]}")


class SupervisorProc(SupervisorProcess):
    """One `python -m shmcache run` process (consumer/procs.py's, run from the log's
    folder), with what the tests need besides: its descendants by pid, signals, kill."""

    def __init__(self, log_path: Path, name: str, bootstrap: str, topic: str, group: str, *,
                 workers: int = 2, fmt: str = "v1", memory: str = "128MiB", commit_interval: float = 0.5,
                 assignment: str | None = None, max_rate: int | None = None, sets: tuple = (),
                 config: dict | None = None, args: tuple = (), env: dict | None = None):
        self.name = name
        self.env = None if env is None else {**os.environ, **env}  # added to the test's own
        self.group = group
        argv = [sys.executable, "-m", "shmcache", "run", "--name", name, "--bootstrap", bootstrap,
                "--topic", topic, "--group", group, "--workers", str(workers), "--format", fmt,
                "--memory", memory, "--commit-interval", str(commit_interval)]
        if assignment:
            argv += ["--assignment", assignment]
        if max_rate:
            argv += ["--max-rate", str(max_rate)]
        for s in sets:
            argv += ["--set", s]
        argv += list(args)  # any other flags, as given
        if config:  # settings without a flag (e.g. batch_messages), through a TOML file
            path = log_path.with_suffix(".toml")
            path.write_text("".join(f"{k} = {v!r}\n" for k, v in config.items()))
            argv += ["--config", str(path)]
        super().__init__(argv, log_path)
        self._log = None
        self._seen: dict[int, psutil.Process] = {}  # every descendant ever seen, for cleanup

    def start(self) -> "SupervisorProc":
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=self._log,
                                     stderr=subprocess.STDOUT, cwd=str(self.log_path.parent), env=self.env)
        self._seen[self.proc.pid] = psutil.Process(self.proc.pid)
        return self

    def children(self) -> list[psutil.Process]:
        """The supervisor's live descendants (workers, multiprocessing's resource tracker); remembered."""
        try:
            kids = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.Error:
            kids = []
        for k in kids:
            self._seen.setdefault(k.pid, k)
        return kids

    def named(self, prefix: str) -> list[psutil.Process]:
        """Its live descendants whose process name starts with `prefix`."""
        out = []
        for k in self.children():
            with contextlib.suppress(psutil.Error):
                if k.name().startswith(prefix) and k.status() != psutil.STATUS_ZOMBIE:
                    out.append(k)
        return out

    def workers(self) -> list[psutil.Process]:
        """Its worker processes: forked by its fork server, each names itself shmcache-w<index>
        (consumer/worker.py main; the fork server is shmcache-fork)."""
        return self.named("shmcache-w")

    def signal(self, sig: int) -> None:
        self.children()  # remember the workers before they may be orphaned
        self.proc.send_signal(sig)

    def wait(self, timeout: float) -> int | None:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def terminate(self, timeout: float = 60.0) -> int:
        """SIGTERM and wait for the exit code; SIGKILL (the whole tree) if it does not exit in time."""
        if self.running():
            self.signal(signal.SIGTERM)
        code = self.wait(timeout)
        if code is None:
            self.kill()
            code = self.proc.wait(10)
        self.reap_children(10)
        return code

    def kill(self) -> None:
        """SIGKILL the supervisor and everything it started, and remove the directory of its
        fork server's socket, which a fork server killed outright cannot."""
        if self.proc is None:
            return
        dirs = set()
        for p in self.children():  # the fork server, named or still importing, and what it forked
            with contextlib.suppress(psutil.Error):
                dirs.add(p.environ().get(forkserver.DIR_ENV))
        killed = []
        for p in self._seen.values():
            try:
                if p.is_running():
                    p.kill()
                    killed.append(p)
            except psutil.Error:
                pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            pass
        # SIGKILL is delivered, not done: a worker still runs until the kernel tears it down, and
        # its rows name a live process until then. Return when none of them does.
        wait_gone(killed, "SIGKILLed pids")
        for d in dirs:
            if d and Path(d).name.startswith("pymp-"):
                shutil.rmtree(d, ignore_errors=True)

    def reap_children(self, timeout: float) -> None:
        """After the supervisor exited: its children should be gone; terminate any that are not."""
        kids = [p for pid, p in self._seen.items() if pid != self.proc.pid]
        liveness.stop_processes(kids, timeout)

    def cleanup(self) -> None:
        if self.proc is None:
            return
        if self.running():
            self.signal(signal.SIGTERM)
            if self.wait(20) is None:
                self.kill()
        self.reap_children(5)
        if self._log is not None:
            self._log.close()
            self._log = None

    def log_text(self) -> str:
        if self._log is not None:
            self._log.flush()
        return self.log_path.read_text(errors="replace")


class Harness:
    def __init__(self, tmp_path: Path, bootstrap: str):
        self.tmp_path = tmp_path
        self.bootstrap = bootstrap
        self.names: list[str] = []
        self.sups: list[SupervisorProc] = []
        self.readers: list = []
        self.threads: list["StreamProducer"] = []

    def cache_name(self, tag: str) -> str:
        name = f"t-pipe-{tag}-{uuid.uuid4().hex[:10]}"
        self.names.append(name)
        return name

    def group(self, tag: str) -> str:
        return f"t-pipe-{tag}-{uuid.uuid4().hex[:10]}"

    def supervisor(self, name: str, topic: str, group: str, **kw) -> SupervisorProc:
        label = f"{name}-{sum(s.name == name for s in self.sups)}"
        sup = SupervisorProc(self.tmp_path / f"{label}.log", name, self.bootstrap, topic, group, **kw)
        self.sups.append(sup)
        return sup.start()

    def attach(self, name: str, timeout: float = 60.0, sup: SupervisorProc | None = None):
        """Attach once the supervisor has created the segment and published the topic."""

        def ready():
            if sup is not None and not sup.running():
                raise AssertionError(f"supervisor exited with {sup.proc.returncode}:\n{sup.log_text()[-3000:]}")
            if not shmcache.exists(name):
                return None
            try:
                r = shmcache.attach(name)
            except shmcache.ShmcacheError:
                return None
            if r.control.npartitions == 0:
                r.close()
                return None
            return r

        r = poll_until(ready, timeout, f"cache {name} to appear")
        self.readers.append(r)
        return r

    def producer(self, topic: str, model: "Model", **kw) -> "StreamProducer":
        t = StreamProducer(self.bootstrap, topic, model, **kw)
        self.threads.append(t)
        return t

    def close(self) -> None:
        for t in self.threads:
            t.stop_event.set()
            t.wake.set()
        for t in self.threads:
            t.join(30)
        for sup in self.sups:
            sup.cleanup()
        for r in self.readers:
            try:
                r.close()
            except Exception:
                pass
        for name in self.names:
            try:
                shmcache.destroy(name)
            except (FileNotFoundError, shmcache.ShmcacheError):
                pass


@pytest.fixture
def harness(tmp_path, kafka_broker):
    h = Harness(tmp_path, kafka_broker.bootstrap)
    try:
        yield h
    finally:
        h.close()


# -- the model ----------------------------------------------------------------------------------

class Model:
    """Batches of txmeta entries, and the table they must leave behind."""

    def __init__(self, fmt: str, partitions: int, seed: int):
        self.fmt = fmt
        self.partitions = partitions
        self.rng = np.random.default_rng(seed)
        self.expected: dict[bytes, bytes | None] = {}  # every key ever sent -> final value or None
        self.live: dict[int, list[bytes]] = defaultdict(list)  # partition group -> keys (maybe deleted)
        self.next_part = 0
        self.entries = 0  # entries sent so far
        self.lock = threading.Lock()

    def _value(self) -> bytes:
        n = int(self.rng.integers(61, 142))
        return self.rng.integers(0, 256, n, np.uint8).tobytes()

    def _new_keys(self, n: int, part: int | None) -> list[bytes]:
        out = []
        while len(out) < n:
            k = self.rng.integers(0, 256, 32, np.uint8).tobytes()
            if k in self.expected:
                continue
            if part is not None and partitioners.murmur2_partition(k, self.partitions) != part:
                continue
            out.append(k)
        return out

    def batch(self, n_new: int = 12, n_update: int = 4, n_delete: int = 4, n_twice: int = 2):
        """One batch: new ADDs, re-ADDs with a new value, DELETEs (of live and deleted keys),
        and keys that appear twice in the batch (ADD then DELETE, DELETE then ADD).
        Returns (keys (n, 32) uint8, actions, values) and applies it to the model."""
        with self.lock:
            if self.fmt == "v1":
                part = self.next_part
                self.next_part = (self.next_part + 1) % self.partitions
            else:
                part = None
            group = self.live[part]
            entries: list[tuple[bytes, int, bytes]] = []
            for k in self._new_keys(n_new, part):
                entries.append((k, ADD, self._value()))
            if group:
                for i in self.rng.integers(0, len(group), n_update):
                    entries.append((group[int(i)], ADD, self._value()))
                for i in self.rng.integers(0, len(group), n_delete):
                    entries.append((group[int(i)], DELETE, b""))
                for j, i in enumerate(self.rng.integers(0, len(group), n_twice)):
                    k = group[int(i)]
                    if j % 2:
                        entries += [(k, ADD, self._value()), (k, DELETE, b"")]
                    else:
                        entries += [(k, DELETE, b""), (k, ADD, self._value())]
            order = self.rng.permutation(len(entries) - 1) + 1 if len(entries) > 1 else []
            # shuffled (the model applies the order sent); entry 0, a new key of `part`, stays
            # first: the v1 producer keys the message by it
            entries = [entries[0]] + [entries[int(i)] for i in order]
            self.entries += len(entries)
            for k, a, v in entries:
                if k not in self.expected:
                    group.append(k)
                self.expected[k] = v if a == ADD else None
            keys = np.frombuffer(b"".join(k for k, _, _ in entries), np.uint8).reshape(-1, 32)
            actions = np.array([a for _, a, _ in entries], np.uint8)
            values = [v for _, _, v in entries]
            return keys, actions, values

    def snapshot(self) -> dict[bytes, bytes | None]:
        with self.lock:
            return dict(self.expected)


class StreamProducer(threading.Thread):
    """Produces Model batches until stopped; `rate` batches per second (roughly)."""

    def __init__(self, bootstrap: str, topic: str, model: Model, *, rate: float = 20.0,
                 batch_kw: dict | None = None, max_batches: int | None = None):
        super().__init__(daemon=True, name=f"producer-{topic}")
        self.producer = TxmetaProducer(bootstrap, topic, format=model.fmt)
        self.model = model
        self.rate = rate
        self.batch_kw = batch_kw or {}
        self.max_batches = max_batches
        self.stop_event = threading.Event()
        self.wake = threading.Event()
        self.extra = 0  # batches asked for by burst(), sent at once
        self.extra_lock = threading.Lock()
        self.batches = 0
        self.error: BaseException | None = None

    def burst(self, n: int, timeout: float = 30.0) -> None:
        """Send n more batches at once, from this thread: a second producer running at the
        same time would make the order on the topic differ from the model's."""
        with self.extra_lock:
            target = self.batches + n
            self.extra += n
        self.wake.set()
        poll_until(lambda: self.batches >= target or self.error is not None or not self.is_alive(), timeout,
                   f"a burst of {n} batches")

    def run(self) -> None:
        try:
            period = 1.0 / self.rate
            nxt = time.monotonic()
            while not self.stop_event.is_set():
                if self.max_batches is not None and self.batches >= self.max_batches:
                    break
                self.producer.send(*self.model.batch(**self.batch_kw))
                with self.extra_lock:
                    self.batches += 1
                    if self.extra:
                        self.extra -= 1
                        continue
                nxt = max(nxt + period, time.monotonic() - period)
                self.wake.wait(max(0.0, nxt - time.monotonic()))
                self.wake.clear()
            self.producer.flush(60)
        except BaseException as e:  # noqa: BLE001 - reported by finish()
            self.error = e
        finally:
            self.producer = None  # librdkafka handle goes now, not at interpreter exit

    def finish(self, timeout: float = 90.0) -> None:
        """Stop producing (or, with max_batches, let it send them all), wait for every message
        to be acknowledged; raise what went wrong."""
        if self.max_batches is None:
            self.stop_event.set()
            self.wake.set()
        self.join(timeout)
        assert not self.is_alive(), "producer thread did not finish"
        if self.error is not None:
            raise self.error


# -- Kafka probes ---------------------------------------------------------------------------------

class KafkaProbe:
    """Reads end offsets and a group's committed offsets (never joins the group)."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, group: str | None = None):
        from confluent_kafka import Consumer

        self.topic = topic
        self.partitions = partitions
        self.consumer = Consumer({"bootstrap.servers": bootstrap,
                                  "group.id": group or f"t-probe-{uuid.uuid4().hex[:8]}",
                                  "enable.auto.commit": False})

    def end_offsets(self) -> list[int]:
        from confluent_kafka import TopicPartition

        return [self.consumer.get_watermark_offsets(TopicPartition(self.topic, p), timeout=10)[1]
                for p in range(self.partitions)]

    def committed(self) -> list[int]:
        """The group's committed offset per partition; negative if none."""
        from confluent_kafka import TopicPartition

        tps = self.consumer.committed([TopicPartition(self.topic, p) for p in range(self.partitions)], timeout=10)
        return [tp.offset for tp in sorted(tps, key=lambda t: t.partition)]

    def close(self) -> None:
        self.consumer.close()


def produce_and_wait(harness, topic: str, model: "Model", partitions: int, **kw) -> list[int]:
    """Run a producer of `model` batches to its end (`max_batches` in kw) and return the
    topic's end offsets then, per partition."""
    prod = harness.producer(topic, model, **kw)
    prod.start()
    prod.finish()
    probe = KafkaProbe(harness.bootstrap, topic, partitions)
    ends = probe.end_offsets()
    probe.close()
    return ends


def produce_entries(bootstrap: str, topic: str, counts: dict[int, int], rng) -> dict[bytes, bytes]:
    """One-entry v1 messages (ADD of a new random key), counts[p] of them to partition p;
    returns {key: value} sent, once every message is acknowledged."""
    from confluent_kafka import Producer

    prod = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    sent = {}
    for p, n in counts.items():
        for _ in range(n):
            key, value = rng.bytes(32), rng.bytes(80)
            prod.produce(topic, wire.encode_v1([key], [ADD], [value]), partition=p)
            sent[key] = value
    assert prod.flush(30) == 0
    return sent


def applied(r, partitions: int) -> list[int]:
    """Applied offsets from the segment's control area (valid after the supervisor exits too)."""
    rows = r.control.partitions
    return [int(rows[p, L.P_APPLIED]) for p in range(partitions)]


def wait_applied(r, ends: list[int], timeout: float, sup: SupervisorProc | None = None) -> None:
    """Until every partition's applied offset reached `ends`."""

    def done():
        if sup is not None and not sup.running():
            raise AssertionError(f"supervisor exited with {sup.proc.returncode}:\n{sup.log_text()[-3000:]}")
        return all(a >= e for a, e in zip(applied(r, len(ends)), ends))

    def what():
        logs = f"; supervisor log:\n{sup.log_text()[-4000:]}" if sup is not None else ""
        return f"applied {applied(r, len(ends))} to reach {ends}{logs}"

    poll_until(done, timeout, what, interval=0.1)


def assert_no_worker_restarted(r, timeout: float = 60.0) -> None:
    """Every worker was started once and is up. A worker that owns no partition may still
    be importing its kernels when the others have applied everything, so wait for each to
    claim its row before judging; a restart would show as starts > 1."""

    def up():
        ws = r.status()["workers"]
        assert all(w["starts"] == 1 for w in ws), ws  # a restart is never undone: fail at once
        assert all(w["state"] in ("starting", "up") for w in ws), ws  # the supervisor runs
        return all(w["alive"] and w["state"] == "up" for w in ws)

    poll_until(up, timeout, lambda: f"every worker to be up: {r.status()['workers']}")


def check_table(r, expected: dict[bytes, bytes | None]) -> None:
    """Every key: present with exactly its value, or absent."""
    keys = list(expected)
    got = []
    for i in range(0, len(keys), 20000):
        got += r.get_many(keys[i:i + 20000])
    wrong = [(k, expected[k], g) for k, g in zip(keys, got) if g != expected[k]]
    if wrong:
        missing = sum(1 for _, e, g in wrong if g is None)
        stale = sum(1 for _, e, g in wrong if e is None)
        ex = [(k.hex()[:16], None if e is None else e.hex()[:16], None if g is None else g.hex()[:16])
              for k, e, g in wrong[:5]]
        raise AssertionError(f"{len(wrong)} of {len(keys)} keys wrong ({missing} missing, {stale} should be "
                             f"absent, rest wrong value); examples (key, want, got): {ex}")
    assert r.stats()["evictions"] == 0  # the model assumes nothing was evicted


def replay_topic(bootstrap: str, topic: str, upto: list[int], fmt: str) -> dict[bytes, bytes | None]:
    """The table that applying partition p's messages [0, upto[p]) in order gives, from the topic itself."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"t-replay-{uuid.uuid4().hex[:8]}",
                  "enable.auto.commit": False, "enable.partition.eof": False})
    want = {p: o for p, o in enumerate(upto) if o > 0}
    c.assign([TopicPartition(topic, p, 0) for p in want])
    table: dict[bytes, bytes | None] = {}
    pos = {p: 0 for p in want}
    deadline = time.monotonic() + 60
    try:
        while any(pos[p] < want[p] for p in want):
            assert time.monotonic() < deadline, f"replay stuck at {pos}, want {want}"
            for m in c.consume(500, timeout=0.5):
                assert m.error() is None, m.error()
                p, o = m.partition(), m.offset()
                if o >= want[p]:
                    continue
                assert o == pos[p], f"partition {p}: expected offset {pos[p]}, got {o}"
                pos[p] = o + 1
                if fmt == "kv":
                    table[m.key()] = m.value()
                else:
                    b = wire.decode(m.value())
                    for i in range(len(b)):
                        k = b.keys[i].tobytes()
                        table[k] = b.value(i) if b.actions[i] == ADD else None
    finally:
        c.close()
    return table

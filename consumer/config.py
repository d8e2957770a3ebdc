"""What `shmcache run` needs to know: one config object, from flags or a TOML file.

A TOML file holds the same names as the flags (underscores), plus a [kafka] table
of librdkafka settings passed through to every consumer unchanged:

    name = "txmeta"
    bootstrap = "127.0.0.1:9092"
    topic = "txmeta"
    workers = 2
    format = "v1"
    [kafka]
    "fetch.max.bytes" = 52428800
"""

from __future__ import annotations

import dataclasses
import math
import tomllib
from dataclasses import dataclass, field

from shmcache.engine import layout as L
from shmcache.engine import units
from shmcache.formats import registry as wire_formats
from shmcache.ipc.machine import machine

STRATEGIES = ("cooperative-sticky", "range", "roundrobin")

# Settings the supervisor and workers own; passing them through would break the
# invariants (commits only of applied offsets, by the supervisor alone; where a partition
# starts, which the supervisor decides and checks against the log start: a gap). Each with
# every other name librdkafka takes for it (its aliases and legacy topic-level forms, from
# librdkafka's CONFIGURATION.md): metadata.broker.list silently replaced --bootstrap.
RESERVED_KAFKA = {
    "bootstrap.servers": "--bootstrap", "metadata.broker.list": "--bootstrap",
    "group.id": "--group", "group.instance.id": "--instance-id",
    "enable.auto.commit": "nothing: the supervisor commits what was applied",
    "auto.commit.enable": "nothing: the supervisor commits what was applied",
    "enable.auto.offset.store": "nothing: the supervisor stores what was applied",
    "auto.offset.reset": "nothing: a partition starts where the table ends, a gap is flagged",
    # a table of topic settings (confluent-kafka's old form), which could set any of the above
    "default.topic.config": "the settings themselves",
    # callables shmcache sets; a TOML file or --set can only give text there
    "error_cb": "nothing", "logger": "nothing", "on_commit": "nothing", "stats_cb": "nothing",
    "throttle_cb": "nothing",
}
DEFAULT_MEMORY = "1GiB"  # a new cache's size when `memory` is not given
TOPIC_REFRESH_MS = 5000  # how soon partitions added to the topic are seen (consumer_settings)
DYNAMIC = "none"  # instance_id for plain (dynamic) group membership


# each RunConfig annotation: the types a value may have, and how an error says it
_TYPES = {
    "str": ((str,), "a string"),
    "int": ((int,), "a whole number"),
    "float": ((int, float), "a number"),
    "bool": ((bool,), "true or false"),
    "dict": ((dict,), "a table"),
    "int | None": ((int, type(None)), "a whole number"),
    "int | str": ((int, str), "a whole number or a size such as \"128MiB\""),
    "int | str | None": ((int, str, type(None)), "an octal mode such as 0o640 or \"0640\""),
}
DAY = 86_400.0
_MEANING = {"max_rate": " (0 = unlimited)", "metrics_port": " (0 = no endpoint)", "broker_wait": " (0 = for ever)"}
# each number's range: (least, most, whether the least itself is refused); floats must be finite
_RANGES = {
    "workers": (1, L.MAX_WORKERS, False),  # one row each in the segment
    "key_size": (1, L.MAX_KEY_SIZE, False),
    "commit_interval": (0, 3600.0, True),
    # consume() takes at most 1,000,000; the local queue holds ~460 txmeta messages at librdkafka's
    # defaults, so a larger batch only holds a worker's heartbeat longer where messages are small
    "batch_messages": (1, 100_000, False),
    "max_rate": (0, 10**12, False),  # 0 = unlimited
    "drain_timeout": (0, DAY, True),
    "stop_timeout": (0, DAY, True),
    "worker_heartbeat_timeout": (0, DAY, True),
    "worker_start_timeout": (0, DAY, True),
    "metrics_port": (0, 65535, False),  # 0 = no endpoint
    "broker_wait": (0, 30 * DAY, False),  # 0 = wait for ever
    "snapshot_interval": (0, 30 * DAY, True),
    "snapshot_keep": (1, 10_000, False),
    "grow_below": (0, 365 * DAY, True),
}


def _num(x: float) -> str:
    return f"{int(x):,}" if float(x).is_integer() else f"{x:g}"


def setting(default, help: str, **flag):
    """A RunConfig field that is also a `shmcache run` flag, --NAME with dashes (cli/run.py makes
    each flag from these): `help` its --help text, where "{default}" stands for the default;
    `flag` argparse's metavar or choices, or octal=True for a file mode given as chmod takes it.
    The flag's type is the field's; a flag not given leaves the TOML file's value or the default."""
    shown = f"{default:g}" if isinstance(default, float) else default
    return field(default=default, metadata={"help": help.format(default=shown), **flag})


@dataclass
class RunConfig:
    name: str = setting(dataclasses.MISSING, "the cache name")
    bootstrap: str = setting(dataclasses.MISSING, "Kafka bootstrap servers, host:port[,host:port]")
    topic: str = setting(dataclasses.MISSING, "the Kafka topic that fills the cache")
    group: str = setting("", "consumer group (default: unique to this machine and cache)")
    # Kafka static membership: a supervisor restarted after a crash takes its partitions back
    # at once instead of after the session timeout
    instance_id: str = setting("", "Kafka static membership id (group.instance.id; default: unique to this "
                                   f"machine and cache; '{DYNAMIC}' = dynamic membership)")
    # several machines on one host (scripts/cluster) each need their own (shmcache.ipc.machine)
    machine: str = setting("", "this machine's name in the default group and instance id "
                               "(default $SHMCACHE_MACHINE, else the host name)")
    # for a cache this run creates (create_memory); a cache restored from a snapshot keeps the
    # snapshot's own size unless this is given
    memory: str = setting("", f"cache size if it must be created (default {DEFAULT_MEMORY}; a restored "
                              "snapshot's own; `shmcache size` says what N entries need)")
    # None = an existing cache's own, else layout's default for a new one; given, an existing
    # cache's must match. Workers decode against the cache's own.
    max_value: int | None = setting(None, f"largest value if the cache must be created (default "
                                          f"{L.DEFAULT_MAX_VALUE}); an existing cache keeps its own, which must "
                                          "match if this is given", metavar="BYTES")
    # online growth (consumer/supervisor/resizing.py Grower): "" never
    memory_max: str = setting("", "grow the cache by itself, online, up to this size when its entries are evicted "
                                  "young (see --grow-below; default: never)", metavar="SIZE")
    grow_below: float = setting(3600.0, "with --memory-max: grow (2x) when an entry is evicted less than this "
                                        "long after it was written (default {default})", metavar="SECONDS")
    # made so at every start, also of a cache restored from a snapshot; None: a new cache's
    # 0o600, a cache that is there keeps its own
    mode: int | str | None = setting(None, "the cache's octal file mode at every start, restores too (640: a "
                                           "reader group may attach; default: 600 for a new cache)", octal=True)
    # a name or gid ("" the supervisor user's own), looked up at the start
    reader_group: str = setting("", "the Unix group the cache's file is given (with --mode 640, its readers'); "
                                    "this user must belong to it", metavar="GROUP")
    workers: int = setting(2, "worker processes (default {default})")
    # proto: the upstream Teranode topic, a protobuf message per transaction (formats/proto.py)
    format: str = setting("v1", "wire format (default {default}; proto: Teranode's protobuf message per "
                                "transaction)", choices=wire_formats.NAMES)
    commit_interval: float = setting(1.0, "seconds between commits (default {default})")
    assignment: str = setting("cooperative-sticky", "partition.assignment.strategy (default {default})",
                              choices=STRATEGIES)
    key_size: int = 32
    batch_messages: int = 256  # messages a worker takes per consume() call
    # leaves CPU to readers while catching up
    max_rate: int = setting(0, "entries/s per worker while catching up (default {default}: unlimited)")
    drain_timeout: float = 30.0  # how long a revoke waits for workers to drain; a shutdown, for all of them
    metrics_port: int = setting(0, "serve Prometheus metrics on this port (default {default}: none)")
    metrics_host: str = setting("127.0.0.1", "address of the metrics endpoint (default {default})")
    broker_wait: float = setting(0.0, "exit if the Kafka broker does not answer for this long (default "
                                      "{default}: wait for it)", metavar="SECONDS")
    snapshot_dir: str = setting("", "snapshot the cache here; restore the newest at start", metavar="DIR")
    snapshot_interval: float = setting(300.0, "seconds between snapshots (default {default})", metavar="SECONDS")
    snapshot_keep: int = setting(3, "snapshots kept (default {default})", metavar="K")
    # it also runs at SCHED_IDLE: a snapshot beside readers takes little from them (consumer/supervisor/snapshot_policy.py)
    snapshot_rate: int | str = setting("128MiB", "bytes/s a periodic snapshot writes at most, e.g. 64MiB "
                                                 "(default {default}; 0 = unlimited)", metavar="BYTES")
    # a heartbeat is written once per loop: every 0.1 s idle, after every batch busy
    worker_heartbeat_timeout: float = setting(
        10.0, "kill and restart a worker whose heartbeat is older than this; its partitions are not caught up "
              "meanwhile (default {default})", metavar="SECONDS")
    # come up = claimed its row. A start takes about a second with the kernels in numba's cache
    # (the supervisor warms them first); one that must compile them itself (a cache it cannot
    # write) takes far longer on a loaded host: the bound leaves that room several times over,
    # or such a worker would never come up
    worker_start_timeout: float = setting(
        120.0, "kill and restart a worker that has not come up (opened the cache, loaded its kernels) this "
               "long after it was started (default {default})", metavar="SECONDS")
    # consumer/supervisor/stop.py; room for the interpreter's exit inside the systemd unit's TimeoutStopSec
    stop_timeout: float = setting(
        50.0, "the whole stop's budget: drain, final commit, leaving the group, closing the Kafka consumer "
              "(default {default}, inside systemd's TimeoutStopSec=60)", metavar="SECONDS")
    # a table that lacks offsets the topic's retention deleted before it had them (a gap) is
    # not ready unless this is set: the operator says the cache may serve it as it is
    accept_gaps: bool = setting(False, "call the cache ready even where the topic's retention deleted offsets "
                                       "before the cache had them (default: such a cache is caught up but not "
                                       "ready)")
    kafka: dict = field(default_factory=dict)  # librdkafka settings, passed through

    def __post_init__(self) -> None:
        if not self.machine:
            self.machine = machine()
        if not self.group:
            self.group = f"shmcache-{self.machine}-{self.name}"
        if not self.instance_id:
            self.instance_id = f"shmcache-{self.machine}-{self.name}"
        self.validate()

    def validate(self) -> None:
        from shmcache.ipc.segment import check_name

        for f in dataclasses.fields(self):  # a TOML file can give any type: say which setting, not a TypeError
            value, (kinds, said) = getattr(self, f.name), _TYPES[f.type]
            if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
                raise ValueError(f"{f.name}={value!r}: expected {said}")
        check_name(self.name)
        if not self.bootstrap:
            raise ValueError("bootstrap: give the Kafka bootstrap servers (host:port[,host:port])")
        if not self.topic:
            raise ValueError("topic: give the Kafka topic that fills the cache")
        fmt = wire_formats.get(self.format)
        try:
            fmt.require()  # said once at the start, not by every worker as it dies
        except ImportError as e:
            raise ValueError(str(e)) from None
        if self.assignment not in STRATEGIES:
            raise ValueError(f"assignment={self.assignment!r}: expected one of {', '.join(STRATEGIES)}")
        for name, (lo, hi, above) in _RANGES.items():
            v = getattr(self, name)
            if isinstance(v, float) and not math.isfinite(v) or v < lo or v > hi or (above and v == lo):
                raise ValueError(f"{name}={v!r}: expected {'more than' if above else 'at least'} {_num(lo)} and at "
                                 f"most {_num(hi)}{_MEANING.get(name, '')}")
        units.parse_bytes(self.create_memory, what="memory")  # a clear ValueError now, not at the cache's creation
        if self.memory_max_bytes and self.memory and self.memory_max_bytes < units.parse_bytes(self.memory):
            raise ValueError(f"memory_max={self.memory_max!r}: less than memory={self.memory!r}; the cache only "
                             "grows up to it")
        if self.mode is not None:
            from shmcache.engine.lifecycle import check_mode

            check_mode(self.name, self.file_mode)
        # reader_group is looked up at the start (startup.open_cache): the machine's groups, not the file's
        self.snapshot_rate_bytes  # a clear ValueError for a rate that is no size
        if self.max_value is not None and (isinstance(self.max_value, bool) or not isinstance(self.max_value, int)
                                           or not 0 <= self.max_value <= 0xFFFFFFFF):
            raise ValueError(f"max_value={self.max_value!r}: expected bytes 0..{0xFFFFFFFF} (or unset: the cache's own)")
        if fmt.key_size not in (None, self.key_size):
            any_size = ", ".join(f.name for f in wire_formats.FORMATS.values() if f.key_size is None)
            raise ValueError(f"key_size={self.key_size}: format {fmt.name!r} carries {fmt.key_size}-byte keys; use a "
                             f"format of any key size ({any_size})")
        for key, value in self.kafka.items():
            if key in RESERVED_KAFKA:
                raise ValueError(f"kafka setting {key!r} is set by shmcache itself; use {RESERVED_KAFKA[key]} instead")
            if isinstance(value, dict):  # [kafka] fetch.max.bytes = 1 is a table fetch > max > bytes to TOML
                raise ValueError(f"kafka setting {key!r} = {value!r}: a table, not a value; write a librdkafka name "
                                 f"in quotes (\"{key}.{next(iter(value), '')}\" = ...)")
            if isinstance(value, float) and not math.isfinite(value) or not isinstance(value, (str, int, float, bool)):
                raise ValueError(f"kafka setting {key!r} = {value!r}: expected text, a number or true/false")

    @property
    def file_mode(self) -> int | None:
        """`mode` as a number (TOML 0o640, or octal digits in a string: "0640"), None if not given."""
        if self.mode is None or isinstance(self.mode, int):
            return self.mode
        try:
            return int(self.mode, 8)
        except ValueError:
            raise ValueError(f"mode={self.mode!r}: expected octal digits such as \"0640\"") from None

    @property
    def reader_gid(self) -> int | None:
        """`reader_group` as a gid (None if not given); ValueError if there is no such group."""
        import grp

        if not self.reader_group:
            return None
        try:
            return grp.getgrnam(self.reader_group).gr_gid
        except KeyError:
            if self.reader_group.isdigit():
                return int(self.reader_group)
            raise ValueError(f"reader_group={self.reader_group!r}: no such group on this machine "
                             "(groupadd it, and add the readers' and the supervisor's users)") from None

    @property
    def create_memory(self) -> str:
        """The size of a cache this run creates: `memory`, or DEFAULT_MEMORY if not given."""
        return self.memory or DEFAULT_MEMORY

    @property
    def memory_max_bytes(self) -> int:
        """memory_max in bytes, 0 = the cache never grows by itself."""
        return units.parse_bytes(self.memory_max, what="memory_max") if self.memory_max else 0

    @property
    def snapshot_rate_bytes(self) -> int:
        """snapshot_rate in bytes/s, 0 = unlimited."""
        if self.snapshot_rate in (0, "0"):
            return 0
        return units.parse_bytes(self.snapshot_rate, what="snapshot_rate")

    @property
    def cooperative(self) -> bool:
        return self.assignment == "cooperative-sticky"

    @property
    def static(self) -> bool:
        return self.instance_id != DYNAMIC

    @property
    def client_id(self) -> str:
        """The client.id of the supervisor's own Kafka clients, its group's consumer and its
        AdminClients (kafka/client.py admin_client): the [kafka] table's if it sets one, else
        shmcache-<name>@<machine>. Other members' status names this one by it."""
        return self.kafka.get("client.id") or f"shmcache-{self.name}@{self.machine}"

    def group_settings(self) -> dict:
        """librdkafka settings of the supervisor's group membership (its consumer only)."""
        conf = {"group.id": self.group, "partition.assignment.strategy": self.assignment, "client.id": self.client_id}
        if self.static:
            conf["group.instance.id"] = self.instance_id
        return conf

    def consumer_settings(self, **extra) -> dict:
        """librdkafka settings common to the supervisor's and the workers' consumers."""
        conf = {
            "bootstrap.servers": self.bootstrap,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "earliest",
            "enable.partition.eof": False,
            # A txmeta message is ~140 KB, so the local queue reaches its byte limit
            # (queued.max.messages.kbytes, 64 MiB: ~460 messages) while a worker applies
            # a batch, and librdkafka then postpones the next fetch by
            # fetch.queue.backoff.ms, 1 s by default: fetching would stop whenever
            # applying runs.
            "fetch.queue.backoff.ms": 10,
            # librdkafka logs every failed connect (many lines a second while the broker is down);
            # its errors reach error_cb, and the supervisor says the broker's state once
            # per retry (kafka/broker.py). `--set log_level=7` shows everything.
            "log_level": 2,
            # Partitions added to the topic reach the group (and status(), which is not
            # ready until they are assigned here and caught up) only when librdkafka
            # refreshes its metadata: every 300 s by default, all that time "ready" with
            # the new partitions' entries missing. A metadata request every 5 s costs the
            # broker nothing measurable.
            "topic.metadata.refresh.interval.ms": TOPIC_REFRESH_MS,
        }
        conf.update(self.kafka)
        conf.update(extra)
        return conf

    @classmethod
    def from_toml(cls, path: str, **overrides) -> "RunConfig":
        with open(path, "rb") as f:
            try:
                data = tomllib.load(f)
            except tomllib.TOMLDecodeError as e:
                raise ValueError(f"{path}: not valid TOML: {e}") from None
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"{path}: unknown settings {sorted(unknown)}; known: {sorted(known)}")
        data.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**data)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

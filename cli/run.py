"""`shmcache run`: the supervisor daemon (consumer/supervisor.py), from flags or a TOML file."""

from __future__ import annotations

from shmcache.cli.args import key_values, mode_arg

HELP = "run the supervisor daemon: keep a cache filled from a Kafka topic"


def add_arguments(rn) -> None:
    rn.add_argument("--config", help="a TOML file with these settings (flags override it)")
    rn.add_argument("--name", help="the cache name")
    rn.add_argument("--bootstrap", help="Kafka bootstrap servers, host:port[,host:port]")
    rn.add_argument("--topic")
    rn.add_argument("--group", help="consumer group (default: unique to this machine and cache)")
    rn.add_argument("--instance-id", help="Kafka static membership id (group.instance.id; default: unique to "
                                          "this machine and cache; 'none' = dynamic membership)")
    rn.add_argument("--machine", help="this machine's name in the default group and instance id "
                                      "(default $SHMCACHE_MACHINE, else the host name)")
    rn.add_argument("--memory", help="cache size if it must be created (default 1GiB; a restored snapshot's own)")
    rn.add_argument("--max-value", type=int, metavar="BYTES",
                    help="largest value if the cache must be created (default 4096); an existing cache keeps "
                         "its own, which must match if this is given")
    rn.add_argument("--mode", type=mode_arg, help="the cache's octal file mode at every start, restores too "
                                                  "(640: a reader group may attach; default: 600 for a new cache)")
    rn.add_argument("--reader-group", metavar="GROUP", help="the Unix group the cache's file is given (with --mode "
                                                            "640, its readers'); this user must belong to it")
    rn.add_argument("--workers", type=int, help="worker processes (default 2)")
    rn.add_argument("--format", choices=("v1", "v2", "kv"), help="wire format (default v1)")
    rn.add_argument("--commit-interval", type=float, help="seconds between commits (default 1)")
    rn.add_argument("--assignment", choices=("cooperative-sticky", "range", "roundrobin"),
                    help="partition.assignment.strategy (default cooperative-sticky)")
    rn.add_argument("--max-rate", type=int, help="entries/s per worker while catching up (default 0: unlimited)")
    rn.add_argument("--set", action="append", metavar="KEY=VALUE", help="a librdkafka setting, repeatable")
    rn.add_argument("--metrics-port", type=int, help="serve Prometheus metrics on this port (default 0: none)")
    rn.add_argument("--metrics-host", help="address of the metrics endpoint (default 127.0.0.1)")
    rn.add_argument("--broker-wait", type=float, metavar="SECONDS",
                    help="exit if the Kafka broker does not answer for this long (default 0: wait for it)")
    rn.add_argument("--snapshot-dir", metavar="DIR", help="snapshot the cache here; restore the newest at start")
    rn.add_argument("--snapshot-interval", type=float, metavar="SECONDS", help="seconds between snapshots (default 300)")
    rn.add_argument("--snapshot-keep", type=int, metavar="K", help="snapshots kept (default 3)")
    rn.add_argument("--snapshot-rate", metavar="BYTES", help="bytes/s a periodic snapshot writes at most, e.g. "
                                                             "64MiB (default 128MiB; 0 = unlimited)")
    rn.add_argument("--worker-heartbeat-timeout", type=float, metavar="SECONDS",
                    help="kill and restart a worker whose heartbeat is older than this; its partitions are not "
                         "caught up meanwhile (default 10)")
    rn.add_argument("--worker-start-timeout", type=float, metavar="SECONDS",
                    help="kill and restart a worker that has not come up (opened the cache, loaded its kernels) "
                         "this long after it was started (default 120)")
    rn.add_argument("--stop-timeout", type=float, metavar="SECONDS",
                    help="the whole stop's budget: drain, final commit, leaving the group, closing the Kafka "
                         "consumer (default 50, inside systemd's TimeoutStopSec=60)")
    rn.add_argument("--accept-gaps", action="store_true", default=None,
                    help="call the cache ready even where the topic's retention deleted offsets before the "
                         "cache had them (default: such a cache is caught up but not ready)")


def run(a) -> int:
    from shmcache.consumer import supervisor
    from shmcache.consumer.config import RunConfig

    flags = {k: getattr(a, k) for k in ("name", "bootstrap", "topic", "group", "instance_id", "memory", "max_value",
                                        "mode", "reader_group", "workers",
                                        "format", "commit_interval", "assignment", "max_rate", "metrics_port",
                                        "metrics_host", "broker_wait", "machine", "snapshot_dir", "snapshot_interval",
                                        "snapshot_keep", "snapshot_rate", "accept_gaps",
                                        "worker_heartbeat_timeout", "worker_start_timeout", "stop_timeout")}
    kafka = key_values(a.set, "shmcache: --set", "a librdkafka setting")
    if a.config:
        cfg = RunConfig.from_toml(a.config, **flags)
        cfg.kafka.update(kafka)
        cfg.validate()
    else:
        missing = [f"--{k}" for k in ("name", "bootstrap", "topic") if not flags[k]]
        if missing:
            raise SystemExit(f"shmcache run: give {', '.join(missing)} (or --config FILE)")
        cfg = RunConfig(**{k: v for k, v in flags.items() if v is not None}, kafka=kafka)
    return supervisor.run(cfg)

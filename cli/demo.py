"""`shmcache demo`: the main job end to end (dev/demo.py runs it)."""

from __future__ import annotations

from shmcache.formats import registry as wire_formats

HELP = "the main job end to end: Kafka broker, supervisor, load generator, reader"


def add_arguments(dm) -> None:
    dm.add_argument("--entries", type=int, help="entries to produce (default 2,000,000; 20,000 with --cluster)")
    dm.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    dm.add_argument("--partitions", type=int, default=8, help="partitions of the demo topic (default 8)")
    dm.add_argument("--format", choices=wire_formats.SPARK, default="v1", help="wire format (default v1)")
    dm.add_argument("--bootstrap", help="use this Kafka broker instead of starting the project's local one")
    dm.add_argument("--memory", default="auto", help="cache size (default: enough that nothing is evicted)")
    dm.add_argument("--sample", type=int, default=100_000, help="sent keys the reader checks (default 100,000)")
    dm.add_argument("--delete-share", type=float, default=0.1, help="share of DELETEs (default 0.1)")
    dm.add_argument("--seed", type=int, help="random seed of the generated entries")
    dm.add_argument("--name", help="cache name (default: demo-<random>)")
    dm.add_argument("--keep", action="store_true", help="leave the cache in /dev/shm afterwards")
    dm.add_argument("--cluster", action="store_true", help="on a Spark cluster of 2 machines on this host, each "
                    "with its own /dev/shm and replica (root; spark/cluster_demo.py)")
    dm.add_argument("--cluster-dir", help="with --cluster: keep the run directory here (logs, lookup output)")
    dm.add_argument("--json", action="store_true", help="with --cluster: a JSON report on the last line")


def run(a) -> int:
    if a.cluster:
        from shmcache.spark import cluster_demo

        return cluster_demo.command(a)
    from shmcache.dev import demo

    return demo.run(entries=a.entries or 2_000_000, workers=a.workers, partitions=a.partitions, fmt=a.format,
                    bootstrap=a.bootstrap, memory=a.memory, sample=a.sample, delete_share=a.delete_share,
                    seed=a.seed, name=a.name, keep=a.keep)

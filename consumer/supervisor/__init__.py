"""The supervisor (`shmcache run`'s process): this machine's only member of the consumer
group, the policy over its worker processes and the segment's control area.

    policy.py          Supervisor and run(): membership, rebalances, commits, restarts, its loop
    startup.py         the cache opened or created, a dead supervisor's orphans, the broker and topic
    rebalance.py       its rebalance callbacks: which worker takes a partition, from where; a revoke's drain
    start_offsets.py   where an assignment's partitions start, asked in one look-up with one bound
    topic_id.py        the topic's Kafka id against the table's (a re-created topic starts over)
    watermarks.py      its own look at the high watermarks of partitions no live worker publishes
    group.py           who else is in the consumer group
    commits.py         when and how it commits: asynchronous and bounded
    worker_handle.py   its handle on one worker process (states, stale kill, requests), backoff.py
    stop.py            the stop: drain, final commit, a last snapshot, within one budget
    snapshot_policy.py restore at start, snapshots while running, retention gaps
    snapshot_dir.py    the snapshot directory: its files, their order, its checks, its descriptor
    metrics.py         the Prometheus metrics, and http_endpoint.py, which serves them and /ready

A folder because the supervisor is one process with these parts, each a concept of its
own; it starts the workers (consumer/worker/) and is the only one that does.
"""

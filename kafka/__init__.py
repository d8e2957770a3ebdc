"""The Kafka plumbing that both directions share (the load generator and Spark's publish
write topics, `shmcache run` reads them): how every client is made and kept quiet
(client.py), topic administration and end offsets (topics.py), a look at the broker never
waited for (admin_poll.py) and whether the broker answers (broker.py). A layer under
consumer/ and produce/: what to fetch or produce, and when, is theirs; no module here
decides anything about a cache but the broker's state it is told to publish."""

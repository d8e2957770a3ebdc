"""What the publisher asks the broker before Spark runs a task (spark/publish.py
topic_partitions): a broker that is not there is one error naming it and the wait, raised
within that wait, with none of librdkafka's connect errors on the terminal (it printed ~20
a second, then a KafkaException out of `shmcache spark publish`)."""

import os
import socket
import subprocess
import sys

from shmcache.errors import BrokerUnavailableError

CHILD = """
import sys
from shmcache.spark.publish import topic_partitions
from shmcache.errors import BrokerUnavailableError
try:
    topic_partitions(sys.argv[1], "t-nowhere", timeout=2)
except BrokerUnavailableError as e:
    print(e)
"""


def test_publish_without_a_broker_says_so_once():
    assert issubclass(BrokerUnavailableError, ConnectionError)
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        bootstrap = f"127.0.0.1:{s.getsockname()[1]}"
    # a process of its own: what reaches its stderr is what a user's terminal would show
    p = subprocess.run([sys.executable, "-c", CHILD, bootstrap], capture_output=True, text=True, timeout=60,
                       env=os.environ)
    assert p.returncode == 0 and p.stderr == "", p.stderr[-3000:]
    assert f"no Kafka broker answered at {bootstrap} within 2 s" in p.stdout, p.stdout

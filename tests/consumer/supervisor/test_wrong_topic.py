"""A mistyped --topic changes nothing in an existing cache (issue 39 item 4): open_cache
reset the partitions' applied offsets as soon as the topic differed from the cache's,
before the topic was known to exist; the next, correct run replayed the topic from its
log start (and, where retention had moved it, flagged a gap and was never ready although
the table held everything). Now the topic is the cache's only once it exists, and an
existing topic that is not the cache's is refused while the cache holds the other's
progress. A cache filled from a topic; a run with a topic that does not exist; one with
a topic that exists but is another; then the right one, which fetches only what is new."""

import subprocess
import sys

from shmtest.supervisors import harness  # noqa: F401
from shmtest.topic_model import Model, check_table, produce_and_wait
from shmtest.waits import applied, poll_until, wait_applied

import shmcache
from shmcache.engine.control import layout as C

PARTS = 3


def _run(name: str, bootstrap: str, topic: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "shmcache", "run", "--name", name, "--bootstrap", bootstrap,
                           "--topic", topic, "--memory", "64MiB", "--broker-wait", "60"],
                          capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL)


def _state(name: str) -> tuple:
    """What a run must not change: the topic, its id, the partitions' applied offsets, the table."""
    with shmcache.attach(name) as r:
        c = r.control
        return (c.topic, c.topic_id, c.partitions[:, C.P_APPLIED].tolist(), r.stats()["entries"], r.creation_id)


def test_a_wrong_topic_changes_nothing_and_the_right_one_resumes(harness, kafka_topic):
    h = harness
    topic, other = kafka_topic(PARTS), kafka_topic(1)
    model = Model("v1", PARTS, seed=23)
    name, group = h.cache_name("wrongtopic"), h.group("wrongtopic")
    first = produce_and_wait(h, topic, model, PARTS, rate=200.0, max_batches=30)
    sup = h.supervisor(name, topic, group, memory="64MiB")
    r = h.attach(name, sup=sup)
    wait_applied(r, first, 120, sup)
    assert sup.terminate() == 0, sup.log_text()[-3000:]
    before = _state(name)
    assert before[0] == topic and before[2][:PARTS] == first

    typo = topic + "x"  # does not exist
    run = _run(name, h.bootstrap, typo)
    last = run.stderr.strip().splitlines()[-1]
    assert run.returncode == 2 and f"topic {typo!r} does not exist" in last and "Traceback" not in run.stderr, \
        run.stderr[-3000:]
    assert _state(name) == before

    run = _run(name, h.bootstrap, other)  # exists, but the cache holds the first topic's entries
    last = run.stderr.strip().splitlines()[-1]
    assert run.returncode == 2 and f"holds entries of topic {topic!r}" in last and f"topic {other!r}" in last, \
        run.stderr[-3000:]
    assert _state(name) == before

    ends = produce_and_wait(h, topic, model, PARTS, rate=200.0, max_batches=20)
    sup = h.supervisor(name, topic, group, memory="64MiB")
    r = h.attach(name, sup=sup)
    poll_until(lambda: sup.check_running() and r.status()["ready"], 120,
               lambda: f"ready: {r.status()}\n{sup.log_text()[-3000:]}")
    wait_applied(r, ends, 120, sup)
    st = r.status()
    assert st["gap_partitions"] == [] and applied(r, PARTS) == ends
    assert sum(w["messages"] for w in st["workers"]) == sum(ends) - sum(first)  # only what came since
    check_table(r, model.snapshot())
    assert sup.terminate() == 0

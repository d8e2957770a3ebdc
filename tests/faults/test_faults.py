"""The fault suite at smoke size (issue 10; the full size is `scripts/faults`).

One run (module fixture): a broker of its own, `shmcache run` as a real process, a v1 stream
with deletes, overwrites and malformed messages, a reader process checking every value, and
the faults below at seeded moments. Correctness is asserted; recovery times are printed only.
SHMCACHE_FAULTS_ALL=1 injects every fault kind once (slower: about 3 minutes) and runs the
late-orphan case (below).

Also here: the checker itself catches lost, extra, wrong, torn, foreign and never-written
values (without a broker), and the supervisor faults this suite found: readiness claimed from a
dead supervisor's rows, orphaned workers dying on a traceback, and a late orphan writing stale
values after the new workers took its partitions.
"""

import os

import numpy as np
import pytest

from shmtest.faults import cli as _cli
from shmtest.faults import harness as _harness
from shmtest.faults import stream as _stream

SMOKE = {"worker_kill_catchup": 1, "sup_kill": 1, "broker_kill": 1}
ALL = {"worker_kill": 1, "worker_kill_catchup": 1, "sup_term": 1, "sup_kill": 1, "broker_term": 1,
       "broker_kill": 1, "broker_outage": 1, "member_join": 1}


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    faults = ALL if os.environ.get("SHMCACHE_FAULTS_ALL") else SMOKE
    cfg = _harness.Config(entries=12_000, minutes=0.4, format="v1", seed=10, partitions=4, workers=2,
                          malformed=4, lookups_per_s=30_000, session_timeout=6.0, faults=faults, skip_after_end=False,
                          workdir=str(tmp_path_factory.mktemp("faults")), verbose=False)
    res = _harness.Run(cfg).run()
    print("\n" + _cli.table(res))
    return res


def test_fault_suite_smoke(smoke):
    assert not smoke["failures"], _cli.table(smoke)
    kinds = [f["kind"] for f in smoke["faults"]]
    want = _harness.Run.expand(smoke["config"]["faults"])
    assert sorted(kinds) == sorted(want), kinds
    assert all(f["recovery"] is not None for f in smoke["faults"])
    c = smoke["counts"]
    assert c["read hits"] > 0 and c["expected present"] > 0
    assert c["malformed sent"] == smoke["config"]["malformed"] == c["malformed logged at their offsets"]


def test_restarted_supervisor_never_claims_inherited_readiness(smoke):
    assert smoke["false_ready"]["sup_kill"] == 0, f"{smoke['false_ready']['sup_kill']} samples ready without an assignment"


def test_orphaned_workers_exit_without_a_traceback(smoke):
    assert smoke["counts"]["EOFError tracebacks"] == 0


@pytest.mark.skipif(os.geteuid() != 0, reason="a pod (unshare --pid --mount) needs root")
def test_the_supervisor_in_a_pod_of_its_own(tmp_path):
    """The smoke run with each supervisor pid 1 of a PID namespace of its own, as a DaemonSet's
    pod, and the reader checking every value in this one: a worker killed while it catches
    up, and the whole pod SIGKILLed (its workers die with it) and started again. No value
    lost or wrong, and no false ready: a reader here never calls the cache ready while the
    pod's supervisor is dead or not yet assigned."""
    cfg = _harness.Config(entries=8_000, minutes=0.3, format="v1", seed=12, partitions=4, workers=2,
                          malformed=2, lookups_per_s=20_000, session_timeout=6.0,
                          faults={"worker_kill_catchup": 1, "sup_kill": 1}, skip_after_end=False, pod=True,
                          workdir=str(tmp_path / "run"), verbose=False)
    res = _harness.Run(cfg).run()
    print("\n" + _cli.table(res))
    assert not res["failures"], _cli.table(res)
    assert sorted(f["kind"] for f in res["faults"]) == ["sup_kill", "worker_kill_catchup"]
    assert all(f["recovery"] is not None for f in res["faults"])
    assert res["false_ready"]["sup_kill"] == 0 and res["counts"]["read hits"] > 0


@pytest.mark.skipif(not os.environ.get("SHMCACHE_FAULTS_ALL"), reason="about 2 minutes; SHMCACHE_FAULTS_ALL=1 runs it")
def test_a_late_orphan_writes_nothing(tmp_path):
    """Two supervisor SIGKILLs while the workers apply a burst; the old workers are stopped until
    the new ones applied past them, then go on. The table must still equal the model: a new
    supervisor stops a dead one's workers before it hands their partitions out again."""
    cfg = _harness.Config(entries=20_000, minutes=2.0, format="v1", seed=11, partitions=4, workers=2,
                          malformed=2, lookups_per_s=20_000, session_timeout=6.0, faults={"sup_kill": 2},
                          late_orphans=True, burst_share=0.2, workdir=str(tmp_path / "run"), verbose=False)
    res = _harness.Run(cfg).run()
    print("\n" + _cli.table(res))
    assert not res["failures"], _cli.table(res)


def test_checker_catches_lost_extra_wrong_torn_foreign_and_unwritten_values(tmp_path):
    """The end-of-run comparison and the reader's check, on a cache we damage on purpose."""
    import shmcache

    plan = _stream.make_plan("v1", 4, 3000, seed=5, batch_size=50, malformed=2)
    nmsg = len(plan.batch_part)
    msgs = [np.arange(plan.batch_start[b], plan.batch_start[b + 1]) for b in range(nmsg)]
    part = np.maximum(plan.batch_part.astype(np.int64), 0)
    off = np.arange(nmsg)  # any increasing offsets per partition keep the send order
    kept = {b: len(msgs[b]) - 1 for b in np.flatnonzero(plan.batch_bad).tolist()}  # v1: before the damage
    present, seq = _stream.model(plan, msgs, part, off, kept)
    assert present.sum() > 100 and (~present).sum() > 100
    keys = np.flatnonzero(present)
    name = f"t-faults-check-{os.getpid()}"
    w = shmcache.create(name, "64MiB")
    try:
        vo, vd = _stream.make_values(plan.ids[keys], seq[keys].astype(np.uint64))
        w.set_many(plan.keys[keys], [vd[vo[i]:vo[i + 1]].tobytes() for i in range(len(keys))])
        with shmcache.attach(name) as r:
            assert _harness.compare(r, plan, present, seq, plan.entries)[:4] == (0, 0, 0, 0)
            lost, extra = keys[0], np.flatnonzero(~present)[0]
            older = next(k for k in keys[10:] if (plan.entry_key[:seq[k]] == k).any()
                         and plan.entry_action[np.flatnonzero(plan.entry_key[:seq[k]] == k)[-1]] == _stream.ADD)
            old_seq = np.flatnonzero(plan.entry_key[:seq[older]] == older)[-1]
            torn, foreign, unwritten = keys[5], keys[6], keys[7]

            def value(k, s):
                o, d = _stream.make_values(plan.ids[[k]], np.array([s], np.uint64))
                return d.tobytes()

            w.delete(plan.keys[lost].tobytes())
            w.set(plan.keys[extra].tobytes(), value(extra, np.flatnonzero(plan.entry_key == extra)[0]))
            w.set(plan.keys[older].tobytes(), value(older, old_seq))
            t = bytearray(value(torn, seq[torn]))
            t[-1] ^= 1
            w.set(plan.keys[torn].tobytes(), bytes(t))
            w.set(plan.keys[foreign].tobytes(), value(keys[8], seq[keys[8]]))
            w.set(plan.keys[unwritten].tobytes(), value(unwritten, seq[unwritten]))
            lost_n, extra_n, wrong_n, bad_n, problem = _harness.compare(r, plan, present, seq, plan.entries)
            assert (lost_n, extra_n) == (1, 1)
            assert bad_n == 2 and wrong_n == 3, (wrong_n, bad_n, problem)  # older + torn + foreign
            # a value whose seq was not yet sent when it was read was never written
            assert _harness.compare(r, plan, present, seq, int(seq[unwritten]))[3] >= 3
    finally:
        w.close()
        shmcache.destroy(name)

"""`shmcache demo --cluster`: the growth story on a real Spark cluster of 2 machines on this host.

1. A Kafka broker (the project's local one, or --bootstrap), a fresh topic, and
   Parquet txmeta rows (datagen) in the run directory.
2. `scripts/cluster start` (spark/cluster.py): a Spark master and 2 workers, each
   worker a "machine" m1, m2 with its own /dev/shm, each with its own `shmcache run`
   (group shmcache-m1-<name>, shmcache-m2-<name>); waits for both /ready.
3. Publish the rows through Spark on the cluster (publish.publish, Kafka sink); both
   replicas apply every message (each machine's `shmcache status`, against the
   topic's end offsets).
4. `lookup` on the cluster with the JVM engine (the shmcache jar, sent to the
   executors on spark.jars by session()), when the jar is built, else the Python
   engine; each row tagged with the machine that looked it up; written to
   <dir>/lookup-<step> and compared with the source. Each machine's readers'
   companion counts that machine's rows as hits (`shmcache stats` on each machine
   before and after): each executor read its own replica. The Python engine's rows
   over the same keys are written beside them (<dir>/lookup-<step>-python) and
   compared.
   One task per machine: the machine tag is a barrier `mapInArrow` (2 tasks on 2
   single-core executors, launched together). Barrier is a property of the stage,
   so the JVM lookup in the same stage (shuffle read, the lookup's and the decoding's
   projections, tag: no exchange between them) runs one task per machine too. It cannot go: Spark has no
   other per-executor placement (every machine here is host 127.0.0.1, and
   preferred locations name hosts), and without it a task failing on m2 is retried
   on any executor (spark.task.maxFailures), so the lookup job of step 6 could
   succeed by reading m1's replica for m2's rows; a barrier stage is retried whole,
   one task per machine each attempt, so it fails every time.
5. The audit's kernel (audit.audit_batches) over the whole source on each machine:
   every hash a hit on both replicas.
6. m2's replica is stopped and destroyed: a probe on each machine shows m1's tasks
   succeed and m2's fail naming the cache and m2; the lookup job itself fails
   with that error, with either engine (the JVM reader's error names the machine
   as the Python one's does: $SHMCACHE_MACHINE, which the workers pass on to their
   executors).
7. m2's `shmcache run` starts again, rebuilds the replica from Kafka; the lookup
   and the per-machine audit pass again.

Prints each step, and with --json one line of JSON at the end (the report the
cluster test checks). Stops everything it started by pid (the cluster, the broker)
and deletes the topic, whatever happens; --cluster-dir keeps the run directory.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
import uuid
from functools import partial
from pathlib import Path

from shmcache.spark import cluster as cl

APPLY_TIMEOUT_S = 180.0
MACHINE_COL = "machine"


def _tag_machine(batches):
    """mapInArrow: each batch with the machine that ran it appended."""
    import pyarrow as pa

    from shmcache.ipc.machine import machine

    for b in batches:
        yield pa.RecordBatch.from_arrays(list(b.columns) + [pa.array([machine()] * b.num_rows, pa.string())],
                                         names=list(b.schema.names) + [MACHINE_COL])


def _probe(_, *, cache: str, src: str):
    """A barrier task: this machine's lookup and audit of every source hash, or its error."""
    import socket

    import pyarrow as pa
    import pyarrow.parquet as pq

    from shmcache.ipc.machine import machine
    from shmcache.spark import audit

    out = {"machine": machine(), "host": socket.gethostname(), "pid": os.getpid(), "error": None, "counts": None}
    try:
        t = pq.read_table(src)
        t = t.append_column(audit.EXPECT, pa.array([True] * t.num_rows))
        counts = dict.fromkeys(audit.STATUSES, 0)
        for r in audit.audit_batches(t.to_batches(max_chunksize=4096), cache=cache, key_col="tx_hash", samples=0):
            for s, n in zip(r.column("status").to_pylist(), r.column("n").to_pylist()):
                counts[s] += n
        out["counts"] = counts
    except Exception as e:  # noqa: BLE001 - the probe reports each machine's outcome
        out["error"] = f"{type(e).__name__}: {e}"
    yield json.dumps(out)


class ClusterDemo:
    def __init__(self, *, rows: int, partitions: int, bootstrap: str | None, run_dir: str | None, say):
        self.rows, self.partitions, self.bootstrap, self.say = rows, partitions, bootstrap, say
        tag = uuid.uuid4().hex[:8]
        self.name, self.topic = f"cluster-{tag}", f"shmcache-cluster-{tag}"
        self.keep = run_dir is not None
        self.dir = Path(run_dir or tempfile.mkdtemp(prefix="shmcache-cluster-")).resolve()
        self.dir.mkdir(parents=True, exist_ok=True)
        self.src = self.dir / "src"
        self.broker = None
        self.cluster: cl.Cluster | None = None
        self.spark = None
        self.engine = "python"
        self.report: dict = {"name": self.name, "topic": self.topic, "dir": str(self.dir), "rows": rows}

    # -- steps -----------------------------------------------------------------------------

    def setup(self) -> None:
        from shmcache.kafka import topics
        from shmcache.dev.local_kafka import LocalBroker
        from shmcache.spark import datagen

        if not self.bootstrap:
            self.broker = LocalBroker(self.dir / "kafka")
            self.broker.start(capture_stderr=False)
            self.bootstrap = self.broker.bootstrap
            self.say(f"Kafka broker pid {self.broker.pid} on {self.bootstrap}")
        topics.create_topic(self.bootstrap, self.topic, self.partitions)
        datagen.write(self.src, self.rows, seed=7, rows_per_file=max(1, self.rows // 2))
        t = time.monotonic()
        self.cluster = cl.start(self.dir / "cluster", workers=2, memory="768m", shm="256m", run={
            "name": self.name, "bootstrap": self.bootstrap, "topic": self.topic, "memory": "64MiB",
            "workers": 1, "format": "v1"})
        self.report["machines"] = self.cluster.machines
        self.say(f"cluster up in {time.monotonic() - t:.1f} s: master {self.cluster.master_url}, machines "
                 + ", ".join(f"{m} (worker pid {v['worker']['pid']}, shmcache run pid {v['run']['pid']})"
                             for m, v in self.cluster.state["machines"].items()) + "; both replicas /ready")

    def session(self) -> None:
        from shmcache.spark import session
        from shmcache.spark._session import jvm_jar

        cl.driver_env()
        self.spark = session("shmcache-cluster-demo", master=self.cluster.master_url, kafka=True,
                             conf=cl.spark_conf(self.cluster))
        # session() put the jar on spark.jars (the executors fetch it from the driver) when it is built
        self.engine = "jvm" if jvm_jar(required=False) else "python"
        self.report["engine"] = self.engine
        self.report["app_id"] = self.spark.sparkContext.applicationId
        self.say(f"lookup engine: {self.engine}")

    def publish(self) -> None:
        from shmcache.spark import publish

        rep = publish.publish(self.spark, str(self.src), self.bootstrap, self.topic, partitions=self.partitions)
        self.report["publish"] = rep.to_dict()
        self.say(f"published {rep.adds:,} rows through Spark in {rep.messages} messages ({rep.seconds:.1f} s)")
        self.wait_applied(self.cluster.machines)

    def wait_applied(self, machines) -> None:
        from confluent_kafka import Consumer, TopicPartition

        c = Consumer({"bootstrap.servers": self.bootstrap, "group.id": "probe-" + self.topic})
        try:
            ends = [c.get_watermark_offsets(TopicPartition(self.topic, p), timeout=10)[1]
                    for p in range(self.partitions)]
        finally:
            c.close()

        def behind(m):
            got = self.cluster.applied(m)
            if got is None:
                return f"{m}: its supervisor's /metrics does not answer"
            late = [i for i in range(self.partitions) if got.get(i, -1) < ends[i]]
            return f"{m}: partitions {late} behind {ends}" if late else None

        cl.wait_for(lambda: not any(behind(m) for m in machines), APPLY_TIMEOUT_S,
                    lambda: "; ".join(filter(None, (behind(m) for m in machines))))
        self.say(f"{', '.join(machines)}: every message applied (end offsets {ends})")

    def _lookup_job(self, engine: str, decode: str | None = "txmeta"):
        """The lookup of every source hash with `engine`, each row tagged with its machine in a
        barrier stage (one task per machine; the module docstring says why barrier)."""
        from pyspark.sql.types import StringType, StructField, StructType

        from shmcache.spark import lookup

        keys = self.spark.read.parquet(str(self.src)).select("tx_hash").repartition(len(self.cluster.machines))
        out = lookup(keys, cache=self.name, decode=decode, engine=engine)
        return out.mapInArrow(_tag_machine, StructType(list(out.schema.fields)
                                                       + [StructField(MACHINE_COL, StringType())]), barrier=True)

    def reader_hits(self) -> dict[str, int]:
        """Each machine's readers' companion hits (`shmcache stats` there)."""
        hits = {}
        for m in self.cluster.machines:
            p = self.cluster.shmcache(m, "stats", "--json", self.name)
            if p.returncode != 0:
                raise RuntimeError(f"shmcache stats on {m}: {p.stderr.strip()}")
            hits[m] = json.loads(p.stdout)["reader_hits"]
        return hits

    def lookup(self, step: str) -> None:
        import pyarrow.compute as pc
        import pyarrow.parquet as pq

        before = self.reader_hits()
        path = self.dir / f"lookup-{step}"
        self._lookup_job(self.engine).write.mode("overwrite").parquet(str(path))  # the one Spark job of this step
        after = self.reader_hits()
        t = pq.read_table(path)  # checked here, on the driver: the output is small
        vc = pc.value_counts(t.column(MACHINE_COL))
        by = dict(zip(vc.field("values").to_pylist(), vc.field("counts").to_pylist()))
        found = int(pc.sum(t.column("found")).as_py() or 0)
        equal = self._equal_to_source(path)
        hits = {m: after[m] - before[m] for m in self.cluster.machines}
        rep = {"path": str(path), "engine": self.engine, "rows_by_machine": by, "found": found, "equal": equal,
               "reader_hits": hits}
        self.say(f"lookup ({step}, {self.engine} engine): rows by machine {by}, {found:,} found, equal to the "
                 f"source: {equal}; hits counted in each machine's replica {hits}")
        if self.engine != "python":  # the same keys through the Python engine: the same rows
            py = self.dir / f"lookup-{step}-python"
            self._lookup_job("python").write.mode("overwrite").parquet(str(py))
            rep["python_path"] = str(py)
            rep["engines_equal"] = self._same_rows(path, py)
            self.say(f"lookup ({step}, python engine): the same rows as the {self.engine} engine's: "
                     f"{rep['engines_equal']}")
        self.report[f"lookup_{step}"] = rep

    @staticmethod
    def _same_rows(a, b) -> bool:
        import pyarrow.parquet as pq

        x, y = (pq.read_table(p).drop_columns([MACHINE_COL]).sort_by("tx_hash") for p in (a, b))
        # column by column: the JVM engine's `found` is a non-nullable column, the Python one's nullable
        return x.column_names == y.column_names and all(x.column(c).equals(y.column(c)) for c in x.column_names)

    def _equal_to_source(self, path) -> bool:
        import pyarrow.parquet as pq

        from shmcache.formats import txmeta

        src = pq.read_table(self.src).sort_by("tx_hash")
        got = pq.read_table(path).sort_by("tx_hash")
        cols = ["tx_hash"] + [c for c, _ in txmeta.arrow_fields()]
        return got.num_rows == src.num_rows and all(got.column(c).equals(src.column(c)) for c in cols)

    def probe(self, step: str) -> list[dict]:
        n = len(self.cluster.machines)
        fn = partial(_probe, cache=self.name, src=str(self.src))
        rdd = self.spark.sparkContext.parallelize(range(n), n).barrier().mapPartitions(fn)
        res = sorted((json.loads(x) for x in rdd.collect()), key=lambda r: r["machine"])
        self.report[f"probe_{step}"] = res
        for r in res:
            self.say(f"  {r['machine']}: " + (f"audit {r['counts']}" if r["error"] is None else r["error"][:200]))
        return res

    def break_one(self, machine: str = "m2") -> None:
        self.cluster.stop_run(machine)
        p = self.cluster.shmcache(machine, "destroy", self.name)
        if p.returncode != 0:
            raise RuntimeError(f"destroy on {machine}: {p.stderr.strip()}")
        self.say(f"{machine}: shmcache run stopped, replica {self.name!r} destroyed")
        self.probe("broken")
        errors = {}
        for engine in dict.fromkeys((self.engine, "python")):
            try:
                self._lookup_job(engine, decode=None).write.format("noop").mode("overwrite").save()
                err = None
            except Exception as e:  # noqa: BLE001 - Spark's wrapper; the text is what matters
                err = str(e)
            line = next((ln.strip() for ln in (err or "").splitlines() if "not found on host" in ln), err)
            errors[engine] = line
            self.say(f"lookup job ({engine} engine) with {machine}'s replica gone: "
                     + (f"failed: {line}" if err else "did not fail"))
        self.report["job_broken_errors"] = errors
        self.report["job_broken_error"] = errors[self.engine]

    def rebuild(self, machine: str = "m2") -> None:
        t = time.monotonic()
        self.cluster.start_run(machine)
        self.cluster.wait_ready([machine])
        self.wait_applied([machine])
        self.report["rebuild_seconds"] = time.monotonic() - t
        self.say(f"{machine}: replica rebuilt from Kafka in {time.monotonic() - t:.1f} s")

    def cleanup(self) -> None:
        if self.spark is not None:
            self.spark.stop()
        if self.cluster is not None:
            left = self.cluster.stop()
            self.report["leftover_processes"] = left
        if self.bootstrap and self.topic:
            try:
                from shmcache.kafka import topics

                topics.delete_topic(self.bootstrap, self.topic)
            except Exception:  # noqa: BLE001 - a broker going away takes its topics along
                pass
        if self.broker is not None:
            self.broker.stop()
        if not self.keep:
            shutil.rmtree(self.dir, ignore_errors=True)

    def run(self) -> int:
        try:
            self.setup()
            self.session()
            self.publish()
            self.lookup("first")
            self.probe("first")
            self.break_one()
            self.rebuild()
            self.lookup("rebuilt")
            self.probe("rebuilt")
        except Exception as e:  # noqa: BLE001 - reported after the cleanup
            self.report["error"] = f"{type(e).__name__}: {e}"
        except KeyboardInterrupt:
            self.report["error"] = "interrupted"
        finally:
            self.cleanup()
        self.report["passed"] = self.passed()
        return 0 if self.report["passed"] else 1

    def passed(self) -> bool:
        """Every check held; the ones that did not are named in the report's "failed"."""
        r = self.report
        failed = self.report["failed"] = [] if not r.get("error") else ["error"]
        ms = r.get("machines", [])
        for s in ("first", "rebuilt"):
            look = r.get(f"lookup_{s}", {})
            if not look.get("equal"):
                failed.append(f"lookup_{s}: the lookup's rows differ from the source's")
            elif set(look["rows_by_machine"]) != set(ms):
                failed.append(f"lookup_{s}: rows from machines {sorted(look['rows_by_machine'])}, not {ms}")
            elif look["reader_hits"] != look["rows_by_machine"]:
                failed.append(f"lookup_{s}: reader hits {look['reader_hits']} against rows {look['rows_by_machine']}")
            elif not look.get("engines_equal", True):
                failed.append(f"lookup_{s}: the JVM and Python engines' rows differ")
            probes = r.get(f"probe_{s}", [])
            if len(probes) != len(ms):
                failed.append(f"probe_{s}: {len(probes)} machines answered of {len(ms)}")
            failed += [f"probe_{s}: {p['machine']}: {p['error'] or p['counts']}" for p in probes
                       if p["error"] is not None or p["counts"]["hit"] != self.rows]
        broken = {p["machine"]: p for p in r.get("probe_broken", [])}
        if broken.get("m1", {}).get("error") is not None:
            failed.append(f"probe_broken: m1 failed: {broken['m1']['error']}")
        if "m2" not in (broken.get("m2", {}).get("error") or ""):
            failed.append(f"probe_broken: m2's probe did not fail naming m2: {broken.get('m2')}")
        failed += [f"job_broken: the {engine} engine's job did not fail naming m2: {e}"
                   for engine, e in r.get("job_broken_errors", {None: None}).items()
                   if f"cache {self.name!r} not found on host 'm2'" not in (e or "")]
        return not failed


def command(a) -> int:
    """`shmcache demo --cluster` (cli.py): rows from --entries (default 20,000 here)."""
    rows = a.entries or 20_000
    say = (lambda s: print(s, file=sys.stderr, flush=True)) if a.json else (lambda s: print(s, flush=True))
    demo = ClusterDemo(rows=rows, partitions=a.partitions, bootstrap=a.bootstrap, run_dir=a.cluster_dir, say=say)
    rc = demo.run()
    if a.json:
        print(json.dumps(demo.report))
    else:
        print(("demo --cluster passed" if rc == 0 else "demo --cluster FAILED: "
               + (demo.report.get("error") or "; ".join(demo.report["failed"]))))
    return rc

"""What an operator deploys (deploy/): the TOML config example, the systemd unit, GET /ready
beside /metrics, and the Grafana dashboard, each against a real `shmcache run`.

- `shmcache run --config deploy/shmcache.toml` with flags on top (the flags win) runs a
  supervisor whose /ready is 200 once the replica holds the whole topic, 503 with the
  reason while a second member of its group holds partitions (the hardest case: a live
  supervisor, caught up, but not whole), and 200 again when that member leaves;
- every metric the dashboard queries is exported by that running supervisor;
- /ready without a supervisor, or without the cache, is 503 naming why;
- the machine identity names the default group and instance id, the env var and the
  option override the host name;
- the systemd unit passes `systemd-analyze verify` (where systemd is installed).
"""

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import urllib.error
import urllib.request
import uuid

import pytest
from prometheus_client.parser import text_string_to_metric_families

import shmcache
from shmcache.consumer.config import RunConfig
from shmcache.dev.local_kafka import free_ports
from shmcache.consumer.supervisor.metrics import MetricsServer

from shmtest.supervisors import REPO, harness  # noqa: F401
from shmtest.waits import poll_until

DEPLOY = REPO / "deploy"
PARTITIONS = 4


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def dashboard_metrics() -> set[str]:
    d = json.loads((DEPLOY / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for p in d["panels"] for t in p["targets"]]
    exprs += [v["query"] for v in d["templating"]["list"] if v["type"] == "query"]
    return set(re.findall(r"\b(shmcache_[a-z_]+)\b", " ".join(exprs)))


def test_config_file_ready_endpoint_and_dashboard(harness, kafka_topic):
    topic = kafka_topic(PARTITIONS)
    name, other = harness.cache_name("deploy"), harness.cache_name("deploy-b")
    group = harness.group("deploy")
    port, port_b = free_ports(2)
    # the example config, with the flags the harness gives (name, bootstrap, topic, group, memory, ...) winning
    sup = harness.supervisor(name, topic, group, memory="64MiB",
                             args=("--config", str(DEPLOY / "shmcache.toml"), "--metrics-port", str(port),
                                   "--reader-group", ""))  # the example's shmcache-readers is not this machine's
    r = harness.attach(name, sup=sup)
    assert r.status()["topic"] == topic  # the flag, not the file's "txmeta"
    code, why = poll_until(lambda: (lambda c: c if c[0] == 200 else None)(get(port, "/ready")), 60,
                           lambda: f"/ready to be 200: {get(port, '/ready')}")
    assert why.strip() == f"cache {name!r} ready" and r.status()["ready"]

    # the dashboard's every metric is exported by this running supervisor (a reader looked up once)
    with shmcache.attach(name) as reader:
        reader.get(b"\x01" * 32)
    code, text = get(port, "/metrics")
    assert code == 200
    exported = {s.name for fam in text_string_to_metric_families(text) for s in fam.samples}
    wanted = dashboard_metrics()
    assert len(wanted) >= 12 and wanted <= exported, sorted(wanted - exported)

    # a second member in the same group takes partitions: live, caught up, but not whole -> 503 with the reason
    # (once the rebalance settles: while it runs, the reason is "an assignment is being published")
    sup_b = harness.supervisor(other, topic, group, memory="64MiB", args=("--metrics-port", str(port_b)))
    code, why = poll_until(lambda: (lambda c: c if c[0] == 503 and "not assigned to this cache" in c[1] else None)(
                           get(port, "/ready")), 120, lambda: f"/ready to turn 503, not assigned: {get(port, '/ready')}")
    assert why.startswith(f"cache {name!r} not ready") and "not assigned to this cache" in why, why
    assert not r.status()["ready"]
    assert sup_b.terminate() == 0
    poll_until(lambda: get(port, "/ready")[0] == 200, 120, lambda: f"/ready back to 200: {get(port, '/ready')}")
    assert sup.terminate() == 0


def test_ready_without_supervisor_or_cache():
    name = f"t-ready-{uuid.uuid4().hex[:10]}"
    srv = MetricsServer(name, 0)
    try:
        code, why = get(srv.port, "/ready")
        assert (code, why.strip()) == (503, f"cache {name!r} does not exist")
        shmcache.create(name, memory="40MiB").close()
        code, why = get(srv.port, "/ready")
        assert code == 503 and why.startswith(f"cache {name!r} not ready") and "no live supervisor" in why, why
        assert get(srv.port, "/metrics")[0] == 200
    finally:
        srv.close()
        try:
            shmcache.destroy(name)
        except FileNotFoundError:
            pass


def test_machine_identity_names_group_and_instance(monkeypatch):
    monkeypatch.delenv("SHMCACHE_MACHINE", raising=False)
    host = socket.gethostname()
    assert RunConfig(name="tx", bootstrap="b:1", topic="t").group == f"shmcache-{host}-tx"
    monkeypatch.setenv("SHMCACHE_MACHINE", "m7")
    c = RunConfig(name="tx", bootstrap="b:1", topic="t")
    assert (c.machine, c.group, c.instance_id) == ("m7", "shmcache-m7-tx", "shmcache-m7-tx")
    assert c.group_settings()["client.id"] == "shmcache-tx@m7"
    c = RunConfig.from_toml(str(DEPLOY / "shmcache.toml"), machine="m9", name="tx2")
    assert (c.group, c.instance_id, c.name, c.metrics_port) == ("shmcache-m9-tx2", "shmcache-m9-tx2", "tx2", 9464)
    assert c.accept_gaps is False  # commented out in the example: a gap keeps the cache not ready


def test_accept_gaps_takes_a_boolean_only(tmp_path):
    """`accept_gaps = "no"` in a TOML file would be truthy: refused by name instead."""
    f = tmp_path / "gaps.toml"
    f.write_text('name = "tx"\nbootstrap = "b:1"\ntopic = "t"\naccept_gaps = "no"\n')
    with pytest.raises(ValueError, match="accept_gaps='no': expected true or false"):
        RunConfig.from_toml(str(f))
    f.write_text('name = "tx"\nbootstrap = "b:1"\ntopic = "t"\naccept_gaps = true\n')
    assert RunConfig.from_toml(str(f)).accept_gaps is True


@pytest.mark.parametrize("line, said", [
    ('workers = "two"', "workers='two': expected a whole number"),
    ("workers = true", "workers=True: expected a whole number"),  # a bool is an int to Python: 1 worker
    ('commit_interval = "1s"', "commit_interval='1s': expected a number"),
    ("snapshot_rate = 1.5", "snapshot_rate=1.5: expected a whole number or a size"),
    ("kafka = 3", "kafka=3: expected a table"),
    ("topic = 7", "topic=7: expected a string"),
])
def test_a_setting_of_the_wrong_type_is_refused_by_name(tmp_path, line, said):
    """A TOML file can give any setting any type: each is refused naming the setting and
    what it takes (a number where a string belongs was a TypeError deep in validate()), and
    `shmcache run` says so in one line, exit 2, before it makes a cache."""
    f = tmp_path / "typed.toml"
    base = {"name": '"typed"', "bootstrap": '"127.0.0.1:1"', "topic": '"t"'}
    key = line.split(" =")[0]
    f.write_text("".join(f"{k} = {v}\n" for k, v in base.items() if k != key) + line + "\n")
    with pytest.raises(ValueError, match=re.escape(said)):
        RunConfig.from_toml(str(f))
    if key == "workers" and line.endswith('"two"'):
        p = subprocess.run([sys.executable, "-m", "shmcache", "run", "--config", str(f)], cwd=REPO,
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 2 and p.stderr.strip() == f"shmcache: {said}", p.stderr[-3000:]
        assert not shmcache.exists("typed")


def test_a_file_that_is_not_toml_is_named(tmp_path):
    f = tmp_path / "broken.toml"
    f.write_text('name = "tx\n')
    with pytest.raises(ValueError, match=re.escape(f"{f}: not valid TOML: ")):
        RunConfig.from_toml(str(f))


def test_a_librdkafka_setting_it_refuses_is_one_line_and_no_cache(tmp_path):
    """`--set foo=bar` (no such librdkafka property) or a value it cannot take: one line naming
    librdkafka's words, exit 2, and the cache this run made is removed (it was a traceback)."""
    name = f"t-kafka-set-{uuid.uuid4().hex[:8]}"
    for setting, said in (("foo=bar", 'No such configuration property: "foo"'),
                          ("fetch.max.bytes=lots", 'Invalid value for configuration property "fetch.max.bytes"')):
        p = subprocess.run([sys.executable, "-m", "shmcache", "run", "--name", name, "--bootstrap", "127.0.0.1:1",
                            "--topic", "t", "--memory", "64MiB", "--set", setting], cwd=REPO,
                           capture_output=True, text=True, timeout=120)
        last = p.stderr.strip().splitlines()[-1]
        assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr[-3000:]
        assert last == f"shmcache: cache {name!r}: a librdkafka setting was refused: {said}", p.stderr[-3000:]
        assert not shmcache.exists(name)
        # what the log says agrees: removed, not "stays in /dev/shm for readers" (it said both)
        assert f"removed cache {name!r}" in p.stderr and "the cache stays" not in p.stderr, p.stderr[-3000:]


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_systemd_unit_verifies(tmp_path):
    exe = shutil.which("shmcache", path=os.path.dirname(sys.executable))
    assert exe, "the shmcache entry point next to this Python"
    text = (DEPLOY / "shmcache@.service").read_text()
    assert "ExecStart=/opt/shmcache/.venv/bin/shmcache run --config /etc/shmcache/%i.toml" in text
    unit = tmp_path / "shmcache@.service"
    unit.write_text(text.replace("/opt/shmcache/.venv/bin/shmcache", exe))
    p = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60)
    complaints = [ln for ln in (p.stdout + p.stderr).splitlines() if "shmcache@" in ln]
    assert p.returncode == 0 and not complaints, p.stdout + p.stderr


def test_the_config_is_installed_readable_by_the_daemon_only():
    """The config may hold a SASL password ([kafka] "sasl.password"): every install line of
    it says 0640 and the daemon's group, never 0644 (issue 39 item 11)."""
    docs = REPO / "docs" / "deploy.md"
    for path in (docs, DEPLOY / "shmcache@.service"):
        lines = [ln for ln in path.read_text().splitlines() if "install" in ln and "shmcache.toml" in ln]
        assert lines and all("-m 640 -g shmcache" in ln for ln in lines), (path, lines)
    assert "0644 would give to every" in docs.read_text()

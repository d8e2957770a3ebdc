"""The deployment kit (issue 52): deploy/kubernetes/ (a DaemonSet, a reader's Deployment,
the config they share), deploy/compose.yaml, deploy/container/Dockerfile. There is no
cluster and no Docker engine here, so what can be held without them is:

- the manifests parse, every one is applied (kustomization.yaml), and they say what
  docs/deploy.md says: the hostPath /dev/shm, /ready as the readiness probe on the metrics
  port, the node's name as the machine, no hostIPC or hostPID anywhere, non-root users, the
  cache's owner named by its readers, the readers' group in every pod's supplementalGroups
  and in the config, the memory limit = the cache's memory + the daemon's headroom, a grace
  period longer than the supervisor's stop budget; compose.yaml the same;
- the exact commands their containers run, run as those containers would run them: each
  as pid 1 of a pod of its own (shmtest/pods.py: PID and mount namespaces), as the manifest's uid,
  gid and supplementalGroups, sharing the machine's /dev/shm, on the real broker. The
  reader's init container, started before the daemon, waits and exits 0 once the cache is
  ready; the DaemonSet's readiness probe is 503, then 200; compose's healthcheck exits 0; a
  user outside the readers' group is refused; the kubelet's stop (SIGTERM to pid 1) ends
  the daemon with exit 0 within the grace period and leaves the cache for the next pod;
- the memory limit: the daemon's pod in a memory cgroup limited to the headroom the
  manifest gives over the cache's memory (plus that memory), catching up on 200,000
  entries: it becomes ready, is never OOM-killed, and the cache's pages are charged there.
Needs root (namespaces, other uids, cgroups)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest
import yaml

import shmcache

from shmtest.pods import Pod, available, pod
from shmtest.supervisors import REPO, harness  # noqa: F401  (fixture)
from shmtest.waits import poll_until
from shmcache.consumer.config import RunConfig
from shmcache.dev.local_kafka import free_ports
from shmcache.engine.units import parse_bytes
from shmcache.ipc import memlimit

pytestmark = pytest.mark.skipif(available() is not None, reason=str(available()))

KIT = REPO / "deploy" / "kubernetes"
COMPOSE = REPO / "deploy" / "compose.yaml"
HEADROOM = 512 * 2**20  # the daemon's own memory over the cache's, in every limit the kit sets
NODE = "node-1"  # the node's name, as the downward API gives it


def _manifests() -> dict[str, dict]:
    """kind -> the one object of that kind in deploy/kubernetes/."""
    out = {}
    for f in sorted(KIT.glob("*.yaml")):
        for doc in yaml.safe_load_all(f.read_text()):
            assert doc["kind"] not in out, f"two {doc['kind']}s"
            out[doc["kind"]] = doc
    return out


def _quantity(q: str) -> int:
    """A Kubernetes or Docker memory quantity ('8704Mi', '8704m') in bytes."""
    m = re.fullmatch(r"(\d+)(Ki|Mi|Gi|k|m|g)?", str(q))
    assert m, f"not a memory quantity: {q!r}"
    return int(m.group(1)) * {None: 1, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "k": 2**10, "m": 2**20,
                              "g": 2**30}[m.group(2)]


@pytest.fixture(scope="module")
def kit():
    objs = _manifests()
    kustom = objs.pop("Kustomization")
    config_map, = kustom["configMapGenerator"]
    toml_file, = config_map["files"]
    return {"objs": objs, "kustomization": kustom, "config_map": config_map["name"],
            "toml": tomllib.loads((KIT / toml_file).read_text()), "toml_path": KIT / toml_file,
            "compose": yaml.safe_load(COMPOSE.read_text())}


def _pod_spec(obj: dict) -> dict:
    return obj["spec"]["template"]["spec"]


def _mounts(container: dict, spec: dict) -> dict[str, dict]:
    """mountPath -> the volume mounted there."""
    vols = {v["name"]: v for v in spec["volumes"]}
    return {m["mountPath"]: vols[m["name"]] for m in container.get("volumeMounts", [])}


def test_the_manifests_say_what_the_docs_say(kit):
    objs, cfg = kit["objs"], kit["toml"]
    applied = {f for f in kit["kustomization"]["resources"]}
    assert applied == {f.name for f in KIT.glob("*.yaml")} - {"kustomization.yaml"}, "a manifest is not applied"
    RunConfig.from_toml(str(kit["toml_path"]), machine=NODE)  # the daemon's own check of the config
    gid = int(cfg["reader_group"])
    assert cfg["mode"] == "0640"

    ds = objs["DaemonSet"]
    spec = _pod_spec(ds)
    daemon, = spec["containers"]
    sec = spec["securityContext"]
    owner = sec["runAsUser"]
    assert owner > 0 and sec["runAsNonRoot"] and gid in sec["supplementalGroups"]
    for s in (spec, _pod_spec(objs["Deployment"])):
        assert not any(s.get(k) for k in ("hostIPC", "hostPID", "hostNetwork", "shareProcessNamespace")), s
    mounts = _mounts(daemon, spec)
    assert mounts["/dev/shm"]["hostPath"] == {"path": "/dev/shm", "type": "Directory"}
    conf_dir = next(p for p, v in mounts.items() if v.get("configMap", {}).get("name") == kit["config_map"])
    assert daemon["command"] == ["shmcache", "run", "--config", f"{conf_dir}/{kit['toml_path'].name}",
                                 "--metrics-host", "$(POD_IP)"]
    env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in daemon["env"]}
    assert env == {"SHMCACHE_MACHINE": "spec.nodeName", "POD_IP": "status.podIP"}
    port, = daemon["ports"]
    assert port["containerPort"] == cfg["metrics_port"]
    assert daemon["readinessProbe"]["httpGet"] == {"path": "/ready", "port": port["name"]}
    assert "livenessProbe" not in daemon  # a cache catching up is 503, and no reason to restart it
    res = daemon["resources"]
    limit = _quantity(res["limits"]["memory"])
    assert _quantity(res["requests"]["memory"]) == limit == parse_bytes(cfg["memory"]) + HEADROOM
    assert spec["terminationGracePeriodSeconds"] > RunConfig.__dataclass_fields__["stop_timeout"].default
    if daemon["securityContext"]["readOnlyRootFilesystem"]:
        assert "emptyDir" in mounts["/tmp"], "the compiled kernels need a writable /tmp"

    rspec = _pod_spec(objs["Deployment"])
    rsec = rspec["securityContext"]
    assert rsec["runAsNonRoot"] and rsec["runAsUser"] not in (0, owner) and gid in rsec["supplementalGroups"]
    init, = rspec["initContainers"]
    assert init["command"] == ["shmcache", "wait-ready", "--owner", str(owner), cfg["name"]]
    for c in (init, *rspec["containers"]):
        assert _mounts(c, rspec)["/dev/shm"]["hostPath"]["path"] == "/dev/shm", c["name"]

    # compose.yaml: the same daemon, on the host's network (so no --metrics-host), the same limits
    services = kit["compose"]["services"]
    d = services["shmcache"]
    assert d["command"] == daemon["command"][:4]
    assert d["user"] == f"{owner}:{sec['runAsGroup']}" and d["group_add"] == [str(gid)]
    assert "/dev/shm:/dev/shm" in d["volumes"]
    assert f"./kubernetes/{kit['toml_path'].name}:{conf_dir}/{kit['toml_path'].name}:ro" in d["volumes"]
    assert _quantity(d["mem_limit"]) == limit
    assert int(d["stop_grace_period"].rstrip("s")) == spec["terminationGracePeriodSeconds"]
    assert d["healthcheck"]["test"][:4] == ["CMD", "shmcache", "wait-ready", "--owner"]
    assert d["healthcheck"]["test"][4] == str(owner) and d["healthcheck"]["test"][-1] == cfg["name"]
    reader = next(s for n, s in services.items() if n != "shmcache")
    assert reader["depends_on"] == {"shmcache": {"condition": "service_healthy"}}
    assert "/dev/shm:/dev/shm" in reader["volumes"] and reader["group_add"] == [str(gid)]
    assert not any(s.get(k) for s in services.values() for k in ("ipc", "pid"))

    # docs/deploy.md names the kit's files and the figures the manifests hold
    doc = (REPO / "docs" / "deploy.md").read_text()
    for f in ("deploy/kubernetes/shmcache-daemonset.yaml", "deploy/kubernetes/reader-deployment.yaml",
              "deploy/kubernetes/shmcache.toml", "deploy/compose.yaml", "deploy/container/Dockerfile"):
        assert f"`{f}`" in doc, f
    for fact in (f"uid {owner}", f"gid {gid}", "memory + 512Mi", "hostIPC", "hostPID", "supplementalGroups"):
        assert fact in doc, fact


def _ready(port: int) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except OSError as e:  # not listening yet
        return 0, str(e)


def _argv(command: list[str], env: dict[str, str]) -> list[str]:
    """A container's command as the kubelet runs it: $(VAR) expanded from its env; the
    image's `shmcache` is this interpreter's."""
    argv = [re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], a) for a in command]
    assert argv[0] == "shmcache"
    return [sys.executable, "-m", "shmcache", *argv[1:]]


@pytest.fixture
def etc():
    """A folder for the daemon's config that the pods' users may enter; removed after."""
    d = Path(tempfile.mkdtemp(prefix="shmcache-kit-"))
    d.chmod(0o711)
    yield d
    shutil.rmtree(d)


def _configured(kit, etc: Path, name: str, topic: str, bootstrap: str, port: int, memory: str) -> Path:
    """The kit's config with what an operator sets for their cluster (the broker, the topic)
    and what this machine needs (a cache name and port of the test's own, a small cache)."""
    text = kit["toml_path"].read_text()
    for key, value in (("name", name), ("bootstrap", bootstrap), ("topic", topic), ("memory", memory)):
        text, n = re.subn(rf'(?m)^{key} = "[^"]*"', f'{key} = "{value}"', text)
        assert n == 1, key
    text, n = re.subn(r"(?m)^metrics_port = \d+", f"metrics_port = {port}", text)
    assert n == 1
    # where the ConfigMap's file is: root's, group fsGroup, defaultMode 0440, in a folder others may
    # enter (pytest's tmp_path is root's alone)
    path = etc / kit["toml_path"].name
    path.write_text(text)
    spec = _pod_spec(kit["objs"]["DaemonSet"])
    os.chown(path, 0, spec["securityContext"]["fsGroup"])
    path.chmod(next(v["configMap"]["defaultMode"] for v in spec["volumes"] if "configMap" in v))
    return path


def test_the_containers_commands_run_in_pods(kit, harness, kafka_topic, etc, tmp_path):  # noqa: F811
    objs, cfg = kit["objs"], kit["toml"]
    spec, rspec = _pod_spec(objs["DaemonSet"]), _pod_spec(objs["Deployment"])
    daemon, = spec["containers"]
    init, = rspec["initContainers"]
    sec, rsec = spec["securityContext"], rspec["securityContext"]
    as_daemon = dict(uid=sec["runAsUser"], gid=sec["runAsGroup"], groups=tuple(sec["supplementalGroups"]))
    as_reader = dict(uid=rsec["runAsUser"], gid=rsec["runAsGroup"], groups=tuple(rsec["supplementalGroups"]))
    topic = kafka_topic(4)
    produce(harness.bootstrap, topic, 20_000)
    name = harness.cache_name("kit")
    port, = free_ports(1)
    conf = _configured(kit, etc, name, topic, harness.bootstrap, port, "64MiB")
    env = {"SHMCACHE_MACHINE": f"{NODE}-{uuid.uuid4().hex[:6]}", "POD_IP": "127.0.0.1"}

    def exact(command: list[str]) -> list[str]:
        argv = _argv(command, env)
        return [str(conf) if a == daemon["command"][3] else (name if a == cfg["name"] else a) for a in argv]

    # the reader's init container first: the node's daemon has not even made the cache yet
    waiting = Pod(exact(init["command"]), log=tmp_path / "init.log", **as_reader)
    sup = Pod(exact(daemon["command"]), log=tmp_path / "daemon.log", env=env, **as_daemon)
    try:
        probe = daemon["readinessProbe"]["httpGet"]
        assert probe["path"] == "/ready"
        code, why = poll_until(lambda: (lambda c: c if c[0] == 200 or not sup.running() else None)(_ready(port)), 240,
                               lambda: f"/ready to be 200 ({_ready(port)}); the daemon's log: "
                                       f"{(tmp_path / 'daemon.log').read_text()[-2000:]}")
        assert sup.running() and why.strip() == f"cache {name!r} ready", (tmp_path / "daemon.log").read_text()[-3000:]
        assert waiting.proc.wait(120) == 0, (tmp_path / "init.log").read_text()[-2000:]
        st = os.stat(f"/dev/shm/{name}")
        assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (sec["runAsUser"], int(cfg["reader_group"]), 0o640)

        # compose's healthcheck, as the daemon's user in a container of its own
        check = kit["compose"]["services"]["shmcache"]["healthcheck"]["test"][1:]
        p = subprocess.run(pod(exact(check), **as_daemon), capture_output=True, text=True, timeout=120)
        assert p.returncode == 0 and json.loads(p.stdout)["ready"], p.stderr
        # a user outside the readers' group: refused by name, not served
        p = subprocess.run(pod(exact(init["command"]), uid=rsec["runAsUser"], gid=rsec["runAsGroup"]),
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 2 and "permission" in p.stderr.lower(), p.stderr

        # the kubelet stops the daemon's pod: SIGTERM to pid 1, exit 0 within the grace period
        assert sup.stop(spec["terminationGracePeriodSeconds"]) == 0, (tmp_path / "daemon.log").read_text()[-3000:]
        assert os.path.exists(f"/dev/shm/{name}"), "the cache is left for the readers and the next pod"
        p = subprocess.run(pod(exact(init["command"][:-1] + ["--timeout", "0.5", cfg["name"]]), **as_reader),
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 1 and "no live supervisor" in p.stderr, p.stderr
    finally:
        for p in (waiting, sup):
            p.kill()


def produce(bootstrap: str, topic: str, count: int) -> None:
    p = subprocess.run([sys.executable, "-m", "shmcache", "produce", "--bootstrap", bootstrap, "--topic", topic,
                        "--count", str(count), "--seed", "52"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr


def _memory_cgroup(limit: int) -> Path | None:
    levels = memlimit._levels()
    if not levels:
        return None
    d = Path(levels[0][0]) / f"shmcache-kit-{uuid.uuid4().hex[:8]}"
    try:
        d.mkdir()
        (d / levels[0][1]).write_text(str(limit))
    except OSError:
        if d.exists():
            d.rmdir()
        return None
    return d


def _stat(cgroup: Path) -> dict[str, int]:
    return {k: int(v) for k, v in (ln.split() for ln in (cgroup / "memory.stat").read_text().splitlines())}


def test_the_daemon_fits_the_manifests_memory_limit(kit, harness, kafka_topic, etc, tmp_path):  # noqa: F811
    """The headroom the manifests give the daemon over its cache, held on a real cgroup limit
    (v1 or v2, whichever this machine's memory controller is) while it catches up."""
    objs, cfg = kit["objs"], kit["toml"]
    spec = _pod_spec(objs["DaemonSet"])
    daemon, = spec["containers"]
    sec = spec["securityContext"]
    memory = 64 * 2**20
    headroom = _quantity(daemon["resources"]["limits"]["memory"]) - parse_bytes(cfg["memory"])
    cgroup = _memory_cgroup(memory + headroom)
    if cgroup is None:
        pytest.skip("no memory cgroup can be made here")
    topic = kafka_topic(4)
    produce(harness.bootstrap, topic, 200_000)  # a backlog: every worker's fetch queue full
    name = harness.cache_name("kit-mem")
    port, = free_ports(1)
    conf = _configured(kit, etc, name, topic, harness.bootstrap, port, "64MiB")
    env = {"SHMCACHE_MACHINE": f"{NODE}-{uuid.uuid4().hex[:6]}", "POD_IP": "127.0.0.1"}
    argv = [str(conf) if a == daemon["command"][3] else a for a in _argv(daemon["command"], env)]
    sup = Pod(argv, log=tmp_path / "daemon.log", env=env, cgroup=cgroup, uid=sec["runAsUser"],
              gid=sec["runAsGroup"], groups=tuple(sec["supplementalGroups"]))
    try:
        poll_until(lambda: _ready(port)[0] == 200 or not sup.running(), 300, "/ready to be 200")
        assert sup.running(), f"the daemon exited: {(tmp_path / 'daemon.log').read_text()[-3000:]}"
        stat = _stat(cgroup)
        assert stat["shmem"] >= memory, f"the cache's pages are charged to the daemon's cgroup: {stat}"
        with shmcache.attach(name) as r:  # no process of the daemon's was killed on the way (an OOM kill)
            st = r.status()
        assert st["ready"] and [w["starts"] for w in st["workers"]] == [1] * len(st["workers"]), st["workers"]
        peak = next((cgroup / f).read_text() for f in ("memory.max_usage_in_bytes", "memory.peak")
                    if (cgroup / f).exists())
        print(f"the daemon's cgroup: limit {memory + headroom:,}, peak {int(peak):,}, shmem {stat['shmem']:,}, "
              f"rss {stat.get('rss', stat.get('anon', 0)):,}")
        assert sup.stop(spec["terminationGracePeriodSeconds"]) == 0
    finally:
        sup.kill()
        cgroup.rmdir()

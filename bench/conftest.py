"""bench/: make bench/'s helpers (_summary.py, _summary.py) importable (pytest runs with --import-mode=importlib),
lend bench/test_consume.py the Kafka broker fixtures of tests/conftest.py,
and print the summary tables at the end of the run."""

import importlib.util
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import _summary  # noqa: E402


def _load_kafka_fixtures():
    """tests/conftest.py as a module of its own (its fixtures are not visible
    from bench/). Re-exported here, its session-scoped `kafka_broker` is a broker of
    this directory's own, started on first use and stopped by pid at the end."""
    name = "_shmcache_bench_kafka_fixtures"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, HERE.parent / "tests" / "conftest.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return sys.modules[name]


kafka_fixtures = _load_kafka_fixtures()
kafka_broker = kafka_fixtures.kafka_broker
kafka_admin = kafka_fixtures.kafka_admin
kafka_topic = kafka_fixtures.kafka_topic


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if _summary.RESULTS:
        terminalreporter.section("shmcache benchmark summary")
        terminalreporter.write(_summary.render_summary())
        if _summary.RESULTS.get(("_meta", "_meta"), {}).get("enabled"):
            path = _summary.save_json(Path(config.rootpath) / ".benchmarks")  # git-ignored
            terminalreporter.write_line(f"results written to {path}")
    for title, render, save in _summary.SUMMARIES:  # other benchmark modules (test_consume.py)
        text = render()
        if not text:
            continue
        terminalreporter.section(title)
        terminalreporter.write(text)
        path = save(Path(config.rootpath) / ".benchmarks")
        if path is not None:
            terminalreporter.write_line(f"results written to {path}")

"""bench/: the Kafka broker fixtures the tests have (shmtest.fixtures), and the summary
tables printed at the end of the run (shmtest.bench.summary)."""

from pathlib import Path

from shmtest.bench import summary as _summary
# the session's Kafka broker and its topics, as the tests have them (shmtest/fixtures.py)
from shmtest.fixtures import kafka_admin, kafka_broker, kafka_topic  # noqa: F401


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

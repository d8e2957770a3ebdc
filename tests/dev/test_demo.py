"""The README's first command, `scripts/demo`, at a small size, twice in a row, as CI
runs it (no terminal): it exits 0, says every check held, reports what the summary
promises, and leaves nothing behind (no process it started, no segment, no broker,
no temporary directory)."""

import re

from shmtest.demo_run import assert_nothing_left, demo_tmp_dirs, run_demo

ENTRIES = 20_000


def test_readme_demo_twice_in_a_row(tmp_path):
    names = []
    for _ in range(2):
        run = run_demo(["--entries", str(ENTRIES)], timeout=900, tmpdir=tmp_path)
        assert run.code == 0, run.out
        out = run.out
        assert "demo passed" in out and "FAILED" not in out
        assert re.search(r"Kafka broker pid \d+ on 127\.0\.0\.1:\d+", out)
        assert re.search(r"supervisor pid \d+ with 2 workers \(pids \d+, \d+\)", out)
        assert "8 partitions assigned, ready" in out
        assert f"produced {ENTRIES:,} entries" in out
        assert "exit code 0, final commit at the end of every partition" in out
        entries = run.row("table entries")
        got, want = re.fullmatch(r"([\d,]+) \(expected ([\d,]+)\)", entries).groups()
        assert got == want
        assert run.row("hit rate (present)").startswith("100.00%")
        present, deleted = map(lambda s: int(s.replace(",", "")),
                               re.search(r"\(([\d,]+) present, ([\d,]+) deleted\)", run.row("sampled hashes")).groups())
        assert present > 0 and deleted > 0
        assert run.row("deleted that missed") == f"{deleted:,} of {deleted:,}"
        assert run.row("evictions") == "0" and run.row("malformed messages") == "0"
        assert float(run.row("lookups").split()[0].replace(",", "")) > 0
        assert "\x1b[" not in out  # no terminal, no control codes
        assert_nothing_left(run)
        names.append(run.cache())
    assert names[0] != names[1]
    assert not demo_tmp_dirs(tmp_path)  # its temporary directories (broker data, logs) are gone

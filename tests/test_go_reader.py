"""The Go reader (go/, issues 41, 45 and 46) in the suite: gofmt, go vet, a CGO_ENABLED=0
build of its module and of its bench and metrics modules (go/bench, go/metrics), its tests (the golden segments and
golden control areas, byte flips, a truncated file, a real Python writer under Go readers,
readiness against the Python reader's, a followed name, the owner and mode checks, the
shmcache-go commands, the examples; the goldens again without prefetching), the writer and
following tests again under the race detector, a smoke-size run of the benchmarks, and
the module as a consumer sees it: `go mod tidy` of a program that imports the reader adds
only what a reader needs.
Skipped, saying so, where `go` is not installed."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from shmtest.toolchains import GO, GO_DIR
from shmtest.toolchains import go as _go

BENCH_DIR = GO_DIR / "bench"
METRICS_DIR = GO_DIR / "metrics"  # its own module: the Prometheus client stays out of the reader's
pytestmark = pytest.mark.skipif(GO is None, reason="go is not installed: the Go reader (go/) is not built or tested")


def test_gofmt_vet_and_a_pure_go_build():
    fmt = subprocess.run([str(Path(GO).with_name("gofmt")), "-l", "."], cwd=GO_DIR, capture_output=True, text=True)
    assert fmt.returncode == 0 and fmt.stdout == "", f"not gofmt'ed: {fmt.stdout}{fmt.stderr}"
    for d in (GO_DIR, BENCH_DIR, METRICS_DIR):  # modules of their own, left out of go/'s ./...
        _go("vet", "./...", cwd=d)
        _go("build", "./...", cwd=d)


def test_a_consumer_gets_only_what_a_reader_needs(tmp_path):
    """`go mod tidy` of a program importing the reader and go/txmeta (a replace to this
    checkout, as a Teranode service would have) adds xxhash and x/sys and nothing else
    (fastcache and snappy are the bench module's), and keeps the program's `go` line: the
    reader's own names no patch version."""
    gomod = (GO_DIR / "go.mod").read_text()
    directive = re.search(r"^go (\S+)$", gomod, re.M).group(1)
    assert re.fullmatch(r"\d+\.\d+", directive), f"go/go.mod says go {directive}: a patch version"
    (tmp_path / "go.mod").write_text(f"module example.com/consumer\n\ngo {directive}\n\n"
                                     "require github.com/shmcache/shmcache/go v0.0.0\n\n"
                                     f"replace github.com/shmcache/shmcache/go => {GO_DIR}\n")
    (tmp_path / "main.go").write_text('package main\n\nimport (\n\tshmcache "github.com/shmcache/shmcache/go"\n'
                                      '\t"github.com/shmcache/shmcache/go/txmeta"\n)\n\n'
                                      'func main() { _, _ = shmcache.Attach("txmeta"); _ = txmeta.BatchSize }\n')
    # offline, from the module cache scripts/setup filled (`go mod download` checked each module
    # against go/go.sum): no checksum database to ask, which a fresh machine's cache has not seen
    _go("mod", "tidy", cwd=tmp_path, env={"GOPROXY": "off", "GOFLAGS": "-mod=mod", "GOSUMDB": "off"})
    required = {line.split()[0] for line in (tmp_path / "go.sum").read_text().splitlines()}
    assert required == {"github.com/cespare/xxhash/v2", "golang.org/x/sys"}, required
    assert re.search(rf"^go {re.escape(directive)}$", (tmp_path / "go.mod").read_text(), re.M), \
        (tmp_path / "go.mod").read_text()


def test_go_tests():
    _go("test", "-count=1", "./...")


def test_go_metrics_tests():
    """go/metrics: Teranode's gauges against the cache's stats, the supervisor's figures
    against the Python reader's status of the same control area."""
    _go("test", "-count=1", "./...", cwd=METRICS_DIR)


def test_go_tests_without_prefetch():
    """The path of platforms without a prefetch instruction (touching lines), on the goldens."""
    _go("test", "-count=1", "-tags", "shmcache_noprefetch", "-run", "Golden|ByteFlip|Truncated", ".")


def test_go_benchmark_smoke():
    """go/bench/bench_test.go at a smoke size (SHMCACHE_BENCH_N, 20,000 unless set): it runs
    and GetMany allocates nothing per batch. Full size: see its docstring."""
    n = os.environ.get("SHMCACHE_BENCH_N", "20000")
    out = _go("test", "-run", "^$", "-bench", ".", "-benchmem", "-benchtime", "20x", "-cpu", "1", ".",
              env={"SHMCACHE_BENCH_N": n}, cwd=BENCH_DIR)
    rows = [line.split() for line in out.splitlines() if line.startswith("BenchmarkGetMany")]
    assert len(rows) == 2, out
    assert all(r[r.index("allocs/op") - 1] == "0" for r in rows), out


@pytest.mark.skipif(shutil.which("gcc") is None and shutil.which("cc") is None,
                    reason="no C compiler: go test -race needs cgo")
def test_python_writer_under_go_readers_with_the_race_detector():
    _go("test", "-count=1", "-race", "-run", "PythonWriter|Reattach|Follow|CompanionCutShort", ".", cgo=True)


def _build_blocks(page: Path) -> list[list[str]]:
    """The indented code blocks of a docs page that build a Go command, each as its lines."""
    blocks, block = [], []
    for line in page.read_text().splitlines() + [""]:
        if line.startswith("    "):
            block.append(line[4:])
        elif block:
            blocks += [block] if any(ln.startswith("go build") for ln in block) else []
            block = []
    return blocks


@pytest.mark.parametrize("page", ["go.md", "teranode.md"])
def test_the_docs_build_commands_work_as_written_from_the_repositorys_root(tmp_path, page):
    """Each page's build lines (`cd go`, `go build ...`), run from the root of a copy of the
    repository's go/ as the page says, build the command; the binary answers --help."""
    blocks = _build_blocks(GO_DIR.parent / "docs" / page)
    assert blocks, f"docs/{page} shows no `go build`"
    shutil.copytree(GO_DIR, tmp_path / "go", ignore=shutil.ignore_patterns("testdata", "bench"))
    for block in blocks:
        steps = [ln for ln in block if ln.startswith(("cd ", "go build"))]
        script = " && ".join(steps)
        env = {**os.environ, "CGO_ENABLED": "0", "GOPROXY": "off"}  # the module cache scripts/setup filled
        p = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, f"docs/{page}: `{script}` failed from the root:\n{p.stdout}\n{p.stderr}"
        built = [ln.split()[ln.split().index("-o") + 1] for ln in steps if ln.startswith("go build")]
        where = tmp_path / "go" if "cd go" in steps else tmp_path
        for binary in built:
            h = subprocess.run([str(where / binary), "--help"], capture_output=True, text=True, timeout=30)
            assert h.returncode == 0 and "usage" in (h.stdout + h.stderr).lower(), (page, binary, h)

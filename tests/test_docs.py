"""The documentation is tested as code: `mkdocs build --strict` (a link, a page of the
nav or an API reference that does not resolve fails it), and every Python example of
the README and of docs/ runs, each in a process of its own, as a reader would paste it.

An example that must not run says so in its fence (```python notest); every other
```python fence is run, so a README sentence with code cannot rot."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
FENCE = re.compile(r"^```python([^\n]*)\n(.*?)^```", re.S | re.M)


def _examples():
    for page in PAGES:
        text = page.read_text()
        for m in FENCE.finditer(text):
            if "notest" in m.group(1).split():
                continue
            line = text.count("\n", 0, m.start()) + 1
            yield pytest.param(m.group(2), id=f"{page.relative_to(REPO)}:{line}")


def test_the_site_builds_strict(tmp_path):
    mkdocs = Path(sys.executable).with_name("mkdocs")
    out = subprocess.run([str(mkdocs), "build", "--strict", "--site-dir", str(tmp_path / "site")],
                         cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, (out.stdout + out.stderr)[-5000:]
    assert (tmp_path / "site" / "index.html").exists()


@pytest.mark.parametrize("code", list(_examples()))
def test_example_runs(code, tmp_path):
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, f"the example failed:\n{code}\n--- output ---\n{(out.stdout + out.stderr)[-5000:]}"


FILE_REF = re.compile(r"`((?:[a-z_]+/)+[A-Za-z0-9_.-]+\.(?:py|md|go|java|toml|json|yml|service))`")


def test_every_file_the_docs_name_exists():
    """A file of the repo named in backticks (`engine/layout.py`, `deploy/shmcache.toml`) in the
    README, docs/ or bench/README.md is there: a module that moves takes its mentions along."""
    named = {(page.relative_to(REPO), ref) for page in [*PAGES, REPO / "bench" / "README.md"]
             for ref in FILE_REF.findall(page.read_text())}
    assert len(named) > 50  # the pattern finds the mentions at all
    missing = sorted(f"{page}: {ref}" for page, ref in named if not (REPO / ref).exists())
    assert not missing, missing

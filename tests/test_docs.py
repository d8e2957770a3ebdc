"""The documentation is tested as code: `mkdocs build --strict` (a link, a page of the
nav or an API reference that does not resolve fails it), every Python example of
the README and of docs/ runs, each in a process of its own, as a reader would paste it,
and every file of the repo that the docs (or the code's own docstrings) name is there.

An example that must not run says so in its fence (```python notest); every other
```python fence is run, so a README sentence with code cannot rot."""

import os
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


@pytest.mark.slow  # a build: mkdocs renders every page and the API reference (~40 s)
def test_the_site_builds_strict(tmp_path):
    mkdocs = Path(sys.executable).with_name("mkdocs")
    out = subprocess.run([str(mkdocs), "build", "--strict", "--site-dir", str(tmp_path / "site")],
                         cwd=REPO, capture_output=True, text=True, timeout=900)  # a hang guard: ~40 s of CPU, minutes on a loaded host
    assert out.returncode == 0, (out.stdout + out.stderr)[-5000:]
    assert (tmp_path / "site" / "index.html").exists()


@pytest.mark.parametrize("code", list(_examples()))
def test_example_runs(code, tmp_path):
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, f"the example failed:\n{code}\n--- output ---\n{(out.stdout + out.stderr)[-5000:]}"


FILE_REF = re.compile(r"`((?:[a-z_]+/)+[A-Za-z0-9_.-]+\.(?:py|md|go|java|toml|json|yml|service))`")
BARE_REF = re.compile(r"`(_?[a-z][a-z0-9_]*\.py)`")  # a module named by its file alone: `reader.py`
# a repo path in the code's docstrings and comments (engine/_lookup.py, deploy/shmcache.toml),
# not part of a longer path or an installed one (/usr/..., shmcache/...)
CODE_REF = re.compile(r"(?<![\w/.$~-])((?:[a-z_][a-z0-9_]*/)+[A-Za-z0-9_.@-]+\.(?:py|md|go|java|toml|json|yml|service|sh))\b")
NOT_SOURCES = {".git", ".venv", "build", ".cache", "__pycache__", ".hypothesis", ".benchmarks", "target", "golden"}


def _repo_files(suffix: str):
    """Every file of the repo with this suffix, outside what is built, fetched or cached."""
    for top, dirs, files in os.walk(REPO):
        dirs[:] = [d for d in dirs if d not in NOT_SOURCES]
        yield from (Path(top) / f for f in files if f.endswith(suffix))


def test_every_file_the_docs_name_exists():
    """A file of the repo named in backticks (`engine/layout.py`, `deploy/shmcache.toml`) in the
    README, docs/ or bench/README.md is there: a module that moves takes its mentions along."""
    named = {(page.relative_to(REPO), ref) for page in [*PAGES, REPO / "bench" / "README.md"]
             for ref in FILE_REF.findall(page.read_text())}
    assert len(named) > 50  # the pattern finds the mentions at all
    missing = sorted(f"{page}: {ref}" for page, ref in named if not (REPO / ref).exists())
    assert not missing, missing


def test_every_module_the_docs_name_by_its_file_exists():
    """A module named by its file alone (`reader.py`, `_lookup.py`) in the README, docs/ or
    bench/README.md is a file of the repo: a bare name is not caught by the check above, and
    a module that was merged away or renamed leaves such names behind."""
    files = {p.name for p in _repo_files(".py")}
    named = {(page.relative_to(REPO), ref) for page in [*PAGES, REPO / "bench" / "README.md"]
             for ref in BARE_REF.findall(page.read_text())}
    assert len(named) > 20  # the pattern finds the mentions at all
    missing = sorted(f"{page}: {ref}" for page, ref in named if ref not in files)
    assert not missing, missing


def test_every_file_the_code_names_exists():
    """A repo path named in the package's modules, the tests or the benchmarks (a docstring's
    or a comment's `engine/_lookup.py`) is there: a module that moves takes its mentions along
    in the code too. Paths of other repositories (whose first folder is none of this one's)
    are not checked."""
    tops = {p.name for p in REPO.iterdir() if p.is_dir() and p.name not in NOT_SOURCES}
    named = {(f.relative_to(REPO), ref) for f in _repo_files(".py")
             if f.relative_to(REPO).parts[0] not in ("go", "jvm")
             for ref in CODE_REF.findall(f.read_text()) if ref.split("/")[0] in tops}
    assert len(named) > 200  # the pattern finds the mentions at all
    missing = sorted(f"{f}: {ref}" for f, ref in named if not (REPO / ref).exists())
    assert not missing, missing


LONGEST_BLOCK = 15  # lines: past this a paragraph is a wall; steps, a table or sections read better
LIST_ITEM = re.compile(r"^\s*(?:[-*+]|\d+[.)])\s")


def _blocks(text: str):
    """(line, length, first line) of each paragraph and each list item of a Markdown page.
    Code blocks, tables and headings are not paragraphs; a list item runs from its marker
    to the next item, a blank line or the end of its paragraph."""
    start, size, first, fenced = 0, 0, "", False
    for n, line in enumerate([*text.splitlines(), ""], 1):
        s = line.strip()
        if s.startswith(("```", "~~~")):
            fenced = not fenced
        if fenced or not s or s.startswith(("```", "~~~", "|", "#")) or LIST_ITEM.match(line):
            if size:
                yield start, size, first
            size = 0
            if fenced or not s or s.startswith(("```", "~~~", "|", "#")):
                continue
        if not size:
            start, first = n, s
        size += 1


def _walls():
    return {(str(page.relative_to(REPO)), line, size, first) for page in PAGES
            for line, size, first in _blocks(page.read_text()) if size > LONGEST_BLOCK}


def test_no_paragraph_is_a_wall():
    """No paragraph or list item of the README or docs/ runs over LONGEST_BLOCK lines: a
    long one is broken into steps, a table or sections of its own."""
    walls = sorted(f"{page}:{line}: {size} lines" for page, line, size, _ in _walls())
    assert not walls, walls


def test_the_wall_check_sees_walls():
    """The paragraph parser counts what a reader sees: a 16-line paragraph and a 16-line list
    item are walls; code, tables and a list of short items are not."""
    para = "word\n" * 16
    item = "- first\n" + "  more\n" * 15
    short_items = "- one\n  two\n" * 16
    fence = "```sh\n" + "x\n" * 40 + "```\n"
    table = "| a |\n" * 40
    sizes = lambda text: [size for _, size, _ in _blocks(text)]
    assert max(sizes(para)) == 16 and max(sizes(item)) == 16
    assert max(sizes(short_items)) == 2 and sizes(fence) == [] and sizes(table) == []
    assert sizes("text\n" + fence + "text\n") == [1, 1]


def _nav_section(title: str) -> list[str]:
    """The pages of one section of mkdocs.yml's nav, by their file names."""
    nav = (REPO / "mkdocs.yml").read_text().split("\nnav:\n", 1)[1]
    section = re.search(rf"^  - {re.escape(title)}:\n((?:      - .*\n)+)", nav, re.M)
    assert section, f"mkdocs.yml's nav has no section {title!r}"
    return re.findall(r":\s*(\S+\.md)$", section.group(1), re.M)


def test_every_use_it_page_ends_with_where_to_go_next():
    """A reader who finishes a page of "Use it" is told where to go: its last section is
    "Next", a list of links to other pages."""
    pages = _nav_section("Use it")
    assert len(pages) >= 6, pages
    for page in pages:
        text = (REPO / "docs" / page).read_text()
        last = text.rsplit("\n## ", 1)[-1]
        assert last.startswith("Next\n"), f"docs/{page}: its last section is {last.splitlines()[0]!r}, not Next"
        assert re.findall(r"\]\([a-z-]+\.md(?:#[a-z0-9-]+)?\)", last), f"docs/{page}: its Next links nowhere"


def test_every_symptom_of_troubleshooting_links_to_its_section():
    rows = [ln for ln in (REPO / "docs" / "troubleshooting.md").read_text().splitlines()
            if ln.startswith("| ") and not ln.startswith(("| what you see", "| ---"))]
    assert len(rows) >= 9, rows
    for row in rows:
        assert re.search(r"\]\([a-z-]+\.md(#[a-z0-9-]+)?\) \|$", row), f"no link to read on: {row[:60]}"


STUCK_BOUND = re.compile(r"`STUCK_GIVE_UP` \(([\d.]+) s\)")
STUCK_TALK = re.compile(r"(stuck|mid-write|held buckets|given up|gives? their keys up)", re.I)
SECONDS = re.compile(r"\b\d+(?:\.\d+)? s\b")


def test_the_stuck_bound_is_named_and_its_value_is_the_specs_everywhere():
    """The stuck bucket's bound is one constant (docs/segment-format.md section 7, every
    reader's STUCK_GIVE_UP): a page that gives it says its name, and the seconds it writes
    beside the name are the constant's, so a change of the bound that misses a page fails here."""
    from shmcache.engine.reader import STUCK_GIVE_UP

    said, wrong, unnamed = 0, [], []
    for page in PAGES:
        for n, line in enumerate(page.read_text().splitlines(), 1):
            for m in STUCK_BOUND.finditer(line):
                said += 1
                if float(m.group(1)) != STUCK_GIVE_UP:
                    wrong.append(f"{page.name}:{n}: {m.group(0)}")
            if STUCK_TALK.search(line) and SECONDS.search(line) and "STUCK_GIVE_UP" not in line \
                    and ("bucket" in line or "in all" in line or "deadline" in line):
                unnamed.append(f"{page.name}:{n}: {line.strip()}")
    assert said >= 5, "the pages no longer name the bound"
    assert not wrong, f"the bound is {STUCK_GIVE_UP:g} s: {wrong}"
    assert not unnamed, f"the stuck bound in seconds without its name: {unnamed}"

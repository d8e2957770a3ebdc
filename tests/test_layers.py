"""The package's layers, read from its sources: every import of every module (at any depth,
a function's own imports too) goes down the layers or stays in its own, never up; a
sub-package reaches only the modules of its folder it is allowed; no two modules import
each other, however far round; no folder's private modules (`_*`) are reached from outside
it; nothing below the command line goes through the package's face; a module holds one
concept, small enough to read in a sitting.

The layers, lowest first (pyproject.toml says the same):
    ipc < engine < snapshots < formats < kafka < consumer < produce < dev < spark < cli
errors.py is beneath them all. The face (__init__.py: the public API, by name from the
engine) is what the package's users import, the command line among them: it sits at
cli's level, and __main__.py (`python -m shmcache`) above it.
"""

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ["ipc", "engine", "snapshots", "formats", "kafka", "consumer", "produce", "dev", "spark", "cli"]
# A sub-package is a concept of its own inside its folder's layer; of its folder's other
# modules it reaches only these, and a package named here with its modules (its own modules,
# errors.py and the layers below, freely).
SUBPACKAGES = {
    # the control area: the Reader builds its view, so it sits below the handles, and it
    # knows of the table only where the words lie, and who of their owners lives
    "shmcache.engine.control": {"shmcache.engine.layout", "shmcache.engine.units", "shmcache.engine.owners"},
    # a worker shares with the supervisor only its settings, the warm-up and the segment
    "shmcache.consumer.worker": {"shmcache.consumer.config", "shmcache.consumer.warm"},
    # the supervisor starts the workers, and so may reach them
    "shmcache.consumer.supervisor": {"shmcache.consumer.config", "shmcache.consumer.warm", "shmcache.consumer.worker"},
}
# A module holds one concept and stays readable in a sitting: MAX_LINES. One concept that
# needs more may grow to LONG_MAX, named here with what it holds; several concepts get a
# module each (and a folder, if they make one concept together).
MAX_LINES = 400
LONG_MAX = 600
LONG = {
    "engine/control/area.py": "the control area's words, read (ControlView) and written by name (ControlArea)",
    "engine/reader.py": "the Reader: its mapping and the checks of the file at attach, lookups and their "
                        "results (Packed), stats and readiness",
    "snapshots/writing.py": "writing a snapshot: the buckets copied under their seqlocks, the file written light "
                            "on the readers beside it",
}


def _modules() -> dict[str, Path]:
    """Dotted name -> file, for every module of the package: its folders' and their
    sub-packages' (a folder with an __init__.py), at any depth."""
    out = {"shmcache": ROOT / "__init__.py", "shmcache.__main__": ROOT / "__main__.py",
           "shmcache.errors": ROOT / "errors.py"}
    for folder in LAYERS:
        for f in sorted((ROOT / folder).rglob("*.py")):
            parts = f.relative_to(ROOT).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(("shmcache", *parts))] = f
    return out


MODULES = _modules()


def _imports(name: str) -> set[str]:
    """The package's modules that module `name` imports, at any depth of its code."""
    tree = ast.parse(MODULES[name].read_text(), str(MODULES[name]))
    package = name if MODULES[name].name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1] + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        else:
            continue
        found |= {t for t in targets if t in MODULES and t != name}
    return found


GRAPH = {name: _imports(name) for name in MODULES}


def _layer(name: str) -> int:
    parts = name.split(".")
    if name == "shmcache.errors":
        return -1
    if len(parts) == 1:
        return LAYERS.index("cli")  # the face
    if parts[1] == "__main__":
        return len(LAYERS)
    return LAYERS.index(parts[1])


def _packages() -> set[str]:
    return {name for name, f in MODULES.items() if f.name == "__init__.py" and name != "shmcache"}


def test_the_layers_are_the_package_folders():
    folders = {p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file()}
    assert folders == set(LAYERS), "a package folder that is no layer (or a layer without a folder)"
    assert {p.name for p in ROOT.glob("*.py")} == {"__init__.py", "__main__.py", "errors.py"}, \
        "the root holds the face alone"
    loose = sorted(str(d.relative_to(ROOT)) for folder in LAYERS for d in (ROOT / folder).rglob("*")
                   if d.is_dir() and d.name != "__pycache__" and not (d / "__init__.py").is_file())
    assert not loose, f"folders inside the package that are no package: {loose}"


def test_every_package_says_what_it_owns():
    """Each folder's __init__.py opens with a docstring: what the folder owns (and, for a
    sub-package, why it is one)."""
    bare = sorted(name for name in _packages()
                  if len(ast.get_docstring(ast.parse(MODULES[name].read_text())) or "") < 40)
    assert not bare, f"package folders without a docstring saying what they own: {bare}"


def test_pyproject_installs_every_package():
    """pyproject.toml maps each package folder (sub-packages too) to its dotted name."""
    text = (ROOT / "pyproject.toml").read_text()
    listed = set(re.findall(r'^"(shmcache\.[\w.]+)" = "([\w/]+)"$', text, re.M))
    want = {(name, str(MODULES[name].parent.relative_to(ROOT))) for name in _packages()}
    assert listed == want, f"pyproject.toml's package-dir differs: missing {sorted(want - listed)}, " \
                           f"extra {sorted(listed - want)}"
    packages = set(re.findall(r'"(shmcache(?:\.[\w.]+)?)"', text[text.index("packages = ["):text.index("]", text.index("packages = ["))]))
    assert packages == {"shmcache", *_packages()}, sorted(packages ^ {"shmcache", *_packages()})


TESTS = ROOT / "tests"
# tests folders that mirror no package folder: the readers' conformance suite (Python, Go
# and Java through the same commands) and the fault suite (the whole system under faults)
TESTS_OF_NO_PACKAGE = {"conformance", "faults"}


def test_the_tests_mirror_the_package():
    """Each package folder (and sub-package) has the tests folder of the same path, holding
    tests, and each tests folder is a package folder's (or one named above)."""
    folders = {str(MODULES[name].parent.relative_to(ROOT)) for name in _packages()}
    missing = sorted(f for f in folders if not any((TESTS / f).glob("test_*.py")))
    assert not missing, f"package folders without a tests folder of the same path: {missing}"
    tests_folders = {str(d.relative_to(TESTS)) for d in TESTS.rglob("*")
                     if d.is_dir() and any(d.glob("test_*.py"))}
    extra = sorted(f for f in tests_folders if f not in folders and f.split("/")[0] not in TESTS_OF_NO_PACKAGE)
    assert not extra, f"tests folders that mirror no package folder: {extra}"


def test_no_import_goes_up_a_layer():
    up = sorted(f"{a} -> {b}" for a, bs in GRAPH.items() for b in bs if _layer(b) > _layer(a))
    assert not up, "\n".join(up)


def test_a_subpackage_reaches_only_what_it_may_of_its_folder():
    wrong = []
    for sub, allowed in SUBPACKAGES.items():
        parent = sub.rpartition(".")[0]
        for a, bs in GRAPH.items():
            if a != sub and not a.startswith(sub + "."):
                continue
            wrong += [f"{a} -> {b}" for b in bs if b.startswith(parent + ".") and b != sub
                      and not b.startswith(sub + ".") and not any(b == x or b.startswith(x + ".") for x in allowed)]
    assert not wrong, "\n".join(sorted(wrong))


def test_no_module_goes_through_the_face():
    """Below the command line, a module imports the engine (or whichever module has what it
    needs), not `shmcache` itself: the face is for the package's users."""
    through = sorted(a for a, bs in GRAPH.items() if "shmcache" in bs and _layer(a) < LAYERS.index("cli"))
    assert not through, through


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The sets of two or more nodes that reach each other (Tarjan's strongly connected components)."""
    index, low, stack, on, circles = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = set()
            while True:
                w = stack.pop()
                on.discard(w)
                part.add(w)
                if w == v:
                    break
            if len(part) > 1:
                circles.append(sorted(part))

    for v in graph:
        if v not in index:
            visit(v)
    return circles


def test_no_circle():
    """No module imports itself again through others (a package's __init__ re-exporting its
    submodules is no circle of code: the graph has no edge from a module to its package)."""
    assert not _circles(GRAPH), _circles(GRAPH)


def _helper_graph() -> dict[str, set[str]]:
    """The test helpers' package (tests/lib/shmtest) as a graph: module -> the modules of the
    package it imports."""
    lib = ROOT / "tests" / "lib"
    mods = {".".join(f.relative_to(lib).with_suffix("").parts).removesuffix(".__init__"): f
            for f in (lib / "shmtest").rglob("*.py")}
    graph = {}
    for name, f in mods.items():
        tree = ast.parse(f.read_text(), str(f))
        # a script's entry (`if __name__ == "__main__":`) and type hints' imports are no dependency
        tree.body = [n for n in tree.body if not (isinstance(n, ast.If) and ast.unparse(n.test) in (
            "__name__ == '__main__'", "TYPE_CHECKING"))]
        found = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                found |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and not node.level:
                found |= {node.module or ""} | {f"{node.module}.{a.name}" for a in node.names}
        graph[name] = {m for m in found if m in mods and m not in (name, "shmtest")}
    return graph


def test_no_circle_in_the_test_helpers():
    """The helpers' modules import each other one way only."""
    graph = _helper_graph()
    assert sum(len(v) for v in graph.values()) > 10  # the imports are seen at all
    assert not _circles(graph), _circles(graph)


def test_tests_and_benchmarks_find_their_helpers_by_name():
    """No test, benchmark or helper edits sys.path or loads a file by its path to find a
    helper, and none imports another test module: the helpers are the installed package
    `shmtest` (the one loader of generated source, peers.import_source, is a benchmark's
    way to compile edited kernels, not to find code)."""
    found = []
    for f in sorted([*(ROOT / "tests").rglob("*.py"), *(ROOT / "bench").rglob("*.py")]):
        text = f.read_text()
        rel = f.relative_to(ROOT).as_posix()
        for node in ast.walk(ast.parse(text, rel)):
            if isinstance(node, ast.Attribute) and node.attr == "path" and getattr(node.value, "id", "") == "sys" \
                    and rel != "tests/lib/shmtest/bench/peers.py":
                found.append(f"{rel}:{node.lineno}: sys.path")
            if isinstance(node, ast.Attribute) and node.attr == "spec_from_file_location":
                found.append(f"{rel}:{node.lineno}: a module loaded by its path")
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else \
                [node.args[0].value] if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(
                    node.func, "attr", "")) in ("__import__", "import_module") and node.args and isinstance(
                    node.args[0], ast.Constant) and isinstance(node.args[0].value, str) else []
            found += [f"{rel}:{node.lineno}: imports {n}" for n in names if n.split(".")[0].startswith(("test_", "_"))
                      and n != "__future__"]
    assert not found, "\n".join(found)


def test_private_modules_stay_in_their_folder():
    """A module named `_*` is its folder's own: nothing outside the folder imports it."""
    reached = sorted(f"{a} -> {b}" for a, bs in GRAPH.items() for b in bs
                     if b.rpartition(".")[2].startswith("_") and not a.startswith(b.rpartition(".")[0] + ".")
                     and a != b.rpartition(".")[0])
    assert not reached, reached


@pytest.mark.parametrize("name", sorted(MODULES))
def test_a_module_holds_one_concept_readable_in_a_sitting(name):
    n = len(MODULES[name].read_text().splitlines())
    where = str(MODULES[name].relative_to(ROOT))
    if where in LONG:
        assert MAX_LINES < n <= LONG_MAX, f"{where}: {n} lines (one concept, {LONG[where]}: {MAX_LINES}..{LONG_MAX})"
    else:
        assert n <= MAX_LINES, (f"{where}: {n} lines (at most {MAX_LINES}; one concept that needs more is named "
                                f"in LONG, up to {LONG_MAX}; several concepts are several modules)")


def test_the_checks_see_the_imports():
    """The graph is read right: imports known to exist are in it (a parser that found none
    would pass every check above)."""
    assert "shmcache.engine.layout" in GRAPH["shmcache.engine.table"]
    assert "shmcache.formats.wire" in GRAPH["shmcache.consumer.worker.loop"]  # a function-level or top-level import
    assert "shmcache.consumer.worker.loop" in GRAPH["shmcache.consumer.warm"]  # inside warm()
    assert "shmcache.engine.control.area" in GRAPH["shmcache.engine.reader"]  # a sub-package's module
    assert sum(len(v) for v in GRAPH.values()) > 300


def test_the_module_table_lists_the_layers_in_order():
    """docs/how-it-works.md's module table (the only one in the docs) names the package's
    folders, lowest layer first."""
    text = (ROOT / "docs" / "how-it-works.md").read_text()
    table = text[text.index("## Layout of the repo"):]
    table = table.split("\n## ", 1)[0]
    rows = re.findall(r"^\| \*\*`(\w+)/`\*\*", table, re.M)
    assert [r for r in rows if (ROOT / r / "__init__.py").is_file()] == LAYERS


def test_how_it_works_names_every_module():
    """docs/how-it-works.md's table of the repo names each module under its folder's row
    (a sub-package's under its own row; the command modules of cli/ are one row: "one
    module per command")."""
    from shmcache.cli import COMMANDS

    text = (ROOT / "docs" / "how-it-works.md").read_text()
    table = text[text.index("## Layout of the repo"):]
    named: dict[str, set[str]] = {}
    folder = None
    for line in table.splitlines():
        head = re.match(r"^\| \*\*`([\w/]+)/`\*\*", line)
        if head:
            folder = head.group(1)
        if folder and line.startswith("|"):
            named.setdefault(folder, set()).update(re.findall(r"`(\w+\.py)`", line))
    commands = {f"{module}.py" for _, module in COMMANDS}
    missing = []
    for name, f in MODULES.items():
        where = f.relative_to(ROOT)
        if len(where.parts) < 2:
            continue  # the face
        folder = str(where.parent)
        if f.name == "__init__.py" and where.parts[0] != "cli":
            continue
        if name.startswith("shmcache.cli.") and f.name in commands:
            continue
        if f.name not in named.get(folder, set()):
            missing.append(str(where))
    assert not missing, f"modules docs/how-it-works.md does not name under their folder's row: {sorted(missing)}"

"""The package's layers, read from its sources: every import of every module (at any depth,
a function's own imports too) goes down the layers or stays in its own, never up; no two
modules import each other, however far round; nothing outside engine/ reaches engine's
private modules; nothing below the command line goes through the package's face; no
module grows past what one sitting can read.

The layers, lowest first (pyproject.toml says the same):
    ipc < engine < formats < consumer < produce < dev < spark < cli
errors.py is beneath them all. The face (__init__.py: the public API, by name from the
engine) is what the package's users import, the command line among them: it sits at
cli's level, and __main__.py (`python -m shmcache`) above it.
"""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ["ipc", "engine", "formats", "consumer", "produce", "dev", "spark", "cli"]
MAX_LINES = 400


def _modules() -> dict[str, Path]:
    """Dotted name -> file, for every module of the package."""
    out = {"shmcache": ROOT / "__init__.py", "shmcache.__main__": ROOT / "__main__.py",
           "shmcache.errors": ROOT / "errors.py"}
    for folder in LAYERS:
        for f in sorted((ROOT / folder).glob("*.py")):
            name = f"shmcache.{folder}" if f.stem == "__init__" else f"shmcache.{folder}.{f.stem}"
            out[name] = f
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


def test_the_layers_are_the_package_folders():
    folders = {p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file()}
    assert folders == set(LAYERS), "a package folder that is no layer (or a layer without a folder)"
    assert {p.name for p in ROOT.glob("*.py")} == {"__init__.py", "__main__.py", "errors.py"}, \
        "the root holds the face alone"


def test_no_import_goes_up_a_layer():
    up = sorted(f"{a} -> {b}" for a, bs in GRAPH.items() for b in bs if _layer(b) > _layer(a))
    assert not up, "\n".join(up)


def test_no_module_goes_through_the_face():
    """Below the command line, a module imports the engine (or whichever module has what it
    needs), not `shmcache` itself: the face is for the package's users."""
    through = sorted(a for a, bs in GRAPH.items() if "shmcache" in bs and _layer(a) < LAYERS.index("cli"))
    assert not through, through


def test_no_circle():
    """No module imports itself again through others (Tarjan's strongly connected components)."""
    index, low, stack, on, circles = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in GRAPH[v]:
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
            # a package's __init__ re-exporting its submodules is no circle of code
            if len(part) > 1:
                circles.append(sorted(part))

    for v in GRAPH:
        if v not in index:
            visit(v)
    assert not circles, circles


def test_engine_private_modules_stay_in_the_engine():
    reached = sorted(f"{a} -> {b}" for a, bs in GRAPH.items() for b in bs
                     if b.startswith("shmcache.engine._") and not a.startswith("shmcache.engine"))
    assert not reached, reached


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_module_past_one_sitting(name):
    n = len(MODULES[name].read_text().splitlines())
    assert n <= MAX_LINES, f"{MODULES[name].relative_to(ROOT)}: {n} lines (at most {MAX_LINES})"


def test_the_checks_see_the_imports():
    """The graph is read right: imports known to exist are in it (a parser that found none
    would pass every check above)."""
    assert "shmcache.engine.layout" in GRAPH["shmcache.engine.table"]
    assert "shmcache.formats.wire" in GRAPH["shmcache.consumer.worker"]  # a function-level or top-level import
    assert "shmcache.consumer.worker" in GRAPH["shmcache.consumer.warmup"]  # inside warm()
    assert sum(len(v) for v in GRAPH.values()) > 300


def test_the_readme_lists_the_layers_in_order():
    """README.md's Layout table names the package's folders, lowest layer first."""
    import re

    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Layout"):]
    section = section[:section.index("\n## ", 1)]
    assert re.findall(r"^\| `(\w+)/` \|", section, re.M) == LAYERS


def test_how_it_works_names_every_module():
    """docs/how-it-works.md's table of the repo names each module under its folder's row
    (the command modules of cli/ are one row: "one module per command")."""
    import re

    from shmcache.cli import COMMANDS

    text = (ROOT / "docs" / "how-it-works.md").read_text()
    table = text[text.index("## Layout of the repo"):]
    named: dict[str, set[str]] = {}
    folder = None
    for line in table.splitlines():
        head = re.match(r"^\| \*\*`(\w+)/`\*\*", line)
        if head:
            folder = head.group(1)
        if folder and line.startswith("|"):
            named.setdefault(folder, set()).update(re.findall(r"`(\w+\.py)`", line))
    commands = {f"{module}.py" for _, module in COMMANDS}
    missing = sorted(f"{name.split('.')[1]}/{f.name}" for name, f in MODULES.items()
                     if name.count(".") >= 1 and name.split(".")[1] in LAYERS
                     and f.name not in named.get(name.split(".")[1], set())
                     and not (name.startswith("shmcache.cli.") and f.name in commands)
                     and not (f.name == "__init__.py" and name.split(".")[1] != "cli"))
    assert not missing, f"modules docs/how-it-works.md does not name: {missing}"

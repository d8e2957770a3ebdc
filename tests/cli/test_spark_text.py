"""`shmcache spark`'s reports print the user's paths as typed: a rich table's title and
cells are markup, so a directory named "[bold red]x" lost its brackets (and "z\\[" its
backslash) before they were escaped. datagen needs no Spark session, so it runs here in
a process of its own, as a user's terminal would show it."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", ["[bold red]x", "z\\[", "[link=http://e.example]y"])
def test_datagen_report_shows_the_path_as_typed(tmp_path, name):
    out = tmp_path / name
    p = subprocess.run([sys.executable, "-m", "shmcache", "spark", "datagen", str(out), "--rows", "100"], cwd=REPO,
                       capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "300"})
    assert p.returncode == 0, p.stderr[-3000:]
    assert f"datagen -> {out}" in p.stdout, p.stdout
    assert out.is_dir()

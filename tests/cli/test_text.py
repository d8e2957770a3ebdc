"""Text from outside printed by the command line is text, never rich markup (issue 39
item 8): other group members' client ids, hosts and instance ids, the topic, a snapshot's
topic and path. `evil[/]` made `shmcache status` die with a MarkupError traceback;
`[link=...]` or `[bold]` would have been rendered, hiding what is really there."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

import shmcache

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "COLUMNS": "300"}
# a closing tag with nothing open (raises), a style, a link and an escape: all must print as typed
EVIL = ["evil[/]", "[bold red]x[/bold red]", "[link=http://e.example]y[/link]", "z\\[/]"]


def _cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "shmcache", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=60, env=ENV)



def test_status_prints_group_members_and_topic_as_text(cache_names):
    name = cache_names("status")
    with shmcache.create(name, memory="64MiB") as w:
        assert w.control.claim_supervisor() == 0  # this process publishes as a supervisor
        w.control.set_topic("tx[/]", 4)
        others = [{"client_id": EVIL[i], "host": EVIL[(i + 1) % 4], "instance_id": EVIL[(i + 2) % 4]}
                  for i in range(4)]
        w.control.set_group(5, others, {0: 0, 1: 1, 2: 2, 3: 3})
        with shmcache.attach(name) as r:
            got = [{k: o[k] for k in ("client_id", "host", "instance_id")} for o in r.status()["group_others"]]
            assert got == others  # what status is given to print
        p = _cli("status", name)
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr
    for text in EVIL:
        assert f"  {text} on " in p.stdout, p.stdout  # each client id, as typed
    assert "'tx[/]'" in p.stdout and "\x1b]8;" not in p.stdout  # no hyperlink escape


def test_snapshot_and_restore_print_topic_and_path_as_text(cache_names, tmp_path):
    src, dst = cache_names("snap"), cache_names("restore")
    path = tmp_path / "a[bold]b[link=x]c.snap"
    with shmcache.create(src, memory="64MiB") as w:
        w.control.set_topic("evil[/]", 1)
        w.set(b"k" * 32, b"v")
        p = _cli("snapshot", src, str(path))
        assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr
        assert str(path) in p.stdout.replace("\n", ""), p.stdout
    p = _cli("restore", str(path), dst)
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr
    out = p.stdout.replace("\n", "")
    assert str(path) in out and "topic 'evil[/]'" in out, p.stdout


def test_a_plain_progress_line_is_one_line_as_typed_however_long(monkeypatch):
    """Without a terminal (a log, CI: 80 columns) a progress line of any length is one line, its
    text as typed: rich wrapped a long one across two lines and a blank one (a produce run's
    last line, longer on a slow host's figures)."""
    import io

    from rich.console import Console

    from shmcache.cli import progress

    out = io.StringIO()
    console = Console(file=out, force_terminal=False)  # 80 columns, as in CI
    assert not console.is_terminal and console.width == 80
    line = "producing to " + "t" * 40 + ": 5,000/5,000 entries, 3,293/s, 20/20 messages acknowledged " + EVIL[0] + EVIL[1]
    monkeypatch.setattr(progress, "PLAIN_S", 0.0)
    with progress.ProgressLine(console, (), 10) as p:
        p.update(lambda: line)
    assert out.getvalue() == line + "\n"

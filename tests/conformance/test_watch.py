"""The conformance suite's watches (scenarios.toml's [[watch]]): every reader's `watch` runs
at once on one name while the name is changed under it, step by step or churned, and each
must print the lines written there, each in time. Apart from test_conformance.py so that the
two, the suite's longest files, run side by side."""

from __future__ import annotations

import re
import time
import tomllib
from pathlib import Path

import pytest

from shmtest import readers as R
from shmtest import scene as S

SCENARIOS = tomllib.loads((Path(__file__).resolve().parent / "scenarios.toml").read_text())
# A watch's SECONDS: a scenario with `to_the_end` waits for its watches to exit 0 when their
# time is up; the others stop them (kill) once every step's line has come.
WATCH_SECONDS = 60.0


def _outcome(text: str) -> str:
    """A scenario's outcome as a watch prints it: "hit v1" is the hit of value "v1"."""
    verb, _, v = text.partition(" ")
    return f"hit {S.value(v).hex()}" if verb == "hit" else text


# -- under a live watch --------------------------------------------------------------------------------


def _expect_line(w: R.Running, want: str, since: float, within: float | None, what: str) -> None:
    """w's next line is `want` (its ELAPSED aside), and came within `within` s of `since`."""
    got = w.next_line(timeout=max(within or 0, 30))
    assert got is not None, f"{w.reader}: no line after {what} (wanted {want!r}); stderr: {w.stderr()[-500:]!r}"
    at, line = got
    elapsed, _, outcome = line.partition(" ")
    assert re.fullmatch(r"\d+\.\d{3}", elapsed), f"{w.reader}: {line!r} does not start with ELAPSED"
    assert outcome == want or outcome.startswith(want + (": " if want.startswith("error") else " ")), \
        f"{w.reader}: after {what}, {line!r}, not {want!r}"
    if within is not None:
        assert at - since <= within, f"{w.reader}: {want!r} came {at - since:.2f} s after {what}, over {within} s"


def _settle(w: R.Running, want: str, what: str) -> None:
    """Reads w's lines until one is `want` (at most 30 s after the last came)."""
    while True:
        got = w.next_line(timeout=30)
        assert got is not None, f"{w.reader}: no {want!r} after the {what}; stderr: {w.stderr()[-500:]!r}"
        if got[1].partition(" ")[2].startswith(want):
            return


WATCHES = SCENARIOS["watch"]


@pytest.mark.parametrize("case", WATCHES, ids=[c["about"][:60] for c in WATCHES])
def test_watch(readers, scene, case):
    s = scene("watch")
    s.setup(case["setup"])
    key = (S.key("k") * 4)[:case.get("key_bytes", len(S.key("k")))].hex()
    first = _outcome(case["first"])
    seconds = case.get("seconds", WATCH_SECONDS)
    watches = [R.Running(r, "watch", *case.get("args", []), s.name, key, str(seconds)) for r in readers]
    try:
        for w in watches:
            _expect_line(w, first, 0, None, "the start")
        if "churn" in case:
            churn = s.exchange_loop(seconds=case.get("churn_seconds", 5), kind=case["churn"])
            assert churn.wait(timeout=60) == 0, churn.stderr.read()
            allowed = {_outcome(a) for a in case["allowed"]}
            if "settle" in case:  # the watch's line for the name as the churn left it, before the steps
                for w in watches:
                    _settle(w, _outcome(case["settle"]), case["churn"])
        for step in case.get("steps", []):
            t = time.monotonic()
            s.step(step["do"])
            if "expect" in step:
                for w in watches:
                    _expect_line(w, _outcome(step["expect"]), t, step.get("within", 30), step["do"])
        expected = 1 + sum("expect" in st for st in case.get("steps", []))
        for w in watches:
            if case.get("to_the_end"):  # it lives to the end, and exits 0 when its time is up
                rc = w.proc.wait(timeout=seconds + 60)
                assert rc == 0, f"{w.reader}: watch exited {rc}; stderr: {w.stderr()[-500:]!r}"
            else:  # it lives on after every step
                assert w.proc.poll() is None, f"{w.reader}: watch ended early; stderr: {w.stderr()[-500:]!r}"
                w.stop()
            while w.next_line(timeout=5) is not None:  # every line it printed
                pass
            if "churn" in case:  # a hit's line is "hit HEX", an error's "error KIND: message"
                outcomes = {line.partition(" ")[2].split(":")[0] for _, line in w.seen}
                assert outcomes <= allowed, f"{w.reader}: outcomes {sorted(outcomes)} beyond {sorted(allowed)}"
            else:
                assert len(w.seen) == expected, f"{w.reader}: lines beyond the expected: {[ln for _, ln in w.seen]}"
    finally:
        for w in watches:
            w.stop()

"""One conformance suite for the three readers (docs/reader-contract.md): every scenario of
scenarios.toml (the watches' in test_watch.py), every golden segment (golden/expect.json), every golden control area
(golden/control/expect.json) and the golden txmeta values (golden/txmeta/cases.json, through
`get --decode txmeta`) is run against the Python, Go and Java readers through the same
commands, and each reader must give the outcome written there. A reader whose
outcome differs fails the scenario, naming the reader and what it said.

A reader whose toolchain is not installed (no go, no java) is left out, saying so; CI
has all three."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import time
import tomllib
from pathlib import Path

import pytest

from shmtest import golden_control
from shmtest import readers as R
from shmtest import scene as S

HERE = Path(__file__).resolve().parent
SCENARIOS = tomllib.loads((HERE / "scenarios.toml").read_text())
GOLDEN_KINDS = {"not_a_cache": "not-a-cache", "version": "unknown-version", "corrupt": "corrupt"}
# -- checks ------------------------------------------------------------------------------------


def _judge(results: dict[str, subprocess.CompletedProcess], readers, exp: dict) -> None:
    """Each reader's result against the expectation {out, exit, kind, says}; one failure
    naming every reader that differs."""
    bad = []
    for r in readers:
        p = results[r.name]
        if "kind" in exp:
            wrong = R.error_line(r, p, exp["kind"], exp.get("says", ()))
        else:
            wrong = []
            if p.returncode != exp["exit"]:
                wrong.append(f"exit {p.returncode}, not {exp['exit']}")
            if "out" in exp and p.stdout.split("\n")[:-1] != exp["out"]:
                wrong.append(f"stdout {p.stdout.splitlines()!r}, not {exp['out']!r}")
            if re.search(rf"^{re.escape(r.program)}: [a-z-]+: ", p.stderr, re.M):
                wrong.append("an error line on stderr")  # a warning of its log (a bucket given up) may be there
        if wrong:
            bad.append(f"{r}: {'; '.join(wrong)}\n    stdout: {p.stdout[-500:]!r}\n    stderr: {p.stderr[-500:]!r}")
    assert not bad, exp.get("about", "") + "\n" + "\n".join(bad)


def _values(outs: list[str]) -> list[str]:
    return ["-" if v == "-" else S.value(v).hex() for v in outs]


# -- one command, one answer ----------------------------------------------------------------------

GETS = SCENARIOS["get"]


@pytest.mark.parametrize("case", GETS, ids=[c["about"][:60] for c in GETS])
def test_get(readers, scene, case):
    s = scene("get", case.get("name"))
    s.setup(case["setup"], case.get("entries"))
    keys = case.get("hexkeys") or [S.key(k).hex() for k in case.get("keys", [])]
    command = case.get("command", "get")
    results = R.run_all(readers, command, *case.get("args", []), s.name, *keys, *case.get("tail", []),
                        no_dac=case.get("no_dac", False))
    _judge(results, readers, {**case, **({"out": _values(case["out"])} if "out" in case else {})})


@pytest.mark.contract  # in scripts/test --quick: every reader over the goldens
@pytest.mark.parametrize("case", sorted(S.golden_cases()))
def test_golden_segment(readers, scene, roles, case):
    """Every golden segment: refused with its kind (naming the field), or every key's answer."""
    exp = S.golden_cases()[case]
    s = scene("golden")
    data = S.golden_image(exp)
    if "live_holder_offset" in exp:  # the holder's word in the bucket's lock and in writer row 0, its lock held
        for off in (exp["live_holder_offset"], exp["live_writer_offset"]):
            data[off:off + 8] = roles["holder"][1].to_bytes(8, "little", signed=True)
    s.install(data)
    if "live_writer_offset" in exp:
        s.hold_locks([exp["live_writer_offset"]])
    if "attach_error" in exp:
        says = [f"header field {exp['field']} is"] if exp["field"] else []
        results = R.run_all(readers, "get", s.name, "00" * 32)
        _judge(results, readers, {"about": case, "kind": GOLDEN_KINDS[exp["attach_error"]], "says": says})
        return
    keys = exp["keys"]
    out = ["-" if k["value"] is None else k["value"] for k in keys]
    results = R.run_all(readers, "get", s.name, *(k["key"] for k in keys))
    _judge(results, readers, {"about": case, "out": out, "exit": 0 if "-" not in out else 1})


# -- get --decode txmeta --------------------------------------------------------------------------

DECODES = SCENARIOS["decode"]


@pytest.mark.parametrize("case", DECODES, ids=[c["about"][:60] for c in DECODES])
def test_get_decode_txmeta(readers, scene, case):
    """Every reader prints each golden txmeta value's expected decode, one JSON object a
    line, compared as parsed JSON (each reader lays its JSON out its own way)."""
    s = scene("decode")
    expect = s.txmeta_goldens(case["cases"])
    misses = [hashlib.sha256(b"conformance txmeta miss %d" % i).hexdigest() for i in range(case["misses"])]
    want = [c["expect"] for _, c in expect] + ["-"] * len(misses)
    names = [c["name"] for _, c in expect] + ["a key never set"] * len(misses)
    results = R.run_all(readers, "get", "--decode", "txmeta", s.name, *(k.hex() for k, _ in expect), *misses)
    bad = []
    for r in readers:
        p = results[r.name]
        lines = p.stdout.split("\n")[:-1]
        wrong = [] if p.returncode == case["exit"] else [f"exit {p.returncode}, not {case['exit']}"]
        if re.search(rf"^{re.escape(r.program)}: [a-z-]+: ", p.stderr, re.M):
            wrong.append(f"an error line on stderr: {p.stderr[-300:]!r}")
        if len(lines) != len(want):
            wrong.append(f"{len(lines)} lines for {len(want)} keys")
        else:
            for i, (line, w) in enumerate(zip(lines, want)):
                try:
                    got = line if line == "-" else json.loads(line)
                except ValueError:
                    got = line
                if got != w:
                    wrong.append(f"line {i} ({names[i]}): {line!r}, not {w if w == '-' else json.dumps(w)}")
                    if len(wrong) > 5:
                        break
        if wrong:
            bad.append(f"{r}: " + "; ".join(wrong))
    assert not bad, case["about"] + "\n" + "\n".join(bad)


# -- a planted sparse file -------------------------------------------------------------------------


@pytest.mark.parametrize("case", SCENARIOS["sparse"], ids=[c["about"][:60] for c in SCENARIOS["sparse"]])
def test_a_planted_sparse_file_costs_no_memory(readers, scene, case):
    s = scene("sparse")
    s.setup([f"sparse {case['size']}"])
    before = s.allocated()
    for r in readers:  # one at a time: what each one allocated is its own
        p = R.run(r, "get", s.name, *(S.key(k).hex() for k in case["keys"]))
        _judge({r.name: p}, [r], {**case, "out": _values(case["out"])})
        grew = s.allocated() - before
        assert grew <= case["most_allocated"], f"{r}: attach and a get allocated {grew:,} bytes of the planted file"


# -- buckets held mid-write ---------------------------------------------------------------------------


@pytest.mark.parametrize("case", SCENARIOS["stuck"], ids=[c["about"][:60] for c in SCENARIOS["stuck"]])
def test_a_batch_over_held_buckets_returns_after_one_bound(readers, scene, case):
    s = scene("stuck")
    s.setup(["cache"])
    keys = [k.hex() for k in s.keys_in_distinct_buckets(case["keys"])]
    s.hold_every_bucket()
    for r in readers:
        corrupt0 = json.loads(R.run(r, "stats", "--json", s.name).stdout)["corruptions"]
        t0 = time.monotonic()
        p = R.run(r, "get", s.name, *keys, timeout=case["within"] + 60)
        took = time.monotonic() - t0
        _judge({r.name: p}, [r], {"about": case["about"], "exit": case["exit"], "out": ["-"] * case["keys"]})
        assert took < case["within"], f"{r}: a batch of {case['keys']} keys over held buckets took {took:.1f} s"
        # the buckets given up are told in one warning line a call (Java wrote two lines a bucket)
        assert len(p.stderr.splitlines()) == 1, f"{r}: {len(p.stderr.splitlines())} lines on stderr: {p.stderr[:300]!r}"
        corrupt = json.loads(R.run(r, "stats", "--json", s.name).stdout)["corruptions"] - corrupt0
        assert corrupt == case["corruptions"], f"{r}: {corrupt} corruptions counted, not {case['corruptions']}"


# -- readiness -----------------------------------------------------------------------------------------

CONTROL = S.control_cases()


@pytest.mark.contract  # in scripts/test --quick: every reader over the goldens
@pytest.mark.parametrize("case", sorted(CONTROL))
def test_status_of_a_golden_control_area(readers, scene, roles, case):
    """Each golden control area: the same ready, caught_up, reason and why from every reader."""
    exp = CONTROL[case]
    s = scene("status")
    s.install_control(exp, {r: w for r, (_, w) in roles.items()})
    results = R.run_all(readers, "status", "--json", s.name)
    pattern = re.compile(golden_control.why_pattern(exp, roles["supervisor"][0]))
    bad = []
    for r in readers:
        p = results[r.name]
        try:
            st = json.loads(p.stdout)
        except ValueError:
            bad.append(f"{r}: not one JSON object: exit {p.returncode}, {p.stdout[-300:]!r} {p.stderr[-300:]!r}")
            continue
        got = {k: st.get(k) for k in ("ready", "caught_up", "reason")}
        want = {k: exp["status"][k] for k in got}
        if got != want or not pattern.match(str(st.get("why"))):
            bad.append(f"{r}: {got} why={st.get('why')!r}; wanted {want} why={exp['status']['why']!r}")
        bad += [f"{r}: {w}" for w in golden_control.behind_wrong(exp, st)]
        missing = [f for f in CONTRACT_STATUS_FIELDS if f not in st]
        missing += sorted({f"assigned[].{f}" for a in st.get("assigned") or [] for f in CONTRACT["status"]["partition_fields"]
                           if f not in a})
        missing += sorted({f"workers[].{f}" for w in st.get("workers") or [] for f in CONTRACT["status"]["worker_fields"]
                           if f not in w})
        if missing:
            bad.append(f"{r}: status lacks {missing}")
    assert not bad, exp["about"] + "\n" + "\n".join(bad)


BOUNDS = [(case, b) for case in sorted(CONTROL) for b in CONTROL[case].get("bounds", [])]


def _bound_args(b: dict) -> list[str]:
    return [*(["--max-lag", str(b["max_lag"])] if "max_lag" in b else []),
            *(["--max-behind", str(b["max_behind"])] if "max_behind" in b else [])]


@pytest.mark.contract
def test_wait_ready_with_a_bound_over_the_golden_control_areas(readers, scene, roles):
    """Each readiness bound of the goldens (golden/control/expect.json's `bounds`), as
    `wait-ready --max-lag N --max-behind S`, from every reader: within it, the status and exit
    0 at once; past it, exit 1 (not-ready) at the timeout, with the bound's why, partition by
    partition, in the same words."""
    assert len(BOUNDS) >= 8, "the goldens' readiness bounds"
    bad = []
    for case in sorted({c for c, _ in BOUNDS}):
        exp = CONTROL[case]
        s = scene("bound")
        s.install_control(exp, {r: w for r, (_, w) in roles.items()})
        s.keep_ages(exp)  # heartbeats kept fresh: ready however long the readers take to start
        bounds = [b for c, b in BOUNDS if c == case]
        lines = [["wait-ready", "--timeout", "60" if not b["why"] else "0.3", *_bound_args(b), s.name] for b in bounds]
        for (r, i), p in R.run_many(readers, lines).items():
            b = bounds[i]
            what = f"{r} {case} {' '.join(_bound_args(b))}"
            if not b["why"]:
                ok = p.returncode == 0 and json.loads(p.stdout or "{}").get("ready") is True
                if not ok:
                    bad.append(f"{what}: exit {p.returncode}, {p.stdout[-200:]!r} {p.stderr[-300:]!r}")
                continue
            wrong = R.error_line(r, p, "not-ready")
            pattern = golden_control.why_pattern(exp, roles["supervisor"][0], b["why"])
            if not re.search(": " + pattern[1:], p.stderr.strip()):
                wrong.append(f"the message does not end with {b['why']!r}")
            if wrong:
                bad.append(f"{what}: {'; '.join(wrong)}; stderr {p.stderr[-300:]!r}")
        s.clear()
    assert not bad, "\n".join(bad)


CONTRACT = json.loads((HERE.parents[1] / "golden" / "contract.json").read_text())  # the contract as data
CONTRACT_STATUS_FIELDS = tuple(CONTRACT["status"]["fields"])
CONTRACT_STATS_FIELDS = tuple(CONTRACT["stats"]["fields"])


def test_every_readiness_reason_has_a_golden_control_area():
    """Every reason of the contract is some golden control area's, so every reader is held to
    each (test_status_of_a_golden_control_area), and no golden gives a reason it lacks."""
    assert {c["status"]["reason"] for c in CONTROL.values()} == set(CONTRACT["status"]["reasons"])


def test_stats_give_the_same_figures(readers, scene):
    s = scene("stats")
    s.setup(["cache"], {"k": "v1", "j": "v2", "e": ""})
    results = R.run_all(readers, "stats", "--json", s.name)
    stats = {}
    for r in readers:
        p = results[r.name]
        assert p.returncode == 0, f"{r}: {p.stderr}"
        st = json.loads(p.stdout)
        missing = [f for f in CONTRACT_STATS_FIELDS if f not in st]
        assert not missing, f"{r}: stats lack {missing}"
        stats[r.name] = {f: st[f] for f in CONTRACT_STATS_FIELDS if f not in ("readers",)}
    first = stats["python"]
    for name, st in stats.items():
        diff = {f: (first[f], v) for f, v in st.items() if v != first[f]}
        assert not diff, f"{name} differs from python: {diff}"
    assert first["entries"] == 3 and first["name"] == s.name


WAITS = SCENARIOS["wait_ready"]


def _maps(pid: int, path: str) -> bool:
    """Process pid maps the file at path (or the file that was there: "(deleted)")."""
    try:
        with open(f"/proc/{pid}/maps") as f:
            return any(line.rstrip().removesuffix(" (deleted)").endswith(" " + path) for line in f)
    except OSError:
        return False


def _until(cond, what: str, timeout: float = 60) -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, f"gave up waiting: {what}"
        time.sleep(0.02)


@pytest.mark.parametrize("case", WAITS, ids=[c["about"][:60] for c in WAITS])
def test_wait_ready(readers, scene, roles, case):
    s = scene("wait")
    owners = {r: w for r, (_, w) in roles.items()}
    s.install_control(CONTROL[case["setup"]], owners)
    procs = [R.Running(r, "wait-ready", "--timeout", str(case["timeout"]), s.name) for r in readers]
    try:
        if "then" in case:  # every wait has the cache mapped; it is destroyed, and once no wait maps it, re-created
            _until(lambda: all(_maps(w.proc.pid, str(s.path)) or w.proc.poll() is not None for w in procs),
                   "every wait-ready attached")
            s.step("remove")
            _until(lambda: not any(_maps(w.proc.pid, str(s.path)) for w in procs), "every wait dropped the cache")
            s.install_control(CONTROL[case["then"]], owners)
        bad = []
        for w in procs:
            rc = w.proc.wait(timeout=case["timeout"] + 60)
            out = []
            while (item := w.next_line(timeout=5)) is not None:
                out.append(item[1])
            p = subprocess.CompletedProcess(w.proc.args, rc, "\n".join(out) + ("\n" if out else ""), w.stderr())
            if "kind" in case:
                wrong = R.error_line(w.reader, p, case["kind"], case.get("says", ()))
            else:
                wrong = [] if rc == case["exit"] else [f"exit {rc}"]
                try:
                    if json.loads(p.stdout)["reason"] != case["reason"]:
                        wrong.append(f"reason {json.loads(p.stdout)['reason']}")
                except (ValueError, KeyError):
                    wrong.append(f"not a status: {p.stdout[-300:]!r}")
            if wrong:
                bad.append(f"{w.reader}: {'; '.join(wrong)}; stderr {p.stderr[-300:]!r}")
        assert not bad, case["about"] + "\n" + "\n".join(bad)
    finally:
        for w in procs:
            w.stop()

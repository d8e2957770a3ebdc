"""The contract's words as data (golden/contract.json), held against every reader: each
argument the contract refuses is a bad-argument, one line (`PROGRAM: bad-argument: ...`, a
line break in what was given written as its escape), exit 2, in Python, Go and Java alike;
each it takes is taken. The error kinds of the file are each reader's own (Python's here,
Go's and Java's in their own tests against the same file) and the contract's table.

A command line is run with NAME standing for a cache of root's (mode 0600) whose control
area says ready, and KEY for a key of its size in hex."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from shmtest import readers as R
from shmtest import scene as S

from shmcache import errors

REPO = Path(__file__).resolve().parents[2]
CONTRACT = json.loads((REPO / "golden" / "contract.json").read_text())
ARGS = CONTRACT["arguments"]
KINDS = {k["kind"]: k for k in CONTRACT["kinds"]}


@pytest.fixture
def cache(scene, roles):
    """A ready cache (the control golden "control_ready", its roles live, its heartbeats kept
    fresh: it reads ready however long the tests take)."""
    s = scene("args")
    case = S.control_cases()["control_ready"]
    s.install_control(case, {r: w for r, (_, w) in roles.items()})
    s.keep_ages(case)
    return s


def _line(args: list[str], name: str) -> list[str]:
    return [name if a == "NAME" else S.key("k").hex() if a == "KEY" else a for a in args]


def _refused(readers, cases: list[tuple[str, list[str]]]) -> None:
    """Every reader refuses every command line of `cases` ((what, argv)): a bad-argument."""
    bad = []
    for (r, i), p in R.run_many(readers, [argv for _, argv in cases]).items():
        wrong = R.error_line(r, p, "bad-argument")
        if wrong:
            bad.append(f"{r} {cases[i][0]}: {'; '.join(wrong)}; stderr {p.stderr[-300:]!r}")
    assert not bad, "\n".join(bad)


def _taken(readers, cases: list[tuple[str, list[str]]], kind: str | None = None) -> None:
    """Every reader takes every command line of `cases`: it answers (exit 0 or 1, no error
    line), or, with `kind`, gives that error (the argument was taken, the cache refused)."""
    bad = []
    for (r, i), p in R.run_many(readers, [argv for _, argv in cases]).items():
        wrong = R.error_line(r, p, kind) if kind else [] if p.returncode in (0, 1) and not re.search(
            rf"^{re.escape(r.program)}: [a-z-]+: ", p.stderr, re.M) else [f"exit {p.returncode}"]
        if wrong:
            bad.append(f"{r} {cases[i][0]}: {'; '.join(wrong)}; stderr {p.stderr[-300:]!r}")
    assert not bad, "\n".join(bad)


def test_command_lines_of_the_wrong_shape_are_bad_arguments(readers, cache):
    _refused(readers, [(" ".join(a) or "(none)", _line(a, cache.name)) for a in ARGS["shape"]["refused"]])


def test_names_the_contract_refuses_are_bad_arguments_on_one_line(readers):
    for name in ARGS["name"]["refused"]:
        assert not re.fullmatch(ARGS["name"]["pattern"], name), name
    _refused(readers, [(f"name {n!r}", ["get", n, S.key("k").hex()]) for n in ARGS["name"]["refused"]])


def test_keys_that_are_not_hex_are_bad_arguments(readers, cache):
    _refused(readers, [(f"key {k!r}", ["get", cache.name, k]) for k in ARGS["hexkey"]["refused"]])


def test_owners_beyond_the_largest_uid_or_no_user_are_bad_arguments(readers, cache):
    _refused(readers, [(f"--owner {u!r}", ["get", "--owner", u, cache.name, S.key("k").hex()])
                       for u in ARGS["uid"]["refused"]])


def test_owners_the_contract_takes_are_taken(readers, cache):
    key = S.key("k").hex()
    largest = str(ARGS["uid"]["largest"])
    _taken(readers, [(f"--owner {u}", ["get", "--owner", u, cache.name, key]) for u in ARGS["uid"]["taken"]
                     if u != largest])  # root's cache, read by root's name and uid
    _taken(readers, [(f"--owner {largest}", ["get", "--owner", largest, cache.name, key])], "wrong-owner")


# of the seconds the contract refuses, the ones a number parser takes unless told not to
HARDEST_SECONDS = ("-1", "1e3", "inf", "1000000000", "\u0661")


def test_seconds_the_contract_refuses_are_bad_arguments(readers, cache):
    assert set(HARDEST_SECONDS) <= set(ARGS["seconds"]["refused"])
    _refused(readers, [(f"SECONDS {t!r}", ["watch", cache.name, S.key("k").hex(), t])
                       for t in ARGS["seconds"]["refused"]]
             + [(f"--timeout {t!r}", ["wait-ready", "--timeout", t, cache.name]) for t in ARGS["seconds"]["refused"]]
             # --max-behind is parsed by the same code as --timeout in every reader: its hardest cases
             + [(f"--max-behind {t!r}", ["wait-ready", "--max-behind", t, cache.name]) for t in HARDEST_SECONDS])


def test_seconds_the_contract_takes_are_taken(readers, cache):
    # a ready cache with no lag: the wait ends at once, whatever the timeout or the bound
    _taken(readers, [(f"--timeout {t}", ["wait-ready", "--timeout", t, cache.name]) for t in ARGS["seconds"]["taken"]]
           + [(f"--max-behind {t}", ["wait-ready", "--timeout", "0.2", f"--max-behind={t}", cache.name])
              for t in ("0", ARGS["seconds"]["taken"][-1])])


def test_counts_the_contract_refuses_are_bad_arguments(readers, cache):
    for t in ARGS["count"]["refused"]:
        assert not re.fullmatch(ARGS["count"]["pattern"], t), t
    _refused(readers, [(f"--max-lag {t!r}", ["wait-ready", "--max-lag", t, cache.name])
                       for t in ARGS["count"]["refused"]])


def test_counts_the_contract_takes_are_taken(readers, cache):
    _taken(readers, [(f"--max-lag {t}", ["wait-ready", "--timeout", "0.2", "--max-lag", t, cache.name])
                     for t in ARGS["count"]["taken"]])


def test_pythons_kinds_are_the_contracts():
    """Every error class names its own kind, one of the file's; together they (and a system
    refusal's `error`) are all of the file's kinds."""
    told = {}
    for name in errors.__all__:
        cls = getattr(errors, name)
        assert "kind" in vars(cls), f"{name} names no kind of its own"
        told[name] = cls.kind
    unknown = {n: k for n, k in told.items() if k not in KINDS}
    assert not unknown, f"kinds not in golden/contract.json: {unknown}"
    assert set(told.values()) | {errors.error_kind(OSError(12, "Cannot allocate memory"))} == set(KINDS)


def test_an_error_class_that_names_no_kind_is_refused_where_it_is_defined():
    with pytest.raises(TypeError, match="Unnamed names no kind"):
        type("Unnamed", (errors.CacheNotFoundError,), {"__doc__": "inherits not-found, says nothing"})


def test_the_contracts_table_of_kinds_is_the_files():
    text = (REPO / "docs" / "reader-contract.md").read_text()
    table = dict(re.findall(r"^\| `([a-z-]+)` \| (.+) \|$", text.split("### Errors", 1)[1].split("###", 1)[0], re.M))
    assert list(table) == list(KINDS), "docs/reader-contract.md's kinds are not golden/contract.json's, in order"
    for kind, case in table.items():
        assert case == KINDS[kind]["case"], f"{kind}: the contract says {case!r}, golden/contract.json " \
                                            f"{KINDS[kind]['case']!r}"


def test_the_contracts_table_of_arguments_is_the_files():
    text = (REPO / "docs" / "reader-contract.md").read_text()
    section = text.split("### Arguments", 1)[1].split("###", 1)[0]
    table = dict(re.findall(r"^\| `([a-z]+)` \| (.+) \|$", section, re.M))
    assert table == {name: a["rule"] for name, a in ARGS.items()}, \
        "docs/reader-contract.md's argument rules are not golden/contract.json's"


def test_the_contracts_status_and_stats_fields_and_reasons_are_the_files():
    text = (REPO / "docs" / "reader-contract.md").read_text()
    status = text.split("### `status` and `wait-ready`", 1)[1].split("\n\n", 3)[2]  # the table
    firsts = [row.split("|")[1] for row in status.splitlines()[2:]]
    named = [f for cell in firsts for f in re.findall(r"`([a-z_]+)`", cell)]
    assert named == CONTRACT["status"]["fields"], "docs/reader-contract.md's status fields are not golden/contract.json's"
    inner = re.search(r"\| `assigned` \| a list of `\{([a-z_, ]+)\}`", status).group(1).split(", ")
    assert inner == CONTRACT["status"]["partition_fields"], "an assigned partition's fields"
    rows = re.search(r"\| `workers` \| a list of `\{([a-z_, ]+)\}`", status).group(1).split(", ")
    assert rows == CONTRACT["status"]["worker_fields"], "a worker row's fields"
    stats = text.split("### `stats`", 1)[1].split("The command's own handle", 1)[0]
    assert re.findall(r"`([a-z_]+)`", stats) == CONTRACT["stats"]["fields"], "the stats fields"
    spec = (REPO / "docs" / "segment-format.md").read_text().split("**Why not.**", 1)[1].split("| Constant |", 1)[0]
    reasons = re.findall(r"^\| `([a-z-]+)` \|", spec, re.M)
    assert ["ready", *reasons] == CONTRACT["status"]["reasons"], "the spec's readiness reasons (section 14)"

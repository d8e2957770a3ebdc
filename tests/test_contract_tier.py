"""The contract tier of `scripts/test --quick`: every reader held to the one contract in about a
minute, before every change. The Go reader's and the Java reader's layout tests (their
constants against docs/segment-format.md's tables), their golden tests (the golden segments
and control areas, golden/) and their contract tests (golden/contract.json's kinds and
fields); with tests/conformance's golden cases (marked `contract` there), which run every
reader's command line over the same goldens. The whole suites run in scripts/test
(tests/test_go_reader.py, tests/test_jvm_reader.py, tests/conformance)."""

from __future__ import annotations

import re

import pytest

from shmtest.toolchains import GO, JAVA, JDK17, MVN, go, mvn

pytestmark = pytest.mark.contract
# the Go tests whose names say layout, golden, contract, kind or status (go test -run)
GO_RUN = "Layout|Golden|Contract|Kind|Status"
JVM_TESTS = ("LayoutTest", "GoldenTest", "ContractTest")


@pytest.mark.skipif(GO is None, reason="go is not installed: the Go reader (go/) is not built or tested")
def test_the_go_readers_layout_golden_and_contract_tests():
    out = go("test", "-count=1", "-v", "-run", GO_RUN, ".")
    ran = re.findall(r"^--- PASS: (\w+)", out, re.M)
    for word in ("Layout", "Golden", "Contract"):
        assert any(word in t for t in ran), f"no Go test of the {word} kind ran: {ran}"


@pytest.mark.skipif(MVN is None or JAVA is None or JDK17 is None,
                    reason="java 17 or mvn is not installed: the Java reader (jvm/) is not built or tested")
def test_the_java_readers_layout_golden_and_contract_tests_on_jdk_17(tmp_path):
    p = mvn(tmp_path, "package", f"-Dshmcache.test.jdk17={JDK17}", f"-Dtest={','.join(JVM_TESTS)}",
            "-Dsurefire.failIfNoSpecifiedTests=false", timeout=600)
    assert p.returncode == 0, f"mvn test failed in jvm/ (reports in {tmp_path}/surefire-reports):\n{p.stdout}\n{p.stderr}"
    ran = {r.name[len("TEST-io.shmcache."):-len(".xml")] for r in (tmp_path / "surefire-reports" / "jdk17").glob("TEST-*.xml")}
    assert ran == set(JVM_TESTS), ran

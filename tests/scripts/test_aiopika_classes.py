"""scripts/aiopika_classes.py and run_aiopika_suite.py's report handling: which failures of
aio-pika's suite count against quorumq, which do not apply, and the per-module summary (pure
functions; no cluster)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def _load(name: str) -> ModuleType:
    sys.path.insert(0, str(SCRIPTS))
    try:
        spec = importlib.util.spec_from_file_location(f"{name}_under_test", SCRIPTS / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(SCRIPTS))


classes = _load("aiopika_classes")
suite = _load("run_aiopika_suite")
EXCHANGE_REFUSAL = (
    "aiormq.exceptions.ConnectionNotImplemented: NOT_IMPLEMENTED - exchange.declare of 'x' "
    "(type direct): exchanges other than the default one (they come with machine v4): "
    "not implemented by quorumq"
)
AUTO_DELETE_REFUSAL = (
    "ConnectionNotImplemented: NOT_IMPLEMENTED - an auto-delete queue (every quorumq queue is a "
    "durable quorum queue): not implemented by quorumq"
)


def test_only_our_own_refusals_make_a_failure_not_count() -> None:
    test = "tests/test_amqp.py::TestCaseAmqp::test_x[connect]"
    assert classes.classify(test, "failed", EXCHANGE_REFUSAL)[0] == "needs_exchanges"
    assert classes.classify(test, "failed", AUTO_DELETE_REFUSAL)[0] == "not_applicable"
    assert classes.classify(test, "failed", "AssertionError: assert b'' == b'x'") == ("failed", "")
    assert classes.classify(test, "failed", "TimeoutError: exchange.declare hung") == ("failed", "")
    assert classes.classify(test, "passed", EXCHANGE_REFUSAL) == ("passed", "")


def test_junit_test_cases_become_node_ids() -> None:
    assert (
        suite.node_id("tests.test_amqp.TestCaseAmqp", "test_x[connect]")
        == "tests/test_amqp.py::TestCaseAmqp::test_x[connect]"
    )
    assert suite.node_id("tests.test_connect", "test_y") == "tests/test_connect.py::test_y"


def test_the_pass_rate_counts_only_tests_that_apply(tmp_path: Path) -> None:
    junit = tmp_path / "junit.xml"
    junit.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="tests.test_a" name="test_ok" />'
        f'<testcase classname="tests.test_a" name="test_ex"><failure message="{EXCHANGE_REFUSAL}">'
        "traceback</failure></testcase>"
        '<testcase classname="tests.test_b" name="test_bug"><error message="boom">tb</error>'
        "</testcase>"
        '<testcase classname="tests.test_b" name="test_skip"><skipped message="s" /></testcase>'
        "</testsuite></testsuites>"
    )
    cases = suite.outcomes(junit)
    summary = suite.summarise(cases)
    assert summary["totals"] == {
        "tests": 4, "applicable": 2, "passed": 1, "failed": 1, "not_applicable": 0,
        "needs_exchanges": 1, "skipped": 1, "pass_rate": 0.5,
    }  # fmt: skip
    assert summary["modules"]["tests/test_b.py"]["failed"][0]["why"] == "boom"
    assert suite.verdict(summary, cases, 0.5) == []
    assert suite.verdict(summary, cases, 0.8) != []

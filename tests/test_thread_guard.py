"""The thread guard (`tests/thread_guard.py`): a thread a test leaves running fails that test,
named; one that ends within the grace, or belongs to a module's fixture, does not."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from tests.thread_guard import describe_thread, leak_report, lingering_threads

ROOT = Path(__file__).resolve().parent.parent


def _parked_here(release: threading.Event) -> None:
    release.wait(30)


def test_a_thread_alive_after_the_grace_is_lingering_one_that_ends_in_it_is_not() -> None:
    """Joined for the grace: the one that ends meanwhile is dropped, the parked one reported."""
    release = threading.Event()
    before = set(threading.enumerate())
    parked = threading.Thread(target=_parked_here, args=(release,), name="parked", daemon=True)
    quick = threading.Thread(target=release.wait, args=(0.2,), name="quick", daemon=True)
    parked.start()
    quick.start()
    try:
        assert lingering_threads(before, grace_s=1.0) == [parked]
        assert not quick.is_alive()
    finally:
        release.set()
        parked.join(5)


def test_threads_that_ran_before_are_not_counted() -> None:
    """A thread alive before the snapshot (a module's fixture) is never reported."""
    release = threading.Event()
    earlier = threading.Thread(target=_parked_here, args=(release,), daemon=True)
    earlier.start()
    try:
        assert lingering_threads(set(threading.enumerate()), grace_s=0.1) == []
    finally:
        release.set()
        earlier.join(5)


def test_the_report_names_the_thread_its_target_and_where_it_waits() -> None:
    release = threading.Event()
    parked = threading.Thread(target=_parked_here, args=(release,), name="parked", daemon=True)
    parked.start()
    try:
        described = describe_thread(parked)
        report = leak_report("tests/x.py::test_y", [parked], 5.0)
    finally:
        release.set()
        parked.join(5)
    target = f"{_parked_here.__module__}._parked_here"  # the module as pytest imported it
    assert described.startswith(f"parked (target {target}, daemon) at {__file__}:")
    assert described.endswith(" in _parked_here")  # threading's own frames left out
    assert report.splitlines()[:2] == [
        "tests/x.py::test_y left 1 thread(s) running 5 s after its teardown:",
        f"  {described}",
    ]


INNER_TESTS = """
import threading
import pytest

PARKED = threading.Event()


@pytest.fixture(scope="module")
def shared():
    thread = threading.Thread(target=PARKED.wait, name="module-fixture", daemon=True)
    thread.start()
    yield thread


@pytest.fixture
def stopped_at_teardown():
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait, name="function-fixture", daemon=True)
    thread.start()
    yield
    stop.set()


def test_leaks(shared):
    threading.Thread(target=PARKED.wait, name="left-behind", daemon=True).start()


def test_ends_in_the_grace(shared, stopped_at_teardown):
    threading.Thread(target=threading.Event().wait, args=(0.1,), daemon=True).start()


def test_failing_and_leaking():
    threading.Thread(target=PARKED.wait, name="after-a-failure", daemon=True).start()
    assert False
"""


def test_the_plugin_fails_a_leaking_test_at_teardown_and_only_it(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real pytest run with the plugin: the leaking tests error at teardown naming their
    thread (also the one that failed already); a module fixture's thread and threads that end
    within the grace pass."""
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    pytester.makeconftest('pytest_plugins = ["tests.thread_guard"]\n')
    pytester.makeini("[pytest]\nthread_grace_s = 0.5\n")
    pytester.makepyfile(test_inner=INNER_TESTS)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2, failed=1, errors=2)
    result.stdout.fnmatch_lines(
        [
            "*ERROR at teardown of test_leaks*",
            "*left 1 thread(s) running 0.5 s after its teardown:",
            "*left-behind (target threading.Event.wait, daemon)",
        ]
    )
    result.stdout.fnmatch_lines(["*ERROR at teardown of test_failing_and_leaking*"])
    assert "after-a-failure (target threading.Event.wait" in result.stdout.str()
    assert "module-fixture" not in result.stdout.str()
    assert "function-fixture" not in result.stdout.str()

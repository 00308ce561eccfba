"""`tests/background.py`: loops stop when their block ends however it ends, errors are counted
with only the first few kept, and a loop that fails pauses instead of spinning."""

from __future__ import annotations

import threading
import time

import pytest

from tests.background import ERROR_PAUSE_S, Background, ErrorRecord


def test_the_error_record_counts_every_error_and_keeps_the_first_few() -> None:
    errors = ErrorRecord(kept_max=3)
    assert not errors
    for number in range(1000):
        errors.add(f"e{number}")
    assert (len(errors), errors.first) == (1000, ["e0", "e1", "e2"])
    assert repr(errors) == "1000 errors, the first 3: ['e0', 'e1', 'e2']"


def test_a_loop_stops_when_the_block_raises() -> None:
    """The test's own exception comes out, and the loop it started is stopped and joined."""
    with pytest.raises(ValueError, match="the test failed"), Background("raising") as background:
        thread = background.start(lambda: background.stop.wait(60), "waiting")
        raise ValueError("the test failed")
    assert background.stop.is_set() and not thread.is_alive()
    assert thread.name == "raising-waiting"


def test_a_failing_loop_pauses_after_each_error_and_its_errors_stay_bounded() -> None:
    """A loop whose every call fails (its cluster gone) records each error and waits
    ERROR_PAUSE_S before the next: a few per tenth of a second, not millions."""

    def failing() -> None:
        while not background.failed("the cluster is gone"):
            pass

    with Background("failing") as background:
        background.start(failing, "loop")
        time.sleep(0.25)
    assert 1 <= background.errors.count <= 0.25 / ERROR_PAUSE_S + 2
    assert len(background.errors.first) <= background.errors.kept_max


def test_an_exception_that_ends_a_loop_is_recorded() -> None:
    def broken() -> None:
        raise RuntimeError("boom")

    with Background("broken") as background:
        background.start(broken, "loop")
    assert background.errors.first == ["broken-loop ended: RuntimeError('boom')"]


def test_finish_names_a_loop_that_ignores_the_stop() -> None:
    release = threading.Event()
    background = Background("deaf", join_timeout_s=0.1)
    background.start(lambda: release.wait(30), "loop")
    try:
        with pytest.raises(
            AssertionError, match=r"still running 0.1 s after the stop: \['deaf-loop'\]"
        ):
            background.finish()
    finally:
        release.set()
        background.threads[0].join(5)

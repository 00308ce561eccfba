"""A pytest plugin: a test fails when a thread it started is still running after its teardown.

A background loop left running by a failed test lives on in the pytest process: one that spun
on errors once grew it to 24 GB and starved every later test until the run was killed, with
nothing naming the culprit. Only threads started after the test's higher-scoped fixtures were
set up are counted (the test's body and its function-scoped fixtures); each gets a grace
period (`thread_grace_s`) to end first, as the client library's threads end shortly after a
close. Loaded for the whole tree by `tests/conftest.py`.
"""

from __future__ import annotations

import sys
import threading
import time
import traceback
from collections.abc import Collection, Iterator

import pytest

GRACE_S_DEFAULT = "5"  # a closed client's reader and ticker end well within this
STACK_FRAMES_SHOWN = 3  # innermost frames of a lingering thread: where it runs or waits
THREADING_FILE = threading.__file__  # its frames (bootstrap, Event.wait) say nothing of a leak


def pytest_addoption(parser: pytest.Parser) -> None:
    """Register the `thread_grace_s` ini option."""
    parser.addini(
        "thread_grace_s",
        "seconds a thread started by a test may take to end after the test's teardown",
        default=GRACE_S_DEFAULT,
    )


@pytest.fixture(autouse=True)
def no_thread_outlives_its_test(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail the test (at teardown) when threads it started are alive once the grace is over.

    Autouse and function-scoped, so set up after every fixture of a higher scope and torn down
    after every other function-scoped one: a module's shared cluster is not counted, a
    function-scoped fixture's threads must be gone when its teardown returns."""
    before = set(threading.enumerate())
    yield
    grace_s = float(str(request.config.getini("thread_grace_s")))
    lingering = lingering_threads(before, grace_s)
    if not lingering:
        return
    report = leak_report(request.node.nodeid, lingering, grace_s)
    _say_now(request.config, report)
    pytest.fail(report, pytrace=False)


def lingering_threads(
    before: Collection[threading.Thread], grace_s: float
) -> list[threading.Thread]:
    """Threads alive now that were not in `before`, still alive after being joined for up to
    `grace_s` in all (threads not started by `threading`, which cannot be joined, are left out)."""
    deadline = time.monotonic() + grace_s
    started = [
        thread
        for thread in threading.enumerate()
        if thread not in before and not isinstance(thread, threading._DummyThread)
    ]
    for thread in started:
        thread.join(max(0.0, deadline - time.monotonic()))
    return [thread for thread in started if thread.is_alive()]


def leak_report(nodeid: str, threads: list[threading.Thread], grace_s: float) -> str:
    """What the failing test says: each lingering thread's name, target and current frames."""
    lines = [f"{nodeid} left {len(threads)} thread(s) running {grace_s:g} s after its teardown:"]
    lines += [f"  {describe_thread(thread)}" for thread in threads]
    lines.append("stop and join every thread a test starts, whatever happens (try/finally)")
    return "\n".join(lines)


def describe_thread(thread: threading.Thread) -> str:
    """`name (target ..., daemon) at file:line in function <- ...` for one live thread."""
    target = getattr(thread, "_target", None)  # Thread keeps it while `run` runs
    if target is None:  # a subclass overriding `run`
        what = f"{type(thread).__module__}.{type(thread).__qualname__}.run"
    else:
        name = getattr(target, "__qualname__", None) or repr(target)
        what = f"{getattr(target, '__module__', None) or '?'}.{name}"
    kind = "daemon" if thread.daemon else "non-daemon"
    frame = sys._current_frames().get(thread.ident or -1)
    stack = [] if frame is None else traceback.extract_stack(frame)
    shown = [s for s in stack if s.filename != THREADING_FILE][-STACK_FRAMES_SHOWN:]
    where = " <- ".join(f"{s.filename}:{s.lineno} in {s.name}" for s in reversed(shown))
    return f"{thread.name} (target {what}, {kind})" + (f" at {where}" if where else "")


def _say_now(config: pytest.Config, text: str) -> None:
    """Write `text` on the terminal at once, not only in the summary: a run that dies later
    (out of memory, as the leak may make it) still names the test and its threads."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    capture = config.pluginmanager.get_plugin("capturemanager")
    if reporter is None or capture is None:
        return
    with capture.global_and_fixture_disabled():
        reporter.write_line(text, red=True, bold=True)

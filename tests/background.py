"""Threads a test runs beside its own body (traffic, a killer, an acker): stopped and joined
however the test ends, pausing after an error, and keeping a bounded record of the errors.

A loop left running by a failed test, retrying at full speed against a stopped cluster and
appending every error to a list, once grew the pytest process to 24 GB (`tests/thread_guard.py`
now fails such a test; this module is how a test avoids being one).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from types import TracebackType

ERRORS_KEPT_MAX = 20  # messages kept; the rest are only counted
ERROR_PAUSE_S = 0.05  # a loop's pause after an error: a cluster that is gone must not be spun on
JOIN_TIMEOUT_S = 60.0  # for each thread once stopped (a client call in flight may need its timeout)


class ErrorRecord:
    """How many errors the loops met, and the first ERRORS_KEPT_MAX messages (thread-safe).
    False while empty, so `assert not errors, errors` reads as before."""

    def __init__(self, kept_max: int = ERRORS_KEPT_MAX) -> None:
        self.kept_max = kept_max
        self.count = 0
        self.first: list[str] = []
        self._lock = threading.Lock()

    def add(self, message: str) -> None:
        """Count one error; keep its message if fewer than `kept_max` are kept."""
        with self._lock:
            self.count += 1
            if len(self.first) < self.kept_max:
                self.first.append(message)

    def __len__(self) -> int:
        return self.count

    def __repr__(self) -> str:
        with self._lock:
            return f"{self.count} errors, the first {len(self.first)}: {self.first!r}"


class Background:
    """Loops on named daemon threads until `stop` is set: by `finish`, or when the `with`
    block ends however it ends. A loop checks `stop` and calls `failed` after an error (it
    records the error and pauses); an exception that ends a loop is recorded too."""

    def __init__(self, name: str, join_timeout_s: float = JOIN_TIMEOUT_S) -> None:
        self.name = name
        self.join_timeout_s = join_timeout_s
        self.stop = threading.Event()
        self.errors = ErrorRecord()
        self.threads: list[threading.Thread] = []

    def start(self, target: Callable[[], object], what: str) -> threading.Thread:
        """Run `target` on a thread named `<name>-<what>`."""
        name = f"{self.name}-{what}"
        thread = threading.Thread(target=self._run, args=(target, name), name=name, daemon=True)
        self.threads.append(thread)
        thread.start()
        return thread

    def _run(self, target: Callable[[], object], name: str) -> None:
        try:
            target()
        except BaseException as err:  # reported through `errors`, not lost in the thread
            self.errors.add(f"{name} ended: {err!r}")

    def failed(self, message: str) -> bool:
        """Record `message`, then pause ERROR_PAUSE_S (cut short by `stop`); True once stopped."""
        self.errors.add(message)
        return self.stop.wait(ERROR_PAUSE_S)

    def finish(self) -> None:
        """Set `stop` and join every thread; AssertionError naming any still running."""
        self.stop.set()
        for thread in self.threads:
            thread.join(self.join_timeout_s)
        running = [thread.name for thread in self.threads if thread.is_alive()]
        assert not running, f"still running {self.join_timeout_s:g} s after the stop: {running}"

    def __enter__(self) -> Background:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if exc is None:
            self.finish()
            return
        # the test's own failure is what its reader needs: never replace it by ours (the
        # thread guard names any thread still running)
        with contextlib.suppress(AssertionError):
            self.finish()

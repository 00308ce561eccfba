"""A test-only machine one version past the latest released, registered as unreleased, so the
unreleased-version mechanism (`fifo.UNRELEASED_VERSIONS`, a node's
`QUORUMQ_ALLOW_UNRELEASED_MACHINE`, the CLI checks) stays tested while no real version is
unreleased.

`register(monkeypatch)` adds it to the version tables for one test (undone after it): the latest
machine's behaviour under the next number, reached from the latest by a conversion that only
renumbers the state.
"""

from __future__ import annotations

import pytest

import fifo
import fifo.versions
from fifo.commands import Command
from fifo.effects import Effect
from fifo.meta import Meta
from fifo.replies import Reply
from fifo.state import State

TEST_VERSION = fifo.LATEST_VERSION + 1


class UnreleasedMachine:
    """The latest released machine under the number `TEST_VERSION` (test only)."""

    def __init__(self) -> None:
        self.inner = fifo.machine_for(fifo.LATEST_VERSION)

    @property
    def version(self) -> int:
        """The test-only version number."""
        return TEST_VERSION

    def init(self) -> State:
        """An empty state of the latest machine, numbered `TEST_VERSION`."""
        state = self.inner.init()
        state.version = TEST_VERSION
        return state

    def apply(self, meta: Meta, command: object, state: State) -> tuple[Reply, list[Effect]]:
        """The latest machine's apply."""
        return self.inner.apply(meta, command, state)

    def due_commands(self, state: State, now_ms: int) -> list[Command]:
        """The latest machine's timers."""
        return self.inner.due_commands(state, now_ms)

    def next_deadline_ms(self, state: State) -> int | None:
        """The latest machine's next deadline."""
        return self.inner.next_deadline_ms(state)


def renumber(state: State, meta: Meta) -> State:
    """The conversion from the latest version: a copy of the state, renumbered."""
    copy = fifo.convert(state, fifo.LATEST_VERSION, fifo.LATEST_VERSION, meta)
    copy.version = TEST_VERSION
    return copy


def register(monkeypatch: pytest.MonkeyPatch) -> int:
    """Add the test-only machine to the tables as unreleased (for this test); its number."""
    monkeypatch.setitem(fifo.versions.MACHINES, TEST_VERSION, UnreleasedMachine())
    monkeypatch.setitem(fifo.versions.CONVERSIONS, TEST_VERSION, renumber)
    for module in (fifo, fifo.versions):
        monkeypatch.setattr(module, "UNRELEASED_VERSIONS", (TEST_VERSION,))
    return TEST_VERSION

"""A handler that raises is never hidden: the fuzzer reports it for every version.

v1-v3 keep their frozen catch-all (a raising handler is answered `invalid_argument: rejected:
KeyError`); the fuzzer counts that reply as the violation `apply_rejected`. v4 has no catch-all:
the exception leaves `apply` and the fuzzer reports `apply_raised`. Either way the run stops there
and `fifo.fuzz.shrink` gives the short log that still crashes. The raising handler is planted
with monkeypatch in the test only; the frozen code is unchanged.
"""

from __future__ import annotations

from typing import Any

import pytest

import fifo
import fifo.fuzz
from fifo.commands import Purge

STEPS = 300
SEED = 1  # its generated logs purge early for every version (checked below)


def plant_raising_purge(monkeypatch: pytest.MonkeyPatch, version: int) -> None:
    """Make `version`'s Purge handler raise KeyError (as the issue's experiment did)."""

    def raising(*_args: Any) -> Any:
        raise KeyError("planted")

    handlers = fifo.machine_for(version).queue_handlers  # type: ignore[attr-defined]
    monkeypatch.setitem(handlers, Purge, raising)


@pytest.mark.parametrize("version", [1, 2, 3, 4])
def test_the_fuzzer_finds_a_raising_handler(monkeypatch: pytest.MonkeyPatch, version: int) -> None:
    """Planted in any version, a raising handler is a violation at the first Purge, and the
    shrunk log is a handful of entries ending with that Purge."""
    log = fifo.fuzz.generate_log(SEED, STEPS, version)
    first_purge = next(i for i, (_meta, command) in enumerate(log) if type(command) is Purge)
    plant_raising_purge(monkeypatch, version)
    result = fifo.fuzz.run(SEED, STEPS, version)
    expected = "apply_raised" if version >= 4 else "apply_rejected"
    assert [v.invariant for v in result.violations] == [expected]
    assert result.violations[0].step == first_purge and "Purge" in result.violations[0].command
    shrunk = fifo.fuzz.shrink(SEED, STEPS, version)
    assert shrunk is not None and shrunk.reproducible and shrunk.invariant == expected
    last = shrunk.entries[-1]
    assert not isinstance(last, fifo.fuzz.Upgrade) and type(last[1]) is Purge
    assert len(shrunk.entries) <= 3  # a declare and the purge (an upgrade at most)


@pytest.mark.parametrize("version", [1, 2, 3, 4])
def test_without_the_plant_the_same_run_is_clean(version: int) -> None:
    """The same seed without the planted bug has no violation (the plant is what is found)."""
    assert fifo.fuzz.run(SEED, STEPS, version).violations == []


def test_v4_apply_lets_an_exception_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """v4's apply has no catch-all: the planted KeyError itself leaves apply."""
    plant_raising_purge(monkeypatch, 4)
    state = fifo.init_state(4)
    fifo.apply(fifo.Meta(1, 1, 10, 4), fifo.commands.DeclareQueue("q"), state)
    with pytest.raises(KeyError, match="planted"):
        fifo.apply(fifo.Meta(2, 1, 20, 4), Purge("q"), state)

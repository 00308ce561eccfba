"""v4 snapshots keep their bytes: logs replay to the snapshot digests main's code computed.

The pins (`fixtures/v4_snapshot_pins.json`) were written by `tests/fifo/v4_snapshot_pins.py
generate` run with main's code on PYTHONPATH, before plain waiting messages were kept as packed
ints; see that script for the logs and what a checkpoint covers.
"""

from __future__ import annotations

import json
from functools import cache
from typing import Any

import pytest

import tests.fifo.v4_snapshot_pins as pins


@cache
def pinned() -> dict[str, Any]:
    """The pins, read once."""
    loaded: dict[str, Any] = json.loads(pins.PINS.read_text())
    return loaded


@cache
def families() -> dict[str, list[tuple[str, list[Any]]]]:
    """The pinned logs by family, built once."""
    out: dict[str, list[tuple[str, list[Any]]]] = {}
    for name, entries in pins.all_logs():
        out.setdefault(name.rsplit("-", 1)[0], []).append((name, entries))
    return out


FAMILIES = ["v4-corpus", "v3-corpus-as-v4", "fuzz", "backlog"]


def test_every_pinned_log_is_built() -> None:
    """The logs built today are exactly the pinned ones (same names, same bytes)."""
    built = {name: entries for logs in families().values() for name, entries in logs}
    assert sorted(built) == sorted(pinned())
    assert set(families()) == set(FAMILIES)


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_snapshots_match_the_pins(family: str) -> None:
    """Every log's snapshot digests, outputs and next deadlines at every checkpoint chain to the
    digest main's code pinned."""
    for name, entries in families()[family]:
        assert pins.pin(entries) == pinned()[name], f"{name} differs from main's pin"


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_restored_states_match_the_pins(family: str) -> None:
    """A state replaced by its restored snapshot every 50 entries (every 10 for a corpus log)
    goes on to the same pinned digests (restore may give either form of a plain message): every
    fuzz log, every other backlog log, one corpus log in ten."""
    logs = families()[family]
    every = 5 if family in ("fuzz", "backlog") else 1
    step = {"fuzz": 1, "backlog": 2}.get(family, 10)
    for name, entries in logs[::step]:
        got = pins.pin(entries, restart_every=every)
        assert got == pinned()[name], f"{name}: a restored state went on differently"

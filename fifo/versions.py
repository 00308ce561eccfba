"""The table of machine versions: which machine runs a state, and conversions.

The only place that maps a version number to code. A new version adds its machine here and its
conversion step to `CONVERSIONS` (see fifo/README.md, "How to add a machine version").
`SUPPORTED_VERSIONS` are the released ones (a node runs at most the newest of them);
`UNRELEASED_VERSIONS` can be selected (`machine_for`, `init_state`, `convert`) but a node runs
them only when allowed explicitly (`cluster.node.server.supported_version`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from fifo.codec import restore, snapshot
from fifo.commands import Command
from fifo.effects import Effect
from fifo.errors import UnsupportedVersionError
from fifo.meta import Meta
from fifo.replies import Reply
from fifo.state import State
from fifo.v1.registry import MachineV1
from fifo.v2.convert import convert_v1_to_v2
from fifo.v2.registry import MachineV2
from fifo.v3.convert import convert_v2_to_v3
from fifo.v3.registry import MachineV3
from fifo.v4.convert import convert_v3_to_v4
from fifo.v4.registry import MachineV4


class Machine(Protocol):
    """What every version's machine offers (each version is its own code, not a subclass)."""

    @property
    def version(self) -> int:
        """The machine version number."""

    def init(self) -> State:
        """An empty state shaped for this version."""

    def apply(self, meta: Meta, command: object, state: State) -> tuple[Reply, list[Effect]]:
        """Apply one command to the state (mutated in place)."""

    def due_commands(self, state: State, now_ms: int) -> list[Command]:
        """Timer commands the leader should submit at `now_ms`."""

    def next_deadline_ms(self, state: State) -> int | None:
        """The earliest time at which `due_commands` returns something, or None."""


SUPPORTED_VERSIONS: tuple[int, ...] = (1, 2, 3, 4)  # released
LATEST_VERSION = 4  # the newest released version
UNRELEASED_VERSIONS: tuple[int, ...] = ()  # selectable, not shipped (fifo/README.md)
MACHINES: dict[int, Machine] = {1: MachineV1(), 2: MachineV2(), 3: MachineV3(), 4: MachineV4()}
# CONVERSIONS[n] turns a state of version n - 1 into one of version n
CONVERSIONS: dict[int, Callable[[State, Meta], State]] = {
    2: convert_v1_to_v2,
    3: convert_v2_to_v3,
    4: convert_v3_to_v4,
}


def machine_for(version: int) -> Machine:
    """The machine of a version (`.version`, `.apply(meta, cmd, state)`, `.init()`), released
    or not."""
    m = MACHINES.get(version) if type(version) is int else None
    if m is None:
        raise UnsupportedVersionError(f"machine version {version!r} is not supported")
    return m


def convert(state: State, from_version: int, to_version: int, meta: Meta) -> State:
    """Chain conversions one version at a time; pure (returns a new state)."""
    if state.version != from_version or not 1 <= from_version <= to_version <= max(MACHINES):
        raise UnsupportedVersionError(
            f"cannot convert a v{state.version} state from v{from_version} to v{to_version}"
        )
    if from_version == to_version:
        return restore(snapshot(state))
    for version in range(from_version + 1, to_version + 1):
        state = CONVERSIONS[version](state, meta)
    return state

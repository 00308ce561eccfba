"""The table of shipped machine versions: which frozen machine runs a state, and conversions.

The only place that maps a version number to code. A new version adds its machine here and its
conversion step to `CONVERSIONS` (see fifo/README.md, "How to add a machine version").
"""

from __future__ import annotations

from collections.abc import Callable

from fifo.codec import restore, snapshot
from fifo.errors import UnsupportedVersionError
from fifo.meta import Meta
from fifo.state import State
from fifo.v1.registry import MachineV1
from fifo.v2.convert import convert_v1_to_v2
from fifo.v2.registry import MachineV2
from fifo.v3.convert import convert_v2_to_v3
from fifo.v3.registry import MachineV3

Machine = MachineV1  # every version's machine is (a subclass of) the v1 machine
SUPPORTED_VERSIONS: tuple[int, ...] = (1, 2, 3)
LATEST_VERSION = 3
MACHINES: dict[int, Machine] = {1: MachineV1(), 2: MachineV2(), 3: MachineV3()}
# CONVERSIONS[n] turns a state of version n - 1 into one of version n
CONVERSIONS: dict[int, Callable[[State, Meta], State]] = {
    2: convert_v1_to_v2,
    3: convert_v2_to_v3,
}


def machine_for(version: int) -> Machine:
    """The frozen machine of a version (`.version`, `.apply(meta, cmd, state)`, `.init()`)."""
    m = MACHINES.get(version) if type(version) is int else None
    if m is None:
        raise UnsupportedVersionError(f"machine version {version!r} is not supported")
    return m


def convert(state: State, from_version: int, to_version: int, meta: Meta) -> State:
    """Chain conversions one version at a time; pure (returns a new state)."""
    if state.version != from_version or not 1 <= from_version <= to_version <= LATEST_VERSION:
        raise UnsupportedVersionError(
            f"cannot convert a v{state.version} state from v{from_version} to v{to_version}"
        )
    if from_version == to_version:
        return restore(snapshot(state))
    for version in range(from_version + 1, to_version + 1):
        state = CONVERSIONS[version](state, meta)
    return state

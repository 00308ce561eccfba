"""quorumq's deterministic replicated queue state machine (rabbit_fifo semantics), pure.

Public API: build a state with `init_state`, feed log entries to `apply`, read it with the query
functions, persist it with `snapshot` / `restore`, compare replicas with `digest`.
"""

from __future__ import annotations

from fifo.bodies import live_entry_indexes, referenced_bodies
from fifo.codec import decode, digest, encode, restore, snapshot
from fifo.effects import Effect
from fifo.errors import CodecError, FifoError, UnsupportedVersionError
from fifo.meta import Meta
from fifo.queries import (
    ConsumerGroupInfo,
    ConsumerGroupOverview,
    ConsumerInfo,
    GroupInfo,
    MessageInfo,
    QueueOverview,
    consumer_group,
    consumer_groups,
    consumers,
    group_config,
    groups,
    list_queues,
    messages,
    overview,
    partition_count,
    state_version,
)
from fifo.replies import Error, Reply
from fifo.state import State
from fifo.timers import due_commands, next_deadline_ms
from fifo.v2.convert import convert_v1_to_v2
from fifo.versions import (
    LATEST_VERSION,
    MACHINES,
    SUPPORTED_VERSIONS,
    UNRELEASED_VERSIONS,
    Machine,
    convert,
    machine_for,
)


def init_state(version: int = 1) -> State:
    """An empty state shaped for machine `version`."""
    return machine_for(version).init()


def apply(meta: Meta, command: object, state: State) -> tuple[Reply, list[Effect]]:
    """Apply one command with the machine the state is shaped for.

    Mutates `state` in place; an Error reply leaves it unchanged. The state's version (not
    `meta.machine_version`) picks the machine: the caller converts the state at an upgrade.
    Bad input is an Error reply; an exception is a bug (v4 lets it out, v1-v3 answer it
    `invalid_argument: rejected: ...`; the fuzzer reports both).
    """
    try:
        m = MACHINES[state.version]
    except (AttributeError, KeyError, TypeError):
        return Error("unsupported", "not a fifo state of a supported version"), []
    return m.apply(meta, command, state)


__all__ = [
    "LATEST_VERSION",
    "MACHINES",
    "SUPPORTED_VERSIONS",
    "UNRELEASED_VERSIONS",
    "CodecError",
    "ConsumerGroupInfo",
    "ConsumerGroupOverview",
    "ConsumerInfo",
    "FifoError",
    "GroupInfo",
    "Machine",
    "MessageInfo",
    "Meta",
    "QueueOverview",
    "State",
    "UnsupportedVersionError",
    "apply",
    "consumer_group",
    "consumer_groups",
    "consumers",
    "convert",
    "convert_v1_to_v2",
    "decode",
    "digest",
    "due_commands",
    "encode",
    "group_config",
    "groups",
    "init_state",
    "list_queues",
    "live_entry_indexes",
    "machine_for",
    "messages",
    "next_deadline_ms",
    "overview",
    "partition_count",
    "referenced_bodies",
    "restore",
    "snapshot",
    "state_version",
]

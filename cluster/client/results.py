"""Typed query results: the node answers with plain maps; these rebuild the machine's classes.

Nodes encode `fifo.queries` results as maps with a `type` tag (`cluster.node.queries.plain`);
fields this client does not know (a newer node) are ignored, missing ones take their defaults.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

from cluster import protocol
from cluster.errors import ProtocolError
from fifo.commands import ConnectionId, ConsumerId, QueueConfig
from fifo.queries import ConsumerInfo, GroupInfo, MessageInfo, QueueOverview

_T = TypeVar("_T")
_TYPES: dict[str, type[Any]] = {
    cls.__name__: cls
    for cls in (
        QueueOverview,
        ConsumerInfo,
        MessageInfo,
        QueueConfig,
        ConsumerId,
        ConnectionId,
        GroupInfo,
    )
}


def _bad(what: str, value: object) -> ProtocolError:
    return ProtocolError(protocol.BAD_FRAME, f"a query answered {what} with {value!r}")


def _rebuild(value: Any) -> Any:
    if isinstance(value, dict) and value.get("type") in _TYPES:
        cls = _TYPES[value["type"]]
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: _rebuild(v) for k, v in value.items() if k in names})
    if isinstance(value, list):
        return tuple(_rebuild(v) for v in value)  # the machine's classes hold tuples
    return value


def _typed(value: object, cls: type[_T]) -> _T:
    try:
        rebuilt = _rebuild(value)
    except TypeError as err:  # a required field missing
        raise _bad(cls.__name__, value) from err
    if not isinstance(rebuilt, cls):
        raise _bad(cls.__name__, value)
    return rebuilt


def overview(value: object) -> QueueOverview | None:
    """One queue's overview (None: no such queue)."""
    return None if value is None else _typed(value, QueueOverview)


def overviews(value: object) -> list[QueueOverview]:
    """The overview of every queue."""
    if not isinstance(value, list):
        raise _bad("overview", value)
    return [_typed(item, QueueOverview) for item in value if item is not None]


def consumers(value: object) -> dict[str, list[ConsumerInfo]]:
    """The consumers of each queue asked for, by queue name."""
    if not isinstance(value, dict):
        raise _bad("consumers", value)
    out: dict[str, list[ConsumerInfo]] = {}
    for queue, items in value.items():
        if not isinstance(items, list):
            raise _bad("consumers", value)
        out[str(queue)] = [_typed(item, ConsumerInfo) for item in items]
    return out


def messages(value: object) -> list[MessageInfo]:
    """Peeked messages."""
    if not isinstance(value, list):
        raise _bad("messages", value)
    return [_typed(item, MessageInfo) for item in value]


def groups(value: object) -> list[GroupInfo]:
    """The tracked message groups of a grouped queue (machine v3)."""
    if not isinstance(value, list):
        raise _bad("groups", value)
    return [_typed(item, GroupInfo) for item in value]


def names(value: object) -> list[str]:
    """Queue names."""
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise _bad("queues", value)
    return [str(item) for item in value]


def mapping(value: object, what: str) -> dict[str, object]:
    """A status-like map (status, machine, admin results)."""
    if not isinstance(value, dict):
        raise _bad(what, value)
    return {str(k): v for k, v in value.items()}

"""fifo's codec on the hot path (Enqueue, Settle / Return / Discard, Deliver).

Encoding is `fifo.wire`'s (derived from the codec's schemas, tested byte-for-byte against the
generic encoder). Decoding adds one path here for the command every publish costs three times
(the leader's session, then each follower's apply): a well-formed `Enqueue`. It reads the blob
with the same cbor2 call as `fifo.codec.Codec.decode`, checks it with the schema's own
predicates and builds it with the schema's own constructors, skipping only the generic per-tag
dispatch. Anything else, and any Enqueue this path is not sure of, goes to `fifo.decode`, so the
result (object or CodecError) is always exactly fifo's.

The `ConnectionId` of an Enqueue is shared between the commands of one connection (a small
bounded cache): it is an immutable value, and the leader already binds the session's one
object into every command of the connection.
"""

from __future__ import annotations

from typing import Any

import cbor2

from fifo.codec import CODEC
from fifo.commands import ConnectionId, Enqueue
from fifo.wire import decode_command as _fifo_decode
from fifo.wire import encode_command, encode_effect

__all__ = ["decode_command", "encode_command", "encode_effect"]

CONNECTIONS_CACHED_MAX = 4096  # distinct connections remembered before the cache starts over

# the class cbor2's C decoder builds for unknown tags (as fifo.codec finds it)
_TAG = type(cbor2.loads(cbor2.dumps(cbor2.CBORTag(99_999, []))))
_ENQUEUE = CODEC.builders[CODEC.tag_by_class[Enqueue]]
_CONNECTION = CODEC.builders[CODEC.tag_by_class[ConnectionId]]
_ENQUEUE_TAG = _ENQUEUE.schema.tag
_CONNECTION_TAG = _CONNECTION.schema.tag
_ENQUEUE_WIDTH = _ENQUEUE.width
_CONNECTION_WIDTH = _CONNECTION.width
_CONNECTION_AT = Enqueue.__match_args__.index("connection")
_CONNECTIONS: dict[tuple[Any, ...], ConnectionId] = {}
if _ENQUEUE.deep != (_CONNECTION_AT,) or _CONNECTION.deep != ():  # pragma: no cover
    raise ImportError("raft.fastcodec: the Enqueue schema changed; review the fast path")


def decode_command(blob: bytes) -> Any:
    """`fifo.decode(blob)` for one command blob: the same object, or the same CodecError."""
    if type(blob) is bytes:
        try:
            raw = cbor2.loads(blob, max_depth=64)
        except Exception:
            raw = None  # fifo raises its own CodecError for it
        if type(raw) is _TAG and raw.tag == _ENQUEUE_TAG:
            fields = raw.value
            if type(fields) is tuple and len(fields) == _ENQUEUE_WIDTH:
                command = _enqueue(fields)
                if command is not None:
                    return command
    return _fifo_decode(blob)


def _enqueue(fields: tuple[Any, ...]) -> Enqueue | None:
    """The Enqueue of a full-width field tuple, or None if fifo's generic path must judge it."""
    connection = fields[_CONNECTION_AT]
    if type(connection) is _TAG:
        value = connection.value
        if (
            connection.tag != _CONNECTION_TAG
            or type(value) is not tuple
            or len(value) != _CONNECTION_WIDTH
        ):
            return None
        if not _CONNECTION.check_all(value):  # type: ignore[arg-type]
            return None  # checked first: 3 == 3.0 == True would share a cache slot
        bound = _CONNECTIONS.get(value)
        if bound is None:
            bound = _CONNECTION.make(*value)
            if len(_CONNECTIONS) >= CONNECTIONS_CACHED_MAX:
                _CONNECTIONS.clear()
            _CONNECTIONS[value] = bound
        fields = (*fields[:_CONNECTION_AT], bound, *fields[_CONNECTION_AT + 1 :])
    elif type(connection) in (list, tuple, dict):
        return None
    if not _ENQUEUE.check_all(fields):  # type: ignore[arg-type]
        return None
    command: Enqueue = _ENQUEUE.make(*fields)
    return command

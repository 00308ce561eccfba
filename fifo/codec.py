"""CBOR codec: one explicit tag per class (never pickle), snapshots and the state digest.

A tagged value is the array of the dataclass fields in declaration order. Tag numbers are
frozen: never renumber, only append.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections import deque
from typing import Any

import cbor2

from fifo import commands as c
from fifo import effects as e
from fifo import replies as r
from fifo.errors import CodecError
from fifo.meta import Meta
from fifo.state import Consumer, Enqueuer, Message, Queue, State

TAG_BASE = 71_000
# Frozen table: tag = TAG_BASE + position. Append only.
_CLASSES: tuple[type, ...] = (
    c.ConnectionId, c.ConsumerId, c.QueueConfig, c.SimplePrefetch, c.Credited, c.Cancel,
    c.Remove, c.Dequeue, c.DeclareQueue, c.DeleteQueue, c.UpdateConfig, c.Enqueue,
    c.RegisterEnqueuer, c.Checkout, c.Settle, c.Return, c.Discard, c.Modify, c.Credit,
    c.RenewLocks, c.Purge, c.EvalConsumerTimeouts, c.ConsumerDisconnectedTimeout, c.Expire,
    c.ConnectionDown, c.NodeDown, c.NodeUp, Meta,
    r.Ok, r.Error, r.NotEnqueued, r.RejectPublish, r.DeclareOk, r.DeleteOk, r.CheckoutOk,
    r.CancelOk, r.DequeuedMessage, r.DequeueOk, r.PurgeOk,
    e.Delivery, e.Deliver, e.CreditReply, e.QueueStatus, e.Released, e.ConsumerUpdate,
    e.ConsumerCancelled, e.DeadLettered,
)  # fmt: skip
_TAG_BY_CLASS: dict[type, int] = {cls: TAG_BASE + i for i, cls in enumerate(_CLASSES)}
_CLASS_BY_TAG: dict[int, type] = {tag: cls for cls, tag in _TAG_BY_CLASS.items()}
_FIELDS: dict[type, tuple[str, ...]] = {
    cls: tuple(f.name for f in dataclasses.fields(cls)) for cls in _CLASSES
}
SNAPSHOT_FORMAT = 1


def _default(encoder: Any, value: Any) -> None:
    tag = _TAG_BY_CLASS.get(type(value))
    if tag is None:
        raise CodecError(f"cannot encode {type(value).__name__}")
    encoder.encode(cbor2.CBORTag(tag, [getattr(value, n) for n in _FIELDS[type(value)]]))


def _tuples(value: Any) -> Any:
    if isinstance(value, list | tuple):
        return tuple(_tuples(v) for v in value)
    return value


def _tag_hook(*args: Any) -> Any:
    # cbor2 5.x passes (decoder, tag), 6.x passes (tag, immutable): find the tag
    tag = next((a for a in args if isinstance(a, cbor2.CBORTag)), None)
    if tag is None:
        raise CodecError("tag hook called without a tag")
    cls = _CLASS_BY_TAG.get(tag.tag)
    if cls is None:
        raise CodecError(f"unknown tag {tag.tag}")
    names = _FIELDS[cls]
    if not isinstance(tag.value, list | tuple) or len(tag.value) != len(names):
        raise CodecError(f"bad field list for {cls.__name__}")
    return cls(*(_tuples(v) for v in tag.value))


def encode(obj: object) -> bytes:
    """Encode a command, reply, effect, spec, config, id or Meta (or a list of them) to CBOR."""
    try:
        return bytes(cbor2.dumps(obj, default=_default, canonical=True))
    except CodecError:
        raise
    except Exception as exc:  # cbor2 raises several types for unencodable values
        raise CodecError(str(exc)) from exc


def decode(data: bytes) -> Any:
    """Decode bytes made by `encode`; any malformed input raises CodecError."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise CodecError("decode expects bytes")
    try:
        return cbor2.loads(bytes(data), tag_hook=_tag_hook, max_depth=64)
    except CodecError:
        raise
    except Exception as exc:  # cbor2 raises several types on malformed input
        raise CodecError(str(exc)) from exc


# --- snapshots ----------------------------------------------------------------------------------


def _msg_out(m: Message) -> list[Any]:
    return [m.body, m.expiry, m.delivery_count, m.acquired_count, list(m.annotations), m.lock]


def _msg_in(v: Any) -> Message:
    m = Message(v[0], v[1])
    m.delivery_count, m.acquired_count, m.annotations, m.lock = v[2], v[3], _tuples(v[4]), v[5]
    return m


def _consumer_out(x: Consumer) -> list[Any]:
    return [
        x.key, x.tag, x.connection, x.attach_index, x.credited, x.prefetch, x.priority,
        x.timeout_ms, x.once, x.status, x.suspected_since, x.disconnected_fired,
        list(x.timed_out), x.next_msg_id, [[i, _msg_out(m)] for i, m in x.checked_out.items()],
        x.credit, x.delivery_count, x.drain, x.in_service,
    ]  # fmt: skip


def _consumer_in(v: Any) -> Consumer:
    x = Consumer(v[0], v[1], v[2], v[3])
    (x.credited, x.prefetch, x.priority, x.timeout_ms, x.once, x.status, x.suspected_since,
     x.disconnected_fired) = v[4:12]  # fmt: skip
    x.timed_out = list(v[12])
    x.next_msg_id = v[13]
    x.checked_out = {i: _msg_in(m) for i, m in v[14]}
    x.credit, x.delivery_count, x.drain, x.in_service = v[15:19]
    return x


def _enqueuer_out(x: Enqueuer) -> list[Any]:
    return [x.name, x.connection, x.next_seq, x.status, x.blocked, x.down_index]


def _enqueuer_in(v: Any) -> Enqueuer:
    x = Enqueuer(v[0], v[1])
    x.next_seq, x.status, x.blocked, x.down_index = v[2:6]
    return x


def _queue_out(q: Queue) -> list[Any]:
    return [
        q.name, q.config, [_msg_out(m) for m in q.ready], [_msg_out(m) for m in q.returns],
        q.messages_total, q.bytes_ready, q.bytes_checkout,
        [_enqueuer_out(x) for x in q.enqueuers.values()], q.blocked_count,
        [_consumer_out(x) for x in q.consumers.values()], [_consumer_out(x) for x in q.waiting],
        [[p, list(keys)] for p, keys in q.service.items()], q.last_active,
    ]  # fmt: skip


def _queue_in(v: Any) -> Queue:
    q = Queue(v[0], v[1], v[12])
    q.ready = deque(_msg_in(m) for m in v[2])
    q.returns = deque(_msg_in(m) for m in v[3])
    q.messages_total, q.bytes_ready, q.bytes_checkout = v[4:7]
    q.enqueuers = {x.name: x for x in (_enqueuer_in(e) for e in v[7])}
    q.blocked_count = v[8]
    q.consumers = {x.key: x for x in (_consumer_in(e) for e in v[9])}
    q.waiting = [_consumer_in(e) for e in v[10]]
    q.service = {p: deque(keys) for p, keys in v[11]}
    for x in (*q.consumers.values(), *q.waiting):
        q.key_by_id[c.ConsumerId(x.tag, x.connection)] = x.key
    return q


def snapshot(state: State) -> bytes:
    """Encode the whole state (with its machine version) as canonical CBOR."""
    body = [SNAPSHOT_FORMAT, state.version, state.last_time,
            [_queue_out(q) for q in state.queues.values()]]  # fmt: skip
    return bytes(cbor2.dumps(body, default=_default, canonical=True))


def restore(data: bytes) -> State:
    """Rebuild a state from `snapshot` bytes; malformed input raises CodecError."""
    try:
        v = cbor2.loads(bytes(data), tag_hook=_tag_hook)
        if not isinstance(v, list) or v[0] != SNAPSHOT_FORMAT:
            raise CodecError("not a fifo snapshot")
        state = State(v[1])
        state.last_time = v[2]
        state.queues = {q.name: q for q in (_queue_in(x) for x in v[3])}
        return state
    except CodecError:
        raise
    except Exception as exc:  # any shape error in the snapshot
        raise CodecError(f"bad snapshot: {exc}") from exc


def digest(state: State) -> str:
    """Hex SHA-256 of the canonical snapshot encoding; computed on demand only."""
    return hashlib.sha256(snapshot(state)).hexdigest()


decode_unchecked = decode

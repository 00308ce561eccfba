"""Fast paths of fifo's codec for the messages that dominate traffic: Enqueue (encode, decode),
Settle / Return / Discard (decode) and Deliver (encode).

fifo's codec calls a Python hook for every tagged value; an Enqueue (with its ConnectionId) is
two hooks and two frozen-dataclass constructions. Here the CBOR is built or parsed by cbor2's C
code and the objects are constructed directly. Each fast path is used only if it gives exactly
fifo's result on samples at import (else fifo's codec is used), and any blob whose shape is not
the expected one goes through fifo's codec, so results never differ.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import cbor2

import fifo
from fifo.commands import ConnectionId, Discard, Enqueue, Return, Settle
from fifo.effects import Deliver, Delivery

_ENQUEUE_FIELDS = ("queue", "body", "enqueuer", "seq", "connection", "ttl_ms")
_CONNECTION_FIELDS = ("node", "incarnation", "number")
_TAGS: dict[type, int] = {}
_SETTLE_LIKE: dict[int, type] = {}  # tag -> Settle / Return / Discard (same field layout)
_SETTLE_FIELDS = ("queue", "consumer_key", "msg_ids")
# the class cbor2's C decoder builds for tags (not always the `cbor2.CBORTag` name)
_DECODED_TAG = type(cbor2.loads(cbor2.dumps(cbor2.CBORTag(99_999, []))))
_SAMPLES = (
    Enqueue("q", b"x" * 100, "e", 7, ConnectionId("n1", 2**40, 3), 5),
    Enqueue("queue", b"", None, None, ConnectionId("n2", 1, 1), None),
    Enqueue("q", b"b"),
)


def _layout_known() -> bool:
    enqueue = tuple(f.name for f in dataclasses.fields(Enqueue))
    connection = tuple(f.name for f in dataclasses.fields(ConnectionId))
    return enqueue == _ENQUEUE_FIELDS and connection == _CONNECTION_FIELDS


def _fast_encode(cmd: Enqueue) -> bytes:
    conn = cmd.connection
    conn_tag = (
        None
        if conn is None
        else cbor2.CBORTag(_TAGS[ConnectionId], [conn.node, conn.incarnation, conn.number])
    )
    fields = [cmd.queue, cmd.body, cmd.enqueuer, cmd.seq, conn_tag, cmd.ttl_ms]
    return bytes(cbor2.dumps(cbor2.CBORTag(_TAGS[Enqueue], fields), canonical=True))


def _optional(value: Any, kind: type) -> bool:
    return value is None or type(value) is kind


def _fast_decode(blob: bytes) -> Any:
    try:
        raw = cbor2.loads(blob)
    except Exception:
        return fifo.decode(blob)  # raises fifo's CodecError, with fifo's message
    if type(raw) is not _DECODED_TAG:
        return fifo.decode(blob)
    settle_like = _SETTLE_LIKE.get(raw.tag)
    if settle_like is not None:
        return _settle_like(blob, settle_like, raw.value)
    if raw.tag != _TAGS[Enqueue]:
        return fifo.decode(blob)
    fields = raw.value
    if type(fields) not in (list, tuple) or len(fields) != 6:
        return fifo.decode(blob)
    queue, body, enqueuer, seq, conn, ttl_ms = fields
    ok = type(queue) is str and type(body) is bytes and _optional(enqueuer, str)
    if not (ok and _optional(seq, int) and _optional(ttl_ms, int)):
        return fifo.decode(blob)
    connection = None
    if conn is not None:
        value: Any = getattr(conn, "value", None)
        if (
            type(conn) is not _DECODED_TAG
            or conn.tag != _TAGS[ConnectionId]
            or type(value) not in (list, tuple)
            or len(value) != 3
            or type(value[0]) is not str
            or type(value[1]) is not int
            or type(value[2]) is not int
        ):
            return fifo.decode(blob)
        connection = ConnectionId(value[0], value[1], value[2])
    return Enqueue(queue, body, enqueuer, seq, connection, ttl_ms)


def _settle_like(blob: bytes, cls: type, fields: Any) -> Any:
    """Settle / Return / Discard with an int key (v2) and int message ids; else fifo's codec."""
    if type(fields) not in (list, tuple) or len(fields) != 3:
        return fifo.decode(blob)
    queue, key, msg_ids = fields
    if type(queue) is not str or type(key) is not int or type(msg_ids) not in (list, tuple):
        return fifo.decode(blob)
    if not all(type(i) is int for i in msg_ids):
        return fifo.decode(blob)
    return cls(queue, key, tuple(msg_ids))


_DELIVER_FIELDS = ("connection", "queue", "tag", "consumer_key", "messages")
_DELIVERY_FIELDS = ("msg_id", "body", "redelivered", "delivery_count", "annotations")
_DELIVER_SAMPLES = (
    Deliver(
        ConnectionId("n1", 2**40, 3),
        "q",
        "tag",
        5 * 1024,
        (Delivery(0, b"x" * 100, False, 0), Delivery(7, b"", True, 2, (("k", "v"), ("n", 1)))),
    ),
    Deliver(ConnectionId("n", 1, 1), "", "", 0, ()),
)


def _fast_encode_deliver(effect: Deliver) -> bytes:
    conn = effect.connection
    messages = [
        cbor2.CBORTag(
            _TAGS[Delivery],
            [m.msg_id, m.body, m.redelivered, m.delivery_count, m.annotations],
        )
        for m in effect.messages
    ]
    fields = [
        cbor2.CBORTag(_TAGS[ConnectionId], [conn.node, conn.incarnation, conn.number]),
        effect.queue,
        effect.tag,
        effect.consumer_key,
        messages,
    ]
    return bytes(cbor2.dumps(cbor2.CBORTag(_TAGS[Deliver], fields), canonical=True))


def _choose_effect_encoder() -> Callable[[Any], bytes]:
    deliver = tuple(f.name for f in dataclasses.fields(Deliver))
    delivery = tuple(f.name for f in dataclasses.fields(Delivery))
    if deliver != _DELIVER_FIELDS or delivery != _DELIVERY_FIELDS or ConnectionId not in _TAGS:
        return fifo.encode
    try:
        _TAGS[Deliver] = cbor2.loads(fifo.encode(_DELIVER_SAMPLES[0])).tag
        _TAGS[Delivery] = cbor2.loads(fifo.encode(_DELIVER_SAMPLES[0].messages[0])).tag
    except Exception:
        return fifo.encode
    if not all(_fast_encode_deliver(d) == fifo.encode(d) for d in _DELIVER_SAMPLES):
        return fifo.encode

    def encode(effect: Any) -> bytes:
        # v2's int consumer keys take the fast path; a v1 ConsumerId key is fifo's business
        if type(effect) is Deliver and type(effect.consumer_key) is int:
            return _fast_encode_deliver(effect)
        return fifo.encode(effect)

    return encode


def _choose() -> tuple[Callable[[Any], bytes], Callable[[bytes], Any]]:
    if not _layout_known():
        return fifo.encode, fifo.decode
    try:
        _TAGS[Enqueue] = cbor2.loads(fifo.encode(_SAMPLES[0])).tag
        _TAGS[ConnectionId] = cbor2.loads(fifo.encode(ConnectionId("n", 1, 1))).tag
    except Exception:  # fifo's encoding is not a tag any more
        return fifo.encode, fifo.decode
    for cls in (Settle, Return, Discard):
        if tuple(f.name for f in dataclasses.fields(cls)) == _SETTLE_FIELDS:
            _SETTLE_LIKE[cbor2.loads(fifo.encode(cls("q", 1, (1,)))).tag] = cls
    samples: list[Any] = [
        *_SAMPLES,
        Settle("q", 3, (1, 2)),
        Return("", 0, ()),
        Discard("d", 9, (7,)),
    ]
    encode_ok = all(_fast_encode(s) == fifo.encode(s) for s in _SAMPLES)
    decode_ok = all(_fast_decode(fifo.encode(s)) == s for s in samples)
    return (
        (lambda c: _fast_encode(c) if type(c) is Enqueue else fifo.encode(c))
        if encode_ok
        else fifo.encode,
        _fast_decode if decode_ok else fifo.decode,
    )


encode_command, decode_command = _choose()
encode_effect = _choose_effect_encoder()

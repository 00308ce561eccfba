"""AMQP 0-9-1 frames over a byte stream: split, checked against the negotiated frame size, and
built. Methods are decoded and encoded by pamqp; content headers keep their property bytes raw
(stored as published, see `envelope`), so only the frame envelope is handled here."""

from __future__ import annotations

import struct
from collections.abc import Iterator

from pamqp import base, commands, frame
from pamqp.exceptions import UnmarshalingException

from cluster.amqp.errors import FRAME_ERROR, ConnectionRefusal

METHOD = 1
HEADER = 2
BODY = 3
HEARTBEAT = 8
FRAME_END = 0xCE
_FRAME_HEAD = struct.Struct(">BHI")
_CONTENT_HEAD = struct.Struct(">HHQ")
ENVELOPE_BYTES = _FRAME_HEAD.size + 1  # frame header and end octet around a payload
HEARTBEAT_FRAME = bytes([HEARTBEAT, 0, 0, 0, 0, 0, 0, FRAME_END])
PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"

Frame = tuple[int, int, bytes]  # frame type, channel, payload
_END = bytes([FRAME_END])
_INDEX = struct.Struct(">I")
_ACK_BODY = struct.Struct(">QB")  # delivery tag, then the bits (multiple; nack: requeue)
_ACK_BYTES = _INDEX.size + _ACK_BODY.size
_DELIVER_FIELDS = struct.Struct(">QBB")  # delivery tag, redelivered, the exchange's length
_PUBLISH = commands.Basic.Publish.index
_ACK = commands.Basic.Ack.index
_NACK = commands.Basic.Nack.index
_DELIVER = commands.Basic.Deliver.index


class FrameSplitter:
    """Whole frames out of the bytes read so far; a frame over `frame_bytes_max` is an error."""

    def __init__(self, frame_bytes_max: int) -> None:
        self.frame_bytes_max = frame_bytes_max
        self._buffer = bytearray()

    def feed(self, data: bytes) -> Iterator[Frame]:
        """Every whole frame in the stream once `data` is added (the rest waits for more)."""
        buffer = self._buffer
        buffer += data
        offset = 0
        while len(buffer) - offset >= _FRAME_HEAD.size:
            kind, channel, size = _FRAME_HEAD.unpack_from(buffer, offset)
            if size + ENVELOPE_BYTES > self.frame_bytes_max:
                raise ConnectionRefusal(
                    FRAME_ERROR,
                    f"frame size {size + ENVELOPE_BYTES} larger than negotiated maximum "
                    f"{self.frame_bytes_max}",
                )
            end = offset + _FRAME_HEAD.size + size
            if len(buffer) <= end:
                break
            if buffer[end] != FRAME_END:
                raise ConnectionRefusal(FRAME_ERROR, f"frame end marker 0x{buffer[end]:02x}")
            yield kind, channel, bytes(buffer[offset + _FRAME_HEAD.size : end])
            offset = end + 1
        del buffer[:offset]


def decode_method(payload: bytes) -> base.Frame:
    """The pamqp method of a method frame's payload; 501 FRAME_ERROR when it does not decode.
    basic.publish and basic.ack, one per message, take a fast path that builds the same pamqp
    objects (tests/amqp/test_amqp_units.py compares both)."""
    try:
        index = _INDEX.unpack_from(payload)[0]
        if index == _PUBLISH:
            return _decode_publish(payload)
        if index == _ACK and len(payload) == _ACK_BYTES:
            ack = commands.Basic.Ack.__new__(commands.Basic.Ack)
            ack.delivery_tag, bits = _ACK_BODY.unpack_from(payload, 4)
            ack.multiple = bool(bits & 1)
            return ack
    except (struct.error, IndexError, UnicodeDecodeError) as err:
        raise ConnectionRefusal(FRAME_ERROR, f"cannot decode method frame: {err}") from err
    return _decode_with_pamqp(payload)


def _decode_publish(payload: bytes) -> commands.Basic.Publish:
    offset = 6  # index, then the reserved short "ticket"
    exchange_end = offset + 1 + payload[offset]
    exchange = payload[offset + 1 : exchange_end].decode("utf-8")
    key_end = exchange_end + 1 + payload[exchange_end]
    routing_key = payload[exchange_end + 1 : key_end].decode("utf-8")
    if len(payload) != key_end + 1:
        raise IndexError("basic.publish of the wrong length")
    bits = payload[key_end]
    publish = commands.Basic.Publish.__new__(commands.Basic.Publish)
    publish.ticket, publish.exchange, publish.routing_key = 0, exchange, routing_key
    publish.mandatory, publish.immediate = bool(bits & 1), bool(bits & 2)
    return publish


def _decode_with_pamqp(payload: bytes) -> base.Frame:
    whole = _FRAME_HEAD.pack(METHOD, 0, len(payload)) + payload + bytes([FRAME_END])
    try:
        _used, _channel, method = frame.unmarshal(whole)
    except (UnmarshalingException, ValueError, struct.error) as err:
        raise ConnectionRefusal(FRAME_ERROR, f"cannot decode method frame: {err}") from err
    if not isinstance(method, base.Frame):
        raise ConnectionRefusal(FRAME_ERROR, "a method frame without a method")
    return method


def decode_content_header(payload: bytes) -> tuple[int, bytes]:
    """(body size, encoded properties) of a content header frame's payload."""
    if len(payload) < _CONTENT_HEAD.size + 2:
        raise ConnectionRefusal(FRAME_ERROR, "content header frame too short")
    class_id, _weight, body_size = _CONTENT_HEAD.unpack_from(payload)
    if class_id != commands.Basic.frame_id:
        raise ConnectionRefusal(FRAME_ERROR, f"content header of class {class_id}, not basic")
    return body_size, payload[_CONTENT_HEAD.size :]


def encode_method(channel: int, method: base.Frame) -> bytes:
    """One method frame."""
    return frame.marshal(method, channel)


def encode_confirm(channel: int, delivery_tag: int, ok: bool) -> bytes:
    """basic.ack (or basic.nack, requeue off) of one publish: the same bytes pamqp writes."""
    index = _ACK if ok else _NACK
    body = _INDEX.pack(index) + _ACK_BODY.pack(delivery_tag, 0)
    return _FRAME_HEAD.pack(METHOD, channel, len(body)) + body + _END


def encode_deliver(
    channel: int, consumer_tag: str, delivery_tag: int, redelivered: bool, routing_key: str,
    exchange: str = "",
) -> bytes:  # fmt: skip
    """basic.deliver: the same bytes pamqp writes."""
    tag, key = consumer_tag.encode("utf-8"), routing_key.encode("utf-8")
    name = exchange.encode("utf-8")
    body = b"".join((
        _INDEX.pack(_DELIVER), bytes([len(tag)]), tag,
        _DELIVER_FIELDS.pack(delivery_tag, redelivered, len(name)), name, bytes([len(key)]), key,
    ))  # fmt: skip
    return _FRAME_HEAD.pack(METHOD, channel, len(body)) + body + _END


def encode_content(
    channel: int, method: base.Frame | bytes, properties: bytes, body: bytes, frame_bytes_max: int
) -> bytes:
    """A content method (deliver, get-ok, return; as pamqp's or already encoded) with its header
    and body frames."""
    parts = [method if isinstance(method, bytes) else frame.marshal(method, channel)]
    header = _CONTENT_HEAD.pack(commands.Basic.frame_id, 0, len(body)) + properties
    parts += (_FRAME_HEAD.pack(HEADER, channel, len(header)), header, b"\xce")
    step = frame_bytes_max - ENVELOPE_BYTES
    for start in range(0, len(body), step):
        chunk = body[start : start + step]
        parts += (_FRAME_HEAD.pack(BODY, channel, len(chunk)), chunk, b"\xce")
    return b"".join(parts)

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
    """The pamqp method of a method frame's payload; 501 FRAME_ERROR when it does not decode."""
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


def encode_content(
    channel: int, method: base.Frame, properties: bytes, body: bytes, frame_bytes_max: int
) -> bytes:
    """A content method (deliver, get-ok, return) with its header and body frames."""
    parts = [frame.marshal(method, channel)]
    header = _CONTENT_HEAD.pack(commands.Basic.frame_id, 0, len(body)) + properties
    parts += (_FRAME_HEAD.pack(HEADER, channel, len(header)), header, b"\xce")
    step = frame_bytes_max - ENVELOPE_BYTES
    for start in range(0, len(body), step):
        chunk = body[start : start + step]
        parts += (_FRAME_HEAD.pack(BODY, channel, len(chunk)), chunk, b"\xce")
    return b"".join(parts)

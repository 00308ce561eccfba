"""Client-side wire pieces without I/O: the handshake, frame splitting and the publish encoding.

`encode_enqueue` is the one place a publish is encoded (the hot path of the client).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import cbor2

from cluster import protocol
from cluster.errors import AuthError, ProtocolError
from fifo.codec import decode
from fifo.commands import GROUP_KEY_DEFAULT as GROUP_KEY
from fifo.commands import AnnotatedEnqueue, ConnectionId, Enqueue
from fifo.wire import fields_encoder

Frame = dict[str, object]  # a decoded wire frame, as public signatures show it
AnyFrame = dict[str, Any]  # the same inside the package, where fields are read without casts


@dataclass(frozen=True, slots=True)
class Welcome:
    """What a node told us when it accepted the connection."""

    address: str
    node: str
    connection: bytes  # fifo.encode(ConnectionId), spliced by the node into our commands
    leader: str | None
    endpoints: dict[str, str] = field(default_factory=dict)  # node id -> client address

    @property
    def connection_id(self) -> ConnectionId:
        """Our ConnectionId on that node."""
        try:
            value = decode(self.connection)
        except Exception as err:  # the codec raises several types for garbage
            raise ProtocolError(protocol.BAD_FRAME, "welcome has a bad connection id") from err
        if not isinstance(value, ConnectionId):
            raise ProtocolError(protocol.BAD_FRAME, f"welcome names no connection: {value!r}")
        return value

    def leader_address(self) -> str | None:
        """The client address of the leader the node named, if it is another node."""
        if self.leader is None or self.leader == self.node:
            return None
        return self.endpoints.get(self.leader)


class Handshake:
    """The client side of the authentication handshake, sans-IO.

    Feed it bytes with `receive_data` until it returns the `Welcome`; send what `data_to_send`
    returns; bytes that followed the welcome are in `leftover`. Raises `AuthError` when the node
    refuses the key and `ProtocolError` for anything else unexpected.
    """

    def __init__(
        self,
        address: str,
        client_key: bytes,
        name: str,
        frame_bytes_max: int = protocol.FRAME_BYTES_MAX_DEFAULT,
    ) -> None:
        self.address = address
        self._client_key = client_key
        self._name = name
        self._frame_bytes_max = frame_bytes_max
        self._buffer = b""
        self._out = b""
        self._said_hello = False
        self.leftover = b""

    def data_to_send(self) -> bytes:
        """The bytes to write now (the hello, once the challenge came)."""
        out, self._out = self._out, b""
        return out

    def receive_data(self, data: bytes) -> Welcome | None:
        """Take received bytes; the Welcome once the node accepted us, else None."""
        self._buffer += data
        while True:
            frame, self._buffer = _take_frame(self._buffer, self._frame_bytes_max)
            if frame is None:
                return None
            if not self._said_hello:
                self._on_challenge(frame)
                continue
            welcome = self._on_answer(frame)
            self.leftover, self._buffer = self._buffer, b""
            return welcome

    def connection_closed(self) -> AuthError | ProtocolError:
        """The error to raise when the node closed the socket mid-handshake."""
        if self._said_hello:
            return AuthError(f"{self.address} closed the connection during the handshake")
        return ProtocolError(protocol.BAD_FRAME, f"{self.address} closed before the challenge")

    def _on_challenge(self, frame: AnyFrame) -> None:
        nonce = frame.get("nonce")
        if frame.get("op") != protocol.CHALLENGE or not isinstance(nonce, bytes):
            raise ProtocolError(protocol.BAD_FRAME, f"expected a challenge, got {frame!r}")
        self._out += protocol.encode_frame(protocol.hello(self._client_key, nonce, self._name))
        self._said_hello = True

    def _on_answer(self, frame: AnyFrame) -> Welcome:
        if frame.get("op") == protocol.ERROR:
            code, text = frame.get("code"), frame.get("message", "")
            if code == protocol.AUTH_FAILED:
                raise AuthError(f"{self.address} refused the client credentials: {text}")
            raise ProtocolError(str(code), f"{self.address}: handshake failed: {text}")
        connection = frame.get("connection")
        if frame.get("op") != protocol.WELCOME or not isinstance(connection, bytes):
            raise ProtocolError(protocol.BAD_FRAME, f"expected welcome, got {frame!r}")
        leader = frame.get("leader")
        endpoints = frame.get("endpoints")
        if not isinstance(endpoints, dict):
            endpoints = {}
        welcome = Welcome(
            address=self.address,
            node=str(frame.get("node")),
            connection=connection,
            leader=leader if isinstance(leader, str) else None,
            endpoints={str(k): str(v) for k, v in endpoints.items()},
        )
        welcome.connection_id  # noqa: B018 (validated here, where a refusal is expected)
        return welcome


def _take_frame(buffer: bytes, frame_bytes_max: int) -> tuple[AnyFrame | None, bytes]:
    if len(buffer) < protocol.HEADER.size:
        return None, buffer
    (length,) = protocol.HEADER.unpack_from(buffer)
    protocol.check_length(length, frame_bytes_max)
    end = protocol.HEADER.size + length
    if len(buffer) < end:
        return None, buffer
    return protocol.decode_body(buffer[protocol.HEADER.size : end]), buffer[end:]


def split_frames(buffer: bytes, frame_bytes_max: int) -> tuple[list[AnyFrame], bytes]:
    """Every whole frame at the start of `buffer` (maps only), and the bytes left over.

    Raises ProtocolError for a bad length, after which the stream cannot be resynchronised.
    """
    frames: list[AnyFrame] = []
    pos, size = 0, len(buffer)
    view = memoryview(buffer)
    while size - pos >= 4:
        length = int.from_bytes(view[pos : pos + 4], "big")
        protocol.check_length(length, frame_bytes_max)
        if size - pos - 4 < length:
            break
        message = cbor2.loads(view[pos + 4 : pos + 4 + length])
        if isinstance(message, dict):
            frames.append(message)
        pos += 4 + length
    return frames, buffer[pos:]


_enqueue_fields = fields_encoder(Enqueue)  # schema-derived (fifo.wire), tested against fifo.encode
_annotated_fields = fields_encoder(AnnotatedEnqueue)


def encode_enqueue(
    queue: str, body: bytes, enqueuer: str, seq: int, ttl_ms: int | None, group: str | None = None
) -> bytes:
    """The command bytes of one publish: `fifo.encode(Enqueue(...))`, no connection (the node
    splices in its own). With a `group` (machine v3), an `AnnotatedEnqueue` naming the group in
    the `x-group-id` annotation (the default `group_key` of a grouped queue)."""
    if group is None:
        return _enqueue_fields(queue, body, enqueuer, seq, None, ttl_ms)
    return _annotated_fields(queue, body, enqueuer, seq, None, ttl_ms, ((GROUP_KEY, group),))


def group_of(annotations: tuple[tuple[str, str | int], ...]) -> str | None:
    """The message group a delivery names in its `x-group-id` annotation (an int as text)."""
    found: str | None = None
    for key, value in annotations:
        if key == GROUP_KEY:
            found = value if isinstance(value, str) else str(value)
    return found

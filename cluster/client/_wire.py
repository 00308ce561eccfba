"""Client-side wire pieces without I/O: the handshake, frame splitting and the publish encoding.

`encode_enqueue` is the one place a publish is encoded (the hot path of the client).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import cbor2

from cluster import protocol
from cluster.client.errors import TlsError, Unavailable
from cluster.errors import AuthError, ProtocolError
from fifo.codec import decode, encode, schema
from fifo.commands import GROUP_KEY_DEFAULT as GROUP_KEY
from fifo.commands import AnnotatedEnqueue, ConnectionId, Enqueue
from fifo.replies import Ok
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
    features: frozenset[str] = frozenset()  # the optional protocol features the node will use

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
    refuses the key, `TlsError` when a TLS node says it was dialed without TLS, and
    `ProtocolError` for anything else unexpected.
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
        if frame.get("op") == protocol.ERROR and frame.get("code") == protocol.TLS_REQUIRED:
            # the node's message names it and says what to pass (tls=, --tls-ca)
            raise TlsError(str(frame.get("message") or f"{self.address} speaks TLS"))
        if frame.get("op") == protocol.ERROR and frame.get("code") == protocol.CONNECTION_LIMIT:
            # the node is at its connection cap: another node (or later) may take us
            raise Unavailable(str(frame.get("message") or f"{self.address} is at its cap"))
        nonce = frame.get("nonce")
        if frame.get("op") != protocol.CHALLENGE or not isinstance(nonce, bytes):
            raise ProtocolError(protocol.BAD_FRAME, f"expected a challenge, got {frame!r}")
        hello = protocol.hello(self._client_key, nonce, self._name, protocol.CLIENT_FEATURES)
        self._out += protocol.encode_frame(hello)
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
            features=protocol.features_of(frame),
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


def _ok_reply_parts() -> tuple[bytes, bytes]:
    """What an `Ok` reply frame's body holds before and after its request id (the id is the
    only item that changes); derived from the generic encoder, checked for several ids."""
    head, tail = cbor2.dumps(protocol.reply(0, OK_BYTES)), cbor2.dumps("reply")
    tail += cbor2.dumps(OK_BYTES)
    before = head[: len(head) - len(tail) - 1]
    for request_id in (0, 23, 24, 255, 256, 65_536, 2**32):
        if cbor2.dumps(protocol.reply(request_id, OK_BYTES)) != (
            before + cbor2.dumps(request_id) + tail
        ):
            return b"\xff", b"\xff"  # never matches: every answer takes the generic path
    return before, tail


OK_BYTES = encode(Ok())  # nearly every confirm
_OK_BEFORE_ID, _OK_AFTER_ID = _ok_reply_parts()


def split_answers(buffer: bytes, frame_bytes_max: int) -> tuple[list[AnyFrame | int], bytes]:
    """`split_frames` for what a node sends: a frame that is exactly an `Ok` reply (the confirm
    of nearly every publish and ack) comes as its request id (an int), without building a map,
    and an `oks` frame (protocol.OKS_FEATURE) as the ids it lists, in order.

    Raises ProtocolError for a bad length, after which the stream cannot be resynchronised.
    """
    answers: list[AnyFrame | int] = []
    pos, size = 0, len(buffer)
    before, after = _OK_BEFORE_ID, _OK_AFTER_ID
    id_min = len(before) + len(after) + 1
    loads, dumps = cbor2.loads, cbor2.dumps
    view = memoryview(buffer)  # (bytes cannot be resized: the view need not be released)
    while size - pos >= 4:
        length = int.from_bytes(buffer[pos : pos + 4], "big")
        protocol.check_length(length, frame_bytes_max)
        start, end = pos + 4, pos + 4 + length
        if end > size:
            break
        pos = end
        if (
            length >= id_min
            and buffer.startswith(before, start)
            and buffer.endswith(after, start, end)
        ):
            encoded_id = buffer[start + len(before) : end - len(after)]
            request_id = loads(encoded_id)
            if type(request_id) is int and dumps(request_id) == encoded_id:
                answers.append(request_id)
                continue
        message = loads(view[start:end])
        if not isinstance(message, dict):
            continue
        if message.get("op") == protocol.OKS:
            answers += _ok_ids(message)
        else:
            answers.append(message)
    return answers, buffer[pos:]


def _ok_ids(frame: AnyFrame) -> list[int]:
    """The request ids of an `oks` frame; ProtocolError(bad_frame) when it is malformed."""
    ids = frame.get("ids")
    if (
        not isinstance(ids, list)
        or len(ids) > protocol.OKS_IDS_MAX
        or not all(type(request_id) is int for request_id in ids)
    ):
        raise ProtocolError(protocol.BAD_FRAME, "an 'oks' frame needs a list of integer 'ids'")
    return ids


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


class PublishFrames:
    """The whole wire frame of a publish (`command` frame around its Enqueue) for one queue,
    enqueuer, ttl and connection, built by joining pre-encoded CBOR items.

    A CBOR map or array is its header followed by its items, so only the items that change per
    message (request id, body, seq) are encoded per message; the fixed ones come from the
    generic encoders, in the order of the Enqueue schema, and `matches()` checks the result
    byte-for-byte against `protocol.encode_frame(protocol.command(..., encode_enqueue(...)))`
    (the caller falls back to that when it does not match). `connection` is this connection's
    encoded ConnectionId (the welcome's), so the node finds the publish already bound to it and
    neither rebuilds nor re-encodes it; None leaves the field empty (the node splices it in).
    """

    __slots__ = ("_cmd_head", "_cmd_key", "_connection", "_enqueuer", "_id_key", "_queue",
                 "_ttl", "args")  # fmt: skip

    def __init__(
        self, queue: str, enqueuer: str, ttl_ms: int | None, connection: bytes | None
    ) -> None:
        self.args = (queue, enqueuer, ttl_ms, connection)
        dumps = cbor2.dumps
        fixed = {"queue": queue, "enqueuer": enqueuer, "connection": None, "ttl_ms": ttl_ms}
        self._queue, self._enqueuer = dumps(queue), dumps(enqueuer)
        self._connection = dumps(None) if connection is None else connection
        self._ttl = dumps(ttl_ms)
        names = tuple(f.name for f in schema(Enqueue).fields)
        if names != ("queue", "body", "enqueuer", "seq", "connection", "ttl_ms"):
            self._cmd_head = b""  # a changed schema: matches() is False, the caller encodes
        else:  # the tag and array header: what precedes the items of an empty publish
            empty = _enqueue_fields(*(fixed.get(n, b"" if n == "body" else 0) for n in names))
            items = self._queue + dumps(b"") + self._enqueuer + dumps(0) + dumps(None) + self._ttl
            self._cmd_head = empty[: len(empty) - len(items)] if empty.endswith(items) else b""
        # the frame map's header and keys before the id's value, and the key before the command
        head = dumps(protocol.command(0, b""))
        self._cmd_key = dumps("cmd")
        tail = dumps(0) + self._cmd_key + dumps(b"")
        self._id_key = head[: len(head) - len(tail)] if head.endswith(tail) else b""

    def frame(
        self,
        request_id: int,
        body: bytes,
        seq: int,
        frame_bytes_max: int = protocol.FRAME_BYTES_MAX_DEFAULT,
    ) -> bytes:
        """The frame (length header included) of one publish; ProtocolError past the limit."""
        dumps = cbor2.dumps
        cmd = b"".join((self._cmd_head, self._queue, dumps(body), self._enqueuer, dumps(seq),
                        self._connection, self._ttl))  # fmt: skip
        frame = b"".join((self._id_key, dumps(request_id), self._cmd_key, dumps(cmd)))
        if len(frame) > frame_bytes_max:
            message = f"frame of {len(frame)} bytes > {frame_bytes_max}"
            raise ProtocolError(protocol.FRAME_TOO_LARGE, message)
        return protocol.HEADER.pack(len(frame)) + frame

    def generic(self, request_id: int, body: bytes, seq: int) -> bytes:
        """The same frame from the generic encoders (the reference `frame` must equal)."""
        queue, enqueuer, ttl_ms, connection = self.args
        if connection is None:
            cmd = encode_enqueue(queue, body, enqueuer, seq, ttl_ms)
        else:
            conn = decode(connection)
            cmd = _enqueue_fields(queue, body, enqueuer, seq, conn, ttl_ms)
        return protocol.encode_frame(protocol.command(request_id, cmd))

    def matches(self) -> bool:
        """Whether `frame` equals `generic` across the sizes where CBOR lengths change width."""
        if not self._cmd_head or not self._id_key:
            return False
        samples = ((1, b"", 1), (23, b"x" * 23, 24), (24, b"y" * 24, 255), (255, b"z" * 256, 256),
                   (65_535, b"w" * 65_536, 65_536), (2**32, b"v" * 100, 2**33))  # fmt: skip
        try:
            return all(self.frame(*sample) == self.generic(*sample) for sample in samples)
        except Exception:  # an unencodable field (the caller's generic path reports it)
            return False


def group_of(annotations: tuple[tuple[str, str | int], ...]) -> str | None:
    """The message group a delivery names in its `x-group-id` annotation (an int as text)."""
    found: str | None = None
    for key, value in annotations:
        if key == GROUP_KEY:
            found = value if isinstance(value, str) else str(value)
    return found

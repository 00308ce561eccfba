"""The client wire protocol: length-prefixed CBOR frames, the handshake and the message shapes.

Frame: a 4-byte big-endian length N (1 <= N <= frame_bytes_max) then N bytes of CBOR encoding
a map with an "op" key. Sequence: server sends `challenge`, client answers `hello` with
HMAC-SHA256(client_key, nonce), server answers `welcome` or an `auth_failed` error and closes.
Then `command` / `query` / `admin` requests (pipelined, matched by "id") and `effect` pushes.
Commands inside frames are `fifo.encode` bytes; this module never decodes them.
Optional features are negotiated in the handshake: a client lists those it understands under
FEATURES in its `hello`, the node lists under FEATURES in its `welcome` those it will use; a
node that predates a feature ignores the key and names none (then nothing changes on the wire).
Known features: OKS_FEATURE (the node may answer many commands whose reply is `Ok` with one
`oks` frame listing their ids, in the order it would have sent their `reply` frames).
A node without a reachable leader answers queries (but "status") and, after a while, commands
with an `unavailable` error whose message starts with "no leader/quorum"; a query with the
STALE_OK arg is answered anyway, its result frame carrying STALE (why it may be stale).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import socket
import struct
from collections.abc import Callable
from typing import Any, Final

import cbor2

from cluster.errors import ProtocolError

FRAME_BYTES_MAX_DEFAULT: Final = 16 * 1024 * 1024
# what decoding costs is the number of CBOR items, not bytes (a 16 MiB byte string decodes in
# about 3 ms, a 16 MiB array of zeros in 0.6 s): a body above SCAN_BYTES_MIN is first walked
# without building anything, and refused past its item budget (one below it decodes in < 1 ms)
SCAN_BYTES_MIN: Final = 16 * 1024
FRAME_ITEMS_MAX: Final = 1024  # a request frame is a map of a few keys; bulk data is one string
CBOR_DEPTH_MAX: Final = 64
HEADER = struct.Struct(">I")
NONCE_BYTES: Final = 32

# ops
CHALLENGE: Final = "challenge"
HELLO: Final = "hello"
WELCOME: Final = "welcome"
COMMAND: Final = "command"
REPLY: Final = "reply"
QUERY: Final = "query"
RESULT: Final = "result"
ADMIN: Final = "admin"
EFFECT: Final = "effect"
ERROR: Final = "error"
OKS: Final = "oks"  # {"op": "oks", "ids": [request ids]}: each answered `Ok` (negotiated)
CLIENT_OPS: Final = frozenset({HELLO, COMMAND, QUERY, ADMIN})

QUERIES: Final = ("overview", "queues", "consumers", "messages", "status", "machine", "groups")
ADMIN_ACTIONS: Final = ("member_add", "member_remove", "machine_upgrade")

# handshake feature negotiation (see the module docstring)
FEATURES: Final = "features"
OKS_FEATURE: Final = "oks"
CLIENT_FEATURES: Final = (OKS_FEATURE,)  # what this code's clients understand
FEATURES_MAX: Final = 16  # names read from a hello or welcome; more are ignored
OKS_IDS_MAX: Final = 4096  # ids in one `oks` frame

# a query arg: answer from this node's state even when it has no leader (the result frame then
# carries STALE, the reason); without it such a node answers `unavailable` ("no leader/quorum")
STALE_OK: Final = "stale_ok"
STALE: Final = "stale"

# error codes
BAD_FRAME: Final = "bad_frame"
FRAME_TOO_LARGE: Final = "frame_too_large"
NOT_AUTHENTICATED: Final = "not_authenticated"
AUTH_FAILED: Final = "auth_failed"
UNKNOWN_OP: Final = "unknown_op"
BAD_COMMAND: Final = "bad_command"
BAD_REQUEST: Final = "bad_request"
NOT_LEADER_TIMEOUT: Final = "not_leader_timeout"
UNAVAILABLE: Final = "unavailable"
INTERNAL: Final = "internal"
REFUSED: Final = "refused"
REPLY_TOO_LARGE: Final = "reply_too_large"  # a query result over the frame limit
DISK_FULL: Final = "disk_full"  # journal write hit ENOSPC: no commands until space returns
# the node is past its memory high watermark: no new publishes until it falls back (retryable;
# settles and consumes are served, so a backlog drains)
MEMORY_ALARM: Final = "memory_alarm"
TLS_REQUIRED: Final = "tls_required"  # sent in the clear by a TLS client port, then closed
# sent instead of the challenge by a node at its connection cap, then closed (retry elsewhere)
CONNECTION_LIMIT: Final = "connection_limit"
# errors after which the server closes the connection
FATAL_CODES: Final = frozenset({FRAME_TOO_LARGE, AUTH_FAILED, NOT_AUTHENTICATED})

Message = dict[str, Any]


def encode_frame(message: Message, frame_bytes_max: int = FRAME_BYTES_MAX_DEFAULT) -> bytes:
    """Header + CBOR body of one message; ProtocolError if the body exceeds the limit."""
    body = cbor2.dumps(message)
    if len(body) > frame_bytes_max:
        raise ProtocolError(FRAME_TOO_LARGE, f"frame of {len(body)} bytes > {frame_bytes_max}")
    return HEADER.pack(len(body)) + body


def check_length(length: int, frame_bytes_max: int = FRAME_BYTES_MAX_DEFAULT) -> None:
    """Validate a frame header's length; ProtocolError(frame_too_large | bad_frame) if invalid."""
    if length == 0:
        raise ProtocolError(BAD_FRAME, "empty frame (length 0)")
    if length > frame_bytes_max:
        raise ProtocolError(
            FRAME_TOO_LARGE, f"frame of {length} bytes exceeds the limit of {frame_bytes_max}"
        )


def decode_body(body: bytes | bytearray | memoryview) -> Message:
    """Decode a frame body: CBOR of a map with a string "op"; ProtocolError(bad_frame) otherwise."""
    try:
        message = cbor2.loads(body)
    except Exception as err:  # cbor2 raises several types for garbage
        raise ProtocolError(BAD_FRAME, f"frame is not valid CBOR: {err}") from err
    if not isinstance(message, dict):
        raise ProtocolError(BAD_FRAME, f"frame must be a CBOR map, got {type(message).__name__}")
    if not isinstance(message.get("op"), str):
        raise ProtocolError(BAD_FRAME, "frame map has no string 'op' key")
    return message


def check_cost(
    body: bytes | bytearray | memoryview,
    items_max: int,
    tag_allowed: Callable[[int], bool] = lambda _tag: False,
    what: str = "frame",
) -> None:
    """Walk the CBOR items of `body` without building them: ProtocolError(bad_frame) when there
    are more than `items_max`, nesting deeper than CBOR_DEPTH_MAX, an indefinite length or a tag
    `tag_allowed` refuses. Strings are skipped by their length, so the walk costs at most
    `items_max` steps (about 0.3 us each) whatever the size."""
    with memoryview(body) as data:  # released even on refusal: the buffer may be resized
        _walk(data, items_max, tag_allowed, what)


def _walk(data: memoryview, items_max: int, tag_allowed: Callable[[int], bool], what: str) -> None:
    """check_cost's walk over a view of the body."""
    end, position, items = len(data), 0, 0
    remaining = [1]  # items still to read at each open level
    while remaining:
        if remaining[-1] == 0:
            remaining.pop()
            continue
        remaining[-1] -= 1
        if position >= end:
            raise ProtocolError(BAD_FRAME, f"{what} is not valid CBOR: it ends inside an item")
        initial = data[position]
        major, info = initial >> 5, initial & 0x1F
        position += 1
        if info < 24:
            argument = info
        elif info <= 27:
            size = 1 << (info - 24)
            argument = int.from_bytes(data[position : position + size], "big")
            position += size
        else:
            message = f"{what}: indefinite or reserved CBOR lengths are refused"
            raise ProtocolError(BAD_FRAME, message)
        items += 1
        if items > items_max:
            raise ProtocolError(
                BAD_FRAME,
                f"{what} of {end} bytes has more than {items_max} CBOR items (too costly to "
                "decode: send bulk data as one byte string)",
            )
        if major in (2, 3):
            position += argument
        elif major in (4, 5, 6):
            if major == 6 and not tag_allowed(argument):
                raise ProtocolError(BAD_FRAME, f"{what}: CBOR tag {argument} is not accepted")
            count = 1 if major == 6 else argument * (2 if major == 5 else 1)
            if count:
                if len(remaining) > CBOR_DEPTH_MAX:
                    raise ProtocolError(BAD_FRAME, f"{what} nests deeper than {CBOR_DEPTH_MAX}")
                remaining.append(count)


async def read_frame(
    reader: asyncio.StreamReader, frame_bytes_max: int = FRAME_BYTES_MAX_DEFAULT
) -> Message:
    """Read one frame; EOF raises asyncio.IncompleteReadError, bad frames ProtocolError."""
    header = await reader.readexactly(HEADER.size)
    (length,) = HEADER.unpack(header)
    check_length(length, frame_bytes_max)
    return decode_body(await reader.readexactly(length))


async def write_frame(
    writer: asyncio.StreamWriter, message: Message, frame_bytes_max: int = FRAME_BYTES_MAX_DEFAULT
) -> None:
    """Write one frame and drain."""
    writer.write(encode_frame(message, frame_bytes_max))
    await writer.drain()


class FrameDecoder:
    """Incremental frame parser: feed it bytes as they arrive, take whole frames out.

    A frame that does not decode is reported in place (its bytes are consumed, parsing goes
    on); an oversized length cannot be skipped, so the decoder stays broken after it. With
    `items_max`, a body above SCAN_BYTES_MIN with more CBOR items than that (or any tag) is
    reported as bad_frame before it is decoded (the node's bound on the time one frame costs).
    """

    def __init__(
        self, frame_bytes_max: int = FRAME_BYTES_MAX_DEFAULT, items_max: int | None = None
    ) -> None:
        self.frame_bytes_max = frame_bytes_max
        self.items_max = items_max
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[Message | ProtocolError]:
        """Add received bytes; returns the frames (or their errors) now complete, in order."""
        self._buffer += data
        out: list[Message | ProtocolError] = []
        offset = 0
        buffer = self._buffer
        while len(buffer) - offset >= HEADER.size:
            (length,) = HEADER.unpack_from(buffer, offset)
            try:
                check_length(length, self.frame_bytes_max)
            except ProtocolError as err:
                out.append(err)
                if err.code == FRAME_TOO_LARGE:
                    self._buffer = bytearray()
                    return out
                offset += HEADER.size
                continue
            end = offset + HEADER.size + length
            if len(buffer) < end:
                break
            try:
                out.append(decode_body(self._body(offset + HEADER.size, end)))
            except ProtocolError as err:
                out.append(err)
            offset = end
        del self._buffer[:offset]
        return out

    def _body(self, start: int, end: int) -> bytes:
        """The body at [start, end) of the buffer, checked against the item budget before it is
        copied (one copy: a refused 16 MiB frame is never copied)."""
        with memoryview(self._buffer) as view, view[start:end] as body:
            if self.items_max is not None and end - start > SCAN_BYTES_MIN:
                check_cost(body, self.items_max)
            return bytes(body)


def recv_frame(sock: socket.socket, frame_bytes_max: int = FRAME_BYTES_MAX_DEFAULT) -> Message:
    """Blocking read of one frame from a socket; EOF raises ConnectionError."""
    (length,) = HEADER.unpack(_recv_exactly(sock, HEADER.size))
    check_length(length, frame_bytes_max)
    return decode_body(_recv_exactly(sock, length))


def send_frame(
    sock: socket.socket, message: Message, frame_bytes_max: int = FRAME_BYTES_MAX_DEFAULT
) -> None:
    """Blocking write of one frame."""
    sock.sendall(encode_frame(message, frame_bytes_max))


def _recv_exactly(sock: socket.socket, size: int) -> bytes:
    chunks = bytearray()
    while len(chunks) < size:
        chunk = sock.recv(size - len(chunks))
        if not chunk:
            raise ConnectionError("connection closed by peer")
        chunks += chunk
    return bytes(chunks)


def proof(client_key: bytes, nonce: bytes) -> bytes:
    """The handshake proof: HMAC-SHA256(client_key, nonce)."""
    return hmac.new(client_key, nonce, hashlib.sha256).digest()


def verify_proof(client_key: bytes, nonce: bytes, claimed: object) -> bool:
    """Constant-time check of a `hello` proof."""
    return isinstance(claimed, bytes) and hmac.compare_digest(proof(client_key, nonce), claimed)


def challenge(nonce: bytes, node: str) -> Message:
    """Server -> client on accept."""
    return {"op": CHALLENGE, "nonce": nonce, "node": node}


def hello(client_key: bytes, nonce: bytes, name: str, features: tuple[str, ...] = ()) -> Message:
    """Client -> server: answer to a challenge, with the optional features it understands."""
    frame: Message = {"op": HELLO, "proof": proof(client_key, nonce), "name": name}
    if features:
        frame[FEATURES] = list(features)
    return frame


def features_of(frame: Message) -> frozenset[str]:
    """The feature names a hello or welcome lists (none when absent or malformed)."""
    names = frame.get(FEATURES)
    if not isinstance(names, list):
        return frozenset()
    return frozenset(name for name in names[:FEATURES_MAX] if isinstance(name, str))


def welcome(
    node: str,
    connection: bytes,
    leader: str | None,
    endpoints: dict[str, str],
    features: tuple[str, ...] = (),
) -> Message:
    """Server -> client after a good hello; `connection` is `fifo.encode(ConnectionId)`;
    `features`: those of the client's hello this node will use."""
    frame: Message = {
        "op": WELCOME,
        "node": node,
        "connection": connection,
        "leader": leader,
        "endpoints": endpoints,
    }
    if features:
        frame[FEATURES] = list(features)
    return frame


def command(request_id: int, cmd: bytes) -> Message:
    """Client -> server: one command (`fifo.encode(Command)`)."""
    return {"op": COMMAND, "id": request_id, "cmd": cmd}


def reply(request_id: int, encoded_reply: bytes) -> Message:
    """Server -> client: the reply to one command (`fifo.encode(Reply)`)."""
    return {"op": REPLY, "id": request_id, "reply": encoded_reply}


def query(request_id: int, name: str, args: dict[str, Any] | None = None) -> Message:
    """Client -> server: a read-only query (local state of the node answering)."""
    return {"op": QUERY, "id": request_id, "query": name, "args": args or {}}


def result(request_id: int, value: Any, stale: str | None = None) -> Message:
    """Server -> client: the result of a query or admin request (plain CBOR data); `stale` is
    why it may be stale, set only on a query that passed STALE_OK to a node without a leader."""
    frame: Message = {"op": RESULT, "id": request_id, "result": value}
    if stale is not None:
        frame[STALE] = stale
    return frame


def admin(request_id: int, action: str, args: dict[str, Any] | None = None) -> Message:
    """Client -> server: an admin action."""
    return {"op": ADMIN, "id": request_id, "action": action, "args": args or {}}


def oks(request_ids: list[int]) -> Message:
    """Server -> client (OKS_FEATURE only): each of these requests was answered `Ok`."""
    return {"op": OKS, "ids": request_ids}


def effect(encoded_effect: bytes) -> Message:
    """Server -> client push: `fifo.encode(Effect)` addressed to this connection."""
    return {"op": EFFECT, "effect": encoded_effect}


def error(code: str, message: str, request_id: int | None = None) -> Message:
    """An error frame; `id` is present when the error answers a request with a usable id."""
    frame: Message = {"op": ERROR, "code": code, "message": message}
    if request_id is not None:
        frame["id"] = request_id
    return frame

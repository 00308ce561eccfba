"""One authenticated socket to a node plus the reader thread that hands frames to the client.

A plain blocking socket and one reader thread per connection: frames are parsed in bulk per
`recv`, so a burst of replies costs one callback, not one per frame.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import cbor2

from cluster import protocol
from cluster.errors import AuthError, ProtocolError

Message = dict[str, Any]
RECV_BYTES = 256 * 1024


class Connection:
    """A handshaken connection to one node; `on_frames` runs on the reader thread."""

    def __init__(
        self,
        address: str,
        client_key: bytes,
        name: str,
        connect_timeout_s: float,
        frame_bytes_max: int = protocol.FRAME_BYTES_MAX_DEFAULT,
    ) -> None:
        self.address = address
        self.frame_bytes_max = frame_bytes_max
        host, _, port = address.rpartition(":")
        self._sock = socket.create_connection((host, int(port)), timeout=connect_timeout_s)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._send_lock = threading.Lock()
        self._closed = False
        try:
            welcome = self._handshake(client_key, name)
        except BaseException:
            self._sock.close()
            raise
        self._sock.settimeout(None)
        self.node: str = str(welcome.get("node"))
        self.connection: bytes = welcome["connection"]
        leader = welcome.get("leader")
        self.leader: str | None = leader if isinstance(leader, str) else None
        endpoints = welcome.get("endpoints") or {}
        self.endpoints: dict[str, str] = {str(k): str(v) for k, v in endpoints.items()}
        self._thread: threading.Thread | None = None
        self.last_recv = time.monotonic()  # the client's silence check reads it

    def _handshake(self, client_key: bytes, name: str) -> Message:
        challenge = protocol.recv_frame(self._sock, self.frame_bytes_max)
        if challenge.get("op") != protocol.CHALLENGE or not isinstance(
            challenge.get("nonce"), bytes
        ):
            raise ProtocolError(protocol.BAD_FRAME, f"expected a challenge, got {challenge!r}")
        protocol.send_frame(self._sock, protocol.hello(client_key, challenge["nonce"], name))
        try:
            answer = protocol.recv_frame(self._sock, self.frame_bytes_max)
        except ConnectionError as err:
            raise AuthError(f"{self.address} closed the connection during the handshake") from err
        if answer.get("op") == protocol.ERROR:
            code, text = answer.get("code"), answer.get("message", "")
            if code == protocol.AUTH_FAILED:
                raise AuthError(f"{self.address} refused the client credentials: {text}")
            raise ProtocolError(str(code), f"{self.address}: handshake failed: {text}")
        if answer.get("op") != protocol.WELCOME or not isinstance(answer.get("connection"), bytes):
            raise ProtocolError(protocol.BAD_FRAME, f"expected welcome, got {answer!r}")
        return answer

    def start(
        self,
        on_frames: Callable[[Connection, list[Message]], None],
        on_close: Callable[[Connection, BaseException | None], None],
    ) -> None:
        """Start the reader thread; `on_close` runs once on it when the socket ends."""
        self._thread = threading.Thread(
            target=self._read_loop,
            args=(on_frames, on_close),
            name=f"qq-reader-{self.address}",
            daemon=True,
        )
        self._thread.start()

    def _read_loop(
        self,
        on_frames: Callable[[Connection, list[Message]], None],
        on_close: Callable[[Connection, BaseException | None], None],
    ) -> None:
        error: BaseException | None = None
        buffer = b""
        try:
            while True:
                chunk = self._sock.recv(RECV_BYTES)
                self.last_recv = time.monotonic()
                if not chunk:
                    raise ConnectionError(f"{self.address} closed the connection")
                buffer = buffer + chunk if buffer else chunk
                frames, buffer = self._split(buffer)
                if frames:
                    on_frames(self, frames)
        except BaseException as err:  # any end of the socket is reported once, below
            error = err
        finally:
            self.close()
            on_close(self, None if self._closed_by_us else error)

    def _split(self, buffer: bytes) -> tuple[list[Message], bytes]:
        frames: list[Message] = []
        pos, size = 0, len(buffer)
        view = memoryview(buffer)
        while size - pos >= 4:
            length = int.from_bytes(view[pos : pos + 4], "big")
            protocol.check_length(length, self.frame_bytes_max)
            if size - pos - 4 < length:
                break
            message = cbor2.loads(view[pos + 4 : pos + 4 + length])
            if isinstance(message, dict):
                frames.append(message)
            pos += 4 + length
        return frames, buffer[pos:]

    _closed_by_us = False

    def send(self, data: bytes) -> None:
        """Write bytes (one or many frames); ConnectionError when the socket is gone."""
        with self._send_lock:
            self._sock.sendall(data)

    def close(self, by_us: bool = False) -> None:
        """Close the socket; the reader thread then ends and reports the close."""
        if by_us:
            self._closed_by_us = True
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()

    @property
    def closed(self) -> bool:
        """True once the socket was closed, by either side."""
        return self._closed

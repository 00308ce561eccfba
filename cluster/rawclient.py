"""A blocking protocol client (tests and debugging only; the real client is `cluster.client`).

`RawClient` speaks `cluster.protocol` with blocking sockets: the handshake, then one request at
a time, with the effects pushed in between collected on the side. `tls=` as for `Client` (the
cluster CA's path or an `ssl.SSLContext`, for a cluster with `tls = true`).
"""

from __future__ import annotations

import contextlib
import itertools
import socket
import ssl
import time
from typing import Any

import fifo
from cluster import protocol
from cluster.client.tls import TlsOption, client_context, handshake_failed, server_hostname
from cluster.errors import ProtocolError


class RawClient:
    """A blocking protocol client: handshake, commands, queries, admin, collected effects."""

    def __init__(
        self,
        address: str,
        client_key: bytes,
        name: str = "raw",
        timeout_s: float = 10,
        tls: TlsOption = None,
    ):
        host, port = server_hostname(address), address.rsplit(":", 1)[1]
        context = client_context(tls)
        self.sock = socket.create_connection((host, int(port)), timeout=timeout_s)
        if context is not None:
            try:
                self.sock = context.wrap_socket(self.sock, server_hostname=host)
            except ssl.SSLError as err:
                self.sock.close()
                raise handshake_failed(address, err) from err
        self.ids = itertools.count(1)
        self.effects: list[Any] = []
        self.welcome: dict[str, Any] = {}
        challenge = protocol.recv_frame(self.sock)
        if challenge.get("op") == protocol.ERROR:
            self.sock.close()
            raise ProtocolError(challenge.get("code", "bad_frame"), challenge.get("message", ""))
        protocol.send_frame(self.sock, protocol.hello(client_key, challenge["nonce"], name))
        answer = protocol.recv_frame(self.sock)
        if answer["op"] != protocol.WELCOME:
            self.sock.close()
            raise ProtocolError(answer.get("code", "auth_failed"), answer.get("message", ""))
        self.welcome = answer
        self.connection = fifo.decode(answer["connection"])

    def close(self) -> None:
        """Close the socket."""
        with contextlib.suppress(OSError):
            self.sock.close()

    def request(self, message: dict[str, Any]) -> dict[str, Any]:
        """Send one request and return the frame answering it (effects are collected)."""
        protocol.send_frame(self.sock, message)
        return self.wait_for(message["id"])

    def wait_for(self, request_id: int) -> dict[str, Any]:
        """Read frames until the one with `id == request_id`."""
        while True:
            frame = protocol.recv_frame(self.sock)
            if frame["op"] == protocol.EFFECT:
                self.effects.append(fifo.decode(frame["effect"]))
            elif frame.get("id") == request_id:
                return frame

    def command(self, command: Any) -> Any:
        """Run a command; returns the decoded fifo reply or raises ProtocolError."""
        frame = self.request(protocol.command(next(self.ids), fifo.encode(command)))
        if frame["op"] == protocol.ERROR:
            raise ProtocolError(frame["code"], frame["message"])
        return fifo.decode(frame["reply"])

    def query(self, name: str, **args: Any) -> Any:
        """Run a query; returns its result or raises ProtocolError."""
        frame = self.request(protocol.query(next(self.ids), name, args))
        if frame["op"] == protocol.ERROR:
            raise ProtocolError(frame["code"], frame["message"])
        return frame["result"]

    def admin(self, action: str, **args: Any) -> Any:
        """Run an admin action; returns its result or raises ProtocolError."""
        frame = self.request(protocol.admin(next(self.ids), action, args))
        if frame["op"] == protocol.ERROR:
            raise ProtocolError(frame["code"], frame["message"])
        return frame["result"]

    def read_effects(self, count: int, timeout_s: float = 5.0) -> list[Any]:
        """Wait until at least `count` effects were received; returns them all."""
        deadline = time.monotonic() + timeout_s
        while len(self.effects) < count and time.monotonic() < deadline:
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                frame = protocol.recv_frame(self.sock)
            except TimeoutError:
                break
            if frame["op"] == protocol.EFFECT:
                self.effects.append(fifo.decode(frame["effect"]))
        self.sock.settimeout(10)
        return list(self.effects)

"""One log line per listener a node opens: which address and port it took (`listening`).

Every listener of a node (client, peer, AMQP, metrics, management HTTP) logs
`listening listener=NAME address=HOST:PORT tls=BOOL` once per bound socket, so an operator on a
multi-host deployment reads in node.log which interface each port is on.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import socket
import sys
import time
from collections.abc import Iterable
from pathlib import Path

import structlog

log = structlog.get_logger("cluster.node")


def socket_address(name: object) -> str:
    """`HOST:PORT` (IPv4, names) or `[HOST]:PORT` (IPv6) of a getsockname() result."""
    if isinstance(name, tuple) and len(name) >= 2:
        host, port = str(name[0]), int(name[1])
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return str(name)


def log_sockets(listener: str, sockets: Iterable[socket.socket], tls: bool) -> list[str]:
    """Log one `listening` line per bound socket of `listener`; the addresses logged."""
    addresses = [socket_address(sock.getsockname()) for sock in sockets]
    for address in addresses:
        log.info("listening", listener=listener, address=address, tls=tls)
    return addresses


def log_address(listener: str, address: str, tls: bool) -> None:
    """Log a listener's address (one whose socket a library owns: metrics, HTTP, peer)."""
    log.info("listening", listener=listener, address=address, tls=tls)


PROC_TCP_FILES = ("/proc/net/tcp", "/proc/net/tcp6")
TCP_LISTEN_STATE = "0A"
PEER_BIND_WAIT_S = 10.0


def _proc_address(field: str) -> tuple[str, int]:
    """An `ADDRESS:PORT` field of /proc/net/tcp(6): hex, 32-bit words in host byte order."""
    address_hex, port_hex = field.split(":")
    words = [int(address_hex[i : i + 8], 16) for i in range(0, len(address_hex), 8)]
    packed = b"".join(word.to_bytes(4, sys.byteorder) for word in words)
    # not socket.inet_ntop: pysyncobj (win_inet_pton) replaces it, in every process that
    # imports it, by a Windows-only version that raises
    return str(ipaddress.ip_address(packed)), int(port_hex, 16)


def listening_on(port: int, host: str) -> list[str]:
    """The addresses of `host` (resolved) with a TCP socket listening on `port` in this
    network namespace, as `listening` lines write them (read from /proc/net/tcp and tcp6)."""
    try:
        wanted = {info[4][0] for info in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)}
    except OSError:
        return []
    found = []
    for path in PROC_TCP_FILES:
        with contextlib.suppress(OSError):
            for line in Path(path).read_text().splitlines()[1:]:
                fields = line.split()
                address, local_port = _proc_address(fields[1])
                if fields[3] == TCP_LISTEN_STATE and local_port == port and address in wanted:
                    found.append(socket_address((address, port)))
    return found


async def log_when_listening(listener: str, host: str, port: int, tls: bool) -> None:
    """Log `listener`'s `listening` line once another thread's socket listens on `host:port`
    (the peer port, which raft binds on its own thread); a warning after PEER_BIND_WAIT_S."""
    deadline = time.monotonic() + PEER_BIND_WAIT_S
    while time.monotonic() < deadline:
        addresses = listening_on(port, host)
        if addresses:
            for address in addresses:
                log_address(listener, address, tls)
            return
        await asyncio.sleep(0.05)
    log.warning("not_listening", listener=listener, host=host, port=port, seconds=PEER_BIND_WAIT_S)

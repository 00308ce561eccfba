"""One log line per listener a node opens: which address and port it took (`listening`).

Every listener of a node (client, peer, AMQP, metrics, management HTTP) logs
`listening listener=NAME address=HOST:PORT tls=BOOL` once per bound socket, so an operator on a
multi-host deployment reads in node.log which interface each port is on.
"""

from __future__ import annotations

import socket
from collections.abc import Iterable

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
    """Log a listener whose socket another thread owns (the peer port, bound by raft)."""
    log.info("listening", listener=listener, address=address, tls=tls)

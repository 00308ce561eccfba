"""Root-free network faults on loopback: one TCP proxy per directed peer link.

Node `a` dials peer `b` at the address of proxy (a -> b), which forwards to `b`'s real Raft
port. Each proxy has two directions: `forward` (bytes from the dialer a to b) and `backward`
(bytes from b back to a). pysyncobj keeps one TCP connection per pair, opened by one side only,
so a one-way cut "a cannot send to b" blocks `forward` on (a -> b) and `backward` on (b -> a):
whichever side dials, the cut holds. Modes per direction:
- pass: forward bytes as they come;
- blackhole: stop reading (bytes stay in the kernel, no FIN/RST: peers notice only by timeout,
  like an iptables DROP); held bytes flow again once the direction passes;
- delay: sleep `delay_ms` before forwarding each chunk;
- reset (whole link, both directions): close every connection and refuse new ones, like a
  crashed host or an iptables REJECT.
Threads, not asyncio: the harness is threaded and a proxy must keep working while a node is
SIGSTOPped or the harness is busy.
"""

from __future__ import annotations

import contextlib
import itertools
import select
import socket
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

Mode = Literal["pass", "blackhole", "delay", "reset"]
Direction = Literal["forward", "backward", "both"]
MODES: tuple[str, ...] = ("pass", "blackhole", "delay", "reset")

CHUNK_BYTES_MAX = 65536
POLL_S = 0.05  # how quickly a pump notices a mode change or a close
CONNECT_TIMEOUT_S = 2.0
BACKLOG = 16


@dataclass(slots=True)
class _Conn:
    """One proxied connection: the accepted socket and the one dialed to the target."""

    client: socket.socket
    upstream: socket.socket
    closed: bool = False

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for sock in (self.client, self.upstream):
            # shutdown first: it wakes a pump blocked in select/recv on the other thread.
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()


@dataclass(slots=True)
class _DirectionState:
    mode: Mode = "pass"
    delay_ms: int = 0
    bytes_forwarded: int = 0


@dataclass(slots=True)
class _LinkState:
    forward: _DirectionState = field(default_factory=_DirectionState)
    backward: _DirectionState = field(default_factory=_DirectionState)
    refusing: bool = False


class LinkProxy:
    """A TCP proxy for one directed link, listening on an ephemeral 127.0.0.1 port."""

    def __init__(self, target: tuple[str, int], name: str = "", host: str = "127.0.0.1") -> None:
        self.target = target
        self.name = name or f"proxy->{target[0]}:{target[1]}"
        self._state = _LinkState()
        self._lock = threading.Lock()
        self._conns: list[_Conn] = []
        self._stopped = threading.Event()
        self._server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._server.bind((host, 0))
        self._server.listen(BACKLOG)
        self._server.settimeout(POLL_S * 4)
        self.address: tuple[str, int] = self._server.getsockname()[:2]
        self._acceptor = threading.Thread(target=self._accept_loop, name=self.name, daemon=True)
        self._acceptor.start()

    @property
    def address_str(self) -> str:
        """`host:port` of the listening side (what the dialing node must use)."""
        return f"{self.address[0]}:{self.address[1]}"

    def set_mode(self, mode: Mode, direction: Direction = "both", delay_ms: int = 0) -> None:
        """Switch a direction (or both) to `mode`; "reset" always applies to the whole link."""
        if mode not in MODES:
            raise ValueError(f"unknown proxy mode {mode!r}")
        if mode == "reset":
            with self._lock:
                self._state.refusing = True
            self.reset_connections()
            return
        with self._lock:
            self._state.refusing = False
            for state in self._directions(direction):
                state.mode = mode
                state.delay_ms = delay_ms if mode == "delay" else 0

    def heal(self) -> None:
        """Pass both directions without delay and accept connections again."""
        self.set_mode("pass", "both")

    def mode(self, direction: Literal["forward", "backward"]) -> Mode:
        """The current mode of one direction ("reset" while the link refuses connections)."""
        with self._lock:
            if self._state.refusing:
                return "reset"
            state = self._state.forward if direction == "forward" else self._state.backward
            return state.mode

    def bytes_forwarded(self) -> tuple[int, int]:
        """Bytes forwarded so far (forward, backward)."""
        with self._lock:
            return self._state.forward.bytes_forwarded, self._state.backward.bytes_forwarded

    def open_connections(self) -> int:
        """How many proxied connections are open now."""
        with self._lock:
            return sum(1 for conn in self._conns if not conn.closed)

    def reset_connections(self) -> None:
        """Close every proxied connection now (new ones are accepted unless refusing)."""
        with self._lock:
            conns, self._conns = self._conns, []
        for conn in conns:
            conn.close()

    def close(self) -> None:
        """Stop accepting, close every connection and the listening socket."""
        self._stopped.set()
        self.reset_connections()
        self._acceptor.join(timeout=2)
        self._server.close()

    def _directions(self, direction: Direction) -> list[_DirectionState]:
        if direction == "forward":
            return [self._state.forward]
        if direction == "backward":
            return [self._state.backward]
        return [self._state.forward, self._state.backward]

    def _accept_loop(self) -> None:
        while not self._stopped.is_set():
            try:
                client, _ = self._server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with self._lock:
                refusing = self._state.refusing
            if refusing:
                client.close()
                continue
            self._connect(client)

    def _connect(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection(self.target, timeout=CONNECT_TIMEOUT_S)
        except OSError:
            client.close()  # the target is down: the dialer sees a closed connection
            return
        for sock in (client, upstream):
            sock.settimeout(None)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn = _Conn(client, upstream)
        with self._lock:
            self._conns.append(conn)
        for src, dst, state in (
            (client, upstream, self._state.forward),
            (upstream, client, self._state.backward),
        ):
            threading.Thread(
                target=self._pump, args=(conn, src, dst, state), name=self.name, daemon=True
            ).start()

    def _pump(
        self, conn: _Conn, src: socket.socket, dst: socket.socket, state: _DirectionState
    ) -> None:
        try:
            while not conn.closed:
                if not self._wait_until_open(conn, state):
                    return
                if not _readable(src):
                    continue
                data = src.recv(CHUNK_BYTES_MAX)
                if not data:
                    break
                # The mode may have changed while we waited for data: hold, do not drop.
                if not self._wait_until_open(conn, state):
                    return
                if state.delay_ms:
                    time.sleep(state.delay_ms / 1000)
                dst.sendall(data)
                with self._lock:
                    state.bytes_forwarded += len(data)
        except OSError:
            pass
        conn.close()

    def _wait_until_open(self, conn: _Conn, state: _DirectionState) -> bool:
        """Block while the direction is blackholed; False once the connection is closed."""
        while state.mode == "blackhole" and not conn.closed:
            time.sleep(POLL_S)
        return not conn.closed


def _readable(sock: socket.socket) -> bool:
    readable, _, _ = select.select([sock], [], [], POLL_S)
    return bool(readable)


class ProxyMesh:
    """One LinkProxy per ordered pair of nodes, with partition helpers over them."""

    def __init__(self, raft_addresses: dict[str, str]) -> None:
        self.nodes = list(raft_addresses)
        self.addresses = dict(raft_addresses)
        self.proxies: dict[tuple[str, str], LinkProxy] = {}
        for source, target in itertools.permutations(self.nodes, 2):
            self._add_link(source, target)

    def _add_link(self, source: str, target: str) -> None:
        host, port = self.addresses[target].rsplit(":", 1)
        self.proxies[(source, target)] = LinkProxy(
            (host, int(port)), name=f"link-{source}->{target}"
        )

    def add_node(self, node: str, raft_address: str) -> None:
        """Proxies for every link between `node` (a member being added) and the others."""
        if node in self.addresses:
            raise ValueError(f"{node} is already in the mesh")
        self.addresses[node] = raft_address
        for peer in self.nodes:
            self._add_link(peer, node)
            self._add_link(node, peer)
        self.nodes.append(node)

    def remove_node(self, node: str) -> None:
        """Close and forget every link of `node` (a member removed for good)."""
        for link in [link for link in self.proxies if node in link]:
            self.proxies.pop(link).close()
        if node in self.nodes:
            self.nodes.remove(node)
        self.addresses.pop(node, None)

    def peer_addresses(self, node: str) -> dict[str, str]:
        """Where `node` must dial each peer (the proxy addresses), by peer id."""
        return {t: p.address_str for (s, t), p in self.proxies.items() if s == node}

    def cut(self, source: str, target: str, mode: Mode = "blackhole") -> None:
        """No bytes from `source` reach `target` (one way), whichever side dialed."""
        if mode == "reset":
            self.proxies[(source, target)].set_mode("reset")
            self.proxies[(target, source)].set_mode("reset")
            return
        self.proxies[(source, target)].set_mode(mode, "forward")
        self.proxies[(target, source)].set_mode(mode, "backward")

    def isolate(self, node: str, mode: Mode = "blackhole") -> None:
        """Cut `node` off from every peer, both ways."""
        for peer in self.nodes:
            if peer != node:
                self.cut(node, peer, mode)
                self.cut(peer, node, mode)

    def partition(self, groups: Iterable[Iterable[str]], mode: Mode = "blackhole") -> None:
        """Only nodes of the same group can talk."""
        group_of = {node: index for index, group in enumerate(groups) for node in group}
        for source, target in itertools.permutations(self.nodes, 2):
            if group_of.get(source) != group_of.get(target):
                self.cut(source, target, mode)

    def heal(self) -> None:
        """Every link passes again."""
        for proxy in self.proxies.values():
            proxy.heal()

    def close(self) -> None:
        """Close every proxy."""
        for proxy in self.proxies.values():
            proxy.close()

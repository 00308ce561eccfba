"""The per-link TCP proxy with plain sockets: pass, blackhole per direction, delay, reset."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from cluster.chaos.linkproxy import LinkProxy, ProxyMesh

QUIET_S = 0.4  # long enough for a proxy that wrongly forwards to have done so


class Server:
    """A TCP server on an ephemeral port that keeps every accepted socket."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.address: tuple[str, int] = self.sock.getsockname()[:2]
        self.accepted: list[socket.socket] = []
        self._ready = threading.Condition()
        self._acceptor = threading.Thread(target=self._accept, name="test-server", daemon=True)
        self._acceptor.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            conn.settimeout(5)
            with self._ready:
                self.accepted.append(conn)
                self._ready.notify_all()

    def next_conn(self, index: int = 0, timeout_s: float = 5) -> socket.socket:
        with self._ready:
            assert self._ready.wait_for(lambda: len(self.accepted) > index, timeout=timeout_s)
            return self.accepted[index]

    def close(self) -> None:
        # shutdown wakes the acceptor blocked in accept(); a close alone does not (Linux)
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        self._acceptor.join(5)
        for conn in self.accepted:
            conn.close()


@pytest.fixture
def server() -> Iterator[Server]:
    srv = Server()
    yield srv
    srv.close()


@pytest.fixture
def proxy(server: Server) -> Iterator[LinkProxy]:
    link = LinkProxy(server.address, name="test")
    yield link
    link.close()


def dial(proxy: LinkProxy) -> socket.socket:
    return socket.create_connection(proxy.address, timeout=5)


def recv_exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            break
        data += chunk
    return data


def nothing_arrives(sock: socket.socket) -> bool:
    """True when neither bytes nor a close arrive on `sock` for QUIET_S."""
    sock.settimeout(QUIET_S)
    try:
        sock.recv(10)
        return False
    except TimeoutError:
        return True
    finally:
        sock.settimeout(5)


def test_pass_forwards_both_directions_and_counts_bytes(server: Server, proxy: LinkProxy) -> None:
    """In pass mode bytes flow both ways unchanged, and the proxy counts them per direction."""
    client = dial(proxy)
    client.sendall(b"hello")
    upstream = server.next_conn()
    assert recv_exactly(upstream, 5) == b"hello"
    upstream.sendall(b"world!")
    assert recv_exactly(client, 6) == b"world!"
    deadline = time.monotonic() + 5  # the pump counts right after its send returns
    while proxy.bytes_forwarded() != (5, 6) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert proxy.bytes_forwarded() == (5, 6)
    assert proxy.open_connections() == 1
    client.close()


def test_blackhole_forward_is_one_way_and_heal_releases_held_bytes(
    server: Server, proxy: LinkProxy
) -> None:
    """A forward blackhole holds dialer->target bytes (no FIN/RST), lets the reply way pass."""
    client = dial(proxy)
    client.sendall(b"a")
    upstream = server.next_conn()
    assert recv_exactly(upstream, 1) == b"a"
    proxy.set_mode("blackhole", "forward")
    client.sendall(b"held")
    assert nothing_arrives(upstream)
    upstream.sendall(b"back")
    assert recv_exactly(client, 4) == b"back"
    proxy.heal()
    assert recv_exactly(upstream, 4) == b"held"
    client.close()


def test_blackhole_backward_holds_replies_only(server: Server, proxy: LinkProxy) -> None:
    """A backward blackhole holds target->dialer bytes while dialer->target still flows."""
    client = dial(proxy)
    proxy.set_mode("blackhole", "backward")
    client.sendall(b"ping")
    upstream = server.next_conn()
    assert recv_exactly(upstream, 4) == b"ping"
    upstream.sendall(b"pong")
    assert nothing_arrives(client)
    assert proxy.mode("backward") == "blackhole" and proxy.mode("forward") == "pass"
    proxy.heal()
    assert recv_exactly(client, 4) == b"pong"
    client.close()


def test_reset_closes_open_connections_and_refuses_new_ones(
    server: Server, proxy: LinkProxy
) -> None:
    """Reset closes what is open and refuses new dials until heal; then dials work again."""
    client = dial(proxy)
    client.sendall(b"x")
    assert recv_exactly(server.next_conn(), 1) == b"x"
    proxy.set_mode("reset")
    assert _closed_by_peer(client)
    refused = dial(proxy)
    assert _closed_by_peer(refused)
    proxy.heal()
    again = dial(proxy)
    again.sendall(b"y")
    assert recv_exactly(server.next_conn(1), 1) == b"y"
    again.close()


def test_delay_holds_each_chunk_for_at_least_the_delay(server: Server, proxy: LinkProxy) -> None:
    """With delay 300 ms forward, a chunk takes at least that long to get through."""
    proxy.set_mode("delay", "forward", delay_ms=300)
    client = dial(proxy)
    upstream_ready = time.monotonic()
    client.sendall(b"slow")
    upstream = server.next_conn()
    assert recv_exactly(upstream, 4) == b"slow"
    assert time.monotonic() - upstream_ready >= 0.3
    client.close()


def test_dial_to_a_dead_target_is_closed() -> None:
    """When the target is down the dialer sees its connection closed, as with a dead peer."""
    dead = socket.create_server(("127.0.0.1", 0))
    address = dead.getsockname()[:2]
    dead.close()
    link = LinkProxy(address)
    try:
        assert _closed_by_peer(dial(link))
    finally:
        link.close()


def test_mesh_cut_blocks_one_direction_whichever_side_dials() -> None:
    """cut(a, b) stops a->b bytes both on a's dial to b and on b's dial to a; b->a still flows."""
    servers = {"a": Server(), "b": Server()}
    mesh = ProxyMesh({n: f"{s.address[0]}:{s.address[1]}" for n, s in servers.items()})
    try:
        a_to_b = _dial_str(mesh.peer_addresses("a")["b"])  # a dials b
        b_to_a = _dial_str(mesh.peer_addresses("b")["a"])  # b dials a
        at_b, at_a = servers["b"].next_conn(), servers["a"].next_conn()
        mesh.cut("a", "b")
        a_to_b.sendall(b"1")
        assert nothing_arrives(at_b)  # a's bytes on a's own dial
        at_a.sendall(b"2")
        assert nothing_arrives(b_to_a)  # a's bytes on b's dial
        at_b.sendall(b"3")
        assert recv_exactly(a_to_b, 1) == b"3"  # b -> a still passes
        b_to_a.sendall(b"4")
        assert recv_exactly(at_a, 1) == b"4"
        mesh.heal()
        assert recv_exactly(at_b, 1) == b"1"
        assert recv_exactly(b_to_a, 1) == b"2"
    finally:
        mesh.close()
        for srv in servers.values():
            srv.close()


def test_mesh_isolate_cuts_every_link_of_one_node_only() -> None:
    """isolate(a) blocks a<->b and a<->c but leaves b<->c alone."""
    servers = {n: Server() for n in ("a", "b", "c")}
    mesh = ProxyMesh({n: f"{s.address[0]}:{s.address[1]}" for n, s in servers.items()})
    try:
        mesh.isolate("a")
        for (source, target), link in mesh.proxies.items():
            expected = "blackhole" if "a" in (source, target) else "pass"
            assert link.mode("forward") == expected and link.mode("backward") == expected
        b_to_c = _dial_str(mesh.peer_addresses("b")["c"])
        b_to_c.sendall(b"ok")
        assert recv_exactly(servers["c"].next_conn(), 2) == b"ok"
    finally:
        mesh.close()
        for srv in servers.values():
            srv.close()


def _dial_str(address: str) -> socket.socket:
    host, port = address.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=5)


def _closed_by_peer(sock: socket.socket) -> bool:
    sock.settimeout(5)
    try:
        return sock.recv(10) == b""
    except ConnectionResetError:
        return True
    finally:
        sock.close()

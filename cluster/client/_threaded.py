"""The threaded shell around `ClientProtocol`: blocking sockets, a reader and a ticker thread.

Every call into the protocol object happens under one lock; bytes are written outside it (a
reader thread must never wait for the socket while holding it) by whichever thread holds the
send lock, in the order they were taken. Waiters block on one condition that every event wakes.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterable, Sequence

import structlog

from cluster.client._wire import AnyFrame, Frame, Handshake, Welcome
from cluster.client.errors import (
    AuthError,
    ClientClosed,
    ClusterError,
    RequestTimeout,
    Unavailable,
)
from cluster.client.sansio import (
    TICK_S,
    Answered,
    ClientProtocol,
    CloseConnection,
    Event,
    ReconnectNeeded,
)

log = structlog.get_logger("quorumq.client")

Callback = Callable[[Frame | None, BaseException | None], None]
RECV_BYTES = 256 * 1024
_Opened = tuple[socket.socket, Welcome, bytes]


def open_socket(address: str, client_key: bytes, name: str, timeout_s: float) -> _Opened:
    """Connect and pass the handshake; the socket, the node's welcome and any early bytes."""
    host, _, port = address.rpartition(":")
    sock = socket.create_connection((host, int(port)), timeout=timeout_s)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        handshake = Handshake(address, client_key, name)
        welcome: Welcome | None = None
        while welcome is None:
            try:
                chunk = sock.recv(RECV_BYTES)
            except ConnectionError as err:
                raise handshake.connection_closed() from err
            if not chunk:
                raise handshake.connection_closed()
            welcome = handshake.receive_data(chunk)
            sock.sendall(handshake.data_to_send())
        sock.settimeout(None)
    except BaseException:
        sock.close()
        raise
    return sock, welcome, handshake.leftover


class _Waiter:
    """A one-shot result slot for a synchronous call."""

    __slots__ = ("answer", "error", "event")

    def __init__(self) -> None:
        self.event = threading.Event()
        self.answer: Frame | None = None
        self.error: BaseException | None = None

    def __call__(self, answer: Frame | None, error: BaseException | None) -> None:
        self.answer, self.error = answer, error
        self.event.set()


class ThreadedShell:
    """Drives a `ClientProtocol` with threads; `Client` adds the user-facing calls."""

    def __init__(
        self,
        endpoints: Sequence[str],
        client_key: bytes,
        *,
        name: str,
        connect_timeout_s: float,
        request_timeout_s: float,
        reconnect_timeout_s: float,
        reconnect: bool,
        silence_timeout_s: float,
        connect_retry_s: float | None,
        prefer_leader: bool,
    ) -> None:
        self._core = ClientProtocol(
            endpoints,
            name=name,
            reconnect=reconnect,
            silence_timeout_s=silence_timeout_s,
            now=time.monotonic(),
        )
        self._client_key = client_key
        self.name = name
        self.connect_timeout_s = connect_timeout_s
        self.request_timeout_s = request_timeout_s
        self.reconnect_timeout_s = reconnect_timeout_s
        self.silence_timeout_s = silence_timeout_s
        self.prefer_leader = prefer_leader
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        self._send_lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._callbacks: dict[int, Callback] = {}
        retry_s = connect_timeout_s if connect_retry_s is None else connect_retry_s
        opened = self._connect_any(self._core.endpoints, time.monotonic() + retry_s)
        self._attach(self._leader_instead(opened) if prefer_leader else opened)
        self._ticker = threading.Thread(target=self._tick_loop, name="qq-ticker", daemon=True)
        self._ticker.start()

    # --- connecting ------------------------------------------------------------------------

    def _connect_any(self, endpoints: list[str], deadline: float) -> _Opened:
        errors: list[str] = []
        while True:
            if self._core.closed:
                raise ClientClosed("the client was closed")
            for address in endpoints:
                try:
                    return open_socket(address, self._client_key, self.name, self.connect_timeout_s)
                except AuthError:
                    raise
                except (OSError, ClusterError, ValueError) as err:
                    errors.append(f"{address}: {err}")
            if time.monotonic() >= deadline:
                tried = "; ".join(errors[-len(endpoints) :])
                raise Unavailable(f"no quorumq node reachable ({tried})")
            time.sleep(0.1)

    def _leader_instead(self, opened: _Opened) -> _Opened:
        """A connection to the leader the node named, if it differs and answers; else `opened`.

        Commands reach the log through the leader anyway; going there directly saves the
        forwarding hop. Any failure keeps the connection we have.
        """
        address = opened[1].leader_address()
        if address is None:
            return opened
        try:
            leader = open_socket(address, self._client_key, self.name, self.connect_timeout_s)
        except (OSError, ClusterError, ValueError):
            return opened
        _shut(opened[0])
        return leader

    def _attach(self, opened: _Opened) -> None:
        sock, welcome, leftover = opened
        with self._lock:
            if self._core.closed:
                _shut(sock)
                return
            self._sock = sock
            events = self._core.connection_made(welcome, now=time.monotonic())
            events += self._core.receive_data(leftover)
            self._changed.notify_all()
        threading.Thread(
            target=self._read_loop, args=(sock,), name=f"qq-reader-{welcome.address}", daemon=True
        ).start()
        self._flush()
        self._handle(events)

    def _reconnect(self, endpoints: tuple[str, ...]) -> None:
        try:
            opened = self._connect_any(list(endpoints), time.monotonic() + self.reconnect_timeout_s)
        except ClusterError as err:
            with self._lock:
                events = self._core.fail(err)
            self._handle(events)
            return
        self._attach(opened)

    # --- the reader and ticker threads ------------------------------------------------------

    def _read_loop(self, sock: socket.socket) -> None:
        error: BaseException | None = None
        try:
            while True:
                chunk = sock.recv(RECV_BYTES)
                if not chunk:
                    raise ConnectionError("the node closed the connection")
                with self._lock:
                    if self._sock is not sock:
                        return
                    events = self._core.receive_data(chunk)
                self._flush()
                self._handle(events)
        except BaseException as err:  # any end of the socket is reported once, below
            error = err
        finally:
            _shut(sock)
            with self._lock:
                events = []
                if self._sock is sock:
                    self._sock = None
                    events = self._core.connection_lost(error)
                    self._changed.notify_all()
            self._handle(events)

    def _tick_loop(self) -> None:
        while not self._core.closed and self._core.failure is None:
            time.sleep(TICK_S)
            with self._lock:
                events = self._core.tick(time.monotonic())
            self._flush()
            self._handle(events)

    def _flush(self) -> None:
        """Write what the protocol has to send; a thread already writing takes it instead."""
        while self._core.has_output:
            if not self._send_lock.acquire(blocking=False):
                return  # its holder checks for more output after it lets go
            try:
                while True:
                    with self._lock:
                        data, sock = self._core.data_to_send(), self._sock
                    if not data or sock is None:
                        break
                    try:
                        sock.sendall(data)
                    except OSError:
                        _shut(sock)  # the reader reports it; the reconnect resends
            finally:
                self._send_lock.release()

    def _handle(self, events: list[Event]) -> None:
        if not events:
            return
        calls: list[tuple[Callback, Frame | None, BaseException | None]] = []
        with self._lock:
            for event in events:
                if isinstance(event, Answered):
                    callback = self._callbacks.pop(event.request_id, None)
                    if callback is not None:
                        calls.append((callback, event.answer, event.error))
                elif isinstance(event, CloseConnection) and self._sock is not None:
                    _shut(self._sock)
                elif isinstance(event, ReconnectNeeded):
                    threading.Thread(
                        target=self._reconnect,
                        args=(event.endpoints,),
                        name="qq-reconnect",
                        daemon=True,
                    ).start()
            self._changed.notify_all()
        for callback, answer, error in calls:
            try:
                callback(answer, error)
            except Exception:  # a failing callback must not kill the reader thread
                log.exception("callback_failed")

    # --- requests and waiting ---------------------------------------------------------------

    def submit(
        self,
        frames: Iterable[Frame],
        callbacks: Iterable[Callback],
        timeout_s: float | None = None,
    ) -> list[int]:
        """Send frames (ids set here) in one write; each callback gets its answer frame once."""
        ids: list[int] = []
        with self._lock:
            for frame, callback in zip(frames, callbacks, strict=True):
                request_id = self._core.submit(frame, timeout_s, now=time.monotonic())
                self._callbacks[request_id] = callback
                ids.append(request_id)
        self._flush()
        return ids

    def forget(self, request_ids: Iterable[int]) -> None:
        """Stop tracking requests (a resend supersedes them); their late answers are ignored."""
        request_ids = list(request_ids)
        with self._lock:
            self._core.forget(request_ids)
            for request_id in request_ids:
                self._callbacks.pop(request_id, None)

    def _request(self, send: Callable[[], int], timeout_s: float, what: str) -> AnyFrame:
        """Make one request with `send` (under the lock) and wait for its answer frame."""
        waiter = _Waiter()
        with self._lock:
            request_id = send()
            self._callbacks[request_id] = waiter
        self._flush()
        if not waiter.event.wait(timeout_s + 1.0):
            self.forget([request_id])
            raise RequestTimeout(f"no answer to {what} within {timeout_s:.1f}s")
        if waiter.error is not None:
            raise waiter.error
        assert waiter.answer is not None
        return dict(waiter.answer)

    def _wait_until(self, ready: Callable[[], bool], deadline: float | None) -> bool:
        """Block until `ready()` (checked under the lock) or the deadline; False on timeout."""
        with self._changed:
            while not ready():
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._changed.wait(1.0 if left is None else min(left, 1.0))
        return True

    def _shutdown(self) -> None:
        """Close the socket and fail what is in flight with ClientClosed."""
        with self._lock:
            events = self._core.close()
            sock, self._sock = self._sock, None
            self._changed.notify_all()
        if sock is not None:
            _shut(sock)
        self._handle(events)


def _shut(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()

"""The threaded shell around `ClientProtocol`: blocking calls whose caller does the socket I/O.

Leader/follower I/O: a caller that waits (for a confirm, a reply, room in the window) reads and
processes frames from the socket itself, so a publish and its confirm cross only the caller's
thread on the client. One thread at a time owns the socket for reading (`_io_owner`); callers
that want it register in `_io_wanted` before they send, and the connection's reader thread
owns it only while no caller wants it (consumers, callbacks, pushes between calls), and yields
before its next read once one does. The ticker thread drives timeouts and retries.

Every call into the protocol object happens under one lock; the socket is non-blocking, and
bytes are written under the send lock in the order they were taken; what the socket cannot take
now is left in `_unsent` for the owner, which waits for the socket to be writable while it reads
(so no thread ever blocks on a full socket while nobody reads). Callers wait on one condition
that every event and every release of the socket wakes; the reader thread waits on its own.
Needs `select.poll` (Linux, macOS, the BSDs).

With TLS (`tls=`) the socket is an `ssl.SSLSocket`, also non-blocking: a TLS read or write that
cannot proceed raises SSLWantRead/WriteError (handled as "nothing now"; a write is retried with
the same bytes first, as OpenSSL requires); bytes TLS already decrypted sit in the SSL object,
where poll cannot see them, so every read drains `pending()` at once; and one SSL object must
never be read and written by two threads at once, so TLS sends (and closes) also hold the lock
that reads hold.
"""

from __future__ import annotations

import contextlib
import select
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence

from cluster.client._log import get_logger
from cluster.client._options import Settings, ShellView
from cluster.client._requests import Dialing, core_for, no_answer, status_probe
from cluster.client._wire import AnyFrame, Frame, Handshake, Welcome
from cluster.client.errors import ClientClosed, ClusterError
from cluster.client.sansio import Answered, CloseConnection, Event, ReconnectNeeded
from cluster.client.tls import client_context, handshake_failed, server_hostname

log = get_logger("quorumq.client")

Callback = Callable[[Frame | None, BaseException | None], None]
RECV_BYTES = 256 * 1024
POLL_SLICE_S = 1.0  # the longest one poll waits (the owner re-checks its condition after it)
# after a caller stops reading, how long the reader thread leaves the socket to the callers: a
# caller that publishes and then waits for the confirm reads both answers itself
READER_LINGER_S = 0.005
_READABLE = select.POLLIN | select.POLLPRI | select.POLLERR | select.POLLHUP | select.POLLNVAL
_Opened = tuple[socket.socket, Welcome, bytes]
_TLS_WAIT = (ssl.SSLWantReadError, ssl.SSLWantWriteError)


def open_socket(
    address: str,
    client_key: bytes,
    name: str,
    timeout_s: float,
    tls: ssl.SSLContext | None = None,
) -> _Opened:
    """Connect (with `tls`: and pass the TLS handshake, verifying the node's certificate) and
    pass the handshake; the socket, the node's welcome and any early bytes."""
    host, port = server_hostname(address), address.rpartition(":")[2]
    sock = socket.create_connection((host, int(port)), timeout=timeout_s)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if tls is not None:
            try:
                sock = tls.wrap_socket(sock, server_hostname=host)
            except ssl.SSLError as err:
                raise handshake_failed(address, err) from err
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
        sock.setblocking(False)
        leftover = handshake.leftover + _pending_tls(sock)
    except BaseException:
        sock.close()
        raise
    return sock, welcome, leftover


def _pending_tls(sock: socket.socket) -> bytes:
    """The bytes TLS has decrypted but not yet returned (poll never reports them)."""
    chunks = []
    while isinstance(sock, ssl.SSLSocket) and sock.pending():
        chunks.append(sock.recv(sock.pending()))
    return b"".join(chunks)


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


class ThreadedShell(ShellView):
    """Drives a `ClientProtocol` with threads; `Client` adds the user-facing calls."""

    def __init__(self, endpoints: Sequence[str], client_key: bytes, settings: Settings) -> None:
        self.settings = settings
        self._tls = client_context(settings.tls)
        self.core = core_for(endpoints, settings, now=time.monotonic())
        self._client_key = client_key
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)
        self._send_lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._callbacks: dict[int, Callback] = {}
        # who reads the socket (see the module docstring); all under self.lock
        self._io_owner: int | None = None  # thread ident
        self._io_owner_is_reader = False
        self._io_wanted = 0
        self._io_released_at = 0.0
        # the reader thread waits on its own condition: the many events callers wake each
        # other with must not wake it too (on two cores, every needless wake costs the GIL)
        self._reader_wake = threading.Condition(self.lock)
        self._reader_parked = False  # waiting for callers to finish (not lingering)
        self.reads_by_callers = 0  # socket reads made by calling threads ...
        self.reads_by_reader = 0  # ... and by the reader thread (observability, benchmarks)
        # written only under the send lock: bytes taken for `_unsent_sock` and not yet sent
        self._unsent = b""
        self._unsent_sock: socket.socket | None = None
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        try:
            opened = self._connect_any(self.core.endpoints, time.monotonic() + settings.retry_s)
            self._attach(self._leader_instead(opened) if settings.prefer_leader else opened)
        except BaseException:
            self._close_wake()
            raise
        self._tick_wake = threading.Event()  # cut the ticker's wait short (a retry to send)
        self._ticker = threading.Thread(target=self._tick_loop, name="qq-ticker", daemon=True)
        self._ticker.start()

    # --- connecting ------------------------------------------------------------------------

    def _connect_any(self, endpoints: list[str], deadline: float) -> _Opened:
        dialing = Dialing(endpoints, deadline, describe=str)
        while True:
            if self.core.closed:
                raise ClientClosed("the client was closed")
            for address in dialing.endpoints:
                try:
                    return self._open(address)
                except Exception as err:  # (Dialing re-raises what must not be retried)
                    dialing.failed(address, err)
            time.sleep(dialing.pause_after_round(time.monotonic()))

    def _open(self, address: str) -> _Opened:
        return open_socket(address, self._client_key, self.name, self.connect_timeout_s, self._tls)

    def _leader_instead(self, opened: _Opened) -> _Opened:
        """A connection to the leader the node named, if it differs and answers; else `opened`.

        Commands reach the log through the leader anyway; going there directly saves the
        forwarding hop. Any failure keeps the connection we have.
        """
        address = opened[1].leader_address()
        if address is None:
            return opened
        try:
            leader = self._open(address)
        except (OSError, ClusterError, ValueError):
            return opened
        _shut(opened[0])
        return leader

    def _attach(self, opened: _Opened) -> None:
        sock, welcome, leftover = opened
        with self.lock:
            if self.core.closed:
                _shut(sock)
                return
            self._sock = sock
            events = self.core.connection_made(welcome, now=time.monotonic())
            events += self.core.receive_data(leftover)
            self.changed.notify_all()
        threading.Thread(
            target=self._read_loop, args=(sock,), name=f"qq-reader-{welcome.address}", daemon=True
        ).start()
        self.flush()
        self._handle(events)

    def _reconnect(self, endpoints: tuple[str, ...]) -> None:
        try:
            opened = self._connect_any(list(endpoints), time.monotonic() + self.reconnect_timeout_s)
        except ClusterError as err:
            with self.lock:
                events = self.core.fail(err)
            self._handle(events)
            return
        self._attach(opened)

    # --- who reads: the reader thread, or a caller that waits --------------------------------

    def _read_loop(self, sock: socket.socket) -> None:
        """The connection's reader: reads while no caller wants to; ends with the connection."""
        me = threading.get_ident()
        while self._reader_takes(sock, me):
            try:
                poller = self._poller(sock)
                while poller is not None and self._io_step(poller, POLL_SLICE_S, by_reader=True):
                    pass
            finally:
                with self.lock:
                    if self._io_owner == me:
                        self._io_owner, self._io_owner_is_reader = None, False
                        self.changed.notify_all()

    def _reader_takes(self, sock: socket.socket, me: int) -> bool:
        """Wait until the socket is free and no caller wants it; False once `sock` is gone."""
        with self.lock:
            while True:
                if self._sock is not sock:
                    return False
                if self._io_owner is None and not self._io_wanted:
                    linger_s = self._io_released_at + READER_LINGER_S - time.monotonic()
                    if linger_s <= 0:
                        self._io_owner, self._io_owner_is_reader = me, True
                        return True
                    self._reader_wake.wait(linger_s)
                else:
                    self._reader_parked = True
                    try:
                        self._reader_wake.wait(POLL_SLICE_S)
                    finally:
                        self._reader_parked = False

    def _free_for_reader(self) -> None:
        """Wake a parked reader thread if no caller reads nor wants to (locked) and deliveries
        may come (a consumer is attached: they must not wait). Answers and confirms are read by
        the callers that wait for them; otherwise the reader takes the socket when its parked
        wait ends (POLL_SLICE_S). Woken between every publish and its confirm only to go back
        to sleep, it cost the publishing thread a third of its CPU (issue 29)."""
        if (
            self._reader_parked
            and self._io_owner is None
            and not self._io_wanted
            and self.core.has_consumers
        ):
            self._reader_wake.notify_all()

    @contextlib.contextmanager
    def reading(self) -> Iterator[None]:
        """This caller will wait for what it sends: the reader thread must not read its answers.

        Enter before sending; the reader thread stops before its next read (woken if it polls).
        """
        with self.lock:
            self._io_wanted += 1
            if self._io_owner_is_reader:
                self._wake()
        try:
            yield
        finally:
            with self.lock:
                self._io_wanted -= 1
                self._free_for_reader()

    def _pump_until(self, ready: Callable[[], bool], deadline: float | None) -> bool:
        """Block until `ready()` (checked under the lock) or the deadline; False on timeout.

        While it waits, this thread reads and processes frames itself whenever nobody else
        does (leader/follower); otherwise it waits for the reading thread's events.
        """
        me = threading.get_ident()
        with self.lock:
            if ready():  # (the common case of a window with room: no hand-over of the socket)
                return True
        with self.reading():
            with self.lock:
                owned_before = self._io_owner == me
            poller: _Poller | None = None
            try:
                while True:
                    with self.lock:
                        if ready():
                            return True
                        left = None if deadline is None else deadline - time.monotonic()
                        if left is not None and left <= 0:
                            return False
                        slice_s = POLL_SLICE_S if left is None else min(left, POLL_SLICE_S)
                        if self._io_owner is None:
                            self._io_owner, self._io_owner_is_reader = me, False
                        sock = self._sock if self._io_owner == me else None
                        if sock is None:  # another thread reads, or we are between connections
                            self.changed.wait(slice_s)
                            continue
                    if poller is None or poller.sock is not sock:
                        poller = self._poller(sock)
                    if poller is not None:
                        self._io_step(poller, slice_s, by_reader=False)
            finally:
                if not owned_before:
                    with self.lock:
                        if self._io_owner == me:
                            self._io_owner = None
                            self._io_released_at = time.monotonic()
                            self.changed.notify_all()  # a waiting caller takes over

    def _poller(self, sock: socket.socket) -> _Poller | None:
        """A poll set for `sock`; None (and the connection reported lost) once it is closed."""
        try:
            return _Poller(sock, self._wake_r)
        except (OSError, ValueError) as err:  # closed by another thread
            with self.lock:
                events = self._lost(sock, err)
            self._handle(events)
            return None

    def _io_step(self, poller: _Poller, timeout_s: float, *, by_reader: bool) -> bool:
        """Read (and write) what the socket allows, waiting up to `timeout_s` (owner only).

        False when the caller should stop: the connection is gone or, for the reader thread, a
        caller wants the socket.
        """
        sock = poller.sock
        if by_reader and self._io_wanted:
            return False
        if self._unsent and self._unsent_sock is sock:
            self.flush()
        if poller.flowing:  # the last read got data: more is likely there, no poll needed
            received = self._receive(sock, by_reader)
            if received is not None:
                return received
            poller.flowing = False
        want_out = bool(self._unsent) and self._unsent_sock is sock
        try:
            readable, writable, woken = poller.poll(want_out, timeout_s)
        except (OSError, ValueError):  # closed by another thread (close, a lost connection)
            return self._sock is sock and self._receive(sock, by_reader) is not False
        if woken:
            self._drain_wake()
        if writable:
            self.flush()
        if readable:
            received = self._receive(sock, by_reader)
            poller.flowing = received is True
            return received is not False
        return self._sock is sock and not (by_reader and self._io_wanted)

    def _receive(self, sock: socket.socket, by_reader: bool) -> bool | None:
        """Read once from `sock` and feed the protocol; report the end of the connection.

        None when nothing was there to read; False when the caller should stop."""
        events: list[Event] = []
        error: BaseException | None = None
        with self.lock:  # a caller registers in _io_wanted under it: no read after that
            if self._sock is not sock or (by_reader and self._io_wanted):
                return False
            try:
                chunk = sock.recv(RECV_BYTES)
                if chunk and isinstance(sock, ssl.SSLSocket):
                    chunk += _pending_tls(sock)
            except (BlockingIOError, InterruptedError, *_TLS_WAIT):
                return None
            except OSError as err:
                error = err
            else:
                if by_reader:
                    self.reads_by_reader += 1
                else:
                    self.reads_by_callers += 1
                if not chunk:
                    error = ConnectionError("the node closed the connection")
                else:
                    try:
                        events = self.core.receive_data(chunk)
                    except Exception as err:  # a broken stream cannot be resynchronised
                        error = err
                    if self.core.retrying:  # the ticker may be in its idle wait
                        self._tick_wake.set()
            if error is not None:
                events += self._lost(sock, error)
        self.flush()
        self._handle(events)
        return error is None

    def _lost(self, sock: socket.socket, error: BaseException | None) -> list[Event]:
        """Close `sock` and, if it is the current connection, report its end once (locked)."""
        _shut(sock)
        if self._sock is not sock:
            return []
        self._sock = None
        self.changed.notify_all()
        self._reader_wake.notify_all()  # its reader thread ends
        return self.core.connection_lost(error)

    def _wake(self) -> None:
        """Wake the thread that polls the socket (to yield it, or to watch for writability)."""
        with contextlib.suppress(OSError):
            self._wake_w.send(b"\0")

    def _drain_wake(self) -> None:
        with contextlib.suppress(OSError):
            while self._wake_r.recv(4096):
                pass

    def _close_wake(self) -> None:
        self._wake_r.close()
        self._wake_w.close()

    # --- the ticker thread ------------------------------------------------------------------

    def _tick_loop(self) -> None:
        while not self.core.closed and self.core.failure is None:
            self._tick_wake.wait(self.core.tick_wait_s())
            self._tick_wake.clear()
            with self.lock:
                events = self.core.tick(time.monotonic())
            self.flush()
            self._handle(events)

    # --- writing and events -----------------------------------------------------------------

    def flush(self) -> None:
        """Write what the protocol has to send, without blocking; a thread already writing
        takes it instead, and what the socket cannot take now is left to the reading thread."""
        while self.core.has_output or self._unsent:
            if not self._send_lock.acquire(blocking=False):
                return  # its holder checks for more output after it lets go
            try:
                blocked = self._send_locked()
            finally:
                self._send_lock.release()
            if blocked:
                with self.lock:
                    if self._io_owner not in (None, threading.get_ident()):
                        self._wake()  # the owner polls for writability from now on
                return

    def _send_locked(self) -> bool:
        """Send `_unsent` then the protocol's output (send lock held); True when the socket is
        full (the rest stays in `_unsent`)."""
        while True:
            with self.lock:
                sock = self._sock
                unsent = self._unsent if self._unsent_sock is sock else b""
                data = unsent + self.core.data_to_send() if unsent else self.core.data_to_send()
                self._unsent, self._unsent_sock = b"", sock
                if not data or sock is None:
                    return False  # bytes of a lost connection are dropped (the reconnect resends)
                tls = isinstance(sock, ssl.SSLSocket)
                if tls:  # one SSL object is never read and written at once
                    sent = _send_some(sock, data)
            if not tls:
                sent = _send_some(sock, data)
            if sent < 0:
                return False  # the reading thread reports the loss; the reconnect resends
            if sent < len(data):
                self._unsent = data[sent:]  # TLS: the retry starts with these same bytes
                return True

    def _handle(self, events: list[Event]) -> None:
        if not events:
            return
        calls: list[tuple[Callback, Frame | None, BaseException | None]] = []
        pending = list(events)
        with self.lock:
            while pending:
                event = pending.pop(0)
                if isinstance(event, Answered):
                    callback = self._callbacks.pop(event.request_id, None)
                    if callback is not None:
                        calls.append((callback, event.answer, event.error))
                elif isinstance(event, CloseConnection) and self._sock is not None:
                    closed = ConnectionError(f"closed by the client: {event.reason}")
                    pending += self._lost(self._sock, closed)
                elif isinstance(event, ReconnectNeeded):
                    threading.Thread(
                        target=self._reconnect,
                        args=(event.endpoints,),
                        name="qq-reconnect",
                        daemon=True,
                    ).start()
            self.changed.notify_all()
        for callback, answer, error in calls:
            try:
                callback(answer, error)
            except Exception:  # a failing callback must not kill the reading thread
                log.exception("callback_failed")
        if calls:
            with self.lock:  # waiters check what the callbacks set
                self.changed.notify_all()

    # --- requests and waiting ---------------------------------------------------------------

    def submit(
        self,
        frames: Iterable[Frame],
        callbacks: Iterable[Callback],
        timeout_s: float | None = None,
    ) -> list[int]:
        """Send frames (ids set here) in one write; each callback gets its answer frame once."""
        ids: list[int] = []
        with self.lock:
            for frame, callback in zip(frames, callbacks, strict=True):
                request_id = self.core.submit(frame, timeout_s, now=time.monotonic())
                self._callbacks[request_id] = callback
                ids.append(request_id)
        self.flush()
        return ids

    def forget(self, request_ids: Iterable[int]) -> None:
        """Stop tracking requests (a resend supersedes them); their late answers are ignored."""
        request_ids = list(request_ids)
        with self.lock:
            self.core.forget(request_ids)
            for request_id in request_ids:
                self._callbacks.pop(request_id, None)

    def request(
        self, send: Callable[[], int], timeout_s: float, what: str, *, explain: bool = True
    ) -> AnyFrame:
        """Make one request with `send` (under the lock) and wait for its answer frame, reading
        it on this thread."""
        waiter = _Waiter()
        with self.reading():
            with self.lock:
                request_id = send()
                self._callbacks[request_id] = waiter
            self.flush()
            answered = self._pump_until(waiter.event.is_set, time.monotonic() + timeout_s + 1.0)
        if not answered:
            self.forget([request_id])
            waiter.error = no_answer(what, timeout_s)
        if isinstance(waiter.error, ClusterError) and explain:
            raise self.explain(waiter.error)
        if waiter.error is not None:
            raise waiter.error
        assert waiter.answer is not None
        return dict(waiter.answer)

    def explain(self, error: ClusterError) -> ClusterError:
        """A timeout becomes Unavailable when the node says it has no quorum (a status query,
        answered without the log); any other error, or no answer, stays as it is."""
        probe = status_probe(self.core, error, time.monotonic)
        if probe is None:
            return error
        try:
            answer = self.request(probe.send, probe.timeout_s, "status", explain=False)
        except ClusterError:
            return error
        return probe.explain(answer, error)

    def wait_until(self, ready: Callable[[], bool], deadline: float | None) -> bool:
        """Block until `ready()` (checked under the lock) or the deadline; False on timeout.
        The waiting thread reads the socket itself while nobody else does."""
        return self._pump_until(ready, deadline)

    def _shutdown(self) -> None:
        """Close the socket and fail what is in flight with ClientClosed."""
        with self.lock:
            events = self.core.close()
            sock, self._sock = self._sock, None
            self.changed.notify_all()
            self._reader_wake.notify_all()
            if sock is not None:
                _shut(sock)  # (under the lock: a TLS read may be using the socket)
        self._handle(events)
        self._wake()  # a thread polling the socket returns and sees the client closed
        self._close_wake()


class _Poller:
    """A poll set over one connection's socket and the wake socket, kept across waits."""

    __slots__ = ("_out", "_poll", "fd", "flowing", "sock")

    def __init__(self, sock: socket.socket, wake: socket.socket) -> None:
        self.sock = sock
        self.fd = sock.fileno()
        self.flowing = False  # the last read got data
        self._out = False
        self._poll = select.poll()
        self._poll.register(self.fd, select.POLLIN)
        self._poll.register(wake, select.POLLIN)

    def poll(self, want_out: bool, timeout_s: float) -> tuple[bool, bool, bool]:
        """(readable, writable, woken) after waiting up to `timeout_s`; OSError or ValueError
        when the socket was closed."""
        if self.sock.fileno() != self.fd:
            raise ValueError("the socket was closed")
        if want_out != self._out:
            self._out = want_out
            self._poll.modify(self.fd, select.POLLIN | (select.POLLOUT if want_out else 0))
        readable = writable = woken = False
        for polled, mask in self._poll.poll(max(0, int(timeout_s * 1000))):
            if polled == self.fd:
                readable = bool(mask & _READABLE)
                writable = bool(mask & select.POLLOUT)
            else:
                woken = True
        return readable, writable, woken


def _send_some(sock: socket.socket, data: bytes) -> int:
    """Send what the socket takes now: the count, or -1 after an error (the socket is shut)."""
    try:
        return sock.send(data)
    except (BlockingIOError, InterruptedError, *_TLS_WAIT):
        return 0
    except OSError:
        _shut(sock)
        return -1


def _shut(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()

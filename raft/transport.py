"""quorumq's Raft transport for pysyncobj (its `transportClass`): authenticated compact frames.

pysyncobj's own transport pickles, zlib-compresses and Fernet-encrypts every message, and reads
a length prefix without limit before it checks anything (a 2^31 prefix followed by zeros stalled
a leader's tick thread until another node was elected). This one:

Handshake (once per connection, both directions proven, nothing decoded but fixed-size fields):

    dialer -> listener  HELLO      MAGIC, VERSION, nonce_d (32 bytes), len (2), dialer address
    listener -> dialer  CHALLENGE  MAGIC, VERSION, nonce_l (32), HMAC(K, "L" nonce_d nonce_l addr)
    dialer -> listener  PROOF      HMAC(K, "D" nonce_d nonce_l addr)

`K = HMAC-SHA256(secret, "quorumq raft v1")`. Both sides check with `hmac.compare_digest`; each
proof covers the other side's fresh nonce (a recorded handshake replays nothing) and a
direction label (a proof cannot be reflected). The listener only answers a HELLO naming a
member's address; the hello is read with exact-size reads (at most HELLO_BYTES_MAX bytes), under
a deadline (AUTH_TIMEOUT_S), and at most PENDING_AUTH_MAX incoming connections may be
unauthenticated at once.

Frames (after the handshake, each direction its own key and counter):

    length (4, big-endian, of the body; checked against FRAME_BYTES_MAX before any body byte
    is buffered), body (pysyncobj's message, `raft.peercodec`),
    tag (16) = HMAC-SHA256(key, seq8 body)[:16]

`key_dir = HMAC(K, "dl"|"ld" nonce_d nonce_l)`, `seq` counts this direction's frames from 0
and is never sent: a forged frame, a replayed one, one reordered or spliced from another
connection fails its tag. A failed tag, an oversized length, an undecodable body or a bad
handshake is logged once for the connection (never per byte) and the connection is closed.
Nothing on the peer port is ever unpickled (CBOR cannot build objects); pysyncobj itself still
unpickles log commands, through the allow-list of `raft.safe_pickle`.

Optional TLS (the cluster's `tls = true`: `ssl.SSLContext`s in the settings, built by
cluster/tls.py): the socket is wrapped before the HELLO, mutual TLS 1.3, and the handshake and
frames above run unchanged inside it (TLS for confidentiality, the secret for authentication).
The TLS handshake runs non-blocking in the poller under the same AUTH_TIMEOUT_S; a peer that
fails it (no TLS, another CA, no certificate) is refused and logged once per connection.

Reads are bounded per poll event (READ_BYTES_PER_EVENT), so no peer can hold the tick thread.
pysyncobj's utility messages (`syncobj_admin`) are not served: it cannot speak this protocol.
A node speaking pysyncobj's transport (an older quorumq) is refused with a log line naming it.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import hmac
import os
import socket
import ssl
import struct
from collections import deque
from collections.abc import Callable
from itertools import islice
from typing import Any

import structlog
from pysyncobj.dns_resolver import globalDnsResolver
from pysyncobj.monotonic import monotonic as monotonic_time
from pysyncobj.poller import POLL_EVENT_TYPE
from pysyncobj.tcp_connection import CONNECTION_STATE, _getAddrType, set_keepalive
from pysyncobj.transport import TCPTransport

from raft import peercodec

log = structlog.get_logger("raft.transport")

MAGIC = b"QQRAFT"
VERSION = 1
NONCE_BYTES = 32
MAC_BYTES = 32
TAG_BYTES = 16
ADDRESS_BYTES_MAX = 255
HELLO_HEAD = struct.Struct(">6sB32sH")  # magic, version, nonce, address length
CHALLENGE = struct.Struct(">6sB32s32s")  # magic, version, nonce, mac
HELLO_BYTES_MAX = HELLO_HEAD.size + ADDRESS_BYTES_MAX
LENGTH = struct.Struct(">I")
SEQ = struct.Struct(">Q")
# a frame carries at most one AppendEntries of appendEntriesBatchSizeBytes (64 MiB) and its
# framing; anything claiming more is refused before a byte of its body is buffered
FRAME_BYTES_MAX = 64 * 1024 * 1024 + 1024 * 1024
AUTH_TIMEOUT_S = 2.0
PENDING_AUTH_MAX = 16
READ_BYTES_PER_EVENT = 1024 * 1024
# what pysyncobj's transport sends first: a 4-byte length, then a Fernet token (base64 of 0x80)
_FERNET_PREFIX = b"gAAAAA"

_DIALING, _AWAIT_CHALLENGE, _AWAIT_HELLO, _AWAIT_PROOF, _OPEN, _TLS = range(6)
# the poller does not see bytes TLS has already decrypted (SSLSocket.pending): these say so
_TLS_WAIT = (ssl.SSLWantReadError, ssl.SSLWantWriteError)
SEND_PARTS_MAX = 64  # buffers handed to one sendmsg


def cluster_key(secret: str | bytes) -> bytes:
    """The transport's key, derived from the cluster secret (distinct from the client key)."""
    raw = secret.encode("utf-8") if isinstance(secret, str) else secret
    return hmac.digest(raw, b"quorumq raft v1", "sha256")


def _mac(key: bytes, *parts: bytes) -> bytes:
    return hmac.digest(key, b"".join(parts), "sha256")


class FrameMac:
    """HMAC-SHA256(key, seq8 body) truncated to TAG_BYTES, with the key's inner and outer pads
    hashed once (the same value as `hmac.digest`, at a quarter of its cost per frame)."""

    __slots__ = ("_inner", "_outer")

    def __init__(self, key: bytes) -> None:
        block = key.ljust(64, b"\0")  # keys here are 32 bytes: shorter than SHA-256's block
        self._inner = hashlib.sha256(bytes(b ^ 0x36 for b in block))
        self._outer = hashlib.sha256(bytes(b ^ 0x5C for b in block))

    def tag(self, seq: int, body: bytes | memoryview) -> bytes:
        """The tag of frame number `seq`."""
        inner = self._inner.copy()
        inner.update(SEQ.pack(seq))
        inner.update(body)
        outer = self._outer.copy()
        outer.update(inner.digest())
        return outer.digest()[:TAG_BYTES]


def _tag(key: bytes, seq: int, body: bytes) -> bytes:
    return hmac.digest(key, SEQ.pack(seq) + body, "sha256")[:TAG_BYTES]


def encode_frame(key: bytes, seq: int, message: Any) -> bytes:
    """One authenticated frame (exposed for tests that forge and replay)."""
    body = peercodec.encode(message)
    return LENGTH.pack(len(body)) + body + _tag(key, seq, body)


class PeerConnection:
    """A pysyncobj connection (the TcpConnection interface the transport and SyncObj use)."""

    def __init__(
        self,
        poller: Any,
        key: bytes,
        self_address: str,
        timeout: float,
        send_buffer: int,
        recv_buffer: int,
        keepalive: Any = None,
        sock: socket.socket | None = None,
        is_member: Callable[[str], bool] | None = None,
        last_tick: Callable[[], float] | None = None,
        ssl_context: ssl.SSLContext | None = None,
        server_hostname: str | None = None,
    ) -> None:
        self._poller = poller
        self._ssl_context = ssl_context
        self._server_hostname = server_hostname  # the peer's identity host (a dialer's check)
        self._server_side = sock is not None
        self._tls_wants_write = False  # the TLS handshake waits for the socket to be writable
        self._tls_unread = False  # decrypted bytes left over when a read's budget ran out
        self._last_tick = last_tick
        self._key = key
        self._self_address = self_address
        self._timeout = timeout
        self._send_buffer = send_buffer
        self._recv_buffer = recv_buffer
        self._keepalive = keepalive
        self._is_member = is_member
        self._on_message: Callable[[Any], None] | None = None
        self._on_connected: Callable[[], None] | None = None
        self._on_disconnected: Callable[[], None] | None = None
        self.on_authenticated: Callable[[str], None] | None = None
        self.peer_address: str | None = None
        self.peer: str | None = None  # host:port of the socket's other end, for logs
        self.last_read_time = monotonic_time()
        self.auth_deadline: float | None = None
        self._sock: socket.socket | None = None
        self._fileno: int | None = None
        self._events = 0  # the poller events subscribed to
        self._state: int = CONNECTION_STATE.DISCONNECTED
        self._phase = _DIALING
        self._reset_buffers()
        if sock is not None:  # accepted: we are the listener
            self._attach(sock)
            self._state = CONNECTION_STATE.CONNECTED
            self._phase = _AWAIT_HELLO
            self.auth_deadline = monotonic_time() + AUTH_TIMEOUT_S
            if ssl_context is not None:
                self._start_tls()
            self._subscribe()

    def _reset_buffers(self) -> None:
        self._rbuf = bytearray()
        # unsent bytes: the messages' own buffers, in order (no copy into one growing buffer:
        # a backed-up follower's 4 MiB of them were copied again at each partial send)
        self._wbuf: deque[memoryview] = deque()
        self._wbuf_bytes = 0
        self._nonce = b""
        self._peer_nonce = b""
        self._send_mac: FrameMac | None = None
        self._recv_mac: FrameMac | None = None
        self._send_seq = 0
        self._recv_seq = 0
        self._frame_len = -1
        self._waiting_since: float | None = None  # first send since the peer was last heard

    def _attach(self, sock: socket.socket) -> None:
        self._sock = sock
        self._fileno = sock.fileno()
        try:
            peer = sock.getpeername()
            self.peer = f"{peer[0]}:{peer[1]}"
        except OSError:
            self.peer = None
        if self._keepalive is not None:
            set_keepalive(sock, *self._keepalive)

    # --- pysyncobj's TcpConnection interface --------------------------------------------------

    @property
    def state(self) -> int:
        """CONNECTION_STATE: a dialer is CONNECTING until the handshake is done (pysyncobj
        sends only to CONNECTED connections)."""
        return self._state

    def setOnConnectedCallback(self, callback: Callable[[], None] | None) -> None:
        """Called once the peer is authenticated (dialer side)."""
        self._on_connected = callback

    def setOnMessageReceivedCallback(self, callback: Callable[[Any], None] | None) -> None:
        """Called with each decoded message."""
        self._on_message = callback

    def setOnDisconnectedCallback(self, callback: Callable[[], None] | None) -> None:
        """Called when a connection that was not already disconnected closes."""
        self._on_disconnected = callback

    def fileno(self) -> int | None:
        """The socket's descriptor (None when disconnected)."""
        return self._fileno

    def getSendBufferSize(self) -> int:
        """Bytes waiting to be sent."""
        return self._wbuf_bytes

    def connect(self, host: str | None, port: int) -> bool:
        """Dial `host:port` (non-blocking); the handshake starts once the socket is writable."""
        if host is None:
            return False
        self._close_socket()
        self._reset_buffers()
        sock = socket.socket(_getAddrType(host), socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self._send_buffer)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self._recv_buffer)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setblocking(False)
        try:
            sock.connect((host, port))
        except OSError as err:
            if err.errno not in (errno.EINPROGRESS, errno.EWOULDBLOCK):
                sock.close()
                return False
        self._sock = sock
        self._fileno = sock.fileno()
        self.peer = f"{host}:{port}"
        if self._keepalive is not None:
            set_keepalive(sock, *self._keepalive)
        self._state = CONNECTION_STATE.CONNECTING
        self._phase = _DIALING
        self.last_read_time = monotonic_time()
        self.auth_deadline = monotonic_time() + AUTH_TIMEOUT_S
        self._subscribe()
        return True

    def send(self, message: Any) -> None:
        """Frame, tag and send a message (buffered if the socket is full)."""
        if self._phase != _OPEN:
            return
        body = peercodec.encode(message)
        assert self._send_mac is not None
        tag = self._send_mac.tag(self._send_seq, body)
        self._send_seq += 1
        if self._waiting_since is None:
            self._waiting_since = monotonic_time()
        self._write(LENGTH.pack(len(body)), body, tag)

    def disconnect(self) -> None:
        """Close; calls the disconnected callback if the connection was not already closed."""
        notify = self._on_disconnected is not None and self._state != CONNECTION_STATE.DISCONNECTED
        self._close_socket()
        self._reset_buffers()
        self._state = CONNECTION_STATE.DISCONNECTED
        self._phase = _DIALING
        self.auth_deadline = None
        if notify and self._on_disconnected is not None:
            self._on_disconnected()

    # --- deadlines ------------------------------------------------------------------------------

    def check_deadlines(self, now: float) -> None:
        """Called on every transport tick: close a connection whose handshake overran
        AUTH_TIMEOUT_S (pysyncobj's own connection checked its timeout only when it read or
        wrote, so a handshake the peer never answered stayed half-open for ever), or that has
        heard nothing for the connection timeout since it sent something (a paused or cut-off
        peer: the leader then dials again and catches it up, by a snapshot if it compacted).
        An idle connection that sent nothing stays: two followers have nothing to say to each
        other until an election."""
        if self._state == CONNECTION_STATE.DISCONNECTED:
            return
        if self._tls_unread:  # the last read event stopped at its budget with bytes in TLS
            self._tls_unread = False
            self._read()
            if self._state == CONNECTION_STATE.DISCONNECTED:
                return
        if self.auth_deadline is not None and now > self.auth_deadline:
            if self._phase in (_AWAIT_HELLO, _AWAIT_PROOF) or (
                self._phase == _TLS and self._server_side
            ):
                self._refuse("peer_refused", reason="no handshake", seconds=AUTH_TIMEOUT_S)
            else:  # our own dial: the peer is paused, cut off, or speaks another protocol
                log.info("peer_unresponsive", peer=self.peer, seconds=AUTH_TIMEOUT_S)
                self.disconnect()
        elif self._waiting_since is not None and now - self._waiting_since > self._timeout:
            self.disconnect()

    # --- I/O ------------------------------------------------------------------------------------

    def _subscribe(self) -> None:
        """(Re)subscribe to the poller if the events we need changed (WRITE only while there is
        something to write, or a dial to complete)."""
        if self._fileno is None:
            return
        events = POLL_EVENT_TYPE.READ | POLL_EVENT_TYPE.ERROR
        if (
            self._wbuf
            or self._tls_wants_write
            or (self._phase == _DIALING and self._state == CONNECTION_STATE.CONNECTING)
        ):
            events |= POLL_EVENT_TYPE.WRITE
        if events != self._events:
            self._events = events
            self._poller.subscribe(self._fileno, self._on_event, events)

    def _close_socket(self) -> None:
        self._events = 0
        if self._fileno is not None:
            self._poller.unsubscribe(self._fileno)
            self._fileno = None
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def _refuse(self, event: str, **fields: Any) -> None:
        """Log once for this connection and close it."""
        log.warning(event, peer=self.peer, node=self.peer_address, **fields)
        self.disconnect()

    def _on_event(self, descr: int, event_type: int) -> None:
        if descr != self._fileno:
            self._poller.unsubscribe(descr)
            return
        if event_type & POLL_EVENT_TYPE.ERROR:
            self.disconnect()
            return
        if self._last_tick is not None and monotonic_time() - self._last_tick() > self._timeout:
            # this process did not tick for longer than the connection timeout (paused, or
            # starved): the peer has given this connection up by the same rule, and what it
            # holds is stale; pysyncobj's connection did the same. The peer sends again on a
            # fresh connection (a snapshot, if it compacted meanwhile).
            log.info("peer_connection_stale", peer=self.peer, node=self.peer_address)
            self.disconnect()
            return
        if self._phase == _DIALING and self._state == CONNECTION_STATE.CONNECTING:
            assert self._sock is not None
            if self._sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                self.disconnect()
                return
            if self._ssl_context is not None:
                self._start_tls()
            else:
                self._send_hello()
            if self._state == CONNECTION_STATE.DISCONNECTED:
                return
        if self._phase == _TLS:
            self._tls_handshake()
            if self._state == CONNECTION_STATE.DISCONNECTED or self._phase == _TLS:
                self._subscribe()
                return
        if event_type & POLL_EVENT_TYPE.WRITE:
            self._flush()
            if self._state == CONNECTION_STATE.DISCONNECTED:
                return
        if event_type & POLL_EVENT_TYPE.READ:
            self._read()
            if self._state == CONNECTION_STATE.DISCONNECTED:
                return
        self._subscribe()

    def _write(self, *parts: bytes) -> None:
        """Send `parts` in order after what is buffered; buffer what the socket does not take."""
        if self._sock is None:
            return
        if isinstance(self._sock, ssl.SSLSocket) and len(parts) > 1:
            parts = (b"".join(parts),)  # no sendmsg over TLS: one record
        idle = not self._wbuf
        for part in parts:
            if part:
                self._wbuf.append(memoryview(part))
                self._wbuf_bytes += len(part)
        if idle:
            self._flush()
            if self._wbuf:
                self._subscribe()

    def _flush(self) -> None:
        sock = self._sock
        wbuf = self._wbuf
        while wbuf and sock is not None:
            try:
                if isinstance(sock, ssl.SSLSocket):  # the same head buffer again after a wait
                    sent = sock.send(wbuf[0])
                else:
                    sent = sock.sendmsg(list(islice(wbuf, SEND_PARTS_MAX)))
            except (BlockingIOError, *_TLS_WAIT):
                return
            except OSError:
                self.disconnect()
                return
            if sent <= 0:
                return
            self._wbuf_bytes -= sent
            while sent:
                head = wbuf[0]
                if len(head) > sent:
                    wbuf[0] = head[sent:]
                    break
                wbuf.popleft()
                sent -= len(head)

    def _wanted(self) -> int:
        """How many bytes the current phase may read (exact sizes before authentication)."""
        have = len(self._rbuf)
        if self._phase == _AWAIT_HELLO:
            if have < HELLO_HEAD.size:
                return HELLO_HEAD.size - have
            length: int = HELLO_HEAD.unpack_from(self._rbuf)[3]
            return HELLO_HEAD.size + length - have
        if self._phase == _AWAIT_CHALLENGE:
            return CHALLENGE.size - have
        if self._phase == _AWAIT_PROOF:
            return MAC_BYTES - have
        return self._recv_buffer

    def _read(self) -> None:
        sock = self._sock
        budget = READ_BYTES_PER_EVENT
        while sock is not None and budget > 0 and self._state != CONNECTION_STATE.DISCONNECTED:
            wanted = self._wanted()
            if wanted <= 0:  # a handshake phase is complete but unprocessed (cannot happen)
                break
            asked = min(wanted, budget)
            try:
                data = sock.recv(asked)
            except (BlockingIOError, *_TLS_WAIT):
                break
            except OSError:
                self.disconnect()
                return
            if not data:
                if self._phase != _OPEN:
                    self._refuse("peer_closed_during_handshake", read=len(self._rbuf))
                else:
                    self.disconnect()
                return
            budget -= len(data)
            self.last_read_time = monotonic_time()
            self._waiting_since = None
            self._rbuf += data
            if self._phase == _OPEN:
                self._parse_frames()
            else:
                self._handshake()
            sock = self._sock
            if len(data) < asked and not isinstance(sock, ssl.SSLSocket):
                break  # drained: no failing recv (EAGAIN, raised and caught) to learn it
        if budget <= 0 and isinstance(sock, ssl.SSLSocket) and sock.pending():
            self._tls_unread = True  # read on the next tick: no poll event will say so

    # --- TLS ------------------------------------------------------------------------------------

    def _start_tls(self) -> None:
        """Wrap the connected socket; the TLS handshake then runs from the poller's events."""
        assert self._sock is not None and self._ssl_context is not None
        try:
            self._sock = self._ssl_context.wrap_socket(
                self._sock,
                server_side=self._server_side,
                server_hostname=None if self._server_side else self._server_hostname,
                do_handshake_on_connect=False,
            )
        except (ssl.SSLError, OSError, ValueError) as err:
            self._refuse("peer_refused", reason="TLS setup failed", error=str(err))
            return
        self._phase = _TLS
        self._tls_handshake()

    def _tls_handshake(self) -> None:
        """One step of the non-blocking TLS handshake; once done, the secret's handshake."""
        sock = self._sock
        assert isinstance(sock, ssl.SSLSocket)
        self._tls_wants_write = False
        try:
            sock.do_handshake()
        except ssl.SSLWantReadError:
            return
        except ssl.SSLWantWriteError:
            self._tls_wants_write = True
            return
        except (ssl.SSLError, OSError) as err:  # no TLS, another CA, no certificate, ...
            self._refuse("peer_refused", reason="TLS handshake failed", error=str(err))
            return
        if self._server_side:
            self._phase = _AWAIT_HELLO
            self._read()  # the HELLO may have come with the handshake's last flight
        else:
            self._send_hello()

    # --- the handshake --------------------------------------------------------------------------

    def _send_hello(self) -> None:
        address = self._self_address.encode("utf-8")
        self._nonce = os.urandom(NONCE_BYTES)
        self._phase = _AWAIT_CHALLENGE
        self._write(HELLO_HEAD.pack(MAGIC, VERSION, self._nonce, len(address)) + address)

    def _check_magic(self) -> bool:
        """Whether the first bytes are this protocol so far (False: refused, or wait for more
        bytes to say what they are); a refusal names what the peer seems to speak."""
        head = bytes(self._rbuf[:10])
        n = min(len(head), len(MAGIC))
        if head[:n] == MAGIC[:n]:
            if len(head) > len(MAGIC) and head[len(MAGIC)] != VERSION:
                reason = f"raft transport version {head[6]}, not {VERSION}"
                self._refuse("peer_refused", reason=reason)
                return False
            return True
        if head[:2] == b"\x16\x03":  # a TLS ClientHello record
            self._refuse("peer_refused", reason="speaks TLS: tls = true there, not here")
            return False
        if len(head) < 10 and (len(head) <= 4 or _FERNET_PREFIX.startswith(head[4:])):
            return False  # maybe pysyncobj's transport (a length, then a Fernet token): wait
        if head[4:10] == _FERNET_PREFIX:
            self._refuse(
                "peer_refused",
                reason="speaks pysyncobj's transport (an older quorumq node?): upgrade it",
            )
        else:
            self._refuse("peer_refused", reason="not the quorumq raft protocol", first=head.hex())
        return False

    def _handshake(self) -> None:
        if self._phase == _AWAIT_HELLO:
            if not self._check_magic() or len(self._rbuf) < HELLO_HEAD.size:
                return
            _magic, _version, nonce, length = HELLO_HEAD.unpack_from(self._rbuf)
            if length > ADDRESS_BYTES_MAX:
                self._refuse("peer_refused", reason="hello too long", bytes=length)
                return
            if len(self._rbuf) < HELLO_HEAD.size + length:
                return
            raw = bytes(self._rbuf[HELLO_HEAD.size :])
            del self._rbuf[:]
            try:
                claimed = raw.decode("utf-8")
            except UnicodeDecodeError:
                self._refuse("peer_refused", reason="undecodable address")
                return
            if self._is_member is None or not self._is_member(claimed):
                self._refuse("peer_refused", reason="not a member", claimed=claimed[:64])
                return
            self.peer_address = claimed
            self._peer_nonce = nonce
            self._nonce = os.urandom(NONCE_BYTES)
            mac = _mac(self._key, b"L", nonce, self._nonce, raw)
            self._phase = _AWAIT_PROOF
            self._write(CHALLENGE.pack(MAGIC, VERSION, self._nonce, mac))
        elif self._phase == _AWAIT_CHALLENGE:
            if not self._check_magic() or len(self._rbuf) < CHALLENGE.size:
                return
            _magic, _version, nonce, mac = CHALLENGE.unpack_from(self._rbuf)
            del self._rbuf[:]
            address = self._self_address.encode("utf-8")
            if not hmac.compare_digest(mac, _mac(self._key, b"L", self._nonce, nonce, address)):
                self._refuse("peer_auth_failed", reason="the peer does not hold the cluster secret")
                return
            self._write(_mac(self._key, b"D", self._nonce, nonce, address))
            self._open(self._nonce, nonce, dialer=True)
            if self._on_connected is not None:
                self._on_connected()
        elif self._phase == _AWAIT_PROOF:
            if len(self._rbuf) < MAC_BYTES:
                return
            proof = bytes(self._rbuf[:MAC_BYTES])
            del self._rbuf[:]
            assert self.peer_address is not None
            address = self.peer_address.encode("utf-8")
            expected = _mac(self._key, b"D", self._peer_nonce, self._nonce, address)
            if not hmac.compare_digest(proof, expected):
                self._refuse("peer_auth_failed", reason="the peer does not hold the cluster secret")
                return
            self._open(self._peer_nonce, self._nonce, dialer=False)
            if self.on_authenticated is not None:
                self.on_authenticated(self.peer_address)

    def _open(self, dialer_nonce: bytes, listener_nonce: bytes, dialer: bool) -> None:
        d2l = _mac(self._key, b"dl", dialer_nonce, listener_nonce)
        l2d = _mac(self._key, b"ld", dialer_nonce, listener_nonce)
        send_key, recv_key = (d2l, l2d) if dialer else (l2d, d2l)
        self._send_mac, self._recv_mac = FrameMac(send_key), FrameMac(recv_key)
        self._phase = _OPEN
        self._state = CONNECTION_STATE.CONNECTED
        self.auth_deadline = None

    # --- frames ---------------------------------------------------------------------------------

    def _parse_frames(self) -> None:
        buf = self._rbuf
        offset = 0
        while self._state != CONNECTION_STATE.DISCONNECTED:
            if self._frame_len < 0:
                if len(buf) - offset < LENGTH.size:
                    break
                length = LENGTH.unpack_from(buf, offset)[0]
                if length > FRAME_BYTES_MAX:
                    self._refuse("peer_frame_refused", reason="too large", bytes=length)
                    return
                self._frame_len = length
                offset += LENGTH.size
            end = offset + self._frame_len + TAG_BYTES
            if len(buf) < end:
                break
            with memoryview(buf) as view:
                body = bytes(view[offset : end - TAG_BYTES])
                tag = bytes(view[end - TAG_BYTES : end])
            offset = end
            self._frame_len = -1
            assert self._recv_mac is not None
            if not hmac.compare_digest(tag, self._recv_mac.tag(self._recv_seq, body)):
                self._refuse(
                    "peer_frame_refused",
                    reason="bad tag (forged, replayed, reordered or spliced)",
                    seq=self._recv_seq,
                )
                return
            self._recv_seq += 1
            try:
                message = peercodec.decode(body)
            except peercodec.CodecError as err:  # from a member: a bug, not an attack
                self._refuse("peer_frame_refused", reason="undecodable", error=str(err))
                return
            if self._on_message is not None:
                self._on_message(message)
            if buf is not self._rbuf:  # the callback disconnected (buffers replaced)
                return
        if offset:
            del buf[:offset]


class PeerServer:
    """The listening socket: accepts into PeerConnection (pysyncobj's TcpServer interface)."""

    def __init__(self, transport: QuorumTransport, host: str, port: int) -> None:
        self._transport = transport
        self._host = host
        self._port = int(port)
        self._sock: socket.socket | None = None
        self._fileno: int | None = None

    def bind(self) -> None:
        """Bind and listen (raises on failure: pysyncobj retries)."""
        conf = self._transport.conf
        sock = socket.socket(_getAddrType(self._host), socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, conf.sendBufferSize)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, conf.recvBufferSize)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setblocking(False)
            sock.bind((self._host, self._port))
            sock.listen(64)
        except OSError:
            sock.close()
            raise
        self._sock = sock
        self._fileno = sock.fileno()
        self._transport.poller.subscribe(
            self._fileno, self._on_event, POLL_EVENT_TYPE.READ | POLL_EVENT_TYPE.ERROR
        )

    def unbind(self) -> None:
        """Stop listening."""
        if self._fileno is not None:
            self._transport.poller.unsubscribe(self._fileno)
            self._fileno = None
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def _on_event(self, descr: int, event: int) -> None:
        if self._sock is None:
            return
        if event & POLL_EVENT_TYPE.READ:
            for _ in range(16):
                try:
                    sock, _addr = self._sock.accept()
                except (BlockingIOError, InterruptedError):
                    break
                except OSError as err:
                    if err.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                        log.error("peer_accept_failed", error=str(err))
                        break
                    self.unbind()
                    return
                self._transport.accept(sock)
        if event & POLL_EVENT_TYPE.ERROR:
            self.unbind()


class QuorumTransport(TCPTransport):  # type: ignore[misc]
    """pysyncobj's TCPTransport with PeerConnection/PeerServer and the handshake inside them."""

    def __init__(self, syncObj: Any, selfNode: Any, otherNodes: Any) -> None:
        settings = syncObj.settings
        self._key = cluster_key(settings.password)
        self._self_address = selfNode.address
        self._tls_server: ssl.SSLContext | None = settings.tls_server_context
        self._tls_client: ssl.SSLContext | None = settings.tls_client_context
        self._refused_pending = 0
        self._refused_logged_at = 0.0
        self._last_tick: float = monotonic_time()
        super().__init__(syncObj, selfNode, otherNodes)
        self._syncObj.addOnTickCallback(self._check_deadlines)

    @property
    def conf(self) -> Any:
        """pysyncobj's configuration."""
        return self._syncObj.conf

    @property
    def poller(self) -> Any:
        """pysyncobj's poller (the tick thread polls it)."""
        return self._syncObj._poller

    def _new_connection(
        self, sock: socket.socket | None = None, server_hostname: str | None = None
    ) -> PeerConnection:
        conf = self.conf
        return PeerConnection(
            self.poller,
            self._key,
            self._self_address,
            timeout=conf.connectionTimeout,
            send_buffer=conf.sendBufferSize,
            recv_buffer=conf.recvBufferSize,
            keepalive=conf.tcp_keepalive,
            sock=sock,
            is_member=self._is_member,
            last_tick=self.last_tick,
            ssl_context=self._tls_server if sock is not None else self._tls_client,
            server_hostname=server_hostname,
        )

    def last_tick(self) -> float:
        """When the tick thread last ran this transport's tick callback."""
        return self._last_tick

    def _is_member(self, address: str) -> bool:
        """A member that dials us (pysyncobj: the larger address dials; we dial the others).

        Follows membership changes: pysyncobj calls `addNode` / `dropNode` when a change
        reaches the log (and undoes it if the entry is cut), so a new member is answered as
        soon as this node knows of it and a removed one is refused (its connection dropped)."""
        node = self._nodeAddrToNode.get(address)
        return node is not None and not self._shouldConnect(node)

    def _createServer(self) -> None:
        host, port = (self.conf.bindAddress or self._self_address).rsplit(":", 1)
        if host not in ("0.0.0.0", "::"):
            host = globalDnsResolver().resolve(host)
        self._server = PeerServer(self, host, int(port))

    def addNode(self, node: Any) -> None:
        """A member: dial it if our address is the larger (pysyncobj's rule)."""
        self._nodes.add(node)
        self._nodeAddrToNode[node.address] = node
        if self._shouldConnect(node):
            conn = self._new_connection(server_hostname=node.host)
            conn.setOnConnectedCallback(functools.partial(self._onOutgoingConnected, conn))
            conn.setOnMessageReceivedCallback(functools.partial(self._onMessageReceived, node))
            conn.setOnDisconnectedCallback(functools.partial(self._onDisconnected, conn))
            self._connections[node] = conn

    def accept(self, sock: socket.socket) -> None:
        """A new incoming socket: refused at once beyond PENDING_AUTH_MAX unauthenticated."""
        if len(self._unknownConnections) >= PENDING_AUTH_MAX:
            self._refused_pending += 1
            now = monotonic_time()
            if now - self._refused_logged_at >= 1.0:
                log.warning(
                    "peer_refused",
                    reason="too many unauthenticated connections",
                    limit=PENDING_AUTH_MAX,
                    refused=self._refused_pending,
                )
                self._refused_logged_at, self._refused_pending = now, 0
            sock.close()
            return
        conf = self.conf
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, conf.sendBufferSize)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, conf.recvBufferSize)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setblocking(False)
        except OSError:
            sock.close()
            return
        conn = self._new_connection(sock)
        self._unknownConnections.add(conn)
        conn.on_authenticated = functools.partial(self._onIncomingAuthenticated, conn)
        conn.setOnDisconnectedCallback(functools.partial(self._onDisconnected, conn))

    def _onIncomingAuthenticated(self, conn: PeerConnection, address: str) -> None:
        self._unknownConnections.discard(conn)
        node = self._nodeAddrToNode.get(address)
        if node is None:  # checked before the challenge, but removed since (a membership change)
            conn.disconnect()
            return
        old = self._connections.get(node)
        self._connections[node] = conn
        if old is not None and old is not conn:
            old.disconnect()  # no longer mapped: its disconnect reports nothing
        conn.setOnMessageReceivedCallback(functools.partial(self._onMessageReceived, node))
        self._onNodeConnected(node)

    def _onOutgoingConnected(self, conn: PeerConnection) -> None:
        node = self._connToNode(conn)
        if node is not None:
            self._onNodeConnected(node)

    def _check_deadlines(self) -> None:
        now = self._last_tick = monotonic_time()
        for conn in list(self._unknownConnections) + list(self._connections.values()):
            conn.check_deadlines(now)

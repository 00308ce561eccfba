"""One client connection: handshake, frame loop, commands, queries, admin requests.

Every bad frame gets an error frame and nothing is applied for it; oversized frames and failed
authentication close the connection after the error frame.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import structlog

import fifo
from cluster import protocol
from cluster.errors import ProtocolError
from cluster.node.effects import EFFECT_BYTES_MAX
from cluster.node.limits import source_address
from cluster.node.membership import handle_member_admin, member_endpoints
from cluster.node.queries import QueryError, run_query
from fifo import limits as fifo_limits
from fifo.codec import TAG_BASE, constructor
from fifo.commands import (
    BOUND_SETTLES,
    BOUND_SETTLES_SINCE_VERSION,
    UNBOUND_SETTLES,
    Checkout,
    ConnectionDown,
    ConnectionId,
    Credit,
    DeclareQueue,
    DeleteQueue,
    Discard,
    Enqueue,
    Modify,
    Purge,
    RegisterEnqueuer,
    RenewLocks,
    Return,
    Settle,
    UpdateConfig,
)
from fifo.replies import Error, Ok
from fifo.state import Message
from fifo.wire import field_splicer
from raft.errors import SubmitError
from raft.fastcodec import decode_command, encode_command
from raft.replica import ReplicaView, Reply
from raft.replicated import InternalFailure

if TYPE_CHECKING:
    from cluster.node.server import NodeServer

log = structlog.get_logger("cluster.session")

HELLO_TIMEOUT_S = 5.0  # an unauthenticated connection must finish its handshake within this
HELLO_BYTES_MAX = 8 * 1024  # a hello is a proof and a name: never read 16 MiB before auth
PENDING_HANDSHAKES_MAX = 64  # unauthenticated connections at once; more are closed at once
_pending_handshakes = 0
# fifo's decoder builds a command's nested values in Python (about 0.5 us per CBOR item): a blob
# over COMMAND_SCAN_BYTES_MIN is walked first and refused past COMMAND_ITEMS_MAX items; the
# largest client command holds msg_ids_per_command_max ids and about a hundred other items
COMMAND_SCAN_BYTES_MIN = 4 * 1024
COMMAND_ITEMS_MAX = fifo_limits.msg_ids_per_command_max + 512
CBOR_MAJOR_TAG = 6
# a body that fits a publish frame must fit a delivery or dequeue frame too, where up to
# annotations_per_message_max annotations (about 17 KiB) may have been added (modify, dead-letter);
# and no body may stall a node's loop past 100 ms: 8 MiB publishes stall each node 82-93 ms,
# 15 MiB ones 184-219 ms (`python scripts/bench_big_messages.py --mib 8`, 2 cores, quiet)
PUBLISH_BODY_BYTES_MAX = min(EFFECT_BYTES_MAX, 8 * 1024 * 1024)
# queries always answered: "status" says itself whether this node has a leader
FRESH_QUERIES = frozenset({"status"})
WRITE_BUFFER_BYTES_MAX = 64 * 1024 * 1024
# an effect frame (a delivery) queued longer than this before its write means this node was
# stopped or starved meanwhile: long enough, near the peers' connection timeout, for the leader
# to mark the node down and hand its consumers' messages to others; the frame may describe state
# that no longer holds (issue 24), so the session is closed instead (its consumers' messages
# come back through the log, as after a snapshot)
EFFECTS_STALE_S = 1.0
# a settle answered Ok by the machine after the state was replaced while it was in flight
STATE_REPLACED_MESSAGE = (
    "the node's state was replaced (a machine upgrade) while this settle was in flight: "
    "whether its consumer still held the messages when it applied is unknown; outcome unknown, "
    "retry"
)
READ_BYTES = 256 * 1024
OK_BYTES = fifo.encode(Ok())  # the most frequent reply, encoded once
CLIENT_COMMANDS = (
    DeclareQueue,
    DeleteQueue,
    UpdateConfig,
    Enqueue,
    RegisterEnqueuer,
    Checkout,
    Settle,
    Return,
    Discard,
    Modify,
    Credit,
    RenewLocks,
    Purge,
)


# the direct Enqueue constructor below is only right while these are all its fields
_ENQUEUE_FIELDS_KNOWN = tuple(f.name for f in dataclasses.fields(Enqueue)) == (
    "queue",
    "body",
    "enqueuer",
    "seq",
    "connection",
    "ttl_ms",
)
_make_enqueue = constructor(Enqueue)  # == Enqueue(...) without the frozen __init__'s setattrs


def bind_connection(command: Any, connection: ConnectionId) -> Any:
    """The command with every `connection` field set to the caller's own connection."""
    if type(command) is Enqueue and _ENQUEUE_FIELDS_KNOWN:  # hot path: no replace()
        if command.connection == connection:
            return command
        return _make_enqueue(
            command.queue, command.body, command.enqueuer, command.seq, connection, command.ttl_ms
        )
    if isinstance(command, (Enqueue, RegisterEnqueuer)):
        if command.connection == connection:
            return command
        return dataclasses.replace(command, connection=connection)
    if isinstance(command, Checkout):
        if command.consumer.connection == connection:
            return command
        consumer = dataclasses.replace(command.consumer, connection=connection)
        return dataclasses.replace(command, consumer=consumer)
    return command


def bind_owner(command: Any, connection: ConnectionId, effective_version: int) -> Any:
    """A settle, return, discard, modify or renew in the form the machine checks against the
    consumer's connection (issue 31), submitted by `connection`, once the effective machine
    version knows that form (v4); before, the unbound form, as those machines know it. A bound
    form a client sent itself gets our connection too: a client never chooses it. Any other
    command is returned as is."""
    kind = type(command)
    plain = UNBOUND_SETTLES.get(kind)
    bound = BOUND_SETTLES.get(kind)
    if plain is None and bound is None:
        return command
    values = [getattr(command, f.name) for f in dataclasses.fields(plain or kind)]
    if effective_version < BOUND_SETTLES_SINCE_VERSION:
        return command if plain is None else plain(*values)
    if plain is not None and command.connection == connection:
        return command
    return (bound or kind)(*values, connection)


def _held_now(
    view: ReplicaView, settle: Settle
) -> tuple[list[tuple[int, Message, int]], list[int]]:
    """(id, message, times taken back so far) of each named message its consumer holds now,
    and the named ids it neither holds nor lost to its own consumer timeout."""
    queue = view.state.queues.get(settle.queue)
    consumer = queue.consumers.get(settle.consumer_key) if queue is not None else None
    if consumer is None:
        return [], []  # the machine refuses it (unknown consumer) or it is a queue-level id
    held: list[tuple[int, Message, int]] = []
    missing: list[int] = []
    for mid in settle.msg_ids:
        message = consumer.checked_out.get(mid)
        if message is not None:
            held.append((mid, message, message.acquired_count))
        elif mid not in consumer.timed_out:
            missing.append(mid)
    return held, missing


def _state_of(view: ReplicaView) -> Any:
    """The state object itself (replaced whole by an upgrade's conversion or a snapshot)."""
    return view.state


def _not_held_message(settle: Settle, lost: list[int]) -> str:
    shown = ", ".join(str(mid) for mid in lost[:20])
    return (
        f"not settled: message ids {shown} of consumer {settle.consumer_key} on {settle.queue} "
        "were taken back before the settle applied (a timeout, or its node was marked down); "
        "they are delivered again"
    )


def _fifo_tag(tag: int) -> bool:
    """Commands carry fifo's class tags only (no cbor2 semantic tag: dates, regexes, MIME...)."""
    return tag >= TAG_BASE


def _splice(blob: bytes, command: Any, conn_blob: bytes) -> bytes | None:
    """An Enqueue blob sent with no connection, with `conn_blob` (the encoded ConnectionId) in
    its place (schema-derived in fifo.wire); None when the command does not allow it."""
    return _splice_connection(blob, command, conn_blob)


def _splice_matches() -> bool:
    """Whether splicing gives exactly `encode_command` of the bound command (else re-encode)."""
    conn = ConnectionId("n1", 2**41, 7)
    for ttl in (None, 5, 2**33):
        command = Enqueue("q", b"body", "e", 3, None, ttl)
        bound = bind_connection(command, conn)
        if _splice(encode_command(command), command, encode_command(conn)) != encode_command(bound):
            return False
    return True


_splice_connection = field_splicer(Enqueue, "connection")
SETTLING_COMMANDS = (Settle, Return, Discard, Modify, RenewLocks)  # and their bound forms
SPLICE_OK = _splice_matches()


class SessionFlusher:
    """Writes the client sessions' queued frames: at the end of the loop iteration in which the
    first was queued (one write per session for everything queued until then), or sooner,
    `now`: the node calls it right after an applied entry's replies and effects were handed
    over, inside the tick that applied it (issue 29), so that a reply leaves before the rest of
    the tick and the loop's next iteration (a second follower's ack, other clients' frames)."""

    def __init__(self) -> None:
        self._sessions: list[ClientSession] = []
        self._handle: asyncio.Handle | None = None

    def soon(self, session: ClientSession) -> None:
        """`session` queued its first frame since its last write."""
        self._sessions.append(session)
        if self._handle is None:
            self._handle = asyncio.get_running_loop().call_soon(self.now)

    def now(self) -> None:
        """Write every session's queued frames."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        sessions, self._sessions = self._sessions, []
        for session in sessions:
            try:
                session.flush()
            except Exception:  # one session's failure must not leave the others unwritten
                log.exception("session_flush_failed")


class ClientSession:
    """Serves one accepted TCP connection until it closes."""

    def __init__(
        self, server: NodeServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self.server = server
        self.reader = reader
        self.writer = writer
        self.connection: ConnectionId | None = None
        self.closed = False
        self.used = False  # submitted a command that may have registered the connection
        self._out: list[bytes] = []
        self._flush_scheduled = False
        self._conn_blob: bytes | None = None  # this connection's encoded ConnectionId
        self._oks: list[int] | None = None  # OKS_FEATURE: ids answered Ok, not yet framed
        self._effects_since: float | None = None  # when the oldest unwritten effect was queued

    def send(self, message: dict[str, Any]) -> None:
        """Queue a frame to the client (loop thread); frames queued in one loop iteration go
        out in one write (one syscall for a burst of replies)."""
        if self.closed:
            return
        if self._oks:
            self._out.append(protocol.encode_frame(protocol.oks(self._oks)))
            self._oks = []
        if self._effects_since is None and message.get("op") == protocol.EFFECT:
            self._effects_since = time.monotonic()
        try:
            self._out.append(protocol.encode_frame(message, self.server.frame_bytes_max))
        except ProtocolError as err:
            log.error("frame_not_sent", error=err.message)
            request_id = message.get("id")
            if message.get("op") != protocol.ERROR and isinstance(request_id, int):
                # never drop a reply silently: the caller would wait for it until its timeout
                self.error(
                    protocol.REPLY_TOO_LARGE,
                    f"the reply does not fit in a frame ({err.message}): ask for less "
                    "(e.g. a lower --limit)",
                    request_id,
                )
            return
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.server.flusher.soon(self)

    def send_ok(self, request_id: int) -> None:
        """Answer `Ok` to one command: in the next `oks` frame when the client asked for them."""
        oks = self._oks
        if oks is None or self.closed:
            self.send(protocol.reply(request_id, OK_BYTES))
            return
        oks.append(request_id)
        if len(oks) >= protocol.OKS_IDS_MAX:
            self._out.append(protocol.encode_frame(protocol.oks(oks)))
            self._oks = []
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.server.flusher.soon(self)

    def flush(self) -> None:
        """Write what is queued (called by the server's SessionFlusher)."""
        self._flush_scheduled = False
        if self._oks:
            self._out.append(protocol.encode_frame(protocol.oks(self._oks)))
            self._oks = []
        if self.closed or not self._out:
            return
        since, self._effects_since = self._effects_since, None
        if since is not None and time.monotonic() - since > EFFECTS_STALE_S:
            self._drop_stale(time.monotonic() - since)
            return
        data, self._out = b"".join(self._out), []
        self.writer.write(data)
        if self.writer.transport.get_write_buffer_size() > WRITE_BUFFER_BYTES_MAX:
            log.warning("client_too_slow", connection=repr(self.connection))
            self.close()

    def _drop_stale(self, waited_s: float) -> None:
        """Close without sending what is queued: its effects waited `waited_s` (the node was
        stopped or starved) and may no longer match the state (issue 24)."""
        log.warning("session_closed_stale_effects", connection=repr(self.connection),
                    waited_s=round(waited_s, 3))  # fmt: skip
        self._out = []
        self.closed = True
        self.writer.close()

    def is_closed(self) -> bool:
        """Whether the session was closed (a method, so checks are not narrowed away)."""
        return self.closed

    def close(self) -> None:
        """Flush what is queued (error frames before a close), then close (idempotent)."""
        if not self.closed:
            self.flush()
            self.closed = True
            self.writer.close()

    def error(self, code: str, message: str, request_id: Any = None) -> None:
        """Send an error frame (with the request id when it is a usable int)."""
        rid = (
            request_id if isinstance(request_id, int) and not isinstance(request_id, bool) else None
        )
        self.send(protocol.error(code, message, rid))

    async def run(self) -> None:
        """Handshake, then serve frames until EOF."""
        try:
            if await self._handshake():
                await self._serve()
        except (asyncio.IncompleteReadError, ConnectionError, TimeoutError):
            pass
        finally:
            self._closed()

    async def _handshake(self) -> bool:
        global _pending_handshakes
        if _pending_handshakes >= PENDING_HANDSHAKES_MAX:
            self.server.refusals.note(
                "handshake_refused", source_address(self.writer), pending=_pending_handshakes
            )
            self.error(protocol.UNAVAILABLE, "too many connections waiting to authenticate")
            return False
        _pending_handshakes += 1
        try:
            nonce = os.urandom(protocol.NONCE_BYTES)
            self.send(protocol.challenge(nonce, self.server.node_id))
            hello = await asyncio.wait_for(
                protocol.read_frame(self.reader, HELLO_BYTES_MAX), HELLO_TIMEOUT_S
            )
        except ProtocolError as err:
            self.error(err.code, err.message)
            return False
        finally:
            _pending_handshakes -= 1
        if hello.get("op") != protocol.HELLO:
            self.error(protocol.NOT_AUTHENTICATED, "the first frame must be a 'hello'")
            return False
        if not protocol.verify_proof(self.server.client_key, nonce, hello.get("proof")):
            self.server.refusals.note("auth_failed", source_address(self.writer))
            self.error(protocol.AUTH_FAILED, "authentication failed: wrong client credentials")
            return False
        self.connection = self.server.new_connection()
        self.server.router.register(self.connection, self.send)
        self.server.metrics.connection_opened()
        features: tuple[str, ...] = ()
        if protocol.OKS_FEATURE in protocol.features_of(hello):
            self._oks, features = [], (protocol.OKS_FEATURE,)
        self.send(
            protocol.welcome(
                self.server.node_id,
                fifo.encode(self.connection),
                self.server.replica.leader_id(),
                member_endpoints(self.server),  # not cluster.toml's: members added since too
                features,
            )
        )
        log.info("client_connected", connection=self.connection.number, name=hello.get("name"))
        return True

    async def _serve(self) -> None:
        # read what has arrived and parse every whole frame in it: pipelined clients send
        # bursts, and one read per burst is much cheaper than two awaits per frame
        decoder = protocol.FrameDecoder(self.server.frame_bytes_max, protocol.FRAME_ITEMS_MAX)
        while not self.closed:
            data = await self.reader.read(READ_BYTES)
            if not data:
                return
            for item in decoder.feed(data):
                if self.is_closed():  # a slow client was dropped while dispatching
                    return
                if isinstance(item, ProtocolError):
                    self.error(item.code, item.message)
                    if item.code in protocol.FATAL_CODES:
                        return
                    continue
                self._dispatch(item)
            await self.writer.drain()
            await self.server.replica.room()  # the node's commands in flight: bounded in bytes

    def _dispatch(self, message: dict[str, Any]) -> None:
        op, request_id = message["op"], message.get("id")
        if not isinstance(request_id, int) or isinstance(request_id, bool):
            self.error(protocol.BAD_FRAME, f"'{op}' needs an integer 'id'")
            return
        if op == protocol.COMMAND:
            self._command(request_id, message.get("cmd"))
        elif op == protocol.QUERY:
            self._query(request_id, message.get("query"), message.get("args") or {})
        elif op == protocol.ADMIN:
            self._admin(request_id, message.get("action"), message.get("args") or {})
        else:
            self.error(protocol.UNKNOWN_OP, f"unknown op {op!r}", request_id)

    def _command(self, request_id: int, blob: Any) -> None:
        assert self.connection is not None
        if not isinstance(blob, bytes):
            self.error(protocol.BAD_COMMAND, "'cmd' must be bytes (fifo.encode)", request_id)
            return
        try:
            if not blob or blob[0] >> 5 != CBOR_MAJOR_TAG:  # a list of commands decodes slowly
                raise ProtocolError(protocol.BAD_COMMAND, "a command is one tagged fifo command")
            if len(blob) > COMMAND_SCAN_BYTES_MIN:  # bound what decoding it costs the loop
                protocol.check_cost(blob, COMMAND_ITEMS_MAX, _fifo_tag, "command")
            command = decode_command(blob)
        except ProtocolError as err:
            self.error(protocol.BAD_COMMAND, err.message, request_id)
            return
        except Exception as err:
            self.error(protocol.BAD_COMMAND, f"command does not decode: {err}", request_id)
            return
        if type(command) is not Enqueue and not isinstance(command, CLIENT_COMMANDS):
            name = type(command).__name__
            self.error(protocol.BAD_COMMAND, f"{name} is not a client command", request_id)
            return
        if isinstance(command, Enqueue) and len(command.body) > PUBLISH_BODY_BYTES_MAX:
            message = (
                f"a body of {len(command.body)} bytes: at most {PUBLISH_BODY_BYTES_MAX} (its "
                "copies would stall the nodes' loops past 100 ms; split it or store it elsewhere)"
            )
            self.error(protocol.BAD_COMMAND, message, request_id)
            return
        alarm = self.server.memory.refusal() if type(command) is Enqueue else None
        if alarm is not None:  # flow control: settles and consumes go on, publishes wait
            self.error(protocol.MEMORY_ALARM, alarm, request_id)
            return
        refusal = self.server.unavailable_reason(for_read=False)
        if refusal is not None:  # say so now: held, it would only time out (nothing submitted)
            self.error(protocol.UNAVAILABLE, f"{refusal}; nothing was submitted", request_id)
            return
        bound = bind_connection(command, self.connection)
        if isinstance(bound, SETTLING_COMMANDS):
            bound = bind_owner(bound, self.connection, self._effective_version())
        if bound is not command:  # re-encode only what changed (the codec is the hot path)
            blob = self._rebound_blob(blob, command, bound)
        self.used = True
        sink = self._command_sink(bound, self._reply_sink(request_id))
        self.server.replica.propose(bound, sink, blob)

    def _command_sink(
        self, command: Any, reply_sink: Callable[[Reply], None]
    ) -> Callable[[Reply], None]:
        """What receives `command`'s reply: the settle fence, then the metrics, then the client
        (the metrics count what the client is told: a settle the fence refuses is no ack)."""
        sink = self.server.metrics.count(command, reply_sink)
        if isinstance(command, Settle):
            sink = self._settle_sink(command, sink)
        return sink

    def _effective_version(self) -> int:
        """The machine version the cluster applies entries with now (it only ever grows, so a
        command bound for it is applied by it or a later one)."""
        return int(self.server.replica.read(lambda view: view.meta.effective_version))

    def _settle_sink(
        self, settle: Settle, sink: Callable[[Reply], None]
    ) -> Callable[[Reply], None]:
        """`sink`, but an `Ok` becomes a refusal when a named message was not held by its
        consumer when the settle applied (issue 24): the machines answer `ok` to a settle of
        ids their consumer no longer holds, and a message taken back meanwhile (disconnected
        timeout, node down) and delivered to another consumer would then seem acked twice.
        Each message is noted as held now (the object and how often it was taken back); not
        held now, or taken back by the time the settle applied, means not settled. Ids the
        consumer lost to its own consumer timeout are exempt: naming them is how a client
        clears the timeout (it was told with a Released notice). A resent settle whose first
        attempt applied gets the refusal too: the client flags an error to a resend uncertain.
        A state replaced meanwhile (a machine upgrade converts it into new objects) hides what
        happened to the noted objects since: that Ok becomes `unavailable`, outcome unknown
        (the client retries; its answer is flagged uncertain)."""
        held, missing, noted = self.server.replica.read(
            lambda view: (*_held_now(view, settle), view.state)
        )

        def checked(reply: Reply) -> None:
            if type(reply) is Ok:
                lost = missing + [mid for mid, message, taken in held
                                  if message.acquired_count != taken]  # fmt: skip
                if lost:
                    reply = Error("fenced", _not_held_message(settle, sorted(lost)))
                elif held and self.server.replica.read(_state_of) is not noted:
                    reply = SubmitError(protocol.UNAVAILABLE, STATE_REPLACED_MESSAGE)
            sink(reply)

        return checked

    def _rebound_blob(self, blob: bytes, command: Any, bound: Any) -> bytes:
        # a publish arrives without its connection: splicing ours in is far cheaper than
        # encoding the whole command again
        if SPLICE_OK and self.connection is not None:
            if self._conn_blob is None:
                self._conn_blob = encode_command(self.connection)
            spliced = _splice(blob, command, self._conn_blob)
            if spliced is not None:
                return spliced
        return bytes(encode_command(bound))

    def _reply_sink(self, request_id: int) -> Callable[[Reply], None]:
        def sink(reply: Reply) -> None:
            if isinstance(reply, SubmitError):
                self.error(reply.code, reply.message, request_id)
            elif isinstance(reply, InternalFailure):
                self.error(protocol.INTERNAL, reply.message, request_id)
            elif type(reply) is Ok:
                self.send_ok(request_id)
            else:
                self.send(protocol.reply(request_id, fifo.encode(reply)))

        return sink

    def _query(self, request_id: int, name: Any, args: Any) -> None:
        if not isinstance(name, str) or not isinstance(args, dict):
            self.error(protocol.BAD_REQUEST, "'query' must be a string, 'args' a map", request_id)
            return
        stale = None if name in FRESH_QUERIES else self.server.unavailable_reason(for_read=True)
        if stale is not None and args.get(protocol.STALE_OK) is not True:
            message = (
                f"{stale}: its state may be stale (ask a node of the majority, or pass "
                f"{protocol.STALE_OK} to read it anyway)"
            )
            self.error(protocol.UNAVAILABLE, message, request_id)
            return
        try:
            value = run_query(
                self.server.replica,
                name,
                args,
                self.server.status_extra(),
                member_endpoints(self.server) if name == "status" else None,
            )
        except QueryError as err:
            self.error(protocol.BAD_REQUEST, str(err), request_id)
            return
        except Exception as err:
            log.exception("query_failed", query=name)
            self.error(protocol.INTERNAL, f"query {name} failed: {err!r}", request_id)
            return
        self.send(protocol.result(request_id, value, stale))

    def _admin(self, request_id: int, action: Any, args: Any) -> None:
        if action == "machine_upgrade" and isinstance(args, dict):
            self._machine_upgrade(request_id, args.get("to"))
        elif action == "snapshot":
            self.server.replica.force_snapshot()
            self.send(protocol.result(request_id, {"requested": True}))
        elif action in ("member_add", "member_remove"):
            handle_member_admin(self, request_id, action, args)
        else:
            self.error(protocol.BAD_REQUEST, f"unknown admin action {action!r}", request_id)

    def _machine_upgrade(self, request_id: int, to: Any) -> None:
        target = to if isinstance(to, int) else max(fifo.SUPPORTED_VERSIONS)

        def check(view: ReplicaView) -> tuple[int, str | None]:
            return view.meta.effective_version, view.upgrade_refusal(target)

        effective, refusal = self.server.replica.read(check)
        if target <= effective:
            self.send(
                protocol.result(request_id, {"effective_version": effective, "changed": False})
            )
            return
        if refusal is not None:
            self.error(protocol.REFUSED, refusal, request_id)
            return

        def sink(reply: Reply) -> None:
            if isinstance(reply, Error):
                self.error(protocol.REFUSED, reply.message, request_id)
            elif isinstance(reply, (SubmitError, InternalFailure)):
                code = reply.code if isinstance(reply, SubmitError) else protocol.INTERNAL
                self.error(code, reply.message, request_id)
            else:
                result = {"effective_version": target, "changed": True}
                self.send(protocol.result(request_id, result))

        self.server.replica.propose_upgrade(target, sink)

    def _registered(self) -> bool:
        """Whether the replicated metadata knows this connection (else no ConnectionDown)."""
        assert self.connection is not None
        connection = self.connection
        return self.server.replica.read(lambda view: view.lists_connection(connection))

    def node_id_of_conn(self) -> str:
        """The node id in this session's connection id."""
        assert self.connection is not None
        return self.connection.node

    def _closed(self) -> None:
        self.close()
        if self.connection is None:
            return
        self.server.router.unregister(self.connection)
        log.info("client_disconnected", connection=self.connection.number)
        if self.used and not self.server.stopping and self._registered():
            down = ConnectionDown(self.connection, "normal")
            self.server.replica.propose(down, lambda _reply: None)

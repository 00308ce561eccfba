"""One AMQP 0-9-1 connection: protocol header, start/tune/open negotiation with SASL,
heartbeats, the frame loop, channel and connection exceptions, and the effects the node routes
to this connection (deliveries, cancellations, consumer timeouts)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import structlog
from pamqp import base, commands

from cluster.amqp import auth, frames, limits, node_link
from cluster.amqp.channel import Channel, message_too_large
from cluster.amqp.consumers import Consumer, chunks
from cluster.amqp.dispatch import dispatch_method
from cluster.amqp.errors import (
    CHANNEL_ERROR,
    CONNECTION_FORCED,
    FRAME_ERROR,
    NOT_ALLOWED,
    PRECONDITION_FAILED,
    UNEXPECTED_FRAME,
    AmqpError,
    ChannelRefusal,
    ConnectionRefusal,
)
from cluster.node.session import SETTLING_COMMANDS, bind_owner
from fifo.commands import (
    ConnectionDown,
    ConnectionId,
    ConsumerKey,
    QueueConfig,
    Return,
    Settle,
)
from fifo.effects import ConsumerCancelled, Deliver, Released
from raft.replica import Reply

if TYPE_CHECKING:
    from cluster.node.server import NodeServer

log = structlog.get_logger("cluster.amqp")

CONFIG_CACHE_S = 1.0  # how long a queue's config is trusted for x-overflow reject-publish
CONFIG_CACHE_QUEUES_MAX = 1_000
# acks are gathered this long before they go to the log as one Settle (a client acking one
# message per frame would otherwise cost one command per message)
SETTLE_GATHER_S = 0.001
ALARM_POLL_S = 0.2  # a blocked connection checks the memory alarm this often
CLOSE_OK_WAIT_S = 2.0  # after our connection.close, how long the client may take to answer
PRODUCT = "quorumq"


class ConnectionClosed(Exception):
    """Raised inside the frame loop once the connection is done (closed either way)."""


class AmqpConnection:
    """Serves one accepted socket until it closes."""

    def __init__(
        self, server: NodeServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
        guest_allowed: bool,
    ) -> None:  # fmt: skip
        self.server = server
        self.reader = reader
        self.writer = writer
        self.guest_allowed = guest_allowed
        self.connection_id: ConnectionId = server.new_connection()
        self.channels: dict[int, Channel] = {}
        self.consumers: dict[str, tuple[Channel, Consumer]] = {}  # by fifo tag
        self.frame_bytes_max = limits.frame_bytes_max
        self.channel_max = limits.channels_per_connection_max
        self.heartbeat_s = 0
        self.cancel_notify = False
        self.closed = False
        self.registered = False
        self._content: dict[int, tuple[commands.Basic.Publish, int, bytes, list[bytes]]] = {}
        self._out: list[bytes] = []
        self._flush_scheduled = False
        self._last_read = self._last_write = time.monotonic()
        self._in_flight = 0
        self._reading = asyncio.Event()
        self._reading.set()
        self.blocked_notify = False  # the client announced the connection.blocked capability
        self._unblocked = asyncio.Event()  # cleared while the memory alarm blocks this connection
        self._unblocked.set()
        self._configs: dict[str, tuple[float, QueueConfig | None, str | None]] = {}
        self._closing_connection = False
        self._splitter = frames.FrameSplitter(limits.frame_bytes_max)
        self._settles: dict[tuple[str, ConsumerKey], list[int]] = {}
        self._frames = self._read_frames()

    # --- writing ------------------------------------------------------------------------------

    def _write(self, data: bytes) -> None:
        if self.closed:
            return
        self._out.append(data)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self.closed or not self._out:
            return
        data, self._out = b"".join(self._out), []
        self.writer.write(data)
        self._last_write = time.monotonic()
        if self.writer.transport.get_write_buffer_size() > limits.write_buffer_bytes_max:
            log.warning("amqp_client_too_slow", connection=self.connection_id.number)
            self.close()

    def send_method(self, channel: int, method: base.Frame) -> None:
        """Queue one method frame."""
        self._write(frames.encode_method(channel, method))

    def send_bytes(self, data: bytes) -> None:
        """Queue frames encoded already (the fast paths of `frames`)."""
        self._write(data)

    def send_content(
        self, channel: int, method: base.Frame | bytes, properties: bytes, body: bytes
    ) -> None:
        """Queue a content method with its header and body frames."""
        self._write(frames.encode_content(channel, method, properties, body, self.frame_bytes_max))

    def is_closed(self) -> bool:
        """Whether the socket was closed (a method, so checks are not narrowed away)."""
        return self.closed

    def close(self) -> None:
        """Flush what is queued and close the socket (idempotent)."""
        if not self.closed:
            self._flush()
            self.closed = True
            self.writer.close()

    # --- commands: acks coalesced, everything else in order after them ----------------------

    def settle_later(self, queue: str, key: ConsumerKey, msg_ids: list[int]) -> None:
        """Acknowledge messages with the other acks of this loop iteration: clients ack one
        message per frame, and one Settle per queue and consumer is far cheaper than one each."""
        if not self._settles:
            asyncio.get_running_loop().call_later(SETTLE_GATHER_S, self.flush_settles)
        self._settles.setdefault((queue, key), []).extend(msg_ids)

    def flush_settles(self) -> None:
        """Submit the acks gathered so far (before any other command of this connection)."""
        settles, self._settles = self._settles, {}
        for (queue, key), msg_ids in settles.items():
            for part in chunks(msg_ids):
                settle = self.bound(Settle(queue, key, part))
                node_link.propose(self.server, settle, _ignore)

    def propose(self, command: Any, sink: node_link.Sink) -> None:
        """Submit a command after the acks gathered before it."""
        if self._settles:
            self.flush_settles()
        node_link.propose(self.server, self.bound(command), sink)

    async def submit(self, command: Any) -> Reply:
        """Submit a command after the acks gathered before it, and wait for its reply."""
        if self._settles:
            self.flush_settles()
        return await node_link.submit(self.server, self.bound(command))

    def bound(self, command: Any) -> Any:
        """A settle, return, discard, modify or renew bound to this connection (machine v4
        accepts one only from the connection holding the consumer, issue 31: a delivery tag
        means something on its channel only); any other command as it is."""
        if not isinstance(command, SETTLING_COMMANDS):
            return command
        return bind_owner(command, self.connection_id, node_link.effective_version(self.server))

    # --- flow control of publishes ------------------------------------------------------------

    def publish_started(self) -> None:
        """A publish was submitted: past the limit, stop reading until confirms come back."""
        self._in_flight += 1
        if self._in_flight >= limits.publishes_in_flight_max:
            self._reading.clear()

    def publish_done(self) -> None:
        """A publish was answered."""
        self._in_flight -= 1
        if self._in_flight < limits.publishes_in_flight_max // 2:
            self._reading.set()

    def block_if_alarmed(self) -> None:
        """A publish was read: while the node's memory alarm is set, stop reading this
        connection (after what was read) until it clears, telling the client with
        connection.blocked / unblocked if it asked for them (RabbitMQ's flow control; a
        connection that only consumes is never blocked)."""
        alarm = self.server.memory.refusal()
        if alarm is None or not self._unblocked.is_set():
            return
        self._unblocked.clear()
        if self.blocked_notify:
            self.send_method(0, commands.Connection.Blocked(reason="low on memory"))
        log.info("amqp_blocked", connection=self.connection_id.number, reason=alarm)
        asyncio.get_running_loop().create_task(self._unblock_when_cleared())

    async def _unblock_when_cleared(self) -> None:
        while not self.closed and self.server.memory.refusal() is not None:
            await asyncio.sleep(ALARM_POLL_S)
        if self.closed:
            return
        self._last_read = time.monotonic()  # the client's heartbeats were not read meanwhile
        self._unblocked.set()
        if self.blocked_notify:
            self.send_method(0, commands.Connection.Unblocked())
        log.info("amqp_unblocked", connection=self.connection_id.number)

    def cached_config(self, queue: str) -> tuple[QueueConfig | None, str | None]:
        """The config of `queue` and its message-group key (None: not grouped), read again at
        most once a CONFIG_CACHE_S."""
        now = time.monotonic()
        cached = self._configs.get(queue)
        if cached is None or now - cached[0] > CONFIG_CACHE_S:
            if len(self._configs) > CONFIG_CACHE_QUEUES_MAX:
                self._configs.clear()
            groups = node_link.group_config(self.server, queue)
            group_key = None if groups is None else groups.group_key
            cached = (now, node_link.queue_config(self.server, queue), group_key)
            self._configs[queue] = cached
        return cached[1], cached[2]

    # --- the connection's life ----------------------------------------------------------------

    async def run(self) -> None:
        """Negotiate, then serve frames until either side closes."""
        try:
            await asyncio.wait_for(self._negotiate(), limits.handshake_timeout_s)
            heartbeats = asyncio.create_task(self._heartbeats())
            try:
                await self._serve()
            finally:
                heartbeats.cancel()
        except ConnectionRefusal as refusal:
            await self._close_with(refusal, *refusal.method_ids)
        except (ConnectionClosed, asyncio.IncompleteReadError, ConnectionError, TimeoutError):
            pass
        finally:
            self._closed()

    async def _negotiate(self) -> None:
        header = await self.reader.readexactly(8)
        if header != frames.PROTOCOL_HEADER:
            self.writer.write(frames.PROTOCOL_HEADER)  # the specification's answer: our version
            raise ConnectionClosed()
        self.send_method(0, commands.Connection.Start(
            server_properties=_server_properties(), mechanisms=" ".join(auth.MECHANISMS),
            locales="en_US",
        ))  # fmt: skip
        start_ok = await self._next_method(commands.Connection.StartOk)
        capabilities = (start_ok.client_properties or {}).get("capabilities") or {}
        self.cancel_notify = bool(capabilities.get("consumer_cancel_notify"))
        self.blocked_notify = bool(capabilities.get("connection.blocked"))
        peer = self.writer.get_extra_info("peername")
        user = auth.check(
            start_ok.mechanism, _bytes(start_ok.response), self.server.client_key,
            self.guest_allowed, str(peer[0]) if peer else "",
        )  # fmt: skip
        self.send_method(0, commands.Connection.Tune(
            channel_max=self.channel_max, frame_max=self.frame_bytes_max,
            heartbeat=limits.heartbeat_s_default,
        ))  # fmt: skip
        tune_ok = await self._next_method(commands.Connection.TuneOk)
        self._tuned(tune_ok)
        opened = await self._next_method(commands.Connection.Open)
        if opened.virtual_host not in ("/", ""):
            raise ConnectionRefusal(
                NOT_ALLOWED, f"vhost '{opened.virtual_host}' not found (quorumq has '/' only)"
            )
        self.server.router.register_effects(self.connection_id, self.on_effect)
        self.registered = True
        self.server.metrics.connection_opened()
        self.send_method(0, commands.Connection.OpenOk())
        log.info("amqp_connected", connection=self.connection_id.number, user=user)

    def _tuned(self, tune_ok: commands.Connection.TuneOk) -> None:
        if tune_ok.frame_max and tune_ok.frame_max < limits.frame_bytes_min:
            raise ConnectionRefusal(FRAME_ERROR, f"frame_max {tune_ok.frame_max} below 4096")
        if tune_ok.frame_max:
            self.frame_bytes_max = min(tune_ok.frame_max, limits.frame_bytes_max)
            self._splitter.frame_bytes_max = self.frame_bytes_max
        if tune_ok.channel_max:
            self.channel_max = min(tune_ok.channel_max, limits.channels_per_connection_max)
        self.heartbeat_s = tune_ok.heartbeat

    async def _next_method(self, expected: type[Any]) -> Any:
        """The next method on channel 0 during negotiation (heartbeats skipped)."""
        async for kind, channel, payload in self._frames:
            if kind == frames.HEARTBEAT:
                continue
            method = frames.decode_method(payload) if kind == frames.METHOD else None
            if channel != 0 or not isinstance(method, expected):
                raise ConnectionRefusal(
                    UNEXPECTED_FRAME, f"expected '{expected.name}', got {method or kind}"
                )
            return method
        raise ConnectionClosed()

    async def _read_frames(self) -> AsyncIterator[frames.Frame]:
        """Every frame the client sends, in order (reading pauses while too many publishes
        wait for their confirms, or while the node holds its bound of commands in flight; what
        was written is drained after each read)."""
        while not self.is_closed():
            await self._reading.wait()
            await self._unblocked.wait()
            await self.server.replica.room()  # the node's commands in flight: bounded in bytes
            data = await self.reader.read(limits.read_bytes)
            if not data:
                return
            self._last_read = time.monotonic()
            for frame in self._splitter.feed(data):
                yield frame
                if self.is_closed():
                    return
            await self.writer.drain()

    async def _serve(self) -> None:
        async for kind, channel, payload in self._frames:
            await self._frame(kind, channel, payload)

    async def _frame(self, kind: int, channel: int, payload: bytes) -> None:
        if kind == frames.HEARTBEAT:
            return
        if channel > self.channel_max:
            raise ConnectionRefusal(CHANNEL_ERROR, f"channel {channel} above channel_max")
        if kind == frames.METHOD:
            method = frames.decode_method(payload)
            if channel == 0:
                await self._connection_method(method)
            else:
                await self._channel_method(channel, method)
        elif kind in (frames.HEADER, frames.BODY):
            open_channel = self.channels.get(channel)
            if open_channel is None or not open_channel.closing:  # a closing one drops them
                self._content_frame(kind, channel, payload)
        else:
            raise ConnectionRefusal(FRAME_ERROR, f"unknown frame type {kind}")

    async def _connection_method(self, method: base.Frame) -> None:
        if isinstance(method, commands.Connection.Close):
            self.send_method(0, commands.Connection.CloseOk())
            self.close()
            raise ConnectionClosed()
        if isinstance(method, commands.Connection.CloseOk) and self._closing_connection:
            self.close()
            raise ConnectionClosed()
        if not isinstance(method, (commands.Connection.Blocked, commands.Connection.Unblocked)):
            raise ConnectionRefusal(
                UNEXPECTED_FRAME, f"method {method.name} on channel 0 after connection.open"
            )

    async def _channel_method(self, number: int, method: base.Frame) -> None:
        channel = self.channels.get(number)
        if isinstance(method, commands.Channel.Open):
            self._open_channel(number, channel)
            return
        if channel is None:
            raise ConnectionRefusal(CHANNEL_ERROR, f"expected 'channel.open' on channel {number}")
        if channel.closing:  # after our channel.close only its close-ok counts
            if isinstance(method, (commands.Channel.CloseOk, commands.Channel.Close)):
                del self.channels[number]
            return
        if number in self._content:
            raise ConnectionRefusal(
                UNEXPECTED_FRAME, f"expected content header for class 60, got {method.name}"
            )
        try:
            await self._channel_step(channel, method)
        except ChannelRefusal as refusal:
            self._close_channel(channel, refusal, method)
        except ConnectionRefusal as refusal:
            refusal.method_ids = _ids(method)  # connection.close names the failed method
            raise

    async def _channel_step(self, channel: Channel, method: base.Frame) -> None:
        if isinstance(method, commands.Channel.Close):
            channel.release()
            del self.channels[channel.number]
            self._content.pop(channel.number, None)
            self.send_method(channel.number, commands.Channel.CloseOk())
        elif isinstance(method, commands.Basic.Publish):
            self._content[channel.number] = (method, -1, b"", [])
        else:
            await dispatch_method(channel, method)

    def _open_channel(self, number: int, channel: Channel | None) -> None:
        if channel is not None:
            raise ConnectionRefusal(CHANNEL_ERROR, f"second 'channel.open' seen on {number}")
        self.channels[number] = Channel(self, number)
        self.send_method(number, commands.Channel.OpenOk())

    def _content_frame(self, kind: int, number: int, payload: bytes) -> None:
        pending = self._content.get(number)
        if pending is None:
            raise ConnectionRefusal(UNEXPECTED_FRAME, f"content frame on channel {number}")
        method, size, properties, chunks = pending
        if kind == frames.HEADER:
            if size >= 0:
                raise ConnectionRefusal(UNEXPECTED_FRAME, "second content header")
            size, properties = frames.decode_content_header(payload)
            if len(properties) > limits.properties_bytes_max:
                raise ConnectionRefusal(FRAME_ERROR, "message properties too large")
            if size > limits.body_bytes_max:  # refused before its body is buffered
                del self._content[number]
                self._close_channel(self.channels[number], message_too_large(size), method)
                return
        elif size < 0:
            raise ConnectionRefusal(UNEXPECTED_FRAME, "content body before its header")
        else:
            chunks.append(payload)
        received = sum(len(chunk) for chunk in chunks)
        if received > size:
            raise ConnectionRefusal(FRAME_ERROR, "content body larger than its header said")
        if received < size:
            self._content[number] = (method, size, properties, chunks)
            return
        del self._content[number]
        channel = self.channels[number]
        try:
            channel.publish(method, properties, b"".join(chunks))
        except ChannelRefusal as refusal:
            self._close_channel(channel, refusal, method)
        except ConnectionRefusal as refusal:
            refusal.method_ids = _ids(method)
            raise

    def refuse_channel(self, channel: Channel, refusal: AmqpError, method: base.Frame) -> None:
        """Close `channel` for a refusal that came after its method (a publish's reply)."""
        self._close_channel(channel, refusal, method)

    def _close_channel(self, channel: Channel, refusal: AmqpError, method: base.Frame) -> None:
        """Close one channel with a soft error (RabbitMQ's channel.close), keep the others."""
        log.info("amqp_channel_error", channel=channel.number, error=refusal.reply_text)
        channel.release()
        channel.closing = True
        self._content.pop(channel.number, None)
        class_id, method_id = _ids(method)
        self.send_method(channel.number, commands.Channel.Close(
            reply_code=refusal.code, reply_text=refusal.reply_text,
            class_id=class_id, method_id=method_id,
        ))  # fmt: skip

    async def _close_with(self, refusal: AmqpError, class_id: int, method_id: int) -> None:
        """A hard error: connection.close, a short wait for close-ok, then the socket closes."""
        log.info("amqp_connection_error", error=refusal.reply_text)
        self._closing_connection = True
        self.send_method(0, commands.Connection.Close(
            reply_code=refusal.code, reply_text=refusal.reply_text,
            class_id=class_id, method_id=method_id,
        ))  # fmt: skip
        self._flush()
        with contextlib.suppress(TimeoutError, ConnectionError):
            await asyncio.wait_for(self.reader.read(limits.read_bytes), CLOSE_OK_WAIT_S)
        self.close()

    async def _heartbeats(self) -> None:
        """Send a heartbeat when nothing was written for half the interval; close after two
        intervals without a byte from the client (RabbitMQ's rule)."""
        if not self.heartbeat_s:
            return
        while not self.closed:
            await asyncio.sleep(self.heartbeat_s / 2)
            now = time.monotonic()
            if not self._unblocked.is_set():
                self._last_read = now  # blocked: the client's heartbeats wait unread
            if now - self._last_read > 2 * self.heartbeat_s:
                log.info("amqp_heartbeat_missed", connection=self.connection_id.number)
                self.close()
                return
            if now - self._last_write >= self.heartbeat_s / 2:
                self._write(frames.HEARTBEAT_FRAME)

    def shutdown(self) -> None:
        """The node is stopping: tell the client (320 CONNECTION_FORCED), then close."""
        if not self.closed:
            self.send_method(0, commands.Connection.Close(
                reply_code=CONNECTION_FORCED, reply_text="CONNECTION_FORCED - broker forced "
                "connection closure with reason 'shutdown'", class_id=0, method_id=0,
            ))  # fmt: skip
        self.close()

    def _closed(self) -> None:
        self.close()
        if not self.registered:
            return
        self.flush_settles()  # acks read before the close still count
        self.server.router.unregister(self.connection_id)
        log.info("amqp_disconnected", connection=self.connection_id.number)
        if self.server.stopping:  # the next incarnation's hello closes its connections
            return
        connection = self.connection_id
        if node_link.read(self.server, lambda view: view.lists_connection(connection)):
            self.propose(ConnectionDown(connection, "normal"), _ignore)

    # --- effects the node routes here ---------------------------------------------------------

    def on_effect(self, effect: Any) -> None:
        """An effect of an applied entry addressed to this connection (loop thread); a failure
        closes this connection only (its ConnectionDown returns what it held)."""
        try:
            self._effect(effect)
        except Exception:
            log.exception("amqp_effect_failed", connection=self.connection_id.number)
            self.close()

    def _effect(self, effect: Any) -> None:
        if isinstance(effect, Deliver):
            self._on_deliver(effect)
        elif isinstance(effect, ConsumerCancelled) and effect.reason == "queue_deleted":
            found = self.consumers.get(effect.tag)
            if found is not None:
                found[0].cancelled_by_server(found[1])
        elif isinstance(effect, Released):
            self._on_released(effect)

    def _on_deliver(self, effect: Deliver) -> None:
        found = self.consumers.get(effect.tag)
        if found is None:  # its channel closed meanwhile: give the messages back
            ids = tuple(message.msg_id for message in effect.messages)
            self.propose(Return(effect.queue, effect.consumer_key, ids), _ignore)
            return
        found[0].deliver(found[1], effect)

    def _on_released(self, effect: Released) -> None:
        """A consumer timeout: RabbitMQ 3.8+ closes the channel with 406."""
        found = self.consumers.get(effect.tag)
        if found is None:
            return
        channel = found[0]
        config = node_link.queue_config(self.server, effect.queue)
        timeout = config.consumer_timeout_ms if config else 0
        refusal = ChannelRefusal(PRECONDITION_FAILED, (
            f"delivery acknowledgement on channel {channel.number} timed out. Timeout value "
            f"used: {timeout} ms. This timeout value can be configured, see consumers doc "
            "guide to learn more"
        ))  # fmt: skip
        self._close_channel(channel, refusal, commands.Basic.Ack())


def _ids(method: base.Frame) -> tuple[int, int]:
    index = getattr(method, "index", 0)
    return index >> 16, index & 0xFFFF


def _bytes(value: Any) -> bytes:
    return value if isinstance(value, bytes) else str(value or "").encode("utf-8")


def _server_properties() -> dict[str, Any]:
    return {
        "product": PRODUCT,
        "version": "0.1.0",
        "platform": "Python",
        "capabilities": {
            "publisher_confirms": True,
            "basic.nack": True,
            "consumer_cancel_notify": True,
            "exchange_exchange_bindings": False,
            "connection.blocked": True,
            "authentication_failure_close": True,
            "per_consumer_qos": True,
            "consumer_priorities": True,
        },
    }


def _ignore(_reply: Any) -> None:
    """ConnectionDown and returns need no answer (the node reconciles connections)."""

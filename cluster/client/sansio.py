"""The whole client-side state as a sans-IO protocol: bytes and calls in, bytes and events out.

`ClientProtocol` holds the requests in flight, the publishers with their unconfirmed messages,
the consumers with their buffers, credit and pending acks, and the reconnect-and-resend logic.
It does no I/O and reads no clock (in the manner of h11): a shell feeds it received bytes
(`receive_data`), the time (`tick`), connection changes (`connection_made`, `connection_lost`)
and user calls, then writes `data_to_send()` to the socket and acts on the returned events.
`Client` (threads) and `AsyncClient` (asyncio) are two such shells.

Obligations of a shell:
- write the bytes of `data_to_send()` in the order they were taken, on the connection that was
  current when they were taken; bytes of a lost connection are dropped, never sent elsewhere
  (`connection_made` resends every unanswered request in order);
- report every connection end once with `connection_lost`, before the next `connection_made`;
- call `tick(now)` every `tick_wait_s()` or so with a monotonic clock (sooner once a received
  answer left the core `retrying`); on `CloseConnection` close the socket (and report it), on
  `ReconnectNeeded` connect to the endpoints in the order given.

Example (one blocking query; `Handshake` in `_wire` does the authentication the same way):
    core = ClientProtocol(["127.0.0.1:7001"])
    core.connection_made(welcome)                  # after the handshake on `sock`
    request_id = core.submit(protocol.query(0, "status"))
    sock.sendall(core.data_to_send())
    while not any(isinstance(e, Answered) for e in core.receive_data(sock.recv(65536))):
        pass
"""

from __future__ import annotations

import itertools
import random
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from cluster import protocol
from cluster.client._log import get_logger
from cluster.client._state import Buffered, ConsumerState, PublisherState, Unconfirmed
from cluster.client._wire import (
    OK_BYTES,
    AnyFrame,
    Frame,
    PublishFrames,
    Welcome,
    encode_enqueue,
    split_answers,
)
from cluster.client.errors import (
    AuthError,
    ClientClosed,
    ClusterError,
    CommandRefused,
    NoQuorum,
    RequestTimeout,
    Unavailable,
)
from fifo.codec import decode, encode
from fifo.commands import (
    Cancel,
    Checkout,
    CheckoutSpec,
    Command,
    ConnectionId,
    ConsumerId,
    ConsumerKey,
    Credit,
    Credited,
    Remove,
    Settle,
    SimplePrefetch,
)
from fifo.effects import (
    Effect,
    QueueStatus,
)
from fifo.replies import CheckoutOk, Error, NotEnqueued, Ok

log = get_logger("quorumq.client")

RETRY_CODES = frozenset({protocol.NOT_LEADER_TIMEOUT, protocol.UNAVAILABLE})
# refusals of this node alone (nothing was written): retried at once on another node
RETRY_ELSEWHERE_CODES = frozenset({protocol.DISK_FULL})
# set on an answer frame when an earlier attempt of the same request may have been applied
UNCERTAIN = "uncertain"
RETRY_DELAY_S = 0.1
# a publish refused by a node past its memory watermark (flow control) is resent after a delay
# that doubles per refusal up to the max, jittered down to half (refusals spread out)
MEMORY_ALARM_RETRY_S_MIN = 0.1
MEMORY_ALARM_RETRY_S_MAX = 2.0
# a node draining near its mark sets and clears its alarm again and again: an alarm that comes
# back within this long of the last record is the same episode for the log (one record)
MEMORY_ALARM_LOG_INTERVAL_S = 60.0
SWITCH_NODE_AFTER_S = 3.0  # only "unavailable" answers for this long: reconnect elsewhere
TICK_S = 0.05  # how often the owner ticks while a retry waits
SCAN_S = 0.5  # request deadlines and the silence check; an idle owner's tick period
BATCH_MAX = 512  # enqueue frames per write: bounds the latency a write adds to the first one
PUBLISH_FRAMES_KEPT = 64  # frame builders (publisher x ttl) kept per connection

# what a request's answer is for
_CALL, _PUBLISH, _SETTLE, _ATTACH, _REATTACH = range(5)


# --- events -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Answered:
    """A request made with `submit` (or `attach`) got its answer frame, or failed."""

    request_id: int
    answer: Frame | None
    error: ClusterError | None


@dataclass(frozen=True, slots=True)
class PublisherUpdated:
    """Confirms arrived, the queue blocked or unblocked the publisher, or it failed."""

    publisher: PublisherState


@dataclass(frozen=True, slots=True)
class ConsumerUpdated:
    """Messages arrived, the consumer's status changed, or a settle was answered."""

    consumer: ConsumerState


@dataclass(frozen=True, slots=True)
class CloseConnection:
    """The shell must close the current connection (and then report `connection_lost`)."""

    reason: str


@dataclass(frozen=True, slots=True)
class ReconnectNeeded:
    """The connection is gone; connect to one of `endpoints` (in this order) and resume."""

    endpoints: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Failed:
    """The client gave up (no reconnect, or none succeeded); every call now raises `error`."""

    error: ClusterError


Event = Answered | PublisherUpdated | ConsumerUpdated | CloseConnection | ReconnectNeeded | Failed


class _Request:
    """A request in flight: its encoded frame (with id), what it is for and when it gives up."""

    __slots__ = (
        "data",
        "deadline",
        "held",
        "kind",
        "refusal",
        "refused_since",
        "request_id",
        "retry_at",
        "sent_at",
        "target",
        "uncertain",
    )

    def __init__(
        self, request_id: int, data: bytes, kind: int, target: Any, deadline: float | None
    ) -> None:
        self.request_id = request_id
        self.data = data
        self.kind = kind
        self.target = target  # Unconfirmed | ConsumerState | None
        self.deadline = deadline
        self.retry_at = 0.0
        self.sent_at = 0.0
        # an earlier attempt may have been applied (its answer was lost or left it unknown)
        self.uncertain = False
        # the last "no leader" answer (a retry code) to an attempt, as "code: message"
        self.refusal: str | None = None
        self.refused_since = 0.0  # when the first such answer came (0: none yet)
        self.held = 0  # memory_alarm refusals of this request (its backoff)


class ClientProtocol:
    """The client's state machine over one connection at a time (see the module docstring)."""

    def __init__(
        self,
        endpoints: Sequence[str],
        *,
        name: str = "quorumq-client",
        reconnect: bool = True,
        silence_timeout_s: float = 5.0,
        frame_bytes_max: int = protocol.FRAME_BYTES_MAX_DEFAULT,
        now: float = 0.0,
        no_leader_fail_s: float | None = None,
    ) -> None:
        if not endpoints:
            raise ValueError("at least one endpoint host:port is required")
        self.name = name
        self.endpoints = list(dict.fromkeys(endpoints))
        self.reconnect = reconnect
        self.silence_timeout_s = silence_timeout_s
        # a request the nodes keep refusing for want of a leader fails after this long (None:
        # it is retried until its own deadline; an election takes a second or two)
        self.no_leader_fail_s = no_leader_fail_s
        self.frame_bytes_max = frame_bytes_max
        self.reconnects = 0
        self.welcome: Welcome | None = None  # the current connection, None while away
        self.connection_id: ConnectionId | None = None
        self.closed = False
        self.failure: ClusterError | None = None
        self._ids = itertools.count(1)
        self._tags = itertools.count(1)
        self._tag_prefix = f"{name}-{uuid.uuid4().hex[:8]}"
        self._inflight: dict[int, _Request] = {}
        self._retries: list[_Request] = []
        self._publishers: dict[tuple[str, str], PublisherState] = {}
        self._consumers: dict[tuple[str, str], ConsumerState] = {}
        self._out: list[bytes] = []
        self._buffer = b""
        self._events: list[Event] = []
        self._updated: dict[int, PublisherState | ConsumerState] = {}
        self._now = now
        self._received = False
        self._last_recv = now
        self._last_scan = now
        self._unavailable_since = 0.0  # first of an unbroken run of retryable errors
        self._refused_frames = 0  # frames refused in that run (logged once when it ends)
        self._refusal_seen = ""  # the last such refusal, for that record
        # the memory alarm of the current episode (the refusal's text), None when there is none
        self._memory_alarm: str | None = None
        self._memory_alarm_logged_at = -MEMORY_ALARM_LOG_INTERVAL_S
        self._jitter = random.Random()
        self._attached_once = False
        # the connection that ended, for the one record of the reconnect: (node, why, chosen)
        self._lost: tuple[str, str, bool] | None = None
        self._closing: str | None = None  # why this client asked its shell to close
        self._frames: dict[tuple[str, str, int | None, bytes | None], PublishFrames | None] = {}

    # --- bytes in and out ---------------------------------------------------------------------

    def data_to_send(self) -> bytes:
        """Every byte to write now, in order (empty when there is nothing)."""
        if not self._out:
            return b""
        out = b"".join(self._out)
        self._out.clear()
        return out

    @property
    def has_output(self) -> bool:
        """True while `data_to_send()` would return bytes."""
        return bool(self._out)

    def receive_data(self, data: bytes) -> list[Event]:
        """Take bytes received on the current connection; ProtocolError for a broken stream."""
        if self.welcome is None or not data:
            return []
        self._received = True
        buffer = self._buffer + data if self._buffer else data
        answers, self._buffer = split_answers(buffer, self.frame_bytes_max)
        for answer in answers:
            if type(answer) is int:
                self._on_ok(answer)
            else:
                self._on_frame(answer)  # type: ignore[arg-type]
        self._check_stuck()
        return self._take_events()

    @property
    def retrying(self) -> bool:
        """Whether a refused request waits to be resent (at a `tick`)."""
        return bool(self._retries)

    def tick_wait_s(self) -> float:
        """How long the owner may wait before the next `tick`: TICK_S while a retry waits, else
        SCAN_S (all a tick then does is the deadlines and the silence check). An idle client's
        ticker so wakes twice a second, not twenty times (0.002 cores each, beside the nodes
        on the same cores); the owner wakes it when a received answer makes `retrying` true."""
        return TICK_S if self._retries else SCAN_S

    def tick(self, now: float) -> list[Event]:
        """Advance time: resend due retries, expire requests, leave a silent node."""
        self._advance(now)
        now = self._now
        if self._received:
            self._received, self._last_recv = False, now
        if self._retries:
            due = [r for r in self._retries if r.retry_at <= now]
            if due:
                self._retries = [r for r in self._retries if r.retry_at > now]
                for request in due:
                    if self._inflight.get(request.request_id) is request:
                        self._write(request)
        if now - self._last_scan >= SCAN_S:
            self._last_scan = now
            self._expire(now)
            self._check_silence(now)
        return self._take_events()

    # --- connections ----------------------------------------------------------------------------

    def connection_made(self, welcome: Welcome, *, now: float | None = None) -> list[Event]:
        """A new connection passed its handshake: resend everything unanswered, re-attach."""
        self._advance(now)
        if self.closed:
            raise ClientClosed("the client was closed")
        for address in welcome.endpoints.values():
            if address not in self.endpoints:
                self.endpoints.append(address)
        self.welcome, self.connection_id = welcome, welcome.connection_id
        self._buffer, self._out = b"", []
        self._frames.clear()
        self._last_recv = self._now
        self._unavailable_since, self._refused_frames = 0.0, 0  # the reconnect is logged
        if self._attached_once:
            self.reconnects += 1
        self._attached_once = True
        pending = list(self._inflight.values())
        for request in pending:
            request.uncertain = request.uncertain or request.sent_at > 0.0
            self._write(request)
        self._log_reconnect(welcome, len(pending))
        for consumer in list(self._consumers.values()):
            self._reattach(consumer)
        return self._take_events()

    def connection_lost(self, error: BaseException | None = None) -> list[Event]:
        """The current connection ended (by either side); decide between reconnect and failure."""
        welcome, self.welcome, self.connection_id = self.welcome, None, None
        self._buffer, self._out = b"", []
        if self.closed or self.failure is not None or welcome is None:
            return self._take_events()
        chosen, self._closing = self._closing, None
        self._lost = (welcome.node, chosen or str(error), chosen is not None)
        log.debug("connection_lost", node=welcome.node, address=welcome.address, error=str(error))
        if not self.reconnect:
            return self.fail(Unavailable(f"lost the connection to {welcome.address}: {error}"))
        order = self.endpoints
        if welcome.address in order:
            start = order.index(welcome.address) + 1
            order = order[start:] + order[:start]
        self._events.append(ReconnectNeeded(tuple(order)))
        return self._take_events()

    def _log_reconnect(self, welcome: Welcome, resent: int) -> None:
        """One record per reconnect: WARNING when the node was lost (killed, closed, reset),
        INFO when this client chose to leave it (silent, or no commit through it)."""
        lost, self._lost = self._lost, None
        if lost is None:
            return
        node, why, chosen = lost
        level = log.info if chosen else log.warning
        level("reconnected", node=welcome.node, lost=node, reason=why, resent=resent)

    def _close_connection(self, why: str) -> None:
        self._closing = why
        self._events.append(CloseConnection(why))

    def fail(self, error: ClusterError) -> list[Event]:
        """Give up for good: every request and waiter gets `error`."""
        if self.closed or self.failure is not None:
            return self._take_events()
        self.failure = error
        self._end_everything(error)
        self._events.append(Failed(error))
        return self._take_events()

    def close(self) -> list[Event]:
        """Close the client: requests still in flight fail with ClientClosed."""
        if self.closed:
            return []
        self.closed = True
        self._end_everything(ClientClosed("the client was closed"))
        self.welcome = self.connection_id = None
        self._out = []
        return self._take_events()

    def _end_everything(self, error: ClusterError) -> None:
        pending = list(self._inflight.values())
        self._inflight.clear()
        self._retries = []
        for request in pending:
            self._finish(request, None, error)
        for consumer in self._consumers.values():
            consumer.closed = True
            self._touch(consumer)

    def check_usable(self) -> None:
        """Raise ClientClosed or the failure when no request can be made."""
        if self.closed:
            raise ClientClosed("the client was closed")
        if self.failure is not None:
            raise self.failure

    # --- requests -------------------------------------------------------------------------------

    def submit(
        self, frame: Frame, timeout_s: float | None = None, *, now: float | None = None
    ) -> int:
        """Send one request frame (its "id" is set here); its answer comes as `Answered`.

        `timeout_s` counts from `now` (default: the time of the last `tick`).
        """
        self._advance(now)
        return self._submit(frame, _CALL, None, timeout_s)

    def _advance(self, now: float | None) -> None:
        if now is not None and now > self._now:
            self._now = now

    def command_frame(self, command: Command) -> Frame:
        """The request frame of one command."""
        return protocol.command(0, encode(command))

    def forget(self, request_ids: Iterable[int]) -> None:
        """Stop tracking requests; their late answers are ignored."""
        for request_id in request_ids:
            self._inflight.pop(request_id, None)

    @property
    def in_flight(self) -> int:
        """Requests sent (or waiting for a connection) and not yet answered."""
        return len(self._inflight)

    @property
    def has_consumers(self) -> bool:
        """Whether a consumer is registered (deliveries may come unasked)."""
        return bool(self._consumers)

    def _submit(self, frame: Frame, kind: int, target: Any, timeout_s: float | None) -> int:
        self.check_usable()
        request_id = next(self._ids)
        frame["id"] = request_id
        data = protocol.encode_frame(frame, self.frame_bytes_max)
        deadline = None if timeout_s is None else self._now + timeout_s
        request = _Request(request_id, data, kind, target, deadline)
        self._inflight[request_id] = request
        if self.welcome is not None:
            self._write(request)
        return request_id

    def _write(self, request: _Request) -> None:
        request.sent_at = self._now
        self._out.append(request.data)

    def _on_ok(self, request_id: int) -> None:
        """An `Ok` reply to request `request_id` (nearly every confirm): a publish is confirmed
        here at once, any other request goes the general way."""
        request = self._inflight.get(request_id)
        if request is None:
            return
        if request.kind != _PUBLISH or request.uncertain:
            self._on_frame({"op": protocol.REPLY, "id": request_id, "reply": OK_BYTES})
            return
        del self._inflight[request_id]
        if self._unavailable_since:
            self._refusals_ended()
        self._confirm(request.target)

    def _confirm(self, item: Unconfirmed) -> None:
        """`item` is confirmed (a confirm of an earlier attempt may have come already)."""
        publisher = item.publisher
        self._updated[id(publisher)] = publisher
        if self._memory_alarm is not None:
            self._memory_alarm_ended()
        if publisher.pending.pop(item.seq, None) is not None:
            publisher.confirmed += 1

    def _on_frame(self, frame: AnyFrame) -> None:
        op = frame.get("op")
        if op == protocol.EFFECT:
            self._on_effect(decode(frame["effect"]))
            return
        request = self._inflight.pop(frame.get("id", -1), None)
        if request is None:
            if op == protocol.ERROR:
                # an answer to a request given up (expired, forgotten, answered by an earlier
                # attempt): nothing to act on, and a leader change makes hundreds of them
                log.debug("error_frame", code=frame.get("code"), message=frame.get("message"))
            return
        if op == protocol.ERROR:
            code = str(frame.get("code"))
            if code == protocol.MEMORY_ALARM and not self._expired(request):
                self._hold_for_memory(request, str(frame.get("message", "")))
                return
            elsewhere = code in RETRY_ELSEWHERE_CODES and self.reconnect and len(self.endpoints) > 1
            if code in RETRY_CODES or elsewhere:
                request.refusal = f"{code}: {frame.get('message', '')}"
                request.refused_since = request.refused_since or self._now
            retry = (code in RETRY_CODES or elsewhere) and not self._expired(request)
            if retry and not self._gave_up(request):
                self._refused_frames += 1
                self._refusal_seen = request.refusal or code
                request.uncertain = True
                request.retry_at = self._now + RETRY_DELAY_S
                self._inflight[request.request_id] = request
                self._retries.append(request)
                self._unavailable_since = self._unavailable_since or self._now
                if elsewhere:  # this node cannot take it, another can: switch at the next tick
                    self._unavailable_since = self._now - SWITCH_NODE_AFTER_S - TICK_S
                return
            gave_up = self._gave_up(request)
            what = f"refused for {self.no_leader_fail_s:g}s" if gave_up else None
            self._finish(request, None, _frame_error(frame, what))
            return
        if self._unavailable_since:
            self._refusals_ended()
        if request.uncertain:
            # an error reply now may only mean an earlier attempt already did the work (a settle
            # applied, then its consumer left): the caller must treat the outcome as unknown
            frame = {**frame, UNCERTAIN: True}
        self._finish(request, frame, None)

    def _refusals_ended(self) -> None:
        """A run of refusals for want of a leader ended with an answer: one record for it all
        (however many frames were refused), at INFO: the client rode it out."""
        if self._refused_frames:
            node = self.welcome.node if self.welcome is not None else None
            waited_s = round(self._now - self._unavailable_since, 2)
            log.info(
                "leader_unavailable",
                node=node,
                refused=self._refused_frames,
                for_s=waited_s,
                last=self._refusal_seen,
            )
        self._unavailable_since = 0.0
        self._refused_frames = 0

    def _hold_for_memory(self, request: _Request, message: str) -> None:
        """A request refused by a node past its memory high watermark (nothing was submitted):
        resend it after a bounded, jittered backoff; the publisher's window stays full meanwhile,
        which is the flow control. One WARNING per alarm episode says why (alarms that come
        back within MEMORY_ALARM_LOG_INTERVAL_S of it are the same episode)."""
        due = self._now - self._memory_alarm_logged_at >= MEMORY_ALARM_LOG_INTERVAL_S
        if self._memory_alarm is None and due:
            self._memory_alarm_logged_at = self._now
            node = self.welcome.node if self.welcome is not None else None
            log.warning("publishes_held_memory_alarm", node=node, reason=message)
        self._memory_alarm = message
        request.held += 1
        delay = min(MEMORY_ALARM_RETRY_S_MAX, MEMORY_ALARM_RETRY_S_MIN * 2 ** min(request.held, 8))
        request.retry_at = self._now + delay * self._jitter.uniform(0.5, 1.0)
        self._inflight[request.request_id] = request
        self._retries.append(request)

    def _memory_alarm_ended(self) -> None:
        """A publish was confirmed again after a memory alarm."""
        log.debug("publishes_resumed_memory_alarm_cleared")
        self._memory_alarm = None

    def _gave_up(self, request: _Request) -> bool:
        """True once `request` was refused for want of a leader for `no_leader_fail_s`."""
        limit = self.no_leader_fail_s
        return (
            limit is not None
            and request.refused_since > 0.0
            and self._now - request.refused_since >= limit
        )

    def _expired(self, request: _Request) -> bool:
        return request.deadline is not None and self._now >= request.deadline

    def _finish(
        self, request: _Request, answer: AnyFrame | None, error: ClusterError | None
    ) -> None:
        kind = request.kind
        if kind == _PUBLISH:
            self._on_publish_answer(request.target, answer, error)
        elif kind == _SETTLE:
            self._on_settle_answer(request.target, answer, error)
        elif kind == _CALL:
            self._events.append(Answered(request.request_id, answer, error))
        else:
            self._on_checkout_answer(request.target, answer, error)
            if kind == _ATTACH:
                self._events.append(Answered(request.request_id, answer, error))

    def _check_stuck(self) -> None:
        stuck = (
            self._unavailable_since and self._now - self._unavailable_since > SWITCH_NODE_AFTER_S
        )
        if stuck and len(self.endpoints) > 1 and self.welcome is not None:
            # this node cannot get anything committed (cut off from the majority?): try another
            log.debug("switching_node", node=self.welcome.node, after_s=SWITCH_NODE_AFTER_S)
            self._unavailable_since, self._refused_frames = 0.0, 0
            self._close_connection("no commit through this node")

    def _expire(self, now: float) -> None:
        expired = [
            r for r in self._inflight.values() if r.deadline is not None and now >= r.deadline
        ]
        for request in expired:
            del self._inflight[request.request_id]
            if request.refusal is not None:
                error: ClusterError = no_leader(request.refusal, "nothing committed in time")
            else:
                error = RequestTimeout("the cluster did not answer in time")
            self._finish(request, None, error)

    def _check_silence(self, now: float) -> None:
        """A node that answers nothing while requests wait (paused, wedged): go elsewhere."""
        oldest = next(iter(self._inflight.values()), None)
        if self.welcome is None or oldest is None:
            return
        waiting_s, silent_s = now - oldest.sent_at, now - self._last_recv
        if waiting_s > self.silence_timeout_s and silent_s > self.silence_timeout_s:
            log.debug("node_silent", node=self.welcome.node, silent_s=round(silent_s, 1))
            self._close_connection("the node is silent")

    def _touch(self, owner: PublisherState | ConsumerState) -> None:
        self._updated[id(owner)] = owner

    def _take_events(self) -> list[Event]:
        if self._updated:
            for owner in self._updated.values():
                if isinstance(owner, PublisherState):
                    self._events.append(PublisherUpdated(owner))
                else:
                    self._events.append(ConsumerUpdated(owner))
            self._updated = {}
        if not self._events:
            return []
        events, self._events = self._events, []
        return events

    # --- publishers -----------------------------------------------------------------------------

    def add_publisher(self, queue: str, window: int, enqueuer: str | None = None) -> PublisherState:
        """Start publishing to `queue` as `enqueuer` (a fresh one when None)."""
        if window < 1:
            raise ValueError("window must be at least 1")
        publisher = PublisherState(queue, window, enqueuer or uuid.uuid4().hex)
        self._publishers[(queue, publisher.enqueuer)] = publisher
        return publisher

    def remove_publisher(self, publisher: PublisherState) -> None:
        """Stop tracking a publisher (unconfirmed messages are no longer resent)."""
        if self._publishers.get((publisher.queue, publisher.enqueuer)) is publisher:
            del self._publishers[(publisher.queue, publisher.enqueuer)]

    def room(self, publisher: PublisherState) -> int:
        """How many messages may be published now (0: wait); raises the publisher's failure, or
        ClientClosed once the client is closed (a blocked publisher must not wait on)."""
        self.check_usable()
        if publisher.error is not None:
            raise publisher.error
        if publisher.blocked:
            return 0
        return max(0, min(publisher.window - len(publisher.pending), BATCH_MAX))

    def publish(
        self,
        publisher: PublisherState,
        bodies: Sequence[bytes],
        ttl_ms: int | None = None,
        group: str | None = None,
    ) -> list[int]:
        """Send messages (the caller keeps within `room`); returns their sequence numbers.
        `group`: their message group (a grouped queue, machine v3)."""
        self.check_usable()
        items: list[Unconfirmed] = []
        for body in bodies:
            item = Unconfirmed(publisher, publisher.next_seq, body, ttl_ms, group)
            publisher.next_seq += 1
            publisher.pending[item.seq] = item
            items.append(item)
        self._send_publishes(items)
        return [item.seq for item in items]

    def _send_publishes(self, items: list[Unconfirmed]) -> None:
        self.check_usable()
        frames: PublishFrames | None = None
        frames_for: tuple[PublisherState, int | None] | None = None
        inflight, now, connected = self._inflight, self._now, self.welcome is not None
        for item in items:
            publisher = item.publisher
            if item.group is not None:
                command = encode_enqueue(
                    publisher.queue,
                    item.body,
                    publisher.enqueuer,
                    item.seq,
                    item.ttl_ms,
                    item.group,
                )
                frame = {"op": protocol.COMMAND, "id": 0, "cmd": command}
                item.request_id = self._submit(frame, _PUBLISH, item, None)
                continue
            if frames_for != (publisher, item.ttl_ms):
                frames_for, frames = (publisher, item.ttl_ms), self._publish_frames(item)
            request_id = next(self._ids)
            if frames is None:  # (the fast encoding did not match the generic one)
                command = encode_enqueue(
                    publisher.queue, item.body, publisher.enqueuer, item.seq, item.ttl_ms
                )
                data = protocol.encode_frame(
                    protocol.command(request_id, command), self.frame_bytes_max
                )
            else:
                data = frames.frame(request_id, item.body, item.seq, self.frame_bytes_max)
            request = _Request(request_id, data, _PUBLISH, item, None)
            inflight[request_id] = request
            item.request_id = request_id
            if connected:
                request.sent_at = now
                self._out.append(data)

    def _publish_frames(self, item: Unconfirmed) -> PublishFrames | None:
        """The frame builder for `item`'s publisher and ttl on this connection (None: encode
        generically); kept per connection, since the frames carry its connection id."""
        welcome, publisher = self.welcome, item.publisher
        connection = welcome.connection if welcome is not None else None
        key = (publisher.queue, publisher.enqueuer, item.ttl_ms, connection)
        if key in self._frames:
            return self._frames[key]
        if len(self._frames) >= PUBLISH_FRAMES_KEPT:
            self._frames.clear()
        frames = PublishFrames(*key)
        usable = frames if frames.matches() else None
        if usable is None:
            log.warning("publish_fast_path_off", queue=publisher.queue)
        self._frames[key] = usable
        return usable

    def _on_publish_answer(
        self, item: Unconfirmed, answer: AnyFrame | None, error: ClusterError | None
    ) -> None:
        publisher = item.publisher
        self._touch(publisher)
        if error is not None or answer is None:
            publisher.fail(error or ClusterError("no answer"))
            return
        raw = answer["reply"]
        reply = Ok() if raw == OK_BYTES else decode(raw)
        if isinstance(reply, Ok):
            self._confirm(item)
        elif isinstance(reply, NotEnqueued):
            self._resend_gap(item, reply.expected_seq)
        elif isinstance(reply, Error):
            publisher.fail(CommandRefused(reply.code, reply.message))
        else:
            publisher.fail(CommandRefused("unexpected_reply", f"enqueue answered {reply!r}"))

    def unconfirmed_error(self, publisher: PublisherState, waited_s: float) -> ClusterError:
        """Why `publisher` still has unconfirmed messages after `waited_s`: Unavailable when every
        attempt that ended was refused for want of a leader (no quorum), else RequestTimeout."""
        count = len(publisher.pending)
        requests = [self._inflight.get(item.request_id) for item in publisher.pending.values()]
        refusals = [r.refusal for r in requests if r is not None and r.refusal is not None]
        if refusals and len(refusals) == len(requests):
            return no_leader(refusals[-1], f"{count} messages not confirmed in {waited_s:.1f}s")
        if self._memory_alarm is not None:
            return RequestTimeout(
                f"{count} messages still unconfirmed after {waited_s:.1f}s: {self._memory_alarm}"
            )
        return RequestTimeout(f"{count} messages still unconfirmed after {waited_s:.1f}s")

    def _resend_gap(self, item: Unconfirmed, expected: int) -> None:
        """Resend [expected, item.seq] sent no later than `item` (they may have been lost)."""
        publisher = item.publisher
        if publisher.pending.get(item.seq) is not item:
            return
        resend = publisher.gap_to_resend(item, expected)
        publisher.resent += len(resend)
        self.forget(p.request_id for p in resend)
        self._send_publishes(resend)

    def _on_queue_status(self, effect: QueueStatus) -> None:
        publisher = self._publishers.get((effect.queue, effect.enqueuer))
        if publisher is not None:
            publisher.blocked = effect.status == "reject_publish"
            self._touch(publisher)

    # --- consumers: attaching -------------------------------------------------------------------

    def next_tag(self) -> str:
        """A consumer tag unique to this client."""
        return f"{self._tag_prefix}-{next(self._tags)}"

    def add_consumer(
        self,
        queue: str,
        *,
        prefetch: int = 100,
        credited: bool = False,
        priority: int = 0,
        timeout_ms: int | None = None,
        auto_ack: bool = False,
        ack_batch: int | None = None,
        tag: str | None = None,
    ) -> ConsumerState:
        """Register a consumer (deliveries for its tag are buffered); `attach` checks it out.
        `tag` names it (unique per queue in this client); by default a fresh one."""
        if prefetch < 1 and not credited:
            raise ValueError("prefetch must be at least 1")
        if tag is not None and (queue, tag) in self._consumers:
            raise ValueError(f"tag {tag!r} is already used on queue {queue!r} by this client")
        batch = ack_batch or max(1, min(prefetch, 200) // 2)
        consumer = ConsumerState(
            queue, tag or self.next_tag(), prefetch, credited, priority, timeout_ms, auto_ack, batch
        )
        self._consumers[(queue, consumer.tag)] = consumer
        return consumer

    def consumers(self) -> list[ConsumerState]:
        """Every registered consumer."""
        return list(self._consumers.values())

    def remove_consumer(self, consumer: ConsumerState) -> None:
        """Stop routing pushes to this consumer."""
        if self._consumers.get((consumer.queue, consumer.tag)) is consumer:
            del self._consumers[(consumer.queue, consumer.tag)]

    def attach(
        self, consumer: ConsumerState, timeout_s: float | None = None, *, now: float | None = None
    ) -> int:
        """Send the consumer's checkout; its answer comes as `Answered` with this id."""
        self._advance(now)
        command = self._checkout(consumer, self._spec(consumer))
        return self._submit(self.command_frame(command), _ATTACH, consumer, timeout_s)

    def _reattach(self, consumer: ConsumerState) -> None:
        """Attach again through the new connection (a new consumer; old messages still settle)."""
        if consumer.cancelled or consumer.closed:
            return
        command = self._checkout(consumer, self._spec(consumer))
        self._submit(self.command_frame(command), _REATTACH, consumer, None)

    @staticmethod
    def _spec(consumer: ConsumerState) -> CheckoutSpec:
        if consumer.credited:
            return Credited(consumer.delivery_count)
        return SimplePrefetch(consumer.prefetch)

    def _checkout(self, consumer: ConsumerState, spec: CheckoutSpec) -> Checkout:
        # the node overwrites the connection anyway; any placeholder is fine while away
        connection = self.connection_id or ConnectionId("", 0, 0)
        return Checkout(
            consumer.queue,
            ConsumerId(consumer.tag, connection),
            spec,
            consumer.priority,
            consumer.timeout_ms,
        )

    def _on_checkout_answer(
        self, consumer: ConsumerState, answer: AnyFrame | None, error: ClusterError | None
    ) -> None:
        if answer is None:
            log.warning(
                "resubscribe_failed", queue=consumer.queue, tag=consumer.tag, error=str(error)
            )
            return
        reply = decode(answer["reply"])
        if isinstance(reply, CheckoutOk):
            consumer.consumer_key = reply.consumer_key
            consumer.active = reply.is_active
            consumer.status = "up" if reply.is_active else "waiting"
            self._touch(consumer)

    def leave(
        self,
        consumer: ConsumerState,
        spec: Cancel | Remove,
        timeout_s: float | None,
        *,
        now: float | None = None,
    ) -> int:
        """Send a cancel or remove checkout; `Answered` comes with this id (then `left`)."""
        self._advance(now)
        if isinstance(spec, Remove):
            self.flush_acks(consumer)  # a removed consumer's late settles are ignored
        return self.submit(self.command_frame(self._checkout(consumer, spec)), timeout_s)

    def left(self, consumer: ConsumerState) -> None:
        """The consumer's cancel was answered: it gets nothing more."""
        consumer.cancelled = True
        self._touch(consumer)

    def close_consumer(self, consumer: ConsumerState) -> None:
        """Flush acks and stop handing out messages (attached until the connection ends)."""
        self.flush_acks(consumer)
        consumer.closed = True
        self._touch(consumer)

    # --- consumers: receiving -------------------------------------------------------------------

    def _on_effect(self, effect: Effect) -> None:
        if isinstance(effect, QueueStatus):
            self._on_queue_status(effect)
            return
        tag = getattr(effect, "tag", None)
        consumer = self._consumers.get((effect.queue, tag)) if isinstance(tag, str) else None
        if consumer is None:
            return
        self._touch(consumer)
        consumer.apply(effect)

    def next_delivery(self, consumer: ConsumerState) -> Buffered | None:
        """The next buffered delivery (key, fifo Delivery); None when empty (acks are flushed,
        since the server refills credit only once we settle)."""
        if not consumer.buffer:
            self.flush_acks(consumer)
            return None
        item = consumer.buffer.popleft()
        if consumer.auto_ack:
            self.ack(consumer, [(item[0], item[1].msg_id)])
        return item

    def take_buffered(self, consumer: ConsumerState) -> list[Buffered]:
        """Remove and return the deliveries received but not yet handed out."""
        items, consumer.buffer = list(consumer.buffer), deque()
        return items

    # --- consumers: settling --------------------------------------------------------------------

    def ack(self, consumer: ConsumerState, pairs: Iterable[tuple[ConsumerKey | None, int]]) -> None:
        """Buffer acks (sent once `ack_batch` wait, or on `flush_acks`)."""
        for key, msg_id in consumer.keyed(pairs):
            consumer.acks.setdefault(key, []).append(msg_id)
            consumer.ack_count += 1
        if consumer.ack_count >= consumer.ack_batch:
            self.flush_acks(consumer)

    def flush_acks(self, consumer: ConsumerState) -> None:
        """Send every buffered ack now."""
        if not consumer.acks:
            return
        acks, consumer.acks, consumer.ack_count = consumer.acks, {}, 0
        queue = consumer.queue
        self._send_settles(consumer, [Settle(queue, key, tuple(ids)) for key, ids in acks.items()])

    def settle(
        self,
        consumer: ConsumerState,
        pairs: Iterable[tuple[ConsumerKey | None, int]],
        build: Callable[[ConsumerKey, tuple[int, ...]], Command],
    ) -> None:
        """Send `build(key, ids)` (a return, discard, modify or renew) per consumer key, after
        the buffered acks (so settles go out in the order the caller made them)."""
        groups: dict[ConsumerKey, list[int]] = {}
        for key, msg_id in consumer.keyed(pairs):
            groups.setdefault(key, []).append(msg_id)
        self.flush_acks(consumer)
        self._send_settles(consumer, [build(key, tuple(ids)) for key, ids in groups.items()])

    def grant(self, consumer: ConsumerState, credit: int, drain: bool = False) -> None:
        """Credited mode: grant `credit` more deliveries (AMQP 1.0 flow)."""
        key = consumer.require_key()
        command = Credit(consumer.queue, key, credit, consumer.delivery_count, drain)
        self._send_settles(consumer, [command])

    def _send_settles(self, consumer: ConsumerState, commands: list[Command]) -> None:
        if not commands or self.closed or self.failure is not None:
            return
        for command in commands:
            consumer.outstanding += 1
            self._submit(self.command_frame(command), _SETTLE, consumer, None)

    def _on_settle_answer(
        self, consumer: ConsumerState, answer: AnyFrame | None, error: ClusterError | None
    ) -> None:
        refused = error is not None
        if answer is not None:
            reply = decode(answer["reply"])
            # an error after an attempt with an unknown outcome is no refusal: that attempt may
            # have settled the message (then it is gone), else it comes back (at least once)
            refused = isinstance(reply, Error) and not answer.get(UNCERTAIN)
            if refused:
                log.info("settle_refused", queue=consumer.queue, reply=repr(reply))
        consumer.outstanding -= 1
        consumer.settle_errors += refused
        self._touch(consumer)


def no_leader(refusal: str, what: str) -> NoQuorum:
    """The error of a request whose attempts the nodes refused for want of a leader."""
    return NoQuorum(
        f"no leader: the cluster has no quorum to commit ({what}; the nodes answered {refusal})"
    )


def explain_timeout(status: object, error: ClusterError) -> ClusterError:
    """`error` (a timeout), or Unavailable when the node's status map says it reaches no
    majority of the cluster or knows no leader: nothing can commit until a quorum is back."""
    if not isinstance(error, RequestTimeout) or not isinstance(status, dict):
        return error
    node = status.get("id") or "the node"
    if status.get("has_quorum") is False:
        reason = f"{node} reaches no majority of the nodes"
    elif status.get("leader") is None:
        reason = f"{node} knows no leader"
    else:
        return error
    return NoQuorum(f"no leader: the cluster has no quorum ({reason}); {error}")


def _frame_error(frame: AnyFrame, what: str | None = None) -> ClusterError:
    code, message = str(frame.get("code")), str(frame.get("message", ""))
    if code in RETRY_CODES:
        return no_leader(f"{code}: {message}", what or "the request's time ran out")
    if code in (protocol.AUTH_FAILED, protocol.NOT_AUTHENTICATED):
        return AuthError(message)
    return CommandRefused(code, message)

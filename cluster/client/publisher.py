"""Confirmed, pipelined publishing with publisher dedup (enqueuer id + sequence numbers).

Up to `window` messages are unconfirmed at a time; `publish_many` sends many enqueue commands in
one write. A message stays pending until the cluster confirms it; after a reconnect the client
resends it with the same enqueuer id and sequence number, so the queue drops duplicates. A
`NotEnqueued` reply (a sequence gap: an earlier message was lost on its way) resends the gap.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterable
from typing import TYPE_CHECKING

from cluster import protocol
from cluster.client._connection import Message
from cluster.client.errors import ClusterError, CommandRefused, RequestTimeout
from fifo.codec import decode, encode
from fifo.commands import Enqueue
from fifo.replies import Error, NotEnqueued, Ok
from fifo.wire import fields_encoder

if TYPE_CHECKING:
    from cluster.client.client import Client

BATCH_MAX = 512  # enqueue frames per write: bounds the latency a write adds to the first one
_OK = Ok()
_OK_BYTES = encode(_OK)  # nearly every confirm: compared instead of decoded


class _Pending:
    """An unconfirmed message: its body, sequence number and the request that carries it."""

    __slots__ = ("body", "request_id", "seq", "ttl_ms")

    def __init__(self, seq: int, body: bytes, ttl_ms: int | None) -> None:
        self.seq = seq
        self.body = body
        self.ttl_ms = ttl_ms
        self.request_id = 0


class Publisher:
    """Publishes to one queue as one enqueuer; use as a context manager to wait for confirms."""

    def __init__(
        self, client: Client, queue: str, *, window: int = 100, enqueuer: str | None = None
    ) -> None:
        if window < 1:
            raise ValueError("window must be at least 1")
        self.client = client
        self.queue = queue
        self.window = window
        self.enqueuer = enqueuer or uuid.uuid4().hex
        self.confirmed = 0
        self.resent = 0
        self._next_seq = 1
        self._pending: dict[int, _Pending] = {}
        self._cond = threading.Condition()
        self._error: ClusterError | None = None
        self.blocked = False  # the queue asked us to stop (overflow reject_publish)
        client._register_publisher(self)

    def __enter__(self) -> Publisher:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        try:
            if exc_type is None:
                self.wait_for_confirms()
        finally:
            self.close()

    def close(self) -> None:
        """Stop tracking this publisher (unconfirmed messages are no longer resent)."""
        self.client._unregister_publisher(self)

    @property
    def unconfirmed(self) -> int:
        """Messages sent (or queued to send) and not yet confirmed."""
        return len(self._pending)

    def publish(
        self, body: bytes, *, ttl_ms: int | None = None, timeout_s: float | None = None
    ) -> int:
        """Send one message (waits while the window is full); returns its sequence number."""
        return self.publish_many([body], ttl_ms=ttl_ms, timeout_s=timeout_s)[0]

    def publish_many(
        self, bodies: Iterable[bytes], *, ttl_ms: int | None = None, timeout_s: float | None = None
    ) -> list[int]:
        """Send many messages, as many per write as the window allows; returns their seqs."""
        timeout = self.client.request_timeout_s if timeout_s is None else timeout_s
        seqs: list[int] = []
        batch: list[_Pending] = []
        for body in bodies:
            if not batch:
                room = self._wait_for_room(timeout)
            with self._cond:
                item = _Pending(self._next_seq, body, ttl_ms)
                self._next_seq += 1
                self._pending[item.seq] = item
            batch.append(item)
            seqs.append(item.seq)
            if len(batch) >= min(room, BATCH_MAX):
                self._send(batch)
                batch = []
        if batch:
            self._send(batch)
        return seqs

    def _wait_for_room(self, timeout_s: float) -> int:
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while True:
                if self._error is not None:
                    raise self._error
                room = self.window - len(self._pending)
                if room > 0 and not self.blocked:
                    return room
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RequestTimeout(f"the publish window stayed full for {timeout_s:.1f}s")
                self._cond.wait(left)

    def wait_for_confirms(self, timeout_s: float | None = None) -> None:
        """Wait until every message sent so far is confirmed; raises the first failure."""
        timeout = self.client.request_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._pending and self._error is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RequestTimeout(
                        f"{len(self._pending)} messages still unconfirmed after {timeout:.1f}s"
                    )
                self._cond.wait(left)
            if self._error is not None:
                raise self._error

    # --- sending and confirms --------------------------------------------------------------

    def _frame(self, item: _Pending) -> Message:
        return protocol.command(
            0, _encode_enqueue(self.queue, item.body, self.enqueuer, item.seq, item.ttl_ms)
        )

    def _send(self, items: list[_Pending]) -> None:
        frames = [self._frame(item) for item in items]
        callbacks = [self._callback(item) for item in items]
        ids = self.client.submit(frames, callbacks)
        with self._cond:
            for item, request_id in zip(items, ids, strict=True):
                item.request_id = request_id

    def _callback(self, item: _Pending):  # type: ignore[no-untyped-def]
        def on_answer(answer: Message | None, error: BaseException | None) -> None:
            self._on_answer(item, answer, error)

        return on_answer

    def _on_answer(
        self, item: _Pending, answer: Message | None, error: BaseException | None
    ) -> None:
        if error is not None:
            self._set_error(error if isinstance(error, ClusterError) else ClusterError(str(error)))
            return
        assert answer is not None
        raw = answer["reply"]
        reply = _OK if raw == _OK_BYTES else decode(raw)
        if isinstance(reply, Ok):
            with self._cond:
                if self._pending.pop(item.seq, None) is not None:
                    self.confirmed += 1
                    self._cond.notify_all()
        elif isinstance(reply, NotEnqueued):
            self._resend_gap(item, reply.expected_seq)
        elif isinstance(reply, Error):
            self._set_error(CommandRefused(reply.code, reply.message))
        else:
            self._set_error(CommandRefused("unexpected_reply", f"enqueue answered {reply!r}"))

    def _resend_gap(self, item: _Pending, expected: int) -> None:
        """Resend [expected, item.seq] sent no later than `item` (they may have been lost)."""
        with self._cond:
            if item.seq not in self._pending or self._pending[item.seq] is not item:
                return
            earlier = [p for p in self._pending.values() if expected <= p.seq < item.seq]
            if not earlier and expected < item.seq:
                self._renumber(expected)  # the queue forgot this enqueuer: start again at expected
                resend = sorted(self._pending.values(), key=lambda p: p.seq)
            else:
                resend = [
                    *sorted(
                        (p for p in earlier if p.request_id <= item.request_id), key=lambda p: p.seq
                    ),
                    item,
                ]
            self.resent += len(resend)
        self.client.forget([p.request_id for p in resend])
        self._send(resend)

    def _renumber(self, start: int) -> None:
        items = sorted(self._pending.values(), key=lambda p: p.seq)
        self._pending = {}
        for offset, pending in enumerate(items):
            pending.seq = start + offset
            self._pending[pending.seq] = pending
        self._next_seq = start + len(items)

    def _set_error(self, error: ClusterError) -> None:
        with self._cond:
            if self._error is None:
                self._error = error
            self._cond.notify_all()

    def _on_queue_status(self, status: str) -> None:
        with self._cond:
            self.blocked = status == "reject_publish"
            self._cond.notify_all()


_enqueue_fields = fields_encoder(Enqueue)  # schema-derived, tested against fifo.encode


def _encode_enqueue(queue: str, body: bytes, enqueuer: str, seq: int, ttl_ms: int | None) -> bytes:
    """`fifo.encode(Enqueue(...))` without building the dataclass: the hot path of publishing."""
    return _enqueue_fields(queue, body, enqueuer, seq, None, ttl_ms)

"""Consumers: an iterator (or a callback thread) over deliveries, with settles batched.

`ack` is buffered and sent in batches (when `ack_batch` acks are waiting, before the consumer
blocks for more messages, and on `flush_acks`/`cancel`/close); `nack`, `reject`, `modify` and
`renew` are sent at once. Settles are asynchronous: a refused one is counted in
`settle_errors`, since the message it named comes back to some consumer anyway.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import structlog

from cluster import protocol
from cluster.client._connection import Message as Frame
from cluster.client.errors import ClientClosed, CommandRefused
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
    Discard,
    Modify,
    Remove,
    RenewLocks,
    Return,
    Settle,
    SimplePrefetch,
)
from fifo.effects import (
    ConsumerCancelled,
    ConsumerUpdate,
    CreditReply,
    Deliver,
    Effect,
    Released,
)
from fifo.replies import CancelOk, CheckoutOk, Error

if TYPE_CHECKING:
    from cluster.client.client import Client

log = structlog.get_logger("quorumq.client")
SERIAL_MASK = 0xFFFFFFFF  # AMQP 1.0 delivery counts are 32-bit serial numbers


class Settles(Protocol):
    """What a message is settled through: its consumer (or the client, for a dequeue)."""

    def ack(self, messages: list[Message]) -> None: ...

    def nack(self, messages: list[Message], requeue: bool = True) -> None: ...

    def reject(self, messages: list[Message]) -> None: ...


@dataclass(frozen=True, slots=True)
class Message:
    """One delivered message; settle it with `ack()`, `nack()`, `reject()` or the consumer."""

    queue: str
    msg_id: int
    body: bytes
    redelivered: bool
    delivery_count: int
    consumer_key: ConsumerKey
    annotations: tuple[tuple[str, str | int], ...] = ()
    consumer: Settles | None = field(default=None, repr=False, compare=False)

    def ack(self) -> None:
        """Settle: the message is done."""
        self._owner().ack([self])

    def nack(self, requeue: bool = True) -> None:
        """Return it to the queue (`requeue`), or reject it (dead-letter / drop)."""
        self._owner().nack([self], requeue=requeue)

    def reject(self) -> None:
        """Discard it: a failed delivery, dead-lettered if the queue has a target."""
        self._owner().reject([self])

    def _owner(self) -> Settles:
        if self.consumer is None:
            raise ValueError("this message has no consumer to settle it with")
        return self.consumer


class Consumer:
    """A consumer of one queue, with prefetch (default) or AMQP 1.0 credit."""

    def __init__(
        self,
        client: Client,
        queue: str,
        *,
        prefetch: int = 100,
        credited: bool = False,
        priority: int = 0,
        timeout_ms: int | None = None,
        auto_ack: bool = False,
        ack_batch: int | None = None,
    ) -> None:
        if prefetch < 1 and not credited:
            raise ValueError("prefetch must be at least 1")
        self.client = client
        self.queue = queue
        self.tag = client._next_tag()
        self.prefetch = prefetch
        self.credited = credited
        self.priority = priority
        self.timeout_ms = timeout_ms
        self.auto_ack = auto_ack
        self.ack_batch = ack_batch or max(1, min(prefetch, 200) // 2)
        self.consumer_key: ConsumerKey | None = None
        self.active = True
        self.status = "up"
        self.cancelled = False
        self.released: set[int] = set()
        self.settle_errors = 0
        self.delivered = 0
        self.delivery_count = 0  # receiver's serial delivery count (credited mode)
        self.last_credit_reply: CreditReply | None = None
        self._buffer: deque[Message] = deque()
        self._acks: dict[ConsumerKey, list[int]] = {}
        self._ack_count = 0
        self._cond = threading.Condition()
        self._ack_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._outstanding = 0  # settle commands sent and not yet answered

    # --- attach ---------------------------------------------------------------------------

    def _spec(self) -> CheckoutSpec:
        return Credited(self.delivery_count) if self.credited else SimplePrefetch(self.prefetch)

    def _checkout(self, spec: CheckoutSpec) -> Checkout:
        connection = self._connection_id()
        return Checkout(
            self.queue, ConsumerId(self.tag, connection), spec, self.priority, self.timeout_ms
        )

    def _connection_id(self) -> ConnectionId:
        try:
            return self.client.connection_id
        except Exception:  # the node overwrites it anyway; any placeholder is fine
            return ConnectionId("", 0, 0)

    def start(self, on_message: Callable[[Message], None] | None = None) -> None:
        """Attach to the queue (waits for the checkout); with `on_message`, start a thread."""
        self.client._register_consumer(self)
        try:
            reply = self.client.command(self._checkout(self._spec()))
        except BaseException:
            self.client._unregister_consumer(self)
            raise
        self._on_checkout_reply(reply)
        if on_message is not None:
            self._thread = threading.Thread(
                target=self._run_callback,
                args=(on_message,),
                name=f"qq-consumer-{self.tag}",
                daemon=True,
            )
            self._thread.start()

    def _on_checkout_reply(self, reply: object) -> None:
        if isinstance(reply, CheckoutOk):
            with self._cond:
                self.consumer_key = reply.consumer_key
                self.active = reply.is_active
                self.status = "up" if reply.is_active else "waiting"
                self._cond.notify_all()

    def _on_reconnected(self) -> None:
        """Attach again through the new connection (a new consumer; old messages still settle)."""
        if self.cancelled or self._closed:
            return

        def on_answer(answer: Frame | None, error: BaseException | None) -> None:
            if answer is not None:
                self._on_checkout_reply(decode(answer["reply"]))
            elif error is not None:
                log.warning("resubscribe_failed", queue=self.queue, tag=self.tag, error=str(error))

        frame = protocol.command(0, encode(self._checkout(self._spec())))
        self.client.submit([frame], [on_answer])

    # --- receiving ------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Message]:
        return self

    def __next__(self) -> Message:
        message = self.get(timeout_s=None)
        if message is None:
            raise StopIteration
        return message

    def get(self, timeout_s: float | None = None) -> Message | None:
        """The next message, waiting up to `timeout_s` (None: until cancelled or closed)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._cond:
            if not self._buffer:
                self._cond.release()
                try:
                    self.flush_acks()  # the server refills credit only once we settle
                finally:
                    self._cond.acquire()
            while not self._buffer:
                if self._closed or self.cancelled:
                    return None
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return None
                self._cond.wait(left if left is not None else 1.0)
            message = self._buffer.popleft()
        if self.auto_ack:
            self.ack([message])
        return message

    def _on_effect(self, effect: Effect) -> None:
        with self._cond:
            if isinstance(effect, Deliver):
                self._on_deliver(effect)
            elif isinstance(effect, Released):
                self.released.update(effect.msg_ids)
                self.status = "timeout"  # until it names the released ids (design, v2)
                dropped = set(effect.msg_ids)
                self._buffer = deque(m for m in self._buffer if m.msg_id not in dropped)
            elif isinstance(effect, ConsumerUpdate):
                self.active, self.status = effect.active, effect.status
            elif isinstance(effect, CreditReply):
                self.last_credit_reply = effect
                self.delivery_count = effect.delivery_count
            elif isinstance(effect, ConsumerCancelled) and (
                effect.consumer_key == self.consumer_key or self.consumer_key is None
            ):
                self.cancelled = True
            self._cond.notify_all()

    def _on_deliver(self, effect: Deliver) -> None:
        for delivery in effect.messages:
            self._buffer.append(
                Message(
                    effect.queue,
                    delivery.msg_id,
                    delivery.body,
                    delivery.redelivered,
                    delivery.delivery_count,
                    effect.consumer_key,
                    delivery.annotations,
                    self,
                )
            )
        self.delivered += len(effect.messages)
        self.delivery_count = (self.delivery_count + len(effect.messages)) & SERIAL_MASK

    def _run_callback(self, on_message: Callable[[Message], None]) -> None:
        while True:
            message = self.get(timeout_s=None)
            if message is None:
                return
            try:
                on_message(message)
            except Exception:  # a failing callback must not kill the consumer thread
                log.exception("consumer_callback_failed", queue=self.queue, msg_id=message.msg_id)

    # --- settling ---------------------------------------------------------------------------

    def ack(self, messages: Iterable[Message | int]) -> None:
        """Settle messages (batched: sent once `ack_batch` are waiting or on `flush_acks`)."""
        with self._ack_lock:
            for key, msg_id in self._keyed(messages):
                self._acks.setdefault(key, []).append(msg_id)
                self._ack_count += 1
            full = self._ack_count >= self.ack_batch
        if full:
            self.flush_acks()

    def flush_acks(self) -> None:
        """Send every buffered ack now."""
        with self._ack_lock:
            acks, self._acks, self._ack_count = self._acks, {}, 0
        if acks:
            self._send_async([Settle(self.queue, key, tuple(ids)) for key, ids in acks.items()])

    def nack(self, messages: Iterable[Message | int], requeue: bool = True) -> None:
        """Return messages (`requeue`, no failed delivery) or reject them."""
        kind = Return if requeue else Discard
        self._send_grouped(messages, lambda key, ids: kind(self.queue, key, ids))

    def reject(self, messages: Iterable[Message | int]) -> None:
        """Discard messages: a failed delivery; dead-lettered when the queue has a target."""
        self._send_grouped(messages, lambda key, ids: Discard(self.queue, key, ids))

    def modify(
        self,
        messages: Iterable[Message | int],
        *,
        delivery_failed: bool = True,
        undeliverable_here: bool = False,
        annotations: tuple[tuple[str, str | int], ...] = (),
    ) -> None:
        """AMQP 1.0 modified outcome (machine v2): return or dead-letter with annotations."""
        self._send_grouped(
            messages,
            lambda key, ids: Modify(
                self.queue, key, ids, delivery_failed, undeliverable_here, annotations
            ),
        )

    def renew(self, messages: Iterable[Message | int]) -> None:
        """Extend the consumer-timeout locks of checked-out messages (machine v2)."""
        self._send_grouped(messages, lambda key, ids: RenewLocks(self.queue, key, ids))

    def grant(self, credit: int, drain: bool = False) -> None:
        """Credited mode: grant `credit` more deliveries (AMQP 1.0 flow)."""
        key = self._require_key()
        self._send_async([Credit(self.queue, key, credit, self.delivery_count, drain)])

    def _keyed(self, messages: Iterable[Message | int]) -> list[tuple[ConsumerKey, int]]:
        pairs: list[tuple[ConsumerKey, int]] = []
        for item in messages:
            if isinstance(item, Message):
                pairs.append((item.consumer_key, item.msg_id))
            else:
                pairs.append((self._require_key(), item))
        if self.released:
            self._clear_released({msg_id for _, msg_id in pairs})
        return pairs

    def _clear_released(self, msg_ids: set[int]) -> None:
        """Naming timed-out ids clears them; with none left the consumer is back to normal."""
        with self._cond:
            self.released -= msg_ids
            if not self.released and self.status == "timeout":
                self.status = "up"

    def _send_grouped(
        self,
        messages: Iterable[Message | int],
        build: Callable[[ConsumerKey, tuple[int, ...]], Command],
    ) -> None:
        groups: dict[ConsumerKey, list[int]] = {}
        for key, msg_id in self._keyed(messages):
            groups.setdefault(key, []).append(msg_id)
        self.flush_acks()  # keep settles in the order the caller made them
        self._send_async([build(key, tuple(ids)) for key, ids in groups.items()])

    def _send_async(self, commands: list[Command]) -> None:
        if not commands:
            return
        frames = [protocol.command(0, encode(command)) for command in commands]
        with self._cond:
            self._outstanding += len(frames)
        try:
            self.client.submit(frames, [self._on_settle_answer] * len(frames))
        except ClientClosed:
            with self._cond:
                self._outstanding -= len(frames)
                self._cond.notify_all()

    def wait_settled(self, timeout_s: float = 10.0) -> bool:
        """Flush acks and wait until every settle sent so far is answered; False on timeout."""
        self.flush_acks()
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._outstanding > 0:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def take_buffered(self) -> list[Message]:
        """Remove and return the messages received but not yet handed out (not acked)."""
        with self._cond:
            items, self._buffer = list(self._buffer), deque()
        return items

    def _on_settle_answer(self, answer: Frame | None, error: BaseException | None) -> None:
        refused = error is not None
        if answer is not None:
            reply = decode(answer["reply"])
            refused = isinstance(reply, Error)
            if refused:
                log.info("settle_refused", queue=self.queue, reply=repr(reply))
        with self._cond:
            self._outstanding -= 1
            if refused:
                self.settle_errors += 1
            self._cond.notify_all()

    def _require_key(self) -> ConsumerKey:
        if self.consumer_key is None:
            raise CommandRefused("unknown_consumer", "the consumer is not attached")
        return self.consumer_key

    # --- leaving ----------------------------------------------------------------------------

    def cancel(self) -> CancelOk | None:
        """Soft cancel: nothing new; pending messages can still be settled."""
        return self._leave(Cancel())

    def remove(self) -> CancelOk | None:
        """Hard cancel (machine v2): pending messages return to the queue at once."""
        return self._leave(Remove())

    def _leave(self, spec: CheckoutSpec) -> CancelOk | None:
        if isinstance(spec, Remove):
            self.flush_acks()  # a removed consumer's late settles are ignored
        reply = self.client.command(self._checkout(spec))
        with self._cond:
            self.cancelled = True
            self._cond.notify_all()
        return reply if isinstance(reply, CancelOk) else None

    def close(self) -> None:
        """Flush acks and stop iterating (the consumer stays attached until its connection ends)."""
        self.flush_acks()
        self._on_client_closed()

    def _on_client_closed(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def summarize(messages: Iterable[Message]) -> dict[str, Any]:
    """A small summary of a batch of messages (count, redelivered, bytes)."""
    items = list(messages)
    return {
        "count": len(items),
        "redelivered": sum(1 for m in items if m.redelivered),
        "bytes": sum(len(m.body) for m in items),
    }

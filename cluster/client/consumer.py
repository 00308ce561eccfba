"""Consumers: an iterator (or a callback thread) over deliveries, with settles batched.

`ack` is buffered and sent in batches (when `ack_batch` acks are waiting, before the consumer
blocks for more messages, and on `flush_acks`/`cancel`/close); `nack`, `reject`, `modify` and
`renew` are sent at once. Settles are asynchronous: a refused one is counted in
`settle_errors`, since the message it named comes back to some consumer anyway. The state lives
in `ClientProtocol`; this is the blocking face of it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Protocol, Unpack

from cluster.client import _views as views
from cluster.client._log import get_logger
from cluster.client._options import ConsumerOptions
from cluster.client._state import Buffered, ConsumerState
from cluster.client._threaded import ThreadedShell
from cluster.client._views import ConsumerView, Delivery, Modification
from cluster.client.errors import CommandRefused
from cluster.client.workpool_consumer import Processing, ProcessOptions
from fifo.codec import decode
from fifo.commands import Cancel, ConsumerKey, Remove
from fifo.replies import CancelOk, Error

log = get_logger("quorumq.client")


class Settles(Protocol):
    """What a message is settled through: its consumer (or the client, for a dequeue)."""

    def ack(self, messages: list[Message]) -> None: ...

    def nack(self, messages: list[Message], requeue: bool = True) -> None: ...

    def reject(self, messages: list[Message]) -> None: ...


@dataclass(frozen=True, slots=True)
class Message(Delivery):
    """One delivered message; settle it with `ack()`, `nack()`, `reject()` or the consumer."""

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


Pairs = list[tuple[ConsumerKey | None, int]]


def pairs_of(messages: Iterable[Message | int]) -> Pairs:
    """(consumer key, id) per message; None for a bare id (the consumer's current key)."""
    return [
        (item.consumer_key, item.msg_id) if isinstance(item, Message) else (None, item)
        for item in messages
    ]


class Consumer(ConsumerView):
    """A consumer of one queue, with prefetch (default) or AMQP 1.0 credit."""

    def __init__(
        self, client: ThreadedShell, queue: str, **options: Unpack[ConsumerOptions]
    ) -> None:
        self.client = client
        with client.lock:
            self.core_state: ConsumerState = client.core.add_consumer(queue, **options)
        self._thread: threading.Thread | None = None

    # --- the state, read-only ---------------------------------------------------------------

    @property
    def prefetch(self) -> int:
        """Unsettled messages it may hold (prefetch mode)."""
        return self.core_state.prefetch

    def set_prefetch(self, prefetch: int) -> None:
        """Change the prefetch: the same consumer checks out again and the queue updates it in
        place (credit = prefetch - checked out); a reconnect attaches with the new value."""
        if prefetch < 1:
            raise ValueError("prefetch must be at least 1")
        core, timeout = self.client.core, self.client.request_timeout_s
        with self.client.lock:
            self.core_state.prefetch = prefetch
        answer = self.client.request(
            lambda: core.attach(self.core_state, timeout, now=time.monotonic()), timeout, "checkout"
        )
        reply = decode(answer["reply"])
        if isinstance(reply, Error):
            raise CommandRefused(reply.code, reply.message)

    @property
    def credited(self) -> bool:
        """True in AMQP 1.0 credit mode."""
        return self.core_state.credited

    @property
    def priority(self) -> int:
        """Its consumer priority."""
        return self.core_state.priority

    @property
    def timeout_ms(self) -> int | None:
        """Its consumer timeout (None: the queue's)."""
        return self.core_state.timeout_ms

    @property
    def auto_ack(self) -> bool:
        """True when messages are acked as they are handed out."""
        return self.core_state.auto_ack

    @property
    def ack_batch(self) -> int:
        """Acks sent per batch."""
        return self.core_state.ack_batch

    # --- attach ---------------------------------------------------------------------------

    def start(self, on_message: Callable[[Message], None] | None = None) -> None:
        """Attach to the queue (waits for the checkout); with `on_message`, start a thread."""
        core, timeout = self.client.core, self.client.request_timeout_s
        try:
            answer = self.client.request(
                lambda: core.attach(self.core_state, timeout, now=time.monotonic()),
                timeout,
                "checkout",
            )
            reply = decode(answer["reply"])
            if isinstance(reply, Error):
                raise CommandRefused(reply.code, reply.message)
        except BaseException:
            with self.client.lock:
                core.remove_consumer(self.core_state)
            raise
        if on_message is not None:
            self._thread = threading.Thread(
                target=self._run_callback,
                args=(on_message,),
                name=f"qq-consumer-{self.tag}",
                daemon=True,
            )
            self._thread.start()

    # --- receiving ------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Message]:
        return self

    def __next__(self) -> Message:
        message = self.get(timeout_s=None)
        if message is None:
            raise StopIteration
        return message

    def messages(self, idle_timeout_s: float) -> Iterator[Message]:
        """The messages as they come, until none came for `idle_timeout_s` (the queue stayed
        empty) or the consumer was cancelled. Iterating the consumer itself waits forever.

        Example: `for message in client.consume("jobs").messages(idle_timeout_s=2.0): ...`
        """
        while (message := self.get(timeout_s=idle_timeout_s)) is not None:
            yield message

    def get(self, timeout_s: float | None = None) -> Message | None:
        """The next message, waiting up to `timeout_s` (None: until cancelled or closed)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        client, core, state = self.client, self.client.core, self.core_state
        while True:
            with client.lock:
                item = core.next_delivery(state)
            client.flush()
            if item is not None:
                return self.wrap(item)
            with client.changed:
                if state.buffer:
                    continue
                if state.finished:
                    return None
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return None
                client.changed.wait(1.0 if left is None else min(left, 1.0))

    def wrap(self, item: Buffered) -> Message:
        """A buffered delivery as a `Message` of this consumer."""
        return self._message(Message, item)

    def _run_callback(self, on_message: Callable[[Message], None]) -> None:
        while True:
            message = self.get(timeout_s=None)
            if message is None:
                return
            try:
                on_message(message)
            except Exception:  # a failing callback must not kill the consumer thread
                log.exception("consumer_callback_failed", queue=self.queue, msg_id=message.msg_id)

    def process(
        self,
        handler: Callable[[Message], object],
        **options: Unpack[ProcessOptions[Message]],
    ) -> Processing[Message]:
        """Run `handler(message)` on `workers` threads, in order per key, in parallel across
        keys; ack when it returns, nack (`on_error`: requeue | dead_letter) when it raises.
        `key` defaults to the message's group (no group: one shared key). `backlog` caps the
        messages waiting per key. Stop with `.stop(drain=...)`; see docs/workpool.md."""
        return Processing(self, handler, **options)

    # --- settling ---------------------------------------------------------------------------

    def ack(self, messages: Iterable[Message | int]) -> None:
        """Settle messages (batched: sent once `ack_batch` are waiting or on `flush_acks`)."""
        pairs = pairs_of(messages)
        with self.client.lock:
            self.client.core.ack(self.core_state, pairs)
        self.client.flush()

    def flush_acks(self) -> None:
        """Send every buffered ack now."""
        with self.client.lock:
            self.client.core.flush_acks(self.core_state)
        self.client.flush()

    def nack(self, messages: Iterable[Message | int], requeue: bool = True) -> None:
        """Return messages (`requeue`, no failed delivery) or reject them."""
        self._settle(messages, views.returning(self.queue, requeue))

    def reject(self, messages: Iterable[Message | int]) -> None:
        """Discard messages: a failed delivery; dead-lettered when the queue has a target."""
        self._settle(messages, views.discarding(self.queue))

    def modify(
        self,
        messages: Iterable[Message | int],
        **outcome: Unpack[Modification],
    ) -> None:
        """AMQP 1.0 modified outcome (machine v2): return or dead-letter with annotations."""
        self._settle(messages, views.modifying(self.queue, outcome))

    def renew(self, messages: Iterable[Message | int]) -> None:
        """Extend the consumer-timeout locks of checked-out messages (machine v2)."""
        self._settle(messages, views.renewing(self.queue))

    def grant(self, credit: int, drain: bool = False) -> None:
        """Credited mode: grant `credit` more deliveries (AMQP 1.0 flow)."""
        with self.client.lock:
            self.client.core.grant(self.core_state, credit, drain)
        self.client.flush()

    def _settle(self, messages: Iterable[Message | int], build: views.Build) -> None:
        pairs = pairs_of(messages)
        with self.client.lock:
            self.client.core.settle(self.core_state, pairs, build)
        self.client.flush()

    def wait_settled(self, timeout_s: float = 10.0) -> bool:
        """Flush acks and wait until every settle sent so far is answered; False on timeout."""
        self.flush_acks()
        state = self.core_state
        return self.client.wait_until(lambda: state.outstanding <= 0, time.monotonic() + timeout_s)

    def take_buffered(self) -> list[Message]:
        """Remove and return the messages received but not yet handed out (not acked)."""
        with self.client.lock:
            items = self.client.core.take_buffered(self.core_state)
        return [self.wrap(item) for item in items]

    # --- leaving ----------------------------------------------------------------------------

    def cancel(self) -> CancelOk | None:
        """Soft cancel: nothing new; pending messages can still be settled. A no-op (None) on a
        consumer already cancelled (by `process(...).stop()`, say)."""
        if self.core_state.cancelled:
            return None
        return self._leave(Cancel())

    def remove(self) -> CancelOk | None:
        """Hard cancel (machine v2): pending messages return to the queue at once."""
        return self._leave(Remove())

    def _leave(self, spec: Cancel | Remove) -> CancelOk | None:
        core, timeout = self.client.core, self.client.request_timeout_s
        answer = self.client.request(
            lambda: core.leave(self.core_state, spec, timeout, now=time.monotonic()),
            timeout,
            "cancel",
        )
        reply = decode(answer["reply"])
        if isinstance(reply, Error):
            raise CommandRefused(reply.code, reply.message)
        with self.client.changed:
            core.left(self.core_state)
            self.client.changed.notify_all()
        return reply if isinstance(reply, CancelOk) else None

    def close(self) -> None:
        """Flush acks and stop iterating (the consumer stays attached until its connection ends)."""
        with self.client.changed:
            self.client.core.close_consumer(self.core_state)
            self.client.changed.notify_all()
        self.client.flush()

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

"""pika's SelectConnection (its callback-style adapter), unchanged, driven one step at a time
for tests: each call issues one asynchronous method with its callback and runs the connection's
own IOLoop until that callback (or a broker close) fires. Nothing is blocking pika's way: the
frames, callbacks and confirms are SelectConnection's own."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pika
from pika.channel import Channel

STEP_TIMEOUT_S = 30.0  # a shared 2-core machine: generous, and a hang fails with a clear error
POLL_S = 0.01


@dataclass
class Delivery:
    """One basic.deliver (or get-ok) as SelectConnection's callback got it."""

    method: Any
    properties: Any
    body: bytes


@dataclass
class SelectSession:
    """One SelectConnection and one channel (confirms on when `confirms`), stepped by its
    IOLoop. `deliveries` collects every consumer's messages; `confirms` maps each publish's
    delivery tag to "ack" or "nack"."""

    params: Any
    confirms_on: bool = True
    deliveries: list[Delivery] = field(default_factory=list)
    confirms: dict[int, str] = field(default_factory=dict)
    published: int = 0
    closed_by: BaseException | None = None
    opened: bool = False

    def __post_init__(self) -> None:
        self.connection = pika.SelectConnection(
            self.params,
            on_open_callback=lambda _c: setattr(self, "opened", True),
            on_open_error_callback=lambda _c, error: setattr(self, "closed_by", error),
            on_close_callback=lambda _c, error: setattr(self, "closed_by", error),
        )
        self.run_until(lambda: self.opened, "the connection to open")
        opened: list[Channel] = []
        self.connection.channel(on_open_callback=opened.append)
        self.run_until(lambda: opened, "the channel to open")
        self.channel = opened[0]
        self.channel.add_on_close_callback(lambda _ch, error: setattr(self, "closed_by", error))
        if self.confirms_on:
            self.call(self.channel.confirm_delivery, self._confirmed)

    def run_until(self, done: Callable[[], object], what: str,
                  timeout_s: float = STEP_TIMEOUT_S, closing: bool = False) -> None:  # fmt: skip
        """Run the IOLoop until `done()` is truthy; a close (unless `closing`) or the timeout
        raises."""
        ioloop = self.connection.ioloop
        deadline = time.monotonic() + timeout_s

        def check() -> None:
            closed = self.closed_by is not None and not closing
            if done() or closed or time.monotonic() > deadline:
                ioloop.stop()
            else:
                ioloop.call_later(POLL_S, check)

        ioloop.call_later(0, check)
        ioloop.start()
        if not done():
            raise AssertionError(f"SelectConnection: no {what} ({self.closed_by!r})")

    def call(self, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """`method(*args, callback=..., **kwargs)`; the frame its callback got."""
        answers: list[Any] = []
        method(*args, callback=answers.append, **kwargs)
        self.run_until(lambda: answers, f"answer to {method.__name__}")
        return answers[0]

    def publish(self, exchange: str, routing_key: str, body: bytes,
                properties: Any = None) -> str:  # fmt: skip
        """basic.publish, then wait for its confirm: "ack" or "nack"."""
        self.channel.basic_publish(exchange, routing_key, body, properties)
        self.published += 1
        tag = self.published
        self.run_until(lambda: tag in self.confirms, f"confirm of publish {tag}")
        return self.confirms[tag]

    def consume(self, queue: str, **kwargs: Any) -> str:
        """basic.consume collecting into `deliveries`; the consumer tag."""
        frame = self.call(self.channel.basic_consume, queue, self._delivered, **kwargs)
        return str(frame.method.consumer_tag)

    def get(self, queue: str) -> Delivery | None:
        """One basic.get, auto-acked (None: get-empty)."""
        got: list[Delivery | None] = []

        def on_get(_ch: Any, method: Any, properties: Any, body: bytes) -> None:
            got.append(Delivery(method, properties, body))

        # get-empty has no callback in basic_get: listen for it (a stale listener of an
        # earlier get only appends to that get's list)
        self.channel.add_callback(lambda _frame: got.append(None), [pika.spec.Basic.GetEmpty])
        self.channel.basic_get(queue, on_get, auto_ack=True)
        self.run_until(lambda: got, f"basic.get of {queue}")
        return got[0]

    def wait_for_deliveries(self, count: int) -> list[Delivery]:
        """Run until `count` deliveries arrived in all; every one so far."""
        self.run_until(lambda: len(self.deliveries) >= count, f"{count} deliveries")
        return self.deliveries

    def close(self) -> None:
        """Close the connection (if open) and run the loop until it is closed."""
        if self.connection.is_open:
            self.connection.close()
        if not self.connection.is_closed:
            self.run_until(lambda: self.connection.is_closed, "the close", closing=True)

    def _confirmed(self, frame: Any) -> None:
        outcome = "ack" if isinstance(frame.method, pika.spec.Basic.Ack) else "nack"
        tag = frame.method.delivery_tag
        tags = range(1, tag + 1) if frame.method.multiple else (tag,)
        for each in tags:
            self.confirms.setdefault(each, outcome)

    def _delivered(self, _ch: Any, method: Any, properties: Any, body: bytes) -> None:
        self.deliveries.append(Delivery(method, properties, body))

"""A typed pika consumer callback for the AMQP tests (pika is untyped here)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

OnMessage = Callable[[Any, Any, Any, bytes], None]


def collecting(got: list[bytes]) -> OnMessage:
    """A `basic_consume` callback that appends each body to `got`, then acks the delivery."""

    def on_message(channel: Any, method: Any, _properties: Any, body: bytes) -> None:
        got.append(body)
        channel.basic_ack(method.delivery_tag)

    return on_message

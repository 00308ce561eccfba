"""queue.declare's arguments and flags as quorumq's `QueueConfig`, with RabbitMQ's refusals.

Pure: no I/O. Every argument quorumq knows maps to one config field; arguments it does not
support are refused with 540 naming them, never accepted and ignored (docs/amqp.md's table).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from cluster.amqp.errors import (
    ACCESS_REFUSED,
    PRECONDITION_FAILED,
    ChannelRefusal,
    not_implemented,
)
from fifo import limits as fifo_limits
from fifo.commands import GROUP_KEY_DEFAULT, GroupConfig, QueueConfig
from fifo.v4.exchanges import dead_letter_exchange, dead_letter_target

VHOST = "/"
QUORUM = "quorum"
INT_ARGUMENT_MAX = fifo_limits.length_max


def _int(name: str, value: Any, queue: str, low: int = 0) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise invalid_arg(name, queue, f"{{unacceptable_type,{value!r}}}")
    if not low <= value <= INT_ARGUMENT_MAX:
        raise invalid_arg(name, queue, f"{{value_out_of_range,{value!r}}}")
    return value


def _bool(name: str, value: Any, queue: str) -> bool:
    if not isinstance(value, bool):
        raise invalid_arg(name, queue, f"{{unacceptable_type,{value!r}}}")
    return value


def _overflow(name: str, value: Any, queue: str) -> str:
    if value == "reject-publish-dlx":
        raise not_implemented("x-overflow 'reject-publish-dlx' (quorum queues refuse it too)")
    if value not in ("drop-head", "reject-publish"):
        raise invalid_arg(name, queue, f"{{unacceptable_value,{value!r}}}")
    return str(value).replace("-", "_")


def invalid_arg(name: str, queue: str, why: str) -> ChannelRefusal:
    """RabbitMQ's 406 for an argument of the wrong type or range."""
    return ChannelRefusal(
        PRECONDITION_FAILED, f"invalid arg '{name}' for queue '{queue}' in vhost '{VHOST}': {why}"
    )


# argument -> (QueueConfig field, parser); the order is the order of the equivalence checks
FIELD_OF_ARGUMENT: dict[str, tuple[str, Callable[[str, Any, str], Any]]] = {
    "x-single-active-consumer": ("single_active_consumer", _bool),
    "x-delivery-limit": ("delivery_limit", _int),
    "x-max-length": ("max_length", _int),
    "x-max-length-bytes": ("max_bytes", _int),
    "x-overflow": ("overflow", _overflow),
    "x-message-ttl": ("message_ttl_ms", _int),
    "x-consumer-timeout": ("consumer_timeout_ms", lambda n, v, q: _int(n, v, q, low=1)),
    # quorumq's own: how long a consumer whose node is unreachable keeps its messages
    "x-quorumq-disconnected-timeout": (
        "disconnected_timeout_ms",
        lambda n, v, q: _int(n, v, q, low=1),
    ),
}
ARGUMENT_OF_FIELD = {field: name for name, (field, _parse) in FIELD_OF_ARGUMENT.items()}
ARGUMENT_OF_FIELD["dead_letter_queue"] = "x-dead-letter-routing-key"
# RabbitMQ arguments quorumq refuses, with the feature they name
REFUSED_ARGUMENTS = {
    "x-max-priority": "x-max-priority (priority queues)",
    "x-expires": "x-expires (queue expiry)",
    "x-queue-mode": "x-queue-mode (lazy classic queues)",
    "x-queue-master-locator": "x-queue-master-locator (classic mirrored queues)",
    "x-queue-leader-locator": "x-queue-leader-locator (every node holds every queue)",
    "x-quorum-initial-group-size": "x-quorum-initial-group-size (every node holds every queue)",
    "x-quorum-target-group-size": "x-quorum-target-group-size (every node holds every queue)",
    "x-max-age": "x-max-age (streams)",
    "x-stream-max-segment-size-bytes": "x-stream-max-segment-size-bytes (streams)",
    "x-delivery-limit-strategy": "x-delivery-limit-strategy",
}
DEAD_LETTER_STRATEGIES = ("at-most-once", "at-least-once")
# message groups (machine v3): a queue declared with any of these is a grouped queue
GROUP_ARGUMENTS = (
    "x-quorumq-group-key",
    "x-quorumq-group-policy",
    "x-quorumq-rebalance-groups-on-join",
)
GROUP_POLICIES = ("sequenced", "exclusive")


def group_config(queue: str, arguments: dict[str, Any]) -> GroupConfig | None:
    """The message-group config the x-quorumq-group-* arguments ask for (popped from
    `arguments`), None when there is none."""
    given = {name: arguments.pop(name) for name in GROUP_ARGUMENTS if name in arguments}
    if not given:
        return None
    key = given.get("x-quorumq-group-key", GROUP_KEY_DEFAULT)
    if not isinstance(key, str) or not 0 < len(key.encode("utf-8")) <= 255:
        raise invalid_arg("x-quorumq-group-key", queue, f"{{unacceptable_value,{key!r}}}")
    policy = given.get("x-quorumq-group-policy", "sequenced")
    if policy not in GROUP_POLICIES:
        raise invalid_arg("x-quorumq-group-policy", queue, f"{{unacceptable_value,{policy!r}}}")
    rebalance = _bool(
        "x-quorumq-rebalance-groups-on-join",
        given.get("x-quorumq-rebalance-groups-on-join", False),
        queue,
    )
    return GroupConfig(key, policy, rebalance)


def check_flags(queue: str, durable: bool, exclusive: bool, auto_delete: bool, typed: bool) -> None:
    """Refuse what a quorum queue cannot be: exclusive, auto-delete (and non-durable when the
    client asked for a quorum queue by name; untyped, durable is simply kept), and a name the
    client chose in the reserved `amq.` prefix (`queue` is "" for a server-named queue)."""
    if queue.startswith("amq."):
        raise ChannelRefusal(
            ACCESS_REFUSED, f"queue name '{queue}' contains reserved prefix 'amq.*'"
        )
    for flag, name in ((not durable, "non-durable"), (exclusive, "exclusive"),
                       (auto_delete, "auto-delete")):  # fmt: skip
        if not flag or (name == "non-durable" and not typed):
            continue
        if typed:
            raise ChannelRefusal(
                PRECONDITION_FAILED,
                f"invalid property '{name}' for queue '{queue or 'amq.gen'}' in vhost '/'",
            )
        raise not_implemented(f"an {name} queue (every quorumq queue is a durable quorum queue)")


def queue_config(queue: str, arguments: Mapping[str, Any] | None) -> QueueConfig:
    """The config that queue.declare's `arguments` ask for (refusals raised as AMQP errors)."""
    arguments = dict(arguments or {})
    queue_type = arguments.pop("x-queue-type", QUORUM)
    if queue_type != QUORUM:
        raise not_implemented(f"x-queue-type '{queue_type}' (only quorum queues)")
    values: dict[str, Any] = {}
    dead_letter = _dead_letter_queue(queue, arguments)
    if dead_letter is not None:
        values["dead_letter_queue"] = dead_letter
    for name, value in arguments.items():
        if name in REFUSED_ARGUMENTS:
            raise not_implemented(REFUSED_ARGUMENTS[name])
        if name not in FIELD_OF_ARGUMENT:
            raise not_implemented(f"queue argument '{name}'")
        field, parse = FIELD_OF_ARGUMENT[name]
        values[field] = parse(name, value, queue)
    return QueueConfig(**values)


def _dead_letter_queue(queue: str, arguments: dict[str, Any]) -> str | None:
    """x-dead-letter-exchange "" with x-dead-letter-routing-key: the target queue's name."""
    exchange = arguments.pop("x-dead-letter-exchange", None)
    routing_key = arguments.pop("x-dead-letter-routing-key", None)
    strategy = arguments.pop("x-dead-letter-strategy", None)
    if strategy is not None and strategy not in DEAD_LETTER_STRATEGIES:
        raise invalid_arg("x-dead-letter-strategy", queue, f"{{unacceptable_value,{strategy!r}}}")
    if exchange is None:
        if routing_key is not None:
            raise ChannelRefusal(
                PRECONDITION_FAILED,
                "Key x-dead-letter-routing-key should be specified together with "
                "x-dead-letter-exchange",
            )
        return None
    if not isinstance(exchange, str) or not isinstance(routing_key, str | None):
        raise invalid_arg("x-dead-letter-exchange", queue, "{unacceptable_type}")
    if not routing_key:
        raise not_implemented(
            f"x-dead-letter-exchange '{exchange}' without x-dead-letter-routing-key "
            "(dead-lettering by each message's own routing keys)"
        )
    if exchange == "":
        return routing_key
    target = dead_letter_target(exchange, routing_key)
    if len(target.encode("utf-8")) > fifo_limits.queue_name_bytes_max:
        raise invalid_arg("x-dead-letter-exchange", queue, "{exchange and routing key too long}")
    return target


def dead_letter_exchange_of(config: QueueConfig) -> str | None:
    """The named exchange `config` dead-letters through (machine v4), or None."""
    target = config.dead_letter_queue
    through = None if target is None else dead_letter_exchange(target)
    return None if through is None else through[0]


def inequivalence(queue: str, asked: QueueConfig, current: QueueConfig) -> ChannelRefusal | None:
    """RabbitMQ's 406 naming the first argument where `asked` differs from `current`, or None."""
    for field in dataclasses.fields(QueueConfig):
        want, have = getattr(asked, field.name), getattr(current, field.name)
        if want != have:
            name = ARGUMENT_OF_FIELD.get(field.name, field.name)
            return ChannelRefusal(
                PRECONDITION_FAILED,
                f"inequivalent arg '{name}' for queue '{queue}' in vhost '{VHOST}': "
                f"received {_shown(want)} but current is {_shown(have)}",
            )
    return None


def _shown(value: Any) -> str:
    through = dead_letter_exchange(value) if isinstance(value, str) else None
    if through is not None:
        return f"the exchange '{through[0]}' with routing key '{through[1]}'"
    return "none" if value is None else f"the value '{value}'"

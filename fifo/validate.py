"""Input validation shared by every machine version: each check returns an error text or None.

Validation runs before any mutation, so an Error reply leaves the state unchanged.
"""

from __future__ import annotations

from fifo import limits
from fifo.commands import ConnectionId, ConsumerId, QueueConfig


def is_bool(value: object) -> bool:
    """True for a real bool (commands arrive from the wire; hints are not checks)."""
    return type(value) is bool


def one_of(value: object, choices: tuple[str, ...]) -> bool:
    """True if `value` is a str among `choices`."""
    return type(value) is str and value in choices


def int_in(value: object, low: int, high: int) -> bool:
    """True if `value` is a plain int (not a bool) within [low, high]."""
    return type(value) is int and low <= value <= high


def opt_int_in(value: object, low: int, high: int) -> bool:
    """True if `value` is None or a plain int within [low, high]."""
    return value is None or (type(value) is int and low <= value <= high)


def name_error(value: object, what: str, bytes_max: int) -> str | None:
    """Check a non-empty name of at most `bytes_max` UTF-8 bytes."""
    if type(value) is not str:
        return f"{what} must be a str"
    if not value or len(value.encode("utf-8", "surrogatepass")) > bytes_max:
        return f"{what} must have 1..{bytes_max} bytes"
    return None


def connection_error(value: object) -> str | None:
    """Check a ConnectionId and its fields."""
    if type(value) is not ConnectionId:
        return "connection must be a ConnectionId"
    err = name_error(value.node, "node", limits.node_name_bytes_max)
    if err:
        return err
    if not int_in(value.incarnation, 0, limits.int_field_max):
        return "connection.incarnation must be an int >= 0"
    if not int_in(value.number, 0, limits.int_field_max):
        return "connection.number must be an int >= 0"
    return None


def consumer_id_error(value: object) -> str | None:
    """Check a ConsumerId (tag and connection)."""
    if type(value) is not ConsumerId:
        return "consumer must be a ConsumerId"
    return name_error(value.tag, "consumer tag", limits.consumer_tag_bytes_max) or (
        connection_error(value.connection)
    )


def key_error(value: object) -> str | None:
    """Check a consumer key: an int index or a ConsumerId."""
    if type(value) is int:
        return None if value >= 0 else "consumer key must be >= 0"
    return consumer_id_error(value)


def msg_ids_error(value: object) -> str | None:
    """Check a tuple of message ids."""
    if type(value) is not tuple:
        return "msg_ids must be a tuple of int"
    if len(value) > limits.msg_ids_per_command_max:
        return f"at most {limits.msg_ids_per_command_max} msg_ids per command"
    for i in value:
        if type(i) is not int or i < 0 or i > limits.int_field_max:
            return "msg_ids must be ints >= 0"
    return None


def annotations_error(value: object) -> str | None:
    """Check modify annotations: pairs of (str, str | int)."""
    if type(value) is not tuple or len(value) > limits.annotations_per_message_max:
        return f"annotations must be a tuple of at most {limits.annotations_per_message_max} pairs"
    for pair in value:
        if type(pair) is not tuple or len(pair) != 2:
            return "annotations must be (key, value) pairs"
        k, v = pair
        if name_error(k, "annotation key", limits.annotation_bytes_max):
            return "annotation keys must be non-empty short str"
        if type(v) is str:
            if len(v.encode("utf-8", "surrogatepass")) > limits.annotation_bytes_max:
                return "annotation value too long"
        elif not int_in(v, -limits.int_field_max, limits.int_field_max):
            return "annotation values must be str or int"
    return None


def config_error(config: object, queue: str) -> str | None:
    """Check a QueueConfig; the dead-letter target must be another queue."""
    if type(config) is not QueueConfig:
        return "config must be a QueueConfig"
    cfg = config
    if not is_bool(cfg.single_active_consumer):
        return "single_active_consumer must be a bool"
    checks = (
        (opt_int_in(cfg.delivery_limit, 0, limits.int_field_max), "delivery_limit"),
        (opt_int_in(cfg.max_length, 0, limits.length_max), "max_length"),
        (opt_int_in(cfg.max_bytes, 0, limits.length_max), "max_bytes"),
        (opt_int_in(cfg.message_ttl_ms, 0, limits.ttl_ms_max), "message_ttl_ms"),
        (int_in(cfg.consumer_timeout_ms, 1, limits.timeout_ms_max), "consumer_timeout_ms"),
        (int_in(cfg.disconnected_timeout_ms, 0, limits.timeout_ms_max), "disconnected_timeout_ms"),
    )
    for ok, what in checks:
        if not ok:
            return f"{what} out of range"
    if not one_of(cfg.overflow, ("drop_head", "reject_publish")):
        return "overflow must be drop_head or reject_publish"
    if cfg.dead_letter_queue is not None:
        err = name_error(cfg.dead_letter_queue, "dead_letter_queue", limits.queue_name_bytes_max)
        if err:
            return err
        if cfg.dead_letter_queue == queue:
            return "a queue cannot dead-letter into itself"
    return None

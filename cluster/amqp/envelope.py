"""How an AMQP message's properties travel with its body through the replicated queue.

A message published without properties (or with only `delivery_mode`: every quorumq message is
persistent) is stored as its bare body, so the native client reads exactly what was published.
Any other message is stored as MAGIC, the 2-byte length of its encoded properties (the
content-header property bytes, as the publisher sent them), the properties, then the body;
`split` gives both back (the native client calls it to read such a message).

A message published through a named exchange (machine v4) is always wrapped, as ROUTED_MAGIC,
the properties' length and bytes, then the exchange and the routing key (one length byte each)
before the body, so its deliveries name them as RabbitMQ's do (`unwrap`).
"""

from __future__ import annotations

import struct

from pamqp import commands
from pamqp.header import ContentHeader

MAGIC = b"\xffQQAMQP\x01"
ROUTED_MAGIC = b"\xffQQAMQP\x02"
MAGIC_PREFIX = MAGIC[:-1]  # what both start with: a bare body starting so is wrapped
_LENGTH = struct.Struct(">H")
HEADER_BYTES = len(MAGIC) + _LENGTH.size
Route = tuple[str, str]  # (exchange, routing key) a message was published with
PROPERTIES_BYTES_MAX = 0xFFFF
DELIVERY_MODE_PERSISTENT = 2
# the content header's property flags of "delivery_mode alone" and of "no property"
_DELIVERY_MODE_ONLY = commands.Basic.Properties.flags["delivery_mode"]


def wrap(properties: bytes, body: bytes, route: Route | None = None) -> bytes:
    """What the queue stores for a message with encoded `properties` (flags first) and `body`,
    published through `route` (None: the default exchange)."""
    if route is None and _plain(properties) and not body.startswith(MAGIC_PREFIX):
        return body
    if len(properties) > PROPERTIES_BYTES_MAX:
        raise ValueError(f"properties of {len(properties)} bytes: at most {PROPERTIES_BYTES_MAX}")
    if route is None:
        return b"".join((MAGIC, _LENGTH.pack(len(properties)), properties, body))
    exchange, key = (part.encode("utf-8") for part in route)  # shortstrs: at most 255 bytes
    return b"".join((ROUTED_MAGIC, _LENGTH.pack(len(properties)), properties,
                     bytes([len(exchange)]), exchange, bytes([len(key)]), key, body))  # fmt: skip


def _plain(properties: bytes) -> bool:
    """No property, or delivery_mode 2 alone (the default of a stored message)."""
    if len(properties) < 2:
        return True
    flags = _LENGTH.unpack_from(properties)[0]
    if flags == 0:
        return True
    return flags == _DELIVERY_MODE_ONLY and properties[2:] == bytes([DELIVERY_MODE_PERSISTENT])


def split(stored: bytes) -> tuple[bytes | None, bytes]:
    """(encoded properties or None, body) of a stored message; a body that does not hold a
    well-formed envelope is a bare body (published by the native client)."""
    properties, body, _route = unwrap(stored)
    return properties, body


def unwrap(stored: bytes) -> tuple[bytes | None, bytes, Route | None]:
    """(encoded properties or None, body, route or None) of a stored message (`split`)."""
    if not stored.startswith(MAGIC_PREFIX) or len(stored) < HEADER_BYTES:
        return None, stored, None
    routed = stored.startswith(ROUTED_MAGIC)
    if not routed and not stored.startswith(MAGIC):
        return None, stored, None
    end = HEADER_BYTES + _LENGTH.unpack_from(stored, len(MAGIC))[0]
    if end > len(stored):
        return None, stored, None
    properties = stored[HEADER_BYTES:end]
    if not routed:
        return properties, stored[end:], None
    exchange, end = _shortstr(stored, end)
    key, end = _shortstr(stored, end)
    if exchange is None or key is None:
        return None, stored, None
    return properties, stored[end:], (exchange, key)


def _shortstr(stored: bytes, at: int) -> tuple[str | None, int]:
    """The length-prefixed UTF-8 text at `at` and where it ends (None: not well formed)."""
    if at >= len(stored) or at + 1 + stored[at] > len(stored):
        return None, at
    end = at + 1 + stored[at]
    try:
        return stored[at + 1 : end].decode("utf-8"), end
    except UnicodeDecodeError:
        return None, at


def properties_of(encoded: bytes | None) -> commands.Basic.Properties:
    """The decoded properties (delivery_mode 2 when the message was stored bare)."""
    if encoded is None:
        return commands.Basic.Properties(delivery_mode=DELIVERY_MODE_PERSISTENT)
    header = ContentHeader()
    header.unmarshal(b"\x00\x3c\x00\x00" + bytes(8) + encoded)
    return header.properties

"""How an AMQP message's properties travel with its body through the replicated queue.

A message published without properties (or with only `delivery_mode`: every quorumq message is
persistent) is stored as its bare body, so the native client reads exactly what was published.
Any other message is stored as MAGIC, the 2-byte length of its encoded properties (the
content-header property bytes, as the publisher sent them), the properties, then the body;
`split` gives both back (the native client calls it to read such a message).
"""

from __future__ import annotations

import struct

from pamqp import commands
from pamqp.header import ContentHeader

MAGIC = b"\xffQQAMQP\x01"
_LENGTH = struct.Struct(">H")
HEADER_BYTES = len(MAGIC) + _LENGTH.size
PROPERTIES_BYTES_MAX = 0xFFFF
DELIVERY_MODE_PERSISTENT = 2
# the content header's property flags of "delivery_mode alone" and of "no property"
_DELIVERY_MODE_ONLY = commands.Basic.Properties.flags["delivery_mode"]


def wrap(properties: bytes, body: bytes) -> bytes:
    """What the queue stores for a message with encoded `properties` (flags first) and `body`."""
    if _plain(properties) and not body.startswith(MAGIC):
        return body
    if len(properties) > PROPERTIES_BYTES_MAX:
        raise ValueError(f"properties of {len(properties)} bytes: at most {PROPERTIES_BYTES_MAX}")
    return b"".join((MAGIC, _LENGTH.pack(len(properties)), properties, body))


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
    if not stored.startswith(MAGIC) or len(stored) < HEADER_BYTES:
        return None, stored
    length = _LENGTH.unpack_from(stored, len(MAGIC))[0]
    end = HEADER_BYTES + length
    if end > len(stored):
        return None, stored
    return stored[HEADER_BYTES:end], stored[end:]


def properties_of(encoded: bytes | None) -> commands.Basic.Properties:
    """The decoded properties (delivery_mode 2 when the message was stored bare)."""
    if encoded is None:
        return commands.Basic.Properties(delivery_mode=DELIVERY_MODE_PERSISTENT)
    header = ContentHeader()
    header.unmarshal(b"\x00\x3c\x00\x00" + bytes(8) + encoded)
    return header.properties

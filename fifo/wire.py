"""The hot paths of the wire, all derived from the codec's schemas (the one place for them).

- `encode_command`, `decode_command`, `encode_effect`: the codec itself, whose single pass over
  cbor2's C code is the fast path (raft, the node and the client call these).
- `fields_encoder(cls)`: the bytes of `cls(*fields)` without building the object (publishing).
- `field_splicer(cls, field)`: put an encoded value in place of a None field of an encoded
  object, when only plain fields follow it (the node binds a client's Enqueue to its connection
  without decoding and re-encoding it).
- `constructor(cls)`: `cls(*fields)` without the frozen dataclass `__init__` (effects built per
  delivered message).
Each is checked byte-for-byte against the generic encoder in tests/fifo/test_wire.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import cbor2

from fifo.codec import CODEC, constructor, encode, schema

encode_command: Callable[[object], bytes] = encode
encode_effect: Callable[[object], bytes] = encode
decode_command: Callable[[bytes], Any] = CODEC.decode
__all__ = [
    "constructor",
    "decode_command",
    "encode_command",
    "encode_effect",
    "field_splicer",
    "fields_encoder",
]


def fields_encoder(cls: type) -> Callable[..., bytes]:
    """`encode(cls(*fields))` for all of a class's fields, given positionally."""
    tagged = schema(cls)
    tag, width = tagged.tag, len(tagged.fields)
    deep = tuple(i for i, f in enumerate(tagged.fields) if f.deep)
    tree = CODEC.tree

    def encode_fields(*fields: Any) -> bytes:
        if len(fields) != width:
            raise TypeError(f"{cls.__name__} has {width} fields, got {len(fields)}")
        values = list(fields)
        for position in deep:
            values[position] = tree(values[position])
        return bytes(cbor2.dumps(cbor2.CBORTag(tag, values), canonical=True))

    return encode_fields


def field_splicer(cls: type, field: str) -> Callable[[bytes, Any, bytes], bytes | None]:
    """splice(blob, value, field_blob): `blob` (= encode(value), whose `field` is None) with
    `field_blob` in that field's place; None when the value does not allow it.

    CBOR array items are concatenated, so only the field and the plain fields after it are
    rewritten. Allowed only when the fields after `field` cannot hold tagged values.
    """
    names = [f.name for f in schema(cls).fields]
    after = schema(cls).fields[names.index(field) + 1 :]
    if any(f.deep for f in after):
        raise ValueError(f"{cls.__name__}.{field}: tagged fields follow it, cannot splice")
    trailing = tuple(f.name for f in after)

    def splice(blob: bytes, value: Any, field_blob: bytes) -> bytes | None:
        if type(value) is not cls or getattr(value, field) is not None:
            return None
        try:
            tail = b"".join(cbor2.dumps(getattr(value, n), canonical=True) for n in trailing)
        except Exception:  # an unencodable trailing value: let the caller re-encode
            return None
        if not blob.endswith(b"\xf6" + tail):
            return None
        return blob[: len(blob) - len(tail) - 1] + field_blob + tail

    return splice

"""Query results as JSON values: dataclasses to maps, bytes to text (or base64), bounded."""

from __future__ import annotations

import base64
from typing import Any

from cluster.node.queries import plain

BODY_PREVIEW_BYTES_MAX = 4096


def body_json(body: bytes) -> dict[str, Any]:
    """A message body for JSON: UTF-8 text when it is, else base64; the first
    BODY_PREVIEW_BYTES_MAX bytes, with its full size."""
    head = body[:BODY_PREVIEW_BYTES_MAX]
    out: dict[str, Any] = {"bytes": len(body), "truncated": len(body) > len(head)}
    try:
        out["text"] = head.decode("utf-8")
    except UnicodeDecodeError:
        out["base64"] = base64.b64encode(head).decode("ascii")
    return out


def to_json(value: Any) -> Any:
    """`value` (dataclasses, tuples, bytes...) as plain JSON values."""
    return _fix(plain(value))


def _fix(value: Any) -> Any:
    if isinstance(value, dict):
        if value.get("type") == "ConnectionId":
            return f"{value['node']}/{value['incarnation']}/{value['number']}"
        if value.get("type") == "ConsumerId":
            return f"{value['tag']}@{_fix(value['connection'])}"
        return {key: _fix(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_fix(item) for item in value]
    if isinstance(value, (bytes, bytearray)):
        return body_json(bytes(value))
    return value

"""The body of a raft transport frame: pysyncobj's message dicts, compactly.

The first byte says how the rest is laid out:

- 1: `append_entries` with exactly the keys type, term, commit_index, entries, prevLogIdx,
  prevLogTerm: term, commit_index, prevLogIdx, prevLogTerm (u64 each, big-endian), n (u32),
  then n x (index u64, term u64, length u32, command bytes);
- 2: `next_node_idx` (the follower's ack): next_node_idx u64, success u8, reset u8;
- 0: CBOR, for anything else (votes, snapshot chunks, forwarded commands, ...).

The two hand layouts are the messages of the replication hot path (one of each per follower per
entry); CBOR handles the rest. A message the fast layouts cannot hold exactly (a value out of
range, a non-bytes command) falls back to CBOR. Decoding gives what pysyncobj sent, except that
tuples come back as lists from CBOR and entries come back as tuples from kind 1 (pysyncobj only
indexes and unpacks them). Nothing here builds objects: no pickle on the wire.
"""

from __future__ import annotations

import struct
from typing import Any

import cbor2

KIND_CBOR, KIND_APPEND, KIND_ACK = 0, 1, 2
_APPEND = struct.Struct(">BQQQQI")
_ENTRY = struct.Struct(">QQI")
_ACK = struct.Struct(">BQ??")
_APPEND_KEYS = frozenset({"type", "term", "commit_index", "entries", "prevLogIdx", "prevLogTerm"})
_ACK_KEYS = frozenset({"type", "next_node_idx", "success", "reset"})


class CodecError(ValueError):
    """A frame body that does not decode."""


def encode(message: Any) -> bytes:
    """The frame body for a pysyncobj message."""
    if type(message) is dict:
        kind = message.get("type")
        try:
            if kind == "append_entries" and message.keys() == _APPEND_KEYS:
                return _encode_append(message)
            if (
                kind == "next_node_idx"
                and message.keys() == _ACK_KEYS
                and type(message["success"]) is bool
                and type(message["reset"]) is bool
            ):
                return _ACK.pack(
                    KIND_ACK, message["next_node_idx"], message["success"], message["reset"]
                )
        except (struct.error, TypeError):
            pass  # out of range or an unexpected type: CBOR says it exactly
    return b"\0" + cbor2.dumps(message)


def _encode_append(message: dict[str, Any]) -> bytes:
    entries = message["entries"]
    parts = [
        _APPEND.pack(
            KIND_APPEND,
            message["term"],
            message["commit_index"],
            message["prevLogIdx"],
            message["prevLogTerm"],
            len(entries),
        )
    ]
    pack = _ENTRY.pack
    for command, index, term in entries:
        if type(command) is not bytes:
            raise TypeError("command is not bytes")
        parts.append(pack(index, term, len(command)))
        parts.append(command)
    return b"".join(parts)


def decode(body: bytes) -> Any:
    """The pysyncobj message in a frame body (CodecError if it does not decode)."""
    if not body:
        raise CodecError("empty frame")
    kind = body[0]
    try:
        if kind == KIND_APPEND:
            return _decode_append(body)
        if kind == KIND_ACK:
            if len(body) != _ACK.size:
                raise CodecError(f"ack of {len(body)} bytes")
            _kind, next_index, success, reset = _ACK.unpack(body)
            return {
                "type": "next_node_idx",
                "next_node_idx": next_index,
                "success": success,
                "reset": reset,
            }
        if kind == KIND_CBOR:
            return cbor2.loads(body[1:])
    except CodecError:
        raise
    except Exception as err:  # struct.error, CBORDecodeError, ...
        raise CodecError(str(err)[:200]) from err
    raise CodecError(f"unknown kind {kind}")


def _decode_append(body: bytes) -> dict[str, Any]:
    _kind, term, commit, prev_index, prev_term, count = _APPEND.unpack_from(body)
    offset = _APPEND.size
    entries = []
    unpack = _ENTRY.unpack_from
    size = _ENTRY.size
    for _ in range(count):
        index, entry_term, length = unpack(body, offset)
        offset += size
        end = offset + length
        if end > len(body):
            raise CodecError("entry beyond the frame")
        entries.append((body[offset:end], index, entry_term))
        offset = end
    if offset != len(body):
        raise CodecError("trailing bytes after the entries")
    return {
        "type": "append_entries",
        "term": term,
        "commit_index": commit,
        "entries": entries,
        "prevLogIdx": prev_index,
        "prevLogTerm": prev_term,
    }

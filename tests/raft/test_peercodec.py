"""raft.peercodec: pysyncobj's messages survive the frame body; raft.transport.FrameMac is HMAC."""

from __future__ import annotations

import hmac
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raft import peercodec
from raft.transport import SEQ, TAG_BYTES, FrameMac

u64 = st.integers(min_value=0, max_value=2**64 - 1)
entries = st.lists(st.tuples(st.binary(max_size=300), u64, u64), max_size=5)


@settings(max_examples=200, deadline=None)
@given(term=u64, commit=u64, prev=u64, prev_term=u64, entries=entries)
def test_append_entries_round_trip_through_the_hand_layout(
    term: int, commit: int, prev: int, prev_term: int, entries: list[tuple[bytes, int, int]]
) -> None:
    message = {
        "type": "append_entries",
        "term": term,
        "commit_index": commit,
        "entries": entries,
        "prevLogIdx": prev,
        "prevLogTerm": prev_term,
    }
    body = peercodec.encode(message)
    assert body[0] == peercodec.KIND_APPEND
    assert peercodec.decode(body) == message


@given(index=u64, success=st.booleans(), reset=st.booleans())
def test_acks_round_trip_through_the_hand_layout(index: int, success: bool, reset: bool) -> None:
    message = {"type": "next_node_idx", "next_node_idx": index, "success": success, "reset": reset}
    body = peercodec.encode(message)
    assert body[0] == peercodec.KIND_ACK and len(body) == 11
    assert peercodec.decode(body) == message


@pytest.mark.parametrize(
    "message",
    [
        {"type": "request_vote", "term": 3, "last_log_index": 10, "last_log_term": 2},
        {"type": "next_node_idx", "next_node_idx": 2**64, "success": True, "reset": False},
        {"type": "next_node_idx", "next_node_idx": 5, "success": 1, "reset": False},
        {"type": "append_entries", "term": 1, "commit_index": 1, "serialized": [b"x", True, False]},
        {
            "type": "append_entries",
            "term": -1,
            "commit_index": 1,
            "entries": [],
            "prevLogIdx": 0,
            "prevLogTerm": 0,
        },
        {
            "type": "append_entries",
            "term": 1,
            "commit_index": 1,
            "entries": [["str", 1, 1]],
            "prevLogIdx": 0,
            "prevLogTerm": 0,
        },
        {"type": "apply_command", "command": b"\x01abc", "request_id": 7},
        "127.0.0.1:9000",
    ],
)
def test_everything_else_goes_as_cbor_and_comes_back_equal(message: object) -> None:
    body = peercodec.encode(message)
    assert body[0] == peercodec.KIND_CBOR
    assert peercodec.decode(body) == message


@pytest.mark.parametrize(
    "body",
    [b"", b"\x07", b"\x02\x00", b"\x01" + b"\x00" * 36 + b"\x00\x00\x00\x01", b"\x00\xff\xff"],
)
def test_bodies_that_do_not_decode_raise_codec_error(body: bytes) -> None:
    with pytest.raises(peercodec.CodecError):
        peercodec.decode(body)


def test_frame_mac_is_truncated_hmac_sha256() -> None:
    key = os.urandom(32)
    mac = FrameMac(key)
    for seq, body in ((0, b""), (1, b"x" * 100), (2**40, os.urandom(5000))):
        expected = hmac.digest(key, SEQ.pack(seq) + body, "sha256")[:TAG_BYTES]
        assert mac.tag(seq, body) == expected

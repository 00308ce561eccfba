"""The client's fast wire paths equal the generic encoders and decoders byte for byte.

`PublishFrames` builds a publish frame from pre-encoded CBOR items; `split_answers` hands an
`Ok` reply frame over as its request id. Both must be indistinguishable from the generic paths.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from cluster import protocol
from cluster.client._wire import OK_BYTES, PublishFrames, split_answers, split_frames
from cluster.errors import ProtocolError
from fifo.codec import decode, encode
from fifo.commands import ConnectionId, Enqueue
from fifo.replies import Error, Ok

texts = st.text(max_size=40)
uints = st.integers(min_value=0, max_value=2**64 - 1)
ttls = st.none() | st.integers(min_value=0, max_value=2**63)
connections = st.none() | st.builds(
    lambda node, incarnation, number: encode(ConnectionId(node, incarnation, number)),
    texts,
    uints,
    uints,
)


@given(texts, texts, ttls, connections, uints, st.binary(max_size=300), uints)
def test_publish_frames_equal_the_generic_encoding(
    queue: str,
    enqueuer: str,
    ttl_ms: int | None,
    connection: bytes | None,
    request_id: int,
    body: bytes,
    seq: int,
) -> None:
    frames = PublishFrames(queue, enqueuer, ttl_ms, connection)
    assert frames.matches()
    built = frames.frame(request_id, body, seq)
    assert built == frames.generic(request_id, body, seq)
    (frame,), rest = split_frames(built, protocol.FRAME_BYTES_MAX_DEFAULT)
    bound = None if connection is None else decode(connection)
    assert rest == b""
    assert frame["id"] == request_id
    assert decode(frame["cmd"]) == Enqueue(queue, body, enqueuer, seq, bound, ttl_ms)


def test_a_publish_frame_over_the_limit_is_refused_like_the_generic_one() -> None:
    frames = PublishFrames("q", "e", None, None)
    try:
        frames.frame(1, b"x" * 200, 1, frame_bytes_max=100)
    except ProtocolError as err:
        assert err.code == protocol.FRAME_TOO_LARGE
    else:
        raise AssertionError("a frame over the limit was built")


def answers_as_frames(answers: list[Any]) -> list[dict[str, Any]]:
    return [protocol.reply(a, OK_BYTES) if isinstance(a, int) else a for a in answers]


frames_sent_by_a_node = st.lists(
    st.one_of(
        st.builds(lambda i: protocol.reply(i, OK_BYTES), uints),
        st.builds(lambda i: protocol.reply(i, encode(Error("unknown_queue", "refused"))), uints),
        st.builds(lambda i, m: protocol.error(protocol.UNAVAILABLE, m, i), uints, texts),
        st.builds(lambda b: protocol.effect(b), st.binary(max_size=50)),
        st.builds(lambda i: protocol.result(i, {"reply": OK_BYTES}), uints),
    ),
    max_size=20,
)


@given(frames_sent_by_a_node, st.integers(min_value=0, max_value=40))
def test_split_answers_is_split_frames_with_ok_replies_as_their_ids(
    frames: list[dict[str, Any]], cut: int
) -> None:
    data = b"".join(protocol.encode_frame(frame) for frame in frames)
    answers, rest = split_answers(data, protocol.FRAME_BYTES_MAX_DEFAULT)
    assert rest == b""
    assert answers_as_frames(answers) == frames
    ids = [a for a in answers if isinstance(a, int)]
    assert ids == [f["id"] for f in frames if f.get("reply") == OK_BYTES]
    # a cut anywhere leaves the unfinished frame for later, as split_frames does
    head = data[: max(0, len(data) - cut)]
    answers, rest = split_answers(head, protocol.FRAME_BYTES_MAX_DEFAULT)
    expected, expected_rest = split_frames(head, protocol.FRAME_BYTES_MAX_DEFAULT)
    assert (answers_as_frames(answers), rest) == (expected, expected_rest)


def test_ok_is_the_reply_the_fast_path_recognises() -> None:
    assert decode(OK_BYTES) == Ok()

"""`ClientProtocol` on its own: bytes and calls in, bytes and events out; no socket, no thread.

Each test plays the node by hand with the real wire format (`cluster.protocol`, `fifo` codec).
"""

from __future__ import annotations

from typing import Any

import pytest

from cluster import protocol
from cluster.client import ClientProtocol, RequestTimeout, Unavailable
from cluster.client._wire import Handshake, Welcome, split_frames
from cluster.client.errors import AuthError, CommandRefused
from cluster.client.sansio import (
    RETRY_DELAY_S,
    SCAN_S,
    TICK_S,
    UNCERTAIN,
    Answered,
    CloseConnection,
    ConsumerUpdated,
    Failed,
    PublisherUpdated,
    ReconnectNeeded,
)
from fifo.codec import decode, encode
from fifo.commands import AnnotatedEnqueue, Checkout, ConnectionId, ConsumerId, Enqueue, Settle
from fifo.effects import Deliver, Delivery, QueueStatus
from fifo.replies import CheckoutOk, Error, NotEnqueued, Ok

A, B = "127.0.0.1:1001", "127.0.0.1:1002"


def welcome(address: str = A, node: str = "n1", number: int = 1) -> Welcome:
    return Welcome(address, node, encode(ConnectionId(node, 1, number)), None, {})


def sent(core: ClientProtocol) -> list[dict[str, Any]]:
    """The frames the protocol wants written now."""
    frames, rest = split_frames(core.data_to_send(), protocol.FRAME_BYTES_MAX_DEFAULT)
    assert rest == b""
    return frames


def answer(*frames: dict[str, Any]) -> bytes:
    return b"".join(protocol.encode_frame(frame) for frame in frames)


def ok(frame: dict[str, Any]) -> dict[str, Any]:
    return protocol.reply(frame["id"], encode(Ok()))


def connected(**kwargs: Any) -> ClientProtocol:
    core = ClientProtocol([A, B], **kwargs)
    core.connection_made(welcome())
    return core


def test_publishes_are_confirmed_by_ok_replies_and_counted_once() -> None:
    core = connected()
    publisher = core.add_publisher("q", window=10, enqueuer="e1")
    assert core.publish(publisher, [b"a", b"b"]) == [1, 2]
    frames = sent(core)
    # bound to the connection the node named (the node would bind it anyway)
    assert [decode(f["cmd"]) for f in frames] == [
        Enqueue("q", b"a", "e1", 1, ConnectionId("n1", 1, 1)),
        Enqueue("q", b"b", "e1", 2, ConnectionId("n1", 1, 1)),
    ]
    events = core.receive_data(answer(*(ok(f) for f in frames), ok(frames[0])))
    assert events == [PublisherUpdated(publisher)]
    assert (publisher.confirmed, len(publisher.pending), core.room(publisher)) == (2, 0, 10)


def test_grouped_publishes_name_their_group_and_resend_it_after_a_gap() -> None:
    """A publish with a message group is an AnnotatedEnqueue with the x-group-id annotation;
    a resend after a sequence gap keeps the group (bytes equal to fifo.encode's)."""
    core = connected()
    publisher = core.add_publisher("q", window=10, enqueuer="e1")
    core.publish(publisher, [b"a"], ttl_ms=5, group="g1")
    core.publish(publisher, [b"b"])
    first, second = sent(core)
    grouped = AnnotatedEnqueue("q", b"a", "e1", 1, None, 5, (("x-group-id", "g1"),))
    assert first["cmd"] == encode(grouped) and decode(first["cmd"]) == grouped
    assert decode(second["cmd"]) == Enqueue("q", b"b", "e1", 2, ConnectionId("n1", 1, 1))
    core.receive_data(answer(protocol.reply(second["id"], encode(NotEnqueued(1)))))
    plain = Enqueue("q", b"b", "e1", 2, ConnectionId("n1", 1, 1))
    assert [decode(f["cmd"]) for f in sent(core)] == [grouped, plain]


def test_a_sequence_gap_resends_the_earlier_messages_then_the_refused_one() -> None:
    core = connected()
    publisher = core.add_publisher("q", window=10, enqueuer="e1")
    core.publish(publisher, [b"a", b"b", b"c"])
    _, second, _ = sent(core)
    gap = protocol.reply(second["id"], encode(NotEnqueued(1)))
    core.receive_data(answer(gap))
    resent = [decode(f["cmd"]).seq for f in sent(core)]
    assert resent == [1, 2]
    assert publisher.resent == 2


def test_a_lost_connection_resends_every_unanswered_request_unchanged_on_the_next() -> None:
    core = connected()
    publisher = core.add_publisher("q", window=10, enqueuer="e1")
    core.publish(publisher, [b"a", b"b"])
    before = sent(core)
    assert core.connection_lost(ConnectionError("reset")) == [ReconnectNeeded((B, A))]
    assert core.data_to_send() == b""
    core.connection_made(welcome(B, "n2"))
    assert sent(core) == before  # same ids, same enqueuer and seqs: the queue dedups
    assert core.reconnects == 1


def test_consumers_re_attach_as_new_checkouts_and_messages_keep_their_delivery_key() -> None:
    core = connected()
    consumer = core.add_consumer("q", prefetch=5)
    attach_id = core.attach(consumer)
    (checkout,) = sent(core)
    reply = CheckoutOk(
        7, next_msg_id=1, credit=5, delivery_count=0, is_active=True, num_checked_out=0
    )
    events = core.receive_data(answer(protocol.reply(attach_id, encode(reply))))
    assert Answered(attach_id, protocol.reply(attach_id, encode(reply)), None) in events
    assert consumer.consumer_key == 7
    delivery = Deliver(
        ConnectionId("n1", 1, 1), "q", consumer.tag, 7, (Delivery(1, b"x", False, 0),)
    )
    events = core.receive_data(answer(protocol.effect(encode(delivery))))
    assert events == [ConsumerUpdated(consumer)]
    core.connection_lost(None)
    core.connection_made(welcome(B, "n2", 9))
    (again,) = sent(core)
    command = decode(again["cmd"])
    assert isinstance(command, Checkout)
    assert command.consumer == ConsumerId(consumer.tag, ConnectionId("n2", 1, 9))
    assert decode(checkout["cmd"]).consumer.tag == consumer.tag
    item = core.next_delivery(consumer)
    assert item is not None and item[0] == 7  # still the key it was delivered with
    core.ack(consumer, [(item[0], item[1].msg_id)])
    core.flush_acks(consumer)
    (settle,) = sent(core)
    assert decode(settle["cmd"]) == Settle("q", 7, (1,))


def test_retryable_errors_are_resent_as_is_after_a_delay() -> None:
    core = connected(now=100.0)
    request_id = core.submit(protocol.query(0, "status"))
    (first,) = sent(core)
    busy = protocol.error(protocol.NOT_LEADER_TIMEOUT, "electing", request_id)
    assert core.receive_data(answer(busy)) == []
    core.tick(100.0 + RETRY_DELAY_S / 2)
    assert core.data_to_send() == b""
    core.tick(100.0 + RETRY_DELAY_S)
    assert sent(core) == [first]


def test_the_owner_ticks_often_only_while_a_retry_waits() -> None:
    """Idle, or waiting for answers, a tick has only the deadlines and the silence check to do
    (every SCAN_S); a refusal to retry asks for ticks every TICK_S until it is resent."""
    core = connected(now=100.0)
    retrying: list[bool] = []
    assert core.tick_wait_s() == SCAN_S
    retrying.append(core.retrying)
    request_id = core.submit(protocol.query(0, "status"))
    assert core.tick_wait_s() == SCAN_S
    sent(core)
    busy = protocol.error(protocol.NOT_LEADER_TIMEOUT, "electing", request_id)
    core.receive_data(answer(busy))
    assert core.tick_wait_s() == TICK_S < RETRY_DELAY_S
    retrying.append(core.retrying)
    core.tick(100.0 + RETRY_DELAY_S)
    assert sent(core) and core.tick_wait_s() == SCAN_S
    retrying.append(core.retrying)
    assert retrying == [False, True, False]


def test_a_request_past_its_deadline_fails_with_request_timeout() -> None:
    core = connected(now=10.0)
    request_id = core.submit(protocol.query(0, "status"), timeout_s=1.0)
    events = core.tick(10.0 + max(1.0, SCAN_S) + 0.01)
    (event,) = [e for e in events if isinstance(e, Answered)]
    assert event.request_id == request_id and isinstance(event.error, RequestTimeout)


def test_a_node_silent_while_requests_wait_is_left() -> None:
    core = connected(now=0.0, silence_timeout_s=1.0)
    core.submit(protocol.query(0, "status"))
    assert core.tick(0.6) == []
    assert core.tick(1.2) == [CloseConnection("the node is silent")]


def test_without_reconnect_a_lost_connection_fails_everything() -> None:
    core = connected(reconnect=False)
    request_id = core.submit(protocol.query(0, "status"))
    publisher = core.add_publisher("q", window=5)
    core.publish(publisher, [b"a"])
    events = core.connection_lost(ConnectionError("reset"))
    assert any(isinstance(e, Failed) for e in events)
    answered = [e for e in events if isinstance(e, Answered)]
    assert [e.request_id for e in answered] == [request_id]
    assert isinstance(publisher.error, Unavailable)
    with pytest.raises(Unavailable):
        core.submit(protocol.query(0, "status"))


def test_reject_publish_blocks_the_publisher_until_go() -> None:
    core = connected()
    publisher = core.add_publisher("q", window=5, enqueuer="e1")
    conn = ConnectionId("n1", 1, 1)
    core.receive_data(
        answer(protocol.effect(encode(QueueStatus(conn, "q", "e1", "reject_publish"))))
    )
    assert core.room(publisher) == 0
    core.receive_data(answer(protocol.effect(encode(QueueStatus(conn, "q", "e1", "go")))))
    assert core.room(publisher) == 5


def test_an_error_reply_to_a_publish_fails_the_publisher() -> None:
    core = connected()
    publisher = core.add_publisher("q", window=5)
    core.publish(publisher, [b"a"])
    (frame,) = sent(core)
    refused = protocol.error(protocol.BAD_COMMAND, "no", frame["id"])
    core.receive_data(answer(refused))
    with pytest.raises(CommandRefused):
        core.room(publisher)


def test_the_handshake_answers_the_challenge_and_reads_the_welcome() -> None:
    key = b"k" * 32
    handshake = Handshake(A, key, "me")
    nonce = b"n" * 32
    assert handshake.receive_data(answer(protocol.challenge(nonce, "n1"))[:10]) is None
    assert handshake.receive_data(answer(protocol.challenge(nonce, "n1"))[10:]) is None
    (hello,), _ = split_frames(handshake.data_to_send(), protocol.FRAME_BYTES_MAX_DEFAULT)
    assert protocol.verify_proof(key, nonce, hello["proof"])
    conn = encode(ConnectionId("n1", 1, 1))
    extra = protocol.reply(1, encode(Ok()))
    got = handshake.receive_data(answer(protocol.welcome("n1", conn, "n2", {"n2": B}), extra))
    assert got is not None and got.leader_address() == B
    assert handshake.leftover == answer(extra)


def test_the_handshake_reports_a_refused_key_as_an_auth_error() -> None:
    handshake = Handshake(A, b"k" * 32, "me")
    handshake.receive_data(answer(protocol.challenge(b"n" * 32, "n1")))
    with pytest.raises(AuthError):
        handshake.receive_data(answer(protocol.error(protocol.AUTH_FAILED, "bad proof")))


def test_a_settle_retried_after_an_unknown_outcome_marks_an_error_answer_uncertain() -> None:
    """Issue 17: `not_leader_timeout` leaves the first attempt's outcome unknown and the same
    frame is resent. If the retry is refused (the consumer left meanwhile) the first attempt may
    still have settled the message, so the answer is flagged uncertain, not a plain refusal."""
    core = connected(now=0.0)
    request_id = core.submit(core.command_frame(Settle("q", 7, (1,))))
    (first,) = sent(core)
    core.receive_data(answer(protocol.error(protocol.NOT_LEADER_TIMEOUT, "t", request_id)))
    core.tick(RETRY_DELAY_S)
    assert sent(core) == [first]
    refused = protocol.reply(request_id, encode(Error("unknown_consumer", "7")))
    (event,) = core.receive_data(answer(refused))
    assert event == Answered(request_id, {**refused, UNCERTAIN: True}, None)


def test_an_answer_to_a_request_sent_once_is_never_uncertain() -> None:
    core = connected(now=0.0)
    request_id = core.submit(core.command_frame(Settle("q", 7, (1,))))
    refused = protocol.reply(request_id, encode(Error("unknown_consumer", "7")))
    (event,) = core.receive_data(answer(refused))
    assert event == Answered(request_id, refused, None)


def test_a_request_timeout_counts_from_the_time_it_was_submitted_at() -> None:
    core = connected(now=0.0)  # no tick since: the shell's connect took 10 s, say
    request_id = core.submit(protocol.query(0, "status"), timeout_s=2.0, now=10.0)
    assert core.tick(11.0) == []
    (event,) = core.tick(12.1)
    assert isinstance(event, Answered) and event.request_id == request_id
    assert isinstance(event.error, RequestTimeout)

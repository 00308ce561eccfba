"""The decisions both client shells share (`cluster.client._requests`), checked without I/O."""

from __future__ import annotations

import pytest

from cluster import protocol
from cluster.client._options import Settings
from cluster.client._requests import (
    DIAL_PAUSE_S,
    PROBE_TIMEOUT_S,
    Dialing,
    core_for,
    declarations,
    dequeued,
    expect,
    no_answer,
    purging,
    reply_of,
    settling,
    status_probe,
)
from cluster.client.errors import (
    AuthError,
    CommandRefused,
    NoQuorum,
    RequestTimeout,
    TlsError,
    Unavailable,
)
from fifo import commands as c
from fifo.codec import encode
from fifo.replies import DeclareOk, DequeuedMessage, DequeueOk, Error, Ok

CONN = c.ConnectionId("n1", 1, 1)


def test_dialing_retries_network_failures_and_gives_up_naming_the_last_round() -> None:
    dialing = Dialing(["a:1", "b:2"], deadline=10.0, describe=str)
    dialing.failed("a:1", ConnectionRefusedError("refused"))
    dialing.failed("b:2", TimeoutError("timed out"))
    assert dialing.pause_after_round(9.9) == DIAL_PAUSE_S
    dialing.failed("a:1", OSError("unreachable"))
    dialing.failed("b:2", ValueError("bad welcome"))
    with pytest.raises(Unavailable) as caught:
        dialing.pause_after_round(10.0)
    assert str(caught.value) == "no quorumq node reachable (a:1: unreachable; b:2: bad welcome)"


@pytest.mark.parametrize("error", [AuthError("bad key"), TlsError("no TLS"), RuntimeError("bug")])
def test_dialing_never_retries_a_refusal_or_a_bug(error: Exception) -> None:
    dialing = Dialing(["a:1"], deadline=10.0)
    with pytest.raises(type(error)):
        dialing.failed("a:1", error)
    assert dialing.errors == []


def test_dialing_words_failures_with_repr_unless_told() -> None:
    dialing = Dialing(["a:1"], deadline=0.0)
    dialing.failed("a:1", TimeoutError())
    with pytest.raises(Unavailable, match=r"a:1: TimeoutError\(\)"):
        dialing.pause_after_round(0.0)


def test_the_core_is_built_from_the_settings() -> None:
    core = core_for(["a:1"], Settings(name="n", reconnect=False, no_leader_fail_s=2.0), now=5.0)
    assert core.endpoints == ["a:1"] and not core.closed


def test_only_a_timeout_on_an_open_client_is_probed() -> None:
    core = core_for(["a:1"], Settings())
    assert status_probe(core, CommandRefused("x", "y"), lambda: 0.0) is None
    probe = status_probe(core, no_answer("publish", 1.0), lambda: 0.0)
    assert probe is not None and probe.timeout_s == PROBE_TIMEOUT_S
    timeout = RequestTimeout("slow")
    assert probe.explain({"result": {"has_quorum": True, "leader": "n1"}}, timeout) is timeout
    assert isinstance(probe.explain({"result": {"has_quorum": False}}, timeout), NoQuorum)
    core.close()
    assert status_probe(core, timeout, lambda: 0.0) is None


def test_a_reply_frame_decodes_and_an_error_reply_is_a_refusal() -> None:
    assert reply_of({"reply": encode(Ok())}) == Ok()
    with pytest.raises(CommandRefused) as refused:
        reply_of({"reply": encode(Error("unknown_queue", "no queue q"))})
    assert (refused.value.code, refused.value.message) == ("unknown_queue", "no queue q")
    with pytest.raises(CommandRefused) as bad:
        reply_of({"reply": "text"})
    assert bad.value.code == protocol.BAD_FRAME
    assert expect(DeclareOk(True), DeclareOk) == DeclareOk(True)
    with pytest.raises(CommandRefused, match="expected DeclareOk"):
        expect(Ok(), DeclareOk)


def test_what_declare_and_purge_send() -> None:
    config = c.QueueConfig(dead_letter_queue="dlq")
    assert declarations("q", None, None) == (None, c.DeclareQueue("q", c.QueueConfig()))
    assert declarations("q", config, None) == ("dlq", c.DeclareQueue("q", config))
    groups = c.GroupConfig("x-group-id", "exclusive")
    target, grouped = declarations("q", None, groups)
    assert target is None and grouped == c.DeclareGroupedQueue("q", c.QueueConfig(), groups)
    assert purging("q", None, False) == c.Purge("q")
    assert purging("q", "g", False) == c.PurgeGroup("q", "g")
    assert purging("q", None, True) == c.PurgeGroup("q", None)


def test_what_a_dequeue_reply_holds() -> None:
    found = DequeuedMessage(7, b"m", 2, True)
    assert dequeued(DequeueOk(None, 0), "t", CONN) is None
    fields = dequeued(DequeueOk(found, 3), "t", CONN)
    assert fields == (7, b"m", True, 2, c.ConsumerId("t", CONN))
    assert dequeued(DequeueOk(found, 3, consumer_key=42), "t", CONN) == (7, b"m", True, 2, 42)
    with pytest.raises(CommandRefused, match="dequeue answered"):
        dequeued(Ok(), "t", CONN)


def test_how_a_dequeued_message_is_settled() -> None:
    key = c.ConsumerId("t", CONN)
    assert settling("q", key, 7, "ack") == c.Settle("q", key, (7,))
    assert settling("q", key, 7, "requeue") == c.Return("q", key, (7,))
    assert settling("q", key, 7, "reject") == c.Discard("q", key, (7,))

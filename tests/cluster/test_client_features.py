"""Feature negotiation in the handshake, and the `oks` frame (one frame for many `Ok` answers).

A client lists the features it understands in its hello; a node names in its welcome those it
will use. A node that predates a feature ignores the key and names none, so nothing changes on
the wire; the node side plays here by hand, with the real wire format.
"""

from __future__ import annotations

from typing import Any

import pytest

from cluster import protocol
from cluster.client import ClientProtocol
from cluster.client._wire import Handshake, Welcome, split_frames
from cluster.errors import ProtocolError
from cluster.launcher import LocalCluster
from fifo.codec import encode
from fifo.commands import ConnectionId, Settle
from fifo.replies import Ok

A = "127.0.0.1:1001"
CONN = encode(ConnectionId("n1", 1, 1))


def frames_of(data: bytes) -> list[dict[str, Any]]:
    frames, rest = split_frames(data, protocol.FRAME_BYTES_MAX_DEFAULT)
    assert rest == b""
    return frames


def wire(*frames: dict[str, Any]) -> bytes:
    return b"".join(protocol.encode_frame(frame) for frame in frames)


def handshake_with(welcome: dict[str, Any]) -> tuple[dict[str, Any], Welcome]:
    """The hello the client sent and the Welcome it read from `welcome`."""
    handshake = Handshake(A, b"k" * 32, "me")
    handshake.receive_data(wire(protocol.challenge(b"n" * 32, "n1")))
    (hello,) = frames_of(handshake.data_to_send())
    got = handshake.receive_data(wire(welcome))
    assert got is not None
    return hello, got


def test_the_hello_lists_the_features_the_client_understands() -> None:
    hello, _ = handshake_with(protocol.welcome("n1", CONN, None, {}))
    assert hello[protocol.FEATURES] == [protocol.OKS_FEATURE]
    assert protocol.features_of(hello) == {protocol.OKS_FEATURE}


def test_a_welcome_without_features_uses_none() -> None:
    """What a node from before the negotiation sends."""
    _, welcome = handshake_with(protocol.welcome("n1", CONN, None, {}))
    assert welcome.features == frozenset()


def test_a_welcome_names_the_features_the_node_will_use() -> None:
    welcome_frame = protocol.welcome("n1", CONN, None, {}, (protocol.OKS_FEATURE,))
    _, welcome = handshake_with(welcome_frame)
    assert welcome.features == {protocol.OKS_FEATURE}


@pytest.mark.parametrize("names", [None, "oks", [1, "oks"], ["x"] * 100])
def test_malformed_feature_lists_name_only_their_string_entries(names: object) -> None:
    frame = {"op": protocol.WELCOME, protocol.FEATURES: names}
    got = protocol.features_of(frame)
    assert got <= {"oks", "x"}
    assert got == ({"oks"} if names == [1, "oks"] else {"x"} if isinstance(names, list) else set())


def connected() -> ClientProtocol:
    core = ClientProtocol([A])
    core.connection_made(Welcome(A, "n1", CONN, None, {}, frozenset({protocol.OKS_FEATURE})))
    return core


def test_an_oks_frame_confirms_every_publish_it_lists_once() -> None:
    core = connected()
    publisher = core.add_publisher("q", window=10, enqueuer="e1")
    core.publish(publisher, [b"a", b"b", b"c"])
    ids = [frame["id"] for frame in frames_of(core.data_to_send())]
    core.receive_data(wire(protocol.oks(ids[:2]), protocol.oks([ids[0]])))
    assert (publisher.confirmed, sorted(publisher.pending)) == (2, [3])
    core.receive_data(wire(protocol.oks([ids[2]])))
    assert (publisher.confirmed, len(publisher.pending)) == (3, 0)


def test_an_oks_frame_answers_other_requests_as_their_ok_reply_would() -> None:
    core = connected()
    request_id = core.submit(core.command_frame(Settle("q", 7, (1,))))
    core.data_to_send()
    (event,) = core.receive_data(wire(protocol.oks([request_id])))
    assert getattr(event, "answer", None) == protocol.reply(request_id, encode(Ok()))


@pytest.mark.parametrize(
    "ids", [None, "12", [1, "2"], [1.5], list(range(protocol.OKS_IDS_MAX + 1))]
)
def test_a_malformed_oks_frame_breaks_the_stream(ids: object) -> None:
    core = connected()
    with pytest.raises(ProtocolError) as raised:
        core.receive_data(wire({"op": protocol.OKS, "ids": ids}))
    assert raised.value.code == protocol.BAD_FRAME


@pytest.mark.cluster
def test_a_real_node_serves_a_client_that_lists_features_whatever_it_names(
    shared_cluster3: LocalCluster,
) -> None:
    """A node ignores hello keys it does not know: the handshake passes, the welcome names
    only features the client listed (none, from a node that predates them), publishes work."""
    with shared_cluster3.client() as client:
        client.declare_queue("features-q")
        with client.publisher("features-q", window=50) as publisher:
            publisher.publish_many(b"m%d" % number for number in range(200))
        assert publisher.confirmed == 200
        welcome = client.core.welcome
        assert welcome is not None and welcome.features <= set(protocol.CLIENT_FEATURES)

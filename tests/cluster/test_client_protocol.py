"""Client protocol logic against scripted stub nodes: gaps, renumbering, resend on reconnect.

These paths are rare on a real cluster (a lost forward, an evicted enqueuer, a silent node), so a
stub node that speaks the real wire protocol (`cluster.protocol`, `fifo` codec) makes them happen
on purpose. The cluster-level behaviour is tested against real nodes in the other test files.
Every test runs against both shells (threaded `Client`, `AsyncClient`; see `shells.py`).
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from cluster import protocol
from cluster.client import AuthError
from fifo.codec import decode, encode
from fifo.commands import ConnectionId, Enqueue
from fifo.replies import NotEnqueued, Ok
from tests.cluster.shells import Shells

KEY = b"ab" * 32
Handler = Callable[["StubNode", dict[str, Any], Any], list[dict[str, Any]] | None]


class StubNode:
    """A node that authenticates like the real one and answers commands with `handler`."""

    def __init__(self, handler: Handler, node_id: str = "s1") -> None:
        self.handler = handler
        self.node_id = node_id
        self.seen: list[Enqueue] = []
        self.writers: list[asyncio.StreamWriter] = []
        self.loop = asyncio.new_event_loop()
        started = threading.Event()
        self.thread = threading.Thread(
            target=self._run, args=(started,), name=f"stub-node-{node_id}", daemon=True
        )
        self.thread.start()
        started.wait(5)

    def _run(self, started: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        server = self.loop.run_until_complete(asyncio.start_server(self._session, "127.0.0.1", 0))
        self.address = f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
        started.set()
        self.loop.run_forever()

    async def _session(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonce = os.urandom(32)
        await protocol.write_frame(writer, protocol.challenge(nonce, self.node_id))
        hello = await protocol.read_frame(reader)
        if not protocol.verify_proof(KEY, nonce, hello.get("proof")):
            await protocol.write_frame(writer, protocol.error(protocol.AUTH_FAILED, "bad proof"))
            writer.close()
            return
        conn = encode(ConnectionId(self.node_id, 1, len(self.writers) + 1))
        await protocol.write_frame(writer, protocol.welcome(self.node_id, conn, None, {}))
        self.writers.append(writer)
        while True:
            try:
                frame = await protocol.read_frame(reader)
            except (asyncio.IncompleteReadError, ConnectionError):
                return
            command = decode(frame["cmd"])
            if isinstance(command, Enqueue):
                self.seen.append(command)
            for answer in self.handler(self, frame, command) or []:
                writer.write(protocol.encode_frame(answer))

    def close_connections(self) -> None:
        """Drop every client connection (as a crashed node would)."""
        for writer in self.writers:
            self.loop.call_soon_threadsafe(writer.close)

    def stop(self) -> None:
        self.close_connections()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


def ok(frame: dict[str, Any]) -> dict[str, Any]:
    return protocol.reply(frame["id"], encode(Ok()))


@pytest.fixture
def stubs() -> Iterator[list[StubNode]]:
    nodes: list[StubNode] = []
    yield nodes
    for node in nodes:
        node.stop()


def test_wrong_key_is_an_auth_error(stubs: list[StubNode], shells: Shells) -> None:
    stubs.append(StubNode(lambda node, frame, cmd: [ok(frame)]))
    with pytest.raises(AuthError):
        shells.connect([stubs[0].address], b"cd" * 32, connect_timeout_s=1.0)


def test_a_lost_enqueue_is_resent_with_the_gap_in_order(
    stubs: list[StubNode], shells: Shells
) -> None:
    applied: list[int] = []

    def queue_with_a_lost_first_message(node: StubNode, frame: dict[str, Any], cmd: Any) -> Any:
        if cmd.seq == 1 and not node.seen[:-1]:
            return []  # the first send of seq 1 is lost on its way to the leader
        expected = len(applied) + 1
        if cmd.seq < expected:
            return [ok(frame)]  # duplicate
        if cmd.seq > expected:
            return [protocol.reply(frame["id"], encode(NotEnqueued(expected)))]
        applied.append(cmd.seq)
        return [ok(frame)]

    stubs.append(StubNode(queue_with_a_lost_first_message))
    with shells.connect([stubs[0].address], KEY) as client:
        with client.publisher("q", window=10, enqueuer="e1") as publisher:
            publisher.publish_many([b"1", b"2", b"3", b"4"])
        assert publisher.confirmed == 4
        assert publisher.resent >= 4
    assert applied == [1, 2, 3, 4]


def test_an_enqueuer_the_queue_forgot_is_renumbered_from_the_expected_seq(
    stubs: list[StubNode], shells: Shells
) -> None:
    applied: list[bytes] = []
    state = {"next": 1, "forgotten": False}

    def forgetful(node: StubNode, frame: dict[str, Any], cmd: Any) -> Any:
        if len(applied) == 2 and not state["forgotten"]:
            state["forgotten"], state["next"] = True, 1  # evicted: dedup state lost
        if cmd.seq != state["next"]:
            return [protocol.reply(frame["id"], encode(NotEnqueued(int(state["next"]))))]
        state["next"] = int(state["next"]) + 1
        applied.append(cmd.body)
        return [ok(frame)]

    stubs.append(StubNode(forgetful))
    with shells.connect([stubs[0].address], KEY) as client:
        with client.publisher("q", window=1) as publisher:
            for body in (b"a", b"b", b"c", b"d"):
                publisher.publish(body)
        assert publisher.confirmed == 4
    assert applied == [b"a", b"b", b"c", b"d"]


def test_unanswered_publishes_are_resent_to_another_node_with_the_same_enqueuer_and_seqs(
    stubs: list[StubNode], shells: Shells
) -> None:
    first = StubNode(lambda node, frame, cmd: [], node_id="s1")  # takes them, answers nothing
    second = StubNode(lambda node, frame, cmd: [ok(frame)], node_id="s2")
    stubs += [first, second]
    with shells.connect([first.address, second.address], KEY) as client:
        publisher = client.publisher("q", window=10, enqueuer="e-same")
        publisher.publish_many([b"x", b"y", b"z"])
        assert _wait(lambda: len(first.seen) == 3)
        first.close_connections()
        publisher.wait_for_confirms(timeout_s=10.0)
        assert client.node == "s2"
    assert [(c.enqueuer, c.seq, c.body) for c in second.seen] == [
        (c.enqueuer, c.seq, c.body) for c in first.seen
    ]


def test_a_silent_node_is_left_for_another_one(stubs: list[StubNode], shells: Shells) -> None:
    silent = StubNode(lambda node, frame, cmd: [], node_id="s1")
    healthy = StubNode(lambda node, frame, cmd: [ok(frame)], node_id="s2")
    stubs += [silent, healthy]
    with shells.connect([silent.address, healthy.address], KEY, silence_timeout_s=0.5) as client:
        with client.publisher("q", window=5) as publisher:
            publisher.publish_many([b"1", b"2"])
            publisher.wait_for_confirms(timeout_s=10.0)
        assert client.node == "s2"


def test_not_leader_errors_are_retried_until_the_command_commits(
    stubs: list[StubNode], shells: Shells
) -> None:
    attempts: list[int] = []

    def no_leader_twice(node: StubNode, frame: dict[str, Any], cmd: Any) -> Any:
        attempts.append(frame["id"])
        if len(attempts) <= 2:
            return [protocol.error(protocol.NOT_LEADER_TIMEOUT, "electing", frame["id"])]
        return [ok(frame)]

    stubs.append(StubNode(no_leader_twice))
    with shells.connect([stubs[0].address], KEY) as client:
        client.publish("q", b"once")
    assert len(attempts) == 3


def _wait(predicate: Callable[[], bool], timeout_s: float = 5.0) -> bool:
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()

"""pysyncobj driven from the node's asyncio loop (`raft.ticker`): the poller over the loop's
selector with real sockets, and a real single-node Replica that runs without any thread of its
own, its replies and effects handed over on the loop thread inside the tick."""

from __future__ import annotations

import asyncio
import socket
import threading
from pathlib import Path

import pytest
from pysyncobj.poller import POLL_EVENT_TYPE

from fifo.commands import DeclareQueue, Enqueue
from fifo.replies import DeclareOk, Ok
from raft.replica import Replica, Reply
from raft.ticker import LoopPoller, LoopTicker
from tests.raft.test_replica import _settings

READ, WRITE, ERROR = POLL_EVENT_TYPE.READ, POLL_EVENT_TYPE.WRITE, POLL_EVENT_TYPE.ERROR


def test_the_loop_poller_follows_subscribe_masks_on_real_sockets() -> None:
    """READ fires when bytes arrive, WRITE only while subscribed, nothing after unsubscribe;
    every event is followed by `on_event` (the ticker's tick)."""
    loop = asyncio.new_event_loop()
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    seen: list[tuple[int, int]] = []
    ticks: list[int] = []
    poller = LoopPoller(loop, lambda: ticks.append(len(seen)))

    def on_io(descr: int, event: int) -> None:
        seen.append((descr, event))
        if event & READ:
            ours.recv(100)

    async def settle() -> None:
        for _ in range(3):
            await asyncio.sleep(0)

    try:
        poller.subscribe(ours.fileno(), on_io, READ | ERROR)
        loop.run_until_complete(settle())
        assert seen == []  # nothing to read, WRITE not asked for
        theirs.send(b"x")
        loop.run_until_complete(settle())
        assert seen == [(ours.fileno(), READ)] and ticks == [1]
        poller.subscribe(ours.fileno(), on_io, READ | WRITE | ERROR)
        loop.run_until_complete(settle())
        assert (ours.fileno(), WRITE) in seen[1:]
        poller.subscribe(ours.fileno(), on_io, READ | ERROR)  # WRITE dropped again
        seen.clear()
        loop.run_until_complete(settle())
        assert seen == []
        poller.unsubscribe(ours.fileno())
        theirs.send(b"y")
        loop.run_until_complete(settle())
        assert seen == []
    finally:
        poller.unsubscribe_all()
        ours.close()
        theirs.close()
        loop.close()


def test_a_tick_requested_inside_a_tick_runs_after_it() -> None:
    """A tick is never re-entered: asked for during one, it runs once that one returned."""
    loop = asyncio.new_event_loop()
    order: list[str] = []
    ticker: LoopTicker

    def tick() -> None:
        order.append("start")
        if len(order) == 1:
            ticker.tick_now()  # e.g. a socket event handled inside the tick
            ticker.run_or_request(lambda: order.append("nested"))
        order.append("end")

    ticker = LoopTicker(loop, tick, period=10.0)

    async def run() -> None:
        ticker.tick_now()
        for _ in range(3):
            await asyncio.sleep(0)

    try:
        loop.run_until_complete(run())
        assert order[:2] == ["start", "end"]
        assert "nested" not in order
        assert order[2:4] == ["start", "end"]
    finally:
        ticker.stop()
        loop.close()


def test_a_failing_tick_or_socket_callback_calls_on_failure_and_goes_on() -> None:
    """A tick or a socket callback that raises is logged and reported to `on_failure` (the node
    stops there on journal damage); the loop and later ticks carry on."""
    loop = asyncio.new_event_loop()
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    failures: list[str] = []
    ticks: list[int] = []

    def tick() -> None:
        ticks.append(1)
        if len(ticks) == 1:
            raise OSError("the first tick fails")

    def on_io(descr: int, event: int) -> None:
        ours.recv(100)
        raise ValueError("a bad frame")

    ticker = LoopTicker(loop, tick, period=10.0)
    ticker.on_failure = lambda: failures.append("tick")
    poller = LoopPoller(loop, ticker.tick_now)
    poller.on_failure = lambda: failures.append("io")

    async def settle() -> None:
        for _ in range(3):
            await asyncio.sleep(0)

    try:
        ticker.tick_now()
        assert failures == ["tick"] and len(ticks) == 1
        poller.subscribe(ours.fileno(), on_io, READ | ERROR)
        theirs.send(b"x")
        loop.run_until_complete(settle())
        assert failures == ["tick", "io"] and len(ticks) == 2  # the event still ticks
    finally:
        poller.unsubscribe_all()
        ticker.stop()
        ours.close()
        theirs.close()
        loop.close()


@pytest.mark.slow
def test_a_replica_runs_on_its_loop_without_a_thread_of_its_own(tmp_path: Path) -> None:
    """No tick thread: a Replica adds no thread, and its replies come on the loop thread."""

    async def scenario() -> None:
        threads_before = set(threading.enumerate())
        replica = Replica(_settings(tmp_path), asyncio.get_running_loop(), lambda a: None,
                          lambda i: None)  # fmt: skip
        try:
            assert set(threading.enumerate()) == threads_before
            while replica.role() != "leader":
                await asyncio.sleep(0.02)
            for command, expected in ((DeclareQueue("q"), DeclareOk), (Enqueue("q", b"x"), Ok)):
                done: asyncio.Future[tuple[Reply, int]] = asyncio.get_running_loop().create_future()

                def on_reply(reply: Reply, done: asyncio.Future[tuple[Reply, int]] = done) -> None:
                    done.set_result((reply, threading.get_ident()))

                replica.propose(command, on_reply)
                reply, thread = await asyncio.wait_for(done, 15)
                assert isinstance(reply, expected)
                assert thread == threading.get_ident()
            assert set(threading.enumerate()) == threads_before
        finally:
            replica.destroy()

    asyncio.run(scenario())

"""The client under a node's memory alarm (`memory_alarm`): publishes are held, never failed.

A publish the node refuses because it is past its memory high watermark is resent on the same
connection after a bounded, jittered backoff (no node switch: every replica holds the same
backlog), until the node takes it; one WARNING record per alarm episode says why.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest

from cluster import protocol
from cluster.client import ClientProtocol
from cluster.client._wire import Welcome, split_frames
from cluster.client.sansio import (
    MEMORY_ALARM_LOG_INTERVAL_S,
    MEMORY_ALARM_RETRY_S_MAX,
    MEMORY_ALARM_RETRY_S_MIN,
)
from fifo.codec import encode
from fifo.commands import ConnectionId
from fifo.replies import Ok

A, B = "127.0.0.1:1001", "127.0.0.1:1002"
ALARM = "n1 is past its memory high watermark"


def _sent(core: ClientProtocol) -> list[dict[str, Any]]:
    frames, rest = split_frames(core.data_to_send(), protocol.FRAME_BYTES_MAX_DEFAULT)
    assert rest == b""
    return frames


def _answer(*frames: dict[str, Any]) -> bytes:
    return b"".join(protocol.encode_frame(frame) for frame in frames)


def _refuse(frame: dict[str, Any]) -> dict[str, Any]:
    return protocol.error(protocol.MEMORY_ALARM, ALARM, frame["id"])


def _connected() -> ClientProtocol:
    core = ClientProtocol([A, B])
    core.connection_made(Welcome(A, "n1", encode(ConnectionId("n1", 1, 1)), None, {}))
    return core


def _retry_times(core: ClientProtocol, refusals: int) -> list[float]:
    """Refuse the one publish in flight `refusals` times; when each resend came (the clock
    advanced by small steps)."""
    now, times = 0.0, []
    for _ in range(refusals):
        (frame,) = _sent(core)
        core.receive_data(_answer(_refuse(frame)))
        refused_at = now
        while not core.has_output:
            now += 0.01
            core.tick(now)
        times.append(now - refused_at)
    return times


def test_a_refused_publish_is_resent_after_a_growing_jittered_bounded_delay() -> None:
    core = _connected()
    publisher = core.add_publisher("q", window=10, enqueuer="e1")
    core.publish(publisher, [b"a"])
    delays = _retry_times(core, 9)
    assert all(MEMORY_ALARM_RETRY_S_MIN <= d <= MEMORY_ALARM_RETRY_S_MAX + 0.02 for d in delays)
    assert delays[-1] > 4 * delays[0], delays  # it backs off
    assert delays[-1] >= MEMORY_ALARM_RETRY_S_MAX / 2  # ... up to the bound, jittered down
    assert publisher.error is None and len(publisher.pending) == 1
    assert core.welcome is not None and core.reconnects == 0  # it stays on the node


def test_jitter_spreads_the_resends_of_many_publishes() -> None:
    core = _connected()
    publisher = core.add_publisher("q", window=100, enqueuer="e1")
    core.publish(publisher, [b"m%d" % i for i in range(50)])
    core.receive_data(_answer(*(_refuse(f) for f in _sent(core))))
    resent_at, now = set[tuple[float, int]](), 0.0
    while len(resent_at) < 50 and now < 1.0:
        now += 0.01
        core.tick(now)
        resent_at.update((round(now, 2), f["id"]) for f in _sent(core))
    assert len({at for at, _ in resent_at}) >= 5, "every resend at the same instant"


def test_an_alarm_episode_is_one_warning_and_the_publisher_is_confirmed_after_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="quorumq")
    core = _connected()
    publisher = core.add_publisher("q", window=10, enqueuer="e1")
    core.publish(publisher, [b"a", b"b", b"c"])
    now = 0.0
    for _ in range(5):  # every publish refused five times
        core.receive_data(_answer(*(_refuse(f) for f in _sent(core))))
        while not core.has_output:
            now += 0.01
            core.tick(now)
    frames = _sent(core)
    while len(frames) < 3:
        now += 0.01
        core.tick(now)
        frames += _sent(core)
    core.receive_data(_answer(*(protocol.reply(f["id"], encode(Ok())) for f in frames)))
    assert (publisher.confirmed, publisher.error) == (3, None)
    records = [r for r in caplog.records if r.name.startswith("quorumq")]
    assert [(r.levelno, r.__dict__["quorumq_event"]) for r in records] == [
        (logging.WARNING, "publishes_held_memory_alarm")
    ]
    assert ALARM in records[0].getMessage()
    # an alarm back soon after (a node draining near its mark flaps): the same episode
    core.publish(publisher, [b"d"])
    core.receive_data(_answer(*(_refuse(f) for f in _sent(core))))
    assert len([r for r in caplog.records if r.name.startswith("quorumq")]) == 1
    frame = _resend(core, now)
    core.receive_data(_answer(protocol.reply(frame["id"], encode(Ok()))))
    # one that comes back after the interval is a new episode, logged again
    core.publish(publisher, [b"e"])
    core.tick(now + MEMORY_ALARM_LOG_INTERVAL_S)
    core.receive_data(_answer(*(_refuse(f) for f in _sent(core))))
    assert len([r for r in caplog.records if r.name.startswith("quorumq")]) == 2


def _resend(core: ClientProtocol, now: float) -> dict[str, Any]:
    """The one frame resent after the backoff."""
    while not core.has_output:
        now += 0.01
        core.tick(now)
    (frame,) = _sent(core)
    return frame


def test_a_publisher_that_times_out_under_the_alarm_says_why() -> None:
    core = _connected()
    publisher = core.add_publisher("q", window=10, enqueuer="e1")
    core.publish(publisher, [b"a"])
    core.receive_data(_answer(*(_refuse(f) for f in _sent(core))))
    error = core.unconfirmed_error(publisher, 30.0)
    assert ALARM in str(error)

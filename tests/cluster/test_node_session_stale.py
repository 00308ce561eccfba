"""A session does not send effects that waited in it while the node was stopped (issue 24)."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

import pytest

from cluster import protocol
from cluster.node.session import EFFECTS_STALE_S, ClientSession, SessionFlusher


class FakeWriter:
    """Collects what the session writes; remembers whether it was closed."""

    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.closed = False
        self.transport = SimpleNamespace(get_write_buffer_size=lambda: 0)

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def close(self) -> None:
        self.closed = True


def a_session() -> tuple[ClientSession, FakeWriter]:
    writer = FakeWriter()
    server: Any = SimpleNamespace(
        frame_bytes_max=protocol.FRAME_BYTES_MAX_DEFAULT, flusher=SessionFlusher()
    )
    return ClientSession(server, None, writer), writer  # type: ignore[arg-type]


def run_one_loop_pass(session: ClientSession, message: dict[str, Any], delay_s: float,
                      monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """Queue `message`, let `delay_s` pass on the session's clock, then let it flush."""
    clock = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])  # (the module session uses)

    async def scenario() -> None:
        session.send(message)
        clock[0] += delay_s  # the node was stopped (SIGSTOP) before the loop came back
        await asyncio.sleep(0)

    asyncio.run(scenario())


def test_an_effect_that_waited_past_the_bound_closes_the_session_unsent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A delivery queued, then the node paused for longer than EFFECTS_STALE_S: nothing is
    written, the session is closed (its consumers' messages come back through the log)."""
    session, writer = a_session()
    run_one_loop_pass(session, protocol.effect(b"delivery"), EFFECTS_STALE_S + 1, monkeypatch)
    assert writer.written == [] and writer.closed and session.is_closed()


def test_an_effect_flushed_in_time_or_a_late_reply_is_written(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Within the bound an effect goes out; a reply (no effect) is written however late."""
    session, writer = a_session()
    run_one_loop_pass(session, protocol.effect(b"delivery"), 0.01, monkeypatch)
    assert len(writer.written) == 1 and not writer.closed
    session, writer = a_session()
    run_one_loop_pass(session, protocol.result(7, {"ok": True}), EFFECTS_STALE_S + 1, monkeypatch)
    assert len(writer.written) == 1 and not writer.closed

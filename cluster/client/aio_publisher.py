"""Confirmed, pipelined publishing with the asyncio client (see `cluster.client.publisher`).

The bookkeeping lives in `ClientProtocol`; this is the awaitable face of it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Unpack

from cluster.client._asyncio import AsyncShell
from cluster.client._options import PublishOptions, publish_options
from cluster.client._views import PublisherView
from cluster.client.errors import RequestTimeout


class AsyncPublisher(PublisherView):
    """Publishes to one queue as one enqueuer; `async with` waits for confirms at the end."""

    def __init__(
        self, client: AsyncShell, queue: str, *, window: int = 100, enqueuer: str | None = None
    ) -> None:
        self.core_state = client.core.add_publisher(queue, window, enqueuer)
        self.client = client

    async def __aenter__(self) -> AsyncPublisher:
        return self

    async def __aexit__(self, exc_type: object, *exc: object) -> None:
        try:
            if exc_type is None:
                await self.wait_for_confirms()
        finally:
            self.close()

    def close(self) -> None:
        """Stop tracking this publisher (unconfirmed messages are no longer resent)."""
        self.client.core.remove_publisher(self.core_state)

    async def publish(self, body: bytes, **options: Unpack[PublishOptions]) -> int:
        """Send one message (waits while the window is full); returns its sequence number.
        `group`: the message group (a grouped queue, machine v3)."""
        return (await self.publish_many([body], **options))[0]

    async def publish_many(
        self, bodies: Iterable[bytes], **options: Unpack[PublishOptions]
    ) -> list[int]:
        """Send many messages (all of `group`, if given), as many per write as the window
        allows; returns their seqs."""
        ttl_ms, group, timeout = publish_options(options, self.client.request_timeout_s)
        core, state = self.client.core, self.core_state
        seqs: list[int] = []
        batch: list[bytes] = []
        room = 0
        for body in bodies:
            if not batch:
                room = core.room(state)
                if room <= 0:
                    room = await self._wait_for_room(timeout)
            batch.append(body)
            if len(batch) >= room:
                seqs += core.publish(state, batch, ttl_ms, group)
                self.client.flush()
                batch = []
                await self.client.writable()
        if batch:
            seqs += core.publish(state, batch, ttl_ms, group)
            self.client.flush()
        return seqs

    async def _wait_for_room(self, timeout_s: float) -> int:
        core, state = self.client.core, self.core_state
        if not await self.client.wait_until(lambda: core.room(state) > 0, timeout_s):
            error = core.unconfirmed_error(state, timeout_s)
            if isinstance(error, RequestTimeout):
                error = RequestTimeout(f"the publish window stayed full for {timeout_s:.1f}s")
            raise await self.client.explain(error)
        return core.room(state)

    async def wait_for_confirms(self, timeout_s: float | None = None) -> None:
        """Wait until every message sent so far is confirmed; raises the first failure."""
        timeout = self.client.request_timeout_s if timeout_s is None else timeout_s
        state = self.core_state
        done = await self.client.wait_until(
            lambda: not state.pending or state.error is not None, timeout
        )
        if state.error is not None:
            raise state.error
        if not done:
            raise await self.client.explain(self.client.core.unconfirmed_error(state, timeout))

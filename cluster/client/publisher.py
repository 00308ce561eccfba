"""Confirmed, pipelined publishing with publisher dedup (enqueuer id + sequence numbers).

Up to `window` messages are unconfirmed at a time; `publish_many` sends many enqueue commands in
one write. A message stays pending until the cluster confirms it; after a reconnect the client
resends it with the same enqueuer id and sequence number, so the queue drops duplicates. A
`NotEnqueued` reply (a sequence gap: an earlier message was lost on its way) resends the gap.
The bookkeeping lives in `ClientProtocol`; this is the blocking face of it.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Unpack

from cluster.client._options import PublishOptions, publish_options
from cluster.client._threaded import ThreadedShell
from cluster.client._views import PublisherView
from cluster.client.errors import RequestTimeout


class Publisher(PublisherView):
    """Publishes to one queue as one enqueuer; use as a context manager to wait for confirms."""

    def __init__(
        self, client: ThreadedShell, queue: str, *, window: int = 100, enqueuer: str | None = None
    ) -> None:
        self.client = client
        with client.lock:
            self.core_state = client.core.add_publisher(queue, window, enqueuer)

    def __enter__(self) -> Publisher:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        try:
            if exc_type is None:
                self.wait_for_confirms()
        finally:
            self.close()

    def close(self) -> None:
        """Stop tracking this publisher (unconfirmed messages are no longer resent)."""
        with self.client.lock:
            self.client.core.remove_publisher(self.core_state)

    def publish(self, body: bytes, **options: Unpack[PublishOptions]) -> int:
        """Send one message (waits while the window is full); returns its sequence number.

        `group`: the message group (a grouped queue, machine v3; sent as the `x-group-id`
        annotation, the default `group_key`). A cluster still on machine v2 refuses it."""
        return self.publish_many([body], **options)[0]

    def publish_many(self, bodies: Iterable[bytes], **options: Unpack[PublishOptions]) -> list[int]:
        """Send many messages (all of `group`, if given), as many per write as the window
        allows; returns their seqs."""
        ttl_ms, group, timeout = publish_options(options, self.client.request_timeout_s)
        seqs: list[int] = []
        batch: list[bytes] = []
        room = 0
        with self.client.reading():  # this thread reads the confirms (while it waits for room)
            for body in bodies:
                if not batch:
                    room = self._wait_for_room(timeout)
                batch.append(body)
                if len(batch) >= room:
                    seqs += self._send(batch, ttl_ms, group)
                    batch = []
            if batch:
                seqs += self._send(batch, ttl_ms, group)
        return seqs

    def _send(self, bodies: list[bytes], ttl_ms: int | None, group: str | None) -> list[int]:
        with self.client.lock:
            seqs = self.client.core.publish(self.core_state, bodies, ttl_ms, group)
        self.client.flush()
        return seqs

    def _wait_for_room(self, timeout_s: float) -> int:
        core, state = self.client.core, self.core_state
        room = 0

        def has_room() -> bool:
            nonlocal room
            room = core.room(state)  # raises the publisher's failure
            return room > 0

        if not self.client.wait_until(has_room, time.monotonic() + timeout_s):
            with self.client.lock:
                error = core.unconfirmed_error(state, timeout_s)
            if isinstance(error, RequestTimeout):
                error = RequestTimeout(f"the publish window stayed full for {timeout_s:.1f}s")
            raise self.client.explain(error)
        return room

    def wait_for_confirms(self, timeout_s: float | None = None) -> None:
        """Wait until every message sent so far is confirmed; raises the first failure."""
        timeout = self.client.request_timeout_s if timeout_s is None else timeout_s
        state = self.core_state
        done = self.client.wait_until(
            lambda: not state.pending or state.error is not None, time.monotonic() + timeout
        )
        if state.error is not None:
            raise state.error
        if not done:
            with self.client.lock:
                error = self.client.core.unconfirmed_error(state, timeout)
            raise self.client.explain(error)

"""Run one client test suite against both shells: the threaded `Client` and `AsyncClient`.

The asyncio client runs on an event loop in a background thread; `Synced` makes it callable
from blocking test code: every attribute read and call runs on that loop, and coroutines are
awaited there. So a test body written once drives the real asyncio client, its reader and its
ticker exactly as an asyncio application would, one awaited call at a time.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import Callable, Iterator
from typing import Any

from cluster.client import AsyncClient, AsyncConsumer, AsyncMessage, AsyncPublisher, Client
from cluster.launcher import LocalCluster

SHELLS = ("threaded", "asyncio")
_ASYNC_TYPES = (AsyncClient, AsyncPublisher, AsyncConsumer, AsyncMessage)


class LoopThread:
    """An event loop running in a daemon thread; `run` executes a call on it and waits."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(
            target=self.loop.run_forever, name="shells-asyncio-loop", daemon=True
        )
        self.thread.start()

    def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        async def call() -> Any:
            result = fn(*args, **kwargs)
            if inspect.isawaitable(result):
                result = await result
            return result

        if threading.current_thread() is self.thread:
            raise RuntimeError("Synced objects must not be used from the loop thread")
        return asyncio.run_coroutine_threadsafe(call(), self.loop).result()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


def wrap(value: Any, runner: LoopThread) -> Any:
    """Synced(value) for the asyncio client's objects (and lists of them); others as they are."""
    if isinstance(value, _ASYNC_TYPES):
        return Synced(value, runner)
    if isinstance(value, list):
        return [wrap(item, runner) for item in value]
    return value


def unwrap(value: Any) -> Any:
    """The asyncio object behind a Synced one (arguments passed back into the client)."""
    if isinstance(value, Synced):
        return value._target
    if isinstance(value, list | tuple):
        return [unwrap(item) for item in value]
    return value


class Synced:
    """A blocking view of an asyncio client object (see the module docstring)."""

    def __init__(self, target: Any, runner: LoopThread) -> None:
        object.__setattr__(self, "_target", target)
        object.__setattr__(self, "_runner", runner)

    def __getattr__(self, name: str) -> Any:
        value = self._runner.run(getattr, self._target, name)
        if not callable(value):
            return wrap(value, self._runner)

        def call(*args: Any, **kwargs: Any) -> Any:
            args = tuple(unwrap(a) for a in args)
            kwargs = {k: unwrap(v) for k, v in kwargs.items()}
            return wrap(self._runner.run(value, *args, **kwargs), self._runner)

        return call

    def __enter__(self) -> Synced:
        self._runner.run(self._target.__aenter__)
        return self

    def __exit__(self, *exc: object) -> None:
        self._runner.run(self._target.__aexit__, *exc)

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        try:
            return wrap(self._runner.run(self._target.__anext__), self._runner)
        except StopAsyncIteration:
            raise StopIteration from None


class Shells:
    """Opens clients of one shell kind; closes the event loop (if any) at the end."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._runner: LoopThread | None = None

    @property
    def is_async(self) -> bool:
        return self.kind == "asyncio"

    def connect(self, endpoints: list[str], key: bytes, **kwargs: Any) -> Any:
        """A connected client of this shell kind (`Client` arguments)."""
        if not self.is_async:
            return Client(endpoints, key, **kwargs)
        if self._runner is None:
            self._runner = LoopThread()
        client = AsyncClient(endpoints, key, **kwargs)
        self._runner.run(client.connect)
        return Synced(client, self._runner)

    def client(
        self, cluster: LocalCluster, node_id: str | None = None, *, only: bool = False, **kw: Any
    ) -> Any:
        """Like `LocalCluster.client`, in this shell kind."""
        endpoints = list(cluster.config.endpoints().values())
        if node_id is not None:
            kw.setdefault("prefer_leader", False)
            first = cluster.endpoint(node_id)
            endpoints = [first] if only else [first] + [e for e in endpoints if e != first]
        if only:
            kw.setdefault("reconnect", False)
        return self.connect(endpoints, cluster.key, **kw)

    def close(self) -> None:
        if self._runner is not None:
            self._runner.stop()

"""What an AMQP connection asks of its node: submit a command, read the local state.

The same calls the native session makes (`cluster.node.session`): commands go through the
node's replica (and its metrics), so every rule of the machine applies unchanged.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import fifo
from fifo.commands import GroupConfig, QueueConfig
from fifo.queries import QueueOverview
from raft.errors import SubmitError
from raft.replica import ReplicaView, Reply
from raft.replicated import InternalFailure

if TYPE_CHECKING:
    from cluster.node.server import NodeServer

T = TypeVar("T")
Sink = Callable[[Reply], None]


def propose(server: NodeServer, command: Any, sink: Sink) -> None:
    """Submit `command`; `sink` gets its reply on the loop thread (refused at once, with a
    SubmitError, when this node knows it has no leader)."""
    refusal = server.unavailable_reason(for_read=False)
    if refusal is not None:
        sink(SubmitError("unavailable", f"{refusal}; nothing was submitted"))
        return
    server.replica.propose(command, server.metrics.count(command, sink))


async def submit(server: NodeServer, command: Any) -> Reply:
    """Submit `command` and wait for its reply."""
    done: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()

    def settle(reply: Reply) -> None:
        if not done.done():
            done.set_result(reply)

    propose(server, command, settle)
    return await done


def failure_text(reply: Reply) -> str | None:
    """Why a reply is a failure of the cluster (not of the command), or None."""
    if isinstance(reply, (SubmitError, InternalFailure)):
        return reply.message
    return None


def read(server: NodeServer, function: Callable[[ReplicaView], T]) -> T:
    """`function(view)` over this node's state (it may be behind the leader's)."""
    return server.replica.read(function)


def overview(server: NodeServer, queue: str) -> QueueOverview | None:
    """The counters and config of `queue` on this node, None when it does not exist."""
    return read(server, lambda view: fifo.overview(view.state, queue))


def queue_config(server: NodeServer, queue: str) -> QueueConfig | None:
    """The config of `queue`, None when it does not exist."""
    found = overview(server, queue)
    return None if found is None else found.config


def group_config(server: NodeServer, queue: str) -> GroupConfig | None:
    """The message-group config of `queue` (machine v3), None when it is not grouped."""
    return read(server, lambda view: fifo.group_config(view.state, queue))


def effective_version(server: NodeServer) -> int:
    """The machine version the cluster applies entries with now."""
    return read(server, lambda view: int(view.meta.effective_version))


def consumer_tags(server: NodeServer, queue: str) -> list[str]:
    """The (fifo) tags of the consumers of `queue`."""
    return [info.tag for info in read(server, lambda view: fifo.consumers(view.state, queue))]

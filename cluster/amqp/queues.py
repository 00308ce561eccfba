"""queue.declare / delete / purge on one channel, as replicated commands (bind and unbind:
`cluster.amqp.exchanges`)."""

from __future__ import annotations

import secrets
from typing import TYPE_CHECKING

from pamqp import commands

from cluster.amqp import arguments, node_link
from cluster.amqp.errors import (
    INTERNAL_ERROR,
    NOT_FOUND,
    PRECONDITION_FAILED,
    AmqpError,
    ChannelRefusal,
    ConnectionRefusal,
    not_implemented,
)
from fifo.commands import (
    EXCHANGES_SINCE_VERSION,
    DeclareGroupedQueue,
    DeclareQueue,
    DeleteQueue,
    GroupConfig,
    Purge,
    QueueConfig,
)
from fifo.replies import DeclareOk, DeleteOk, Error, PurgeOk
from raft.replica import Reply

if TYPE_CHECKING:
    from cluster.node.server import NodeServer

VHOST = arguments.VHOST


def not_found(queue: str) -> ChannelRefusal:
    """RabbitMQ's 404 for a queue that does not exist."""
    return ChannelRefusal(NOT_FOUND, f"no queue '{queue}' in vhost '{VHOST}'")


def cluster_failure(reply: Reply) -> None:
    """Raise 541 when the cluster could not take the command (no leader, internal failure)."""
    text = node_link.failure_text(reply)
    if text is not None:
        raise ConnectionRefusal(INTERNAL_ERROR, text)


async def declare(server: NodeServer, method: commands.Queue.Declare) -> commands.Queue.DeclareOk:
    """queue.declare: passive reads this node's state; otherwise a DeclareQueue command."""
    queue = method.queue or f"amq.gen-{secrets.token_urlsafe(16)}"
    if method.passive:
        return _declare_ok(server, queue)
    args = dict(method.arguments or {})
    typed = args.get("x-queue-type") is not None
    arguments.check_flags(method.queue, method.durable, method.exclusive, method.auto_delete, typed)
    groups = arguments.group_config(queue, args)
    config = arguments.queue_config(queue, args)
    dead_letter_exchange = arguments.dead_letter_exchange_of(config)
    if dead_letter_exchange and node_link.effective_version(server) < EXCHANGES_SINCE_VERSION:
        raise not_implemented(
            f"x-dead-letter-exchange '{dead_letter_exchange}': exchanges other "
            f"than the default one need machine v{EXCHANGES_SINCE_VERSION} (quorumq machine "
            f"upgrade --to {EXCHANGES_SINCE_VERSION})"
        )
    command = DeclareQueue(queue, config) if groups is None else DeclareGroupedQueue(
        queue, config, groups
    )  # fmt: skip
    reply = await node_link.submit(server, command)
    cluster_failure(reply)
    if isinstance(reply, Error):
        raise _declare_refusal(server, queue, config, groups, reply)
    assert isinstance(reply, DeclareOk), reply
    return _declare_ok(server, queue)


def _declare_refusal(
    server: NodeServer, queue: str, config: QueueConfig, groups: GroupConfig | None, reply: Error
) -> AmqpError:
    """Why a declare was refused, in RabbitMQ's words where it has them."""
    if reply.code == "unknown_command":
        return not_implemented("message groups before machine v3 (quorumq machine upgrade --to 3)")
    current = node_link.queue_config(server, queue)
    refusal = arguments.inequivalence(queue, config, current) if current else None
    if refusal is None and current is not None:
        have = node_link.group_config(server, queue)
        if have != groups:
            refusal = ChannelRefusal(
                PRECONDITION_FAILED,
                f"inequivalent arg 'x-quorumq-group-*' for queue '{queue}' in vhost '{VHOST}': "
                f"received {groups} but current is {have}",
            )
    return refusal or ChannelRefusal(PRECONDITION_FAILED, f"queue '{queue}': {reply.message}")


def _declare_ok(server: NodeServer, queue: str) -> commands.Queue.DeclareOk:
    found = node_link.overview(server, queue)
    if found is None:
        raise not_found(queue)
    return commands.Queue.DeclareOk(
        queue=queue,
        message_count=found.ready + found.returned,
        consumer_count=found.consumers + found.waiting_consumers,
    )


async def delete(server: NodeServer, method: commands.Queue.Delete) -> commands.Queue.DeleteOk:
    """queue.delete: if-unused / if-empty checked on this node's state, then DeleteQueue."""
    queue = method.queue
    found = node_link.overview(server, queue)
    if found is None:
        return commands.Queue.DeleteOk(message_count=0)  # RabbitMQ: deleting nothing is ok
    if method.if_unused and found.consumers + found.waiting_consumers > 0:
        raise ChannelRefusal(PRECONDITION_FAILED, f"queue '{queue}' in vhost '{VHOST}' in use")
    if method.if_empty and found.total > 0:
        raise ChannelRefusal(
            PRECONDITION_FAILED, f"queue '{queue}' in vhost '{VHOST}' is not empty"
        )
    reply = await node_link.submit(server, DeleteQueue(queue))
    cluster_failure(reply)
    if isinstance(reply, Error):
        return commands.Queue.DeleteOk(message_count=0)  # deleted meanwhile
    assert isinstance(reply, DeleteOk), reply
    return commands.Queue.DeleteOk(message_count=reply.messages)


async def purge(server: NodeServer, method: commands.Queue.Purge) -> commands.Queue.PurgeOk:
    """queue.purge: drop every message waiting (not those delivered and unacked)."""
    reply = await node_link.submit(server, Purge(method.queue))
    cluster_failure(reply)
    if isinstance(reply, Error):
        raise not_found(method.queue)
    assert isinstance(reply, PurgeOk), reply
    return commands.Queue.PurgeOk(message_count=reply.count)

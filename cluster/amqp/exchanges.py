"""exchange.declare / delete and queue.bind / unbind as machine v4's replicated commands, and
the conversion of AMQP header tables to the pairs a headers exchange matches.

Before v4 is effective every one of them is refused with 540 naming the version; a refusal of
the machine becomes RabbitMQ's reply code and text (`refusal`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pamqp import commands

from cluster.amqp import node_link
from cluster.amqp.errors import (
    ACCESS_REFUSED,
    COMMAND_INVALID,
    NOT_FOUND,
    PRECONDITION_FAILED,
    AmqpError,
    ChannelRefusal,
    ConnectionRefusal,
    not_implemented,
)
from cluster.amqp.queues import cluster_failure
from fifo import limits as fifo_limits
from fifo.commands import (
    EXCHANGE_TYPES,
    EXCHANGES_SINCE_VERSION,
    BindExchange,
    BindQueue,
    DeclareExchange,
    DeleteExchange,
    HeaderPairs,
    UnbindExchange,
    UnbindQueue,
)
from fifo.replies import DeclareOk, Error, Ok
from fifo.v4 import exchanges as v4_exchanges
from raft.replica import ReplicaView, Reply

if TYPE_CHECKING:
    from cluster.amqp.channel import Channel
    from cluster.node.server import NodeServer

DEFAULT_EXCHANGE = ""
UPGRADE_HINT = f"quorumq machine upgrade --to {EXCHANGES_SINCE_VERSION}"
# the headers of a publish a headers exchange matches (the machine stores header pairs as
# annotations: at most this many)
HEADERS_MATCHED = min(fifo_limits.headers_per_publish_max, fifo_limits.annotations_per_message_max)
# the machine's refusal codes as AMQP reply codes (RabbitMQ's texts come from the machine)
REPLY_CODE_OF = {
    "unknown_exchange": NOT_FOUND,
    "unknown_queue": NOT_FOUND,
    "access_refused": ACCESS_REFUSED,
    "exchange_exists": PRECONDITION_FAILED,
    "exchange_in_use": PRECONDITION_FAILED,
}


def require_exchanges(channel: Channel, what: str) -> None:
    """540 naming machine v4 when the cluster does not apply exchanges yet."""
    if node_link.effective_version(channel.server) < EXCHANGES_SINCE_VERSION:
        raise exchanges_need_v4(what)


def exchanges_need_v4(what: str) -> AmqpError:
    """The refusal of an exchange feature on a cluster before machine v4."""
    return not_implemented(
        f"{what}: exchanges other than the default one need machine v{EXCHANGES_SINCE_VERSION} "
        f"({UPGRADE_HINT})"
    )


def refusal(reply: Reply, what: str) -> AmqpError:
    """The AMQP error for a machine's refusal of an exchange command."""
    assert isinstance(reply, Error), reply
    if reply.code == "unknown_command":
        return exchanges_need_v4(what)
    return ChannelRefusal(REPLY_CODE_OF.get(reply.code, PRECONDITION_FAILED), reply.message)


async def _submit(channel: Channel, command: Any, what: str) -> Reply:
    reply = await channel.connection.submit(command)
    cluster_failure(reply)
    if isinstance(reply, Error):
        raise refusal(reply, what)
    return reply


async def declare(channel: Channel, method: commands.Exchange.Declare) -> None:
    """exchange.declare (passive too); durable is implied, what we lack is refused with 540."""
    name = method.exchange or DEFAULT_EXCHANGE
    if name == DEFAULT_EXCHANGE:
        if not method.passive:
            raise ChannelRefusal(ACCESS_REFUSED, "operation not permitted on the default exchange")
    else:
        what = f"exchange.declare of '{name}' (type {method.exchange_type})"
        require_exchanges(channel, what)
        if not method.passive:
            _check_declare_flags(method)
            if method.exchange_type not in EXCHANGE_TYPES:  # RabbitMQ: a connection error
                raise ConnectionRefusal(
                    COMMAND_INVALID, f"unknown exchange type '{method.exchange_type}'"
                )
        command = DeclareExchange(
            name, method.exchange_type, bool(method.passive), bool(method.auto_delete),
            bool(method.internal),
        )  # fmt: skip
        reply = await _submit(channel, command, what)
        assert isinstance(reply, DeclareOk), reply
    if not method.nowait:
        channel.send(commands.Exchange.DeclareOk())


def _check_declare_flags(method: commands.Exchange.Declare) -> None:
    """What quorumq's exchanges cannot have: arguments (an alternate exchange). durable=false
    is accepted: every exchange is replicated (docs/amqp.md); auto-delete and internal are the
    machine's (deleted with its last binding; no publish but through a bound exchange)."""
    for name in method.arguments or {}:
        if name == "alternate-exchange":
            raise not_implemented("alternate-exchange (alternate exchanges)")
        raise not_implemented(f"exchange argument '{name}'")


async def delete(channel: Channel, method: commands.Exchange.Delete) -> None:
    """exchange.delete (if_unused: refused while it has bindings)."""
    name = method.exchange or DEFAULT_EXCHANGE
    what = f"exchange.delete of '{name}'"
    if name != DEFAULT_EXCHANGE:
        require_exchanges(channel, what)
    reply = await channel.connection.submit(DeleteExchange(name, bool(method.if_unused)))
    cluster_failure(reply)
    if isinstance(reply, Error) and reply.code != "unknown_exchange":  # RabbitMQ: deleting
        raise refusal(reply, what)  # an exchange that does not exist is ok
    if not method.nowait:
        channel.send(commands.Exchange.DeleteOk())


async def bind(channel: Channel, method: commands.Queue.Bind | commands.Queue.Unbind) -> None:
    """queue.bind / queue.unbind: one BindQueue / UnbindQueue command."""
    name = method.exchange or DEFAULT_EXCHANGE
    verb = "queue.bind" if isinstance(method, commands.Queue.Bind) else "queue.unbind"
    what = f"{verb} of '{method.queue}' to exchange '{name}'"
    if name == DEFAULT_EXCHANGE:
        raise ChannelRefusal(ACCESS_REFUSED, "operation not permitted on the default exchange")
    require_exchanges(channel, what)
    arguments = binding_arguments(method.arguments)
    kind = BindQueue if isinstance(method, commands.Queue.Bind) else UnbindQueue
    reply = await _submit(
        channel, kind(method.queue, name, method.routing_key or "", arguments), what
    )
    assert isinstance(reply, Ok), reply
    if isinstance(method, commands.Queue.Unbind):
        channel.send(commands.Queue.UnbindOk())
    elif not method.nowait:
        channel.send(commands.Queue.BindOk())


async def bind_exchange(
    channel: Channel, method: commands.Exchange.Bind | commands.Exchange.Unbind
) -> None:
    """exchange.bind / exchange.unbind: one BindExchange / UnbindExchange command (v4)."""
    is_bind = isinstance(method, commands.Exchange.Bind)
    verb = "exchange.bind" if is_bind else "exchange.unbind"
    what = f"{verb} of exchange '{method.destination}' to exchange '{method.source}'"
    if DEFAULT_EXCHANGE in (method.source or "", method.destination or ""):
        raise ChannelRefusal(ACCESS_REFUSED, "operation not permitted on the default exchange")
    require_exchanges(channel, what)
    kind = BindExchange if is_bind else UnbindExchange
    command = kind(method.destination, method.source, method.routing_key or "",
                   binding_arguments(method.arguments))  # fmt: skip
    reply = await _submit(channel, command, what)
    assert isinstance(reply, Ok), reply
    if not method.nowait:
        channel.send(commands.Exchange.BindOk() if is_bind else commands.Exchange.UnbindOk())


def binding_arguments(table: Mapping[str, Any] | None) -> HeaderPairs:
    """A binding's arguments as (key, str | int) pairs; another value type is refused (406)."""
    pairs = []
    for key, value in (table or {}).items():
        converted = _header_value(value)
        if converted is None:
            raise ChannelRefusal(
                PRECONDITION_FAILED,
                f"binding argument '{key}' ({type(value).__name__}): quorumq matches str "
                f"values of at most {fifo_limits.annotation_bytes_max} bytes and int values only",
            )
        pairs.append((str(key), converted))
    if len(pairs) > fifo_limits.binding_arguments_max:
        raise ChannelRefusal(
            PRECONDITION_FAILED, f"more than {fifo_limits.binding_arguments_max} binding arguments"
        )
    return tuple(pairs)


def header_pairs(headers: Mapping[str, Any] | None) -> HeaderPairs:
    """A message's headers as the pairs a headers exchange matches: the first HEADERS_MATCHED
    with str or int values (bytes decoded); others are left out (no binding can name them:
    `binding_arguments` refuses what the machine could not store)."""
    pairs = []
    for key, value in (headers or {}).items():
        converted = _header_value(value)
        if converted is not None and _fits(str(key)):
            pairs.append((str(key), converted))
    return tuple(pairs[:HEADERS_MATCHED])


def _header_value(value: Any) -> str | int | None:
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if isinstance(value, bool) or not isinstance(value, str | int):
        return None
    if isinstance(value, int) and abs(value) > fifo_limits.int_field_max:
        return None
    return value if isinstance(value, int) or _fits(value) else None


def _fits(text: str) -> bool:
    return 0 < len(text.encode("utf-8", "surrogatepass")) <= fifo_limits.annotation_bytes_max


def exchange_type_here(server: NodeServer, name: str) -> tuple[int, str | None, bool]:
    """The machine version this node applies, the type of exchange `name` (declared or
    built-in) in its state (None: there is none) and whether it is internal, read at once."""

    def read(view: ReplicaView) -> tuple[int, str | None, bool]:
        version = int(view.meta.effective_version)
        if version < EXCHANGES_SINCE_VERSION:
            return version, None, False
        found = v4_exchanges.find_exchange(view.state, name)
        if found is None:
            return version, None, False
        return version, found.exchange_type, found.internal

    return node_link.read(server, read)

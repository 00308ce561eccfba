"""Which channel handler serves which AMQP method; what quorumq refuses is refused here."""

from __future__ import annotations

from pamqp import base, commands

from cluster.amqp import exchanges, queues
from cluster.amqp.channel import Channel
from cluster.amqp.errors import COMMAND_INVALID, ConnectionRefusal, not_implemented


async def dispatch_method(channel: Channel, method: base.Frame) -> None:
    """Serve one method of an open channel (publish and close are handled by the connection)."""
    if isinstance(method, commands.Basic.Ack):
        channel.ack(method)
    elif isinstance(method, commands.Basic.Nack):
        channel.nack(method.delivery_tag or 0, method.multiple, method.requeue)
    elif isinstance(method, commands.Basic.Reject):
        channel.nack(method.delivery_tag or 0, False, method.requeue)
    elif isinstance(method, commands.Basic.Consume):
        await channel.consume(method)
    elif isinstance(method, commands.Basic.Cancel):
        await channel.cancel(method)
    elif isinstance(method, commands.Basic.Get):
        await channel.get(method)
    elif isinstance(method, commands.Basic.Qos):
        channel.qos(method)
    elif isinstance(method, (commands.Basic.Recover, commands.Basic.RecoverAsync)):
        channel.recover(method.requeue)
        if isinstance(method, commands.Basic.Recover):
            channel.send(commands.Basic.RecoverOk())
    elif isinstance(method, commands.Confirm.Select):
        channel.confirm_select(method)
    else:
        await _queue_or_refused(channel, method)


async def _queue_or_refused(channel: Channel, method: base.Frame) -> None:
    server = channel.server
    channel.connection.flush_settles()  # queue methods go to the log after earlier acks
    if isinstance(method, commands.Queue.Declare):
        declare_ok = await queues.declare(server, method)
        if not method.nowait:
            channel.send(declare_ok)
    elif isinstance(method, commands.Queue.Delete):
        delete_ok = await queues.delete(server, method)
        if not method.nowait:
            channel.send(delete_ok)
    elif isinstance(method, commands.Queue.Purge):
        purge_ok = await queues.purge(server, method)
        if not method.nowait:
            channel.send(purge_ok)
    elif isinstance(method, (commands.Queue.Bind, commands.Queue.Unbind)):
        await exchanges.bind(channel, method)
    elif isinstance(method, (commands.Exchange.Bind, commands.Exchange.Unbind)):
        await exchanges.bind_exchange(channel, method)
    elif isinstance(method, commands.Exchange.Declare):
        await exchanges.declare(channel, method)
    elif isinstance(method, commands.Exchange.Delete):
        await exchanges.delete(channel, method)
    elif isinstance(method, commands.Channel.Flow):
        if not method.active:
            raise not_implemented("channel.flow active=false")
        channel.send(commands.Channel.FlowOk(active=True))
    else:
        _refuse(method)


def _refuse(method: base.Frame) -> None:
    if method.name.startswith("Tx."):
        raise not_implemented(f"transactions ({method.name.lower()})")
    raise ConnectionRefusal(COMMAND_INVALID, f"unexpected method {method.name} on a channel")

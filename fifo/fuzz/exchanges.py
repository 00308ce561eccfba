"""The fuzzer's machine-v4 exchange commands (issue 27): declare, delete, bind and unbind (to a
queue and exchange to exchange), publish through an exchange (the default one, direct, fanout,
topic, headers, built-ins, internal and auto-delete ones) and bad input for them.

The generator draws these only when the world's version is `EXCHANGES_SINCE_VERSION` or later
(weight 0 before), so earlier versions draw exactly as before and their corpora stay as they are.
A publish's body is `body_for(name, number)`: through the default exchange `name` is the queue
its routing key names, so the order invariants check it there like any publish; through another
exchange it is the exchange's name, which is no queue's, so its copies are only counted.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

from fifo.commands import (
    EXCHANGE_TYPES,
    EXCHANGES_SINCE_VERSION,
    BindExchange,
    BindQueue,
    Command,
    DeclareExchange,
    DeleteExchange,
    HeaderPairs,
    PublishToExchange,
    UnbindExchange,
    UnbindQueue,
)
from fifo.fuzz.prng import SplitMix64
from fifo.fuzz.world import World

# the exchanges the fuzzer declares: name -> (type, auto_delete, internal)
EXCHANGES: dict[str, tuple[str, bool, bool]] = {
    "ex-direct": ("direct", False, False),
    "ex-fanout": ("fanout", False, False),
    "ex-topic": ("topic", False, False),
    "ex-headers": ("headers", False, False),
    "ex-auto": ("fanout", True, False),  # deleted with its last binding
    "ex-inner": ("topic", False, True),  # takes no publish, routes what is bound to it
}
BUILT_INS = ("amq.direct", "amq.fanout", "amq.topic", "amq.match")
ROUTING_KEYS = ("a", "b", "a.b", "a.b.c", "")
BINDING_KEYS = ("a", "b", "a.b", "a.*", "*.b", "#", "a.#", "")
HEADERS: HeaderPairs = (("h", 1), ("k", "v"), ("x-k", "v"))
MATCH_MODES = ("all", "any", "all-with-x", "any-with-x")


def weights(world: World) -> list[tuple[int, str]]:
    """(weight, draw) of the exchange commands for this world: all 0 before v4."""
    if world.version < EXCHANGES_SINCE_VERSION:
        return []
    declared = bool(world.exchanges)
    return [(2 if declared else 4, "declare"), (5, "publish"), (4, "bind"),
            (1 if world.bindings else 0, "unbind"), (1, "delete")]  # fmt: skip


class ExchangeDraws:
    """Draws v4 exchange commands from the seeded PRNG and the world's view."""

    def __init__(self, rng: SplitMix64, world: World, body: Callable[[str, int], bytes]) -> None:
        self.rng = rng
        self.world = world
        self.body = body  # the generator's body_for(name, number)

    def draw(self) -> Command:
        """One exchange command, by the weights of `weights`."""
        kind = self.rng.weighted(weights(self.world))
        draws = {"declare": self.declare, "publish": self.publish, "bind": self.bind,
                 "unbind": self.unbind, "delete": self.delete}  # fmt: skip
        return draws[kind]()

    def exchange(self) -> str:
        """An exchange a client might name: declared, built-in, or (1 in 12) one never
        declared or already gone."""
        rng = self.rng
        if rng.chance(1, 12):
            return rng.choice(list(EXCHANGES))
        known = [*self.world.exchanges, *BUILT_INS]
        return rng.choice(known)

    def declare(self) -> Command:
        """Declare one of the fuzzer's exchanges (1 in 10: with another type or flags, refused
        406 if it exists; 1 in 10 passive)."""
        rng = self.rng
        name = rng.choice(list(EXCHANGES))
        kind, auto_delete, internal = EXCHANGES[name]
        if rng.chance(1, 10):
            kind, auto_delete = rng.choice(EXCHANGE_TYPES), rng.chance(1, 2)
        return DeclareExchange(name, kind, rng.chance(1, 10), auto_delete, internal)

    def arguments(self, name: str) -> HeaderPairs:
        """A binding's arguments: for a headers exchange an x-match mode and some headers."""
        rng = self.rng
        if not name.endswith(("headers", "match")) or rng.chance(1, 6):
            return ()
        chosen = tuple(pair for pair in HEADERS if rng.chance(1, 2))
        return (("x-match", rng.choice(MATCH_MODES)), *chosen) if rng.chance(2, 3) else chosen

    def bind(self) -> Command:
        """Bind a queue to an exchange (1 in 3: an exchange to an exchange; cycles allowed),
        half the time to an exchange the world bound already (so publishes fan out)."""
        rng, world = self.rng, self.world
        source = self.exchange()
        if world.bindings and rng.chance(1, 2):  # one more queue or exchange where one is
            made = rng.choice(world.bindings)
            source = made.exchange if isinstance(made, BindQueue) else made.source
        key = rng.choice(BINDING_KEYS)
        if rng.chance(1, 3) or not world.queues:
            return BindExchange(self.exchange(), source, key, self.arguments(source))
        queues = [q for q in world.queues if q.rpartition(".")[0] not in world.partitioned]
        if not queues or rng.chance(1, 10):
            queues = list(world.queues)  # a partition: refused (it belongs to its base)
        return BindQueue(rng.choice(queues), source, key, self.arguments(source))

    def unbind(self) -> Command:
        """Remove a binding the world saw made (it may be gone already: a no-op)."""
        made = self.rng.choice(self.world.bindings)
        if isinstance(made, BindQueue):
            return UnbindQueue(made.queue, made.exchange, made.routing_key, made.arguments)
        return UnbindExchange(made.destination, made.source, made.routing_key, made.arguments)

    def delete(self) -> Command:
        """Delete a declared exchange, sometimes only if unused (now and then a built-in:
        refused 403)."""
        rng, declared = self.rng, list(self.world.exchanges)
        name = rng.choice(declared) if declared and rng.chance(5, 6) else self.exchange()
        return DeleteExchange(name, rng.chance(1, 3))

    def publish(self) -> Command:
        """Publish through an exchange (1 in 4 the default one, to a queue or to no queue),
        sometimes mandatory, with headers or a TTL."""
        rng, world = self.rng, self.world
        if rng.chance(1, 4):
            exchange = ""
            key = rng.choice(list(world.queues)) if rng.chance(5, 6) else "no-such-queue"
            label = key
        else:
            exchange, key = self.route()
            label = exchange
        headers = tuple(pair for pair in HEADERS if rng.chance(1, 2))
        ttl = rng.between(0, 2000) if rng.chance(1, 8) else None
        return PublishToExchange(exchange, key, self.body(label, world.fresh()), headers,
                                 rng.chance(1, 4), ttl)  # fmt: skip

    def route(self) -> tuple[str, str]:
        """(exchange, routing key) of a publish: 2 in 3 through an exchange the world bound
        (with the binding's own key when it has no wildcard), else any."""
        rng = self.rng
        key = rng.choice(ROUTING_KEYS)
        if not self.world.bindings or rng.chance(1, 3):
            return self.exchange(), key
        made = rng.choice(self.world.bindings)
        exchange = made.exchange if isinstance(made, BindQueue) else made.source
        plain = "*" not in made.routing_key and "#" not in made.routing_key
        return exchange, made.routing_key if plain and rng.chance(2, 3) else key

    def bad_input(self, queue: str) -> list[Command]:
        """Exchange commands the machine must refuse with an Error, changing nothing."""
        return [
            DeclareExchange("", "direct"),
            DeclareExchange("ex-bad", "nope"),
            DeclareExchange("amq.custom", "direct"),
            DeclareExchange("ex-bad", "direct", passive=True),
            DeleteExchange("amq.direct"),
            DeleteExchange("no-such-exchange"),
            BindQueue("no-such-queue", "amq.direct", "k"),
            BindQueue(queue, "no-such-exchange", "k"),
            BindQueue(queue, "", "k"),
            BindQueue(queue, "amq.match", "k", (("x-match", "some"),)),
            BindExchange("no-such-exchange", "amq.fanout"),
            UnbindExchange("amq.fanout", ""),
            PublishToExchange("no-such-exchange", "k", b"x"),
            PublishToExchange("amq.topic", "k", b"x", ttl_ms=-1),
            cast(Command, PublishToExchange("amq.topic", "k", cast(bytes, "not-bytes"))),
            cast(Command, PublishToExchange("amq.match", "k", b"x", cast(Any, (("k",),)))),
        ]

"""Machine v4: replicated exchanges and bindings, routing decided in the publish's apply.

- **Types.** The default exchange ("": the queue named by the routing key, implicit, cannot be
  declared, deleted or bound), `direct` (binding key == routing key), `fanout` (every bound
  queue), `topic` (RabbitMQ's dot-separated words: `*` is exactly one word, `#` zero or more;
  the empty key has no words) and `headers` (the binding's arguments against the message's
  headers: `x-match` `all` (the default) or `any`, keys starting `x-` ignored, or `all-with-x`
  / `any-with-x`, which count them).
- **One entry, several queues.** A publish is matched against the bindings, then stored in each
  matching queue, in queue-name order, as a plain enqueue of this same command: every copy
  refers to this entry's body (`fifo.bodies`), and the entry stays live while any copy does.
- **Built-ins.** RabbitMQ's `amq.direct`, `amq.fanout`, `amq.topic`, `amq.headers` and
  `amq.match` (headers) exist implicitly: a passive declare finds them, declaring one with its
  own type is a no-op, deleting one is refused (403). One is stored in `state.exchanges` when a
  queue is first bound to it; until then it routes nowhere.
- **Exchange-to-exchange bindings.** `BindExchange(destination, source, ...)`: what the source
  matches with that binding goes on through the destination, breadth first, each exchange at
  most once (a cycle ends there), at most `exchanges_per_publish_max` exchanges per publish
  (more: the publish is refused). Deleting an exchange drops the bindings to it.
- **Auto-delete.** An `auto_delete` exchange is deleted when its last binding (to a queue or an
  exchange) goes: unbind, the queue's or the destination's deletion; an auto-delete source
  left without bindings by that goes too (a worklist in name order). An `internal` exchange
  refuses a publish to it (`access_refused`) but routes what a bound exchange sends on.
- **Refusals.** Input errors and `queues_per_publish_max` are refused before anything changes;
  a queue refusing its copy (at its `reject_publish` limit) is named in `Routed.refused` (the
  others keep theirs); a mandatory publish matching no queue answers `Unroutable` (nothing
  stored).
- **Dead-lettering through an exchange.** A queue's `dead_letter_queue` may name an exchange
  and a routing key (`dead_letter_target`: NUL, exchange, NUL, key; a queue of that very name
  wins): its dead letters are routed like a publish with that key (their annotations are a
  headers exchange's headers) into every matching queue but the source (`dead_letter_route`).
- **Determinism.** Matches are collected per queue name and sorted: never set or hash order.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fifo import limits
from fifo import validate as v
from fifo.commands import (
    EXCHANGE_TYPES,
    BindExchange,
    BindQueue,
    DeclareExchange,
    DeleteExchange,
    Enqueue,
    HeaderPairs,
    PublishToExchange,
    UnbindExchange,
    UnbindQueue,
)
from fifo.replies import DeclareOk, Error, Ok, RejectPublish, Reply, Routed, Unroutable
from fifo.shared import OK, Ctx, invalid
from fifo.state import BindingKey, Exchange, Queue, State
from fifo.v4.routing import partitioned_of

if TYPE_CHECKING:
    from fifo.v4.machine import QueueMachine

DEFAULT_EXCHANGE = ""
RESERVED_PREFIX = "amq."
BUILT_IN_EXCHANGES: dict[str, str] = {
    "amq.direct": "direct",
    "amq.fanout": "fanout",
    "amq.headers": "headers",
    "amq.match": "headers",
    "amq.topic": "topic",
}
DEAD_LETTER_MARK = "\x00"  # begins and splits a dead-letter target through an exchange
X_MATCH = "x-match"
X_MATCH_MODES = ("all", "any", "all-with-x", "any-with-x")


# --- matching (pure) ---------------------------------------------------------------------------


def topic_words(key: str) -> list[str]:
    """A topic key's words, as RabbitMQ splits them: "" has none, "a." is ["a", ""]."""
    return key.split(".") if key else []


def topic_matches(pattern: str, routing_key: str) -> bool:
    """Whether a topic binding key matches a routing key (`*` one word, `#` zero or more)."""
    words = topic_words(routing_key)
    reachable = [True] + [False] * len(words)  # reachable[i]: the pattern so far consumed i words
    for part in topic_words(pattern):
        if part == "#":
            first = reachable.index(True) if True in reachable else len(reachable)
            reachable = [i >= first for i in range(len(reachable))]
        else:
            reachable = [False] + [
                reachable[i] and (part == "*" or words[i] == part) for i in range(len(words))
            ]
        if True not in reachable:
            return False
    return reachable[-1]


def headers_match(arguments: HeaderPairs, headers: HeaderPairs) -> bool:
    """Whether a headers binding's arguments match a message's headers (the last pair of a
    repeated header counts). Values match when equal and of the same type."""
    mode = "all"
    for key, value in arguments:
        if key == X_MATCH:
            mode = str(value)
    with_x = mode.endswith("-with-x")
    wanted = [(key, value) for key, value in arguments
              if key != X_MATCH and (with_x or not key.startswith("x-"))]  # fmt: skip
    have = dict(headers)
    hits = (key in have and type(have[key]) is type(value) and have[key] == value
            for key, value in wanted)  # fmt: skip
    return all(hits) if mode.startswith("all") else any(hits)


def binding_matches(exchange_type: str, binding: tuple[str, HeaderPairs],
                    cmd: PublishToExchange) -> bool:  # fmt: skip
    """Whether one binding (key, arguments) of an exchange of `exchange_type` takes `cmd`."""
    key, arguments = binding
    if exchange_type == "fanout":
        return True
    if exchange_type == "direct":
        return key == cmd.routing_key
    if exchange_type == "topic":
        return topic_matches(key, cmd.routing_key)
    return headers_match(arguments, cmd.headers)


def find_exchange(state: State, name: str) -> Exchange | None:
    """The exchange `name`: a declared one, or a built-in never bound (a fresh, unstored one)."""
    exchange = state.exchanges.get(name)
    if exchange is None and name in BUILT_IN_EXCHANGES:
        return Exchange(name, BUILT_IN_EXCHANGES[name])
    return exchange


def exchange_type(state: State, name: str) -> str | None:
    """The type of exchange `name` (declared or built-in), None when there is none."""
    exchange = find_exchange(state, name)
    return None if exchange is None else exchange.exchange_type


class TooManyExchanges(Exception):
    """A publish reached more than `exchanges_per_publish_max` exchanges."""


def route(state: State, cmd: PublishToExchange) -> list[str] | None:
    """The sorted names of the queues `cmd` goes to, or None: no such exchange. Raises
    TooManyExchanges past `exchanges_per_publish_max`."""
    if cmd.exchange == DEFAULT_EXCHANGE:
        return [cmd.routing_key] if cmd.routing_key in state.queues else []
    exchange = find_exchange(state, cmd.exchange)
    return None if exchange is None else _matching(state, exchange, cmd)


def dead_letter_target(exchange: str, routing_key: str) -> str:
    """The `dead_letter_queue` value that dead-letters through `exchange` with `routing_key`."""
    return f"{DEAD_LETTER_MARK}{exchange}{DEAD_LETTER_MARK}{routing_key}"


def dead_letter_exchange(target: str) -> tuple[str, str] | None:
    """(exchange, routing key) of a `dead_letter_target` value, None for a plain queue name."""
    if not target.startswith(DEAD_LETTER_MARK) or DEAD_LETTER_MARK not in target[1:]:
        return None
    exchange, routing_key = target[1:].split(DEAD_LETTER_MARK, 1)
    return exchange, routing_key


def dead_letter_route(state: State, through: tuple[str, str], source: str,
                      annotations: HeaderPairs) -> list[str]:  # fmt: skip
    """The sorted queues a dead letter of `source` goes to through (exchange, routing key):
    none when the exchange is gone; never `source` itself."""
    exchange, routing_key = through
    if exchange == DEFAULT_EXCHANGE:
        names = [routing_key] if routing_key in state.queues else []
    else:
        found = find_exchange(state, exchange)
        publish = PublishToExchange(exchange, routing_key, b"", annotations)
        try:
            names = [] if found is None else _matching(state, found, publish)
        except TooManyExchanges:  # dropped, as when nothing matches (docs/amqp.md)
            names = []
    return [name for name in names if name != source]


def _matching(state: State, start: Exchange, cmd: PublishToExchange) -> list[str]:
    """The sorted queues `cmd` reaches from `start`, through exchange-to-exchange bindings
    breadth first, each exchange once (a cycle ends there). Only insertion-ordered dicts are
    iterated, and the result is sorted: the same on every node."""
    queues: dict[str, None] = {}
    seen: dict[str, None] = {start.name: None}
    frontier = [start]
    while frontier:
        reached: list[Exchange] = []
        for exchange in frontier:
            kind = exchange.exchange_type
            for queue, keys in exchange.bindings.items():
                if any(binding_matches(kind, binding, cmd) for binding in keys):
                    queues[queue] = None
            for name, keys in exchange.exchange_bindings.items():
                if name not in seen and any(binding_matches(kind, b, cmd) for b in keys):
                    seen[name] = None
                    found = find_exchange(state, name)
                    reached += [] if found is None else [found]
        if len(seen) > limits.exchanges_per_publish_max:
            raise TooManyExchanges(len(seen))
        frontier = reached
    return sorted(queues)


# --- validation --------------------------------------------------------------------------------


def pairs_error(value: object, what: str, count_max: int) -> str | None:
    """Check header or argument pairs: at most `count_max` (str, str | int) pairs."""
    if type(value) is not tuple or len(value) > count_max:
        return f"{what} must be a tuple of at most {count_max} pairs"
    if value and (err := v.annotations_error(value)):
        return f"{what}: {err.replace('annotation', 'header')}"
    return None


def key_error(value: object, what: str) -> str | None:
    """Check a routing or binding key: a str of at most `routing_key_bytes_max` bytes."""
    if type(value) is not str or len(value.encode("utf-8", "surrogatepass")) > (
            limits.routing_key_bytes_max):  # fmt: skip
        return f"{what} must be a str of at most {limits.routing_key_bytes_max} bytes"
    return None


def exchange_name_error(name: object) -> str | None:
    """Check a declared exchange's name (non-empty, short)."""
    return v.name_error(name, "exchange", limits.exchange_name_bytes_max)


def binding_error(cmd: BindQueue | UnbindQueue) -> str | None:
    """What is wrong with a bind or unbind's fields, or None."""
    err = v.name_error(cmd.queue, "queue", limits.queue_name_bytes_max)
    if err is None and cmd.exchange != DEFAULT_EXCHANGE:
        err = exchange_name_error(cmd.exchange)
    err = err or key_error(cmd.routing_key, "routing_key")
    return err or pairs_error(cmd.arguments, "arguments", limits.binding_arguments_max)


def exchange_binding_error(cmd: BindExchange | UnbindExchange) -> str | None:
    """What is wrong with an exchange-to-exchange bind or unbind's fields, or None."""
    err = None
    for name in (cmd.destination, cmd.source):
        if err is None and name != DEFAULT_EXCHANGE:
            err = exchange_name_error(name)
    err = err or key_error(cmd.routing_key, "routing_key")
    return err or pairs_error(cmd.arguments, "arguments", limits.binding_arguments_max)


def exchange_binding_source(state: State, cmd: BindExchange | UnbindExchange) -> Exchange | Error:
    """The source exchange of an exchange-to-exchange bind or unbind, or the Error refusing it
    (the default exchange: 403; either exchange missing: 404)."""
    if err := exchange_binding_error(cmd):
        return invalid(err)
    if DEFAULT_EXCHANGE in (cmd.source, cmd.destination):
        return _default_refused("bind to or unbind from")
    if find_exchange(state, cmd.destination) is None:
        return _no_exchange(cmd.destination)
    source = find_exchange(state, cmd.source)
    return _no_exchange(cmd.source) if source is None else source


def publish_error(cmd: PublishToExchange) -> str | None:
    """What is wrong with a publish's fields, or None."""
    err = None
    if cmd.exchange != DEFAULT_EXCHANGE:
        err = exchange_name_error(cmd.exchange)
    err = err or key_error(cmd.routing_key, "routing_key")
    if err is None and (type(cmd.body) is not bytes or len(cmd.body) > limits.body_bytes_max):
        err = f"body must be bytes of at most {limits.body_bytes_max}"
    if err is None and not v.is_bool(cmd.mandatory):
        err = "mandatory must be a bool"
    if err is None and cmd.ttl_ms is not None and not v.int_in(cmd.ttl_ms, 0, limits.ttl_ms_max):
        err = "ttl_ms out of range"
    return err or pairs_error(cmd.headers, "headers", limits.headers_per_publish_max)


def sorted_arguments(arguments: HeaderPairs) -> HeaderPairs:
    """Binding arguments in key order (last pair of a repeated key wins), so equal tables given
    in another order are one binding, as RabbitMQ sorts them."""
    table = dict(arguments)
    return tuple((key, table[key]) for key in sorted(table))


def x_match_error(exchange: Exchange, arguments: HeaderPairs) -> str | None:
    """A headers binding's `x-match` must be one RabbitMQ knows."""
    if exchange.exchange_type != "headers":
        return None
    for key, value in arguments:
        if key == X_MATCH and value not in X_MATCH_MODES:
            return f"Invalid x-match field value {value!r}; expected one of {X_MATCH_MODES}"
    return None


# --- handlers ----------------------------------------------------------------------------------


class Exchanges:
    """Registry-level handlers of v4's exchange commands (declare, delete, bind, unbind,
    publish) over `ctx.state.exchanges`; stores copies through the per-queue machine."""

    def __init__(self, queues: QueueMachine) -> None:
        self.queues = queues

    def declare(self, ctx: Ctx, cmd: DeclareExchange) -> Reply:
        """Create an exchange; the same type again is a no-op, another is refused (406)."""
        if err := exchange_name_error(cmd.exchange):
            return invalid(err)
        if not all(v.is_bool(flag) for flag in (cmd.passive, cmd.auto_delete, cmd.internal)):
            return invalid("passive, auto_delete and internal must be bools")
        existing = find_exchange(ctx.state, cmd.exchange)
        if cmd.passive:
            return DeclareOk(False) if existing is not None else _no_exchange(cmd.exchange)
        if not v.one_of(cmd.exchange_type, EXCHANGE_TYPES):
            return invalid(f"unknown exchange type {cmd.exchange_type!r}; "
                           f"one of {EXCHANGE_TYPES}")  # fmt: skip
        if existing is not None:
            return _redeclared(existing, cmd)
        if cmd.exchange.startswith(RESERVED_PREFIX):
            return Error("access_refused", f"exchange name '{cmd.exchange}' contains reserved "
                         f"prefix '{RESERVED_PREFIX}*'")  # fmt: skip
        if len(ctx.state.exchanges) >= limits.exchanges_max:
            return Error("unsupported", "exchanges_max reached")
        ctx.state.exchanges[cmd.exchange] = Exchange(cmd.exchange, cmd.exchange_type,
                                                     cmd.auto_delete, cmd.internal)  # fmt: skip
        return DeclareOk(True)

    def delete(self, ctx: Ctx, cmd: DeleteExchange) -> Reply:
        """Delete an exchange and its bindings (`if_unused`: only without bindings)."""
        if cmd.exchange == DEFAULT_EXCHANGE:
            return _default_refused("delete")
        if err := exchange_name_error(cmd.exchange):
            return invalid(err)
        if not v.is_bool(cmd.if_unused):
            return invalid("if_unused must be a bool")
        if cmd.exchange.startswith(RESERVED_PREFIX):
            return Error("access_refused", f"deletion of system exchange '{cmd.exchange}' in "
                         "vhost '/' not allowed")  # fmt: skip
        exchange = ctx.state.exchanges.get(cmd.exchange)
        if exchange is None:
            return _no_exchange(cmd.exchange)
        if cmd.if_unused and exchange.has_bindings():
            return Error("exchange_in_use", f"exchange '{cmd.exchange}' in vhost '/' in use")
        _remove_exchange(ctx.state, cmd.exchange)
        return OK

    def bind(self, ctx: Ctx, cmd: BindQueue) -> Reply:
        """Bind a queue (idempotent); the exchange and the queue must exist."""
        found = self.binding_target(ctx.state, cmd)
        if not isinstance(found, Exchange):
            return found
        return _add_binding(ctx.state, found, found.bindings, cmd.queue, cmd)

    def unbind(self, ctx: Ctx, cmd: UnbindQueue) -> Reply:
        """Remove one binding; one that does not exist is a no-op."""
        found = self.binding_target(ctx.state, cmd)
        if not isinstance(found, Exchange):
            return found
        _remove_binding(ctx.state, found, found.bindings, cmd.queue, cmd)
        return OK

    def bind_exchange(self, ctx: Ctx, cmd: BindExchange) -> Reply:
        """Bind exchange to exchange (idempotent); both must exist."""
        source = exchange_binding_source(ctx.state, cmd)
        if not isinstance(source, Exchange):
            return source
        return _add_binding(ctx.state, source, source.exchange_bindings, cmd.destination, cmd)

    def unbind_exchange(self, ctx: Ctx, cmd: UnbindExchange) -> Reply:
        """Remove one exchange-to-exchange binding; one that does not exist is a no-op."""
        source = exchange_binding_source(ctx.state, cmd)
        if not isinstance(source, Exchange):
            return source
        _remove_binding(ctx.state, source, source.exchange_bindings, cmd.destination, cmd)
        return OK

    def binding_target(self, state: State, cmd: BindQueue | UnbindQueue) -> Exchange | Error:
        """The exchange a bind or unbind names, or the Error refusing it."""
        if err := binding_error(cmd):
            return invalid(err)
        if cmd.exchange == DEFAULT_EXCHANGE:
            return _default_refused("bind to or unbind from")
        exchange = find_exchange(state, cmd.exchange)
        if exchange is None:
            return _no_exchange(cmd.exchange)
        if cmd.queue not in state.queues:
            return Error("unknown_queue", f"no queue '{cmd.queue}' in vhost '/'")
        base = partitioned_of(state, cmd.queue)
        if base is not None:
            return Error("unsupported", f"{cmd.queue!r} is a partition of {base!r}: it cannot "
                         "be bound")  # fmt: skip
        return exchange

    def publish(self, ctx: Ctx, cmd: PublishToExchange) -> Reply:
        """Route a publish and store it in every matching queue (one body, N references)."""
        if err := publish_error(cmd):
            return invalid(err)
        if (found := ctx.state.exchanges.get(cmd.exchange)) is not None and found.internal:
            return Error("access_refused", f"cannot publish to internal exchange "
                         f"'{cmd.exchange}' in vhost '/'")  # fmt: skip
        try:
            names = route(ctx.state, cmd)
        except TooManyExchanges:
            return Error("unsupported", "the publish is routed through more than "
                         f"exchanges_per_publish_max ({limits.exchanges_per_publish_max}) "
                         "exchanges")  # fmt: skip
        if names is None:
            return _no_exchange(cmd.exchange)
        if len(names) > limits.queues_per_publish_max:
            return Error("unsupported", f"the publish matches {len(names)} queues, more than "
                         f"queues_per_publish_max ({limits.queues_per_publish_max})")  # fmt: skip
        if not names:
            return Unroutable(cmd.exchange, cmd.routing_key) if cmd.mandatory else Routed(())
        stored: list[str] = []
        refused: list[str] = []
        for name in names:
            queue = ctx.state.queues[name]
            reply = self.store(ctx, queue, cmd)
            (stored if reply.__class__ is Ok else refused).append(name)
        return Routed(tuple(stored), tuple(refused))

    def store(self, ctx: Ctx, queue: Queue, cmd: PublishToExchange) -> Reply:
        """One queue's copy: a plain enqueue whose message refers to this entry's body; refused
        (RejectPublish) by a queue at its x-overflow reject-publish limit."""
        if queue.config.overflow == "reject_publish" and self.at_limit(queue):
            return RejectPublish()
        copy = Enqueue(queue.name, cmd.body, ttl_ms=cmd.ttl_ms)
        return self.queues.handlers[Enqueue](ctx, queue, copy)

    def at_limit(self, queue: Queue) -> bool:
        """Whether `queue` holds max_length waiting messages, or max_bytes, already."""
        length_max, bytes_max = queue.config.max_length, queue.config.max_bytes
        return (length_max is not None and self.queues.waiting_count(queue) >= length_max) or (
            bytes_max is not None and queue.bytes_ready >= bytes_max
        )

    def queue_deleted(self, state: State, queue: str) -> None:
        """A deleted queue's bindings go with it (exchanges in name order), and an auto-delete
        exchange left without bindings with them."""
        for name in sorted(state.exchanges):
            exchange = state.exchanges[name]
            if exchange.bindings.pop(queue, None) is not None:
                _drop_if_unused(state, exchange)


def _add_binding(
    state: State,
    exchange: Exchange,
    table: dict[str, dict[BindingKey, None]],
    target: str,
    cmd: BindQueue | BindExchange,
) -> Reply:
    """Add (routing key, arguments) for `target` to `table`, the exchange's bindings to queues
    or to exchanges; idempotent, within bindings_per_exchange_max."""
    arguments = sorted_arguments(cmd.arguments)
    if err := x_match_error(exchange, arguments):
        return invalid(err)
    keys = table.get(target)
    if keys is not None and (cmd.routing_key, arguments) in keys:
        return OK
    if exchange.binding_count() >= limits.bindings_per_exchange_max:
        return Error("unsupported", "bindings_per_exchange_max reached")
    state.exchanges.setdefault(exchange.name, exchange)  # a built-in's first binding: stored
    table.setdefault(target, {})[(cmd.routing_key, arguments)] = None
    return OK


def _remove_binding(
    state: State,
    exchange: Exchange,
    table: dict[str, dict[BindingKey, None]],
    target: str,
    cmd: UnbindQueue | UnbindExchange,
) -> None:
    """Remove one (routing key, arguments) of `target` from `table`, if there; an auto-delete
    exchange left without bindings goes."""
    keys = table.get(target)
    if keys is not None:
        keys.pop((cmd.routing_key, sorted_arguments(cmd.arguments)), None)
        if not keys:
            del table[target]
            _drop_if_unused(state, exchange)


def _drop_if_unused(state: State, exchange: Exchange) -> None:
    """Delete an auto-delete exchange that just lost its last binding (RabbitMQ's rule)."""
    if exchange.auto_delete and not exchange.has_bindings():
        _remove_exchange(state, exchange.name)


def _remove_exchange(state: State, name: str) -> None:
    """Delete exchange `name` with its bindings and every binding to it; an auto-delete source
    left without bindings goes too (a worklist: each exchange at most once, in name order)."""
    pending = [name]
    while pending:
        current = pending.pop(0)
        if state.exchanges.pop(current, None) is None:
            continue
        for other_name in sorted(state.exchanges):
            other = state.exchanges[other_name]
            if other.exchange_bindings.pop(current, None) is not None and (
                other.auto_delete and not other.has_bindings()
            ):
                pending.append(other_name)


def _redeclared(existing: Exchange, cmd: DeclareExchange) -> Reply:
    """A declare of an existing exchange: a no-op when equivalent, else RabbitMQ's 406."""
    if existing.exchange_type != cmd.exchange_type:
        return _inequivalent(cmd.exchange, "type", cmd.exchange_type, existing.exchange_type)
    for arg, received, current in (("auto_delete", cmd.auto_delete, existing.auto_delete),
                                   ("internal", cmd.internal, existing.internal)):  # fmt: skip
        if received != current:
            return _inequivalent(cmd.exchange, arg, str(received).lower(), str(current).lower())
    return DeclareOk(False)


def _inequivalent(name: str, arg: str, received: str, current: str) -> Error:
    return Error("exchange_exists", f"inequivalent arg '{arg}' for exchange '{name}' in vhost "
                 f"'/': received '{received}' but current is '{current}'")  # fmt: skip


def _no_exchange(name: str) -> Error:
    return Error("unknown_exchange", f"no exchange '{name}' in vhost '/'")


def _default_refused(what: str) -> Error:
    return Error("access_refused", f"operation not permitted on the default exchange ({what})")

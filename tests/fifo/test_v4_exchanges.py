"""Machine v4's replicated exchanges (issue 27): declare, delete, bind, unbind, and a publish
routed by the machine (default, direct, fanout, topic, headers) into every matching queue as one
log entry whose body each copy refers to."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import cbor2
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fifo
from fifo import commands as c
from fifo import limits
from fifo.bodies import BodyMissingError, body_of_command, resolve_effects
from fifo.effects import DeadLettered, Deliver
from fifo.replies import DeclareOk, Error, Ok, Routed, Unroutable
from fifo.state import State, inflate
from fifo.v4.exchanges import (
    dead_letter_exchange,
    dead_letter_target,
    headers_match,
    sorted_arguments,
    topic_matches,
)

CONN = c.ConnectionId("n1", 1, 1)
SPAN = limits.commands_per_entry_max
NEW_COMMANDS: tuple[object, ...] = (
    c.DeclareExchange("x", "fanout"),
    c.DeleteExchange("x"),
    c.BindQueue("q", "x", "k"),
    c.UnbindQueue("q", "x", "k"),
    c.PublishToExchange("x", "k", b"m"),
    c.BindExchange("y", "x", "k"),
    c.UnbindExchange("y", "x", "k"),
)


class Log:
    """Applies commands one per entry and keeps their bodies, as a journal would."""

    def __init__(self, version: int = 4) -> None:
        self.state: State = fifo.init_state(version)
        self.entry = 0
        self.bodies: dict[int, bytes] = {}

    def run(self, command: object) -> tuple[Any, list[Any]]:
        """Apply `command` at the next entry; return (reply, effects)."""
        self.entry += 1
        index = self.entry * SPAN
        body = body_of_command(command)
        if body is not None:
            self.bodies[index] = body
        return fifo.apply(fifo.Meta(index, 1, 1_000, 4), command, self.state)

    def ok(self, command: object) -> Any:
        """Apply `command`, which must not be refused; its reply."""
        reply, _ = self.run(command)
        assert not isinstance(reply, Error), reply
        return reply

    def body_of(self, ref: int) -> bytes:
        if ref not in self.bodies:
            raise BodyMissingError(ref, "not in this log")
        return self.bodies[ref]

    def ready(self) -> dict[str, int]:
        """Queue name -> ready messages."""
        return {name: len(queue.ready) for name, queue in self.state.queues.items()}


def setup(kind: str, queues: tuple[str, ...] = ("a", "b", "c")) -> Log:
    log = Log()
    for name in queues:
        log.ok(c.DeclareQueue(name))
    log.ok(c.DeclareExchange("x", kind))
    return log


def publish(log: Log, key: str, headers: c.HeaderPairs = (), mandatory: bool = False) -> Any:
    return log.ok(c.PublishToExchange("x", key, b"body:" + key.encode(), headers, mandatory))


# --- declare, delete ---------------------------------------------------------------------------


def test_a_declare_creates_once_and_refuses_another_type() -> None:
    """Declaring again with the same type is a no-op; another type is RabbitMQ's 406 text."""
    log = Log()
    assert log.ok(c.DeclareExchange("x", "topic")) == DeclareOk(True)
    assert log.ok(c.DeclareExchange("x", "topic")) == DeclareOk(False)
    reply, _ = log.run(c.DeclareExchange("x", "fanout"))
    assert reply.code == "exchange_exists"
    assert "received 'fanout' but current is 'topic'" in reply.message
    assert log.state.exchanges["x"].exchange_type == "topic"


@pytest.mark.parametrize(
    ("command", "code"),
    [
        (c.DeclareExchange("x", "stream"), "invalid_argument"),
        (c.DeclareExchange("", "direct"), "invalid_argument"),
        (c.DeclareExchange("amq.custom", "direct"), "access_refused"),
        (c.DeclareExchange("nope", "direct", passive=True), "unknown_exchange"),
        (c.DeclareExchange("x" * 256, "direct"), "invalid_argument"),
        (c.DeleteExchange("nope"), "unknown_exchange"),
        (c.DeleteExchange(""), "access_refused"),
        (c.BindQueue("a", "", "a"), "access_refused"),
        (c.BindQueue("a", "nope", "k"), "unknown_exchange"),
        (c.BindQueue("nope", "x", "k"), "unknown_queue"),
        (c.BindQueue("a", "x", "k" * 256), "invalid_argument"),
        (c.PublishToExchange("nope", "k", b"m"), "unknown_exchange"),
        (c.PublishToExchange("x", "k", "text"), "invalid_argument"),  # type: ignore[arg-type]
        (c.PublishToExchange("x", "k", b"m", (("h", 1.5),)), "invalid_argument"),  # type: ignore[arg-type]
    ],
)
def test_refusals_name_their_cause_and_change_nothing(command: object, code: str) -> None:
    """Each refusal has its code and leaves the state as it was."""
    log = setup("direct")
    before = fifo.digest(log.state)
    reply, effects = log.run(command)
    assert isinstance(reply, Error) and reply.code == code, reply
    assert effects == [] and fifo.digest(log.state) == before


def test_a_passive_declare_checks_existence_only() -> None:
    """Passive declare of an existing exchange succeeds whatever type it names."""
    log = setup("topic")
    assert log.ok(c.DeclareExchange("x", "direct", passive=True)) == DeclareOk(False)


BUILT_INS = [("amq.direct", "direct"), ("amq.fanout", "fanout"), ("amq.topic", "topic"),
             ("amq.headers", "headers"), ("amq.match", "headers")]  # fmt: skip


@pytest.mark.parametrize(("name", "kind"), BUILT_INS)
def test_built_in_exchanges_exist_implicitly_and_cannot_be_deleted(name: str, kind: str) -> None:
    """RabbitMQ's amq.* exchanges: passive declare finds them, their own type is a no-op,
    another type is 406, deleting is 403; nothing is stored until a queue is bound."""
    log = Log()
    assert log.ok(c.DeclareExchange(name, "direct", passive=True)) == DeclareOk(False)
    assert log.ok(c.DeclareExchange(name, kind)) == DeclareOk(False)
    other = "fanout" if kind != "fanout" else "topic"
    reply, _ = log.run(c.DeclareExchange(name, other))
    assert reply.code == "exchange_exists" and f"current is '{kind}'" in reply.message
    for if_unused in (False, True):
        reply, _ = log.run(c.DeleteExchange(name, if_unused))
        assert reply.code == "access_refused"
        assert reply.message == f"deletion of system exchange '{name}' in vhost '/' not allowed"
    assert log.ok(c.PublishToExchange(name, "k", b"m")) == Routed(())
    assert log.state.exchanges == {}


def test_built_in_exchanges_route_once_bound_and_survive_snapshots() -> None:
    """A queue bound to amq.topic / amq.match gets what matches; the state restores equal."""
    log = Log()
    for name in ("a", "b"):
        log.ok(c.DeclareQueue(name))
    log.ok(c.BindQueue("a", "amq.topic", "log.#"))
    log.ok(c.BindQueue("b", "amq.match", "", (("x-match", "any"), ("k", 1))))
    assert log.ok(c.PublishToExchange("amq.topic", "log.x", b"m")) == Routed(("a",))
    assert log.ok(c.PublishToExchange("amq.match", "", b"m", (("k", 1),))) == Routed(("b",))
    reply, _ = log.run(c.PublishToExchange("amq.fanout", "", b"m", mandatory=True))
    assert reply == Unroutable("amq.fanout", "")
    assert list(log.state.exchanges) == ["amq.topic", "amq.match"]
    log.ok(c.UnbindQueue("a", "amq.topic", "log.#"))
    log.ok(c.UnbindQueue("a", "amq.direct", "never-bound"))
    reply, _ = log.run(c.DeleteExchange("amq.topic"))
    assert reply.code == "access_refused"
    restored = fifo.restore(fifo.snapshot(log.state))
    assert fifo.digest(restored) == fifo.digest(log.state)


def test_delete_if_unused_refuses_while_bound_and_delete_drops_bindings() -> None:
    """if-unused is refused with bindings (406); a plain delete removes them with it."""
    log = setup("fanout")
    log.ok(c.BindQueue("a", "x"))
    reply, _ = log.run(c.DeleteExchange("x", if_unused=True))
    assert reply.code == "exchange_in_use"
    log.ok(c.DeleteExchange("x"))
    assert log.state.exchanges == {}
    log.ok(c.DeclareExchange("x", "fanout"))
    assert publish(log, "k") == Routed(())


def test_an_auto_delete_exchange_goes_with_its_last_binding() -> None:
    """RabbitMQ's auto-delete: kept until it had a binding and lost the last one (by unbind or
    by the queue's deletion); declared again with another auto_delete it is 406; it survives a
    snapshot with its flag."""
    log = setup("direct")
    log.ok(c.DeclareExchange("x2", "fanout", auto_delete=True))
    reply, _ = log.run(c.DeclareExchange("x2", "fanout"))
    assert reply.code == "exchange_exists" and "inequivalent arg 'auto_delete'" in reply.message
    log.ok(c.BindQueue("a", "x2"))
    log.ok(c.BindQueue("b", "x2"))
    restored = fifo.restore(fifo.snapshot(log.state))
    assert restored.exchanges["x2"].auto_delete and fifo.digest(restored) == fifo.digest(log.state)
    log.ok(c.UnbindQueue("a", "x2"))
    assert "x2" in log.state.exchanges
    log.ok(c.DeleteQueue("b"))
    assert list(log.state.exchanges) == ["x"]
    log.ok(c.DeclareExchange("x2", "fanout", auto_delete=True))
    log.ok(c.BindQueue("a", "x2"))
    log.ok(c.UnbindQueue("a", "x2"))
    assert list(log.state.exchanges) == ["x"]
    log.ok(c.BindQueue("a", "x"))
    log.ok(c.UnbindQueue("a", "x"))
    assert list(log.state.exchanges) == ["x"]  # not auto-delete: kept without bindings


def test_an_internal_exchange_takes_no_publish_but_routes_from_a_bound_exchange() -> None:
    """RabbitMQ's internal exchange: a publish to it is refused (403, nothing stored); one
    routed into it through an exchange binding goes on; re-declared not internal: 406."""
    log = setup("fanout")
    log.ok(c.DeclareExchange("in", "fanout", internal=True))
    reply, _ = log.run(c.DeclareExchange("in", "fanout"))
    assert reply.code == "exchange_exists" and "inequivalent arg 'internal'" in reply.message
    log.ok(c.BindQueue("a", "in"))
    reply, _ = log.run(c.PublishToExchange("in", "k", b"m"))
    assert reply.code == "access_refused"
    assert reply.message == "cannot publish to internal exchange 'in' in vhost '/'"
    log.ok(c.BindExchange("in", "x"))
    assert publish(log, "k") == Routed(("a",))
    restored = fifo.restore(fifo.snapshot(log.state))
    assert restored.exchanges["in"].internal and fifo.digest(restored) == fifo.digest(log.state)


def test_deleting_a_queue_removes_its_bindings() -> None:
    """A deleted queue's bindings go; a queue declared again under its name is not bound."""
    log = setup("fanout")
    log.ok(c.BindQueue("a", "x"))
    log.ok(c.BindQueue("b", "x"))
    log.ok(c.DeleteQueue("a"))
    assert list(log.state.exchanges["x"].bindings) == ["b"]
    log.ok(c.DeclareQueue("a"))
    assert publish(log, "k") == Routed(("b",))


def test_binding_is_idempotent_and_unbinding_removes_exactly_one() -> None:
    """The same binding twice is one; argument order does not make another; unbind of a binding
    that does not exist is a no-op."""
    log = setup("direct")
    log.ok(c.BindQueue("a", "x", "k", (("p", 1), ("q", "v"))))
    log.ok(c.BindQueue("a", "x", "k", (("q", "v"), ("p", 1))))
    log.ok(c.BindQueue("a", "x", "j"))
    assert log.state.exchanges["x"].binding_count() == 2
    log.ok(c.UnbindQueue("a", "x", "zz"))
    log.ok(c.UnbindQueue("a", "x", "k", (("q", "v"), ("p", 1))))
    assert publish(log, "k") == Routed(())
    assert publish(log, "j") == Routed(("a",))
    log.ok(c.UnbindQueue("a", "x", "j"))
    assert log.state.exchanges["x"].bindings == {}


def test_the_limits_refuse_cleanly(monkeypatch: pytest.MonkeyPatch) -> None:
    """exchanges_max, bindings_per_exchange_max and queues_per_publish_max refuse, unchanged."""
    monkeypatch.setattr(limits, "exchanges_max", 1)
    monkeypatch.setattr(limits, "bindings_per_exchange_max", 2)
    monkeypatch.setattr(limits, "queues_per_publish_max", 1)
    log = setup("fanout")
    assert log.run(c.DeclareExchange("y", "fanout"))[0].code == "unsupported"
    log.ok(c.BindQueue("a", "x"))
    log.ok(c.BindQueue("b", "x"))
    assert log.run(c.BindQueue("c", "x"))[0].code == "unsupported"
    before = fifo.digest(log.state)
    reply, _ = log.run(c.PublishToExchange("x", "k", b"m"))
    assert reply.code == "unsupported" and "queues_per_publish_max" in reply.message
    assert fifo.digest(log.state) == before


# --- routing per type --------------------------------------------------------------------------


def test_the_default_exchange_routes_to_the_queue_named_by_the_key() -> None:
    """The default exchange ("") is implicit: the routing key names the queue (none: unroutable)."""
    log = setup("direct")
    assert log.ok(c.PublishToExchange("", "b", b"m")) == Routed(("b",))
    assert log.ok(c.PublishToExchange("", "zz", b"m", mandatory=True)) == Unroutable("", "zz")
    assert log.ready() == {"a": 0, "b": 1, "c": 0}


def test_direct_routes_on_equal_keys() -> None:
    """A direct exchange stores in each queue bound with the routing key, once per queue."""
    log = setup("direct")
    log.ok(c.BindQueue("a", "x", "red"))
    log.ok(c.BindQueue("b", "x", "red"))
    log.ok(c.BindQueue("b", "x", "blue"))
    log.ok(c.BindQueue("c", "x", "blue", (("other", 1),)))
    assert publish(log, "red") == Routed(("a", "b"))
    assert publish(log, "blue") == Routed(("b", "c"))
    assert publish(log, "green") == Routed(())
    assert log.ready() == {"a": 1, "b": 2, "c": 1}


def test_fanout_routes_to_every_bound_queue_whatever_the_key() -> None:
    """A fanout exchange stores in every bound queue, once each."""
    log = setup("fanout", ("a", "b", "c", "d"))
    for name in ("c", "a", "b"):
        log.ok(c.BindQueue(name, "x", name))
    assert publish(log, "anything") == Routed(("a", "b", "c"))
    assert log.ready() == {"a": 1, "b": 1, "c": 1, "d": 0}


@pytest.mark.parametrize(
    ("pattern", "key", "matches"),
    [
        ("a.b", "a.b", True), ("a.b", "a.c", False), ("a.*", "a.b", True),
        ("a.*", "a", False), ("a.*", "a.b.c", False), ("a.#", "a", True),
        ("a.#", "a.b.c", True), ("#", "", True), ("*", "", False), ("#.b", "b", True),
        ("#.b", "a.a.b", True), ("#.b.#", "x.b", True), ("*.b.#", "b", False),
        ("a.#.z", "a.z", True), ("a.#.z", "a.b.c.z", True), ("a.#.z", "a.b.c", False),
        ("", "", True), ("", "a", False), ("*", "a.", False), ("*.*", "a.", True),
        ("#.#", "a.b", True), ("a.*.#", "a", False),
    ],
)  # fmt: skip
def test_topic_words_match_as_rabbitmq(pattern: str, key: str, matches: bool) -> None:
    """`*` is one word, `#` zero or more; words are split on dots ("" has none)."""
    assert topic_matches(pattern, key) is matches


def test_topic_routes_through_the_machine() -> None:
    """A topic exchange stores in every queue one of whose patterns matches."""
    log = setup("topic")
    log.ok(c.BindQueue("a", "x", "orders.*.created"))
    log.ok(c.BindQueue("b", "x", "orders.#"))
    log.ok(c.BindQueue("c", "x", "*.eu.*"))
    assert publish(log, "orders.eu.created") == Routed(("a", "b", "c"))
    assert publish(log, "orders") == Routed(("b",))
    assert publish(log, "billing.eu.paid") == Routed(("c",))


@pytest.mark.parametrize(
    ("arguments", "headers", "matches"),
    [
        ((("format", "pdf"), ("type", "report")), (("format", "pdf"), ("type", "report")), True),
        ((("format", "pdf"), ("type", "report")), (("format", "pdf"),), False),
        ((("format", "pdf"), ("type", "report"), ("x-match", "any")), (("format", "pdf"),), True),
        ((("x-match", "any"),), (("format", "pdf"),), False),
        ((), (("format", "pdf"),), True),
        ((("n", 1),), (("n", "1"),), False),
        ((("n", 1),), (("n", 2), ("n", 1)), True),
        ((("x-k", 1),), (), True),
        ((("x-k", 1), ("x-match", "all-with-x")), (), False),
        ((("x-k", 1), ("x-match", "any-with-x")), (("x-k", 1),), True),
    ],
)
def test_headers_match_all_and_any(
    arguments: c.HeaderPairs, headers: c.HeaderPairs, matches: bool
) -> None:
    """x-match all (default) needs every argument, any one of them; x- keys are skipped unless
    -with-x; values match by type and value; the last repeated header counts."""
    assert headers_match(arguments, headers) is matches


def test_headers_routes_through_the_machine_and_checks_x_match() -> None:
    """A headers exchange routes on the publish's headers; an unknown x-match is refused."""
    log = setup("headers")
    log.ok(c.BindQueue("a", "x", "", (("x-match", "all"), ("format", "pdf"), ("size", 2))))
    log.ok(c.BindQueue("b", "x", "", (("x-match", "any"), ("format", "pdf"), ("size", 2))))
    assert publish(log, "", (("format", "pdf"), ("size", 2))) == Routed(("a", "b"))
    assert publish(log, "", (("size", 2),)) == Routed(("b",))
    assert log.run(c.BindQueue("c", "x", "", (("x-match", "some"),)))[0].code == (
        "invalid_argument")  # fmt: skip


def test_a_mandatory_unroutable_publish_is_returned_and_stores_nothing() -> None:
    """Mandatory and no match: `Unroutable` (basic.return); not mandatory: dropped, Routed(())."""
    log = setup("direct")
    before = fifo.digest(log.state)
    assert publish(log, "k", mandatory=True) == Unroutable("x", "k")
    assert publish(log, "k") == Routed(())
    assert fifo.digest(log.state) == before and log.bodies and fifo.live_entry_indexes(
        log.state) == []  # fmt: skip


# --- one entry, one body, several queues -------------------------------------------------------


def test_one_publish_is_one_entry_referred_to_by_every_copy() -> None:
    """Each queue's copy refers to the publish's one entry; settling one copy leaves the entry
    live and the other copies' bodies intact; it is released when the last copy goes."""
    log = setup("fanout")
    for name in ("a", "b", "c"):
        log.ok(c.BindQueue(name, "x"))
    publish(log, "k")
    entry = log.entry
    refs = {inflate(log.state.queues[name].ready[0]).ref for name in ("a", "b", "c")}
    assert refs == {entry * SPAN} and fifo.live_entry_indexes(log.state) == [entry]
    key = log.ok(c.Checkout("a", c.ConsumerId("t", CONN), c.SimplePrefetch(5))).consumer_key
    assert isinstance(log.ok(c.Settle("a", key, (0,))), Ok)
    assert len(log.state.queues["a"].ready) == 0 and log.state.queues["a"].messages_total == 0
    assert fifo.live_entry_indexes(log.state) == [entry]
    log.ok(c.Checkout("b", c.ConsumerId("t", CONN), c.SimplePrefetch(5)))
    _, effects = log.run(c.Checkout("c", c.ConsumerId("t", CONN), c.SimplePrefetch(5)))
    delivered = [e for e in resolve_effects(effects, log.body_of) if isinstance(e, Deliver)]
    assert [m.body for m in delivered[0].messages] == [b"body:k"]
    log.ok(c.Purge("b"))
    assert fifo.live_entry_indexes(log.state) == [entry]  # b's copy is checked out, c's too
    log.ok(c.DeleteQueue("b"))
    log.ok(c.DeleteQueue("c"))
    assert fifo.live_entry_indexes(log.state) == []


def dead_letter_log(kind: str, key: str) -> Log:
    """Queue "src" dead-letters through exchange "dlx" (of `kind`) with routing key `key`;
    queues a, b, c exist; the test binds them."""
    log = setup(kind)
    log.ok(c.DeclareExchange("dlx", kind))
    target = dead_letter_target("dlx", key)
    log.ok(c.DeclareQueue("src", c.QueueConfig(dead_letter_queue=target)))
    return log


def reject_one(log: Log, body: bytes = b"job") -> list[Any]:
    """Publish `body` to src, take it and discard it (a nack without requeue); the effects."""
    log.ok(c.Enqueue("src", body))
    key = log.ok(c.Checkout("src", c.ConsumerId("r", CONN), c.SimplePrefetch(1))).consumer_key
    msg_id = max(log.state.queues["src"].consumers[key].checked_out)
    _, effects = log.run(c.Discard("src", key, (msg_id,)))
    return effects


def test_dead_lettering_through_an_exchange_routes_with_the_configured_key() -> None:
    """x-dead-letter-exchange + routing key: the message goes to every queue bound to match
    the key (one body, refs), with why and from where; one DeadLettered effect per queue."""
    log = dead_letter_log("topic", "dead.src")
    log.ok(c.BindQueue("a", "dlx", "dead.#"))
    log.ok(c.BindQueue("b", "dlx", "*.src"))
    log.ok(c.BindQueue("c", "dlx", "alive.#"))
    effects = reject_one(log)
    assert log.ready() == {"a": 1, "b": 1, "c": 0, "src": 0}
    copy = inflate(log.state.queues["a"].ready[0])
    assert ("x-death-reason", "rejected") in copy.annotations
    assert ("x-death-queue", "src") in copy.annotations
    dead = [e for e in effects if isinstance(e, DeadLettered)]
    assert dead == [
        DeadLettered("src", "rejected", 1, "a"),
        DeadLettered("src", "rejected", 1, "b"),
    ]
    assert log.state.queues["src"].messages_total == 0


def test_dead_lettering_to_no_bound_queue_or_a_missing_exchange_drops() -> None:
    """Nothing bound to match, or the exchange deleted: the message is dropped (RabbitMQ's
    unroutable dead letter), counted once without a target."""
    log = dead_letter_log("direct", "k")
    log.ok(c.BindQueue("a", "dlx", "other"))
    effects = reject_one(log)
    assert [e for e in effects if isinstance(e, DeadLettered)] == [
        DeadLettered("src", "rejected", 1, None)
    ]
    log.ok(c.DeleteExchange("dlx"))
    effects = reject_one(log)
    assert [e for e in effects if isinstance(e, DeadLettered)] == [
        DeadLettered("src", "rejected", 1, None)
    ]
    assert log.ready() == {"a": 0, "b": 0, "c": 0, "src": 0}


def test_a_queue_never_dead_letters_into_itself_through_an_exchange() -> None:
    """The source bound to its own dead-letter exchange gets no copy (as a dead_letter_queue
    naming itself is refused); the other bound queues do."""
    log = dead_letter_log("fanout", "")
    log.ok(c.BindQueue("src", "dlx"))
    log.ok(c.BindQueue("a", "dlx"))
    reject_one(log)
    assert log.ready() == {"a": 1, "b": 0, "c": 0, "src": 0}


def test_a_queue_named_like_a_dead_letter_target_wins() -> None:
    """The target form cannot be mistaken: a queue of exactly that name is the target."""
    log = dead_letter_log("fanout", "")
    log.ok(c.BindQueue("a", "dlx"))
    log.ok(c.DeclareQueue(dead_letter_target("dlx", "")))
    reject_one(log)
    assert log.ready()["a"] == 0 and log.ready()[dead_letter_target("dlx", "")] == 1
    assert dead_letter_exchange("plain-queue") is None
    assert dead_letter_exchange(dead_letter_target("d.x", "a\x00b")) == ("d.x", "a\x00b")


def test_a_queue_at_its_reject_publish_limit_refuses_its_copy_only() -> None:
    """x-overflow reject-publish: a queue at max_length (or max_bytes) refuses the copy, named
    in `refused` (the publisher's nack); the other matching queues store theirs."""
    log = Log()
    log.ok(c.DeclareQueue("a"))
    limited = c.QueueConfig(max_length=1, overflow="reject_publish")
    log.ok(c.DeclareQueue("full", limited))
    log.ok(c.DeclareQueue("bytes", c.QueueConfig(max_bytes=3, overflow="reject_publish")))
    log.ok(c.DeclareExchange("x", "fanout"))
    for name in ("a", "full", "bytes"):
        log.ok(c.BindQueue(name, "x"))
    assert publish(log, "k") == Routed(("a", "bytes", "full"))
    assert publish(log, "k") == Routed(("a",), ("bytes", "full"))
    assert log.ready() == {"a": 2, "full": 1, "bytes": 1}


def test_a_copy_to_a_waiting_consumer_carries_the_body_in_hand() -> None:
    """A copy handed straight to a consumer delivers the publish's body."""
    log = setup("fanout", ("a", "b"))
    log.ok(c.BindQueue("a", "x"))
    log.ok(c.BindQueue("b", "x"))
    log.ok(c.Checkout("a", c.ConsumerId("t", CONN), c.SimplePrefetch(5)))
    _, effects = log.run(c.PublishToExchange("x", "k", b"hello"))
    delivered = [e for e in resolve_effects(effects, log.body_of) if isinstance(e, Deliver)]
    assert [(d.queue, [m.body for m in d.messages]) for d in delivered] == [("a", [b"hello"])]
    assert log.ready() == {"a": 0, "b": 1}


# --- versions, snapshots, determinism ----------------------------------------------------------


@pytest.mark.parametrize("version", [1, 2, 3])
@pytest.mark.parametrize("command", NEW_COMMANDS, ids=lambda cmd: type(cmd).__name__)
def test_machines_before_v4_refuse_the_exchange_commands(version: int, command: object) -> None:
    """v1-v3 answer `unknown_command` and change nothing."""
    log = Log(version)
    log.ok(c.DeclareQueue("q"))
    before = fifo.digest(log.state)
    reply, effects = log.run(command)
    assert isinstance(reply, Error) and reply.code == "unknown_command", reply
    assert effects == [] and fifo.digest(log.state) == before


def test_the_v3_to_v4_conversion_keeps_the_state_and_adds_no_exchange() -> None:
    """A converted v3 state has its queues and messages and no exchange; it then takes them."""
    log = Log(3)
    log.ok(c.DeclareQueue("q"))
    log.ok(c.Enqueue("q", b"old"))
    state = fifo.convert(log.state, 3, 4, fifo.Meta(100 * SPAN, 1, 0, 4))
    assert state.exchanges == {} and len(state.queues["q"].ready) == 1
    assert len(cbor2.loads(fifo.snapshot(state))) == 4  # no exchange element is written
    reply, _ = fifo.apply(fifo.Meta(101 * SPAN, 1, 0, 4), c.DeclareExchange("x", "fanout"), state)
    assert reply == DeclareOk(True)


def test_a_snapshot_with_exchanges_restores_to_the_same_digest() -> None:
    """Exchanges and bindings (with arguments) survive snapshot and restore exactly."""
    log = setup("headers")
    log.ok(c.BindQueue("b", "x", "k", (("x-match", "any"), ("n", 1))))
    log.ok(c.BindQueue("a", "x", "j"))
    log.ok(c.DeclareExchange("t", "topic"))
    restored = fifo.restore(fifo.snapshot(log.state))
    assert fifo.digest(restored) == fifo.digest(log.state)
    assert restored.exchanges["x"].bindings == log.state.exchanges["x"].bindings
    assert list(restored.exchanges) == ["x", "t"]


def test_the_digest_is_the_same_in_processes_with_other_hash_seeds() -> None:
    """Equal logs with exchanges (exchange-to-exchange bindings and a cycle too) give equal
    digests whatever PYTHONHASHSEED."""
    script = (
        "import fifo\nfrom fifo import commands as c\ns = fifo.init_state(4)\n"
        "cmds = [c.DeclareExchange('t', 'topic'), c.DeclareExchange('h', 'headers'),\n"
        "        c.DeclareExchange('f', 'fanout', auto_delete=True), c.BindExchange('t', 'f'),\n"
        "        c.BindExchange('h', 't', 'k.1.#'), c.BindExchange('f', 'h')]\n"
        "for n in range(20):\n"
        "    cmds += [c.DeclareQueue(f'q{n}'), c.BindQueue(f'q{n}', 't', f'k.{n % 3}.#'),\n"
        "             c.BindQueue(f'q{n}', 'h', '', (('a', n % 2), ('x-match', 'any'))),\n"
        "             c.BindQueue(f'q{n}', f'amq.{\"topic\" if n % 2 else \"fanout\"}', 'k.#')]\n"
        "for n in range(30):\n"
        "    cmds += [c.PublishToExchange('t', f'k.{n % 4}.z', b'm'),\n"
        "             c.PublishToExchange('amq.topic', f'k.{n}', b't'),\n"
        "             c.PublishToExchange('h', '', b'h', (('a', n % 3),)),\n"
        "             c.PublishToExchange('f', f'k.{n % 3}.z', b'f', (('a', n % 2),))]\n"
        "for i, cmd in enumerate(cmds):\n"
        "    r, _ = fifo.apply(fifo.Meta((i + 1) * 1024, 1, 1, 4), cmd, s)\n"
        "    assert type(r).__name__ != 'Error', r\n"
        "print(fifo.digest(s))\n"
    )
    runs = [
        subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       check=True, env={**os.environ, "PYTHONHASHSEED": seed})
        for seed in ("1", "2", "3")
    ]  # fmt: skip
    assert len({run.stdout for run in runs}) == 1 and runs[0].stdout.strip()


# --- exchange-to-exchange bindings ------------------------------------------------------------


def test_an_exchange_bound_to_an_exchange_routes_on_through_it() -> None:
    """x (topic) -> y (fanout) -> queues: y's queues get what x's binding matches, once each
    (a queue reached twice gets one copy); unbinding stops it."""
    log = setup("topic")
    log.ok(c.DeclareExchange("y", "fanout"))
    log.ok(c.BindExchange("y", "x", "log.#"))
    log.ok(c.BindQueue("a", "y"))
    log.ok(c.BindQueue("b", "y"))
    log.ok(c.BindQueue("a", "x", "log.*"))
    assert publish(log, "log.a") == Routed(("a", "b"))
    assert publish(log, "log.a.b") == Routed(("a", "b"))
    assert publish(log, "other") == Routed(())
    assert log.ready() == {"a": 2, "b": 2, "c": 0}
    log.ok(c.UnbindExchange("y", "x", "log.#"))
    assert publish(log, "log.a.b") == Routed(())


def test_cycles_are_walked_once_and_long_chains_are_refused(monkeypatch: Any) -> None:
    """x -> y -> x is a cycle: each exchange is visited once. A publish that reaches more
    exchanges than exchanges_per_publish_max is refused, nothing stored."""
    log = setup("fanout")
    log.ok(c.DeclareExchange("y", "fanout"))
    log.ok(c.BindExchange("y", "x"))
    log.ok(c.BindExchange("x", "y"))
    log.ok(c.BindExchange("x", "x"))
    log.ok(c.BindQueue("c", "y"))
    assert publish(log, "k") == Routed(("c",))
    monkeypatch.setattr(limits, "exchanges_per_publish_max", 1)
    reply, _ = log.run(c.PublishToExchange("x", "k", b"m"))
    assert reply.code == "unsupported" and "exchanges_per_publish_max" in reply.message
    assert log.ready() == {"a": 0, "b": 0, "c": 1}


def test_exchange_binding_refusals_and_idempotence() -> None:
    """Missing exchanges are 404s, the default exchange 403; the same binding twice is one."""
    log = setup("direct")
    log.ok(c.DeclareExchange("y", "direct"))
    for command, code in (
        (c.BindExchange("nope", "x"), "unknown_exchange"),
        (c.BindExchange("y", "nope"), "unknown_exchange"),
        (c.BindExchange("", "x"), "access_refused"),
        (c.BindExchange("y", ""), "access_refused"),
        (c.UnbindExchange("y", "nope"), "unknown_exchange"),
    ):
        reply, _ = log.run(command)
        assert reply.code == code, (command, reply)
    log.ok(c.BindExchange("y", "x", "k"))
    log.ok(c.BindExchange("y", "x", "k"))
    assert log.state.exchanges["x"].binding_count() == 1
    log.ok(c.UnbindExchange("y", "x", "other"))  # not bound: a no-op
    assert log.state.exchanges["x"].binding_count() == 1


def test_deleting_an_exchange_drops_bindings_to_it_and_auto_deletes_cascade() -> None:
    """Deleting y removes x's binding to y; x, auto-delete, had only that one: it goes too.
    if_unused counts exchange bindings."""
    log = setup("fanout")
    log.ok(c.DeclareExchange("auto", "fanout", auto_delete=True))
    log.ok(c.DeclareExchange("y", "fanout"))
    log.ok(c.BindExchange("y", "auto"))
    reply, _ = log.run(c.DeleteExchange("auto", if_unused=True))
    assert reply.code == "exchange_in_use"
    log.ok(c.DeleteExchange("y"))
    assert list(log.state.exchanges) == ["x"]


def test_exchange_bindings_survive_snapshots_and_dead_letters_follow_them() -> None:
    """A dead letter through x follows x's exchange bindings; a snapshot keeps them exactly."""
    log = Log()
    log.ok(c.DeclareQueue("dead"))
    log.ok(c.DeclareExchange("x", "direct"))
    log.ok(c.DeclareExchange("y", "topic"))
    log.ok(c.BindExchange("y", "x", "dl"))
    log.ok(c.BindQueue("dead", "y", "#"))
    log.ok(c.DeclareQueue("src", c.QueueConfig(dead_letter_queue=dead_letter_target("x", "dl"))))
    restored = fifo.restore(fifo.snapshot(log.state))
    assert fifo.digest(restored) == fifo.digest(log.state)
    assert restored.exchanges["x"].exchange_bindings == {"y": {("dl", ()): None}}
    reject_one(log)
    assert log.ready()["dead"] == 1


# --- a property against a tiny model of RabbitMQ's routing ------------------------------------


def model_topic(pattern: list[str], words: list[str]) -> bool:
    """RabbitMQ's topic match, written as the plain recursion over words (not the DP)."""
    if not pattern:
        return not words
    if pattern[0] == "#":
        return model_topic(pattern[1:], words) or (bool(words) and model_topic(pattern, words[1:]))
    if words and pattern[0] in ("*", words[0]):
        return model_topic(pattern[1:], words[1:])
    return False


def model_routes(kind: str, bindings: set[tuple[str, str, c.HeaderPairs]], key: str,
                 headers: c.HeaderPairs) -> set[str]:  # fmt: skip
    """The queues a publish reaches in the model: a set of (queue, key, arguments) bindings."""

    def split(text: str) -> list[str]:
        return text.split(".") if text else []

    last = dict(headers)
    out = set()
    for queue, binding_key, arguments in bindings:
        if kind == "direct":
            hit = binding_key == key
        elif kind == "fanout":
            hit = True
        elif kind == "topic":
            hit = model_topic(split(binding_key), split(key))
        else:
            table = dict(arguments)
            mode = table.pop("x-match", "all")
            checks = [k in last and last[k] == value for k, value in table.items()]
            hit = all(checks) if mode == "all" else any(checks)
        if hit:
            out.add(queue)
    return out


WORD = st.sampled_from(["a", "b", ""])
PATTERN_WORD = st.sampled_from(["a", "b", "*", "#"])
QUEUE = st.sampled_from(["q1", "q2", "q3"])
PAIRS = st.lists(st.tuples(st.sampled_from(["h1", "h2"]), st.sampled_from(["v", "w"])),
                 max_size=2).map(tuple)  # fmt: skip
PATTERN = st.lists(PATTERN_WORD, max_size=3).map(".".join)
MODE = st.sampled_from(["all", "any"])
OP = st.one_of(
    st.tuples(st.just("bind"), QUEUE, PATTERN, PAIRS, MODE),
    st.tuples(st.just("unbind"), QUEUE, PATTERN, PAIRS, MODE),
    st.tuples(st.just("publish"), st.lists(WORD, max_size=3).map(".".join), PAIRS),
    st.tuples(st.just("publish"), st.lists(WORD, max_size=3).map(".".join), PAIRS),
    st.tuples(st.just("delete"), QUEUE),
)


@pytest.mark.parametrize("kind", ["direct", "fanout", "topic", "headers"])
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(OP, max_size=30))
def test_routing_agrees_with_a_model_of_rabbitmq(kind: str, ops: list[tuple[Any, ...]]) -> None:
    """Random binds, unbinds, queue deletions and publishes: the queues each publish is stored in
    (read from the state) are the model's, and every copy refers to that publish's entry."""
    log = setup(kind, ("q1", "q2", "q3"))
    bindings: set[tuple[str, str, c.HeaderPairs]] = set()
    for op in ops:
        if op[0] in ("bind", "unbind"):
            _, queue, key, pairs, mode = op
            arguments = sorted_arguments((*pairs, ("x-match", mode)))
            command = (c.BindQueue if op[0] == "bind" else c.UnbindQueue)(
                queue, "x", key, arguments
            )
            reply, _ = log.run(command)
            if queue not in log.state.queues:
                assert isinstance(reply, Error) and reply.code == "unknown_queue"
                continue
            (bindings.add if op[0] == "bind" else bindings.discard)((queue, key, arguments))
        elif op[0] == "delete":
            log.run(c.DeleteQueue(op[1]))
            bindings = {b for b in bindings if b[0] != op[1]}
        else:
            before = {name: len(queue.ready) for name, queue in log.state.queues.items()}
            reply = log.ok(c.PublishToExchange("x", op[1], b"m", op[2]))
            grew = {name for name, queue in log.state.queues.items()
                    if len(queue.ready) > before[name]}  # fmt: skip
            expected = model_routes(kind, bindings, op[1], op[2])
            assert grew == expected and reply == Routed(tuple(sorted(expected)))
            assert all(inflate(log.state.queues[name].ready[-1]).ref == log.entry * SPAN
                       for name in grew)  # fmt: skip

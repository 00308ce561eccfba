"""Machine behaviour the golden files cannot show well: caps, purity, robustness, dispatch."""

from __future__ import annotations

import random

import pytest

import fifo
from fifo import commands as c
from fifo import limits
from fifo.replies import Error, Reply
from tests.must import must

CONN = c.ConnectionId("n1", 1, 1)


class Log:
    """Applies commands at increasing indexes and times."""

    def __init__(self, version: int) -> None:
        self.state = fifo.init_state(version)
        self.version = version
        self.index = 0

    def __call__(self, cmd: object, time: int | None = None) -> Reply:
        self.index += 1
        meta = fifo.Meta(self.index, 1, self.index if time is None else time, self.version)
        reply, _ = fifo.apply(meta, cmd, self.state)
        return reply


@pytest.mark.parametrize("version", [1, 2])
def test_enqueuer_cap_evicts_the_earliest_down_enqueuer(
    version: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At the cap a new enqueuer evicts the enqueuer that went down first; none down: refused."""
    monkeypatch.setattr(limits, "enqueuers_per_queue_max", 3)
    log = Log(version)
    log(c.DeclareQueue("q"))
    for n in range(3):
        log(c.RegisterEnqueuer("q", f"p{n}", c.ConnectionId("n1", 1, n)))
    reply = log(c.Enqueue("q", b"x", "p9", 1, CONN))
    assert isinstance(reply, Error) and reply.code == "unsupported"
    log(c.ConnectionDown(c.ConnectionId("n1", 1, 2), "normal"))
    log(c.ConnectionDown(c.ConnectionId("n1", 1, 1), "normal"))
    assert log(c.Enqueue("q", b"x", "p9", 1, CONN)) == fifo.replies.Ok()
    names = list(log.state.queues["q"].enqueuers)
    assert names == ["p0", "p1", "p9"]


@pytest.mark.parametrize("version", [1, 2])
def test_consumer_and_queue_caps(version: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Consumers per queue and queues are capped with an unsupported error."""
    monkeypatch.setattr(limits, "consumers_per_queue_max", 2)
    monkeypatch.setattr(limits, "queues_max", 1)
    log = Log(version)
    log(c.DeclareQueue("q"))
    assert isinstance(log(c.DeclareQueue("r")), Error)
    for tag in ("a", "b"):
        assert isinstance(log(c.Checkout("q", c.ConsumerId(tag, CONN), c.SimplePrefetch(1))),
                          fifo.replies.CheckoutOk)  # fmt: skip
    reply = log(c.Checkout("q", c.ConsumerId("z", CONN), c.SimplePrefetch(1)))
    assert isinstance(reply, Error) and reply.code == "unsupported"


def test_convert_is_pure() -> None:
    """convert_v1_to_v2 returns a new state and leaves its input untouched."""
    log = Log(1)
    log(c.DeclareQueue("q"))
    log(c.Checkout("q", c.ConsumerId("a", CONN), c.SimplePrefetch(2)))
    log(c.Enqueue("q", b"1"))
    before = fifo.digest(log.state)
    new = fifo.convert(log.state, 1, 2, fifo.Meta(9, 1, 500, 2))
    assert fifo.digest(log.state) == before and fifo.state_version(log.state) == 1
    assert fifo.state_version(new) == 2
    with pytest.raises(fifo.UnsupportedVersionError):
        fifo.convert(new, 2, max(fifo.MACHINES) + 1, fifo.Meta(9, 1, 500, 5))
    newer = fifo.convert(new, 2, 3, fifo.Meta(10, 1, 600, 3))
    assert fifo.state_version(new) == 2 and fifo.state_version(newer) == 3
    assert fifo.overview(newer, "q") == fifo.overview(new, "q")  # v3 groups nothing it converts


def test_machine_for_and_init_state() -> None:
    """Every version (released or not) has a machine; others raise UnsupportedVersionError."""
    assert fifo.SUPPORTED_VERSIONS == (1, 2, 3, 4) and fifo.LATEST_VERSION == 4
    assert fifo.UNRELEASED_VERSIONS == ()
    for v in (*fifo.SUPPORTED_VERSIONS, *fifo.UNRELEASED_VERSIONS):
        m = fifo.machine_for(v)
        assert m.version == v and fifo.state_version(m.init()) == v
    for bad in (0, 5, "2"):
        with pytest.raises(fifo.UnsupportedVersionError):
            fifo.machine_for(bad)  # type: ignore[arg-type]


def test_apply_on_a_non_state_is_an_error() -> None:
    """apply never raises, even when handed something that is not a state."""
    reply, effects = fifo.apply(fifo.Meta(1, 1, 0, 1), c.Purge("q"), object())  # type: ignore[arg-type]
    assert isinstance(reply, Error) and effects == []


def test_time_is_monotonic_inside_the_state() -> None:
    """A meta time older than the last one is raised to it (max(last, meta))."""
    log = Log(2)
    log(c.DeclareQueue("q", c.QueueConfig(message_ttl_ms=10)), time=1000)
    log(c.Enqueue("q", b"x"), time=5)
    assert fifo.messages(log.state, "q")[0].expiry_ms == 1010


def test_dead_letter_cycles_stop_after_a_bounded_number_of_hops() -> None:
    """Two queues dead-lettering into each other on overflow cannot loop inside one apply."""
    log = Log(2)
    log(c.DeclareQueue("a", c.QueueConfig(max_length=1, dead_letter_queue="b")))
    log(c.DeclareQueue("b", c.QueueConfig(max_length=1, dead_letter_queue="a")))
    for n in range(5):
        assert log(c.Enqueue("a", bytes([n]))) == fifo.replies.Ok()
    total = sum(must(fifo.overview(log.state, q)).total for q in ("a", "b"))
    assert total == 2


def test_v1_has_no_timers_but_expiry() -> None:
    """v1 never yields consumer-timeout commands, only Expire."""
    log = Log(1)
    log(c.DeclareQueue("q", c.QueueConfig(message_ttl_ms=5, consumer_timeout_ms=1)), time=0)
    log(c.Checkout("q", c.ConsumerId("a", CONN), c.SimplePrefetch(1)), time=0)
    log(c.Enqueue("q", b"1"), time=0)
    log(c.Enqueue("q", b"2"), time=0)
    assert fifo.due_commands(log.state, 10**9) == [c.Expire("q")]
    assert fifo.next_deadline_ms(log.state) == 5


ATOMS: list[object] = [
    None, True, -1, 0, 1, 2**40, "", "q", "x" * 300, b"", b"b", (), (0,), ("a",), [1], 1.5,
    CONN, c.ConsumerId("a", CONN), c.SimplePrefetch(1), c.Credited(0), c.Cancel(), c.Remove(),
    c.Dequeue(False), c.QueueConfig(), c.QueueConfig(single_active_consumer=True),
]  # fmt: skip
COMMANDS = [
    c.DeclareQueue, c.DeleteQueue, c.UpdateConfig, c.Enqueue, c.RegisterEnqueuer, c.Checkout,
    c.Settle, c.Return, c.Discard, c.Modify, c.Credit, c.RenewLocks, c.Purge,
    c.EvalConsumerTimeouts, c.ConsumerDisconnectedTimeout, c.Expire, c.ConnectionDown,
    c.NodeDown, c.NodeUp,
]  # fmt: skip


@pytest.mark.parametrize("version", [1, 2])
def test_garbage_commands_never_raise_and_errors_change_nothing(version: int) -> None:
    """Random field values of every command: apply never raises; an Error keeps the digest."""
    rng = random.Random(version)
    log = Log(version)
    log(c.DeclareQueue("q"))
    log(c.Checkout("q", c.ConsumerId("a", CONN), c.SimplePrefetch(3)))
    log(c.Enqueue("q", b"1"))
    for _ in range(5000):
        cls = rng.choice(COMMANDS)
        nfields = len(cls.__dataclass_fields__)  # type: ignore[attr-defined]
        args = [rng.choice(ATOMS) for _ in range(nfields)]
        if rng.random() < 0.5:
            args[0] = "q" if cls not in (c.ConnectionDown,) else CONN
        cmd = cls(*args)
        before = fifo.digest(log.state)
        reply = log(cmd)
        if isinstance(reply, Error):
            assert fifo.digest(log.state) == before, cmd
            assert not reply.message.startswith("rejected:"), (cmd, reply)  # validation missed it


def test_fast_constructors_build_equal_frozen_effects() -> None:
    """fifo.fastbuild builds objects equal to the dataclass constructors, with every field set."""
    import dataclasses

    from fifo import effects as e
    from fifo import fastbuild

    assert [f.name for f in dataclasses.fields(e.Delivery)] == [
        "msg_id", "body", "redelivered", "delivery_count", "annotations",
    ]  # fmt: skip
    assert [f.name for f in dataclasses.fields(e.Deliver)] == [
        "connection", "queue", "tag", "consumer_key", "messages",
    ]  # fmt: skip
    d = fastbuild.fresh_delivery(3, b"x")
    assert d == e.Delivery(3, b"x", False, 0) and hash(d) == hash(e.Delivery(3, b"x", False, 0))
    assert fastbuild.delivery(1, b"y", True, 2, (("k", 1),)) == e.Delivery(
        1, b"y", True, 2, (("k", 1),)
    )
    full = fastbuild.deliver(CONN, "q", "t", 5, (d,))
    assert full == e.Deliver(CONN, "q", "t", 5, (d,))
    with pytest.raises(dataclasses.FrozenInstanceError):
        full.tag = "other"  # type: ignore[misc]

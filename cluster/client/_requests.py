"""What the client sends and what an answer means, shared by the threaded and asyncio shells.

Sans-IO, like `sansio.py`: no sockets, threads, clocks or event loop. Each shell only waits;
every decision both would otherwise make on their own is made here once: the core built from
the settings, when a connect gives up and which failures it must not retry, the command a call
sends, how a reply frame decodes (and which are refusals), when a timed-out request is explained
by a status probe, and what a dequeue reply holds.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

from cluster import protocol
from cluster.client._options import Settings
from cluster.client._wire import AnyFrame
from cluster.client.errors import (
    AuthError,
    ClusterError,
    CommandRefused,
    RequestTimeout,
    TlsError,
    Unavailable,
)
from cluster.client.sansio import ClientProtocol, explain_timeout
from fifo.codec import decode
from fifo.commands import (
    Checkout,
    Command,
    ConnectionId,
    ConsumerId,
    ConsumerKey,
    DeclareGroupedQueue,
    DeclareQueue,
    Dequeue,
    Discard,
    GroupConfig,
    Purge,
    PurgeGroup,
    QueueConfig,
    Return,
    Settle,
)
from fifo.replies import DequeueOk, Error, Reply

_T = TypeVar("_T")
PROBE_TIMEOUT_S = 1.0  # the status probe that explains a timeout
DIAL_PAUSE_S = 0.1  # between two rounds over the endpoints while a connect keeps trying
# what a connect attempt may fail with and still be retried (elsewhere, or in the next round)
DIAL_RETRIES = (OSError, ClusterError, ValueError, TimeoutError)
# what a dequeue reply holds: msg_id, body, redelivered, delivery_count, consumer key
Dequeued = tuple[int, bytes, bool, int, ConsumerKey]


def core_for(endpoints: Sequence[str], settings: Settings, now: float = 0.0) -> ClientProtocol:
    """The sans-IO protocol object a shell drives, configured from its settings."""
    return ClientProtocol(
        endpoints,
        name=settings.name,
        reconnect=settings.reconnect,
        silence_timeout_s=settings.silence_timeout_s,
        now=now,
        no_leader_fail_s=settings.no_leader_fail_s,
    )


class Dialing:
    """One connect's decisions: rounds over `endpoints` until one answers, or `deadline` passes.

    The shell opens each address of a round (`endpoints`) and reports each failure to `failed`;
    after a round that connected nowhere it asks `pause_after_round` how long to wait before the
    next. `describe` words a failure in the final Unavailable (`str` or `repr`).
    """

    def __init__(
        self, endpoints: Sequence[str], deadline: float, describe: Callable[[object], str] = repr
    ) -> None:
        self.endpoints = list(endpoints)
        self.deadline = deadline
        self.describe = describe
        self.errors: list[str] = []

    def failed(self, address: str, error: BaseException) -> None:
        """Note a failed attempt; re-raise what no retry can fix (a refused key, a TLS mismatch,
        anything unexpected)."""
        if isinstance(error, AuthError | TlsError) or not isinstance(error, DIAL_RETRIES):
            raise error
        self.errors.append(f"{address}: {self.describe(error)}")

    def pause_after_round(self, now: float) -> float:
        """The pause before the next round; Unavailable (naming the last round's failures) once
        the deadline has passed."""
        if now >= self.deadline:
            tried = "; ".join(self.errors[-len(self.endpoints) :])
            raise Unavailable(f"no quorumq node reachable ({tried})")
        return DIAL_PAUSE_S


def reply_of(answer: AnyFrame) -> Reply:
    """The decoded reply of a command's answer frame; CommandRefused for an error reply."""
    raw = answer.get("reply")
    if not isinstance(raw, bytes):
        raise CommandRefused(protocol.BAD_FRAME, f"expected an encoded reply, got {raw!r}")
    reply: Reply = decode(raw)
    if isinstance(reply, Error):
        raise CommandRefused(reply.code, reply.message)
    return reply


def expect(reply: Reply, kind: type[_T]) -> _T:
    """`reply` as the reply class a command answers with; CommandRefused for anything else."""
    if not isinstance(reply, kind):
        raise CommandRefused("unexpected_reply", f"expected {kind.__name__}, got {reply!r}")
    return reply


def no_answer(what: str, timeout_s: float) -> RequestTimeout:
    """The error of a request that got no answer in its time."""
    return RequestTimeout(f"no answer to {what} within {timeout_s:.1f}s")


class StatusProbe:
    """The status query that explains a timed-out request (answered without the log)."""

    timeout_s = PROBE_TIMEOUT_S

    def __init__(self, core: ClientProtocol, now: Callable[[], float]) -> None:
        self.core = core
        self.now = now

    def send(self) -> int:
        """Submit the query to the core; its request id."""
        return self.core.submit(protocol.query(0, "status"), self.timeout_s, now=self.now())

    def explain(self, answer: AnyFrame, error: ClusterError) -> ClusterError:
        """`error`, or Unavailable when the status answer says the node has no quorum."""
        return explain_timeout(answer.get("result"), error)


def status_probe(
    core: ClientProtocol, error: BaseException, now: Callable[[], float]
) -> StatusProbe | None:
    """The probe that may explain `error`; None when none is worth sending: only a timeout is
    explained, never on a closed client (and a probe's own error is never probed)."""
    if not isinstance(error, RequestTimeout) or core.closed:
        return None
    return StatusProbe(core, now)


def declarations(
    queue: str, config: QueueConfig | None, groups: GroupConfig | None
) -> tuple[str | None, Command]:
    """What `declare_queue` sends: the dead-letter queue to declare first when it is missing
    (None: no target), and the declaration (grouped with `groups`, machine v3)."""
    target = config.dead_letter_queue if config is not None else None
    if groups is not None:
        return target, DeclareGroupedQueue(queue, config or QueueConfig(), groups)
    return target, DeclareQueue(queue, config or QueueConfig())


def purging(queue: str, group: str | None, default_group: bool) -> Command:
    """What `purge_queue` sends: a whole queue, or one message group of a grouped queue."""
    if group is not None or default_group:
        return PurgeGroup(queue, group)
    return Purge(queue)


def dequeue(queue: str, tag: str, connection: ConnectionId, settled: bool) -> Checkout:
    """What `get` sends: a one-message checkout under a fresh consumer tag."""
    return Checkout(queue, ConsumerId(tag, connection), Dequeue(settled))


def dequeued(reply: Reply, tag: str, connection: ConnectionId) -> Dequeued | None:
    """The message a dequeue reply holds (None: the queue had none ready)."""
    if not isinstance(reply, DequeueOk):
        raise CommandRefused("unexpected_reply", f"dequeue answered {reply!r}")
    found = reply.message
    if found is None:
        return None
    key = reply.consumer_key if reply.consumer_key is not None else ConsumerId(tag, connection)
    return found.msg_id, found.body, found.redelivered, found.delivery_count, key


def settling(queue: str, key: ConsumerKey, msg_id: int, outcome: str) -> Command:
    """The settle command of a dequeued message: `ack`, `requeue` (nack) or `reject`."""
    if outcome == "ack":
        return Settle(queue, key, (msg_id,))
    kind = Return if outcome == "requeue" else Discard
    return kind(queue, key, (msg_id,))

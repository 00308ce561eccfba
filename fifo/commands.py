"""Commands accepted by the machine: one frozen, slotted dataclass per verb.

This module is the contract between `fifo` and its callers (`raft`, `cluster`, tests). Fields may
be added with defaults; existing fields keep their meaning in every shipped machine version.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True, slots=True, order=True)
class ConnectionId:
    """A client connection: the node that owns it, that node's incarnation, and a number.

    The incarnation changes at every node restart, so effects replayed from the journal after a
    restart name connections that no longer exist and are dropped by the node.
    """

    node: str
    incarnation: int
    number: int


@dataclass(frozen=True, slots=True, order=True)
class ConsumerId:
    """A consumer as the client names it: a tag unique within its connection."""

    tag: str
    connection: ConnectionId


# v2 keys consumers by the Raft index of the checkout that created them (compact key); the id form
# is accepted everywhere a key is. v1 keys consumers by their ConsumerId.
ConsumerKey = int | ConsumerId

Overflow = Literal["drop_head", "reject_publish"]
GroupPolicy = Literal["sequenced", "exclusive"]
GROUP_KEY_DEFAULT = "x-group-id"
DownReason = Literal["normal", "noconnection"]

CONSUMER_TIMEOUT_MS_DEFAULT = 1_800_000
DISCONNECTED_TIMEOUT_MS_DEFAULT = 60_000


@dataclass(frozen=True, slots=True)
class QueueConfig:
    """Per-queue configuration; `None` means no limit."""

    single_active_consumer: bool = False
    delivery_limit: int | None = None
    max_length: int | None = None
    max_bytes: int | None = None
    overflow: Overflow = "drop_head"
    message_ttl_ms: int | None = None
    dead_letter_queue: str | None = None
    consumer_timeout_ms: int = CONSUMER_TIMEOUT_MS_DEFAULT
    disconnected_timeout_ms: int = DISCONNECTED_TIMEOUT_MS_DEFAULT


# --- checkout specs ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SimplePrefetch:
    """AMQP 0.9.1 basic.qos: credit starts at `prefetch` and is refilled by settles."""

    prefetch: int


@dataclass(frozen=True, slots=True)
class Credited:
    """AMQP 1.0 link credit: credit starts at 0 and is granted by `Credit` commands."""

    initial_delivery_count: int = 0


@dataclass(frozen=True, slots=True)
class Cancel:
    """Soft cancel: the consumer gets nothing new and leaves once its pending messages are done."""


@dataclass(frozen=True, slots=True)
class Remove:
    """Hard cancel (v2 only): pending messages are returned at once, late settles are ignored."""


@dataclass(frozen=True, slots=True)
class Dequeue:
    """basic.get: take one ready message; `settled` means no ack is expected."""

    settled: bool


CheckoutSpec = SimplePrefetch | Credited | Cancel | Remove | Dequeue


# --- queue registry ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DeclareQueue:
    """Create a queue; declaring an existing queue with an equal config is a no-op."""

    queue: str
    config: QueueConfig = QueueConfig()


@dataclass(frozen=True, slots=True)
class DeleteQueue:
    """Delete a queue with everything in it; its consumers are told they were cancelled."""

    queue: str


@dataclass(frozen=True, slots=True)
class UpdateConfig:
    """Replace a queue's config; limits are re-evaluated at once."""

    queue: str
    config: QueueConfig


# --- per-queue commands -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Enqueue:
    """Publish one message. With `enqueuer` and `seq`, duplicates are acked and gaps refused."""

    queue: str
    body: bytes
    enqueuer: str | None = None
    seq: int | None = None
    connection: ConnectionId | None = None
    ttl_ms: int | None = None


@dataclass(frozen=True, slots=True)
class RegisterEnqueuer:
    """Make an enqueuer known (bound to a connection); replies RejectPublish while over limit."""

    queue: str
    enqueuer: str
    connection: ConnectionId


@dataclass(frozen=True, slots=True)
class Checkout:
    """Attach, update, cancel or remove a consumer, or dequeue one message."""

    queue: str
    consumer: ConsumerId
    spec: CheckoutSpec
    priority: int = 0
    timeout_ms: int | None = None  # None: the queue's consumer_timeout_ms


@dataclass(frozen=True, slots=True)
class Settle:
    """Acknowledge messages: they are done and leave the queue."""

    queue: str
    consumer_key: ConsumerKey
    msg_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Return:
    """Give messages back (requeue at the back of the returns queue) without a failed delivery."""

    queue: str
    consumer_key: ConsumerKey
    msg_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Discard:
    """Reject messages: a failed delivery; they are dead-lettered (or dropped)."""

    queue: str
    consumer_key: ConsumerKey
    msg_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Modify:
    """AMQP 1.0 modified outcome (v2 only): return or dead-letter with annotations."""

    queue: str
    consumer_key: ConsumerKey
    msg_ids: tuple[int, ...]
    delivery_failed: bool
    undeliverable_here: bool
    annotations: tuple[tuple[str, str | int], ...] = ()


@dataclass(frozen=True, slots=True)
class Credit:
    """AMQP 1.0 flow: link credit with the receiver's serial-number delivery count."""

    queue: str
    consumer_key: ConsumerKey
    credit: int
    delivery_count: int
    drain: bool = False


@dataclass(frozen=True, slots=True)
class RenewLocks:
    """Extend the consumer-timeout locks of checked-out messages (v2 only)."""

    queue: str
    consumer_key: ConsumerKey
    msg_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Purge:
    """Drop every ready and returned message; checked-out messages are untouched."""

    queue: str


@dataclass(frozen=True, slots=True)
class EvalConsumerTimeouts:
    """Submitted by the leader when some locks expired: return them and time the consumers out."""

    queue: str
    consumer_keys: tuple[ConsumerKey, ...]


@dataclass(frozen=True, slots=True)
class ConsumerDisconnectedTimeout:
    """Submitted by the leader when a suspected consumer stayed disconnected too long (v2)."""

    queue: str
    consumer_key: ConsumerKey


@dataclass(frozen=True, slots=True)
class Expire:
    """Submitted by the leader when the head of a queue has expired: dead-letter expired ones."""

    queue: str


@dataclass(frozen=True, slots=True)
class ConnectionDown:
    """A client connection closed (`normal`) or its node is unreachable (`noconnection`)."""

    connection: ConnectionId
    reason: DownReason


@dataclass(frozen=True, slots=True)
class NodeDown:
    """The leader lost a node: its connections are treated as `noconnection`."""

    node: str


@dataclass(frozen=True, slots=True)
class NodeUp:
    """A lost node is back: its suspected consumers and enqueuers come up again."""

    node: str


# --- machine v3: message groups (new classes: the shipped ones keep their bytes) -----------


@dataclass(frozen=True, slots=True)
class GroupConfig:
    """Message groups of a queue (v3): the annotation naming a message's group, and the policy.

    `sequenced`: a group belongs to a consumer only while it holds messages of it. `exclusive`:
    a group sticks to the consumer that got its first message for as long as that consumer
    lives; `rebalance_groups_on_join` then redistributes idle groups when a consumer joins.
    """

    group_key: str = GROUP_KEY_DEFAULT
    policy: GroupPolicy = "sequenced"
    rebalance_groups_on_join: bool = False


@dataclass(frozen=True, slots=True)
class DeclareGroupedQueue(DeclareQueue):
    """Create a queue with message groups (v3); machines before v3 refuse it (unknown_command)."""

    groups: GroupConfig = GroupConfig()


@dataclass(frozen=True, slots=True)
class AnnotatedEnqueue(Enqueue):
    """Publish one message with annotations (v3); a grouped queue reads the message's group from
    the annotation its `group_key` names (`x-group-id` by default). Machines before v3 refuse it."""

    annotations: tuple[tuple[str, str | int], ...] = ()


@dataclass(frozen=True, slots=True)
class PurgeGroup(Purge):
    """Drop the waiting messages of one group of a grouped queue (v3); None: the default group."""

    group: str | None = None


# --- machine v3: partitioned queues and consumer groups (issue 10) ---------------------------


@dataclass(frozen=True, slots=True)
class DeclarePartitionedQueue(DeclareQueue):
    """Create a partitioned queue (v3): `partitions` single-active-consumer queues `queue.0` ..
    `queue.{partitions - 1}`, each with `config`, consumed through consumer groups."""

    partitions: int = 1


@dataclass(frozen=True, slots=True)
class JoinGroup(Checkout):
    """Join consumer group `group` of partitioned queue `queue` as `member` (v3). The machine
    checks the member's consumer out (tag and connection of `consumer`, `spec`, `timeout_ms`)
    on each partition it assigns it; the reply's epoch names this membership."""

    group: str = ""
    member: str = ""


@dataclass(frozen=True, slots=True)
class LeaveGroup(Checkout):
    """Leave consumer group `group` (v3): the member's unsettled messages go back to their
    partitions. `epoch` is the one JoinGroup answered: an older one is fenced."""

    group: str = ""
    member: str = ""
    epoch: int = 0


# --- machine v4: settles bound to the submitting connection (issue 31) ---------------------
# New classes (new tags), so the shipped Settle ... RenewLocks keep their bytes and a node with
# older code never meets a field it does not know: the node sends these only once machine v4 is
# effective, and sets `connection` to the connection the command came in on (a client never
# chooses it). Machine v4 refuses one naming a consumer of another connection (`not_owner`);
# machines before v4 answer them `unknown_command`.


@dataclass(frozen=True, slots=True)
class BoundSettle(Settle):
    """A Settle submitted by `connection` (v4): accepted only from the consumer's connection."""

    connection: ConnectionId | None = None


@dataclass(frozen=True, slots=True)
class BoundReturn(Return):
    """A Return submitted by `connection` (v4): accepted only from the consumer's connection."""

    connection: ConnectionId | None = None


@dataclass(frozen=True, slots=True)
class BoundDiscard(Discard):
    """A Discard submitted by `connection` (v4): accepted only from the consumer's connection."""

    connection: ConnectionId | None = None


@dataclass(frozen=True, slots=True)
class BoundModify(Modify):
    """A Modify submitted by `connection` (v4): accepted only from the consumer's connection."""

    connection: ConnectionId | None = None


@dataclass(frozen=True, slots=True)
class BoundRenewLocks(RenewLocks):
    """A RenewLocks submitted by `connection` (v4): accepted only from the consumer's
    connection."""

    connection: ConnectionId | None = None


BOUND_SETTLES_SINCE_VERSION = 4  # the first machine version that knows the bound forms
BOUND_SETTLES: dict[type, type] = {  # the unbound command -> its bound form
    Settle: BoundSettle,
    Return: BoundReturn,
    Discard: BoundDiscard,
    Modify: BoundModify,
    RenewLocks: BoundRenewLocks,
}
UNBOUND_SETTLES: dict[type, type] = {bound: plain for plain, bound in BOUND_SETTLES.items()}


# --- machine v4: exchanges and bindings (issue 27) --------------------------------------------
# Replicated exchanges: routing is decided by the machine when the entry is applied, and a
# publish through an exchange is ONE log entry stored in every queue it matches (each copy refers
# to the same body). Machines before v4 answer these `unknown_command`.

ExchangeType = Literal["direct", "fanout", "topic", "headers"]
EXCHANGE_TYPES: tuple[str, ...] = ("direct", "fanout", "topic", "headers")
EXCHANGES_SINCE_VERSION = 4  # the first machine version that knows the commands below
HeaderPairs = tuple[tuple[str, str | int], ...]


@dataclass(frozen=True, slots=True)
class DeclareExchange:
    """Create an exchange (v4); an equal re-declare is a no-op, another type, auto_delete or
    internal is refused (`exchange_exists`, RabbitMQ's 406); `passive` only checks that it
    exists. An `auto_delete` exchange is deleted when its last binding goes (RabbitMQ's rule);
    an `internal` one takes no publish, only what an exchange bound to it routes on."""

    exchange: str
    exchange_type: str = "direct"
    passive: bool = False
    auto_delete: bool = False
    internal: bool = False


@dataclass(frozen=True, slots=True)
class DeleteExchange:
    """Delete an exchange with its bindings (v4); `if_unused` refuses while it has bindings."""

    exchange: str
    if_unused: bool = False


@dataclass(frozen=True, slots=True)
class BindQueue:
    """Bind a queue to an exchange with a binding key and arguments (v4; idempotent). A headers
    exchange matches on `arguments` (`x-match` all, any, all-with-x or any-with-x)."""

    queue: str
    exchange: str
    routing_key: str = ""
    arguments: HeaderPairs = ()


@dataclass(frozen=True, slots=True)
class UnbindQueue:
    """Remove one binding (v4); removing a binding that does not exist is a no-op."""

    queue: str
    exchange: str
    routing_key: str = ""
    arguments: HeaderPairs = ()


@dataclass(frozen=True, slots=True)
class BindExchange:
    """Bind exchange `destination` to exchange `source` (v4; idempotent; RabbitMQ's
    exchange.bind): what `source` matches with this binding is routed on through
    `destination`, each exchange at most once per publish."""

    destination: str
    source: str
    routing_key: str = ""
    arguments: HeaderPairs = ()


@dataclass(frozen=True, slots=True)
class UnbindExchange:
    """Remove one exchange-to-exchange binding (v4); one that does not exist is a no-op."""

    destination: str
    source: str
    routing_key: str = ""
    arguments: HeaderPairs = ()


@dataclass(frozen=True, slots=True)
class PublishToExchange:
    """basic.publish through an exchange (v4; "" is the default exchange): the machine routes it
    and stores it in every matching queue, in this one entry. `headers` are what a headers
    exchange matches; `mandatory` makes a publish that reaches no queue answer `Unroutable`."""

    exchange: str
    routing_key: str
    body: bytes
    headers: HeaderPairs = ()
    mandatory: bool = False
    ttl_ms: int | None = None


Command = (
    DeclareQueue
    | DeleteQueue
    | UpdateConfig
    | Enqueue
    | RegisterEnqueuer
    | Checkout
    | Settle
    | Return
    | Discard
    | Modify
    | Credit
    | RenewLocks
    | Purge
    | EvalConsumerTimeouts
    | ConsumerDisconnectedTimeout
    | Expire
    | ConnectionDown
    | NodeDown
    | NodeUp
    | DeclareGroupedQueue
    | AnnotatedEnqueue
    | PurgeGroup
    | DeclarePartitionedQueue
    | JoinGroup
    | LeaveGroup
    | BoundSettle
    | BoundReturn
    | BoundDiscard
    | BoundModify
    | BoundRenewLocks
    | DeclareExchange
    | DeleteExchange
    | BindQueue
    | UnbindQueue
    | PublishToExchange
    | BindExchange
    | UnbindExchange
)

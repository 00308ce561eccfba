"""Mutable machine state: slotted classes, shared by every machine version.

`State.version` says which machine the state is shaped for. `apply` mutates these in place; only
the machine modules write to them, queries and the codec only read them.
"""

from __future__ import annotations

import heapq
from array import array
from collections import deque
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from fifo import limits
from fifo.commands import (
    ConnectionId,
    ConsumerKey,
    Credited,
    GroupConfig,
    QueueConfig,
    SimplePrefetch,
)

Annotations = tuple[tuple[str, str | int], ...]
GroupId = str | None  # None: the default group (messages without the group annotation)
HeapEntry = tuple[int, GroupId]  # (position of a group's head message, group)


class Message:
    """One message: body in memory, expiry, failed deliveries and acquisitions, consumer lock."""

    __slots__ = (
        "acquired_count",
        "annotations",
        "body",
        "delivery_count",
        "enqueued_at",
        "expiry",
        "group",
        "lock",
        "pos",
    )

    def __init__(self, body: bytes, expiry: int | None) -> None:
        self.body = body
        self.expiry = expiry  # absolute ms, None = never
        self.delivery_count = 0  # failed deliveries (discard, down, modify delivery_failed)
        self.acquired_count = 0  # acquisitions that ended in a return or discard
        self.annotations: Annotations = ()
        self.lock = 0  # v2: absolute ms at which the consumer lock expires while checked out
        # v3 grouped queues only (pos 0 elsewhere): position in the queue (enqueue order, from 1),
        # the message's group and its enqueue time (for a group's oldest age)
        self.pos = 0
        self.group: GroupId = None
        self.enqueued_at = 0

    @property
    def size(self) -> int:
        """The body's size in bytes."""
        return len(self.body)

    @property
    def ref(self) -> int:
        """The meta index of the command whose journal entry holds the body; 0: held inline."""
        return 0


# v4 packs a message's body reference and size into one int (one int object per message instead
# of two: 32 bytes less per queued message, measured by scripts/bench_message_memory.py)
BODY_SIZE_BITS = 25
assert limits.body_bytes_max < 1 << BODY_SIZE_BITS
BODY_SIZE_MASK = (1 << BODY_SIZE_BITS) - 1


class BodyNotHeldError(AttributeError):
    """Raised when code reads `body` of a message whose body stays in the log (machine v4): it
    must be resolved from the journal entry its `ref` names (fifo.bodies)."""


class MessageFields:
    """The fields of a `RefMessage` once one of them left its default (a message checked out,
    returned, dead-lettered, with a TTL, annotations or a group)."""

    __slots__ = ("acquired_count", "annotations", "delivery_count", "enqueued_at", "expiry",
                 "group", "lock", "pos")  # fmt: skip

    def __init__(self) -> None:
        self.expiry: int | None = None
        self.delivery_count = 0
        self.acquired_count = 0
        self.annotations: Annotations = ()
        self.lock = 0
        self.pos = 0
        self.group: GroupId = None
        self.enqueued_at = 0


_FIELD_DEFAULTS: dict[str, object] = {
    "expiry": None, "delivery_count": 0, "acquired_count": 0, "annotations": (), "lock": 0,
    "pos": 0, "group": None, "enqueued_at": 0,
}  # fmt: skip


def _field(name: str) -> property:
    """A `Message` field of a RefMessage: its default until set otherwise, then in `fields`."""
    default = _FIELD_DEFAULTS[name]
    kind = type(default)

    def get(message: RefMessage) -> object:
        fields = message.fields
        return default if fields is None else getattr(fields, name)

    def set_(message: RefMessage, value: object) -> None:
        fields = message.fields
        if fields is None:
            if type(value) is kind and value == default:
                return  # still the default: no fields object
            fields = message.fields = MessageFields()
        setattr(fields, name, value)

    return property(get, set_, doc=f"`Message.{name}` (default {default!r})")


def _no_body(message: RefMessage) -> bytes:
    raise BodyNotHeldError(
        f"the body of this message stays in the log at meta index {message.ref} (raft index "
        f"{message.ref // limits.commands_per_entry_max}): resolve it, never read it from state"
    )


if TYPE_CHECKING:  # to the type checker a RefMessage is a Message: it has every field of one
    _MessageShape = Message
else:  # at run time it holds two slots, not Message's nine (56 bytes less per message)
    _MessageShape = object


class RefMessage(_MessageShape):
    """A v4 message whose body stays in the Raft log: the meta index of its enqueuing command
    and the body's size, packed (`packed = ref << BODY_SIZE_BITS | size`), and the other fields
    of a `Message`, all at their defaults (`fields` None) until one is set. Reading `body` raises
    BodyNotHeldError: a forgotten resolution is loud. While `fields` is None a queue's ready and
    returns lines keep only `packed` (`compact`, `inflate`), as a 64-bit word (`WaitingLine`):
    measured, 8 bytes per queued message instead of the object's 88
    (scripts/bench_message_memory.py)."""

    __slots__ = ("fields", "packed")

    def __init__(self, ref: int, size: int, expiry: int | None) -> None:
        self.packed = ref << BODY_SIZE_BITS | size
        self.fields: MessageFields | None = None
        if expiry is not None:
            self.expiry = expiry

    if not TYPE_CHECKING:  # (the type checker sees Message's attributes, of the same types)
        body = property(_no_body, doc="Never held here: BodyNotHeldError naming the reference.")
        expiry = _field("expiry")
        delivery_count = _field("delivery_count")
        acquired_count = _field("acquired_count")
        annotations = _field("annotations")
        lock = _field("lock")
        pos = _field("pos")
        group = _field("group")
        enqueued_at = _field("enqueued_at")

    @property
    def size(self) -> int:
        """The body's size in bytes."""
        return self.packed & BODY_SIZE_MASK

    @property
    def ref(self) -> int:
        """The meta index of the enqueuing command (its journal entry holds the body)."""
        return self.packed >> BODY_SIZE_BITS

    @staticmethod
    def unpacked(packed: int) -> RefMessage:
        """A RefMessage whose fields are all at their defaults, from its `packed` int."""
        message = RefMessage.__new__(RefMessage)
        message.packed = packed
        message.fields = None
        return message


Waiting = Message | int
"""An item of a queue's `ready` or `returns` line: a message, or (machine v4) the bare `packed`
int of a RefMessage whose fields are all at their defaults (a plain waiting message: a 64-bit
word of a `WaitingLine`, instead of an 88-byte object). v1-v3 deques hold messages only. Go
through `compact` (to store), `inflate` (to take or look at) and `expiry_of` (to peek at a
head)."""


LINE_CHUNK_ITEMS = 4096  # words per chunk of a WaitingLine: 32 KiB buffers, off pymalloc
_OBJECT = (1 << 64) - 1  # a WaitingLine word whose item is an object (no packed int is this big)


class _Chunk:
    __slots__ = ("objects", "words")

    def __init__(self) -> None:
        self.words = array("Q")
        self.objects: list[Message | int | None] | None = None  # made for its first object item


class WaitingLine:
    """Machine v4's ready and returns line: the deque operations the machine uses (append,
    popleft, index, iterate, len, clear) over `Waiting` items, a packed int kept as a 64-bit
    word in arrays of LINE_CHUNK_ITEMS (no object per message), any other item in a list beside
    its chunk's words.

    A deque of packed ints cost an int object per message: 32 bytes on Python's small-object
    heap, whose arenas a drained backlog's few survivors then kept (a node's resident set stayed
    at 1.8-1.9x a fresh one's after 2,000,000 messages drained; issue 32). Here a message costs
    8 bytes, in buffers the C allocator takes back when the line drains. Not safe to mutate while
    iterating (as a deque, but not detected)."""

    __slots__ = ("_chunks", "_head", "_len")

    def __init__(self, items: Iterable[Waiting] = ()) -> None:
        self._chunks: deque[_Chunk] = deque()
        self._head = 0  # the first item's place in the first chunk
        self._len = 0
        self.extend(items)

    def __len__(self) -> int:
        return self._len

    def __repr__(self) -> str:
        return f"WaitingLine({list(self)!r})"

    def append(self, item: Waiting) -> None:
        """Put `item` last."""
        chunks = self._chunks
        if not chunks or len(chunks[-1].words) == LINE_CHUNK_ITEMS:
            chunks.append(_Chunk())
        chunk = chunks[-1]
        if type(item) is int and 0 <= item < _OBJECT:
            chunk.words.append(item)
            if chunk.objects is not None:
                chunk.objects.append(None)
        else:
            if chunk.objects is None:
                chunk.objects = [None] * len(chunk.words)
            chunk.words.append(_OBJECT)
            chunk.objects.append(item)
        self._len += 1

    def extend(self, items: Iterable[Waiting]) -> None:
        """Put `items` last, in order."""
        for item in items:
            self.append(item)

    def popleft(self) -> Waiting:
        """Take the first item (IndexError if there is none)."""
        if not self._len:
            raise IndexError("pop from an empty WaitingLine")
        chunk, head = self._chunks[0], self._head
        item: Waiting | None = chunk.words[head]
        if item == _OBJECT and chunk.objects is not None:
            item, chunk.objects[head] = chunk.objects[head], None
        self._len -= 1
        head += 1
        if head == len(chunk.words):  # a chunk before the last is full: this one is done
            self._chunks.popleft()
            head = 0
        self._head = head
        assert item is not None
        return item

    def __getitem__(self, index: int) -> Waiting:
        if index < 0:
            index += self._len
        if not 0 <= index < self._len:
            raise IndexError("WaitingLine index out of range")
        place = self._head + index
        chunk = self._chunks[place // LINE_CHUNK_ITEMS]  # every chunk but the last is full
        place %= LINE_CHUNK_ITEMS
        word = chunk.words[place]
        if word == _OBJECT and chunk.objects is not None:
            item = chunk.objects[place]
            assert item is not None
            return item
        return word

    def __iter__(self) -> Iterator[Waiting]:
        start = self._head
        for chunk in self._chunks:
            words, objects = chunk.words, chunk.objects
            if objects is None:
                yield from words[start:] if start else words
                start = 0
                continue
            for place in range(start, len(words)):
                word = words[place]
                if word == _OBJECT:
                    item = objects[place]
                    assert item is not None
                    yield item
                else:
                    yield word
            start = 0

    def clear(self) -> None:
        """Drop every item."""
        self._chunks.clear()
        self._head = self._len = 0


def compact(message: Message) -> Waiting:
    """How a queue's ready or returns deque keeps `message`: a RefMessage without fields as its
    packed int, anything else as it is."""
    if type(message) is RefMessage and message.fields is None:
        return message.packed
    return message


def expiry_of(item: Waiting) -> int | None:
    """The expiry of the message a ready or returns deque item stands for (a packed int has
    none), without inflating it."""
    return None if isinstance(item, int) else item.expiry


def inflate(item: Waiting) -> Message:
    """The message a ready or returns deque item stands for: a packed int becomes a new
    RefMessage (so a change to it is kept only once it is stored again, by `compact`)."""
    if isinstance(item, int):
        return RefMessage.unpacked(item)
    return item


class Consumer:
    """A consumer (competing, SAC active, SAC waiting, cancelled, or an unsettled dequeue)."""

    __slots__ = (
        "attach_index",
        "checked_out",
        "connection",
        "credit",
        "credited",
        "delivery_count",
        "disconnected_fired",
        "drain",
        "in_service",
        "key",
        "next_msg_id",
        "once",
        "prefetch",
        "priority",
        "status",
        "suspected_since",
        "tag",
        "timed_out",
        "timeout_ms",
    )

    def __init__(
        self, key: ConsumerKey, tag: str, connection: ConnectionId, attach_index: int
    ) -> None:
        self.key = key
        self.tag = tag
        self.connection = connection
        self.attach_index = attach_index  # Raft index of the creating checkout: SAC tie-break
        self.credited = False  # credit mode: False = simple_prefetch, True = credited
        self.prefetch = 0
        self.priority = 0
        self.timeout_ms = 0
        self.once = False  # lifetime once: no credit refill, removed when drained
        self.status = "up"  # up | cancelled | quiescing
        self.suspected_since: int | None = None  # set while suspected down (noconnection)
        self.disconnected_fired = False  # v2: the disconnected timeout already ran
        self.timed_out: list[int] = []  # v2: ids taken back by a consumer timeout, sorted
        self.next_msg_id = 0
        self.checked_out: dict[int, Message] = {}
        self.credit = 0
        self.delivery_count = 0  # AMQP 1.0 sender delivery-count, 32-bit serial number
        self.drain = False
        self.in_service = False  # queued in the queue's service ring


class Enqueuer:
    """A publisher id with its dedup window, bound to the connection it last used."""

    __slots__ = ("blocked", "connection", "down_index", "name", "next_seq", "status")

    def __init__(self, name: str, connection: ConnectionId | None) -> None:
        self.name = name
        self.connection = connection
        self.next_seq = 1
        self.status = "up"  # up | suspected | down
        self.blocked: int | None = None  # index at which reject_publish was sent
        self.down_index = 0  # index at which it went down (eviction order)


class Queue:
    """One queue: ready and returned messages, consumers, enqueuers and counters."""

    __slots__ = (
        "blocked_count",
        "bytes_checkout",
        "bytes_ready",
        "config",
        "consumers",
        "enqueuers",
        "grouping",
        "key_by_id",
        "last_active",
        "messages_total",
        "name",
        "ready",
        "returns",
        "service",
        "waiting",
    )

    def __init__(self, name: str, config: QueueConfig, now: int) -> None:
        self.name = name
        self.config = config
        # v1-v3: deques of Messages; v4: WaitingLines (`v4_lines`), packed ints or messages
        self.ready: deque[Waiting] | WaitingLine = deque()
        self.returns: deque[Waiting] | WaitingLine = deque()
        self.messages_total = 0
        self.bytes_ready = 0
        self.bytes_checkout = 0
        self.enqueuers: dict[str, Enqueuer] = {}
        self.blocked_count = 0
        self.consumers: dict[ConsumerKey, Consumer] = {}
        self.waiting: list[Consumer] = []  # SAC only, kept sorted
        self.key_by_id: dict[object, ConsumerKey] = {}  # ConsumerId -> key, for id lookups
        # consumer priority -> keys with credit, round robin within a level
        self.service: dict[int, deque[ConsumerKey]] = {}
        self.last_active = now
        self.grouping: Grouping | None = None  # v3: message groups (None: not grouped)

    @classmethod
    def lined(cls, name: str, config: QueueConfig, now: int) -> Queue:
        """A new queue whose ready and returns are WaitingLines (machine v4 on)."""
        queue = cls(name, config, now)
        queue.ready, queue.returns = WaitingLine(), WaitingLine()
        return queue


class Group:
    """One tracked message group of a grouped queue: its waiting messages and its owner.

    Waiting messages are `returns` (returned ones, in position order, served first) then `ready`.
    `owner` holds the group: `sequenced`, while it has checked-out messages of it; `exclusive`,
    from its first delivery for as long as the consumer lives.
    """

    __slots__ = ("checked_out", "gid", "owner", "ready", "returns")

    def __init__(self, gid: GroupId) -> None:
        self.gid = gid
        self.returns: list[Message] = []
        self.ready: deque[Message] = deque()
        self.checked_out = 0  # messages of the group held by consumers
        self.owner: ConsumerKey | None = None


class Grouping:
    """The message groups of a queue (v3). A grouped queue keeps its waiting messages here (its
    `ready` and `returns` stay empty).

    Replicated: `config`, `next_pos`, `groups` (insertion order) and `idle`. The heaps are indexes
    rebuilt from them (on restore, or when stale entries pile up): entries are (head position,
    group) and an entry is valid only while it names the group's current head and the heap is
    the one of the group's owner (`free` for no owner); stale entries are dropped lazily.
    """

    __slots__ = ("by_owner", "config", "free", "groups", "heads", "idle", "next_pos", "owned",
                 "pushes", "waiting")  # fmt: skip

    def __init__(self, config: GroupConfig) -> None:
        self.config = config
        self.next_pos = 1
        self.groups: dict[GroupId, Group] = {}
        # exclusive: owned groups with nothing waiting or checked out, oldest first (evicted first
        # when the queue tracks groups_per_queue_max groups)
        self.idle: dict[GroupId, None] = {}
        # indexes (not replicated, derived from the above)
        self.free: list[HeapEntry] = []  # groups without owner that have waiting messages
        self.owned: dict[ConsumerKey, list[HeapEntry]] = {}  # per owner, likewise
        self.heads: list[HeapEntry] = []  # every group with waiting messages (expiry, drop-head)
        self.by_owner: dict[ConsumerKey, dict[GroupId, None]] = {}
        self.pushes = 0  # heap pushes since the last rebuild
        self.waiting = 0  # waiting messages in all groups (derived)
        self.rebuild()

    def rebuild(self) -> None:
        """Rebuild the indexes from the replicated fields (after a restore; drops stale entries).

        Deterministic: heaps built from the groups in insertion order, owners in first-seen order.
        """
        self.free, self.heads, self.owned, self.by_owner = [], [], {}, {}
        self.waiting = 0
        for gid, g in self.groups.items():
            self.waiting += len(g.returns) + len(g.ready)
            if g.owner is not None:
                self.by_owner.setdefault(g.owner, {})[gid] = None
            head = g.returns[0] if g.returns else (g.ready[0] if g.ready else None)
            if head is None:
                continue
            entry = (head.pos, gid)
            self.heads.append(entry)
            if g.owner is None:
                self.free.append(entry)
            else:
                self.owned.setdefault(g.owner, []).append(entry)
        heapq.heapify(self.free)
        heapq.heapify(self.heads)
        for heap in self.owned.values():
            heapq.heapify(heap)
        self.pushes = 0


class Membership:
    """One member of a consumer group (v3): its join position, the epoch of this incarnation,
    and the consumer id (tag, connection) and spec its partition consumers get."""

    __slots__ = ("connection", "epoch", "join_seq", "member", "spec", "tag")

    def __init__(
        self,
        member: str,
        join_seq: int,
        epoch: int,
        connection: ConnectionId | None,
        spec: SimplePrefetch | Credited | None = None,
        tag: str = "",
    ) -> None:
        self.member = member
        self.join_seq = join_seq
        self.epoch = epoch
        self.connection = connection
        self.spec = spec
        self.tag = tag


class ConsumerGroup:
    """A consumer group over the partitions of a partitioned queue (v3)."""

    __slots__ = (
        "epoch",
        "holder",
        "last_moves",
        "last_reassigned",
        "last_rebalance_index",
        "members",
        "name",
        "next_join_seq",
        "partitions",
        "queue",
        "revoking",
        "target",
    )

    def __init__(self, name: str, queue: str, partitions: tuple[str, ...]) -> None:
        self.name = name
        self.queue = queue
        self.partitions = partitions
        self.members: dict[str, Membership] = {}  # insertion order = join order
        self.next_join_seq = 0
        self.epoch = 0  # bumped by every rebalance that changes the target, and every join
        self.target: dict[str, str] = {}  # partition -> member it should go to
        self.holder: dict[str, str] = {}  # partition -> member active or draining on it
        self.revoking: dict[str, str] = {}  # partition -> its holder, told to stop (draining)
        self.last_rebalance_index = 0
        self.last_moves = 0  # partitions taken from a member still in the group
        self.last_reassigned = 0  # partitions whose member changed (the departed's included)

    def member_order(self) -> list[str]:
        """Member ids in join order."""
        return list(self.members)

    def assignment(self) -> dict[str, tuple[str, ...]]:
        """The target as member -> partitions (in partition order), members in join order (a
        member that left since the last rebalance comes last)."""
        out: dict[str, list[str]] = {member: [] for member in self.members}
        for partition in self.partitions:
            member = self.target.get(partition)
            if member is not None:
                out.setdefault(member, []).append(partition)
        return {member: tuple(held) for member, held in out.items()}

    def held_by(self, member: str) -> tuple[str, ...]:
        """The partitions `member` is active or draining on, in partition order."""
        return tuple(p for p in self.partitions if self.holder.get(p) == member)

    def pending(self) -> tuple[str, ...]:
        """Partitions whose holder is not (yet) their target: a hand-over is under way."""
        return tuple(p for p in self.partitions if self.holder.get(p) != self.target.get(p))

    def is_stale(self, member: str, epoch: int) -> bool:
        """True when (member, epoch) is not the member's current incarnation."""
        current = self.members.get(member)
        return current is None or current.epoch != epoch


class Routing:
    """How publishes to a partitioned queue's base name are spread over its partitions (v3):
    the round-robin cursor (the partition the next message without a key goes to) and the
    publishers' dedup over the whole partitioned queue (enqueuers by name, insertion order)."""

    __slots__ = ("cursor", "enqueuers")

    def __init__(self) -> None:
        self.cursor = 0
        self.enqueuers: dict[str, Enqueuer] = {}



BindingKey = tuple[str, Annotations]  # (binding key, sorted binding arguments)


class Exchange:
    """A declared exchange (v4): its type and its bindings, by queue name (insertion order, the
    order they were bound) to that queue's (binding key, arguments) pairs (insertion order).
    Keyed by queue so a queue's deletion drops its bindings in one step per exchange."""

    __slots__ = ("auto_delete", "bindings", "exchange_bindings", "exchange_type", "internal",
                 "name")  # fmt: skip

    def __init__(
        self, name: str, exchange_type: str, auto_delete: bool = False, internal: bool = False
    ) -> None:
        self.name = name
        self.exchange_type = exchange_type
        self.auto_delete = auto_delete  # deleted when its last binding goes
        self.internal = internal  # no publish to it, only routing from a bound exchange
        self.bindings: dict[str, dict[BindingKey, None]] = {}
        # exchange-to-exchange bindings from this one: destination exchange -> keys (the same)
        self.exchange_bindings: dict[str, dict[BindingKey, None]] = {}

    def binding_count(self) -> int:
        """How many bindings the exchange has as a source (to queues and to exchanges)."""
        return sum(len(keys) for keys in self.bindings.values()) + sum(
            len(keys) for keys in self.exchange_bindings.values()
        )

    def has_bindings(self) -> bool:
        """Whether anything is bound to it as a source."""
        return bool(self.bindings or self.exchange_bindings)


LockEntry = tuple[int, int, str, ConsumerKey, int]  # (lock expiry, push number, queue, key, id)


class LockIndex:
    """Consumer-timeout locks ordered by deadline (v4): an index derived from the checked-out
    messages, never replicated (the codec does not see it; it is rebuilt after a restore).

    Entries are added when a lock is set and dropped lazily: an entry counts only while the
    message it names is still checked out by that consumer with that lock (`fifo.v4.deadlines`).
    The push number makes every entry unique, so keys of different types are never compared.
    """

    __slots__ = ("by_consumer", "entries", "pushes", "rebuild_after")

    def __init__(self) -> None:
        self.entries: list[LockEntry] = []  # a heap: the earliest lock first
        # (queue, consumer key) -> heap of (lock expiry, message id): that consumer's locks
        self.by_consumer: dict[tuple[str, ConsumerKey], list[tuple[int, int]]] = {}
        self.pushes = 0  # entries pushed since the index was built
        self.rebuild_after = 0  # rebuild (drop stale entries) once `pushes` passes this


class State:
    """The whole replicated machine: a registry of queues plus the monotonic clock."""

    __slots__ = ("consumer_groups", "deadlines", "exchanges", "last_time", "partitioned", "queues",
                 "routing", "version")  # fmt: skip

    def __init__(self, version: int) -> None:
        self.version = version
        self.last_time = 0
        self.queues: dict[str, Queue] = {}
        # v3: partitioned queue name -> partition count, and the consumer groups by name
        self.partitioned: dict[str, int] = {}
        self.consumer_groups: dict[str, ConsumerGroup] = {}
        self.routing: dict[str, Routing] = {}  # v3: per partitioned queue, same keys
        self.deadlines: LockIndex | None = None  # v4: derived lock index (None: not built yet)
        self.exchanges: dict[str, Exchange] = {}  # v4: declared exchanges by name

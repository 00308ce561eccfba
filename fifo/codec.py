"""CBOR codec: one explicit tag per class (never pickle), a schema per tag, snapshots, digest.

A tagged value is the array of the dataclass fields in declaration order. Tag numbers are
frozen: never renumber, only append. Each tag has a schema (field names, wire types, defaults)
derived from its dataclass: a decoder accepts an older, shorter array and fills the missing
trailing fields from their declared defaults, and refuses a longer array or a field of the wrong
wire type with a CodecError naming the class, the tag and the field. Encoding never changes:
every field is written, so the bytes of a value stay what they were (tests/fifo/fixtures).
"""

from __future__ import annotations

import dataclasses
import hashlib
import types
import typing
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import cbor2

from fifo import commands as c
from fifo import effects as e
from fifo import replies as r
from fifo.errors import CodecError
from fifo.meta import Meta
from fifo.state import (
    BODY_SIZE_BITS,
    BODY_SIZE_MASK,
    Consumer,
    ConsumerGroup,
    Enqueuer,
    Exchange,
    Group,
    Grouping,
    Membership,
    Message,
    Queue,
    RefMessage,
    Routing,
    State,
    Waiting,
    compact,
)

TAG_BASE = 71_000
# Frozen table: tag = TAG_BASE + position. Append only.
CLASSES: tuple[type, ...] = (
    c.ConnectionId, c.ConsumerId, c.QueueConfig, c.SimplePrefetch, c.Credited, c.Cancel,
    c.Remove, c.Dequeue, c.DeclareQueue, c.DeleteQueue, c.UpdateConfig, c.Enqueue,
    c.RegisterEnqueuer, c.Checkout, c.Settle, c.Return, c.Discard, c.Modify, c.Credit,
    c.RenewLocks, c.Purge, c.EvalConsumerTimeouts, c.ConsumerDisconnectedTimeout, c.Expire,
    c.ConnectionDown, c.NodeDown, c.NodeUp, Meta,
    r.Ok, r.Error, r.NotEnqueued, r.RejectPublish, r.DeclareOk, r.DeleteOk, r.CheckoutOk,
    r.CancelOk, r.DequeuedMessage, r.DequeueOk, r.PurgeOk,
    e.Delivery, e.Deliver, e.CreditReply, e.QueueStatus, e.Released, e.ConsumerUpdate,
    e.ConsumerCancelled, e.DeadLettered,
    c.GroupConfig, c.DeclareGroupedQueue, c.AnnotatedEnqueue, c.PurgeGroup,
    c.DeclarePartitionedQueue, c.JoinGroup, c.LeaveGroup, r.JoinGroupOk, e.GroupAssigned,
    e.GroupRevoked,
    e.RefDelivery, e.RefDeliver, r.RefDequeuedMessage, r.RefDequeueOk,
    c.BoundSettle, c.BoundReturn, c.BoundDiscard, c.BoundModify, c.BoundRenewLocks,
    c.DeclareExchange, c.DeleteExchange, c.BindQueue, c.UnbindQueue, c.PublishToExchange,
    r.Routed, r.Unroutable,
    c.BindExchange, c.UnbindExchange,
)  # fmt: skip
SNAPSHOT_FORMAT = 1
_NO_DEFAULT = object()
Check = Callable[[object], bool]


@dataclass(frozen=True, slots=True)
class FieldSchema:
    """One field of a tag: its name, wire-type check (and its text) and default, if any."""

    name: str
    check: Check
    type_text: str
    default: object = _NO_DEFAULT
    deep: bool = False  # may hold a tagged value: the encoder converts it, cbor2 cannot
    kinds: frozenset[type] | None = None  # the exact types allowed, when the hint is that simple

    @property
    def has_default(self) -> bool:
        """Whether an older encoding may omit this field."""
        return self.default is not _NO_DEFAULT


@dataclass(frozen=True, slots=True)
class TagSchema:
    """The schema of one tag: its class and fields; arrays of `required`..len(fields) decode."""

    tag: int
    cls: type
    fields: tuple[FieldSchema, ...]
    required: int  # leading fields without a default: the shortest array accepted


def _simple_kinds(hint: Any) -> frozenset[type] | None:
    """The exact types a hint allows if it is a plain type, a Literal or a union of those."""
    origin = typing.get_origin(hint)
    if hint is type(None) or hint is None:
        return frozenset({type(None)})
    if origin is typing.Literal:
        return frozenset(type(x) for x in typing.get_args(hint))
    if origin is typing.Union or origin is types.UnionType:
        kinds: set[type] = set()
        for arg in typing.get_args(hint):
            inner = _simple_kinds(arg)
            if inner is None:
                return None
            kinds |= inner
        return frozenset(kinds)
    if hint in (str, bytes, bool, int) or dataclasses.is_dataclass(hint):
        return frozenset({hint})
    return None


def _check_for(hint: Any, text: str) -> Check:
    """A wire-type check for a type hint (Literal values are checked by the machine, not here)."""
    kinds = _simple_kinds(hint)
    if kinds is not None:  # exact types: a bool is not an int, a str is not a Literal's value
        if len(kinds) == 1:
            (kind,) = kinds
            return lambda v: type(v) is kind
        return lambda v: type(v) in kinds
    origin = typing.get_origin(hint)
    if origin is typing.Union or origin is types.UnionType:
        checks = tuple(_check_for(arg, text) for arg in typing.get_args(hint))
        return lambda v: any(check(v) for check in checks)
    if origin is tuple:
        args = typing.get_args(hint)
        if len(args) == 2 and args[1] is Ellipsis:
            item_kinds = _simple_kinds(args[0])
            if item_kinds is not None:  # message ids and the like: one C-level pass
                return lambda v: type(v) is tuple and item_kinds.issuperset(map(type, v))
            item = _check_for(args[0], text)
            return lambda v: type(v) is tuple and all(item(x) for x in v)
        items = tuple(_check_for(arg, text) for arg in args)
        return lambda v: type(v) is tuple and len(v) == len(items) and all(
            check(x) for check, x in zip(items, v, strict=True))  # fmt: skip
    raise TypeError(f"no wire-type check for {text}")  # a programmer error at import


def _may_hold_tagged(hint: Any) -> bool:
    """Whether a value of this hint can contain a tagged class (else cbor2 encodes it as is)."""
    if dataclasses.is_dataclass(hint):
        return True
    return any(_may_hold_tagged(arg) for arg in typing.get_args(hint) if arg is not Ellipsis)


def schema_of(cls: type, tag: int) -> TagSchema:
    """Derive a tag's schema from its dataclass fields and type hints."""
    hints = typing.get_type_hints(cls)
    fields: list[FieldSchema] = []
    for f in dataclasses.fields(cls):
        text = str(f.type)
        default: object = _NO_DEFAULT
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        hint = hints[f.name]
        fields.append(FieldSchema(f.name, _check_for(hint, text), text, default,
                                  _may_hold_tagged(hint), _simple_kinds(hint)))  # fmt: skip
    required = len(fields)
    while required and fields[required - 1].has_default:
        required -= 1
    if any(not f.has_default for f in fields[required:]):
        raise TypeError(f"{cls.__name__}: a field without default follows one with a default")
    return TagSchema(tag, cls, tuple(fields), required)


def _codec_error(exc: BaseException) -> CodecError:
    """Our own error if cbor2 wrapped one of ours, else a CodecError with cbor2's text."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, CodecError):
            return CodecError(str(seen))
        seen = seen.__cause__ or seen.__context__
    return CodecError(str(exc))


def _tuples(value: Any) -> Any:
    if isinstance(value, list | tuple):
        return tuple(_tuples(v) for v in value)
    return value


def constructor(cls: type) -> Callable[..., Any]:
    """A function equal to `cls(*fields)` for a frozen slotted dataclass without __post_init__,
    about 3x faster: it sets the slots through their member descriptors (generated, like the
    dataclass's own __init__, from the class's fields)."""
    if not dataclasses.is_dataclass(cls) or hasattr(cls, "__post_init__"):
        raise TypeError(f"{cls.__name__}: not a plain dataclass")
    names = [f.name for f in dataclasses.fields(cls)]
    namespace: dict[str, Any] = {"_new": object.__new__, "_cls": cls}
    for name in names:
        namespace[f"_set_{name}"] = getattr(cls, name).__set__  # a slot's member descriptor
    body = "".join(f"    _set_{name}(obj, {name})\n" for name in names)
    source = f"def make({', '.join(names)}):\n    obj = _new(_cls)\n{body}    return obj\n"
    exec(source, namespace)  # the source is built from the class's field names only
    made: Callable[..., Any] = namespace["make"]
    return made


def _all_fields_check(fields: tuple[FieldSchema, ...]) -> Callable[[list[Any]], bool]:
    """One generated predicate checking every field's wire type (a full-width field list)."""
    namespace: dict[str, Any] = {}
    parts: list[str] = []
    for i, f in enumerate(fields):
        if f.kinds is not None and len(f.kinds) == 1:
            (namespace[f"k{i}"],) = f.kinds
            parts.append(f"type(a[{i}]) is k{i}")
        elif f.kinds is not None:
            namespace[f"k{i}"] = f.kinds
            parts.append(f"type(a[{i}]) in k{i}")
        else:
            namespace[f"c{i}"] = f.check
            parts.append(f"c{i}(a[{i}])")
    check: Callable[[list[Any]], bool] = eval("lambda a: " + (" and ".join(parts) or "True"),
                                              namespace)  # fmt: skip
    return check


@dataclass(frozen=True, slots=True)
class _Builder:
    """What `tagged` needs to build a tag's object, precomputed from its schema."""

    schema: TagSchema
    make: Callable[..., Any]
    defaults: list[Any]  # of the fields an older, shorter array may leave out
    check_all: Callable[[list[Any]], bool]
    name: str
    width: int
    required: int
    deep: tuple[int, ...]  # positions of the fields that may hold a tagged value


# the class cbor2's C decoder builds for unknown tags (not always the `cbor2.CBORTag` name)
_DECODED_TAG = type(cbor2.loads(cbor2.dumps(cbor2.CBORTag(99_999, []))))
Tree = Callable[[Any], Any]
_NESTED = frozenset({_DECODED_TAG, list, tuple, dict})


class Codec:
    """Encoder and decoder for a frozen table of tagged classes (the module uses `CODEC`).

    Both directions are one pass in Python over cbor2's C encoder and decoder: objects become
    `CBORTag` trees (per-class, from the schema: only fields that may hold a tagged value are
    visited), and decoded trees become objects through `build`. No hook runs inside cbor2.
    """

    def __init__(self, classes: tuple[type, ...], tag_base: int = TAG_BASE) -> None:
        self.schemas: dict[int, TagSchema] = {
            tag_base + i: schema_of(cls, tag_base + i) for i, cls in enumerate(classes)
        }
        self.tag_by_class: dict[type, int] = {s.cls: tag for tag, s in self.schemas.items()}
        if len({cls.__name__ for cls in classes}) != len(classes):
            raise TypeError("tagged class names must be unique (generated encoders use them)")
        self.fields: dict[type, tuple[str, ...]] = {
            s.cls: tuple(f.name for f in s.fields) for s in self.schemas.values()
        }
        # shared by the generated encoders: they call each other through E_<class> names
        self._namespace: dict[str, Any] = {"Tag": cbor2.CBORTag, "tree": self.tree}
        self.to_tree: dict[type, Tree] = {
            s.cls: self.tree_encoder(s) for s in self.schemas.values()
        }
        for cls, encode in self.to_tree.items():
            self._namespace[f"E_{cls.__name__}"] = encode
        self.builders: dict[int, _Builder] = {
            tag: _Builder(s, constructor(s.cls), [f.default for f in s.fields[s.required :]],
                          _all_fields_check(s.fields), s.cls.__name__, len(s.fields), s.required,
                          tuple(i for i, f in enumerate(s.fields) if f.deep))
            for tag, s in self.schemas.items()
        }  # fmt: skip

    def tree_encoder(self, schema: TagSchema) -> Tree:
        """value -> CBORTag(tag, [fields]) for one class, generated from its schema: a plain
        field is read as is; a field that may hold a tagged value is encoded inline for the
        types its hint names, and through `tree` for anything else."""
        parts = [self._field_source(f, hints=typing.get_type_hints(schema.cls))
                 for f in schema.fields]  # fmt: skip
        source = f"lambda v: Tag({schema.tag}, [{', '.join(parts)}])"
        encode: Tree = eval(source, self._namespace)  # built from the schema's names only
        return encode

    def _field_source(self, field: FieldSchema, hints: dict[str, Any]) -> str:
        """The expression encoding one field of `v` (see `tree_encoder`)."""
        read = f"v.{field.name}"
        if not field.deep:
            return read
        hint = hints[field.name]
        kinds = _simple_kinds(hint)
        if kinds is not None:
            plain = sorted(k.__name__ for k in kinds if not dataclasses.is_dataclass(k))
            tagged = [k for k in kinds if dataclasses.is_dataclass(k)]
            self._namespace[f"P_{field.name}"] = kinds - set(tagged)
            out = f"(t if type(t := {read}) in P_{field.name} else tree(t))" if plain else \
                f"tree({read})"  # fmt: skip
            if len(tagged) == 1:
                name = tagged[0].__name__
                self._namespace[f"C_{name}"] = tagged[0]
                inline = f"E_{name}(t) if type(t := {read}) is C_{name} else "
                rest = f"t if type(t) in P_{field.name} else tree(t)" if plain else "tree(t)"
                out = f"({inline}{rest})"
            return out
        args = typing.get_args(hint)
        if typing.get_origin(hint) is tuple and len(args) == 2 and args[1] is Ellipsis:
            item = args[0]
            if isinstance(item, type) and dataclasses.is_dataclass(item):  # Deliver.messages
                name = item.__name__
                self._namespace[f"C_{name}"] = item
                return (f"([E_{name}(x) if type(x) is C_{name} else tree(x) for x in t] "
                        f"if type(t := {read}) is tuple else tree(t))")  # fmt: skip
        return f"tree({read})"

    def tree(self, value: Any) -> Any:
        """A value with our objects replaced by their CBORTag trees (lists, tuples walked)."""
        encode = self.to_tree.get(type(value))
        if encode is not None:
            return encode(value)
        if type(value) is tuple or type(value) is list:
            tree = self.tree
            return [tree(item) for item in value]
        return value

    def default(self, encoder: Any, value: Any) -> None:
        """cbor2's hook for what `tree` did not reach (a dict's values, say): same encoding."""
        to_tree = self.to_tree.get(type(value))
        if to_tree is None:
            raise CodecError(f"cannot encode {type(value).__name__}")
        encoder.encode(to_tree(value))

    def tagged(self, raw: Any, check_types: bool) -> Any:
        """The object of one decoded tag (its nested values built first), after the schema's
        length and type checks; shorter arrays take the trailing fields' defaults."""
        builder = self.builders.get(raw.tag)
        if builder is None:
            raise CodecError(f"unknown tag {raw.tag}")
        inner = raw.value
        if type(inner) is not tuple and type(inner) is not list:
            raise CodecError(f"{builder.name} (tag {raw.tag}): expected an array of fields")
        objects = self.objects
        if check_types and type(inner) is tuple:
            # cbor2 6: nested arrays are tuples already, so only fields that may hold a tagged
            # value need building (anything nested elsewhere fails the type check anyway)
            values = list(inner)
            for position in builder.deep:
                if position < len(values) and type(values[position]) in _NESTED:
                    values[position] = objects(values[position], True, True)
        else:
            values = [objects(item, check_types, True) if type(item) in _NESTED else item
                      for item in inner]  # fmt: skip
        if len(values) != builder.width:
            if not builder.required <= len(values) <= builder.width:
                raise CodecError(f"{builder.name} (tag {raw.tag}): {len(values)} fields, the "
                                 f"schema accepts {builder.required}..{builder.width}")  # fmt: skip
            values += builder.defaults[len(values) - builder.required :]
        if check_types and not builder.check_all(values):
            for f, arg in zip(builder.schema.fields, values, strict=True):
                if not f.check(arg):
                    raise CodecError(f"{builder.name} (tag {raw.tag}): field {f.name} must "
                                     f"be {f.type_text}, got {type(arg).__name__}")  # fmt: skip
        return builder.make(*values)

    def objects(self, value: Any, check_types: bool, in_tag: bool = False) -> Any:
        """A decoded tree with our tags built into objects; arrays inside a tag become tuples.

        (cbor2 6 already decodes a tag's value as tuples, cbor2 5 as lists: both end as tuples.)
        """
        kind = type(value)
        if kind is _DECODED_TAG:
            return self.tagged(value, check_types)
        if kind is tuple:
            for item in value:
                if type(item) in _NESTED:
                    break
            else:
                return value  # plain items (message ids, annotations): already final
        if kind is list or kind is tuple:
            items = [self.objects(item, check_types, in_tag) for item in value]
            return tuple(items) if in_tag or kind is tuple else items
        if kind is dict:
            return {self.objects(k, check_types, in_tag): self.objects(v, check_types, in_tag)
                    for k, v in value.items()}  # fmt: skip
        return value

    def encode(self, obj: object) -> bytes:
        """Canonical CBOR of an object (or a list of them)."""
        try:
            blob: bytes = cbor2.dumps(self.tree(obj), default=self.default, canonical=True)
            return blob
        except CodecError:
            raise
        except Exception as exc:  # cbor2 raises several types for unencodable values
            raise _codec_error(exc) from exc

    def decode(self, data: bytes, check_types: bool = True) -> Any:
        """Decode bytes made by `encode` (or by an older schema); bad input raises CodecError."""
        if type(data) is not bytes:
            if not isinstance(data, bytes | bytearray | memoryview):
                raise CodecError("decode expects bytes")
            data = bytes(data)
        try:
            raw = cbor2.loads(data, max_depth=64)
        except Exception as exc:  # cbor2 raises several types on malformed input
            raise _codec_error(exc) from exc
        try:
            if type(raw) is _DECODED_TAG:  # a single command, reply or effect
                return self.tagged(raw, check_types)
            return self.objects(raw, check_types)
        except CodecError:
            raise
        except Exception as exc:  # e.g. an unhashable map key
            raise CodecError(f"{type(exc).__name__}: {exc}") from exc


CODEC = Codec(CLASSES)
_default = CODEC.default


def schema(cls: type) -> TagSchema:
    """The schema of a tagged class (what the fast paths in fifo/wire.py are derived from)."""
    return CODEC.schemas[CODEC.tag_by_class[cls]]


def encode(obj: object) -> bytes:
    """Encode a command, reply, effect, spec, config, id or Meta (or a list of them) to CBOR."""
    return CODEC.encode(obj)


def decode(data: bytes) -> Any:
    """Decode bytes made by `encode`; malformed, longer or mistyped input raises CodecError."""
    return CODEC.decode(data)


def decode_unchecked(data: bytes) -> Any:
    """`decode` without the wire-type checks (lengths are still checked).

    For stored fuzzer logs only: they keep deliberately mistyped commands (bad input the machine
    must refuse), which the wire decoder would refuse before the machine saw them.
    """
    return CODEC.decode(data, check_types=False)


# --- snapshots ----------------------------------------------------------------------------------

# Snapshot records are positional arrays as well. A field added to a state class is appended to
# its record, with its default listed here, so older snapshots (shorter records) still restore.
# v3 appended (pos, group, enqueued_at) to messages and the grouping to queues: they are written
# only when set (a grouped queue's messages, a grouped queue), so v1/v2 snapshots keep their bytes.
_RECORD_WIDTH = {"message": 9, "consumer": 19, "enqueuer": 6, "queue": 14}
_RECORD_DEFAULTS: dict[str, tuple[Any, ...]] = {  # kind -> defaults of appended trailing fields
    "message": (0, None, 0),
    "queue": (None,),
}


def _record(v: Any, kind: str) -> list[Any]:
    """A snapshot record padded to today's width; a longer or malformed one is a CodecError."""
    width = _RECORD_WIDTH[kind]
    defaults = _RECORD_DEFAULTS.get(kind, ())
    shortest = width - len(defaults)
    if not isinstance(v, list) or not shortest <= len(v) <= width:
        size = len(v) if isinstance(v, list) else type(v).__name__
        raise CodecError(f"{kind} record of {size} fields, expected {shortest}..{width}")
    return v + list(defaults[len(v) - shortest :])


def _msg_out(item: Waiting) -> list[Any]:
    # v4: a body kept in the log is written as [ref, size] in the body's place; a plain message
    # kept as its packed int exactly as the RefMessage it stands for (every field its default)
    if isinstance(item, int):
        return [[item >> BODY_SIZE_BITS, item & BODY_SIZE_MASK], None, 0, 0, [], 0]
    m = item
    body: Any = [m.ref, m.size] if type(m) is RefMessage else m.body
    if m.pos:
        return [body, m.expiry, m.delivery_count, m.acquired_count, list(m.annotations), m.lock,
                m.pos, m.group, m.enqueued_at]  # fmt: skip
    return [body, m.expiry, m.delivery_count, m.acquired_count, list(m.annotations), m.lock]


def _msg_in(v: Any) -> Message:
    v = _record(v, "message")
    m = RefMessage(v[0][0], v[0][1], v[1]) if type(v[0]) is list else Message(v[0], v[1])
    m.delivery_count, m.acquired_count, m.annotations, m.lock = v[2], v[3], _tuples(v[4]), v[5]
    m.pos, m.group, m.enqueued_at = v[6], v[7], v[8]
    return m


def _grouping_out(g: Grouping) -> list[Any]:
    return [
        g.config, g.next_pos,
        [[x.gid, x.owner, x.checked_out, [_msg_out(m) for m in x.returns],
          [_msg_out(m) for m in x.ready]] for x in g.groups.values()],
        list(g.idle),
    ]  # fmt: skip


def _grouping_in(v: Any) -> Grouping | None:
    if v is None:
        return None
    g = Grouping(v[0])
    g.next_pos = v[1]
    for gid, owner, checked_out, returns, ready in v[2]:
        x = Group(gid)
        x.owner, x.checked_out = owner, checked_out
        x.returns = [_msg_in(m) for m in returns]
        x.ready = deque(_msg_in(m) for m in ready)
        g.groups[gid] = x
    g.idle = dict.fromkeys(v[3])
    g.rebuild()
    return g


def _consumer_out(x: Consumer) -> list[Any]:
    return [
        x.key, x.tag, x.connection, x.attach_index, x.credited, x.prefetch, x.priority,
        x.timeout_ms, x.once, x.status, x.suspected_since, x.disconnected_fired,
        list(x.timed_out), x.next_msg_id, [[i, _msg_out(m)] for i, m in x.checked_out.items()],
        x.credit, x.delivery_count, x.drain, x.in_service,
    ]  # fmt: skip


def _consumer_in(v: Any) -> Consumer:
    v = _record(v, "consumer")
    x = Consumer(v[0], v[1], v[2], v[3])
    (x.credited, x.prefetch, x.priority, x.timeout_ms, x.once, x.status, x.suspected_since,
     x.disconnected_fired) = v[4:12]  # fmt: skip
    x.timed_out = list(v[12])
    x.next_msg_id = v[13]
    x.checked_out = {i: _msg_in(m) for i, m in v[14]}
    x.credit, x.delivery_count, x.drain, x.in_service = v[15:19]
    return x


def _enqueuer_out(x: Enqueuer) -> list[Any]:
    return [x.name, x.connection, x.next_seq, x.status, x.blocked, x.down_index]


def _enqueuer_in(v: Any) -> Enqueuer:
    v = _record(v, "enqueuer")
    x = Enqueuer(v[0], v[1])
    x.next_seq, x.status, x.blocked, x.down_index = v[2:6]
    return x


def _queue_out(q: Queue) -> list[Any]:
    return [
        q.name, q.config, [_msg_out(m) for m in q.ready], [_msg_out(m) for m in q.returns],
        q.messages_total, q.bytes_ready, q.bytes_checkout,
        [_enqueuer_out(x) for x in q.enqueuers.values()], q.blocked_count,
        [_consumer_out(x) for x in q.consumers.values()], [_consumer_out(x) for x in q.waiting],
        [[p, list(keys)] for p, keys in q.service.items()], q.last_active,
        *([] if q.grouping is None else [_grouping_out(q.grouping)]),
    ]  # fmt: skip


def _queue_in(v: Any, lined: bool) -> Queue:
    v = _record(v, "queue")
    q = Queue.lined(v[0], v[1], v[12]) if lined else Queue(v[0], v[1], v[12])
    q.ready.extend(compact(_msg_in(m)) for m in v[2])  # (v1-v3: Messages, kept as they are)
    q.returns.extend(compact(_msg_in(m)) for m in v[3])
    q.messages_total, q.bytes_ready, q.bytes_checkout = v[4:7]
    q.enqueuers = {x.name: x for x in (_enqueuer_in(e) for e in v[7])}
    q.blocked_count = v[8]
    q.consumers = {x.key: x for x in (_consumer_in(e) for e in v[9])}
    q.waiting = [_consumer_in(e) for e in v[10]]
    q.service = {p: deque(keys) for p, keys in v[11]}
    for x in (*q.consumers.values(), *q.waiting):
        q.key_by_id[c.ConsumerId(x.tag, x.connection)] = x.key
    q.grouping = _grouping_in(v[13])
    return q


def _consumer_group_out(g: ConsumerGroup) -> list[Any]:
    return [
        g.name, g.queue, list(g.partitions),
        [[m.member, m.join_seq, m.epoch, m.connection, m.spec, m.tag] for m in g.members.values()],
        g.next_join_seq, g.epoch, [[p, m] for p, m in g.target.items()],
        [[p, m] for p, m in g.holder.items()], [[p, m] for p, m in g.revoking.items()],
        g.last_rebalance_index, g.last_moves, g.last_reassigned,
    ]  # fmt: skip


def _consumer_group_in(v: Any) -> ConsumerGroup:
    g = ConsumerGroup(v[0], v[1], tuple(v[2]))
    for member, join_seq, epoch, connection, spec, tag in v[3]:
        g.members[member] = Membership(member, join_seq, epoch, connection, spec, tag)
    g.next_join_seq, g.epoch = v[4], v[5]
    g.target, g.holder, g.revoking = dict(map(tuple, v[6])), dict(map(tuple, v[7])), dict(
        map(tuple, v[8])
    )
    g.last_rebalance_index, g.last_moves, g.last_reassigned = v[9], v[10], v[11]
    return g


def _routing_in(cursor: int, enqueuers: Any) -> Routing:
    r = Routing()
    r.cursor = cursor
    r.enqueuers = {x.name: x for x in map(_enqueuer_in, enqueuers)}
    return r


def _bindings_out(bindings: dict[str, dict[Any, None]]) -> list[Any]:
    return [[target, [[key, [list(pair) for pair in arguments]] for key, arguments in keys]]
            for target, keys in bindings.items()]  # fmt: skip


def _bindings_in(v: Any) -> dict[str, dict[Any, None]]:
    return {target: {(key, _tuples(arguments)): None for key, arguments in keys}
            for target, keys in v}  # fmt: skip


def _exchange_out(x: Exchange) -> list[Any]:
    out: list[Any] = [x.name, x.exchange_type, _bindings_out(x.bindings)]
    if x.auto_delete or x.exchange_bindings or x.internal:  # three more only when any is set
        out += [x.auto_delete, _bindings_out(x.exchange_bindings), x.internal]
    return out


def _exchange_in(v: Any) -> Exchange:
    x = Exchange(v[0], v[1], len(v) > 3 and v[3] is True, len(v) > 5 and v[5] is True)
    x.bindings = _bindings_in(v[2])
    if len(v) > 4:
        x.exchange_bindings = _bindings_in(v[4])
    return x


def snapshot(state: State) -> bytes:
    """Encode the whole state (with its machine version) as canonical CBOR.

    v3's partitioned queues (with their routing: round-robin cursor and publishers' dedup) and
    consumer groups are a fifth element, written only when there is any, so v1/v2 snapshots keep
    their bytes; v4's exchanges a sixth, written only when there is any (so v3 states keep
    theirs)."""
    body = [SNAPSHOT_FORMAT, state.version, state.last_time,
            [_queue_out(q) for q in state.queues.values()]]  # fmt: skip
    if state.partitioned or state.consumer_groups or state.exchanges:
        body.append([
            [[name, count] for name, count in state.partitioned.items()],
            [_consumer_group_out(g) for g in state.consumer_groups.values()],
            [[name, r.cursor, [_enqueuer_out(x) for x in r.enqueuers.values()]]
             for name, r in state.routing.items()],
        ])  # fmt: skip
    if state.exchanges:
        body.append([_exchange_out(x) for x in state.exchanges.values()])
    return bytes(cbor2.dumps(body, default=_default, canonical=True))


def restore(data: bytes) -> State:
    """Rebuild a state from `snapshot` bytes; malformed input raises CodecError."""
    try:
        v = CODEC.objects(cbor2.loads(bytes(data)), check_types=True)
        if not isinstance(v, list) or v[0] != SNAPSHOT_FORMAT:
            raise CodecError("not a fifo snapshot")
        state = State(v[1])
        state.last_time = v[2]
        lined = state.version >= 4
        state.queues = {q.name: q for q in (_queue_in(x, lined) for x in v[3])}
        if len(v) > 4:
            state.partitioned = {name: count for name, count in v[4][0]}
            state.consumer_groups = {g.name: g for g in map(_consumer_group_in, v[4][1])}
            routed = v[4][2] if len(v[4]) > 2 else []  # (written by every released v3)
            state.routing = {name: _routing_in(cursor, enqueuers)
                             for name, cursor, enqueuers in routed}  # fmt: skip
            for name in state.partitioned:  # a pre-release v3 snapshot had no routing yet
                state.routing.setdefault(name, Routing())
        if len(v) > 5:
            state.exchanges = {x.name: x for x in map(_exchange_in, v[5])}
        return state
    except Exception as exc:  # any shape error in the snapshot
        raise CodecError(f"bad snapshot: {_codec_error(exc)}") from exc


def digest(state: State) -> str:
    """Hex SHA-256 of the canonical snapshot encoding; computed on demand only."""
    return hashlib.sha256(snapshot(state)).hexdigest()


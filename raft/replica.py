"""The seam between replication and the node: everything `cluster/node` uses of `raft/`.

A `Replica` owns the pysyncobj node, the group committer and the apply lock; the node gets:
- `propose(command, on_reply)`: replicate one fifo command; its reply (a fifo Reply, an
  `InternalFailure` or a `SubmitError`) comes to `on_reply` on the loop thread once this node
  applied it (a callback, not a Future: one Future per publish is a measurable cost);
  `propose_upgrade` / `propose_hello` do the same for the two metadata entries;
- `on_applied(Applied)`: on the loop thread, in log order, after the replies of the same entry,
  the effects of every applied entry that concern this node (`on_reset(index)` instead when the
  state jumped to a snapshot: whatever was promised to clients no longer holds);
- `read(function)`: runs `function(ReplicaView)` against the current state and returns its
  result; the view is read-only and valid only during the call (callers never take a lock).

Ordering obligations (see raft/node.py for the journal's): a reply never reaches `on_reply`
before its entry is durable on this node; the effects of an entry are handed over after its
replies; `on_reset` comes in order with `on_applied`.

Bodies by reference (machine v4, issue 32): replies and effects reach the node with their bodies
(`RefDeliver` -> `Deliver`, `RefDequeueOk` -> `DequeueOk`), resolved here from `bodies` (a
bounded cache of recent bodies, `raft.bodies`) or read back from the journal on a worker thread:
an entry whose bodies are not all cached waits, and every hand-over after it waits behind it, so
replies, effects and resets keep log order while the loop goes on serving. A body that cannot be
read is logged (`body_missing`, with its index) and its message is not sent (a dequeue gets an
`InternalFailure`): never an empty body.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter, deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import structlog

from fifo.bodies import BodyMissingError, entry_index, refs_in, resolve_deliver, resolve_reply
from fifo.commands import Command, ConnectionId
from fifo.effects import Deliver, Delivery, Effect, RefDeliver
from fifo.state import State
from raft.batcher import GroupCommitter, Reply, Sink
from raft.bodies import BodyCache, read_entries_bodies, read_entry_bodies
from raft.entry import Entry, Origin
from raft.errors import StorageError, SubmitError
from raft.fastcodec import encode_command
from raft.machine_clock import CLOCK_RULE_VERSION, MachineClock
from raft.membership import MemberChange, Refusal
from raft.node import DIGEST_MESSAGES_MAX, RaftNode, RaftSettings
from raft.replicated import InternalFailure, Metadata, Outcome, ReplicatedState

T = TypeVar("T")
log = structlog.get_logger("raft.replica")
# entries read back per worker task: their bodies (at most 1024 each) fit the body cache
READ_ENTRIES_PER_TASK = 4
# how often a node with cached bodies looks whether its state still holds any message
BODIES_DRAINED_CHECK_S = 1.0
Lookup = Callable[[int], bytes]

__all__ = ["Applied", "Replica", "ReplicaView", "Reply", "Sink"]


@dataclass(frozen=True, slots=True)
class Applied:
    """What one applied entry means for this node: its effects for this node's connections."""

    index: int
    effects: list[Effect]


class ReplicaView:
    """Read-only access to the replicated state, valid only inside `Replica.read`."""

    __slots__ = ("_replicated",)

    def __init__(self, replicated: ReplicatedState) -> None:
        self._replicated = replicated

    @property
    def state(self) -> State:
        """The fifo state (read it with fifo's query functions; never change it)."""
        return self._replicated.state

    @property
    def meta(self) -> Metadata:
        """The cluster metadata (members, versions, connections by node, down nodes)."""
        return self._replicated.meta

    def messages_held(self) -> int:
        """Messages in every queue (ready, returned, checked out); O(queues)."""
        return self._replicated.messages_held()

    def connections_of(self, node: str) -> list[tuple[int, int]]:
        """The (incarnation, number) of every connection of `node` the state lists."""
        return list(self._replicated.meta.connections.get(node, {}))

    def lists_connection(self, connection: ConnectionId) -> bool:
        """Whether the state lists `connection` (so a ConnectionDown for it means something)."""
        conns = self._replicated.meta.connections.get(connection.node)
        return conns is not None and (connection.incarnation, connection.number) in conns

    def upgrade_target(self) -> int | None:
        """The version every member supports, if above the effective one."""
        return self._replicated.upgrade_target()

    def upgrade_refusal(self, version: int) -> str | None:
        """Why an upgrade to `version` must be refused now, or None."""
        return self._replicated.upgrade_refusal(version)


class Replica:
    """One node's replica of the log: propose, applied outcomes, read-only views."""

    def __init__(
        self,
        settings: RaftSettings,
        loop: asyncio.AbstractEventLoop,
        on_applied: Callable[[Applied], None],
        on_reset: Callable[[int], None],
        observe: Callable[[Outcome, bool], None] | None = None,
    ) -> None:
        self.settings = settings
        self._loop = loop
        self._on_applied = on_applied
        self._on_reset = on_reset
        self._observe = observe
        self._node = RaftNode(settings, self._outcome_tick, self._snapshot_tick, loop)
        self.clock = MachineClock()  # stamps entries; the machine's time as this node sees it
        self._committer = GroupCommitter(self._node, loop, clock=self.clock)
        self._clocks_judged = False  # latched by _judging_clocks
        self.bodies = BodyCache()
        self.bodies_missing = 0  # messages not sent: their body could not be read back
        # hand-overs waiting for bodies read off the loop, in log order: (refs, hand over)
        self._waiting: deque[tuple[list[int], Callable[[Lookup], None]]] = deque()
        self._node.pinned_indexes = self._pinned_entries  # snapshots retain what is being read
        self._reading = False
        self._destroyed = False
        self._bodies_checked_at = -1e9
        # the bodies read for the waiting hand-overs, each kept until the last one needing it
        # is handed over (the cache may drop them: one delivery can need more than it holds)
        self._needed: Counter[int] = Counter()  # ref -> waiting hand-overs that need it
        self._fresh: dict[int, bytes] = {}
        self._unreadable: dict[int, str] = {}  # raft index -> why, while hand-overs wait
        self._reader: ThreadPoolExecutor | None = None

    # --- proposing (loop thread) ---------------------------------------------------------------

    def propose(self, command: Command, on_reply: Sink, blob: bytes | None = None) -> None:
        """Replicate `command` (`blob`: its encoding, if the caller has it already)."""
        encoded = blob if blob is not None else bytes(encode_command(command))
        self._committer.submit(encoded, on_reply, command)

    async def room(self) -> None:
        """Return once this node has room for more commands (a reader waits on it before it
        reads more: `GroupCommitter.room`)."""
        await self._committer.room()

    def propose_upgrade(self, version: int, on_reply: Sink) -> None:
        """Replicate a switch of the effective machine version to `version`."""
        now, machine_ms = self.clock.stamp()

        def make(origin: Origin) -> Entry:
            return Entry("upgrade", now, origin, version=version, machine_ms=machine_ms)

        self._committer.submit_entry(make, on_reply)

    def propose_hello(self, on_reply: Sink) -> None:
        """Record this node incarnation and the highest machine version its code supports."""
        (now, machine_ms), settings = self.clock.stamp(), self.settings

        def make(origin: Origin) -> Entry:
            return Entry(
                "hello",
                now,
                origin,
                node=settings.node_id,
                version=settings.supported_version,
                incarnation=settings.incarnation,
                machine_ms=machine_ms,
            )

        self._committer.submit_entry(make, on_reply)

    def change_membership(
        self, change: MemberChange, on_done: Callable[[Any, Refusal | None], None]
    ) -> None:
        """Append a membership change (this node should lead); `on_done(reply, None)` on the
        loop thread once this node applied it, or `on_done(None, why)` if it was refused or
        lost. No timeout here: the caller bounds its wait."""

        def done(reply: Any, refusal: Refusal | None) -> None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: shutting down
                self._loop.call_soon_threadsafe(on_done, reply, refusal)

        self._node.change_membership(change, done)

    def peers(self) -> list[str]:
        """The other members of the applied member set (cluster.toml's peers until a change)."""
        return [row["id"] for row in self._node.members() if row["id"] != self.settings.node_id]

    def members(self) -> list[dict[str, Any]]:
        """The applied member set (id, raft, client; addresses None before any change)."""
        return self._node.members()

    def transfer_leadership(self) -> None:
        """Ask the leader (this node) to hand leadership to the most caught-up peer."""
        self._node.request_leadership_transfer()

    def sweep(self) -> bool:
        """Fail proposals that got no commit within their timeout, ask for a snapshot if a
        drained backlog left retained entries, and drop the cached bodies once the state holds
        no message (call periodically). True when it dropped bodies (heap to give back)."""
        self._committer.sweep()
        self._node.compact_if_drained()
        return self._drop_bodies_if_drained()

    def _drop_bodies_if_drained(self) -> bool:
        """The body cache of a drained node (16,384 bodies: 16 MiB of 1 KiB ones) is of no
        use, and held the resident set of a drained leader up; checked at most every
        BODIES_DRAINED_CHECK_S, O(queues)."""
        if not len(self.bodies) or self._waiting:
            return False
        now = time.monotonic()
        if now - self._bodies_checked_at < BODIES_DRAINED_CHECK_S:
            return False
        self._bodies_checked_at = now
        if self.read(ReplicaView.messages_held):
            return False
        self.bodies.clear()
        return True

    def fail_pending(self, reason: SubmitError) -> None:
        """Fail every pending proposal with `reason` (shutting down)."""
        self._committer.fail_all(reason)

    def destroy(self) -> None:
        """Flush the journal and stop replication (after `fail_pending`)."""
        self._node.sync_journal()
        self._node.destroy_synchronous()
        self._destroyed = True  # a read finishing now starts no other
        if self._reader is not None:
            self._reader.shutdown(wait=False, cancel_futures=True)

    # --- reading ---------------------------------------------------------------------------

    def read(self, function: Callable[[ReplicaView], T]) -> T:
        """`function(view)` against the current state, with no entry applied meanwhile."""
        with self._node.lock:
            return function(ReplicaView(self._node.replicated_state))

    def status(self, with_digest: bool = True, bounded: bool = True) -> dict[str, Any]:
        """This node's status map (role, term, indexes, versions, digest, leader, ...); the
        digest is left out above `raft.node.DIGEST_MESSAGES_MAX` messages unless not `bounded`."""
        return self._node.status(with_digest, DIGEST_MESSAGES_MAX if bounded else None)

    def has_quorum(self) -> bool:
        """Whether this node is connected to a majority of the cluster (the status map's
        `has_quorum`, without building the map)."""
        return bool(self._node.hasQuorum)

    @property
    def stopped_reason(self) -> str | None:
        """Why this node stopped applying (older code than the log needs), or None."""
        return self._node.stopped_reason

    def role(self) -> str:
        """leader | follower | candidate | stopped."""
        return self._node.role()

    def applied_index(self) -> int:
        """The last log index applied here: the replicated state changes only when it moves."""
        return self._node.applied_index()

    def applied_state_current(self) -> bool:
        """Whether this node's applied state is current: deliveries may go out (raft.contact)."""
        return self._node.applied_state_current()

    def leader_id(self) -> str | None:
        """The current leader as this node sees it."""
        return self._node.leader_id()

    def peer_connected(self, node_id: str) -> bool:
        """Whether this node has a live raft connection to `node_id`."""
        return self._node.peer_connected(node_id)

    def storage_damage(self) -> StorageError | None:
        """Damage found in the journal while running (replication stopped on it), or None."""
        return self._node.storage_damage()

    def raft_timer_at(self) -> float | None:
        """The loop time of the raft ticker's next timer wake-up (None if not armed)."""
        return self._node.timer_at()

    def bound(self) -> bool:
        """Whether the raft port is bound."""
        return self._node.bound()

    def machine_now_ms(self) -> int:
        """The machine's time now, for the leader's timers: from machine version 4, this node's
        estimate (the time its next entry carries, so a deadline it finds due is due when that
        entry applies); before, its wall clock, as those versions' entries carry."""
        if self._node.replicated_state.meta.effective_version >= CLOCK_RULE_VERSION:
            return self.clock.estimate_ms()
        return self.clock.wall_ms()

    def clock_steps_rejected(self) -> dict[str, int]:
        """Rejected wall-clock steps (episodes) by submitting node, as applied here."""
        return dict(self.clock.steps.rejected)

    def force_snapshot(self) -> None:
        """Ask for a snapshot (log compaction) now."""
        self._node.forceLogCompaction()

    def observe_io(
        self, fsync: Callable[[float], None] | None, apply: Callable[[float], None] | None
    ) -> None:
        """Observers of the seconds spent per journal fsync and per entry applied (metrics)."""
        self._node.observe_fsync = fsync
        self._node.observe_apply = apply

    # --- from pysyncobj's tick (on the loop) --------------------------------------------------

    def _outcome_tick(self, outcome: Outcome) -> None:
        """An applied entry (inside the tick, on the loop, after the entry is durable here):
        hand what concerns this node incarnation over at once, in log order."""
        origin = outcome.origin
        settings = self.settings
        if outcome.time_ms > 0:
            self.clock.applied(outcome.time_ms)
            self.clock.steps.observe(origin, outcome.clock_skew_ms, self._judging_clocks())
        mine = origin is not None and origin[:2] == (settings.node_id, settings.incarnation)
        if self._observe is not None:
            self._observe(outcome, mine)
        effects = [
            e
            for e in outcome.effects
            if getattr(getattr(e, "connection", None), "node", None) == settings.node_id
        ]
        if mine or effects:
            self._deliver(outcome, effects, mine)

    def _judging_clocks(self) -> bool:
        """Whether applied entries' clocks are judged (counted, logged): from the first time
        this node's state was current on (not while it replays its journal at start)."""
        if not self._clocks_judged:
            self._clocks_judged = self._node.applied_state_current()
        return self._clocks_judged

    def _deliver(self, outcome: Outcome, effects: list[Effect], mine: bool) -> None:
        refs = refs_in(effects)
        if mine:
            refs += refs_in(outcome.replies)

        def hand_over(lookup: Lookup) -> None:
            effects[:] = self._resolved_effects(effects, lookup)  # (v4 emits RefDeliver only)
            if mine and refs:
                outcome.replies = [self._resolved_reply(r, lookup) for r in outcome.replies]
            self._committer.resolve(outcome)  # replies first, then the effects of the same entry
            self._on_applied(Applied(outcome.index, effects))

        self._in_order(refs, hand_over)

    def _snapshot_tick(self, index: int) -> None:
        """Inside the tick: the state jumped to a snapshot; tell the node, in order."""
        self.clock.applied(self._node.replicated_state.meta.last_time_ms)
        self._in_order([], lambda _lookup: self._on_reset(index))

    # --- bodies by reference (machine v4) ---------------------------------------------------

    def read_body(self, ref: int) -> bytes:
        """The body at meta index `ref`, from the cache or read back now (blocking: for bounded
        admin reads, never deliveries); BodyMissingError if the log no longer holds it."""
        body = self.bodies.get(ref)
        if body is None:
            bodies = read_entry_bodies(self._node.read_entry, entry_index(ref))
            self.bodies.put_all(bodies)
            body = bodies.get(ref)
            if body is None:
                raise BodyMissingError(ref, "the command at that index carries no body")
        return body

    def resolve_now(self, effect: RefDeliver) -> Deliver | None:
        """`effect` with its bodies (cache, else read now: for the rare reconciliation of held
        deliveries); None when none of its messages could be resolved."""
        resolved = self._resolved_deliver(effect, self.read_body)
        return resolved if resolved.messages else None

    def handovers_waiting(self) -> int:
        """How many applied entries' hand-overs still wait for their bodies."""
        return len(self._waiting)

    def _in_order(self, refs: list[int], hand_over: Callable[[Lookup], None]) -> None:
        """Run `hand_over` now if nothing waits and every body is cached, else behind the
        hand-overs already waiting, once its bodies were read off the loop."""
        if not self._waiting and all(self.bodies.has(ref) for ref in refs):
            hand_over(self._lookup)
            return
        self._waiting.append((refs, hand_over))
        self._needed.update(refs)
        self._read_next()

    def _pinned_entries(self) -> set[int]:
        """The raft indexes of the entries the waiting hand-overs read bodies from (a message
        delivered and settled at once is no longer live, yet its body is still to be read)."""
        return {entry_index(ref) for refs, _hand_over in self._waiting for ref in refs}

    def _lookup(self, ref: int) -> bytes:
        body = self._fresh.get(ref)
        if body is None:
            body = self.bodies.get(ref)
        if body is None:
            why = self._unreadable.get(entry_index(ref), "not read back")
            raise BodyMissingError(ref, why)
        return body

    def _ready(self, refs: list[int]) -> bool:
        return all(
            ref in self._fresh or self.bodies.has(ref) or entry_index(ref) in self._unreadable
            for ref in refs
        )

    def _flush(self) -> None:
        """Hand over, in order, every waiting entry whose bodies are at hand."""
        while self._waiting and self._ready(self._waiting[0][0]):
            refs, hand_over = self._waiting.popleft()
            try:
                hand_over(self._lookup)
            finally:
                self._release(refs)
        if not self._waiting:
            self._unreadable = {}

    def _release(self, refs: list[int]) -> None:
        """A hand-over that needed `refs` is done: drop the bodies no other one waits for."""
        needed = self._needed
        for ref in refs:
            left = needed[ref] - 1
            if left:
                needed[ref] = left
            else:
                del needed[ref]
                self._fresh.pop(ref, None)

    def _read_next(self) -> None:
        """Start reading the entries the waiting hand-overs need (the first ones first)."""
        if self._reading or self._destroyed:
            return
        self._flush()
        wanted: dict[int, None] = {}
        for refs, _hand_over in self._waiting:
            for ref in refs:
                if not self._ready([ref]):  # (an entry found unreadable is not read again)
                    wanted[entry_index(ref)] = None
            if len(wanted) >= READ_ENTRIES_PER_TASK:
                break
        if not wanted:
            return
        if self._reader is None:
            self._reader = ThreadPoolExecutor(1, thread_name_prefix="quorumq-bodies")
        self._reading = True
        entries = list(wanted)[:READ_ENTRIES_PER_TASK]
        future = self._reader.submit(read_entries_bodies, self._node.read_entry, entries)
        future.add_done_callback(self._read_done)

    def _read_done(self, done: Future[tuple[dict[int, bytes], dict[int, str]]]) -> None:
        """On the worker: hand the result to the loop (gone when shutting down)."""
        with contextlib.suppress(RuntimeError):  # the loop is closed
            self._loop.call_soon_threadsafe(self._read, done)

    def _read(self, done: Future[tuple[dict[int, bytes], dict[int, str]]]) -> None:
        """On the loop: a read finished; keep its bodies and hand over what they allow."""
        self._reading = False
        try:
            bodies, unreadable = done.result()
        except Exception as err:  # a bug in the reader: every wanted body counts as unreadable
            log.error("body_read_failed", error=repr(err))
            bodies, unreadable = {}, {}
            for refs, _hand_over in self._waiting:
                self._unreadable.update((entry_index(ref), repr(err)) for ref in refs)
        self.bodies.put_all(bodies)
        needed = self._needed
        self._fresh.update((ref, body) for ref, body in bodies.items() if ref in needed)
        self._unreadable.update(unreadable)
        self._flush()
        self._read_next()

    def _resolved_effects(self, effects: list[Effect], lookup: Lookup) -> list[Effect]:
        out: list[Effect] = []
        for effect in effects:
            if type(effect) is RefDeliver:
                effect = self._resolved_deliver(effect, lookup)
                if not effect.messages:
                    continue
            out.append(effect)
        return out

    def _resolved_deliver(self, effect: RefDeliver, lookup: Lookup) -> Deliver:
        """`effect` with its bodies; a message whose body is missing is logged and left out."""
        try:
            return resolve_deliver(effect, lookup)
        except BodyMissingError:
            pass
        kept: list[Delivery] = []
        for item in effect.messages:
            single = RefDeliver(effect.connection, effect.queue, effect.tag, effect.consumer_key,
                                (item,))  # fmt: skip
            try:
                kept.extend(resolve_deliver(single, lookup).messages)
            except BodyMissingError as err:
                self.bodies_missing += 1
                log.error("body_missing", ref=err.ref, raft_index=entry_index(err.ref),
                          queue=effect.queue, msg_id=item.msg_id, error=str(err))  # fmt: skip
        return Deliver(effect.connection, effect.queue, effect.tag, effect.consumer_key,
                       tuple(kept))  # fmt: skip

    def _resolved_reply(self, reply: Any, lookup: Lookup) -> Any:
        try:
            return resolve_reply(reply, lookup)
        except BodyMissingError as err:
            self.bodies_missing += 1
            log.error("body_missing", ref=err.ref, raft_index=entry_index(err.ref),
                      error=str(err))  # fmt: skip
            return InternalFailure(str(err))

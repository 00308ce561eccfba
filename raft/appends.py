"""AppendEntries on both sides of `raft.node.RaftNode`: durable acks, one send per tick, guards.

- a follower's acks are collected during a tick and sent after one fsync covers them all
  (`send_ack`, `_flush_acks`): entries are on disk before the leader counts them;
- the leader's AppendEntries (pysyncobj sends after every appended entry, every apply and every
  heartbeat) go out once per tick, then the leader fsyncs (`send_append_entries`,
  `_flush_sends`), never to a follower whose connection is backed up (`guard_send_buffers`);
  one that would carry only a new commit index waits up to
  COMMIT_SEND_DELAY_S for the next entry's to carry it (`_commit_send_due`); an idle leader
  heartbeats every `idle_heartbeat_s` instead of `heartbeat_ms` (`_stretch_idle_heartbeat`),
  and a follower's reply that leaves it idle needs no tick (`_event_handled_lightly`);
- Raft's log matching, which pysyncobj skips: a follower cuts its log only at the first
  conflicting entry (`_trim_present_entries`), and a snapshot chunk never advances its commit
  index over its own unverified entries (`_without_commit_advance`);
- contact (raft.contact): which follower answered the leader, and acknowledged its leadership.
"""

from __future__ import annotations

import contextlib
from typing import Any

import structlog
from pysyncobj.monotonic import monotonic as monotonic_time
from pysyncobj.syncobj import _RAFT_STATE

from raft.contact import Contact
from raft.errors import DiskFullError
from raft.node_base import NodeBase
from raft.settings import int_or
from raft.transfer import TRANSFER_BUFFERED_MAX, TransferFailed, send_buffered

log = structlog.get_logger("raft")

# a follower whose connection holds more bytes than this not yet taken by its socket is sent no
# more entries until it drains (`guard_send_buffers`): pysyncobj sends every entry past the
# follower's next index in each round, whatever the socket takes. 2 MiB is 50 ms of 16 KiB
# publishes at 2,600/s, enough to keep a follower's socket busy between two of the leader's
# rounds; each follower's buffer is resident on the leader
APPEND_BUFFERED_MAX = 2 * 1024 * 1024

# one AppendEntries packs the entries starting within this many bytes (`entries_to_send`);
# pysyncobj's own batch size (raft.settings, 64 MiB) stays above any single entry, which it
# would otherwise pickle and send in pieces
APPEND_MESSAGE_BYTES = 1024 * 1024


class FollowerBackedUp(TransferFailed):
    """The connection to `node` holds more than APPEND_BUFFERED_MAX: the send round goes on
    without it (its next index is back at the first entry it was not sent)."""


# how long the leader may hold back an AppendEntries that would only carry a new commit index:
# the next entry's AppendEntries (usually sooner, under load) carries it for free
COMMIT_SEND_DELAY_S = 0.002


class Appends(NodeBase):
    """RaftNode's AppendEntries steps (module doc)."""

    def send_ack(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """A follower ack: collected, and sent at the next tick (or the end of this one) after
        one fsync for all of them: entries must be on disk before the leader counts them."""
        self._deferred_acks.append((args, kwargs))

    def _flush_acks(self) -> None:
        if not self._deferred_acks:
            return
        self.sync_journal()
        acks, self._deferred_acks = self._deferred_acks, []
        for args, kwargs in acks:
            self.syncobj_send_ack(args, kwargs)

    def _hold_commit_send(self, applied: bool) -> None:
        """After an apply: pysyncobj (unbatched) sends an AppendEntries after every apply, only
        to carry the new commit index; it costs a message and an ack per follower per entry, so
        the leader holds it back up to COMMIT_SEND_DELAY_S for a new entry's to carry it."""
        if applied and self._commit_send_at is None and self._isLeader():
            self._commit_send_at = monotonic_time() + COMMIT_SEND_DELAY_S

    def _commit_send_due(self, timeout: float) -> float:
        """Schedule the held-back commit index: now if due (or if entries go out anyway), else
        poll no longer than until it is due."""
        if self._commit_send_at is None:
            return timeout
        left = self._commit_send_at - float(monotonic_time())
        if self._send_pending or left <= 0:
            self._commit_send_at = None
            self._send_pending = self._send_pending or bool(self._isLeader())
            return timeout
        return min(timeout, left)

    def send_append_entries(self) -> None:
        """pysyncobj (unbatched) sends after every appended entry, after every apply and on
        each heartbeat: collect them and send once, before the tick ends in `_end_of_tick`."""
        self._send_pending = True

    def entries_to_send(self, start: int, batch_bytes: int) -> Any:
        """One AppendEntries carries the entries starting within APPEND_MESSAGE_BYTES of the
        first's start (at least one), counted from the journal's offsets: pysyncobj read every
        entry to the log's end and packed up to its 64 MiB. A follower that fell behind (a
        pause, its fsyncs) was sent its whole gap in one message, read back, encoded, buffered
        and, on the follower, decoded and written at once: with 16 KiB bodies 130-190 MiB of
        buffers on a node and its loop stalled up to 400 ms (`scripts/bench_backlog.py --body
        16384`). Smaller messages let `guard_send_buffers` stop the round near its bound."""
        log = self.raft_log
        first = int(log[0][1])
        if start < first or start > first + len(log) - 1:
            return []
        position = start - first
        count = log.entries_within(position, min(batch_bytes, APPEND_MESSAGE_BYTES))
        return self.get_entries(start, count)

    def guard_send_buffers(self) -> None:
        """Flow control on the leader's sends: an AppendEntries with entries for a follower
        whose connection already holds more than APPEND_BUFFERED_MAX is not queued; its next
        index goes back to that message's first entry and the round goes on without it
        (`_send_round`), which gets them from there once its socket took the backlog.

        Without it, a follower slower than the publishers (its fsyncs, a pause) let the
        leader's write buffer grow without bound: 500-760 MiB with 1 KiB publishes at window
        1000 (`scripts/bench_backlog.py`, 150,000 messages in), each append to it a copy of it
        on the loop, stalls of 0.3-1.8 s and a leader change every few seconds."""
        transport = self.raft_transport
        send = transport.send

        def send_bounded(node: Any, message: Any) -> bool:
            if (
                isinstance(message, dict)
                and message.get("entries")
                and send_buffered(transport, node) > APPEND_BUFFERED_MAX
            ):
                self.set_next_index(node, int(message["prevLogIdx"]) + 1)
                raise FollowerBackedUp(node)
            return bool(send(node, message))

        transport.send = send_bounded

    def _flush_sends(self) -> None:
        if not self._send_pending:
            return
        self._send_pending = False
        # leader: send first so the followers' fsyncs overlap ours; ours still completes before
        # the loop reads any ack (we return to it after this), so an entry is never counted as
        # committed, nor its commit index sent out, before the leader's copy is on disk
        self._send_round(self._transfers_on_hold())
        self._stretch_idle_heartbeat()
        self.sync_journal()

    def _send_round(self, skip: frozenset[Any]) -> None:
        """pysyncobj's send of AppendEntries to every follower but `skip`; a follower whose
        snapshot chunk could not be read, or whose connection is backed up
        (`guard_send_buffers`), is left out and the round goes again without it (the followers
        before it get their messages again: Raft takes repeats)."""
        for _attempt in range(len(self.other_nodes) + 1):
            try:
                self.syncobj_send_append_entries(skip=skip)
                return
            except TransferFailed as failed:
                skip = skip | {failed.node}

    def _transfers_on_hold(self) -> frozenset[Any]:
        """Followers whose connection is backed up (`guard_send_buffers`), and followers owed
        snapshot chunks that cannot have one now, left out of this send round:
        every one while a snapshot is being taken (there is no dump to read), and one whose
        connection is behind (raft.transfer). pysyncobj's send loop, given no chunk, spins for
        the rest of its heartbeat period sending empty messages (thousands per round; for ever
        on the simulator's clock: seed 366 of the campaign); given every chunk whatever the
        socket takes, it grew the leader's write buffer by tens of MiB and stalled its loop.
        Also one whose last chunk could not be read, for TRANSFER_RETRY_S (snapshot_hooks)."""
        now = float(monotonic_time())
        holds = {node: until for node, until in self._transfer_holds.items() if until > now}
        self._transfer_holds = holds
        transport = self.raft_transport
        backed_up = {
            n for n in self.other_nodes if send_buffered(transport, n) > APPEND_BUFFERED_MAX
        }
        owed = self.nodes_needing_snapshot()
        if not owed or self.serializer_busy():
            return frozenset(owed) | backed_up
        return (
            frozenset(
                n for n in owed if n in holds or send_buffered(transport, n) > TRANSFER_BUFFERED_MAX
            )
            | backed_up
        )

    def _stretch_idle_heartbeat(self) -> None:
        """After a send: an idle leader's next heartbeat comes `idle_heartbeat_ms` later, not
        pysyncobj's `heartbeat_ms`. Idle: every follower holds every entry, all of it committed
        (so the message just sent told them the commit index), no commit index held back, no
        snapshot being sent. The heartbeat then only keeps the followers' election timers and
        contact (raft.contact) fresh; anything new (a command, an apply, a follower behind)
        sends at once or leaves the leader busy, back at `heartbeat_ms`."""
        idle_s = self.settings.idle_heartbeat_s
        if idle_s > self.settings.heartbeat_ms / 1000 and self._leader_idle():
            self.next_append_entries_time = float(monotonic_time()) + idle_s

    def _leader_idle(self) -> bool:
        """Whether this node leads and has nothing for any follower but a heartbeat."""
        return self._commit_send_at is None and self._leader_settled()

    def _leader_settled(self) -> bool:
        """Whether this node leads, every follower holds every entry, all of it committed and
        applied here, and no snapshot is being sent: nothing for a tick to commit, apply or send
        (a held-back commit index aside: its own timer sends it)."""
        if self.raft_state != _RAFT_STATE.LEADER:
            return False
        last = int(self.current_log_index())
        if int(self.commit_index) != last or int(self.last_applied) != last:
            return False
        if self.serializer_transmissions():
            return False
        matched = self.match_index
        return all(int(matched.get(node, 0)) == last for node in self.other_nodes)

    def _idle_reply(self, message: dict[str, Any]) -> bool:
        """A follower's successful answer (no reset) after which this leader is settled
        (`_leader_settled`): a tick after it would find nothing to commit, apply or send. With
        one command at a time this is the second follower's ack of every entry: the first
        one's tick committed and applied it (a tick there was a third of the leader's ticks)."""
        return (
            message.get("success") is True and not message.get("reset") and self._leader_settled()
        )

    def _event_handled_lightly(self) -> bool:
        """After a peer socket event (the ticker's `light_event`): True when every message it
        brought was an idle reply (`_idle_reply`), so no tick is needed: the leader's timers
        (its next heartbeat, the others at least every `tick_period_ms`) tick when due anyway.
        An event that brought no message (a write drained, a connection's handshake), or left
        something to send, ticks."""
        quiet, self._event_quiet = self._event_quiet, None
        return quiet is True and not self._send_pending and not self._deferred_acks

    def _receive_append(self, node: Any, message: Any) -> None:
        """An AppendEntries or snapshot chunk (or any message pysyncobj handles): guarded, then
        pysyncobj's. A follower appends the leader's entries here: on ENOSPC it does not ack
        them, and the leader sends them again (after the conflicting tail is cut) until space
        returns."""
        snapshot_chunk = (
            isinstance(message, dict)
            and message.get("type") == "append_entries"
            and "prevLogIdx" not in message
        )
        if snapshot_chunk:
            self._snapshots.cancel()  # its rename must never land over the leader's snapshot
            message = self._without_commit_advance(message)
        elif self._is_checked_append(message):
            message = self._trim_present_entries(node, message)
            if message is None:
                return
        with contextlib.suppress(DiskFullError):
            self.syncobj_on_message(node, message)
        if snapshot_chunk:
            self._commit_loaded_snapshot()

    def _is_checked_append(self, message: Any) -> bool:
        """An AppendEntries pysyncobj checks against our log (prevLogIdx), of a current term."""
        return (
            isinstance(message, dict)
            and message.get("type") == "append_entries"
            and "prevLogIdx" in message
            and "transmission" not in message
            and int(message.get("term", -1)) >= int(self.current_term)
        )

    def _trim_present_entries(self, node: Any, message: dict[str, Any]) -> dict[str, Any] | None:
        """Raft's rule, which pysyncobj skips: a follower cuts its log only at the first entry
        that conflicts (same index, other term), never entries it holds that match. pysyncobj
        cut everything after prevLogIdx on every AppendEntries, so a late or repeated one
        (reconnects, a leader resending from an older next index) took entries this follower
        had already acknowledged, and applied, off its log: the leader had counted them, so a
        confirmed entry could be on fewer nodes than a majority. Entries we already hold are
        dropped from the message (prevLogIdx moves past them); when all of them are held and
        our log goes further, nothing is cut: the message is answered here with the index the
        leader verified, and the commit index moves no further than that."""
        entries = list(message.get("entries", []))
        prev = int(message["prevLogIdx"])
        ours = self.get_entries(prev)
        if not ours or ours[0][2] != message["prevLogTerm"]:
            return message  # pysyncobj answers the mismatch (and cuts nothing)
        held = 0
        for entry in entries:
            position = held + 1
            if position >= len(ours) or ours[position][2] != entry[2]:
                break
            held += 1
        verified = prev + held
        if held < len(entries) or len(ours) - 1 == held:
            prev_term = entries[held - 1][2] if held else message["prevLogTerm"]
            return {**message, "prevLogIdx": verified, "prevLogTerm": prev_term,
                    "entries": entries[held:]}  # fmt: skip
        # every entry held and our log goes further: cut nothing; commit at most `verified`
        header = {
            key: value for key, value in message.items() if key not in ("prevLogIdx", "entries")
        }
        header["commit_index"] = min(int(message["commit_index"]), verified)
        with contextlib.suppress(DiskFullError):
            self.syncobj_on_message(node, header)
        self.send_next_node_idx(node, nextNodeIdx=verified + 1, success=True)
        return None

    def _without_commit_advance(self, message: dict[str, Any]) -> dict[str, Any]:
        """A snapshot chunk checks nothing of this node's log (no prevLogIdx), yet pysyncobj
        sets the commit index to min(the leader's, our last index) on every chunk: a follower
        holding entries no leader committed (appended while it led, cut off by a partition)
        applied them and answered their publishes Ok, and the snapshot then replaced them: a
        confirmed message lost (seed-5 chaos run). Such a message may not advance it."""
        own = int(self.commit_index)
        leader_commit = int(message.get("commit_index", 0))
        if leader_commit <= own:
            return message
        log_end = int(self.current_log_index())
        if log_end > own:  # entries of ours pysyncobj would have taken as committed
            log.info(
                "snapshot_chunk_commit_held", commit=own, log_end=log_end, leader=leader_commit
            )
        return {**message, "commit_index": own}

    def _commit_loaded_snapshot(self) -> None:
        """After a snapshot load the log is the leader's committed prefix up to the snapshot:
        commit up to it (what pysyncobj did on the last chunk)."""
        applied = int(self.last_applied)
        if applied > int(self.commit_index):
            self.commit_index = applied
            self.raft_log.setRaftCommitIndex(applied)

    def _heard_follower(self, peer: str | None, message: dict[str, Any]) -> None:
        """A follower answered our AppendEntries (raft.contact): heard; and, when it holds the
        first entry of this leadership (the no-op appended when elected), acknowledged."""
        if peer is None:
            return
        now = monotonic_time()
        contact = self._follower_contacts.setdefault(peer, Contact(self.settings.silence_s))
        contact.heard(peer, now)
        first = int(self.noop_index or 0)
        if (
            self._elected_at is not None
            and self.raft_state == _RAFT_STATE.LEADER
            and message.get("success") is True
            and first > 0
            and int_or(message.get("next_node_idx"), 0) > first
        ):
            contact.acknowledged(now, self._elected_at)

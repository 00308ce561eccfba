"""A standing backlog under the faults (issue 32): `--backlog N` publishes N messages to their own
queue before the faults start and drains them only after the faults and the workload's drain.

The backlog stands through every kill, pause, partition and power loss, while the log is
compacted around it (`--snapshot-every`): on machine v4 its bodies live only in the journal's
live entries, so a node that catches up by snapshot must also have received those entries (and
their checksums) from the leader. Each body is a function of its index (`body_for`), so any node
can be checked for delivering exactly the bytes published: the drain takes a share of the backlog
through every node in turn, each node reading the bodies back from its own storage.

What the check reports (and what makes a run invalid):
- `lost`: confirmed backlog messages that no node delivered;
- `unexpected`: deliveries whose body names no published index;
- `bad_bodies`: deliveries whose index is known but whose bytes differ (the node's own copy);
- `duplicates` (not invalid: at least once), per-node counts, and each node's snapshot installs
  (`snapshot_live_entries_installed` in its log: the nodes restored by snapshot).
The bodies are not recorded in the history (200,000 x 1 KiB would be 200 MB of it).
"""

from __future__ import annotations

import hashlib
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cluster.client import Client
from cluster.client.errors import ClusterError

QUEUE = "chaos-backlog"
BODY_BYTES_MIN = 16  # the index header and a little payload
BODY_BYTES_MAX = 1 << 20
MESSAGES_MAX = 10_000_000
FILL_WINDOW = 500  # publishes in flight while filling
FILL_TIMEOUT_S = 60.0  # the publish window may stay full this long (a healthy cluster: never)
DRAIN_PREFETCH = 200
DRAIN_IDLE_S = 3.0
SAMPLES_MAX = 10  # indexes named in the report per kind of problem
INSTALLED_EVENT = "snapshot_live_entries_installed"
_HEADER = b"bk%010d:"
_HEADER_BYTES = len(_HEADER % 0)


def body_for(index: int, size: int) -> bytes:
    """The body of backlog message `index`: a header naming it, then bytes derived from it."""
    header = _HEADER % index
    block = hashlib.sha256(header).digest()
    payload = size - len(header)
    return header + (block * (payload // len(block) + 1))[:payload]


def index_of(body: bytes) -> int | None:
    """The index a backlog body names, or None for a body that is not one."""
    head = body[:_HEADER_BYTES]
    if len(head) != _HEADER_BYTES or not head.startswith(b"bk") or not head.endswith(b":"):
        return None
    digits = head[2:-1]
    return int(digits) if digits.isdigit() else None


@dataclass(frozen=True, slots=True)
class BacklogParams:
    """How big the standing backlog is."""

    messages: int
    body_bytes: int = 1024
    drain_timeout_s: float = 600.0

    def __post_init__(self) -> None:
        if not 1 <= self.messages <= MESSAGES_MAX:
            raise ValueError(f"--backlog {self.messages}: from 1 to {MESSAGES_MAX}")
        if not BODY_BYTES_MIN <= self.body_bytes <= BODY_BYTES_MAX:
            raise ValueError(
                f"--backlog-body {self.body_bytes}: from {BODY_BYTES_MIN} to {BODY_BYTES_MAX} bytes"
            )


@dataclass(slots=True)
class BacklogCheck:
    """Fills the backlog, drains it through every node, and says what came back."""

    params: BacklogParams
    confirmed: int = 0
    fill_s: float = 0.0
    drain_s: float = 0.0
    seen: set[int] = field(default_factory=set)
    duplicates: int = 0
    unexpected: int = 0
    bad_bodies: int = 0
    samples: dict[str, list[Any]] = field(default_factory=lambda: {"unexpected": [], "bad": []})
    per_node: dict[str, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)

    def fill(self, endpoints: list[str], key: bytes, tls: Any) -> None:
        """Publish the whole backlog with confirms on a healthy cluster (before any fault): a
        publish that is not confirmed here is an error of the run, not a finding."""
        started = time.monotonic()
        size, total = self.params.body_bytes, self.params.messages
        step = max(1, total // 10)
        with Client(endpoints, key, name="chaos-backlog-fill", tls=tls) as client:
            client.declare_queue(QUEUE)
            with client.publisher(QUEUE, window=FILL_WINDOW) as publisher:
                for start in range(0, total, step):
                    end = min(total, start + step)
                    bodies = (body_for(i, size) for i in range(start, end))
                    publisher.publish_many(bodies, timeout_s=FILL_TIMEOUT_S)
                    _progress(f"backlog: {end}/{total} published")
                publisher.wait_for_confirms(FILL_TIMEOUT_S)
                self.confirmed = publisher.confirmed
        self.fill_s = round(time.monotonic() - started, 3)

    def drain(self, endpoints: dict[str, str], key: bytes, tls: Any) -> None:
        """Take an equal share through each node in turn, then rounds until none is left."""
        started = time.monotonic()
        deadline = started + self.params.drain_timeout_s
        nodes = sorted(endpoints)
        for position, node in enumerate(nodes):
            left = self.params.messages - len(self.seen)
            share = math.ceil(left / (len(nodes) - position))
            self._drain_through(node, endpoints[node], key, tls, share, deadline)
        while len(self.seen) < self.confirmed and time.monotonic() < deadline:
            before = len(self.seen)
            for node in nodes:
                self._drain_through(node, endpoints[node], key, tls, None, deadline)
            if len(self.seen) == before:
                break  # a round that found nothing: what is left is lost
        self.drain_s = round(time.monotonic() - started, 3)

    def _drain_through(
        self, node: str, endpoint: str, key: bytes, tls: Any, share: int | None, deadline: float
    ) -> None:
        """Consume up to `share` (None: all) backlog messages through `node` alone."""
        taken = 0
        try:
            with Client(
                [endpoint], key, name=f"chaos-backlog-{node}", reconnect=False, tls=tls
            ) as client:
                consumer = client.consume(QUEUE, prefetch=DRAIN_PREFETCH)
                while (share is None or taken < share) and time.monotonic() < deadline:
                    message = consumer.get(timeout_s=DRAIN_IDLE_S)
                    if message is None:
                        break
                    self._check(node, message.body)
                    message.ack()
                    taken += 1
                consumer.wait_settled(30.0)
                consumer.cancel()
        except (ClusterError, OSError) as err:
            _sample(self.errors, f"{node}: {type(err).__name__}: {err}")
        self.per_node[node] = self.per_node.get(node, 0) + taken
        _progress(f"backlog: {len(self.seen)}/{self.confirmed} drained ({node}: {taken})")

    def _check(self, node: str, body: bytes) -> None:
        index = index_of(body)
        if index is None or index >= self.params.messages:
            self.unexpected += 1
            _sample(self.samples["unexpected"], f"{node}: {body[:24]!r}")
            return
        if body != body_for(index, self.params.body_bytes):
            self.bad_bodies += 1
            _sample(self.samples["bad"], [index, node])
        if index in self.seen:
            self.duplicates += 1
        self.seen.add(index)

    @property
    def lost(self) -> list[int]:
        """Confirmed indexes no node delivered (every index below `confirmed` was confirmed:
        the fill stops at its first failure)."""
        return [i for i in range(self.confirmed) if i not in self.seen]

    @property
    def valid(self) -> bool:
        """Nothing lost, nothing unexpected, every body exact, the whole backlog confirmed."""
        complete = self.confirmed == self.params.messages
        return complete and not self.lost and not self.unexpected and not self.bad_bodies

    def to_dict(self, node_logs: Path | None = None) -> dict[str, Any]:
        """The report's `backlog` section."""
        lost = self.lost
        return {
            "valid": self.valid,
            "messages": self.params.messages,
            "body_bytes": self.params.body_bytes,
            "confirmed": self.confirmed,
            "delivered_per_node": self.per_node,
            "lost": len(lost),
            "lost_sample": lost[:SAMPLES_MAX],
            "unexpected": self.unexpected,
            "unexpected_sample": self.samples["unexpected"],
            "bad_bodies": self.bad_bodies,
            "bad_bodies_sample": self.samples["bad"],
            "duplicates": self.duplicates,
            "restored_by_snapshot": installs_per_node(node_logs) if node_logs else None,
            "errors": self.errors,
            "fill_s": self.fill_s,
            "drain_s": self.drain_s,
        }


def installs_per_node(node_logs: Path) -> dict[str, int]:
    """How many snapshots (with their live entries) each node installed from a leader, read
    from the node logs the run kept (`<out>/nodes/<id>/node.log`)."""
    counts: dict[str, int] = {}
    for log_file in sorted(node_logs.glob("*/node.log")):
        with log_file.open("rb") as lines:
            counts[log_file.parent.name] = sum(INSTALLED_EVENT.encode() in line for line in lines)
    return counts


def _sample(samples: list[Any], item: Any) -> None:
    if len(samples) < SAMPLES_MAX:
        samples.append(item)


def _progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)

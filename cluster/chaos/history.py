"""The history of a chaos run: one JSON object per line, in real-time order, from one clock.

Every operation has an integer `op` id; an invocation (`type` = "invoke") and its completion
("ok" | "fail" | "info") share it. Fields (absent when not relevant):

- `op` int, `type` str, `f` str, `t_ns` int (monotonic ns since the recorder started),
  `process` str (the worker: "producer-0", "consumer-2", "drain", "nemesis").
- `f` = "publish": `queue`, `enqueuer`, `seq`, `value` (the unique body id) on the invoke;
  the completion is "ok" (confirmed), "fail" (definitely not enqueued) or "info" (unknown:
  timeout, connection lost). An invoke without completion is unknown too.
- `f` = "deliver": a single event of type "ok": `queue`, `value`, `redelivered` (bool),
  `detail` (the consumer tag). A delivery is an observation, not a request.
- `f` = "ack": invoke with `value` and `delivery` (the op id of the delivery it settles), then
  "ok" (settled), "fail" (definitely not settled: the message goes back) or "info" (unknown).
- `f` = "fault": invoke when a nemesis starts a fault (`fault`, `node`, `detail`), "ok" when
  it ends (healed). Faults never reach the checker's verdicts; the report uses their times.
- Consumer groups (`cluster.chaos.groups`): `join` / `leave` operations of a member (`process`,
  `detail` = the group), a single "ok" `crash` when the harness kills a member, and single "ok"
  `assigned` / `revoked` notices a member saw (`queue` = the partition). A publish to a
  partitioned queue's base name carries its partition key in `key` (none: round robin).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any, Literal

EventType = Literal["invoke", "ok", "fail", "info"]
Function = Literal[
    "publish", "deliver", "ack", "fault", "join", "leave", "crash", "assigned", "revoked"
]

EVENT_TYPES: tuple[str, ...] = ("invoke", "ok", "fail", "info")
FUNCTIONS: tuple[str, ...] = (
    "publish",
    "deliver",
    "ack",
    "fault",
    "join",
    "leave",
    "crash",
    "assigned",
    "revoked",
)


@dataclass(frozen=True, slots=True)
class Event:
    """One line of a history."""

    op: int
    type: EventType
    f: Function
    t_ns: int = 0
    process: str = ""
    queue: str | None = None
    value: str | None = None
    enqueuer: str | None = None
    seq: int | None = None
    redelivered: bool | None = None
    delivery: int | None = None
    fault: str | None = None
    node: str | None = None
    detail: str | None = None
    key: str | None = None  # a publish's partition key (groups workload); absent: no key

    def to_json(self) -> str:
        """Encode as one compact JSON line (fields that are None are left out)."""
        fields = {k: v for k, v in asdict(self).items() if v is not None}
        return json.dumps(fields, separators=(",", ":"), sort_keys=False)

    @staticmethod
    def from_json(line: str) -> Event:
        """Decode one JSON line; raises ValueError on a malformed event."""
        raw: Any = json.loads(line)
        if not isinstance(raw, dict):
            raise ValueError(f"event is not an object: {line!r}")
        if raw.get("type") not in EVENT_TYPES or raw.get("f") not in FUNCTIONS:
            raise ValueError(f"bad type or f in event: {line!r}")
        if not isinstance(raw.get("op"), int):
            raise ValueError(f"event without an integer op: {line!r}")
        known = set(Event.__dataclass_fields__)
        return Event(**{k: v for k, v in raw.items() if k in known})


def read_history(path: Path) -> list[Event]:
    """Read a JSON-lines history file (blank lines are skipped)."""
    with path.open(encoding="utf-8") as handle:
        return [Event.from_json(line) for line in handle if line.strip()]


def write_history(path: Path, events: Iterable[Event]) -> None:
    """Write events as JSON lines."""
    with path.open("w", encoding="utf-8") as handle:
        for event in events:
            handle.write(event.to_json() + "\n")


class Recorder:
    """Thread-safe history recorder: one clock and one op counter for every worker.

    Events are kept in memory and, with `path`, appended to a JSON-lines file as they happen,
    so a crashed run still leaves its history behind.
    """

    def __init__(self, path: Path | None = None) -> None:
        self._lock = threading.Lock()
        self._events: list[Event] = []
        self._next_op = 0
        self._start_ns = time.monotonic_ns()
        self._file: IO[str] | None = path.open("w", encoding="utf-8") if path else None

    @property
    def start_ns(self) -> int:
        """The monotonic time (ns) that `t_ns` = 0 stands for."""
        return self._start_ns

    def now_ns(self) -> int:
        """Nanoseconds since the recorder started, on the history's clock."""
        return time.monotonic_ns() - self._start_ns

    def invoke(self, f: Function, process: str, **fields: Any) -> int:
        """Record the start of an operation; returns its op id."""
        with self._lock:
            op = self._next_op
            self._next_op += 1
            self._append(Event(op=op, type="invoke", f=f, process=process, **fields))
        return op

    def complete(self, op: int, type_: EventType, f: Function, process: str, **fields: Any) -> None:
        """Record the outcome of operation `op`."""
        with self._lock:
            self._append(Event(op=op, type=type_, f=f, process=process, **fields))

    def observe(self, f: Function, process: str, **fields: Any) -> int:
        """Record a single-event observation (a delivery); returns its op id."""
        with self._lock:
            op = self._next_op
            self._next_op += 1
            self._append(Event(op=op, type="ok", f=f, process=process, **fields))
        return op

    def events(self) -> list[Event]:
        """A copy of every event so far."""
        with self._lock:
            return list(self._events)

    def close(self) -> None:
        """Close the history file, if any."""
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None

    def _append(self, event: Event) -> None:
        # Stamp under the lock so that file order, list order and time order agree.
        stamped = Event(**{**asdict(event), "t_ns": self.now_ns()})
        self._events.append(stamped)
        if self._file is not None:
            self._file.write(stamped.to_json() + "\n")
            self._file.flush()


def iter_ops(events: Iterable[Event]) -> Iterator[tuple[Event, Event | None]]:
    """Pair every invoke with its completion (None when it never completed), in invoke order."""
    pending: dict[int, Event] = {}
    order: list[int] = []
    done: dict[int, Event] = {}
    for event in events:
        if event.type == "invoke":
            pending[event.op] = event
            order.append(event.op)
        elif event.op in pending and event.op not in done:
            done[event.op] = event
    for op in order:
        yield pending[op], done.get(op)

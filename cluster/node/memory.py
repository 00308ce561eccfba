"""A node's memory watermark, and how long its event loop stalls.

The node samples its resident set (`/proc/self/statm`: one small read, every
`SAMPLE_PERIOD_S` from the node's periodic task, never per publish) against
`memory_high_watermark` (cluster.toml; a share of the machine's RAM or a size). At or past the
mark the alarm is set and the node refuses new publishes with `memory_alarm`, a retryable
refusal (nothing is submitted, so nothing confirmed is ever at stake); settles, returns,
consumes and queries go on, so consumers drain the backlog. The alarm clears once the resident
set falls below `RESUME_SHARE` of the mark (hysteresis: no flapping at the mark). While the
alarm is set the node hands freed heap back to the kernel (glibc `malloc_trim`, at most every
`TRIM_PERIOD_S`): without it the resident set of a drained node rarely falls. It does so too,
alarm or not, when the C allocator holds `TRIM_BYTES` free (glibc `mallinfo2`, asked every
`TRIM_PERIOD_S`: it walks every free chunk, up to 1 ms on a fragmented heap): a drained backlog,
the transient buffers of a snapshot. A trim that gave back less than `TRIM_RELEASED_MIN` (the
resident set just before it less just after it: the free pages were given back already)
doubles the wait before the next, up to `TRIM_BACKOFF_MAX_S`; one that gave back more resets
it. (Until machine v4 kept waiting messages
as words in arrays this watched the count of Python's objects, which no longer falls when a
backlog drains.) After 2,000,000 x 1 KiB messages drained a node's resident set stayed at
3-4.7x a fresh node's without any trim.

`LoopStalls` measures the event loop's lateness on the same periodic task: the longest stall
since the node started and in the last `STALL_WINDOW_S`; a stall over `STALL_LOG_S` is logged
(`event_loop_stalled`, at most one line a second), to be matched with what the node logged
around it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

log = structlog.get_logger("cluster.memory")

PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")
SAMPLE_PERIOD_S = 0.2
RESUME_SHARE = 0.9  # the alarm clears below this share of the watermark
TRIM_PERIOD_S = 5.0
TRIM_BYTES = 8 * 1024 * 1024  # free in the C heap: worth a trim
TRIM_RELEASED_MIN = 1024 * 1024  # a trim that gave back less backs off
TRIM_BACKOFF_MAX_S = 320.0
STALL_WINDOW_S = 10.0
STALL_WINDOW_SLOTS_MAX = 1000  # samples kept for the recent maximum
STALL_LOG_S = 0.1
# test hook: while this file exists, its content (an integer of bytes) is the resident set
TEST_RSS_ENV = "QUORUMQ_TEST_RSS_FILE"


def resident_bytes(statm: Path = Path("/proc/self/statm")) -> int:
    """This process's resident set in bytes (0 where /proc is missing)."""
    try:
        fields = statm.read_bytes().split()
    except OSError:
        return 0
    return int(fields[1]) * PAGE_BYTES


class StatmReader:
    """This process's resident set from `/proc/self/statm` kept open: one `pread` a sample
    (opening it through pathlib each time cost nine system calls, five times a second on an
    idle node). 0 where /proc is missing."""

    def __init__(self, path: str = "/proc/self/statm") -> None:
        self.path = path
        self.fd = -1

    def resident_bytes(self) -> int:
        """The resident set in bytes now."""
        try:
            if self.fd < 0:
                self.fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
            fields = os.pread(self.fd, 256, 0).split()
        except OSError:
            return 0
        return int(fields[1]) * PAGE_BYTES


_STATM = StatmReader()


def total_memory_bytes(meminfo: Path = Path("/proc/meminfo")) -> int:
    """The machine's RAM in bytes (MemTotal; the physical pages count where /proc is missing)."""
    try:
        for line in meminfo.read_text(encoding="ascii").splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return int(os.sysconf("SC_PHYS_PAGES")) * PAGE_BYTES


def _resident_reader() -> Callable[[], int]:
    """The resident set's reader: /proc, or the test hook's value while its file exists (the
    hook's variable is read once, when the node starts, not at every sample)."""
    hook = os.environ.get(TEST_RSS_ENV)
    if not hook:
        return _STATM.resident_bytes
    path = Path(hook)

    def test_or_real() -> int:
        try:
            return int(path.read_text(encoding="ascii").strip())
        except (OSError, ValueError):
            return _STATM.resident_bytes()

    return test_or_real


def _libc(function: str) -> Any:
    """The C library's `function` (ctypes), or None where it has none."""
    name = ctypes.util.find_library("c")
    try:
        return getattr(ctypes.CDLL(name), function) if name else None
    except (OSError, AttributeError):
        return None


def _malloc_trim() -> Callable[[], None]:
    """glibc's malloc_trim(0), or a no-op where the C library has none."""
    trim = _libc("malloc_trim")
    if trim is None:
        return lambda: None

    def trim_now() -> None:
        trim(0)

    return trim_now


M_ARENA_MAX = -8  # glibc's mallopt parameter


def one_malloc_arena() -> bool:
    """glibc: every thread of this process allocates from the main arena (call before any
    thread starts); False where the C library has no mallopt. A thread's own arena keeps its
    top chunk whatever `malloc_trim` does: after 1,000,000 x 1 KiB drained, every node still
    held a fully resident 6 MiB arena of its snapshot or body-reader thread. Python threads
    allocate holding the GIL: one arena costs them no contention."""
    mallopt = _libc("mallopt")
    return mallopt is not None and bool(mallopt(M_ARENA_MAX, 1))


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
            "fordblks", "keepcost",
        )
    ]  # fmt: skip


def _malloc_free() -> Callable[[], int]:
    """The free bytes glibc's allocator holds in its arenas (`mallinfo2`'s fordblks: freed
    chunks, resident until trimmed, and the top), or a constant 0 where there is no mallinfo2."""
    info = _libc("mallinfo2")
    if info is None:
        return lambda: 0
    info.restype = _MallInfo2

    def free() -> int:
        return int(info().fordblks)

    return free


@dataclass
class MemoryMonitor:
    """The alarm state of one node: `sample()` periodically, `refusal()` per publish."""

    node_id: str
    watermark_bytes: int
    read_resident: Callable[[], int] = field(default_factory=_resident_reader)
    clock: Callable[[], float] = time.monotonic
    trim: Callable[[], None] = field(default_factory=_malloc_trim)
    malloc_free: Callable[[], int] = field(default_factory=_malloc_free)
    resident: int = 0
    alarm: bool = False
    alarms: int = 0  # alarm episodes since the node started
    _sampled_at: float = -1e9
    _since: float = 0.0
    _trim_due: float = -1e9  # when the heap's free bytes are looked at next
    _trim_wait_s: float = TRIM_PERIOD_S  # after a trim, doubled while trims give nothing back

    def sample(self) -> None:
        """Read the resident set if `SAMPLE_PERIOD_S` passed; set or clear the alarm."""
        now = self.clock()
        if now - self._sampled_at < SAMPLE_PERIOD_S:
            return
        self._sampled_at = now
        before_trim = None
        if now >= self._trim_due:
            self._trim_due = now + TRIM_PERIOD_S
            if self.alarm or self.malloc_free() >= TRIM_BYTES:
                before_trim = self.read_resident()
                self.trim()
        self.resident = self.read_resident()
        if before_trim is not None:  # what the trim gave back sets the wait for the next
            released = before_trim - self.resident
            if self.alarm or released >= TRIM_RELEASED_MIN:
                self._trim_wait_s = TRIM_PERIOD_S
            else:
                self._trim_wait_s = min(2 * self._trim_wait_s, TRIM_BACKOFF_MAX_S)
            self._trim_due = now + self._trim_wait_s
        if not self.alarm and self.resident >= self.watermark_bytes:
            self.alarm, self._since = True, now
            self._trim_due = now  # trimmed at the next sample
            self.alarms += 1
            log.warning(
                "memory_alarm_set",
                resident_bytes=self.resident,
                watermark_bytes=self.watermark_bytes,
            )
        elif self.alarm and self.resident < self.watermark_bytes * RESUME_SHARE:
            self.alarm = False
            log.info(
                "memory_alarm_cleared",
                resident_bytes=self.resident,
                after_s=round(now - self._since, 1),
            )

    def refusal(self) -> str | None:
        """Why a publish is refused now (the alarm is set), or None."""
        if not self.alarm:
            return None
        mib = 1024 * 1024
        return (
            f"{self.node_id} is past its memory high watermark ({self.resident // mib} MiB "
            f"resident, the mark is {self.watermark_bytes // mib} MiB): it takes no new publishes "
            f"until consumers drain the backlog below {int(RESUME_SHARE * 100)}% of the mark; "
            "retry later (nothing was submitted)"
        )

    def status(self) -> dict[str, int | bool]:
        """The fields this monitor adds to the node's status map."""
        return {
            "memory_resident_bytes": self.resident,
            "memory_high_watermark_bytes": self.watermark_bytes,
            "memory_alarm": self.alarm,
        }


@dataclass
class LoopStalls:
    """How late the periodic task wakes: the event loop's longest stalls."""

    clock: Callable[[], float] = time.monotonic
    max_s: float = 0.0  # since the node started
    _recent: deque[tuple[float, float]] = field(default_factory=deque)  # (at, stall)
    _logged_at: float = -1e9

    def note(self, stall_s: float) -> None:
        """Record one wake-up `stall_s` later than asked."""
        stall_s = max(0.0, stall_s)
        now = self.clock()
        self.max_s = max(self.max_s, stall_s)
        if stall_s > STALL_LOG_S and now - self._logged_at >= 1.0:
            self._logged_at = now
            log.warning("event_loop_stalled", ms=round(stall_s * 1000))
        recent = self._recent
        while recent and (
            now - recent[0][0] > STALL_WINDOW_S or len(recent) >= STALL_WINDOW_SLOTS_MAX
        ):
            recent.popleft()
        recent.append((now, stall_s))

    def recent_max_s(self) -> float:
        """The longest stall noted in the last `STALL_WINDOW_S`."""
        now = self.clock()
        recent = tuple(self._recent)  # one copy under the GIL: metrics read from their thread
        return max((stall for at, stall in recent if now - at <= STALL_WINDOW_S), default=0.0)

    def status(self) -> dict[str, int]:
        """The fields this adds to the node's status map (milliseconds)."""
        return {
            "loop_stall_max_ms": round(self.max_s * 1000),
            "loop_stall_recent_max_ms": round(self.recent_max_s() * 1000),
        }

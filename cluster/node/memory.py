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
alarm or not, once the heap holds fewer than half the objects it held at its peak since the last
trim (`sys.getallocatedblocks`, counted at most every `BLOCKS_PERIOD_S`: it walks every pool of
the heap, about 170 us on an idle node holding 100,000 messages, most of its periodic pass): a
drained backlog. After 2,000,000 x 1 KiB messages drained a
node's resident set stayed at 3-4.7x a fresh node's.

`LoopStalls` measures the event loop's lateness on the same periodic task: the longest stall
since the node started and in the last `STALL_WINDOW_S`; a stall over `STALL_LOG_S` is logged
(`event_loop_stalled`, at most one line a second), to be matched with what the node logged
around it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import structlog

log = structlog.get_logger("cluster.memory")

PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")
SAMPLE_PERIOD_S = 0.2
RESUME_SHARE = 0.9  # the alarm clears below this share of the watermark
TRIM_PERIOD_S = 5.0
BLOCKS_PERIOD_S = 2.5  # the heap's objects are counted at most this often
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


def _malloc_trim() -> Callable[[], None]:
    """glibc's malloc_trim(0), or a no-op where the C library has none."""
    name = ctypes.util.find_library("c")
    try:
        trim = ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):
        trim = None
    if trim is None:
        return lambda: None

    def trim_now() -> None:
        trim(0)

    return trim_now


@dataclass
class MemoryMonitor:
    """The alarm state of one node: `sample()` periodically, `refusal()` per publish."""

    node_id: str
    watermark_bytes: int
    read_resident: Callable[[], int] = field(default_factory=_resident_reader)
    clock: Callable[[], float] = time.monotonic
    trim: Callable[[], None] = field(default_factory=_malloc_trim)
    count_blocks: Callable[[], int] = sys.getallocatedblocks
    resident: int = 0
    alarm: bool = False
    alarms: int = 0  # alarm episodes since the node started
    _sampled_at: float = -1e9
    _trimmed_at: float = -1e9
    _since: float = 0.0
    _blocks: int = 0  # the heap's objects at the last count
    _blocks_peak: int = 0  # the most heap objects counted since the last trim
    _counted_at: float = -1e9

    def sample(self) -> None:
        """Read the resident set if `SAMPLE_PERIOD_S` passed; set or clear the alarm."""
        now = self.clock()
        if now - self._sampled_at < SAMPLE_PERIOD_S:
            return
        self._sampled_at = now
        if now - self._counted_at >= BLOCKS_PERIOD_S:
            self._counted_at, self._blocks = now, self.count_blocks()
            self._blocks_peak = max(self._blocks_peak, self._blocks)
        drained = self._blocks * 2 < self._blocks_peak
        if (self.alarm or drained) and now - self._trimmed_at >= TRIM_PERIOD_S:
            self._trimmed_at, self._blocks_peak = now, self._blocks
            self.trim()
        self.resident = self.read_resident()
        if not self.alarm and self.resident >= self.watermark_bytes:
            self.alarm, self._since = True, now
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

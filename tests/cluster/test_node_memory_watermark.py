"""`memory_high_watermark` (cluster.toml) and the node's memory monitor, without processes.

The setting is a share of the machine's RAM or a size with a unit, validated with errors that
name the key; the monitor samples the resident set at most every SAMPLE_PERIOD_S, sets the alarm
at the mark, clears it only below RESUME_SHARE of it, and trims the heap while it is set.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cluster import config
from cluster.errors import ConfigError
from cluster.node.memory import (
    PAGE_BYTES,
    RESUME_SHARE,
    SAMPLE_PERIOD_S,
    STALL_WINDOW_S,
    TRIM_BACKOFF_MAX_S,
    TRIM_BYTES,
    TRIM_PERIOD_S,
    LoopStalls,
    MemoryMonitor,
    resident_bytes,
    total_memory_bytes,
)

MIB = 1024 * 1024


def _config(tmp_path: Path, watermark: float | int = 0.4) -> config.ClusterConfig:
    node = config.NodeConfig("n1", "127.0.0.1", 7001, 8001, tmp_path / "n1")
    return config.ClusterConfig("test", 1, (node,), memory_high_watermark=watermark)


@pytest.mark.parametrize(
    ("written", "parsed"),
    [
        (0.4, 0.4),
        (1.0, 1.0),
        (1073741824, 1073741824),
        ("512MiB", 512 * MIB),
        ("2GB", 2_000_000_000),
        ("1.5 GiB", int(1.5 * 1024**3)),
        ("20000kB", 20_000_000),
    ],
)
def test_a_share_or_a_size_with_its_unit_is_read(written: object, parsed: float | int) -> None:
    assert config.parse_memory_watermark(written, "c.toml") == parsed


@pytest.mark.parametrize(
    ("written", "complaint"),
    [
        (0.0, "within (0, 1]"),
        (1.5, "within (0, 1]"),
        (1, "is written as a float: 0.4"),
        ("512", "cannot read '512' as a size"),
        ("lots", "cannot read 'lots' as a size"),
        ("12 parsecs", "MiB"),
        (True, "must be a share of RAM"),
        ([1], "must be a share of RAM"),
        ("1kB", "must be within"),
    ],
)
def test_a_bad_watermark_is_a_config_error_naming_the_key(written: object, complaint: str) -> None:
    with pytest.raises(ConfigError, match="memory_high_watermark") as raised:
        config.parse_memory_watermark(written, "c.toml")
    assert complaint in str(raised.value)


def test_the_default_is_40_percent_of_ram_and_both_forms_round_trip(tmp_path: Path) -> None:
    assert config.MEMORY_HIGH_WATERMARK_DEFAULT == 0.4
    assert config.memory_watermark_bytes(0.4, 1000 * MIB) == 400 * MIB
    assert config.memory_watermark_bytes(64 * MIB, 1000 * MIB) == 64 * MIB
    for value in (0.4, 0.25, 64 * MIB):
        written = _config(tmp_path, value)
        config.write(tmp_path, written)
        assert config.load(tmp_path).memory_high_watermark == value


def test_a_unit_in_cluster_toml_is_read(tmp_path: Path) -> None:
    config.write(tmp_path, _config(tmp_path))
    path = tmp_path / config.CONFIG_FILE
    text = path.read_text().replace("[cluster]\n", '[cluster]\nmemory_high_watermark = "3GiB"\n')
    path.write_text(text)
    assert config.load(tmp_path).memory_high_watermark == 3 * 1024**3
    path.write_text(text.replace('"3GiB"', '"3 bananas"'))
    with pytest.raises(ConfigError, match=r"cluster.toml: memory_high_watermark"):
        config.load(tmp_path)


def test_resident_and_total_memory_are_read_from_proc() -> None:
    rss = resident_bytes()
    assert rss % PAGE_BYTES == 0 and 10 * MIB < rss < total_memory_bytes()
    status = Path(f"/proc/{os.getpid()}/status").read_text()
    vm_rss = int(next(ln for ln in status.splitlines() if ln.startswith("VmRSS")).split()[1])
    assert abs(rss - vm_rss * 1024) < 64 * MIB


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _monitor(rss: list[int], trims: list[float], clock: _Clock) -> MemoryMonitor:
    return MemoryMonitor(
        "n1", 100 * MIB, lambda: rss[0], clock, lambda: trims.append(clock.now), lambda: 0
    )


def test_the_alarm_sets_at_the_mark_and_clears_below_the_resume_share() -> None:
    clock, rss, trims = _Clock(), [50 * MIB], list[float]()
    monitor = _monitor(rss, trims, clock)
    monitor.sample()
    assert (monitor.alarm, monitor.refusal()) == (False, None)
    rss[0] = 100 * MIB
    clock.now += SAMPLE_PERIOD_S
    monitor.sample()
    assert monitor.alarm and monitor.alarms == 1
    refusal = monitor.refusal()
    assert refusal is not None and "n1 is past its memory high watermark" in refusal
    assert "100 MiB resident" in refusal and "retry" in refusal
    rss[0] = int(100 * MIB * RESUME_SHARE)  # between the resume share and the mark: still set
    clock.now += SAMPLE_PERIOD_S
    monitor.sample()
    assert monitor.alarm
    rss[0] -= 1
    clock.now += SAMPLE_PERIOD_S
    monitor.sample()
    assert monitor.refusal() is None
    assert monitor.status() == {
        "memory_resident_bytes": rss[0],
        "memory_high_watermark_bytes": 100 * MIB,
        "memory_alarm": False,
    }


def test_sampling_is_rate_limited_and_a_steady_heap_is_trimmed_only_under_the_alarm() -> None:
    clock, rss, trims = _Clock(), [200 * MIB], list[float]()
    reads: list[float] = []

    def read() -> int:
        reads.append(clock.now)
        return rss[0]

    monitor = MemoryMonitor(
        "n1", 100 * MIB, read, clock, lambda: trims.append(clock.now), lambda: 0
    )
    for _ in range(100):  # ten samples asked per period: one taken
        monitor.sample()
        clock.now += SAMPLE_PERIOD_S / 10
    assert len(reads) == 10 + len(trims)  # one taken (and one more before each trim)
    assert monitor.alarm and len(trims) == 1 + int(clock.now // TRIM_PERIOD_S)
    rss[0], trims[:] = 10 * MIB, []
    for _ in range(100):
        clock.now += TRIM_PERIOD_S
        monitor.sample()
    assert len(trims) == 1  # the sample that cleared it trimmed first; none after


def test_a_heap_holding_free_bytes_is_trimmed_without_the_alarm() -> None:
    """A drained backlog leaves the resident set where it was (glibc keeps the freed pages)
    unless the heap is trimmed: when the C allocator holds TRIM_BYTES free, looked at every
    TRIM_PERIOD_S. Machine v4 keeps waiting messages as words in arrays (fifo.state.WaitingLine):
    the count of Python's objects the monitor watched before no longer falls when they drain
    (2,000,000 x 1 KiB drained: the followers stayed at 1.65-1.69x a fresh node's resident set,
    untrimmed). Trims that give nothing back (the free pages went at an earlier one) back off,
    doubling up to TRIM_BACKOFF_MAX_S; one that gives back again resets the wait."""
    clock, trims, rss, free, asked = _Clock(), list[float](), [50 * MIB], [2 * MIB], [0]
    resident_free = [0]  # of the free bytes, those still resident

    def malloc_free() -> int:
        asked[0] += 1
        return free[0]

    def trim() -> None:
        trims.append(clock.now)
        rss[0] -= resident_free[0]
        resident_free[0] = 0

    monitor = MemoryMonitor("n1", 1000 * MIB, lambda: rss[0], clock, trim, malloc_free)

    def run(seconds: float) -> list[float]:
        start = len(trims)
        for _ in range(round(seconds / SAMPLE_PERIOD_S)):
            clock.now += SAMPLE_PERIOD_S
            monitor.sample()
        return trims[start:]

    assert run(100) == [] and 0.8 * 100 / TRIM_PERIOD_S <= asked[0] <= 100 / TRIM_PERIOD_S + 1
    rss[0] += 400 * MIB  # the backlog
    assert run(100) == []
    free[0] = resident_free[0] = TRIM_BYTES - 1  # freed, not enough to be worth a trim
    assert run(100) == []
    free[0] = resident_free[0] = 380 * MIB  # drained
    assert len(run(TRIM_PERIOD_S)) == 1 and rss[0] == 70 * MIB and not monitor.alarm
    waits = list(itertools.pairwise(run(2000)))  # nothing more given back: backing off
    gaps = [round(b - a) for a, b in waits]
    assert gaps[:4] == [10, 20, 40, 80] and max(gaps) == TRIM_BACKOFF_MAX_S
    resident_free[0] = 8 * MIB  # freed and resident again: given back at the next look,
    given = run(TRIM_BACKOFF_MAX_S)  # and the wait is TRIM_PERIOD_S again
    assert resident_free[0] == 0 and round(given[1] - given[0]) == TRIM_PERIOD_S


def test_trims_that_give_back_while_the_heap_grows_do_not_back_off() -> None:
    """What a trim gave back is the resident set just before it less just after it. Measured
    from the sample before (up to SAMPLE_PERIOD_S earlier), a heap growing faster than the trim
    gave back looked like a trim that gave nothing: during a 16 KiB backlog every node's wait
    went to TRIM_BACKOFF_MAX_S, and after the drain 30 MiB of free heap stayed resident on
    each follower (84 MiB against 53 fresh, `scripts/bench_backlog.py --body 16384`)."""
    clock, trims, rss, resident_free = _Clock(), list[float](), [50 * MIB], [10 * MIB]

    def trim() -> None:
        trims.append(clock.now)
        rss[0] -= resident_free[0]
        resident_free[0] = 0

    monitor = MemoryMonitor("n1", 2**40, lambda: rss[0], clock, trim, lambda: 20 * MIB)
    for _ in range(round(200 / SAMPLE_PERIOD_S)):
        clock.now += SAMPLE_PERIOD_S
        rss[0] += 12 * MIB  # the backlog grows and churns: 10 MiB freed per trim period
        resident_free[0] += round(10 * MIB * SAMPLE_PERIOD_S / TRIM_PERIOD_S)
        monitor.sample()
    gaps = {round(b - a) for a, b in itertools.pairwise(trims)}
    assert gaps == {TRIM_PERIOD_S} and len(trims) >= 200 / TRIM_PERIOD_S - 1


def test_a_long_stall_is_logged_at_most_once_a_second(capsys: pytest.CaptureFixture[str]) -> None:
    clock = _Clock()
    stalls = LoopStalls(clock)
    stalls.note(0.05)
    stalls.note(0.25)
    stalls.note(0.3)  # the same second: not logged
    clock.now += 1.0
    stalls.note(0.12)
    logged = [line for line in capsys.readouterr().out.splitlines() if "event_loop_stalled" in line]
    assert len(logged) == 2 and "ms=250" in logged[0] and "ms=120" in logged[1]


def test_loop_stalls_keep_the_longest_ever_and_of_the_recent_window() -> None:
    clock = _Clock()
    stalls = LoopStalls(clock)
    stalls.note(-0.01)
    stalls.note(0.5)
    clock.now += STALL_WINDOW_S + 1
    stalls.note(0.02)
    assert stalls.status() == {"loop_stall_max_ms": 500, "loop_stall_recent_max_ms": 20}


def test_the_metrics_carry_the_memory_and_loop_stall_gauges_of_the_status_fields() -> None:
    pytest.importorskip("prometheus_client")
    from cluster.node.metrics import _add_node_gauges, _StateCollector

    families = _StateCollector._families()
    status = {
        "memory_resident_bytes": 70 * MIB,
        "memory_high_watermark_bytes": 64 * MIB,
        "memory_alarm": True,
        "loop_stall_max_ms": 1500,
        "loop_stall_recent_max_ms": 20,
    }
    _add_node_gauges(families, status)
    values = {name: f.samples[0].value for name, f in families.items() if f.samples}
    assert values == {
        "quorumq_memory_resident_bytes": 70 * MIB,
        "quorumq_memory_high_watermark_bytes": 64 * MIB,
        "quorumq_memory_alarm": 1.0,
        "quorumq_event_loop_stall_seconds_max": 1.5,
        "quorumq_event_loop_stall_recent_seconds_max": 0.02,
    }


_ARENAS_SCRIPT = """
import ctypes, sys, tempfile, threading
from cluster.node.memory import one_malloc_arena
if sys.argv[1] == "one":
    assert one_malloc_arena()
held = []
thread = threading.Thread(target=lambda: held.extend(bytes(200_000) for _ in range(20)))
thread.start()
thread.join()
libc = ctypes.CDLL(None)
libc.fopen.restype = ctypes.c_void_p
with tempfile.NamedTemporaryFile() as out:
    stream = libc.fopen(out.name.encode(), b"w")
    libc.malloc_info(0, ctypes.c_void_p(stream))
    libc.fclose(ctypes.c_void_p(stream))
    print(open(out.name).read().count("<heap nr="))
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="glibc on Linux")
def test_a_node_s_threads_share_one_malloc_arena() -> None:
    """A thread's own glibc arena keeps its top chunk whatever malloc_trim does (a drained
    node held one fully resident, 6 MiB); `one_malloc_arena` (called at the node's start) gives
    every thread the main one. Without it the thread here gets an arena of its own."""

    def arenas(mode: str) -> int:
        done = subprocess.run(
            [sys.executable, "-c", _ARENAS_SCRIPT, mode], capture_output=True, text=True, check=True
        )
        return int(done.stdout)

    assert arenas("default") == 2
    assert arenas("one") == 1

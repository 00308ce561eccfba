"""Equivalences over generated logs: snapshots, hash seeds, and the v1 -> v2 upgrade."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

import fifo
import fifo.fuzz
from fifo.commands import Command
from fifo.meta import Meta
from fifo.replies import Error, Reply
from fifo.state import State
from tests.fifo.model import fifo_settings

ROOT = Path(__file__).resolve().parents[2]
Log = list[tuple[Meta, Command]]


def run_log(state: State, log: Log, version: int | None = None) -> list[Reply]:
    """Apply a log (re-stamping the effective machine version if given); returns the replies."""
    replies: list[Reply] = []
    for meta, command in log:
        if version is not None:
            meta = Meta(meta.index, meta.term, meta.system_time_ms, version)
        replies.append(fifo.apply(meta, command, state)[0])
    return replies


def conserved(state: State) -> dict[str, tuple[int, int, int, int]]:
    """Per queue: messages total, ready, enqueuers, consumers (kept across a conversion)."""
    out: dict[str, tuple[int, int, int, int]] = {}
    for name in fifo.list_queues(state):
        view = fifo.overview(state, name)
        assert view is not None
        out[name] = (view.total, view.ready, view.enqueuers, view.consumers)
    return out


@fifo_settings(8)
@given(seed=st.integers(0, 2**32 - 1), version=st.sampled_from(fifo.SUPPORTED_VERSIONS))
def test_snapshot_at_every_prefix_then_replay_equals_full_replay(seed: int, version: int) -> None:
    """For every prefix: restore(snapshot(prefix state)) + the rest of the log == the full log."""
    log = fifo.fuzz.generate_log(seed, 150, version)
    full = fifo.init_state(version)
    run_log(full, log)
    want = fifo.digest(full)
    state = fifo.init_state(version)
    for cut in range(len(log) + 1):
        restored = fifo.restore(fifo.snapshot(state))
        assert fifo.digest(restored) == fifo.digest(state), f"snapshot round trip at {cut}"
        run_log(restored, log[cut:])
        assert fifo.digest(restored) == want, f"replay from the snapshot at entry {cut}"
        if cut < len(log):
            fifo.apply(log[cut][0], log[cut][1], state)


HASHSEED_SCRIPT = (
    "import sys, fifo, fifo.fuzz\n"
    "seed, steps, version = map(int, sys.argv[1:4])\n"
    "log = fifo.fuzz.generate_log(seed, steps, version)\n"
    "state = fifo.init_state(version)\n"
    "for meta, command in log:\n"
    "    fifo.apply(meta, command, state)\n"
    "print(fifo.digest(state), fifo.fuzz.run(seed, steps, version, upgrade_at=None).digest)\n"
)


def digest_in_subprocess(hash_seed: str, seed: int, steps: int, version: int) -> str:
    env = {**os.environ, "PYTHONHASHSEED": hash_seed}
    done = subprocess.run(
        [sys.executable, "-c", HASHSEED_SCRIPT, str(seed), str(steps), str(version)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=True,
    )
    return done.stdout.strip()


def test_same_log_gives_same_digest_under_different_hash_seeds() -> None:
    """A generated log replayed in processes with PYTHONHASHSEED 1, 2 and 3 gives one digest."""
    for version in fifo.SUPPORTED_VERSIONS:
        digests = {digest_in_subprocess(h, 21, 1500, version) for h in ("1", "2", "3")}
        assert len(digests) == 1, digests
        replayed, fuzzed = digests.pop().split()
        assert replayed == fuzzed == fifo.fuzz.run(21, 1500, version).digest


@fifo_settings(8)
@given(seed=st.integers(0, 2**32 - 1))
def test_upgrade_at_every_split_point_keeps_counters_and_runs_on(seed: int) -> None:
    """v1 prefix, convert, v2 suffix: counters survive and v2 refuses nothing v1 accepted."""
    log = fifo.fuzz.generate_log(seed, 120, 1)
    v1_replies = run_log(fifo.init_state(1), log)
    for cut in range(len(log) + 1):
        state = fifo.init_state(1)
        run_log(state, log[:cut])
        before = conserved(state)
        meta = log[cut][0] if cut < len(log) else log[-1][0]
        state = fifo.convert(state, 1, 2, Meta(meta.index, meta.term, meta.system_time_ms, 2))
        assert fifo.state_version(state) == 2
        assert conserved(state) == before, f"conversion after {cut} entries"
        suffix = run_log(state, log[cut:], version=2)
        for offset, (v1_reply, v2_reply) in enumerate(zip(v1_replies[cut:], suffix, strict=True)):
            if isinstance(v2_reply, Error) and not isinstance(v1_reply, Error):
                raise AssertionError(f"split {cut}, entry {cut + offset}: "
                                     f"{log[cut + offset][1]!r} -> {v2_reply!r} on v2, "
                                     f"{v1_reply!r} on v1")

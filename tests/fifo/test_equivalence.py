"""Equivalences over generated logs: snapshots, hash seeds, and the v1 -> v2 upgrade."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

import fifo
import fifo.fuzz
from fifo.commands import Checkout, Command, ConsumerId, Dequeue, UpdateConfig
from fifo.fuzz import probe
from fifo.meta import Meta
from fifo.replies import Error, Reply
from fifo.state import State
from tests.fifo.model import fifo_settings
from tests.fifo.processes import run_pythons

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


@fifo_settings(12)
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


HASH_SEEDS = ("1", "2", "3")


def test_same_log_gives_same_digest_under_different_hash_seeds() -> None:
    """A generated log replayed in processes with PYTHONHASHSEED 1, 2 and 3 gives one digest
    (every version's processes run at once)."""
    versions = fifo.SUPPORTED_VERSIONS
    runs = [
        (["-c", HASHSEED_SCRIPT, "21", "1500", str(v)], h) for v in versions for h in HASH_SEEDS
    ]
    done = run_pythons(runs, 120)
    for index, version in enumerate(versions):
        results = done[index * len(HASH_SEEDS) : (index + 1) * len(HASH_SEEDS)]
        assert all(r.returncode == 0 for r in results), [r.stderr[-2000:] for r in results]
        digests = {r.stdout.strip() for r in results}
        assert len(digests) == 1, digests
        replayed, fuzzed = digests.pop().split()
        assert replayed == fuzzed == fifo.fuzz.run(21, 1500, version).digest


def consumer_absent(state: State, command: Command) -> bool:
    """True when the command names a consumer that this state does not have."""
    key = getattr(command, "consumer_key", getattr(command, "consumer", None))
    name = getattr(command, "queue", None)
    queue = probe.queue(state, name) if isinstance(name, str) else None
    return key is not None and queue is not None and probe.find_consumer(queue, key) is None


def sac_switch_with_consumers(state: State, command: Command) -> bool:
    """True for an UpdateConfig that flips single_active_consumer on a queue with consumers."""
    if not isinstance(command, UpdateConfig):
        return False
    queue = probe.queue(state, command.queue)
    return queue is not None and bool(queue.consumers or queue.waiting) and (
        queue.config.single_active_consumer != command.config.single_active_consumer
    )


def dequeue_on_sac(state: State, command: Command, flipped_on_v1_only: set[str]) -> bool:
    """True for a dequeue on a queue that is single active consumer on v2 only because v2
    refused the SAC flip v1 made (a dequeue is refused on a SAC queue in both versions)."""
    if not isinstance(command, Checkout) or not isinstance(command.spec, Dequeue):
        return False
    queue = probe.queue(state, command.queue)
    return queue is not None and command.queue in flipped_on_v1_only and (
        queue.config.single_active_consumer
    )


def run_suffix_on_v2(state: State, log: Log, v1_replies: list[Reply], cut: int) -> None:
    """Apply log[cut:] on v2; fail on an Error that v1 did not give, with two exceptions where
    v2's own rules (SAC priorities, noconnection keeps suspected consumers) left a different set
    of consumers than v1: naming a consumer v2 no longer has (`unknown_consumer`), and flipping
    SAC on a queue that still has consumers on v2 (`unsupported`), and then a dequeue on that
    queue, still single active consumer on v2 only (`unsupported`). All are checked precisely.
    """
    flipped_on_v1_only: set[str] = set()  # SAC flips v2 refused: the config differs since
    for offset, (meta, command) in enumerate(log[cut:]):
        absent = consumer_absent(state, command)
        sac_switch = sac_switch_with_consumers(state, command)
        sac_dequeue = dequeue_on_sac(state, command, flipped_on_v1_only)
        meta = Meta(meta.index, meta.term, meta.system_time_ms, 2)
        reply = fifo.apply(meta, command, state)[0]
        v1_reply = v1_replies[cut + offset]
        if isinstance(command, UpdateConfig) and not isinstance(v1_reply, Error):
            if isinstance(reply, Error) and sac_switch:
                flipped_on_v1_only.add(command.queue)
            elif not isinstance(reply, Error):
                flipped_on_v1_only.discard(command.queue)
        if not isinstance(reply, Error) or isinstance(v1_reply, Error):
            continue
        if (reply.code, absent, sac_switch) in (("unknown_consumer", True, False),
                                                ("unsupported", False, True)):
            continue
        if reply.code == "unsupported" and sac_dequeue:
            continue
        raise AssertionError(f"split {cut}, entry {cut + offset}: {command!r} -> {reply!r} on "
                             f"v2, {v1_reply!r} on v1")


@fifo_settings(12)
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
        run_suffix_on_v2(state, log, v1_replies, cut)


def test_seed_2049_a_dequeue_after_a_sac_flip_v2_refused_is_tolerated() -> None:
    """Hypothesis counterexample: v1 flips `dlx` to competing (v2 refuses: it still has
    consumers there), then dequeues from it; v2 refuses the dequeue on its still-SAC queue, a
    consequence of the refused flip, not a new divergence."""
    log = fifo.fuzz.generate_log(2049, 120, 1)
    v1_replies = run_log(fifo.init_state(1), log)
    state = fifo.convert(fifo.init_state(1), 1, 2, Meta(1, 1, 0, 2))
    run_suffix_on_v2(state, log, v1_replies, 0)


def test_converted_consumers_keep_their_id_keys() -> None:
    """Right after a conversion every v1 consumer is found by its ConsumerId on v2."""
    log = fifo.fuzz.generate_log(17, 400, 1)
    state = fifo.init_state(1)
    run_log(state, log)
    ids = [(name, ConsumerId(c.tag, c.connection)) for name in fifo.list_queues(state)
           for c in probe.all_consumers(state.queues[name])]
    assert ids, "the log should leave some consumers"
    state = fifo.convert(state, 1, 2, Meta(401, 1, log[-1][0].system_time_ms, 2))
    for name, cid in ids:
        assert probe.find_consumer(state.queues[name], cid) is not None, (name, cid)

"""The pinned replay corpus: new code replays every shipped version's logs to the recorded digests.

Regenerate only a version that was never released: `python tests/fifo/replay_corpus.py generate
--version N` (after removing its line from corpus/SHIPPED.txt).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from functools import cache
from pathlib import Path

import pytest

import fifo
import tests.fifo.replay_corpus as rc
from fifo.replies import Error, Routed
from tests.fifo.processes import run_pythons


@cache
def logs_of(version: int) -> tuple[int, list[rc.CorpusLog]]:
    """The decoded corpus of a version (decoded once per test session)."""
    return rc.decode_corpus(rc.corpus_path(version).read_bytes())


def test_every_supported_version_has_a_corpus() -> None:
    """Every version has a corpus of at least 200 logs; the shipped ones are frozen (SHIPPED.txt)
    and every supported version but the latest is shipped (only the latest may be unreleased)."""
    assert rc.corpus_versions() == list(fifo.SUPPORTED_VERSIONS)
    assert set(rc.shipped()) <= set(fifo.SUPPORTED_VERSIONS)
    assert set(fifo.SUPPORTED_VERSIONS) - set(rc.shipped()) <= {fifo.LATEST_VERSION}
    for version in fifo.SUPPORTED_VERSIONS:
        stored, logs = logs_of(version)
        assert stored == version
        assert len(logs) >= rc.SEEDS_PER_VERSION


@pytest.mark.parametrize("version", sorted(rc.shipped()))
def test_shipped_corpus_file_is_unchanged(version: int) -> None:
    """A shipped corpus file is frozen: its bytes hash to the SHA-256 in SHIPPED.txt."""
    data = rc.corpus_path(version).read_bytes()
    assert hashlib.sha256(data).hexdigest() == rc.shipped()[version], (
        f"tests/fifo/corpus/v{version}.cbor.xz changed; a shipped corpus is never regenerated"
    )


@pytest.mark.parametrize("version", fifo.SUPPORTED_VERSIONS)
def test_corpus_replays_to_recorded_digests(version: int) -> None:
    """Every seeded log gives its recorded digest every 50 entries and at the end."""
    _, logs = logs_of(version)
    for log in logs:
        found = rc.first_divergence(version, log)
        assert found is None, f"v{version} corpus diverges: {found}"


def test_corpus_covers_the_machine() -> None:
    """The corpus exercises every command kind, bad input, timers and upgrades (v1's odd seeds
    to v2; v4's odd seeds start at v3 and upgrade to v4)."""
    kinds: dict[int, set[str]] = {}
    upgrades: dict[int, int] = {}
    for version in fifo.SUPPORTED_VERSIONS:
        _, logs = logs_of(version)
        names = kinds.setdefault(version, set())
        for log in logs:
            for entry in log.entries:
                if entry[0] == "upgrade":
                    upgrades[version] = upgrades.get(version, 0) + 1
                elif entry[0] == rc.START:
                    names.add(f"from v{entry[1]}")
                else:
                    names.add(type(entry[1]).__name__)
                    if getattr(entry[1], "queue", None) == "parts":  # a partitioned queue's name
                        names.add(f"{type(entry[1]).__name__}@parts")
    common = {"DeclareQueue", "DeleteQueue", "UpdateConfig", "Enqueue", "RegisterEnqueuer",
              "Checkout", "Settle", "Return", "Discard", "Credit", "Purge", "Expire",
              "ConnectionDown", "NodeDown", "NodeUp"}  # fmt: skip
    assert common <= kinds[1]
    assert common | {"Modify", "RenewLocks", "EvalConsumerTimeouts",
                     "ConsumerDisconnectedTimeout"} <= kinds[2]  # fmt: skip
    assert {"AnnotatedEnqueue", "DeclareGroupedQueue", "PurgeGroup"} <= kinds[3]  # v3: groups
    assert {"DeclarePartitionedQueue", "JoinGroup", "LeaveGroup"} <= kinds[3]  # consumer groups
    assert {"Enqueue@parts", "AnnotatedEnqueue@parts", "RegisterEnqueuer@parts",
            "DeleteQueue@parts"} <= kinds[3]  # fmt: skip  # v3: routed to the partitions
    assert {"NoneType", "list"} <= kinds[1]  # bad input that is not a command at all
    assert kinds[3] - {"from v3"} <= kinds[4]  # v4 has every v3 kind (on a v4 state too)
    assert {"BoundSettle", "BoundReturn", "BoundDiscard", "BoundModify", "BoundRenewLocks",
            "DeclareExchange", "DeleteExchange", "BindQueue", "UnbindQueue", "BindExchange",
            "UnbindExchange", "PublishToExchange", "from v3"} <= kinds[4]  # fmt: skip
    assert upgrades[1] >= rc.SEEDS_PER_VERSION // 2 - 10
    assert upgrades[4] == rc.SEEDS_PER_VERSION // 2  # every odd seed, once
    assert set(upgrades) == {1, 4}


def test_v4_corpus_exercises_references_exchanges_and_owners() -> None:
    """v4's answers in its corpus (first 60 logs): deliveries by body reference, publishes routed
    to several queues, unroutable and refused copies, foreign settles refused as not_owner,
    exchange refusals; and each odd seed applies v3 before its upgrade."""
    _, logs = logs_of(4)
    seen: set[str] = set()
    for log in logs[:60]:
        state, version = fifo.init_state(4), 4
        for entry in log.entries:
            if entry[0] == rc.START:
                state, version = fifo.init_state(entry[1]), entry[1]
            elif entry[0] == "upgrade":
                state, version = fifo.convert(state, version, 4, entry[1]), 4
            else:
                reply, effects = fifo.apply(entry[0], entry[1], state)
                seen |= answer_kinds(version, reply, effects)
    assert {"v3 Deliver", "v4 RefDeliver", "v4 RefDelivery", "v4 Delivery", "v4 RefDequeueOk",
            "v4 Routed to 2+", "v4 Routed refused", "v4 Unroutable", "v4 not_owner",
            "v4 unknown_exchange", "v4 access_refused", "v4 exchange_exists"} <= seen  # fmt: skip


def answer_kinds(version: int, reply: object, effects: Sequence[object]) -> set[str]:
    """Names of what one command answered (reply and effect classes, delivery item classes,
    error codes, a Routed reply's shape), each prefixed by the machine version."""
    names = {type(reply).__name__, *(type(effect).__name__ for effect in effects)}
    for effect in effects:
        names |= {type(item).__name__ for item in getattr(effect, "messages", ())}
    if isinstance(reply, Error):
        names.add(reply.code)
    if isinstance(reply, Routed):
        names |= {"Routed to 2+"} if len(reply.queues) > 1 else set()
        names |= {"Routed refused"} if reply.refused else set()
    return {f"v{version} {name}" for name in names}


def test_a_v3_log_upgraded_to_v4_at_a_split_replays_v3_until_then() -> None:
    """A shipped v3 log with an upgrade to v4 inserted at a seeded split: up to the split its
    checkpoints are v3's recorded ones, after it v4 goes on (it has no catch-all: a raise fails
    the test); the digest over 20 such logs is the same under any PYTHONHASHSEED
    (`test_replay_is_independent_of_the_hash_seed`)."""
    _, logs = logs_of(3)
    for log in logs[:20]:
        split = rc.split_of(log)
        got = dict(rc.replay(3, rc.upgraded_at_split(log, 4)))
        recorded = dict(zip(sorted(rc._checkpoints(len(log.entries))), log.digests, strict=True))
        before = [n for n in recorded if n <= split and n < len(log.entries)]
        assert [got[n] for n in before] == [recorded[n] for n in before], log.seed
        assert len(got) == len(rc._checkpoints(len(log.entries) + 1))


def test_a_changed_digest_is_reported_with_seed_and_index() -> None:
    """The check is not vacuous: a log whose recorded digest is off fails at that checkpoint."""
    _, logs = logs_of(2)
    log = logs[0]
    tampered = rc.CorpusLog(log.seed, log.entries, [*log.digests[:1], b"\0" * 16, *log.digests[2:]])
    found = rc.first_divergence(2, tampered)
    assert found is not None
    assert (found.seed, found.entry_index) == (log.seed, 2 * rc.CHECKPOINT_ENTRIES)
    assert f"seed {log.seed}" in str(found)


def test_replay_is_independent_of_the_hash_seed() -> None:
    """Equal logs give equal digests under any PYTHONHASHSEED (no set or str-hash order leaks):
    the corpus check passes under seeds 1 and 4242, and v3 logs upgraded to v4 at a split give
    the same digest under both (the processes run at once)."""
    check = [str(Path(rc.__file__)), "check", "--logs", "20"]
    split = [str(Path(rc.__file__)), "split-digest", "--version", "3", "--to", "4", "--logs", "20"]
    runs = [(check, "1"), (check, "4242"), (split, "1"), (split, "4242")]
    results = run_pythons(runs, 300)
    for result in results:
        assert result.returncode == 0, result.stdout + result.stderr
    versions = len(fifo.SUPPORTED_VERSIONS)
    for result in results[:2]:
        assert result.stdout.count("20 logs replay to their digests") == versions
    assert results[2].stdout == results[3].stdout and len(results[2].stdout.strip()) == 64

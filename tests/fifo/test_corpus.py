"""The pinned replay corpus: new code replays every shipped version's logs to the recorded digests.

Regenerate only a version that was never released: `python tests/fifo/replay_corpus.py generate
--version N` (after removing its line from corpus/SHIPPED.txt).
"""

from __future__ import annotations

import hashlib
from functools import cache
from pathlib import Path

import pytest

import fifo
import tests.fifo.replay_corpus as rc
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
    """The corpus exercises every command kind, bad input, timers and (v1) upgrades to v2."""
    kinds: dict[int, set[str]] = {}
    upgrades = 0
    for version in fifo.SUPPORTED_VERSIONS:
        _, logs = logs_of(version)
        names = kinds.setdefault(version, set())
        for log in logs:
            for entry in log.entries:
                if entry[0] == "upgrade":
                    upgrades += 1
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
    assert upgrades >= rc.SEEDS_PER_VERSION // 2 - 10


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
    the corpus check passes under seeds 1 and 4242 (both processes run at once)."""
    check = [str(Path(rc.__file__)), "check", "--logs", "20"]
    for result in run_pythons([(check, "1"), (check, "4242")], 300):
        assert result.returncode == 0, result.stdout + result.stderr
        assert "20 logs replay to their digests" in result.stdout

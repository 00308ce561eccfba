"""The journal keeps offsets, indexes and terms in memory, not the entries' bytes.

Before, `DurableFileJournal` held every entry's command bytes until log compaction (which waits
300 s), so a node kept the whole journal (21 MiB after a 120k-message benchmark) in memory.
Entries are now read back from the file, verified, with a bounded cache of the most recent ones.
These tests check the memory bound, that reads answer exactly what a list of the entries would
(ints, negative ints, slices, after every kind of change, across a reopen), and that read-back
still verifies checksums.
"""

from __future__ import annotations

import gc
import random
import tracemalloc
from pathlib import Path

import pytest

from raft import durability, storage
from raft.errors import StorageError

Entry = tuple[bytes, int, int]


def _journal(path: Path, policy: str = "batch") -> durability.DurableFileJournal:
    return durability.DurableFileJournal(str(path), policy, "n1")


def _numbered(path: Path, count: int) -> tuple[durability.DurableFileJournal, list[Entry]]:
    """A journal holding `count` small entries (indexes 1..count, term 1), and them."""
    journal = _journal(path)
    journal.setCurrentTerm(1, None)
    model = [(b"\x00k%d" % i, i + 1, 1) for i in range(count)]
    for entry in model:
        journal.add(*entry)
    return journal, model


def _all(journal: durability.DurableFileJournal) -> list[Entry]:
    return [journal[i] for i in range(len(journal))]


def test_entries_bytes_are_not_kept_in_memory(tmp_path: Path) -> None:
    """64 MiB of entries leave less than the tail cache's budget (plus the offset arrays)
    allocated once they are written."""
    journal = _journal(tmp_path / "raft.journal")
    journal.setCurrentTerm(1, None)
    body = b"\x00" + b"m" * (256 * 1024 - 1)
    gc.collect()
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        for i in range(256):
            journal.add(body, i + 1, 1)
        journal.sync()
        gc.collect()
        after, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(journal) == 256
    assert after - before < durability.TAIL_CACHE_BYTES + 2 * 1024 * 1024
    assert journal[0] == (body, 1, 1)
    journal._destroy()


def test_reads_match_a_list_through_every_kind_of_change(tmp_path: Path) -> None:
    """Ints, negative ints and slices (with steps and out-of-range bounds) answer what a plain
    list of the entries answers, through appends, tail cuts, compaction (prepared off the loop
    or not), clear and reopen, with a tail cache small enough that most reads go to the file.
    A compaction that finds its prepared file valid copies only the entries added since."""
    rng = random.Random(7)
    path = tmp_path / "raft.journal"
    journal = _journal(path)
    journal.setCurrentTerm(1, None)
    journal._tail_max_entries = 5
    journal._eager_max = 2
    model: list[Entry] = []
    next_index, term = 1, 1
    prepared = (-1, 0)  # the compaction prepared and still valid: its first index, its entries
    for step in range(800):
        action = rng.random()
        if action < 0.6 or not model:
            command = b"\x00" + bytes(rng.randrange(256) for _ in range(rng.randrange(0, 300)))
            journal.add(command, next_index, term)
            model.append((command, next_index, term))
            next_index += 1
        elif action < 0.75:
            cut = rng.randrange(len(model) + 2)
            journal.deleteEntriesFrom(cut)
            del model[cut:]
            prepared = (-1, 0)
            next_index = model[-1][1] + 1 if model else next_index
            term += 1
        elif action < 0.8:
            cut = rng.randrange(len(model))
            journal.prepare_compaction(model[cut][1])
            prepared = (model[cut][1], len(model) - cut)  # its first index, the entries written
        elif action < 0.85:
            cut = rng.randrange(len(model))
            first = (
                [e[1] for e in model].index(prepared[0])
                if prepared[0] in {e[1] for e in model}
                else None
            )
            if first is not None and rng.random() < 0.9:
                cut = first
            journal.deleteEntriesTo(cut)
            copied_before = prepared[1] if cut == first else 0
            assert journal.compacted_on_loop == len(model) - cut - copied_before, step
            del model[:cut]
            prepared = (-1, 0)
        elif action < 0.88:
            journal.clear()
            model.clear()
            prepared = (-1, 0)
        elif action < 0.93:
            journal.sync()
            journal._destroy()
            journal = _journal(path)
            journal._tail_max_entries = 5
            journal._eager_max = 2
            prepared = (-1, 0)
        assert len(journal) == len(model), step
        if model:  # [-1] has its own fast path (the tail cache): pysyncobj asks it every tick
            assert journal[-1] == model[-1], step
        else:
            with pytest.raises(IndexError):
                journal[-1]
        if model:
            for i in {0, 1, len(model) - 1, rng.randrange(len(model))}:
                if i < len(model):
                    assert journal[i] == model[i], (step, i)
                    assert journal[i - len(model)] == model[i - len(model)], (step, i)
        lo, hi = rng.randrange(-3, len(model) + 3), rng.randrange(-3, len(model) + 3)
        view = journal[lo:hi]
        assert list(view) == model[lo:hi], step
        assert len(view) == len(model[lo:hi])
        assert bool(view) == bool(model[lo:hi])
        if model[lo:hi]:
            assert view[0] == model[lo:hi][0] and view[-1] == model[lo:hi][-1]
            assert list(view[1:]) == model[lo:hi][1:]
            assert list(reversed(view[1:])) == list(reversed(model[lo:hi][1:]))
        assert list(journal[lo:]) == model[lo:]
        assert list(journal[::3]) == model[::3]
    with pytest.raises(IndexError):
        journal[len(model)]
    journal._destroy()
    assert _all(_journal(path)) == model
    assert not list(tmp_path.glob("*" + durability.COMPACTING_SUFFIX))


def test_a_view_reads_in_bounded_chunks(tmp_path: Path) -> None:
    """Iterating a view of the whole journal (a restart applying everything) reads it chunk by
    chunk: each chunk is decoded when it is reached, not the whole range up front."""
    journal = _journal(tmp_path / "raft.journal")
    journal.setCurrentTerm(1, None)
    body = b"\x00" + b"c" * (64 * 1024)
    for i in range(100):
        journal.add(body, i + 1, 1)
    journal._tail.clear()
    journal._tail_bytes = 0
    view = journal[0:]
    reads: list[int] = []
    original = journal._read_range

    def spy(lo: int, hi: int) -> list[Entry]:
        reads.append(hi - lo)
        return original(lo, hi)

    journal._read_range = spy  # type: ignore[method-assign]
    assert sum(1 for _ in view) == 100
    assert sum(reads) == 100
    assert max(reads) * len(body) <= durability.READ_CHUNK_BYTES + len(body)
    journal._destroy()


@pytest.mark.parametrize("where", ["payload", "header"])
def test_damage_found_on_read_back_is_refused(tmp_path: Path, where: str) -> None:
    """An entry that went bad on disk after it was written is not served: StorageError naming
    the file and the offset."""
    path = tmp_path / "raft.journal"
    journal = _journal(path)
    journal.setCurrentTerm(1, None)
    for i in range(10):
        journal.add(b"\x00entry-%d" % i, i + 1, 1)
    journal.sync()
    journal._tail.clear()
    journal._tail_bytes = 0
    offset = storage.scan_journal(path, path.read_bytes()).offsets[3]
    data = bytearray(path.read_bytes())
    data[offset + (30 if where == "payload" else 9)] ^= 0x40
    path.write_bytes(bytes(data))
    assert journal[2] == (b"\x00entry-2", 3, 1)
    with pytest.raises(StorageError, match=f"offset {offset}"):
        journal[3]
    with pytest.raises(StorageError):
        list(journal[1:5])
    journal._destroy()


def test_a_compaction_streams_the_kept_entries(tmp_path: Path) -> None:
    """deleteEntriesTo rewrites the file from the old one (verified) and keeps the tail cache
    consistent with the new positions."""
    path = tmp_path / "raft.journal"
    journal, model = _numbered(path, 50)
    journal.deleteEntriesTo(45)
    assert _all(journal) == model[45:]
    assert journal[-1] == model[-1] and journal[0] == model[45]
    journal.add(b"\x00k50", 51, 1)
    journal._destroy()
    assert _all(_journal(path)) == [*model[45:], (b"\x00k50", 51, 1)]


def test_a_prepared_compaction_leaves_the_loop_only_what_came_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """prepare_compaction (the snapshot thread) copies the kept entries in passes while the
    loop appends (here: 5,000 entries appended during its first write); deleteEntriesTo then
    copies only the entries added after its last pass, and the file it renames into place
    reads back whole after a restart."""
    path = tmp_path / "raft.journal"
    journal = _journal(path)
    journal.setCurrentTerm(1, None)
    model = [(b"\x00" + bytes(500), i + 1, 1) for i in range(20_000)]
    for entry in model[:10_000]:
        journal.add(*entry)
    write = durability._Prepared.write
    writes = []

    def write_while_the_loop_appends(prepared: durability._Prepared, entries: list[Entry]) -> None:
        write(prepared, entries)
        writes.append(len(entries))
        if len(writes) == 1:
            for entry in model[10_000:15_000]:
                journal.add(*entry)

    monkeypatch.setattr(durability._Prepared, "write", write_while_the_loop_appends)
    journal.prepare_compaction(4_001)
    monkeypatch.undo()
    assert sum(writes) == 11_000  # a second pass took the 5,000 (2.5 MB left > 1 MiB)
    for entry in model[15_000:15_007]:
        journal.add(*entry)
    journal.deleteEntriesTo(4_000)
    assert journal.compacted_on_loop == 7
    assert journal[0] == model[4_000] and journal[-1] == model[15_006]
    journal._destroy()
    assert _all(_journal(path)) == model[4_000:15_007]
    assert not list(tmp_path.glob("*" + durability.COMPACTING_SUFFIX))


@pytest.mark.parametrize("change", ["cut", "clear", "compaction"])
def test_a_prepared_compaction_the_log_moved_under_is_not_used(tmp_path: Path, change: str) -> None:
    """A tail cut, a clear or another compaction after the prepare makes its file stale: the
    compaction rewrites the kept entries on the loop, as before, and the stale file is gone."""
    path = tmp_path / "raft.journal"
    journal, model = _numbered(path, 100)
    journal.prepare_compaction(41)
    assert list(tmp_path.glob("*" + durability.COMPACTING_SUFFIX))
    if change == "cut":
        journal.deleteEntriesFrom(90)
        model = model[:90]
    elif change == "clear":
        journal.clear()
        model = [(b"\x00new", 7, 2), (b"\x00new", 8, 2)]
        for entry in model:
            journal.add(*entry)
    else:
        journal.deleteEntriesTo(10)
        model = model[10:]
    assert not list(tmp_path.glob("*" + durability.COMPACTING_SUFFIX))
    journal.deleteEntriesTo(1)
    assert journal.compacted_on_loop == len(model) - 1
    journal._destroy()
    assert _all(_journal(path)) == model[1:]

"""raft.safe_pickle and raft.durability: the allow-list unpickler and the fsync policies."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import pysyncobj.pickle as pysyncobj_pickle
import pytest
from pysyncobj.node import TCPNode

from raft import durability, safe_pickle


class _Gadget:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, ("echo pwned > /dev/null",))


def test_malicious_pickle_is_refused_after_install() -> None:
    """An os.system gadget is refused by pysyncobj's (patched) loader."""
    safe_pickle.install()
    payload = pickle.dumps(_Gadget(), 2)
    with pytest.raises(pickle.UnpicklingError):
        pysyncobj_pickle.loads(payload)


def test_pysyncobj_messages_still_load() -> None:
    """The messages pysyncobj sends (dicts, bytes, tuples, nodes) pass the allow-list."""
    safe_pickle.install()
    message = {
        "type": "append_entries",
        "entries": [(b"\x00cmd", 5, 1)],
        "nodes": {TCPNode("127.0.0.1:1")},
        "data": bytearray(b"x"),
    }
    loaded = pysyncobj_pickle.loads(pysyncobj_pickle.dumps(message))
    assert loaded["entries"] == [(b"\x00cmd", 5, 1)]
    assert next(iter(loaded["nodes"])).id == "127.0.0.1:1"


def test_the_last_chunk_of_a_snapshot_transfer_loads() -> None:
    """pysyncobj ends every snapshot sent to a lagging follower with an empty chunk, pickled
    (protocol 2) as `bytes()`; refusing that global silently dropped the connection, so a
    follower behind the leader's log compaction never caught up (issue 17)."""
    safe_pickle.install()
    for chunk in ((b"snapshot bytes", True, False), (b"", False, True)):
        message = {"type": "append_entries", "term": 3, "commit_index": 9, "serialized": chunk}
        assert pysyncobj_pickle.loads(pysyncobj_pickle.dumps(message)) == message


def test_a_log_command_costs_its_bytes_and_older_journals_still_load() -> None:
    """pysyncobj pickles every log command (`(method id, args, kwargs)`, our entry blob in args)
    with protocol 2, where bytes are `_codecs.encode(blob.decode("latin1"), "latin1")`: every
    byte >= 0x80 took 2 bytes in the journal and on the wire, and encoding and decoding ran
    about 20 ms per MiB on the loop (a 15 MiB publish stalled each node for ~300 ms; issue 31
    item 5). Installed, commands are pickled with protocol 5 (bytes as they are); the
    protocol-2 commands of journals written before still load."""
    safe_pickle.install()
    blob = os.urandom(1 << 20)
    command: tuple[int, tuple[bytes], dict[str, object]] = (0, (blob,), {})
    pickled = pysyncobj_pickle.dumps(command)
    assert len(pickled) <= len(blob) + 64
    assert pysyncobj_pickle.loads(pickled) == command
    assert pysyncobj_pickle.loads(pickle.dumps(command, 2)) == command


@pytest.mark.parametrize(
    ("policy", "syncs_after_adds"), [("always", 3), ("batch", 0), ("never", 0)]
)
def test_journal_fsync_policies(tmp_path: Path, policy: str, syncs_after_adds: int) -> None:
    """`always` syncs every record, `batch` only on sync(), `never` not at all."""
    journal = durability.DurableFileJournal(str(tmp_path / "raft.journal"), policy)
    journal.setCurrentTerm(1, None)  # as pysyncobj does before any entry of term 1
    for i in range(3):
        journal.add(b"\x00entry", i + 1, 1)
    assert journal.syncs == syncs_after_adds
    synced = journal.sync()
    assert synced == (policy == "batch")
    assert journal.sync() is False  # nothing new
    journal._destroy()
    reopened = durability.DurableFileJournal(str(tmp_path / "raft.journal"), policy)
    assert [reopened[i][1] for i in range(len(reopened))] == [1, 2, 3]
    reopened._destroy()


def test_unknown_policy_is_rejected() -> None:
    """register() refuses a policy that is not always/batch/never."""
    with pytest.raises(ValueError):
        durability.register("/tmp/x.journal", "sometimes")

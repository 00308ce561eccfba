"""Codec evolution: byte-exact encodings per tag, older shorter arrays, and today's main's files.

`fixtures/` was written by main d4e4698 before the codec had schemas (make_main_fixtures.py).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any, cast

import cbor2
import pytest

import fifo
from fifo import codec
from fifo import commands as c
from raft.entry import command_index, decode_entry
from tests.fifo.codec_samples import SAMPLES

FIXTURES = Path(__file__).parent / "fixtures"
RECORD = json.loads((FIXTURES / "main_fixtures.json").read_text())


def golden_hex() -> dict[str, tuple[int, str]]:
    """Class name -> (tag, hex) from fixtures/codec_tags.hex."""
    out: dict[str, tuple[int, str]] = {}
    for line in (FIXTURES / "codec_tags.hex").read_text().splitlines():
        if line and not line.startswith("#"):
            name, tag, blob = line.split()
            out[name] = (int(tag), blob)
    return out


def test_every_tag_has_a_byte_fixture() -> None:
    """One golden instance per tagged class, so no tag can change its encoding unnoticed."""
    assert set(golden_hex()) == {cls.__name__ for cls in codec.CLASSES}
    assert {type(s) for s in SAMPLES} == set(codec.CLASSES)


@pytest.mark.parametrize("sample", SAMPLES, ids=[type(s).__name__ for s in SAMPLES])
def test_encoding_is_byte_identical_to_the_fixture(sample: object) -> None:
    """The bytes of each tag are those main d4e4698 wrote, and decode back to the value."""
    tag, blob = golden_hex()[type(sample).__name__]
    assert fifo.encode(sample).hex() == blob
    assert codec.CODEC.tag_by_class[type(sample)] == tag
    assert fifo.decode(bytes.fromhex(blob)) == sample


@dataclasses.dataclass(frozen=True, slots=True)
class EnqueueWithPriority:
    """Enqueue as a later version might declare it: one more field, with a default."""

    queue: str
    body: bytes
    enqueuer: str | None = None
    seq: int | None = None
    connection: c.ConnectionId | None = None
    ttl_ms: int | None = None
    priority: int = 4
    headers: tuple[tuple[str, str], ...] = ()


def evolved_codec() -> codec.Codec:
    """Today's table with Enqueue replaced by its evolved form (same tag)."""
    classes = tuple(EnqueueWithPriority if cls is c.Enqueue else cls for cls in codec.CLASSES)
    return codec.Codec(classes)


def test_an_added_defaulted_field_decodes_the_older_encoding() -> None:
    """An Enqueue encoded today decodes as the evolved class with its new fields defaulted."""
    old = c.Enqueue("q", b"body", "e", 3, c.ConnectionId("n1", 1, 2), 50)
    new = evolved_codec().decode(fifo.encode(old))
    assert new == EnqueueWithPriority("q", b"body", "e", 3, c.ConnectionId("n1", 1, 2), 50, 4, ())
    assert evolved_codec().decode(bytes.fromhex(golden_hex()["Enqueue"][1])).priority == 4


def test_a_newer_longer_array_is_refused_by_the_older_decoder() -> None:
    """An array with more fields than the schema is a CodecError naming class, tag and count."""
    blob = evolved_codec().encode(EnqueueWithPriority("q", b"x", priority=9))
    expected = r"Enqueue \(tag 71011\): 8 fields, the schema accepts 2\.\.6"
    with pytest.raises(fifo.CodecError, match=expected):
        fifo.decode(blob)


def test_an_array_shorter_than_the_required_fields_is_refused() -> None:
    """Fields without a default cannot be left out."""
    blob = cbor2.dumps(cbor2.CBORTag(codec.CODEC.tag_by_class[c.Settle], ["q", 1]))
    with pytest.raises(fifo.CodecError, match=r"Settle \(tag 71014\): 2 fields.*3\.\.3"):
        fifo.decode(blob)


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        (["q", "not bytes"], "body"),
        ([5, b"x"], "queue"),
        (["q", b"x", None, True], "seq"),  # a bool is not an int on the wire
        (["q", b"x", None, None, ["n1", 1, 2]], "connection"),  # untagged ConnectionId
    ],
)
def test_a_mistyped_field_is_refused(fields: list[object], field: str) -> None:
    """A field of the wrong wire type is a CodecError naming the field."""
    blob = cbor2.dumps(cbor2.CBORTag(codec.CODEC.tag_by_class[c.Enqueue], fields))
    with pytest.raises(fifo.CodecError, match=rf"Enqueue \(tag 71011\): field {field} must be"):
        fifo.decode(blob)


def test_shorter_optional_arrays_round_trip_to_defaults() -> None:
    """Every tag accepts its shortest legal array and fills the defaults (`Enqueue("q", b"")`)."""
    for schema in codec.CODEC.schemas.values():
        if schema.required == len(schema.fields):
            continue
        sample = next(s for s in SAMPLES if type(s) is schema.cls)
        head = [getattr(sample, f.name) for f in schema.fields[: schema.required]]
        # encode the head with our codec (nested tags), then re-tag it as a short array
        tagged = cbor2.dumps(cbor2.CBORTag(schema.tag, cbor2.loads(fifo.encode(head))))
        back = fifo.decode(tagged)
        defaults = {f.name: f.default for f in schema.fields[schema.required :]}
        assert back == dataclasses.replace(cast(Any, sample), **defaults)  # (a dataclass)


@pytest.mark.parametrize("name", ["snapshot_v1_main.cbor", "snapshot_v2_main.cbor"])
def test_snapshots_of_main_restore_to_their_digest(name: str) -> None:
    """A snapshot written by main d4e4698 restores and gives the digest main recorded."""
    data = (FIXTURES / name).read_bytes()
    assert hashlib.sha256(data).hexdigest() == RECORD["sha256"][name]
    state = fifo.restore(data)
    assert fifo.digest(state) == RECORD["snapshots"][name]
    assert fifo.snapshot(state) == data


def test_journal_of_main_decodes_and_replays_to_its_digest() -> None:
    """A journal written by main d4e4698 decodes (as main did) and replays to main's digests.

    Mistyped bad input that main's codec let through is now a CodecError, which raft turns
    into an Error reply: the state is the same either way, so the digests still hold.
    """
    data = (FIXTURES / "journal_main.cbor").read_bytes()
    assert hashlib.sha256(data).hexdigest() == RECORD["sha256"]["journal_main.cbor"]
    state = fifo.init_state(1)
    reprs: list[str] = []
    refused = 0
    for position, blob in enumerate(cbor2.loads(data)):
        entry = decode_entry(blob)
        meta = fifo.Meta(command_index(position + 1, 0), 1, entry.ts_ms, state.version)
        if entry.kind == "upgrade":
            assert fifo.digest(state) == RECORD["journal"]["digest_at_upgrade"]
            state = fifo.convert(state, 1, entry.version, meta)
            continue
        for command_blob in entry.cmds:
            reprs.append(repr(codec.decode_unchecked(command_blob)))
            try:
                command = fifo.decode(command_blob)
            except fifo.CodecError:
                refused += 1
                continue
            fifo.apply(meta, command, state)
    joined = "\n".join(reprs).encode()
    assert hashlib.sha256(joined).hexdigest() == RECORD["journal"]["decoded_repr_sha256"]
    assert fifo.digest(state) == RECORD["journal"]["final_digest"]
    assert refused < len(reprs) // 10


def test_a_longer_snapshot_record_is_refused() -> None:
    """A snapshot from newer code (a message record with an extra field) is a clear CodecError."""
    body = cbor2.loads((FIXTURES / "snapshot_v1_main.cbor").read_bytes())
    queue = next(q for q in body[3] if q[2])  # a queue with ready messages
    queue[2][0].extend([1, None, 0, "extra"])  # v3's three trailing fields, then one more
    with pytest.raises(fifo.CodecError, match=r"message record of 10 fields, expected 6\.\.9"):
        fifo.restore(cbor2.dumps(body, default=codec.CODEC.default, canonical=True))


def test_a_shorter_snapshot_record_takes_declared_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    """With a trailing field declared (as v3 would), today's shorter records restore with it."""
    monkeypatch.setitem(codec._RECORD_WIDTH, "message", 10)
    monkeypatch.setitem(codec._RECORD_DEFAULTS, "message", (0, None, 0, "group-default"))
    padded = codec._record([b"x", None, 0, 0, [], 0], "message")
    assert padded[-4:] == [0, None, 0, "group-default"]
    state = fifo.restore((FIXTURES / "snapshot_v1_main.cbor").read_bytes())
    assert fifo.digest(state) == RECORD["snapshots"]["snapshot_v1_main.cbor"]

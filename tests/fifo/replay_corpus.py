"""The pinned replay corpus: seeded fuzzer logs per machine version, with digests to replay against.

    python tests/fifo/replay_corpus.py generate --version 2      # write corpus/v2.cbor.xz
    python tests/fifo/replay_corpus.py check                      # replay every corpus file
    python tests/fifo/replay_corpus.py split-digest --version 3 --to 4 --logs 20

A corpus file holds, for each seed, the log the fuzzer applied (commands with their Meta, and for
v1 an upgrade to v2 at a seeded split on odd seeds; v4's odd seeds start at v3, marked by a first
entry `["from", 3]`, and upgrade to v4 at a seeded split) and a digest after every
`CHECKPOINT_ENTRIES` entries and at the end. A digest covers the state (`fifo.digest`) and
everything the machine answered so far (replies and effects), so a change in any reply, effect
or state of a shipped version shows up as the first diverging checkpoint, named by seed and
entry index. The recorded digests are computed by replaying the *stored* log, exactly as the
test does. `corpus/SHIPPED.txt` pins each file's SHA-256; `generate` refuses to overwrite a
version listed there (remove its line first, only for a version that has not been released).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import lzma
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import cbor2

import fifo
from fifo.codec import decode_unchecked
from fifo.fuzz.prng import SplitMix64
from fifo.fuzz.runner import Upgrade, run_with_log
from fifo.meta import Meta

CORPUS_DIR = Path(__file__).resolve().parent / "corpus"
SHIPPED = CORPUS_DIR / "SHIPPED.txt"
CORPUS_FORMAT = 1
SEEDS_PER_VERSION = 200
STEPS_PER_LOG = 300
CHECKPOINT_ENTRIES = 50
DIGEST_BYTES = 16
FIRST_SEED = {1: 1_000_000, 2: 2_000_000, 3: 3_000_000, 4: 4_000_000}
# a version's odd seeds start at this earlier version and upgrade at a seeded split (v1's odd
# seeds upgrade from the start, to the latest version when it was generated: v2)
UPGRADE_FROM = {4: 3}
START = "from"  # a log's first entry ["from", N]: it starts at machine version N


@dataclass(frozen=True, slots=True)
class CorpusLog:
    """One seeded log and the digests replaying it must give."""

    seed: int
    entries: list[Any]  # [Meta, command] or ["upgrade", Meta]; first maybe ["from", version]
    digests: list[bytes]  # after entry CHECKPOINT_ENTRIES, 2 * CHECKPOINT_ENTRIES, ..., and last


@dataclass(frozen=True, slots=True)
class Divergence:
    """The first checkpoint where a replay differs from the recorded digest."""

    seed: int
    entry_index: int  # entries applied when the digest was taken (1-based count)
    expected: str
    actual: str

    def __str__(self) -> str:
        return (f"seed {self.seed}: digest after entry {self.entry_index} is {self.actual}, "
                f"corpus says {self.expected}")  # fmt: skip


def corpus_path(version: int) -> Path:
    """Where the corpus of a machine version lives."""
    return CORPUS_DIR / f"v{version}.cbor.xz"


def _plain(value: Any) -> Any:
    """A class-name form of replies and effects that ignores trailing fields at their default.

    So a later field added with a default (codec evolution) does not change old digests.
    """
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = dataclasses.fields(value)
        items = [getattr(value, f.name) for f in fields]
        while fields and items and fields[len(items) - 1].default is not dataclasses.MISSING \
                and items[-1] == fields[len(items) - 1].default:  # fmt: skip
            items.pop()
        return [type(value).__name__, *(_plain(v) for v in items)]
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _checkpoints(count: int) -> set[int]:
    return {*range(CHECKPOINT_ENTRIES, count + 1, CHECKPOINT_ENTRIES), count}


def replay(version: int, entries: list[Any]) -> Iterator[tuple[int, bytes]]:
    """Apply a stored log from an empty state; yield (entries applied, digest) at checkpoints."""
    state = fifo.init_state(version)
    current = version
    outputs = hashlib.sha256()
    marks = _checkpoints(len(entries))
    for number, entry in enumerate(entries, 1):
        if number == 1 and isinstance(entry, list) and entry and entry[0] == START:
            current = entry[1]
            state = fifo.init_state(current)
            outputs.update(b"from")
        elif isinstance(entry, list) and entry and entry[0] == "upgrade":
            meta = entry[1]
            state = fifo.convert(state, current, meta.machine_version, meta)
            current = meta.machine_version
            outputs.update(b"upgrade")
        else:
            reply, effects = fifo.apply(entry[0], entry[1], state)
            outputs.update(cbor2.dumps(_plain([reply, effects]), canonical=True))
        if number in marks:
            mark = hashlib.sha256(fifo.digest(state).encode() + outputs.digest())
            yield number, mark.digest()[:DIGEST_BYTES]


def record(version: int, seed: int) -> CorpusLog:
    """Run the fuzzer for `seed` and store its log with the digests of replaying it."""
    start = UPGRADE_FROM[version] if version in UPGRADE_FROM and seed % 2 else version
    upgrade: bool = start < fifo.LATEST_VERSION and bool(seed % 2)
    upgrade_at: Literal["random"] | None = "random" if upgrade else None
    log, result = run_with_log(seed, STEPS_PER_LOG, start, upgrade_at)
    if result.violations:
        raise SystemExit(f"seed {seed}: the fuzzer found violations: {result.violations[:3]}")
    entries: list[Any] = [[START, start]] if start != version else []
    for entry in log:
        if isinstance(entry, Upgrade):
            entries.append(["upgrade", entry.meta])
        else:
            entries.append([entry[0], entry[1]])
    # store, then read back: the digests are those of the log as the test will see it
    stored = decode_unchecked(fifo.encode(entries))
    digests = [digest for _, digest in replay(version, stored)]
    return CorpusLog(seed, stored, digests)


def encode_corpus(version: int, logs: list[CorpusLog]) -> bytes:
    """The compressed corpus file of a version."""
    body = [CORPUS_FORMAT, version, CHECKPOINT_ENTRIES,
            [[log.seed, log.entries, log.digests] for log in logs]]  # fmt: skip
    return lzma.compress(fifo.encode(body), preset=9 | lzma.PRESET_EXTREME)


def decode_corpus(data: bytes) -> tuple[int, list[CorpusLog]]:
    """(version, logs) of a corpus file; unchecked decoding keeps the fuzzer's bad input."""
    fmt, version, every, logs = decode_unchecked(lzma.decompress(data))
    if fmt != CORPUS_FORMAT or every != CHECKPOINT_ENTRIES:
        raise ValueError(f"corpus format {fmt} every {every} is not {CORPUS_FORMAT}/"
                         f"{CHECKPOINT_ENTRIES}")  # fmt: skip
    return version, [CorpusLog(seed, list(entries), list(digests))
                     for seed, entries, digests in logs]  # fmt: skip


def first_divergence(version: int, log: CorpusLog) -> Divergence | None:
    """Replay one log; the first checkpoint whose digest differs, or None."""
    got = list(replay(version, log.entries))
    for position, (number, actual) in enumerate(got):
        expected = log.digests[position] if position < len(log.digests) else b""
        if actual != expected:
            return Divergence(log.seed, number, expected.hex(), actual.hex())
    if len(got) != len(log.digests):
        return Divergence(log.seed, len(log.entries), "more checkpoints", "fewer")
    return None


def shipped() -> dict[int, str]:
    """Machine version -> SHA-256 of its shipped corpus file."""
    out: dict[int, str] = {}
    for line in SHIPPED.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, sha = line.split()
            out[int(name.removeprefix("v"))] = sha
    return out


def generate(version: int) -> None:
    """Write the corpus of a version that is not shipped yet and record its SHA-256."""
    if version in shipped():
        raise SystemExit(f"v{version} is shipped: its corpus is frozen (see {SHIPPED.name})")
    first = FIRST_SEED[version]
    logs = [record(version, seed) for seed in range(first, first + SEEDS_PER_VERSION)]
    data = encode_corpus(version, logs)
    corpus_path(version).write_bytes(data)
    sha = hashlib.sha256(data).hexdigest()
    entries = sum(len(log.entries) for log in logs)
    print(f"v{version}: {len(logs)} logs, {entries} entries, {len(data)} bytes, sha256 {sha}")
    print(f"when v{version} is released, freeze it: add the line `v{version} {sha}` to "
          f"{SHIPPED.name}")


def corpus_versions() -> list[int]:
    """Versions with a corpus file: the shipped ones (frozen) and unreleased ones (may change)."""
    return sorted(v for v in fifo.SUPPORTED_VERSIONS if corpus_path(v).exists())


def split_of(log: CorpusLog) -> int:
    """A seeded split of a log (1 .. len - 1): where `upgraded_at_split` converts it."""
    return 1 + SplitMix64(log.seed ^ 0x5EED_0F_F00D).below(max(1, len(log.entries) - 1))


def upgraded_at_split(log: CorpusLog, to_version: int) -> list[Any]:
    """The log with an upgrade to `to_version` inserted at `split_of(log)`, timed as the entry
    before it (a shipped corpus log replayed across a later release's conversion)."""
    split = split_of(log)
    before = log.entries[split - 1]
    meta = before[1] if before[0] == "upgrade" else before[0]
    upgrade = ["upgrade", Meta(meta.index, meta.term, meta.system_time_ms, to_version)]
    return [*log.entries[:split], upgrade, *log.entries[split:]]


def split_digest(version: int, to_version: int, logs_max: int) -> str:
    """One digest over every checkpoint of the first `logs_max` logs of `version`'s corpus,
    each upgraded to `to_version` at its seeded split (equal under any PYTHONHASHSEED)."""
    _, logs = decode_corpus(corpus_path(version).read_bytes())
    total = hashlib.sha256()
    for log in logs[:logs_max]:
        for number, digest in replay(version, upgraded_at_split(log, to_version)):
            total.update(number.to_bytes(4, "big") + digest)
    return total.hexdigest()


def check(logs_max: int | None = None) -> int:
    """Replay every corpus (its first `logs_max` logs); print the first divergence."""
    status = 0
    for version in corpus_versions():
        _, logs = decode_corpus(corpus_path(version).read_bytes())
        logs = logs[:logs_max]
        for log in logs:
            if (found := first_divergence(version, log)) is not None:
                print(f"v{version}: {found}")
                status = 1
                break
        else:
            print(f"v{version}: {len(logs)} logs replay to their digests")
    return status


def main(argv: list[str]) -> int:
    """Command line: generate or check."""
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="action", required=True)
    gen = sub.add_parser("generate", help="write the corpus of an unshipped version")
    gen.add_argument("--version", type=int, required=True, choices=fifo.SUPPORTED_VERSIONS)
    replay_parser = sub.add_parser("check", help="replay every shipped corpus")
    replay_parser.add_argument("--logs", type=int, default=None, help="only the first N logs")
    split = sub.add_parser("split-digest", help="replay logs upgraded at a seeded split")
    split.add_argument("--version", type=int, required=True, choices=fifo.SUPPORTED_VERSIONS)
    split.add_argument("--to", type=int, required=True, choices=fifo.SUPPORTED_VERSIONS)
    split.add_argument("--logs", type=int, default=SEEDS_PER_VERSION, help="the first N logs")
    args = parser.parse_args(argv)
    if args.action == "generate":
        generate(args.version)
        return 0
    if args.action == "split-digest":
        print(split_digest(args.version, args.to, args.logs))
        return 0
    return check(args.logs)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

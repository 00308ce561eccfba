"""The upgrade dry-run (raft/dryrun.py) on generated logs, including planted unsafe upgrades."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import fifo
from cluster.cli.exits import CliError
from cluster.cli.main import cli
from fifo.commands import (
    Checkout,
    Command,
    ConnectionId,
    ConsumerId,
    DeclareQueue,
    Enqueue,
    QueueConfig,
    Return,
    Settle,
    SimplePrefetch,
)
from fifo.effects import Deliver
from fifo.fuzz.runner import generate_log
from fifo.meta import Meta
from fifo.replies import Error
from raft.dryrun import counters, default_every, dry_run
from raft.entry import command_index
from raft.logfile import EndRecord, EntryRecord, Header, LoggedCommand, LogWriter

PER_ENTRY = 3
CONN = ConnectionId("n1", 1, 1)
WORKER = ConsumerId("w1", CONN)


class Workload:
    """Producer + worker traffic whose client choices do not depend on the machine version."""

    def __init__(self, steps: int) -> None:
        self.steps = steps
        self.pending: list[int] = []
        self.settles = 0

    def commands(self) -> Iterator[Command]:
        """Yield the commands; `seen` must be fed the effects of each one before the next."""
        yield DeclareQueue("jobs", QueueConfig())
        yield Checkout("jobs", WORKER, SimplePrefetch(4))
        for step in range(self.steps):
            if step % 3 != 2 or not self.pending:  # a backlog builds up
                yield Enqueue("jobs", b"job-%d" % step, connection=CONN)
                continue
            msg_id = self.pending.pop(0)
            self.settles += 1
            kind = Return if self.settles % 5 == 0 else Settle
            yield kind("jobs", WORKER, (msg_id,))

    def seen(self, effects: list[Any]) -> None:
        """Learn the message ids delivered to the worker."""
        for effect in effects:
            if isinstance(effect, Deliver):
                self.pending.extend(d.msg_id for d in effect.messages)


def write_log(
    path: Path,
    steps: int = 240,
    upgrade_after: int | None = None,
    seed: int | None = None,
) -> tuple[int, Any]:
    """A v1 log as the cluster would export it: 3 commands per entry; returns (entries, state).

    The workload traffic, or a fuzz log with `seed`. `upgrade_after`: an applied upgrade entry
    to v2 after that many cmds entries.
    """
    workload = Workload(steps)
    if seed is None:
        source: Iterator[Command] = workload.commands()
    else:
        source = iter([command for _meta, command in generate_log(seed, steps, 1)])
    state, version, index, count = fifo.init_state(1), 1, 0, 0
    with LogWriter.open(path) as writer:
        writer.write(Header("n1", "test", 0, 0))
        ordinal, done = 0, False
        while not done:
            if upgrade_after is not None and ordinal == upgrade_after:
                index += 1
                meta = Meta(command_index(index, 0), 1, 1000 + ordinal, 2)
                state, version = fifo.convert(state, 1, 2, meta), 2
                writer.write(
                    EntryRecord("upgrade", index, 1, from_version=1, version=2, applied=True)
                )
            index += 1
            logged = []
            for position in range(PER_ENTRY):
                command = next(source, None)
                if command is None:
                    done = True
                    break
                meta = Meta(command_index(index, position), 1, 1000 + ordinal, version)
                _reply, effects = fifo.apply(meta, command, state)
                workload.seen(effects)
                logged.append(LoggedCommand(meta, fifo.encode(command)))
                count += 1
            if not logged:
                index -= 1
                break
            writer.write(EntryRecord("cmds", index, 1, 1000 + ordinal, commands=tuple(logged)))
            ordinal += 1
        writer.write(EndRecord(index, count, index, version, "", fifo.digest(state)))
    return ordinal, state


def test_a_clean_v1_log_is_safe_at_every_split_point(tmp_path: Path) -> None:
    path = tmp_path / "a.log"
    entries, state = write_log(path)
    report = dry_run(path, 2, every=1)
    assert report.safe, report.to_plain()
    assert len(report.splits) == entries + 1  # before each entry, and at the end
    assert all(split.status == "ok" and split.conserved for split in report.splits)
    assert report.baseline_digest == fifo.digest(state)
    assert report.splits[-1].before == counters(state)
    assert sum(split.replies_compared for split in report.splits) > 0


@pytest.mark.parametrize("seed", [3, 11, 29])
def test_fuzz_logs_keep_the_conserved_counters_at_every_split_point(
    tmp_path: Path, seed: int
) -> None:
    """Clients of a fuzz log react to v1 replies, so v2 may refuse later commands; the
    conversion itself must still keep every counter and nothing may raise."""
    path = tmp_path / "fuzz.log"
    write_log(path, steps=300, seed=seed)
    report = dry_run(path, 2, every=1)
    assert not report.baseline_errors
    for split in report.splits:
        assert split.conserved and not split.errors, split.to_plain()


def test_every_k_and_the_default_bound_the_number_of_split_points(tmp_path: Path) -> None:
    path = tmp_path / "a.log"
    entries, _ = write_log(path)
    assert len(dry_run(path, 2, every=10).splits) == math.ceil(entries / 10) + 1
    report = dry_run(path, 2)
    assert report.every == default_every(entries)
    assert len(report.splits) <= 33


def test_split_points_after_the_logs_own_upgrade_are_skipped(tmp_path: Path) -> None:
    path = tmp_path / "a.log"
    write_log(path, upgrade_after=20)
    report = dry_run(path, 2, every=5)
    assert report.safe
    statuses = [(split.ordinal, split.status) for split in report.splits]
    assert all(status == "ok" for ordinal, status in statuses if ordinal < 20)
    assert all(status == "skipped" for ordinal, status in statuses if ordinal >= 20)


def test_a_conversion_that_loses_a_message_is_unsafe(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "a.log"
    write_log(path)
    original = fifo.convert

    def lossy(state: Any, from_version: int, to_version: int, meta: Meta) -> Any:
        new = original(state, from_version, to_version, meta)
        for queue in new.queues.values():
            if queue.ready:
                queue.ready.popleft()  # the planted bug: drop one ready message
                break
        return new

    monkeypatch.setattr(fifo, "convert", lossy)
    report = dry_run(path, 2, every=4)
    assert not report.safe
    unsafe = [split for split in report.splits if split.status == "unsafe"]
    assert unsafe and all(not split.conserved for split in unsafe)
    assert unsafe[0].before["ready"] == unsafe[0].after["ready"] + 1


def test_an_error_reply_only_the_new_version_gives_is_unsafe(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "a.log"
    write_log(path)
    original = fifo.apply

    def refuses_enqueues_on_v2(meta: Meta, command: Any, state: Any) -> Any:
        if state.version == 2 and isinstance(command, Enqueue):
            return Error("unsupported", "planted"), []
        return original(meta, command, state)

    monkeypatch.setattr(fifo, "apply", refuses_enqueues_on_v2)
    report = dry_run(path, 2, every=8)
    assert not report.safe
    first = report.splits[0]
    assert first.status == "unsafe" and first.new_errors > 0 and first.conserved
    assert any("planted" in d["upgraded"] for d in first.new_error_examples)
    assert len(first.differences) <= 5


def test_an_exception_in_the_upgraded_machine_is_reported_not_raised(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "a.log"
    write_log(path, steps=60)
    original = fifo.apply

    def crashes_on_v2(meta: Meta, command: Any, state: Any) -> Any:
        if state.version == 2:
            raise RuntimeError("boom")
        return original(meta, command, state)

    monkeypatch.setattr(fifo, "apply", crashes_on_v2)
    report = dry_run(path, 2, every=5)
    assert not report.safe
    assert "boom" in report.splits[0].errors[0]


def test_a_replay_that_does_not_reproduce_the_exported_state_is_unsafe(tmp_path: Path) -> None:
    path = tmp_path / "a.log"
    write_log(path, steps=30)
    data = path.read_bytes()
    good = dry_run(path, 2)
    assert good.safe
    tampered = data.replace(good.baseline_digest.encode(), b"0" * 64)
    assert tampered != data
    path.write_bytes(tampered)
    report = dry_run(path, 2)
    assert not report.safe
    assert "does not reproduce" in report.baseline_errors[0]


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args), standalone_mode=False)
    if isinstance(result.exception, CliError):
        return result.exception.exit_code, result.output + str(result.exception)
    if result.exception is not None:
        raise result.exception
    return 0, result.output


def test_the_cli_exits_0_when_safe_and_1_when_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "a.log"
    write_log(path, steps=90)
    code, output = invoke("machine", "upgrade", "--dry-run", "--log", str(path), "--to", "2")
    assert code == 0 and "SAFE: upgrade to v2" in output
    code, output = invoke("-o", "json", "machine", "upgrade", "--dry-run", "--log", str(path))
    assert code == 0 and '"safe": true' in output
    monkeypatch.setattr(fifo, "convert", lambda *args: fifo.init_state(2))
    code, output = invoke("machine", "upgrade", "--dry-run", "--log", str(path), "--every", "3")
    assert code == 1 and "NOT safe" in output and "counters changed" in output


def test_the_cli_refuses_a_missing_or_malformed_log(tmp_path: Path) -> None:
    code, output = invoke("machine", "upgrade", "--dry-run", "--log", str(tmp_path / "none"))
    assert code == 66
    (tmp_path / "bad.log").write_bytes(b"\x01\x02garbage")
    code, output = invoke("machine", "upgrade", "--dry-run", "--log", str(tmp_path / "bad.log"))
    assert code == 65
    code, output = invoke("machine", "upgrade", "--dry-run")
    assert code == 64 and "--log" in output

"""Golden scenarios of the cluster metadata (`raft.metadata.apply_metadata`).

Each file in tests/raft/golden/metadata/ starts with comment lines and `members n1 n2 ...`, then
blocks: input lines, `----`, the output, a blank line. An input line is a change, a Python
expression over `Hello(node, version, incarnation)`, `Switch(index, version)`,
`Applied(command, reply)` (a fifo command applied with that reply), a membership change
`MemberChange(op, node, raft, members)` with `Member(id, raft, client)`, the fifo commands and
replies and `conn(node, number, incarnation)`;
or a query: `stale NODE INCARNATION`, `target`, `refusal VERSION`. The output gives each
change's reply (or the query's answer), then the metadata after the block.
QUORUMQ_REWRITE_GOLDEN=1 rewrites the files.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from fifo import commands, replies
from raft.membership import Member, MemberChange
from raft.metadata import (
    Hello,
    Metadata,
    Switch,
    apply_member_change,
    apply_metadata,
    stale_connection_downs,
    upgrade_refusal,
    upgrade_target,
)

GOLDEN_DIR = Path(__file__).parent / "golden" / "metadata"


def conn(node: str = "n1", number: int = 1, incarnation: int = 1) -> commands.ConnectionId:
    """A connection id; `conn()` is n1/1/1."""
    return commands.ConnectionId(node, incarnation, number)


def Applied(command: commands.Command, reply: replies.Reply) -> tuple[Any, ...]:
    """A fifo command applied with `reply` (the golden files' spelling of that change)."""
    return (command, reply)


NAMESPACE: dict[str, Any] = {n: getattr(commands, n) for n in dir(commands) if n[0].isupper()}
NAMESPACE.update({n: getattr(replies, n) for n in dir(replies) if n[0].isupper()})
NAMESPACE.update(Applied=Applied, Hello=Hello, Switch=Switch, conn=conn)
NAMESPACE.update(Member=Member, MemberChange=MemberChange)


def _step(meta: Metadata, line: str) -> str:
    word, *args = line.split()
    if word == "stale":
        downs = stale_connection_downs(meta, args[0], int(args[1]))
        return "stale: " + (", ".join(repr(d.connection) for d in downs) or "-")
    if word == "target":
        return f"target: {upgrade_target(meta)}"
    if word == "refusal":
        return f"refusal: {upgrade_refusal(meta, int(args[0]))}"
    change = eval(line, NAMESPACE)  # test input, ours
    if isinstance(change, MemberChange):
        return repr(apply_member_change(meta, change))
    if isinstance(change, tuple):
        return repr(apply_metadata(meta, *change))
    return repr(apply_metadata(meta, change))


def run_scenario(text: str) -> str:
    """The file with every block's output recomputed from a fresh Metadata."""
    out: list[str] = []
    meta: Metadata | None = None
    for block in text.strip("\n").split("\n\n"):
        lines = block.splitlines()
        inputs = [line for line in lines if not line.startswith("#")]
        if "----" in inputs:
            inputs = inputs[: inputs.index("----")]
        out.extend(line for line in lines if line.startswith("#"))
        if meta is None:
            header, *inputs = inputs
            out.append(header)
            meta = Metadata(members=sorted(header.split()[1:]))
        out.extend(inputs)
        out.append("----")
        out.extend(_step(meta, line) for line in inputs)
        out.append(json.dumps(meta.to_plain(), sort_keys=True))
        out.append("")
    return "\n".join(out)


@pytest.mark.parametrize("path", sorted(GOLDEN_DIR.glob("*.txt")), ids=lambda p: p.stem)
def test_metadata_scenario(path: Path) -> None:
    """The metadata changes exactly as the golden file says, block by block."""
    text = path.read_text()
    actual = run_scenario(text)
    if os.environ.get("QUORUMQ_REWRITE_GOLDEN") == "1":
        path.write_text(actual)
    assert actual == text


def test_there_are_metadata_scenarios() -> None:
    """The golden directory is not empty (a glob that matched nothing would pass silently)."""
    assert len(list(GOLDEN_DIR.glob("*.txt"))) >= 3


def test_plain_form_round_trips() -> None:
    """`from_plain(to_plain(m))` gives the same plain form (snapshots keep the metadata)."""
    meta = Metadata(members=["n1", "n2"])
    apply_metadata(meta, Hello("n1", 2, 7))
    enqueue = commands.Enqueue("q", b"x", connection=conn("n2", 3))
    apply_metadata(meta, enqueue, replies.Ok())
    apply_metadata(meta, commands.NodeDown("n2"))
    apply_metadata(meta, Switch(4, 2))
    assert Metadata.from_plain(meta.to_plain()).to_plain() == meta.to_plain()

"""Golden scenarios of the leader timers (`TimerPlan.due`) in virtual time.

Each file in tests/cluster/golden/timers/ holds blocks: input lines, `----`, the output, a blank
line. An input line is `T role key=value ...` at monotonic second T, where role is `leader` or
`follower` and the keys are `me=n1`, `up=n2,n3` (peers connected), `lost=n3` (peers not
connected), `down=n3` (replicated down nodes), `inc=n2:1,n3:2` (replicated incarnations),
`target=2` (upgrade target) and, last, `due=`
followed by a Python list of fifo commands (what `fifo.due_commands` returned). The output is
one line per input: `T: ` and what is proposed, or `-`. QUORUMQ_REWRITE_GOLDEN=1 rewrites them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from cluster.node.timers import DOWN_AFTER_S_DEFAULT, RESUBMIT_S_DEFAULT, TimerPlan, TimerView
from fifo import commands

GOLDEN_DIR = Path(__file__).parent / "golden" / "timers"
NAMESPACE: dict[str, Any] = {n: getattr(commands, n) for n in dir(commands) if n[0].isupper()}


def _names(value: str) -> list[str]:
    return [item for item in value.split(",") if item]


def parse_view(line: str) -> tuple[float, TimerView]:
    """One input line: its time and the view it describes."""
    head, _, due = line.partition(" due=")
    at, role, *pairs = head.split()
    fields = dict(pair.split("=", 1) for pair in pairs)
    connected = {peer: True for peer in _names(fields.get("up", ""))}
    connected.update({peer: False for peer in _names(fields.get("lost", ""))})
    target = fields.get("target")
    view = TimerView(
        leader=role == "leader",
        me=fields.get("me", "n1"),
        connected=dict(sorted(connected.items())),
        down_nodes=tuple(_names(fields.get("down", ""))),
        incarnations={
            node: int(number)
            for node, number in (item.split(":") for item in _names(fields.get("inc", "")))
        },
        due_commands=tuple(eval(due, NAMESPACE)) if due else (),  # test input, ours
        upgrade_target=int(target) if target else None,
    )
    return float(at), view


def run_scenario(text: str) -> str:
    """The file with every block's output recomputed by one TimerPlan."""
    plan = TimerPlan(DOWN_AFTER_S_DEFAULT, RESUBMIT_S_DEFAULT)
    out: list[str] = []
    for block in text.strip("\n").split("\n\n"):
        lines = block.splitlines()
        inputs = [line for line in lines if not line.startswith("#")]
        if "----" in inputs:
            inputs = inputs[: inputs.index("----")]
        out.extend(line for line in lines if line.startswith("#"))
        out.extend(inputs)
        out.append("----")
        for line in inputs:
            at, view = parse_view(line)
            proposed = plan.due(at, view)
            out.append(f"{at:g}: " + (", ".join(map(repr, proposed)) if proposed else "-"))
        out.append("")
    return "\n".join(out)


@pytest.mark.parametrize("path", sorted(GOLDEN_DIR.glob("*.txt")), ids=lambda p: p.stem)
def test_timer_scenario(path: Path) -> None:
    """The plan proposes exactly what the golden file says, step by step."""
    text = path.read_text()
    actual = run_scenario(text)
    if os.environ.get("QUORUMQ_REWRITE_GOLDEN") == "1":
        path.write_text(actual)
    assert actual == text


def test_there_are_timer_scenarios() -> None:
    """The golden directory is not empty (a glob that matched nothing would pass silently)."""
    assert len(list(GOLDEN_DIR.glob("*.txt"))) >= 4

"""Fault schedules: seeded, printable and parseable (so a shrunk one can be replayed).

A schedule is a list of `Fault(at, op, args)`; its text form is `at:op:arg/arg,...`, e.g.
`3.20:isolate:n2,5.00:crash:n1/power,7.10:heal:,8.00:restart:n1`. Ops:
- `isolate:N`      N cut off both ways (N = `leader`: whoever leads at that moment, as
                   Jepsen's partition-leader nemesis);
- `oneway:A/B`     messages from A to B lost (B still reaches A);
- `flaky:A/B`      A to B loses, duplicates and reorders messages (the connection stays up);
- `slow:A/B`       A to B delayed by SLOW_DELAY_S more, still in order (a congested TCP
                   connection: messages arrive across elections; only with `slow` schedules);
- `heal:`          every partition, flaky and slow link gone;
- `crash:N[/power[/lied][/garbage]]` N killed (with power: what it had not fsynced is lost
                   too, a seeded prefix of it survives, its last record usually torn; with
                   lied: its last fsync had lied, so what that one made stable is unsynced
                   too; with garbage: one byte of the surviving unsynced prefix flipped;
                   lied and garbage in `disk` schedules only);
- `restart:N`      N started again, a new incarnation on the same files.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

OPS = ("isolate", "oneway", "flaky", "slow", "heal", "crash", "restart")
GAP_S = (0.3, 3.0)
LEADER = "leader"  # a target resolved when the fault is applied


class FaultSyntaxError(ValueError):
    """A schedule's text form does not parse."""


@dataclass(frozen=True, slots=True)
class Fault:
    """One nemesis action at virtual time `at`."""

    at: float
    op: str
    args: tuple[str, ...] = ()

    def text(self) -> str:
        """`at:op:args` (the form `parse_faults` reads)."""
        return f"{self.at:.2f}:{self.op}:{'/'.join(self.args)}"


def encode_faults(faults: list[Fault]) -> str:
    """The schedule as one comma-separated string."""
    return ",".join(f.text() for f in faults)


def parse_faults(text: str) -> list[Fault]:
    """Read a schedule written by `encode_faults` (empty string: no faults)."""
    faults = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        pieces = item.split(":")
        if len(pieces) != 3 or pieces[1] not in OPS:
            raise FaultSyntaxError(f"bad fault {item!r}: expected at:op:args with op in {OPS}")
        try:
            at = float(pieces[0])
        except ValueError as err:
            raise FaultSyntaxError(f"bad time in fault {item!r}") from err
        faults.append(Fault(at, pieces[1], tuple(filter(None, pieces[2].split("/")))))
    return sorted(faults, key=lambda f: f.at)


def generate_faults(
    rng: random.Random,
    nodes: list[str],
    seconds: float,
    flaky: bool = True,
    slow: bool = False,
    disk: bool = False,
) -> list[Fault]:
    """A seeded schedule over `seconds` of virtual time (partitions, crashes, flaky links)."""
    faults: list[Fault] = []
    down: set[str] = set()
    at = rng.uniform(*GAP_S)
    while at < seconds:
        choices = ["isolate", "oneway", "heal", "heal", "crash"]
        if flaky:
            choices.append("flaky")
        if slow:
            choices += ["slow", "slow"]
        if down:
            choices += ["restart", "restart"]
        op = rng.choice(choices)
        up = [n for n in nodes if n not in down]
        if op in ("isolate",):
            faults.append(Fault(round(at, 2), op, (rng.choice([*nodes, LEADER]),)))
        elif op in ("oneway", "flaky", "slow"):
            a, b = rng.sample(nodes, 2)
            faults.append(Fault(round(at, 2), op, (a, b)))
        elif op == "heal":
            faults.append(Fault(round(at, 2), op))
        elif op == "crash" and len(up) > 1:
            node = rng.choice(up)
            down.add(node)
            power: tuple[str, ...] = ("power",) if rng.random() < 0.5 else ()
            if disk and power:
                power += tuple(f for f in ("lied", "garbage") if rng.random() < 0.5)
            faults.append(Fault(round(at, 2), op, (node, *power)))
        elif op == "restart":
            node = rng.choice(sorted(down))
            down.discard(node)
            faults.append(Fault(round(at, 2), op, (node,)))
        at += rng.uniform(*GAP_S)
    return faults

"""Interpreter of the golden scenario files (etcd-raft style) in tests/fifo/golden/.

A file starts with comment lines (`# ...`) and `version N`. Then blocks: input lines, a `----`
line, the output lines, a blank line. Each input line is a command expression (evaluated with
the classes of fifo.commands and the helpers `conn`, `cid` in scope), optionally prefixed by
`@T ` to set the clock to T ms, or a directive: `overview Q`, `consumers Q`, `messages Q N`,
`due T`, `deadline`, `convert` (to the next version at the current index and time), `queues`,
`groups Q` (v3), `cgroup G` (a v3 consumer group). `pub(Q, body, group)` is a v3 grouped
publish; `join(Q, G, member, number)` / `leave(Q, G, member, epoch, number)` join and leave a
v3 consumer group from connection n1/1/number.
Each command is applied at the next Raft index (starting at 1), shown as `[index]`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import fifo
from fifo import commands as c
from fifo import effects as e
from fifo.replies import Error

DIRECTIVES = ("overview", "consumers", "messages", "due", "deadline", "convert", "queues",
              "groups", "cgroup")


def conn(node: str = "n1", number: int = 1, incarnation: int = 1) -> c.ConnectionId:
    """A connection id; `conn()` is n1/1/1."""
    return c.ConnectionId(node, incarnation, number)


def cid(tag: str, connection: c.ConnectionId | None = None) -> c.ConsumerId:
    """A consumer id on `connection` (default n1/1/1)."""
    return c.ConsumerId(tag, connection or conn())


NAMESPACE: dict[str, Any] = {n: getattr(c, n) for n in dir(c) if not n.startswith("_")}
def pub(queue: str, body: bytes, group: str | None = None, **kw: Any) -> c.AnnotatedEnqueue:
    """v3: a publish to `group` (the `x-group-id` annotation; None: the default group)."""
    anns = () if group is None else (("x-group-id", group),)
    return c.AnnotatedEnqueue(queue, body, annotations=anns, **kw)


def join(queue: str, group: str, member: str, number: int = 1, prefetch: int = 5) -> c.JoinGroup:
    """v3: `member` joins consumer group `group` from connection n1/1/`number` (tag = member)."""
    consumer = cid(member, conn(number=number))
    return c.JoinGroup(queue, consumer, c.SimplePrefetch(prefetch), group=group, member=member)


def leave(queue: str, group: str, member: str, epoch: int, number: int = 1) -> c.LeaveGroup:
    """v3: `member` (epoch `epoch`) leaves consumer group `group`."""
    consumer = cid(member, conn(number=number))
    return c.LeaveGroup(queue, consumer, c.Cancel(), group=group, member=member, epoch=epoch)


NAMESPACE.update(conn=conn, cid=cid, pub=pub, join=join, leave=leave)


def fmt(value: Any) -> str:
    """Compact, stable rendering of replies, effects and query results."""
    if isinstance(value, c.ConnectionId):
        return f"{value.node}/{value.incarnation}/{value.number}"
    if isinstance(value, c.ConsumerId):
        return f"{value.tag}@{fmt(value.connection)}"
    if isinstance(value, e.Delivery):
        out = f"{value.msg_id}:{value.body!r}"
        out += " redelivered" if value.redelivered else ""
        out += f" dc={value.delivery_count}" if value.delivery_count else ""
        out += f" anns={fmt(value.annotations)}" if value.annotations else ""
        return out
    if isinstance(value, e.Deliver):
        msgs = ", ".join(fmt(m) for m in value.messages)
        return f"Deliver({value.tag}@{fmt(value.connection)} key={fmt(value.consumer_key)}: {msgs})"
    if isinstance(value, tuple):
        inner = ", ".join(fmt(v) for v in value)
        return f"({inner},)" if len(value) == 1 else f"({inner})"
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        parts = []
        for f in dataclasses.fields(value):
            v = getattr(value, f.name)
            if f.default is not dataclasses.MISSING and v == f.default:
                continue
            parts.append(f"{f.name}={fmt(v)}")
        return f"{type(value).__name__}({', '.join(parts)})"
    return repr(value)


class Runner:
    """Applies the lines of one scenario file and renders their output."""

    def __init__(self, version: int) -> None:
        self.state = fifo.init_state(version)
        self.index = 0
        self.time = 0
        self.problems: list[str] = []

    def meta(self) -> fifo.Meta:
        return fifo.Meta(self.index, 1, self.time, self.state.version)

    def run_line(self, line: str) -> list[str]:
        if line.startswith("@"):
            stamp, _, line = line.partition(" ")
            self.time = int(stamp[1:])
        word, _, rest = line.partition(" ")
        if word in DIRECTIVES:
            return self.directive(word, rest.split())
        command = eval(line, dict(NAMESPACE))  # test input written by us, not user data
        before = fifo.digest(self.state)
        self.index += 1
        reply, effects = fifo.apply(self.meta(), command, self.state)
        if isinstance(reply, Error) and fifo.digest(self.state) != before:
            self.problems.append(f"state changed on error reply: {line}")
        return [f"[{self.index}] {fmt(reply)}"] + [f"  {fmt(x)}" for x in effects]

    def directive(self, word: str, args: list[str]) -> list[str]:
        if word == "overview":
            ov = fifo.overview(self.state, args[0])
            if ov is None:
                return ["no such queue"]
            return [
                f"ready={ov.ready} returned={ov.returned} checked_out={ov.checked_out} "
                f"total={ov.total} bytes={ov.bytes} consumers={ov.consumers} "
                f"waiting={ov.waiting_consumers} active={fmt(ov.active_consumer)} "
                f"enqueuers={ov.enqueuers}"
            ]
        if word == "consumers":
            return [
                f"{fmt(i.key)} {i.tag} {i.status} credit={i.credit} {i.credit_mode} "
                f"prefetch={i.prefetch} prio={i.priority} out={i.num_checked_out} "
                f"dc={i.delivery_count} active={i.active}"
                for i in fifo.consumers(self.state, args[0])
            ] or ["none"]
        if word == "messages":
            msgs = fifo.messages(self.state, args[0], int(args[1]) if len(args) > 1 else 100)
            return [
                f"{m.position}: {m.body!r}{' returned' if m.returned else ''} dc={m.delivery_count}"
                + (f" expiry={m.expiry_ms}" if m.expiry_ms is not None else "")
                for m in msgs
            ] or ["none"]
        if word == "due":
            return [fmt(x) for x in fifo.due_commands(self.state, int(args[0]))] or ["none"]
        if word == "deadline":
            return [repr(fifo.next_deadline_ms(self.state))]
        if word == "queues":
            return [" ".join(fifo.list_queues(self.state)) or "none"]
        if word == "groups":
            return [
                f"{g.group!r} ready={g.ready} returned={g.returned} out={g.checked_out} "
                f"owner={fmt(g.owner)} age={g.oldest_age_ms}"
                for g in fifo.groups(self.state, args[0])
            ] or ["none"]
        if word == "cgroup":
            info = fifo.consumer_group(self.state, args[0])
            if info is None:
                return ["no such consumer group"]
            o = info.overview
            out = [f"epoch={o.epoch} members={o.members} pending={o.pending} "
                   f"last_rebalance={o.last_rebalance_index} moves={o.last_moves} "
                   f"reassigned={o.last_reassigned}"]  # fmt: skip
            out += [f"  {m.member} join={m.join_seq} epoch={m.epoch} {','.join(m.partitions)}"
                    for m in info.members]  # fmt: skip
            out += [f"  {p.partition} member={p.member} holder={p.holder} lag={p.lag} "
                    f"out={p.checked_out}" + (" pending" if p.pending else "")
                    for p in info.partitions]  # fmt: skip
            return out
        # convert
        version = self.state.version
        self.state = fifo.convert(self.state, version, version + 1, self.meta())
        return [f"version {self.state.version}"]


def run_file(text: str) -> tuple[str, list[str]]:
    """Run a scenario; returns the file text with regenerated outputs, and problems found."""
    lines = text.split("\n")
    out: list[str] = []
    i = 0
    runner: Runner | None = None
    while i < len(lines):
        line = lines[i]
        if runner is None and line.startswith("version "):
            runner = Runner(int(line.split()[1]))
            out.append(line)
            i += 1
            continue
        if not line.strip() or line.startswith("#"):
            out.append(line)
            i += 1
            continue
        assert runner is not None, "a scenario must start with `version N`"
        inputs = []
        while i < len(lines) and lines[i] != "----":
            inputs.append(lines[i])
            i += 1
        i += 1  # the ---- line
        while i < len(lines) and lines[i].strip():
            i += 1  # old output
        out.extend(inputs)
        out.append("----")
        for inp in inputs:
            out.extend(runner.run_line(inp))
    assert runner is not None
    problems = list(runner.problems)
    state = runner.state
    if fifo.digest(fifo.restore(fifo.snapshot(state))) != fifo.digest(state):
        problems.append("snapshot/restore changed the digest")
    return "\n".join(out), problems

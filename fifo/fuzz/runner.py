"""The seeded fuzz loop: generate, apply, check, and optionally upgrade and snapshot-check."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import fifo
from fifo.bodies import BodyMissingError, body_of_command, resolve_effects, resolve_reply
from fifo.commands import Command
from fifo.effects import Effect
from fifo.fuzz import probe
from fifo.fuzz.generator import Generator
from fifo.fuzz.invariants import Checker
from fifo.fuzz.prng import SplitMix64
from fifo.fuzz.violations import FuzzResult, Violation
from fifo.fuzz.world import World
from fifo.meta import Meta
from fifo.replies import Error, Reply
from fifo.state import State

ApplyFn = Callable[[Meta, Command, State], tuple[Reply, list[Effect]]]
UpgradeAt = int | Literal["random"] | None

DIGEST_SAMPLE_ONE_IN = 16  # digest is costly: check "Error leaves the state unchanged" on a sample
TIMER_SAMPLE_ONE_IN = 20  # the timer check works on a restored copy of the state
CODEC_SAMPLE_ONE_IN = 8
QUERY_SAMPLE_ONE_IN = 10
STALE_TIMER_CODES = ("unknown_consumer", "unknown_queue")
TIMER_ROUNDS_MAX = 4  # a timeout can return expired messages: Expire is due in the next round
VIOLATIONS_MAX = 20
# v1-v3 answer a handler that raised with this reply (their frozen catch-all): a crash all the same
REJECTED_PREFIX = "rejected:"
CRASHES = ("apply_raised", "apply_rejected")  # a run stops at the first one


def crashed(reply: Reply) -> bool:
    """Whether a reply is v1-v3's catch-all answer to a handler that raised."""
    return isinstance(reply, Error) and reply.message.startswith(REJECTED_PREFIX)


@dataclass(frozen=True, slots=True)
class Upgrade:
    """A log position where the effective machine version moved from 1 to 2."""

    meta: Meta


LogEntry = tuple[Meta, Command] | Upgrade


@dataclass
class Run:
    """The mutable state of one fuzz run."""

    seed: int
    state: State
    world: World
    version: int
    apply_fn: ApplyFn
    rng: SplitMix64
    now_ms: int = 1_000
    due: list[Command] = field(default_factory=list)
    log: list[LogEntry] = field(default_factory=list)
    checker: Checker = field(default_factory=Checker)
    violations: list[Violation] = field(default_factory=list)
    error_replies: int = 0
    counts: dict[str, int] = field(default_factory=dict)
    ignore: frozenset[str] = frozenset()


def reproduce_command(
    seed: int, steps: int, version: int, upgrade_index: int | None, snapshot_check: bool
) -> str:
    """The `quorumq fuzz` command line that replays this run exactly."""
    line = f"quorumq fuzz --seed {seed} --steps {steps} --machine-version {version}"
    if upgrade_index is not None:
        line += f" --upgrade-at {upgrade_index}"
    if snapshot_check:
        line += " --snapshot-check"
    return line + " -o json"


def resolve_upgrade(seed: int, steps: int, version: int, upgrade_at: UpgradeAt) -> int | None:
    """The entry index before which v1 is converted to v2 (None: no upgrade)."""
    if upgrade_at is None or version >= fifo.LATEST_VERSION or steps <= 0:
        return None
    if upgrade_at == "random":
        return SplitMix64(seed ^ 0x5EED_0F_F00D).below(steps)
    return max(0, min(int(upgrade_at), steps))


def advance_time(run: Run) -> None:
    """Virtual time: small steps, sometimes a jump so TTLs and consumer timeouts fire."""
    rng = run.rng
    if rng.chance(1, 500):
        run.now_ms += rng.between(60_000, 2_000_000)
    elif rng.chance(1, 60):
        run.now_ms += rng.between(500, 10_000)
    else:
        run.now_ms += rng.between(0, 20)


def next_command(run: Run, generator: Generator) -> tuple[Command, bool]:
    """A due timer command (as the leader would submit) or a generated one."""
    if not run.due and run.rng.chance(1, 4):
        run.due.extend(fifo.due_commands(run.state, run.now_ms))
    if run.due and run.rng.chance(3, 4):
        return run.due.pop(0), False
    return generator.next_command()


def step(run: Run, generator: Generator, index: int) -> None:
    """Apply one generated entry and record any violated invariant."""
    advance_time(run)
    command, bad_input = next_command(run, generator)
    meta = Meta(index + 1, 1, run.now_ms, run.version)
    run.log.append((meta, command))
    name = type(command).__name__
    run.counts[name] = run.counts.get(name, 0) + 1
    sample = bad_input or run.rng.chance(1, DIGEST_SAMPLE_ONE_IN)
    before = fifo.digest(run.state) if sample else None
    peek = run.checker.before(run.state, command)
    try:
        reply, effects = run.apply_fn(meta, command, run.state)
    except Exception as err:  # apply must never raise: report it as a violation
        run.violations.append(Violation(index, repr(command), "apply_raised", repr(err)))
        return
    if crashed(reply):  # a handler raised inside v1-v3's catch-all: as bad as an exception
        run.violations.append(Violation(index, repr(command), "apply_rejected", repr(reply)))
        return
    found = run.checker.after(run.state, command, reply, effects, peek)
    if isinstance(reply, Error):
        run.error_replies += 1
        if before is not None and fifo.digest(run.state) != before:
            found.append(("error_changed_state", f"{reply!r} but the digest changed"))
    elif bad_input:
        found.append(("bad_input_accepted", f"expected an Error reply, got {reply!r}"))
    run.world.observe(command, reply, effects)
    if run.rng.chance(1, TIMER_SAMPLE_ONE_IN):
        found += check_timers(run, index)
    if not bad_input and run.rng.chance(1, CODEC_SAMPLE_ONE_IN):
        # a command the machine refused as invalid may be mistyped (the world replays a bad
        # NodeDown's node in a NodeUp): the wire decoder refuses those, so only its reply counts
        refused = isinstance(reply, Error) and reply.code == "invalid_argument"
        found += check_codec([reply, *effects] if refused else [command, reply, *effects])
    if run.rng.chance(1, QUERY_SAMPLE_ONE_IN):
        found += check_queries(run.state)
    for invariant, detail in found:
        if invariant not in run.ignore:
            run.violations.append(Violation(index, repr(command), invariant, detail))


def check_timers(run: Run, index: int) -> list[tuple[str, str]]:
    """Timers converge: the leader submitting what is due, round after round, runs out of work.

    Also `next_deadline_ms` is not later than a deadline that is already due. Runs on a copy.
    """
    return check_timers_at(
        run.state, run.now_ms, Meta(index + 1, 1, run.now_ms, run.version), run.apply_fn
    )


def check_timers_at(
    state: State, now_ms: int, meta: Meta, apply_fn: ApplyFn
) -> list[tuple[str, str]]:
    """`check_timers` on an explicit state, time and meta (also used when shrinking)."""
    due = fifo.due_commands(state, now_ms)
    if not due:
        return []
    deadline = fifo.next_deadline_ms(state)
    found: list[tuple[str, str]] = []
    if deadline is None or deadline > now_ms:
        found.append(
            (
                "timer_deadline",
                f"{len(due)} commands due at {now_ms} but next_deadline_ms is {deadline}",
            )
        )
    copy = fifo.restore(fifo.snapshot(state))
    for _ in range(TIMER_ROUNDS_MAX):
        before = fifo.digest(copy)
        for command in due:
            reply, _ = apply_fn(meta, command, copy)
            # one scan can name a consumer twice (lock expiry and disconnected timeout); the
            # first command may remove it, so the second is stale: unknown_* is expected
            if isinstance(reply, Error) and reply.code not in STALE_TIMER_CODES:
                found.append(("timer_refused", f"due {command!r} got {reply!r}"))
        again = fifo.due_commands(copy, now_ms)
        if not again:
            return found
        if again == due and fifo.digest(copy) == before:
            found.append(("timers_converge", f"{due!r} stays due and changes nothing"))
            return found
        due = again
    found.append(("timers_converge", f"still due after {TIMER_ROUNDS_MAX} rounds: {due!r}"))
    return found


def check_queries(state: State) -> list[tuple[str, str]]:
    """The read-only queries (what `quorumq queue info` and `consumer list` show) agree with
    the state: overview counters, consumer list, message peek."""
    found: list[tuple[str, str]] = []
    for name in fifo.list_queues(state):
        queue = state.queues[name]
        view = fifo.overview(state, name)
        held = sum(len(c.checked_out) for c in (*queue.consumers.values(), *queue.waiting))
        ready, returned = len(queue.ready), len(queue.returns)
        for group in probe.groups(queue):
            ready += len(group.ready)
            returned += len(group.returns)
        want = (
            ready,
            returned,
            held,
            queue.messages_total,
            queue.bytes_ready,
            len(queue.consumers),
            len(queue.waiting),
        )
        got = (
            None
            if view is None
            else (
                view.ready,
                view.returned,
                view.checked_out,
                view.total,
                view.bytes,
                view.consumers,
                view.waiting_consumers,
            )
        )
        if got != want:
            found.append(("query_overview", f"{name}: overview {got}, state {want}"))
        listed = fifo.consumers(state, name)
        if len(listed) != len(queue.consumers) + len(queue.waiting):
            found.append(("query_consumers", f"{name}: {len(listed)} listed"))
        peeked = fifo.messages(state, name, 3)
        if len(peeked) != min(3, ready + returned):
            found.append(("query_messages", f"{name}: {len(peeked)} peeked"))
        found += check_group_queries(state, name)
    return found


def check_group_queries(state: State, name: str) -> list[tuple[str, str]]:
    """v3: `groups` lists every tracked group of a grouped queue with its counts."""
    queue = state.queues[name]
    rows = fifo.groups(state, name)
    tracked = list(probe.groups(queue))
    if len(rows) != min(len(tracked), 1000):
        return [("query_groups", f"{name}: {len(rows)} groups listed, {len(tracked)} tracked")]
    by_id = {g.gid: g for g in tracked}
    for row in rows:
        group = by_id.get(row.group)
        if group is None or (row.ready, row.returned, row.checked_out, row.owner) != (
                len(group.returns) + len(group.ready), len(group.returns), group.checked_out,
                group.owner):  # fmt: skip
            return [("query_groups", f"{name}: group {row.group!r} listed as {row}")]
    return []


def check_codec(objects: list[object]) -> list[tuple[str, str]]:
    """Commands, replies and effects survive the CBOR codec exactly (what raft and cluster send)."""
    for obj in objects:
        try:
            back = fifo.decode(fifo.encode(obj))
        except Exception as err:  # the codec must handle every well-formed object
            return [("codec_round_trip", f"{obj!r}: {type(err).__name__}: {err}")]
        if back != obj or type(back) is not type(obj):
            return [("codec_round_trip", f"{obj!r} came back as {back!r}")]
    return []


def upgrade(run: Run, index: int) -> None:
    """Convert the state to the next machine version before entry `index`."""
    meta = Meta(index + 1, 1, run.now_ms, fifo.LATEST_VERSION)
    run.state = fifo.convert(run.state, run.version, fifo.LATEST_VERSION, meta)
    run.version = fifo.LATEST_VERSION
    run.world.version = run.version
    run.log.append(Upgrade(meta))


def replay(state: State, entries: list[LogEntry], apply_fn: ApplyFn) -> State:
    """Apply log entries (commands and upgrades) to a state; returns the final state."""
    version = fifo.state_version(state)
    for entry in entries:
        if isinstance(entry, Upgrade):
            state = fifo.convert(state, version, entry.meta.machine_version, entry.meta)
            version = entry.meta.machine_version
        else:
            apply_fn(entry[0], entry[1], state)
    return state


def resolving(apply_fn: ApplyFn) -> ApplyFn:
    """`apply_fn` whose body references (machine v4) come back resolved from the bodies of the
    commands it applied, as a node resolves them from its journal; an unknown reference raises
    BodyMissingError (reported as `apply_raised`). Other versions' results pass unchanged."""
    bodies: dict[int, bytes] = {}

    def body_of(ref: int) -> bytes:
        body = bodies.get(ref)
        if body is None:
            raise BodyMissingError(ref, "no publish the fuzzer applied has that index")
        return body

    def apply(meta: Meta, command: Command, state: State) -> tuple[Reply, list[Effect]]:
        body = body_of_command(command)
        if body is not None and type(meta.index) is int:
            bodies[meta.index] = body
        reply, effects = apply_fn(meta, command, state)
        return resolve_reply(reply, body_of), resolve_effects(effects, body_of)

    return apply


def new_run(seed: int, machine_version: int, apply_fn: ApplyFn | None) -> tuple[Run, Generator]:
    """A fresh run and its generator, all choices derived from `seed`."""
    rng = SplitMix64(seed)
    world = World(machine_version)
    run = Run(
        seed,
        fifo.init_state(machine_version),
        world,
        machine_version,
        resolving(apply_fn or fifo.apply),
        rng.fork(1),
    )
    return run, Generator(rng.fork(2), world)


def run(
    seed: int,
    steps: int,
    machine_version: int,
    upgrade_at: UpgradeAt = None,
    snapshot_check: bool = False,
    apply_fn: ApplyFn | None = None,
    ignore: frozenset[str] = frozenset(),
) -> FuzzResult:
    """Run `steps` generated commands from `seed`, checking every invariant after each step.

    `ignore` names invariants not to report (a known, pinned machine bug) so a run goes on.
    """
    return run_with_log(seed, steps, machine_version, upgrade_at, snapshot_check, apply_fn, ignore)[
        1
    ]


def run_with_log(
    seed: int,
    steps: int,
    machine_version: int,
    upgrade_at: UpgradeAt = None,
    snapshot_check: bool = False,
    apply_fn: ApplyFn | None = None,
    ignore: frozenset[str] = frozenset(),
) -> tuple[list[LogEntry], FuzzResult]:
    """`run`, also returning the log it applied (commands and upgrade points), for shrinking."""
    fuzz, generator = new_run(seed, machine_version, apply_fn)
    fuzz.ignore = ignore
    upgrade_index = resolve_upgrade(seed, steps, machine_version, upgrade_at)
    snap_rng = SplitMix64(seed ^ 0x5A_9_5A07)
    snap_at = snap_rng.below(steps + 1) if snapshot_check else None
    snap: bytes | None = None
    snap_log_len = 0
    done = 0
    for index in range(steps):
        if index == snap_at:
            snap, snap_log_len = fifo.snapshot(fuzz.state), len(fuzz.log)
        if index == upgrade_index:
            upgrade(fuzz, index)
        step(fuzz, generator, index)
        done = index + 1
        if len(fuzz.violations) >= VIOLATIONS_MAX or any(
            v.invariant in CRASHES for v in fuzz.violations
        ):
            break
    if snap_at == steps:
        snap, snap_log_len = fifo.snapshot(fuzz.state), len(fuzz.log)
    final_digest = fifo.digest(fuzz.state)
    if snap is not None and not fuzz.violations:
        check_snapshot(fuzz, snap, snap_log_len, final_digest, snap_at or 0)
    return fuzz.log, result(
        fuzz, steps, done, machine_version, upgrade_index, final_digest, snapshot_check, snap_at
    )


def check_snapshot(fuzz: Run, snap: bytes, log_from: int, full: str, at: int) -> None:
    """Restore the snapshot, replay the rest of the log, and compare with the full run."""
    restored = fifo.restore(snap)
    replayed = fifo.digest(replay(restored, fuzz.log[log_from:], fuzz.apply_fn))
    if replayed != full:
        fuzz.violations.append(
            Violation(
                at, "snapshot", "snapshot_replay", f"replay from snapshot {replayed} != full {full}"
            )
        )


def result(
    fuzz: Run,
    steps: int,
    done: int,
    version: int,
    upgrade_index: int | None,
    digest: str,
    snapshot_check: bool,
    snap_at: int | None,
) -> FuzzResult:
    """Summarise a finished run."""
    ready = total = 0
    for name in fifo.list_queues(fuzz.state):
        overview = fifo.overview(fuzz.state, name)
        if overview is not None:
            ready += overview.ready + overview.returned  # everything waiting for a consumer
            total += overview.total
    return FuzzResult(
        seed=fuzz.seed,
        steps=steps,
        initial_machine_version=version,
        final_machine_version=fuzz.version,
        upgrade_index=upgrade_index,
        digest=digest,
        violations=fuzz.violations,
        ready=ready,
        total=total,
        reproduce=reproduce_command(fuzz.seed, steps, version, upgrade_index, snapshot_check),
        steps_run=done,
        error_replies=fuzz.error_replies,
        deliveries=fuzz.checker.deliveries,
        snapshot_index=snap_at,
        command_counts=dict(sorted(fuzz.counts.items())),
    )


def generate_log(seed: int, steps: int, machine_version: int) -> list[tuple[Meta, Command]]:
    """The log `run(seed, steps, machine_version)` applies (no upgrade), for equivalence tests."""
    fuzz, generator = new_run(seed, machine_version, None)
    for index in range(steps):
        step(fuzz, generator, index)
    return [entry for entry in fuzz.log if not isinstance(entry, Upgrade)]

"""The seeded fuzzer: clean runs on both versions, determinism, upgrades, and planted bugs found."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

import fifo
import fifo.fuzz
from fifo.commands import Command, Settle
from fifo.effects import Effect
from fifo.fuzz.prng import SplitMix64
from fifo.meta import Meta
from fifo.replies import Error, Ok, Reply
from fifo.state import State
from tests.fifo.model import fifo_settings

STEPS = 400
# Known machine bugs, pinned in test_properties_regressions.py; drop an entry when it is fixed.
KNOWN_UPGRADE_BUGS: frozenset[str] = frozenset()  # was {"sac_priority"} until 1bc3932


def describe(result: fifo.fuzz.FuzzResult) -> str:
    return "\n".join(f"{v.step} {v.invariant}: {v.detail} <- {v.command}"
                     for v in result.violations[:5]) + f"\n{result.reproduce}"


@fifo_settings(50)
@given(seed=st.integers(0, 2**32 - 1), version=st.sampled_from(fifo.SUPPORTED_VERSIONS))
def test_random_seeds_hold_every_invariant(seed: int, version: int) -> None:
    """Any seed on any version runs without an invariant violation."""
    result = fifo.fuzz.run(seed, STEPS, version, snapshot_check=True)
    assert result.violations == [], describe(result)
    assert result.steps_run == STEPS


@fifo_settings(30)
@given(seed=st.integers(0, 2**32 - 1))
def test_random_upgrade_point_holds_every_invariant(seed: int) -> None:
    """A v1 run converted to v2 at a seeded random entry keeps every invariant and ends on v2."""
    result = fifo.fuzz.run(seed, STEPS, 1, upgrade_at="random", snapshot_check=True,
                           ignore=KNOWN_UPGRADE_BUGS)
    assert result.violations == [], describe(result)
    assert result.final_machine_version == fifo.LATEST_VERSION
    assert result.upgrade_index is not None and 0 <= result.upgrade_index < STEPS


def test_generated_logs_exercise_the_whole_command_set() -> None:
    """A long v2 run uses every command kind and really delivers and settles messages."""
    result = fifo.fuzz.run(13, 3000, 2)
    assert result.violations == [], describe(result)
    expected = {"DeclareQueue", "DeleteQueue", "UpdateConfig", "Enqueue", "RegisterEnqueuer",
                "Checkout", "Settle", "Return", "Discard", "Modify", "Credit", "RenewLocks",
                "Purge", "ConnectionDown", "NodeDown", "NodeUp"}
    assert expected <= set(result.command_counts), sorted(result.command_counts)
    assert result.deliveries > 300 and result.command_counts["Settle"] > 200
    assert result.error_replies > 0  # bad input is part of the mix


def test_timers_fire_through_due_commands() -> None:
    """Advancing virtual time makes the leader-side timer commands part of the log."""
    seen: set[str] = set()
    for seed in range(4):
        seen |= set(fifo.fuzz.run(seed, 3000, 2).command_counts)
    assert {"Expire", "EvalConsumerTimeouts", "ConsumerDisconnectedTimeout"} & seen, seen


def test_same_seed_same_result() -> None:
    """A seed fully determines the run: same digest, same counts."""
    first = fifo.fuzz.run(5, 800, 2)
    second = fifo.fuzz.run(5, 800, 2)
    assert (first.digest, first.command_counts) == (second.digest, second.command_counts)
    assert fifo.fuzz.run(6, 800, 2).digest != first.digest


def test_reproduce_line_names_the_run() -> None:
    """The result carries the exact command line that replays it."""
    result = fifo.fuzz.run(3, 50, 1, upgrade_at=20)
    assert result.upgrade_index == 20
    assert result.reproduce == ("quorumq fuzz --seed 3 --steps 50 --machine-version 1 "
                                "--upgrade-at 20 -o json")


def test_generate_log_is_the_run_log() -> None:
    """generate_log returns the entries run applies, replayable to the same digest."""
    log = fifo.fuzz.generate_log(9, 300, 2)
    assert len(log) == 300 and [m.index for m, _ in log] == list(range(1, 301))
    state = fifo.init_state(2)
    for meta, command in log:
        fifo.apply(meta, command, state)
    assert fifo.digest(state) == fifo.fuzz.run(9, 300, 2).digest


def test_prng_is_splitmix64() -> None:
    """The PRNG matches the published splitmix64 stream (seed 0) and is uniform enough."""
    rng = SplitMix64(0)
    assert [rng.next_u64() for _ in range(2)] == [0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4]
    draws = [SplitMix64(s).below(6) for s in range(600)]
    assert all(60 <= draws.count(k) <= 140 for k in range(6))


# --- planted bugs: the fuzzer must notice ----------------------------------------------------


def settle_leaks_messages(meta: Meta, command: Command, state: State) -> tuple[Reply, list[Effect]]:
    """A broken machine: settles answer ok and do nothing."""
    if isinstance(command, Settle):
        return Ok(), []
    return fifo.apply(meta, command, state)


def settle_forgets_total(meta: Meta, command: Command, state: State) -> tuple[Reply, list[Effect]]:
    """A broken machine: a settle also drops the queue's total counter by one more."""
    reply, effects = fifo.apply(meta, command, state)
    queue = state.queues.get(getattr(command, "queue", ""))
    if isinstance(command, Settle) and isinstance(reply, Ok) and queue is not None:
        queue.messages_total -= 1
    return reply, effects


def test_planted_settle_bug_is_reported_with_a_reproducer() -> None:
    """A machine whose settles do nothing breaks the accounting invariant."""
    result = fifo.fuzz.run(1, 600, 2, apply_fn=settle_leaks_messages)
    assert {v.invariant for v in result.violations} & {"accounting", "credit_bounds"}
    assert result.reproduce.startswith("quorumq fuzz --seed 1 --steps 600")


def test_planted_counter_bug_breaks_messages_total() -> None:
    """A machine that miscounts its total breaks the messages-total invariant at once."""
    result = fifo.fuzz.run(2, 600, 1, apply_fn=settle_forgets_total)
    assert "messages_total" in {v.invariant for v in result.violations}


def settle_partly_then_refuse(
    meta: Meta, command: Command, state: State
) -> tuple[Reply, list[Effect]]:
    """A broken machine: a settle with a bad id settles the good ids, then answers Error."""
    ids = getattr(command, "msg_ids", ())
    if isinstance(command, Settle) and not all(type(i) is int for i in ids):
        good = tuple(i for i in ids if type(i) is int)
        fifo.apply(meta, Settle(command.queue, command.consumer_key, good), state)
        return Error("invalid_argument", "planted"), []
    return fifo.apply(meta, command, state)


def accept_anything(meta: Meta, command: Command, state: State) -> tuple[Reply, list[Effect]]:
    """A broken machine: junk that is not a command is answered Ok."""
    if not hasattr(command, "__dataclass_fields__"):
        return Ok(), []
    return fifo.apply(meta, command, state)


def test_planted_partial_mutation_on_error_is_caught() -> None:
    """An Error reply that changed the state is reported (bad input is always digest-checked)."""
    found = set()
    for seed in range(6):
        result = fifo.fuzz.run(seed, 3000, 2, apply_fn=settle_partly_then_refuse)
        found |= {v.invariant for v in result.violations}
    assert "error_changed_state" in found


def test_planted_junk_acceptance_is_caught() -> None:
    """A machine that answers Ok to junk input is reported."""
    result = fifo.fuzz.run(4, 3000, 1, apply_fn=accept_anything)
    assert "bad_input_accepted" in {v.invariant for v in result.violations}


def purge_raises(meta: Meta, command: Command, state: State) -> tuple[Reply, list[Effect]]:
    """A broken machine: Purge raises (an exception inside apply wedges a pysyncobj node)."""
    if type(command).__name__ == "Purge":
        raise RuntimeError("planted")
    return fifo.apply(meta, command, state)


def test_an_exception_out_of_apply_stops_the_run_with_a_violation() -> None:
    """apply must never raise: the run reports apply_raised at that step and stops there."""
    result = fifo.fuzz.run(3, 2000, 2, apply_fn=purge_raises)
    assert [v.invariant for v in result.violations] == ["apply_raised"]
    assert "Purge" in result.violations[0].command
    assert result.steps_run == result.violations[0].step + 1 < 2000


def test_shrink_finds_a_minimal_log_for_a_planted_bug() -> None:
    """ddmin cuts a failing run down to the few entries that still break the invariant."""
    shrunk = fifo.fuzz.shrink(0, 3000, 1, apply_fn=settle_forgets_total)
    assert shrunk is not None and shrunk.reproducible
    assert shrunk.invariant == "messages_total"
    assert len(shrunk.entries) <= 5 < shrunk.original_length
    assert "Settle(" in shrunk.lines()[-1]


def test_shrink_of_an_exception_is_the_one_command() -> None:
    """A crash in apply shrinks to the single command that raises."""
    shrunk = fifo.fuzz.shrink(0, 3000, 2, apply_fn=purge_raises)
    assert shrunk is not None and shrunk.invariant == "apply_raised"
    assert len(shrunk.entries) == 1 and "Purge(" in shrunk.lines()[0]


def test_shrink_of_a_clean_run_is_none() -> None:
    """Nothing to shrink when the machine holds every invariant."""
    assert fifo.fuzz.shrink(0, 300, 2) is None

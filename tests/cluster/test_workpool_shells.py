"""The work pool's thread and asyncio shells: per-key order, no two items of a key at once, real
parallelism across keys, no idle worker while a key has work, back-pressure, errors, stopping.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator

import pytest

from cluster.client.workpool import OrderedWorkPool, PoolClosed
from cluster.client.workpool_aio import AsyncOrderedWorkPool

Item = tuple[str, int]  # (key, sequence number)


def by_key(item: Item) -> str:
    return item[0]


class Recorder:
    """What the handlers saw: per-key run order, and the most items of one key at once."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.running: dict[str, int] = defaultdict(int)
        self.most_at_once_per_key = 0
        self.most_at_once = 0
        self.order: dict[str, list[int]] = defaultdict(list)
        self.events: list[tuple[str, Item]] = []

    def begin(self, item: Item) -> None:
        with self.lock:
            self.running[item[0]] += 1
            self.most_at_once_per_key = max(self.most_at_once_per_key, self.running[item[0]])
            self.most_at_once = max(self.most_at_once, sum(self.running.values()))
            self.order[item[0]].append(item[1])
            self.events.append(("begin", item))

    def end(self, item: Item) -> None:
        with self.lock:
            self.running[item[0]] -= 1
            self.events.append(("end", item))

    def done(self, item: Item, error: BaseException | None) -> None:
        with self.lock:
            self.events.append(("done", item))


def items(keys: int, per_key: int, seed: int = 7) -> list[Item]:
    """`per_key` items for each of `keys` keys, interleaved in a shuffled submission order."""
    made = [(f"k{n % keys}", n) for n in range(keys * per_key)]
    random.Random(seed).shuffle(made)
    return made


def expected_order(submitted: list[Item]) -> dict[str, list[int]]:
    order: dict[str, list[int]] = defaultdict(list)
    for key, number in submitted:
        order[key].append(number)
    return order


def assert_done_before_next_begins(events: list[tuple[str, Item]]) -> None:
    """Per key: begin, end, done, begin, end, done, ... (on_done precedes the next item)."""
    per_key: dict[str, list[str]] = defaultdict(list)
    for what, item in events:
        per_key[item[0]].append(what)
    for key, seen in per_key.items():
        cycles = len(seen) // 3
        assert seen == ["begin", "end", "done"] * cycles, f"{key}: {seen}"


# --- the thread pool ---------------------------------------------------------------------------


@contextlib.contextmanager
def _ended(pool: OrderedWorkPool[Item], release: threading.Event) -> Iterator[None]:
    """Whatever happens in the block, release the blocked handlers and end the pool's threads
    (a test that failed half-way left its idle workers behind; the thread guard names any
    still running)."""
    try:
        yield
    finally:
        release.set()
        pool.stop()
        pool.join(10)


def test_threads_keep_per_key_order_and_never_run_a_key_twice_at_once() -> None:
    """200 keys, 2,000 items, random short work on 8 threads: every key in submission order."""
    recorder = Recorder()
    rng = random.Random(1)
    pauses = [rng.random() / 2000 for _ in range(64)]

    def handle(item: Item) -> None:
        recorder.begin(item)
        time.sleep(pauses[item[1] % 64])
        recorder.end(item)

    submitted = items(keys=200, per_key=10)
    with OrderedWorkPool(handle, workers=8, key=by_key, on_done=recorder.done) as pool:
        for item in submitted:
            pool.submit(item)
    assert recorder.order == expected_order(submitted)
    assert recorder.most_at_once_per_key == 1
    assert recorder.most_at_once > 1  # it did run in parallel
    assert pool.completed == len(submitted) and pool.failed == 0
    assert_done_before_next_begins(recorder.events)


def test_threads_run_distinct_keys_truly_at_once() -> None:
    """Four keys on four threads: a 4-party barrier inside the handler is only passed if four
    items run at the same moment."""
    barrier = threading.Barrier(4, timeout=10)
    passed: list[int] = []

    def handle(item: Item) -> None:
        barrier.wait()
        passed.append(item[1])

    with OrderedWorkPool(handle, workers=4, key=by_key) as pool:
        for number in range(8):
            pool.submit((f"k{number % 4}", number))
    assert sorted(passed) == list(range(8)) and pool.failed == 0


def test_threads_a_free_worker_does_not_idle_while_another_key_has_work() -> None:
    """A key blocked in its handler holds one worker and its own later items; the other worker
    runs every other key's work meanwhile."""
    release = threading.Event()
    finished: list[Item] = []

    def handle(item: Item) -> None:
        if item == ("slow", 0):
            assert release.wait(10)
        finished.append(item)

    with OrderedWorkPool(handle, workers=2, key=by_key) as pool:
        pool.submit(("slow", 0))
        pool.submit(("slow", 1))
        others = [(f"k{n}", n) for n in range(20)]
        for item in others:
            pool.submit(item)
        deadline = time.monotonic() + 10
        while len(finished) < len(others) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert sorted(finished) == sorted(others)  # "slow" 1 waits behind "slow" 0
        release.set()
    assert finished[-2:] == [("slow", 0), ("slow", 1)]


def test_threads_a_failing_item_is_reported_and_its_key_goes_on() -> None:
    """The handler's exception reaches on_done; the key's next item still runs."""
    outcomes: list[tuple[Item, str | None]] = []

    def handle(item: Item) -> None:
        if item[1] == 1:
            raise ValueError("boom")

    def done(item: Item, error: BaseException | None) -> None:
        outcomes.append((item, None if error is None else str(error)))

    with OrderedWorkPool(handle, workers=3, key=by_key, on_done=done) as pool:
        for number in range(4):
            pool.submit(("a", number))
    assert outcomes == [(("a", 0), None), (("a", 1), "boom"), (("a", 2), None), (("a", 3), None)]
    assert (pool.completed, pool.failed) == (4, 1)


def test_threads_submit_waits_when_a_keys_backlog_is_full() -> None:
    """backlog=2: with its item running and two waiting, a key takes no more until one starts;
    other keys are not held up."""
    release = threading.Event()

    def handle(item: Item) -> None:
        if item[0] == "a":
            assert release.wait(10)

    pool = OrderedWorkPool(handle, workers=2, key=by_key, backlog=2)
    with _ended(pool, release):
        assert pool.submit(("a", 0))
        deadline = time.monotonic() + 5
        while pool.busy() == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert pool.submit(("a", 1)) and pool.submit(("a", 2))
        assert pool.submit(("a", 3), timeout_s=0.2) is False  # full: back-pressure
        assert pool.submit(("b", 0), timeout_s=1.0) is True
        release.set()
        assert pool.submit(("a", 3), timeout_s=5.0) is True
        pool.close()
        assert pool.join(10) and pool.completed == 5


def test_threads_stop_returns_what_did_not_start_in_submission_order() -> None:
    """stop: running items finish, the rest come back in the order they were submitted, and
    nothing is submitted after."""
    release = threading.Event()
    started = threading.Event()
    ran: list[Item] = []

    def handle(item: Item) -> None:
        started.set()
        assert release.wait(10)
        ran.append(item)

    pool = OrderedWorkPool(handle, workers=1, key=by_key)
    submitted = [("a", 0), ("b", 1), ("a", 2), ("c", 3), ("b", 4)]
    with _ended(pool, release):
        for item in submitted:
            pool.submit(item)
        assert started.wait(5)
        unstarted = pool.stop()
        release.set()
        assert pool.join(10)
    assert ran == [("a", 0)] and unstarted == submitted[1:]
    with pytest.raises(PoolClosed):
        pool.submit(("a", 9))


def test_the_default_key_is_the_group_and_no_group_is_one_key() -> None:
    """Without `key`, items are keyed by their `group`; items without a group share one key."""

    class Grouped:
        def __init__(self, group: str | None, number: int) -> None:
            self.group, self.number = group, number

    recorder = Recorder()

    def handle(item: Grouped) -> None:
        recorder.begin((str(item.group), item.number))
        time.sleep(0.001)
        recorder.end((str(item.group), item.number))

    submitted = [Grouped(group, n) for n in range(30) for group in ("g1", "g2", None)]
    with OrderedWorkPool(handle, workers=6) as pool:
        for entry in submitted:
            pool.submit(entry)
    assert recorder.most_at_once_per_key == 1
    assert recorder.order["None"] == list(range(30)) and recorder.order["g1"] == list(range(30))


# --- the asyncio pool --------------------------------------------------------------------------


def run(main: Callable[[], object]) -> None:
    async def wrapper() -> None:
        result = main()
        assert asyncio.iscoroutine(result)
        await asyncio.wait_for(result, 30)

    asyncio.run(wrapper())


def test_asyncio_keeps_per_key_order_and_never_runs_a_key_twice_at_once() -> None:
    """200 keys, 2,000 items on 8 tasks: every key in submission order, one item at a time."""
    recorder = Recorder()
    submitted = items(keys=200, per_key=10)

    async def handle(item: Item) -> None:
        recorder.begin(item)
        await asyncio.sleep((item[1] % 5) / 5000)
        recorder.end(item)

    async def done(item: Item, error: BaseException | None) -> None:
        recorder.done(item, error)

    async def main() -> None:
        async with AsyncOrderedWorkPool(handle, workers=8, key=by_key, on_done=done) as pool:
            for item in submitted:
                await pool.submit(item)
        assert pool.completed == len(submitted)

    run(main)
    assert recorder.order == expected_order(submitted)
    assert recorder.most_at_once_per_key == 1 and recorder.most_at_once > 1
    assert_done_before_next_begins(recorder.events)


def test_asyncio_runs_distinct_keys_at_once() -> None:
    """Four keys on four tasks pass a 4-party asyncio barrier."""

    async def main() -> None:
        barrier = asyncio.Barrier(4)

        async def handle(item: Item) -> None:
            await asyncio.wait_for(barrier.wait(), 10)

        async with AsyncOrderedWorkPool(handle, workers=4, key=by_key) as pool:
            for number in range(8):
                await pool.submit((f"k{number % 4}", number))
        assert (pool.completed, pool.failed) == (8, 0)

    run(main)


def test_asyncio_backlog_errors_and_stop() -> None:
    """A full key makes submit wait; a failing item reaches on_done and its key goes on; stop
    hands back the unstarted items in order."""

    async def main() -> None:
        release = asyncio.Event()
        outcomes: list[tuple[Item, bool]] = []

        async def handle(item: Item) -> None:
            if item[0] == "a":
                await release.wait()
            if item[1] == 1:
                raise ValueError("boom")

        async def done(item: Item, error: BaseException | None) -> None:
            outcomes.append((item, error is None))

        pool = AsyncOrderedWorkPool(handle, workers=2, key=by_key, backlog=2, on_done=done)
        for item in [("a", 0), ("a", 1), ("a", 2)]:
            await pool.submit(item)
        await asyncio.sleep(0.05)
        blocked = asyncio.ensure_future(pool.submit(("a", 3)))
        await asyncio.sleep(0.1)
        assert not blocked.done()  # back-pressure: "a" has two waiting
        await pool.submit(("b", 9))
        release.set()
        await asyncio.wait_for(blocked, 5)
        await asyncio.sleep(0.1)
        assert [item for item, _ in outcomes if item[0] == "a"] == [("a", n) for n in range(4)]
        assert [ok for item, ok in outcomes if item == ("a", 1)] == [False]
        release.clear()
        for item in [("a", 10), ("a", 11), ("c", 12)]:
            await pool.submit(item)
        await asyncio.sleep(0.05)
        assert pool.stop() == [("a", 11)]  # "a" 10 and "c" 12 are running
        release.set()
        assert await pool.join(5)
        with pytest.raises(PoolClosed):
            await pool.submit(("a", 13))

    run(main)

"""Celery on quorumq: a real worker process, SIGKILLed in the middle of 1,000 late-acked tasks.

A 3-node cluster, a `celery -A celery_app worker` (prefork, 4 processes, task_acks_late,
worker_prefetch_multiplier=1) and results over Celery's RPC backend (also on quorumq). Once a
third of the tasks ran, the worker's whole process group gets SIGKILL; the messages it had
checked out must come back (its connection went down), and a second worker must finish the
rest: every task ran at least once and every result arrives, with the right value.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("celery")

from cluster.client import Client
from cluster.launcher import LocalCluster, start_cluster, wait_until
from fifo.queries import ConsumerInfo
from tests.must import must

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.timeout(120)]

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
TASKS = 1000
KILL_AFTER = 300  # task runs recorded before the first worker is killed
SENDERS = 4  # publishing is confirmed (one round trip each): send from a few threads


@pytest.fixture
def cluster3(tmp_path: Path) -> Iterator[LocalCluster]:
    cluster = start_cluster(tmp_path / "D", nodes=3)
    try:
        yield cluster
    finally:
        cluster.stop()


def _ran(path: Path) -> list[tuple[int, int]]:
    if not path.exists():
        return []
    rows = []
    for line in path.read_text(encoding="ascii").splitlines():
        pid, number = line.split()
        rows.append((int(pid), int(number)))
    return rows


def _worker(tmp_path: Path, env: dict[str, str], name: str) -> subprocess.Popen[bytes]:
    log = (tmp_path / f"{name}.log").open("wb")
    command = [sys.executable, "-m", "celery", "-A", "celery_app", "worker"]
    command += ["--pool", "prefork", "--concurrency", "4", "--loglevel", "info"]
    command += ["--hostname", f"{name}@%h", "--without-gossip", "--without-mingle"]
    process = subprocess.Popen(
        command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=HERE
    )
    log.close()
    return process


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)  # the worker and its pool processes
    process.wait(10)


def _close_connections(app: Any) -> None:
    """Close the broker connections the app opened in this process (its pool, its RPC result
    consumer's): each is a quorumq client with threads, which would otherwise outlive the test
    and reconnect to the stopped cluster for the rest of the run (`app.close()` only forgets
    the pool)."""
    result_consumer = app.backend.result_consumer
    if result_consumer._connection is not None:
        result_consumer.stop()
    app.amqp.producer_pool.force_close_all()
    app.pool.force_close_all()


def test_celery_worker_killed_mid_run_loses_no_task(
    cluster3: LocalCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data_dir = cluster3.data_dir
    endpoints = ",".join(node.client_address for node in cluster3.config.nodes)
    broker = f"quorumq://{endpoints}/?credentials={data_dir / 'client.key'}"
    ran_path = tmp_path / "ran.log"
    monkeypatch.setenv("QQ_BROKER", broker)
    monkeypatch.setenv("QQ_RAN", str(ran_path))
    monkeypatch.syspath_prepend(str(HERE))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), str(ROOT)])}
    sys.modules.pop("celery_app", None)
    import celery_app  # type: ignore[import-not-found]  # by name from HERE, as the worker does

    app = celery_app.app
    workers = [_worker(tmp_path, env, "w1")]
    senders: list[threading.Thread] = []
    try:
        reply_to = app.thread_oid  # results of every sender thread come to this thread
        task_ids: list[str] = [""] * TASKS
        errors: list[BaseException] = []

        def send(start: int) -> None:
            try:
                for number in range(start, TASKS, SENDERS):
                    sent = celery_app.double.apply_async((number,), reply_to=reply_to)
                    task_ids[number] = sent.id
            except BaseException as err:  # reported by the main thread
                errors.append(err)

        senders += [threading.Thread(target=send, args=(i,)) for i in range(SENDERS)]
        for sender in senders:
            sender.start()
        with Client(endpoints.split(","), cluster3.key) as client:
            # the worker's credit is its prefetch: concurrency 4 x multiplier 1
            def attached() -> list[ConsumerInfo]:
                found = client.consumers("celery").get("celery", [])
                return [c for c in found if c.status == "up"]

            (consumer,) = wait_until(attached, 30, "the worker's consumer")
            assert consumer.prefetch == 4, consumer
            assert consumer.num_checked_out <= 4, consumer
        wait_until(lambda: len(_ran(ran_path)) >= KILL_AFTER, 45, f"{KILL_AFTER} task runs")
        _kill_group(workers[0])
        killed_pids = {pid for pid, _ in _ran(ran_path)}

        # the dead worker's connection is down: what it had checked out is back in the queue
        with Client(endpoints.split(","), cluster3.key) as client:
            overview = wait_until(
                lambda: o if (o := must(client.overview("celery"))).checked_out == 0 else None,
                15,
                "the dead worker's messages returned",
            )
        assert overview.consumers == 0
        assert overview.returned >= 1, overview

        workers.append(_worker(tmp_path, env, "w2"))
        for sender in senders:
            sender.join(60)
        assert not errors, errors
        # results are read by this thread's RPC backend (the one consuming `reply_to`)
        values = [app.AsyncResult(task_id).get(timeout=60) for task_id in task_ids]
        assert values == [2 * number for number in range(TASKS)]
    finally:
        for worker in workers:
            _kill_group(worker)
        for sender in senders:  # a failed test must not leave them publishing (1,000 tasks)
            sender.join(60)
        _close_connections(app)

    ran = _ran(ran_path)
    numbers = {number for _, number in ran}
    assert numbers == set(range(TASKS)), f"never ran: {sorted(set(range(TASKS)) - numbers)[:20]}"
    survivors = {pid for pid, _ in ran} - killed_pids
    assert survivors, "the second worker ran nothing"
    by_second = sum(1 for pid, _ in ran if pid in survivors)
    assert by_second >= TASKS - len({n for pid, n in ran if pid in killed_pids})
    twice = len(ran) - len(numbers)
    print(
        f"runs {len(ran)}, by the second worker {by_second}, run twice {twice}, "
        f"returned at the kill {overview.returned}"
    )

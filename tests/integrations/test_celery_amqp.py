"""Celery over `amqp://` (py-amqp, Celery's default broker transport) against quorumq's AMQP
listener on a real 3-node cluster at machine v4 (issue 27, acceptance 2).

A `celery -A celery_amqp_app worker -E` (prefork, 4 processes, task_acks_late, prefetch
multiplier 1) runs 1,000 tasks sent with publisher confirms through Celery's direct `celery`
exchange; once a third ran, its whole process group gets SIGKILL; a second worker finishes the
rest: every task ran and every result arrives (Celery's RPC backend). `celery inspect ping`
(the fanout `celery.pidbox` and a reply queue on the direct `reply.celery.pidbox`) answers, and
Celery's own event receiver, bound to the topic `celeryev` with `#`, sees the tasks succeed.
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
from cluster.launcher import wait_until
from fifo.queries import QueueOverview
from tests.amqp.conftest import AmqpCluster, start_at_v4
from tests.must import must

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.timeout(180)]

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
TASKS = 1000
KILL_AFTER = 300  # task runs recorded before the first worker is killed
SENDERS = 4  # publishing is confirmed (one round trip each): send from a few threads


@pytest.fixture
def v4_cluster(tmp_path: Path) -> Iterator[AmqpCluster]:
    started = start_at_v4(tmp_path / "D")
    try:
        yield started
    finally:
        started.cluster.stop()


def _ran(path: Path) -> list[tuple[int, int]]:
    if not path.exists():
        return []
    rows = []
    for line in path.read_text(encoding="ascii").splitlines():
        pid, number = line.split()
        rows.append((int(pid), int(number)))
    return rows


def _celery(tmp_path: Path, env: dict[str, str], name: str, *args: str) -> subprocess.Popen[bytes]:
    log = (tmp_path / f"{name}.log").open("wb")
    command = [sys.executable, "-m", "celery", "-A", "celery_amqp_app", *args]
    process = subprocess.Popen(
        command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=HERE
    )
    log.close()
    return process


def _worker(tmp_path: Path, env: dict[str, str], name: str) -> subprocess.Popen[bytes]:
    return _celery(tmp_path, env, name, "worker", "-E", "--pool", "prefork", "--concurrency",
                   "4", "--loglevel", "info", "--hostname", f"{name}@%h", "--without-gossip",
                   "--without-mingle")  # fmt: skip


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)  # the worker and its pool processes
    process.wait(10)


class EventWatcher:
    """Celery's event receiver (what `celery events` runs) in a thread: the uuids of the
    task-succeeded events it saw."""

    def __init__(self, app: Any) -> None:
        self.succeeded: set[str] = set()
        self.failure: BaseException | None = None  # why the receiver stopped early, if it did
        self.connection = app.connection_for_read()
        self.receiver = app.events.Receiver(
            self.connection, handlers={"task-succeeded": self._on_succeeded}
        )
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _on_succeeded(self, event: dict[str, Any]) -> None:
        self.succeeded.add(event["uuid"])

    def _run(self) -> None:
        try:
            self.receiver.capture(limit=None, timeout=None, wakeup=False)
        except Exception as err:  # reported by `saw`
            self.failure = err

    def saw(self, uuids: set[str]) -> bool | None:
        """Whether every task of `uuids` was seen succeeding (for wait_until)."""
        assert self.failure is None, f"the event receiver stopped: {self.failure!r}"
        return uuids <= self.succeeded or None

    def start(self) -> None:
        """Declare and bind the receiver's queue (before any event is sent), then consume."""
        self.receiver.queue(self.connection.default_channel).declare()
        self.thread.start()

    def stop(self) -> None:
        self.receiver.should_stop = True
        self.thread.join(10)
        self.connection.close()


def test_celery_over_amqp_worker_killed_mid_run_with_ping_and_events(
    v4_cluster: AmqpCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ran_path = tmp_path / "ran.log"
    monkeypatch.setenv("QQ_AMQP_URL", v4_cluster.url(0))
    monkeypatch.setenv("QQ_RAN", str(ran_path))
    monkeypatch.syspath_prepend(str(HERE))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), str(ROOT)])}
    sys.modules.pop("celery_amqp_app", None)
    import celery_amqp_app  # type: ignore[import-not-found]  # by name from HERE, as the worker does

    app = celery_amqp_app.app
    with app.connection_for_write() as connection:  # results of every sender thread come to
        app.backend.binding(connection.default_channel).declare()  # this thread's queue
    watcher = EventWatcher(app)
    watcher.start()
    workers = [_worker(tmp_path, env, "w1")]
    senders: list[threading.Thread] = []
    try:
        task_ids, senders, errors = _send_all(celery_amqp_app.double, app.thread_oid)
        wait_until(lambda: len(_ran(ran_path)) >= KILL_AFTER, 60, f"{KILL_AFTER} task runs")
        _kill_group(workers[0])
        killed_pids = {pid for pid, _ in _ran(ran_path)}
        _wait_for_returned(v4_cluster)
        workers.append(_worker(tmp_path, env, "w2"))
        for sender in senders:
            sender.join(60)
        assert not errors, errors
        values = [app.AsyncResult(task_id).get(timeout=60) for task_id in task_ids]
        assert values == [2 * number for number in range(TASKS)]
        _ping_answers(tmp_path, env)
        ran = _ran(ran_path)
        by_second = {task_ids[n] for pid, n in ran if pid not in killed_pids}
        wait_until(lambda: watcher.saw(by_second), 30, "task-succeeded events")
    finally:
        for worker in workers:
            _kill_group(worker)
        for sender in senders:  # a failed test must not leave them publishing (1,000 tasks)
            sender.join(60)
        watcher.stop()
    numbers = {number for _, number in ran}
    assert numbers == set(range(TASKS)), f"never ran: {sorted(set(range(TASKS)) - numbers)[:20]}"
    assert by_second, "the second worker ran nothing"
    assert watcher.succeeded <= set(task_ids)


def _send_all(task: Any, reply_to: str) -> tuple[list[str], list[threading.Thread], list[Any]]:
    """Start SENDERS threads applying `task` to 0..TASKS-1 (results come to `reply_to`)."""
    task_ids: list[str] = [""] * TASKS
    errors: list[BaseException] = []

    def send(start: int) -> None:
        try:
            for number in range(start, TASKS, SENDERS):
                task_ids[number] = task.apply_async((number,), reply_to=reply_to).id
        except BaseException as err:  # reported by the main thread
            errors.append(err)

    senders = [threading.Thread(target=send, args=(i,)) for i in range(SENDERS)]
    for sender in senders:
        sender.start()
    return task_ids, senders, errors


def _wait_for_returned(cluster: AmqpCluster) -> None:
    """The dead worker's connection is down: what it had checked out is back in `celery`."""
    endpoints = [node.client_address for node in cluster.cluster.config.nodes]
    with Client(endpoints, cluster.cluster.key) as client:

        def returned() -> QueueOverview | None:
            found = must(client.overview("celery"))
            return found if found.checked_out == 0 else None

        overview = wait_until(returned, 20, "the dead worker's messages returned")
    assert overview.consumers == 0, overview


def _ping_answers(tmp_path: Path, env: dict[str, str]) -> None:
    """`celery inspect ping` gets the live worker's pong."""
    ping = _celery(tmp_path, env, "ping", "inspect", "ping", "--timeout", "10")
    assert ping.wait(60) == 0, (tmp_path / "ping.log").read_text()
    output = (tmp_path / "ping.log").read_text()
    assert "w2@" in output and "pong" in output, output
